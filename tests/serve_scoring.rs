//! Prompt scoring through `wgmoe serve`, as evaluation harnesses use it: `/v1/completions`
//! with `echo: true`, `logprobs: N` and `max_tokens` 0 (or more) returns every prompt
//! token's log-probability (the first null), equal to the engine's teacher-forced
//! log-softmax (`wgmoe eval`'s path, `prompt_logits`) within 1e-4 and to transformers' on
//! the golden prompts; streamed, batched beside another request, and followed by
//! generation, the same numbers. `top_logprobs` objects come most likely first.

mod common;

use common::parity::{self, LOGIT_ATOL, LOGIT_RTOL};
use common::server::*;
use common::{fixture, load_golden};
use serde_json::{json, Value};
use wgmoe::runtime::generate::prompt_logits;
use wgmoe::runtime::logprobs::log_softmax;

const TOP: usize = 3;

/// (token, logprob, top sorted most likely first) per entry; a null logprob (with a null
/// top) only where `nulls_at_first` and it is the first entry.
fn entries(lp: &Value, nulls_at_first: bool) -> Vec<(String, Option<f64>, Vec<(String, f64)>)> {
    let tokens = lp["tokens"].as_array().expect("tokens");
    let lps = lp["token_logprobs"].as_array().expect("token_logprobs");
    let tops = lp["top_logprobs"].as_array().expect("top_logprobs");
    let offs = lp["text_offset"].as_array().expect("text_offset");
    assert!(
        tokens.len() == lps.len() && tops.len() == lps.len() && offs.len() == lps.len(),
        "{lp}"
    );
    (0..lps.len())
        .map(|i| {
            let token = tokens[i].as_str().expect("a token's text").to_string();
            if i == 0 && nulls_at_first {
                assert!(lps[0].is_null() && tops[0].is_null(), "{lp}");
                return (token, None, vec![]);
            }
            let l = lps[i].as_f64().unwrap_or_else(|| panic!("entry {i}: {lp}"));
            let mut top: Vec<(String, f64)> = tops[i]
                .as_object()
                .unwrap_or_else(|| panic!("top_logprobs[{i}] is not an object: {lp}"))
                .iter()
                .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
                .collect();
            // Written most likely first, as OpenAI writes them (clients read them in order).
            assert!(
                top.windows(2).all(|w| w[0].1 >= w[1].1),
                "entry {i}: top_logprobs not most likely first: {}",
                tops[i]
            );
            top.sort_by(|a, b| b.1.total_cmp(&a.1));
            // ≤ 0, probabilities summing to at most 1, the token no likelier than the top.
            assert!(l <= 0.0 && l.is_finite(), "entry {i}: {l}");
            assert!(top.iter().all(|t| t.1 <= 0.0), "entry {i}: {top:?}");
            let p: f64 = top.iter().map(|t| t.1.exp()).sum();
            assert!(p <= 1.0 + 1e-5, "entry {i}: the alternatives sum to {p}");
            assert!(l <= top[0].1 + 1e-6, "entry {i}: {l} above the top {top:?}");
            (token, Some(l), top)
        })
        .collect()
}

fn score(srv: &Server, ids: &[u32], max_tokens: usize) -> Value {
    let body = json!({"prompt": ids, "max_tokens": max_tokens, "echo": true, "logprobs": TOP,
                      "temperature": 0, "ignore_eos": true});
    let (st, v) = srv.post("/v1/completions", &body);
    assert_eq!(st, 200, "{v}");
    v
}

/// Every family: the scored prompt equals the teacher-forced log-softmax of the same
/// engine (INT4 experts, Q8_0 dense weights, f32 KV: the server's weights) within 1e-4,
/// and transformers' within the parity suites' logit tolerance (twice it: a logprob is a
/// logit less the row's log-sum-exp). A chunk of 8 runs each prompt in several scoring
/// steps, so step boundaries are crossed.
fn scoring_matches(name: &str) {
    let golden = load_golden(&format!("{name}.q8_0.safetensors"));
    let srv = Server::start(
        &fixture(name),
        &[
            "--kv-precision",
            "f32",
            "--parallel",
            "1",
            "--prefill-chunk",
            "8",
        ],
    );
    let mut engine = parity::load(name, 256, parity::Q8);
    for (pi, g) in golden.prompts.iter().enumerate() {
        let ids = &g.prompt_ids;
        let v = score(&srv, ids, 0);
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "length", "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 0, "{v}");
        assert_eq!(v["usage"]["prompt_tokens"], ids.len(), "{v}");
        let got = entries(&c["logprobs"], true);
        assert_eq!(
            got.len(),
            ids.len(),
            "{name} p{pi}: one entry per prompt token"
        );
        let ours = prompt_logits(&mut engine.fwd, ids).expect("teacher-forced logits");
        let (mut worst_eval, mut worst_hf) = (0.0f64, 0.0f64);
        for t in 1..ids.len() {
            let lp = got[t].1.expect("scored");
            let id = ids[t] as usize;
            let eval = log_softmax(&ours[t - 1])[id];
            assert!(
                (lp - eval).abs() < 1e-4,
                "{name} p{pi} position {t}: served {lp}, teacher-forced {eval}"
            );
            let row = &g.prompt_logits[t - 1];
            let hf = log_softmax(row)[id];
            let big = row.iter().fold(0.0f32, |a, x| a.max(x.abs()));
            let tol = 2.0 * (LOGIT_ATOL + LOGIT_RTOL * big) as f64;
            assert!(
                (lp - hf).abs() <= tol,
                "{name} p{pi} position {t}: served {lp}, transformers {hf} (tolerance {tol})"
            );
            worst_eval = worst_eval.max((lp - eval).abs());
            worst_hf = worst_hf.max((lp - hf).abs());
        }
        eprintln!(
            "{name} p{pi}: {} tokens scored; worst |served - teacher-forced| {worst_eval:.1e}, |served - transformers| {worst_hf:.1e}",
            ids.len()
        );
    }
}

#[test]
fn prompt_scoring_matches_olmoe() {
    scoring_matches("olmoe-tiny");
}

#[test]
fn prompt_scoring_matches_qwen3moe() {
    scoring_matches("qwen3moe-tiny");
}

#[test]
fn prompt_scoring_matches_qwen2moe() {
    scoring_matches("qwen2moe-tiny");
}

#[test]
fn prompt_scoring_matches_mixtral() {
    scoring_matches("mixtral-tiny");
}

fn close(
    a: &[(String, Option<f64>, Vec<(String, f64)>)],
    b: &[(String, Option<f64>, Vec<(String, f64)>)],
) {
    assert_eq!(a.len(), b.len(), "{a:?}\n{b:?}");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.0, y.0, "{a:?}\n{b:?}");
        match (x.1, y.1) {
            (Some(p), Some(q)) => assert!((p - q).abs() < 1e-4, "{x:?} {y:?}"),
            (None, None) => {}
            _ => panic!("{x:?} {y:?}"),
        }
        assert_eq!(x.2.len(), y.2.len(), "{x:?} {y:?}");
    }
}

/// Scoring followed by generation (the prompt's entries, then the generated tokens' as a
/// request without echo gives them), streamed (the echo chunk carries the prompt's
/// entries), beside another request in a batched server (the same numbers), and the
/// requests that make no sense refused.
#[test]
fn scoring_with_generation_streams_and_batches() {
    let srv = Server::start(&fixture("olmoe-tiny"), &["--parallel", "2"]);
    let text = "The old clockmaker wound the last of his clocks";
    let (st, t) = srv.post("/tokenize", &json!({"content": text}));
    assert_eq!(st, 200, "{t}");
    let ids: Vec<u32> = serde_json::from_value(t["tokens"].clone()).unwrap();
    // Alone, scoring only.
    let alone = entries(&score(&srv, &ids, 0)["choices"][0]["logprobs"], true);
    // Scoring then 4 greedy tokens: the prompt's entries, then those of a plain request.
    let v = score(&srv, &ids, 4);
    let c = &v["choices"][0];
    let all = entries(&c["logprobs"], true);
    assert_eq!(all.len(), ids.len() + 4, "{v}");
    close(&all[..ids.len()], &alone);
    let plain = json!({"prompt": ids, "max_tokens": 4, "temperature": 0, "ignore_eos": true,
                       "logprobs": TOP});
    let (st, p) = srv.post("/v1/completions", &plain);
    assert_eq!(st, 200, "{p}");
    let gen = entries(&p["choices"][0]["logprobs"], false);
    close(&all[ids.len()..], &gen);
    // The text: the echoed prompt, then the completion; the completion's offsets after it.
    let echo = c["text"].as_str().unwrap();
    let completion = p["choices"][0]["text"].as_str().unwrap();
    assert!(echo.ends_with(completion), "{echo:?} / {completion:?}");
    let start = echo.chars().count() - completion.chars().count();
    assert_eq!(c["logprobs"]["text_offset"][ids.len()], start, "{v}");
    // Streamed: the first chunk is the echo with the prompt's entries.
    let mut body = json!({"prompt": ids, "max_tokens": 4, "echo": true, "logprobs": TOP,
                          "temperature": 0, "ignore_eos": true, "stream": true});
    let mut streamed = Vec::new();
    let mut stream_text = String::new();
    let mut first = true;
    for d in srv.stream("/v1/completions", &body) {
        if d == "[DONE]" {
            break;
        }
        let ch = json(&d);
        let lp = &ch["choices"][0]["logprobs"];
        if lp.is_object() {
            streamed.extend(entries(lp, first));
            first = false;
        }
        stream_text.push_str(ch["choices"][0]["text"].as_str().unwrap_or(""));
    }
    assert_eq!(stream_text, echo);
    close(&streamed, &all);
    // Batched: a scoring request and a generating one at once give what they give alone.
    body["stream"] = json!(false);
    body["max_tokens"] = json!(0);
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| score(&srv, &ids, 0));
        let b = s.spawn(|| srv.post("/v1/completions", &plain));
        (a.join().unwrap(), b.join().unwrap())
    });
    close(&entries(&a["choices"][0]["logprobs"], true), &alone);
    assert_eq!(b.0, 200, "{}", b.1);
    close(&entries(&b.1["choices"][0]["logprobs"], false), &gen);
    // Echo alone with max_tokens 0: the prompt back, nothing generated, no logprobs.
    let (st, e) = srv.post(
        "/v1/completions",
        &json!({"prompt": text, "max_tokens": 0, "echo": true}),
    );
    assert_eq!(st, 200, "{e}");
    assert_eq!(e["choices"][0]["text"], text);
    assert!(e["choices"][0]["logprobs"].is_null(), "{e}");
    assert_eq!(e["usage"]["completion_tokens"], 0, "{e}");
    // max_tokens 0 without echo, or in chat, is a 400 naming it.
    for (path, body) in [
        ("/v1/completions", json!({"prompt": text, "max_tokens": 0})),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
        ),
    ] {
        let (st, e) = srv.post(path, &body);
        assert_eq!(
            (st, e["error"]["param"].as_str()),
            (400, Some("max_tokens")),
            "{e}"
        );
    }
}

//! Log-probabilities through `wgmoe serve`: the Completions API's `logprobs: N` and the
//! Chat API's `logprobs`/`top_logprobs`, whole and streamed, against transformers' logits
//! on the fixtures' golden sequences (the greedy tokens' log-softmax at every step), and
//! the shapes the APIs document; `echo` returns the prompt in front of the text.

mod common;

use common::fixture;
use common::load_golden;
use common::parity::{LOGIT_ATOL, LOGIT_RTOL, NEAR_TIE};
use common::server::*;
use serde_json::{json, Value};
use wgmoe::runtime::logprobs::log_softmax;

const TOP: usize = 5;

/// The per-token entries of a completions `logprobs` object as (token, logprob, top).
fn completion_entries(lp: &Value) -> Vec<Entry> {
    let tokens = lp["tokens"].as_array().expect("tokens");
    let lps = lp["token_logprobs"].as_array().expect("token_logprobs");
    let tops = lp["top_logprobs"].as_array().expect("top_logprobs");
    assert_eq!((tokens.len(), tops.len()), (lps.len(), lps.len()), "{lp}");
    assert_eq!(
        lp["text_offset"].as_array().map(Vec::len),
        Some(lps.len()),
        "{lp}"
    );
    (0..lps.len())
        .map(|i| {
            let mut top: Vec<(String, f64)> = tops[i]
                .as_object()
                .expect("a top_logprobs entry is an object")
                .iter()
                .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
                .collect();
            top.sort_by(|a, b| b.1.total_cmp(&a.1));
            (
                tokens[i].as_str().unwrap().to_string(),
                lps[i].as_f64().unwrap(),
                top,
            )
        })
        .collect()
}

type Entry = (String, f64, Vec<(String, f64)>);

/// The same tokens and alternatives, log-probabilities within 1e-4: a repeated request
/// reuses the cached prompt, so its first token's row comes from a shorter prefill.
fn same_entries(a: &[Entry], b: &[Entry]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.0, y.0, "{a:?}\n{b:?}");
        assert!((x.1 - y.1).abs() < 1e-4, "{x:?} {y:?}");
        assert_eq!(x.2.len(), y.2.len());
        for (p, q) in x.2.iter().zip(&y.2) {
            assert!(p.0 == q.0 && (p.1 - q.1).abs() < 1e-4, "{x:?} {y:?}");
        }
    }
}

/// Chat's `content` entries as (token, logprob, top).
fn chat_entries(content: &[Value]) -> Vec<Entry> {
    content
        .iter()
        .map(|t| {
            let top = t["top_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| {
                    (
                        a["token"].as_str().unwrap().to_string(),
                        a["logprob"].as_f64().unwrap(),
                    )
                })
                .collect();
            (
                t["token"].as_str().unwrap().to_string(),
                t["logprob"].as_f64().unwrap(),
                top,
            )
        })
        .collect()
}

/// Log-probabilities are ≤ 0, the alternatives' probabilities sum to at most 1, and a
/// greedy token is its own most likely alternative.
fn check_entry(what: &str, token: &str, lp: f64, top: &[(String, f64)], greedy: bool) {
    assert!(lp <= 0.0 && lp.is_finite(), "{what}: logprob {lp}");
    assert!(top.windows(2).all(|w| w[0].1 >= w[1].1), "{what}: {top:?}");
    assert!(top.iter().all(|t| t.1 <= 0.0), "{what}: {top:?}");
    let p: f64 = top.iter().map(|t| t.1.exp()).sum();
    assert!(p <= 1.0 + 1e-5, "{what}: the alternatives sum to {p}");
    if greedy {
        // (Distinct ids may share a text: the token's own entry is there, first or tied.)
        assert!(
            (top[0].1 - lp).abs() < 1e-6,
            "{what}: {token:?} {lp} not the top {top:?}"
        );
    } else {
        assert!(lp <= top[0].1 + 1e-6, "{what}");
    }
}

/// Greedy completions from the golden prompts' ids: each generated token's logprob equals
/// the log-softmax of transformers' logits at that step (INT4 experts and Q8_0 dense
/// weights, as the server loads them; an f32 KV cache, as the goldens).
fn golden_logprobs_match(name: &str) {
    let golden = load_golden(&format!("{name}.q8_0.safetensors"));
    let srv = Server::start(
        &fixture(name),
        &["--kv-precision", "f32", "--parallel", "1"],
    );
    for (pi, g) in golden.prompts.iter().enumerate() {
        let n = g.generated_ids.len();
        let body = json!({"prompt": g.prompt_ids, "max_tokens": n, "temperature": 0,
                          "ignore_eos": true, "logprobs": TOP});
        let (st, v) = srv.post("/v1/completions", &body);
        assert_eq!(st, 200, "{v}");
        let entries = completion_entries(&v["choices"][0]["logprobs"]);
        assert_eq!(entries.len(), n, "{v}");
        assert!(entries.iter().all(|e| e.2.len() == TOP));
        let mut worst = 0.0f64;
        for (s, (token, lp, top)) in entries.iter().enumerate() {
            let what = format!("{name} p{pi} step {s}");
            check_entry(&what, token, *lp, top, true);
            let row = &g.step_logits[s];
            let want = log_softmax(row)[g.generated_ids[s] as usize];
            let big = row.iter().fold(0.0f32, |a, x| a.max(x.abs()));
            // A logprob is a logit minus the row's log-sum-exp: twice a logit's tolerance.
            let tol = 2.0 * (LOGIT_ATOL + LOGIT_RTOL * big) as f64;
            assert!(
                (lp - want).abs() <= tol,
                "{what}: logprob {lp}, transformers {want} (tolerance {tol})"
            );
            worst = worst.max((lp - want).abs());
            if g.step_gap[s] < NEAR_TIE {
                eprintln!("{what}: a near tie in the golden; later steps are not comparable");
                break;
            }
        }
        eprintln!("{name} p{pi}: {n} steps, worst |logprob - transformers| {worst:.2e}");
    }
}

#[test]
fn completion_logprobs_match_transformers_olmoe() {
    golden_logprobs_match("olmoe-tiny");
}

#[test]
fn completion_logprobs_match_transformers_qwen3moe() {
    golden_logprobs_match("qwen3moe-tiny");
}

/// Streamed and whole answers carry the same log-probabilities; chat's shape has bytes and
/// alternatives per token; a sampled request reports the model's distribution; `echo`
/// puts the prompt in front of the text.
#[test]
fn logprobs_stream_chat_sampling_and_echo() {
    let srv = Server::start(&fixture("olmoe-tiny"), &[]);
    let body = json!({"prompt": "The old clockmaker", "max_tokens": 8, "temperature": 0,
                      "ignore_eos": true, "logprobs": 3});
    let (st, whole) = srv.post("/v1/completions", &body);
    assert_eq!(st, 200, "{whole}");
    let lp = &whole["choices"][0]["logprobs"];
    let entries = completion_entries(lp);
    assert_eq!(entries.len(), 8);
    // The text is the tokens' texts, their offsets where each starts.
    let text = whole["choices"][0]["text"].as_str().unwrap();
    let joined: String = entries.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(joined, text, "{whole}");
    let mut off = 0;
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(lp["text_offset"][i], off);
        off += e.0.chars().count();
    }
    // Streamed: the chunks' entries, in order, are the whole answer's.
    let mut streamed = Vec::new();
    let mut stream_text = String::new();
    let mut body_s = body.clone();
    body_s["stream"] = json!(true);
    for d in srv.stream("/v1/completions", &body_s) {
        if d == "[DONE]" {
            break;
        }
        let c = json(&d);
        stream_text.push_str(c["choices"][0]["text"].as_str().unwrap_or(""));
        if c["choices"][0]["logprobs"].is_object() {
            streamed.extend(completion_entries(&c["choices"][0]["logprobs"]));
        }
    }
    assert_eq!(stream_text, text);
    same_entries(&streamed, &entries);
    // Without logprobs, none.
    let (_, plain) = srv.post(
        "/v1/completions",
        &json!({"prompt": "The old clockmaker", "max_tokens": 2}),
    );
    assert!(plain["choices"][0]["logprobs"].is_null(), "{plain}");
    // Echo: the prompt, then the same completion.
    let mut echo = body.clone();
    echo["echo"] = json!(true);
    echo.as_object_mut().unwrap().remove("logprobs");
    let (st, e) = srv.post("/v1/completions", &echo);
    assert_eq!(st, 200, "{e}");
    assert_eq!(e["choices"][0]["text"], format!("The old clockmaker{text}"));
    // Chat, whole and streamed.
    let chat = json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6,
                      "temperature": 0, "ignore_eos": true, "logprobs": true, "top_logprobs": 2});
    let (st, c) = srv.post("/v1/chat/completions", &chat);
    assert_eq!(st, 200, "{c}");
    let content = c["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("content")
        .clone();
    assert_eq!(content.len(), 6, "{c}");
    for (t, (token, lp, top)) in content.iter().zip(chat_entries(&content)) {
        assert_eq!(t["bytes"], json!(token.as_bytes()), "{t}");
        for a in t["top_logprobs"].as_array().unwrap() {
            assert_eq!(
                a["bytes"],
                json!(a["token"].as_str().unwrap().as_bytes()),
                "{a}"
            );
        }
        assert_eq!(top.len(), 2);
        check_entry(&format!("chat token {token:?}"), &token, lp, &top, true);
    }
    let mut chat_s = chat.clone();
    chat_s["stream"] = json!(true);
    let mut sc = Vec::new();
    for d in srv.stream("/v1/chat/completions", &chat_s) {
        if d == "[DONE]" {
            break;
        }
        let v = json(&d);
        if let Some(a) = v["choices"][0]["logprobs"]["content"].as_array() {
            sc.extend(a.iter().cloned());
        }
    }
    same_entries(&chat_entries(&sc), &chat_entries(&content));
    // Sampled: the chosen token's logprob is the model's, at most the top one's.
    let sampled = json!({"prompt": "The old clockmaker", "max_tokens": 8, "temperature": 1.5,
                         "seed": 7, "ignore_eos": true, "logprobs": 4});
    let (st, s) = srv.post("/v1/completions", &sampled);
    assert_eq!(st, 200, "{s}");
    for (i, (tok, lp, top)) in completion_entries(&s["choices"][0]["logprobs"])
        .iter()
        .enumerate()
    {
        check_entry(&format!("sampled token {i}"), tok, *lp, top, false);
    }
    // Bounds: more than 20 alternatives is a 400 naming the field.
    let (st, e) = srv.post("/v1/completions", &json!({"prompt": "x", "logprobs": 21}));
    assert_eq!(
        (st, e["error"]["param"].as_str()),
        (400, Some("logprobs")),
        "{e}"
    );
}

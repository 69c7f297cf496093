//! The session API on the fixtures: a later request prefills only what it does not share
//! with the cache and gives the tokens of a fresh run; a prompt equal to the cache still
//! runs its last token; `on_token` may stop a generation; greedy decoding stops at EOS;
//! the context limit and context shift of a conversation.

mod common;

use common::cli::{copy_fixture, OLMOE, QWEN3};
use common::engine::load;
use common::fixture;
use wgmoe::model::Executor;
use wgmoe::runtime::generate::{generate, Flow, GenerateOptions};
use wgmoe::runtime::sampling::SamplingOptions;
use wgmoe::session::chat::{chat_prompt, fit, Message, Role};
use wgmoe::session::{common_prefix, Session};
use wgmoe::tokenizer::Tokenizer;

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: n,
        sampling: SamplingOptions::greedy(),
        eos_ids: vec![],
        ignore_eos: true,
        record_logits: false,
        pipeline_depth: wgmoe::runtime::generate::DEFAULT_PIPELINE_DEPTH,
    }
}

fn session(name: &str, ctx: usize) -> Session {
    Session::new(load(name, ctx, Default::default(), Executor::Grouped).unwrap())
}

fn turn(s: &mut Session, prompt: &[u32], n: usize) -> (Vec<u32>, wgmoe::session::TurnStats) {
    let (g, st) = s
        .generate(prompt, &greedy(n), &mut |_| Ok(Flow::Continue))
        .unwrap();
    (g.generated_ids, st)
}

#[test]
fn the_second_turn_prefills_only_its_new_tokens_and_equals_a_fresh_run() {
    for name in [OLMOE, QWEN3] {
        let tok = Tokenizer::from_dir(&fixture(name)).unwrap();
        let n = 8;
        let mut s = session(name, 256);
        let mut msgs = vec![Message::new(Role::User, "Hello there")];
        let p1 = chat_prompt(&tok, &msgs).unwrap();
        let (g1, st1) = turn(&mut s, &p1, n);
        assert_eq!(
            (st1.cached_tokens, st1.prefilled_tokens),
            (0, p1.len()),
            "{name}"
        );
        assert_eq!(st1.generated_tokens, n);
        // The cache: the prompt and every answer token but the last (chosen, never run).
        let mut held = p1.clone();
        held.extend_from_slice(&g1[..n - 1]);
        assert_eq!(s.cached(), &held[..], "{name}");
        msgs.push(Message::new(Role::Assistant, tok.decode(&g1).unwrap()));
        msgs.push(Message::new(Role::User, "And then?"));
        let p2 = chat_prompt(&tok, &msgs).unwrap();
        let shared = common_prefix(&held, &p2);
        assert!(shared >= p1.len(), "{name}: turn 2 extends turn 1");
        let (g2, st2) = turn(&mut s, &p2, n);
        assert_eq!(st2.cached_tokens, shared, "{name}");
        assert_eq!(st2.prefilled_tokens, p2.len() - shared, "{name}");
        assert_eq!(
            s.totals.prefilled_tokens as usize,
            p1.len() + p2.len() - shared
        );
        // A fresh engine on the whole conversation chooses the same tokens.
        let mut fresh = load(name, 256, Default::default(), Executor::Grouped).unwrap();
        let want = generate(&mut fresh.fwd, &p2, &greedy(n), &mut |_| Ok(())).unwrap();
        assert_eq!(
            g2, want.generated_ids,
            "{name}: turn 2 differs from a fresh run"
        );
    }
}

#[test]
fn a_prompt_equal_to_the_cache_still_runs_its_last_token() {
    let mut s = session(OLMOE, 64);
    let p = [5u32, 17, 300, 4000, 12];
    let (a, _) = turn(&mut s, &p, 4);
    let (b, st) = turn(&mut s, &p, 4);
    assert_eq!(a, b);
    assert_eq!((st.cached_tokens, st.prefilled_tokens), (p.len() - 1, 1));
    // A prompt that continues exactly where the cache ends: only the new tokens run.
    let mut longer = p.to_vec();
    longer.extend_from_slice(&b[..3]);
    longer.push(b[3]);
    let (c, st) = turn(&mut s, &longer, 3);
    assert_eq!((st.cached_tokens, st.prefilled_tokens), (p.len() + 3, 1));
    s.clear_cache();
    let (d, st) = turn(&mut s, &longer, 3);
    assert_eq!(st.cached_tokens, 0);
    assert_eq!(c, d);
}

#[test]
fn on_token_stops_a_turn_and_the_cache_holds_what_ran() {
    let mut s = session(OLMOE, 64);
    let p = [7u32, 8, 9, 10];
    let mut seen = 0;
    let (g, st) = s
        .generate(&p, &greedy(20), &mut |_| {
            seen += 1;
            Ok(if seen == 3 {
                Flow::Stop
            } else {
                Flow::Continue
            })
        })
        .unwrap();
    assert_eq!(g.generated_ids.len(), 3);
    assert!(g.cancelled && st.cancelled && !st.stopped_by_eos);
    assert_eq!(s.cached().len(), p.len() + 2);
    // A request beyond the context is refused and leaves the cache as it was.
    let before = s.cached().to_vec();
    let err = s
        .generate(&p, &greedy(61), &mut |_| Ok(Flow::Continue))
        .unwrap_err()
        .to_string();
    assert!(err.contains("exceed the context of 64"), "{err}");
    assert_eq!(s.cached(), &before[..]);
}

#[test]
fn greedy_decoding_stops_at_eos_unless_it_is_ignored() {
    let p = [5u32, 17, 300];
    let mut e = load(OLMOE, 32, Default::default(), Executor::Grouped).unwrap();
    let free = generate(&mut e.fwd, &p, &greedy(4), &mut |_| Ok(())).unwrap();
    // Make the second greedy token the EOS of a copy of the model.
    let eos = free.generated_ids[1];
    let (_t, dir) = copy_fixture(OLMOE);
    for f in ["config.json", "generation_config.json"] {
        let path = dir.join(f);
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        v["eos_token_id"] = eos.into();
        std::fs::write(&path, v.to_string()).unwrap();
    }
    let e = wgmoe::runtime::engine::Engine::load(
        &dir,
        &wgmoe::runtime::engine::EngineOptions {
            residency: Default::default(),
            adapter: Default::default(),
            kernels: Default::default(),
            expert_precision: wgmoe::runtime::engine::ExpertPrecision::Int4,
            dense_precision: wgmoe::runtime::engine::DensePrecision::F16,
            kv_precision: wgmoe::runtime::engine::KvPrecision::F32,
            executor: Executor::Grouped,
            max_context: 32,
            prefill_chunk: 64,
            all_logits: false,
            score_rows: 0,
            batch: 1,
        },
    )
    .unwrap();
    let mut s = Session::new(e);
    let mut opts = greedy(4);
    opts.eos_ids = s.engine.eos_ids();
    opts.ignore_eos = false;
    let (g, st) = s.generate(&p, &opts, &mut |_| Ok(Flow::Continue)).unwrap();
    assert_eq!(g.generated_ids, free.generated_ids[..2], "stops at EOS");
    assert!(st.stopped_by_eos);
    // Ignored, EOS is never chosen: the second token is another one.
    opts.ignore_eos = true;
    s.clear_cache();
    let (g, _) = s.generate(&p, &opts, &mut |_| Ok(Flow::Continue)).unwrap();
    assert_eq!(g.generated_ids.len(), 4);
    assert!(!g.generated_ids.contains(&eos), "{:?}", g.generated_ids);
}

#[test]
fn context_shift_drops_the_oldest_turns_and_keeps_the_system_message() {
    let tok = Tokenizer::from_dir(&fixture(OLMOE)).unwrap();
    let m = |r, t: &str| Message::new(r, t);
    let long = "alpha beta gamma delta epsilon ".repeat(4);
    let conv = vec![
        m(Role::System, "Be brief."),
        m(Role::User, &long),
        m(Role::Assistant, &long),
        m(Role::User, &long),
        m(Role::Assistant, "ok"),
        m(Role::User, "last question"),
    ];
    let full = chat_prompt(&tok, &conv).unwrap().len();
    let last_two = [conv[0].clone(), conv[5].clone()];
    let minimal = chat_prompt(&tok, &last_two).unwrap().len();
    let (reserve, ctx) = (4, full - 1);
    // Without shift: refused, naming the numbers.
    let too = fit(&tok, &conv, ctx, (reserve, reserve), false)
        .unwrap()
        .unwrap_err();
    assert_eq!(
        (too.prompt_tokens, too.reserve, too.context),
        (full, reserve, ctx)
    );
    // With it: whole turns go, oldest first, until it fits.
    let f = fit(&tok, &conv, ctx, (reserve, reserve), true)
        .unwrap()
        .unwrap();
    assert_eq!(f.dropped, 2);
    assert_eq!(f.messages[0], conv[0]);
    assert_eq!(f.messages[1..], conv[3..]);
    assert!(f.prompt.len() + reserve <= ctx);
    assert_eq!(f.prompt, chat_prompt(&tok, &f.messages).unwrap());
    let f = fit(&tok, &conv, minimal + reserve, (reserve, reserve), true)
        .unwrap()
        .unwrap();
    assert_eq!(f.messages, last_two);
    assert_eq!(f.dropped, 4);
    // Not even the system message and the last message fit: refused.
    let too = fit(&tok, &conv, minimal + reserve - 1, (reserve, reserve), true)
        .unwrap()
        .unwrap_err();
    assert_eq!(too.prompt_tokens, minimal);
    assert!(!too.droppable, "every older turn was dropped");
    // Room wanted for the answer, one position needed (chat): what is left runs once
    // nothing more can be dropped, as without shift.
    let f = fit(&tok, &conv, minimal + 1, (reserve, 1), true)
        .unwrap()
        .unwrap();
    assert_eq!(f.messages, last_two);
    assert!(
        fit(&tok, &conv, ctx, (reserve, 1), false)
            .unwrap()
            .unwrap_err()
            .droppable
    );
}

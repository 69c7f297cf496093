//! Batched decoding (`serve --parallel`): several sequences in one engine, each in its own
//! KV region, their decode steps run as one forward over one token of each, new ones
//! joining between decode steps with chunked prefills. Each sequence's greedy tokens must
//! equal the same request run alone, on every family, with every expert resident and with
//! a partial cache, on the CPU-adapter and the GPU-shaped kernel plans, and with f32, f16
//! and q8_0 KV caches.

mod common;

use wgmoe::backend::plan::{DecodeKernels, PrefillKernels};
use wgmoe::backend::{DeviceRequest, KernelOverrides};
use wgmoe::model::Executor;
use wgmoe::runtime::batch::{Batching, Slots};
use wgmoe::runtime::engine::{
    DensePrecision, Engine, EngineOptions, ExpertPrecision, KvPrecision, ResidencyOptions,
};
use wgmoe::runtime::generate::{generate, GenerateOptions};
use wgmoe::runtime::sampling::{argmax, SamplingOptions};

use common::{fixture, init_env};

/// Positions per slot in the tests.
const PER_SLOT: usize = 40;
/// Tokens generated per sequence.
const NEW: usize = 12;

#[derive(Clone, Copy)]
struct Setup {
    gpu_shaped: bool,
    resident: Option<usize>,
    kv: KvPrecision,
    /// Batched steps' MLP blocks always on the multi-token expert kernels (else one token
    /// at a time while the pairs are sparse: `model::solo`).
    grouped_moe: bool,
}

const DEFAULT: Setup = Setup {
    gpu_shaped: false,
    resident: None,
    kv: KvPrecision::F32,
    grouped_moe: false,
};

fn load(name: &str, s: Setup, batch: usize) -> Engine {
    init_env();
    let kernels = if s.gpu_shaped {
        KernelOverrides {
            decode: Some(DecodeKernels::Coalesced),
            prefill: Some(PrefillKernels::Tiled),
            ..Default::default()
        }
    } else {
        KernelOverrides::default()
    };
    let residency = ResidencyOptions {
        resident_experts: s.resident,
        ..common::engine::upload()
    };
    Engine::load(
        &fixture(name),
        &EngineOptions {
            residency,
            adapter: DeviceRequest {
                backend: common::test_backend(),
                ..Default::default()
            },
            kernels,
            expert_precision: ExpertPrecision::Int4,
            dense_precision: DensePrecision::Q8_0,
            kv_precision: s.kv,
            executor: Executor::Grouped,
            max_context: PER_SLOT * batch.max(1),
            prefill_chunk: 8,
            all_logits: false,
            score_rows: 0,
            batch,
        },
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Prompts of different lengths and contents (ids well inside every fixture's vocabulary).
fn prompts(n: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            let len = 3 + (i * 5) % 17;
            (0..len)
                .map(|j| 5 + ((i * 131 + j * 17 + j * j * 7) % 250) as u32)
                .collect()
        })
        .collect()
}

/// The request run alone: a one-sequence engine, greedy, EOS never chosen.
fn alone(e: &mut Engine, prompt: &[u32]) -> Vec<u32> {
    generate(
        &mut e.fwd,
        prompt,
        &GenerateOptions {
            max_new_tokens: NEW,
            sampling: SamplingOptions::greedy(),
            eos_ids: vec![],
            ignore_eos: true,
            record_logits: false,
            pipeline_depth: wgmoe::runtime::generate::DEFAULT_PIPELINE_DEPTH,
        },
        &mut |_| Ok(()),
    )
    .unwrap_or_else(|e| panic!("alone: {e}"))
    .generated_ids
}

/// Sequence i joins at decode step `starts[i]`; each iteration runs one prefill chunk (of
/// the earliest sequence still prefilling), then one decode step of every decoding one.
fn batched(
    e: &mut Engine,
    prompts: &[Vec<u32>],
    starts: &[usize],
    batching: Batching,
) -> Vec<Vec<u32>> {
    let n = prompts.len();
    let mut slots = Slots::new(&e.fwd, n).expect("slots");
    slots.batching = batching;
    let suppress = e.fwd.opts.suppress.clone();
    let chunk = 5;
    // Per sequence: its slot, prompt tokens run, the token chosen and not yet run, output.
    let mut slot_of = vec![None; n];
    let mut done_prefill = vec![0usize; n];
    let mut next: Vec<Option<u32>> = vec![None; n];
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut free: Vec<usize> = (0..n).rev().collect();
    let mut step = 0;
    while out.iter().any(|o| o.len() < NEW) {
        for i in 0..n {
            if slot_of[i].is_none() && starts[i] <= step {
                let s = free.pop().expect("a free slot");
                let keep = slots.claim(s, &prompts[i]);
                assert_eq!(keep, 0, "fresh slots hold nothing");
                slot_of[i] = Some(s);
            }
        }
        if let Some(i) =
            (0..n).find(|&i| slot_of[i].is_some() && done_prefill[i] < prompts[i].len())
        {
            let s = slot_of[i].unwrap_or_default();
            let p = &prompts[i];
            let m = chunk.min(p.len() - done_prefill[i]);
            let last = done_prefill[i] + m == p.len();
            let l = slots
                .prefill(
                    &mut e.fwd,
                    s,
                    &p[done_prefill[i]..done_prefill[i] + m],
                    last,
                )
                .expect("prefill");
            done_prefill[i] += m;
            if let Some(l) = l {
                let id = argmax(&l, &suppress);
                out[i].push(id);
                next[i] = Some(id);
            }
        }
        let items: Vec<(usize, usize, u32)> = (0..n)
            .filter(|&i| out[i].len() < NEW)
            .filter_map(|i| Some((i, slot_of[i]?, next[i]?)))
            .collect();
        if !items.is_empty() {
            let pairs: Vec<(usize, u32)> = items.iter().map(|&(_, s, id)| (s, id)).collect();
            let rows = slots.decode(&mut e.fwd, &pairs).expect("decode step");
            assert_eq!(rows.len(), items.len());
            for (&(i, _, _), row) in items.iter().zip(&rows) {
                let id = argmax(row, &suppress);
                out[i].push(id);
                next[i] = Some(id);
            }
        }
        step += 1;
        assert!(step < 10_000, "the batch never finished");
    }
    if batching == Batching::On && n > 1 {
        assert!(slots.batched_steps > 0, "no batched step ran");
    }
    if batching == Batching::Off {
        assert_eq!(slots.batched_steps, 0);
    }
    out
}

fn check(name: &str, s: Setup, n: usize, starts: &[usize]) {
    check_with(name, s, n, starts, &[Batching::On]);
}

fn check_with(name: &str, s: Setup, n: usize, starts: &[usize], modes: &[Batching]) {
    let ps = prompts(n);
    let mut one = load(name, s, 1);
    let want: Vec<Vec<u32>> = ps.iter().map(|p| alone(&mut one, p)).collect();
    drop(one);
    let mut e = load(name, s, n);
    if s.grouped_moe {
        e.fwd.solo_pairs_per_expert = 0;
    }
    for &mode in modes {
        let got = batched(&mut e, &ps, starts, mode);
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            assert_eq!(
                g, w,
                "{name} ({mode:?}): sequence {i} of {n} (joined at step {}): batched tokens (left) vs alone (right)",
                starts[i]
            );
        }
    }
}

#[test]
fn batched_greedy_tokens_equal_each_request_alone_on_every_family() {
    for name in [
        "olmoe-tiny",
        "qwen2moe-tiny",
        "qwen3moe-tiny",
        "mixtral-tiny",
    ] {
        check(name, DEFAULT, 4, &[0, 0, 3, 7]);
    }
}

#[test]
fn one_to_eight_sequences_started_at_different_times() {
    for n in [1, 2, 3, 8] {
        let starts: Vec<usize> = (0..n).map(|i| (i * 3) % 7).collect();
        check("qwen3moe-tiny", DEFAULT, n, &starts);
    }
}

#[test]
fn the_measured_choice_and_unbatched_steps_give_the_same_tokens() {
    // Auto measures one-token and batched steps and switches between them; Off runs one
    // one-token step per sequence. Either way each sequence's tokens are its own.
    check_with(
        "olmoe-tiny",
        DEFAULT,
        4,
        &[0, 0, 2, 3],
        &[Batching::Auto, Batching::Off],
    );
}

#[test]
fn batched_parity_on_the_grouped_expert_kernels() {
    // Every batched step's MLP blocks on the multi-token expert kernels, however sparse.
    for gpu_shaped in [false, true] {
        for name in [
            "olmoe-tiny",
            "qwen2moe-tiny",
            "qwen3moe-tiny",
            "mixtral-tiny",
        ] {
            let s = Setup {
                grouped_moe: true,
                gpu_shaped,
                ..DEFAULT
            };
            check(name, s, 3, &[0, 1, 3]);
        }
    }
}

#[test]
fn batched_parity_on_the_gpu_shaped_kernels() {
    // Flash attention with one token per workgroup over the key splits.
    for name in ["olmoe-tiny", "qwen3moe-tiny"] {
        let s = Setup {
            gpu_shaped: true,
            ..DEFAULT
        };
        check(name, s, 4, &[0, 1, 2, 5]);
    }
}

#[test]
fn batched_parity_with_a_partial_expert_cache() {
    // One upload serves every sequence routed to an expert in the step.
    for (name, resident) in [("olmoe-tiny", 6), ("mixtral-tiny", 3)] {
        let s = Setup {
            resident: Some(resident),
            ..DEFAULT
        };
        check(name, s, 3, &[0, 2, 4]);
    }
}

#[test]
fn batched_parity_with_f16_and_q8_0_kv_caches() {
    for kv in [KvPrecision::F16, KvPrecision::Q8_0] {
        for gpu_shaped in [false, true] {
            let s = Setup {
                kv,
                gpu_shaped,
                ..DEFAULT
            };
            check("qwen2moe-tiny", s, 3, &[0, 1, 4]);
        }
    }
}

#[test]
fn a_returning_conversation_gets_the_slot_holding_its_prefix() {
    let e = load("olmoe-tiny", DEFAULT, 3);
    let mut slots = Slots::new(&e.fwd, 3).expect("slots");
    let mut fwd = e.fwd;
    let a: Vec<u32> = (10..30).collect();
    let b: Vec<u32> = (40..52).collect();
    assert_eq!(slots.claim(0, &a), 0);
    slots.prefill(&mut fwd, 0, &a, true).expect("prefill a");
    assert_eq!(slots.claim(1, &b), 0);
    slots.prefill(&mut fwd, 1, &b, true).expect("prefill b");
    // a's next turn extends a: slot 0 shares 20 tokens, slot 1 none, slot 2 nothing held.
    let a2: Vec<u32> = (10..36).collect();
    assert_eq!(slots.choose(&a2, [1, 2, 0]), Some(0));
    assert_eq!(slots.claim(0, &a2), 20);
    // A new conversation takes the empty slot, not one holding another's prefix.
    let c: Vec<u32> = (70..75).collect();
    assert_eq!(slots.choose(&c, [1, 2]), Some(2));
    // A prompt equal to what a slot holds still runs its last token.
    assert_eq!(slots.claim(1, &b), b.len() - 1);
}

#[test]
fn impossible_slot_counts_are_refused_naming_the_option() {
    let e = load("olmoe-tiny", DEFAULT, 4);
    let err = Slots::new(&e.fwd, 0).err().expect("refused").to_string();
    assert!(err.contains("--parallel"), "{err}");
    drop(e);
    // More sequences than one step holds.
    init_env();
    let mut o = EngineOptions {
        residency: ResidencyOptions::default(),
        adapter: DeviceRequest {
            backend: common::test_backend(),
            ..Default::default()
        },
        kernels: KernelOverrides::default(),
        expert_precision: ExpertPrecision::Int4,
        dense_precision: DensePrecision::Q8_0,
        kv_precision: KvPrecision::F16,
        executor: Executor::Grouped,
        max_context: 512,
        prefill_chunk: 128,
        all_logits: false,
        score_rows: 0,
        batch: 65,
    };
    let err = Engine::load(&fixture("olmoe-tiny"), &o)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("--parallel") && err.contains("64"), "{err}");
    // More sequences than the prefill chunk's workspace rows.
    o.batch = 16;
    o.prefill_chunk = 8;
    let err = Engine::load(&fixture("olmoe-tiny"), &o)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("--parallel") && err.contains("--prefill-chunk"),
        "{err}"
    );
}

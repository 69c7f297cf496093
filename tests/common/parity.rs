//! The parity harness: a fixture model loaded with given kernels and precision, its logits
//! at every prompt position and every greedy step against transformers' goldens.
#![allow(dead_code)]

use super::*;
use wgmoe::backend::plan::Switch;
pub use wgmoe::backend::plan::{DecodeKernels, PrefillKernels};
use wgmoe::backend::{DeviceRequest, KernelOverrides};
use wgmoe::model::Executor;
use wgmoe::runtime::engine::{DensePrecision, Engine, EngineOptions, ExpertPrecision, KvPrecision};
use wgmoe::runtime::generate::{generate, prompt_logits, GenerateOptions};
use wgmoe::runtime::sampling::SamplingOptions;

/// Allowed |logit - golden| = LOGIT_ATOL + LOGIT_RTOL * |golden|. Weights are the
/// checkpoint's bf16 values held exactly in f16 and everything accumulates in f32, so
/// our own error is summation order (LOGIT_ATOL); the goldens are stored as f16, which
/// rounds by up to half an f16 ulp, 2^-11 relative (0.03 at |logit| = 64).
pub const LOGIT_ATOL: f32 = 1e-2;
pub const LOGIT_RTOL: f32 = 1.0 / 2048.0;
/// With f16 arithmetic every expert input is rounded to f16 (2^-11 relative) before its
/// products, in every expert of every layer a logit goes through, and decode steps compound
/// it through the KV cache. Measured on lavapipe with the f16 kernels in prefill and decode:
/// worst 9.7x the f32 tolerance (qwen2moe-tiny decode steps; olmoe-tiny 4.5x), greedy
/// tokens identical; 16x leaves room for other drivers' f16 rounding.
pub const F16_ARITH_TOL_SCALE: f32 = 16.0;
/// With an f16 KV cache every key and value is rounded to f16 (2^-11 relative) once, and
/// every later score and output reads the rounded values (measured below, on lavapipe).
pub const F16_KV_TOL_SCALE: f32 = 24.0;
/// A q8_0 KV cache against the f32 one on the fixtures' golden sequences, teacher-forced
/// (tests/parity_families.rs). Measured on lavapipe (INT4 experts, Q8_0 dense): mean KL
/// 0.0017 (olmoe, qwen3) to 0.033 (qwen2moe), top-1 agreement 0.91 (qwen2moe) to 1.0; the
/// f16 cache 2e-6 to 4e-5 and 0.98 to 1.0. A broken cache gives a KL of whole nats.
pub const Q8_KV_MAX_MEAN_KL: f64 = 0.1;
pub const Q8_KV_MIN_TOP1: f64 = 0.85;

/// Largest |a - b| beyond the tolerance, as (excess ratio d / allowed, diff, index).
pub fn worst_vs_golden(ours: &[f32], golden: &[f32]) -> (f32, f32, usize) {
    assert_eq!(ours.len(), golden.len());
    let mut w = (0.0f32, 0.0f32, 0usize);
    for (i, (a, g)) in ours.iter().zip(golden).enumerate() {
        let d = (a - g).abs();
        let r = d / (LOGIT_ATOL + LOGIT_RTOL * g.abs());
        if r > w.0 || r.is_nan() {
            w = (r, d, i);
        }
    }
    w
}
/// With an f16 KV cache, a router whose k-th and (k+1)-th experts are closer than this in
/// the golden may pick the other one at that position (its logits are then not
/// comparable; measured: qwen2moe-tiny p0 position 6, margin 8e-4, layer 1).
pub const ROUTER_NEAR_TIE: f32 = 2e-3;

/// Whether position `t` of golden prompt `g` is a routing near tie the setup may flip.
fn routing_near_tie(s: Setup, g: &GoldenPrompt, t: usize) -> bool {
    let tie =
        s.kv != KvPrecision::F32 && g.router_margin.get(t).is_some_and(|&m| m < ROUTER_NEAR_TIE);
    if tie {
        eprintln!(
            "position {t}: a routing near tie in the golden (margin {:.1e}), not compared",
            g.router_margin[t]
        );
    }
    tie
}

/// A greedy token may differ from transformers' only where its top-2 logits are closer
/// than this (a near tie that f32 summation order can flip).
pub const NEAR_TIE: f32 = 2e-3;

#[derive(Clone, Copy)]
pub struct Setup {
    pub precision: ExpertPrecision,
    /// The dense weights' storage (Q8_0: against the Q8_0 goldens, INT4 experts).
    pub dense: DensePrecision,
    /// The KV cache's storage (f16: logits within a wider tolerance, tokens up to near ties).
    pub kv: KvPrecision,
    pub executor: Executor,
    pub chunk: usize,
    pub max_binding: Option<u64>,
    /// Portable kernels even where subgroups exist.
    pub portable: bool,
    /// Force (Some) the decode kernels.
    pub decode: Option<DecodeKernels>,
    /// Force (Some) f16 arithmetic in the W4A16 kernels on or off.
    pub f16_arithmetic: Option<bool>,
    /// Force (Some) the prefill kernels.
    pub prefill: Option<PrefillKernels>,
    /// Multiplies the logit tolerance (1 for f32 arithmetic).
    pub tol_scale: f32,
}

pub const F16: Setup = Setup {
    precision: ExpertPrecision::F16,
    dense: DensePrecision::F16,
    kv: KvPrecision::F32,
    executor: Executor::Grouped,
    chunk: 64,
    max_binding: None,
    portable: false,
    decode: None,
    f16_arithmetic: None,
    prefill: None,
    tol_scale: 1.0,
};
pub const INT4: Setup = Setup {
    precision: ExpertPrecision::Int4,
    dense: DensePrecision::F16,
    kv: KvPrecision::F32,
    executor: Executor::Grouped,
    chunk: 64,
    max_binding: None,
    portable: false,
    decode: None,
    f16_arithmetic: None,
    prefill: None,
    tol_scale: 1.0,
};

/// The GPU-shaped kernels (the default on GPUs): coalesced decode, tiled prefill.
/// INT4 experts and Q8_0 dense weights.
pub const Q8: Setup = Setup {
    dense: DensePrecision::Q8_0,
    ..INT4
};
pub const GPU: Setup = Setup {
    decode: Some(DecodeKernels::Coalesced),
    prefill: Some(PrefillKernels::Tiled),
    ..INT4
};

pub fn load(name: &str, max_context: usize, s: Setup) -> Engine {
    load_dir(&fixture(name), max_context, s)
}

pub fn load_dir(dir: &std::path::Path, max_context: usize, s: Setup) -> Engine {
    let name = dir.display();
    try_load_dir(dir, max_context, s).unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

pub fn try_load_dir(dir: &std::path::Path, max_context: usize, s: Setup) -> wgmoe::Result<Engine> {
    init_env();
    Engine::load(
        dir,
        &EngineOptions {
            residency: Default::default(),
            adapter: DeviceRequest {
                backend: super::test_backend(),
                max_binding: s.max_binding,
                ..Default::default()
            },
            kernels: KernelOverrides {
                portable: s.portable,
                decode: s.decode,
                prefill: s.prefill,
                f16_arithmetic: s
                    .f16_arithmetic
                    .map(|f| if f { Switch::On } else { Switch::Off }),
            },
            expert_precision: s.precision,
            dense_precision: s.dense,
            kv_precision: s.kv,
            executor: s.executor,
            max_context,
            prefill_chunk: s.chunk,
            all_logits: true,
            score_rows: 0,
            batch: 1,
        },
    )
}

/// Whether the adapter's subgroups have at least 8 lanes (the subgroup kernels' need).
/// lavapipe with LP_NATIVE_VECTOR_WIDTH=128 has subgroups of 4.
pub fn subgroup_kernels_available() -> bool {
    init_env();
    let dev = wgmoe::backend::Device::open(&DeviceRequest {
        backend: super::test_backend(),
        ..Default::default()
    })
    .expect("a GPU adapter (lavapipe in CI)");
    dev.info().subgroup && dev.info().subgroup_min_size >= 8
}

/// A setup forcing subgroup kernels is refused, naming the option, where subgroups are
/// narrower than 8 lanes.
pub fn assert_refused(name: &str, s: Setup, option: &str) {
    let err = match try_load_dir(&fixture(name), 64, s) {
        Ok(_) => {
            panic!("{name}: {option} must be refused on an adapter with subgroups below 8 lanes")
        }
        Err(e) => e.to_string(),
    };
    assert!(err.contains(option) && err.contains("8 lanes"), "{err}");
}

/// Compare with the goldens of transformers run on the same expert precision (the INT4
/// goldens use the INT4 round-trip expert weights).
pub fn check_fixture(name: &str, s: Setup) {
    check_dir(name, &fixture(name), s)
}

pub fn check_dir(name: &str, dir: &std::path::Path, s: Setup) {
    let setup = s;
    let file = match (s.precision, s.dense) {
        (ExpertPrecision::F16, DensePrecision::F16) => format!("{name}.safetensors"),
        // Strict is the same INT4 on safetensors checkpoints.
        (ExpertPrecision::Int4 | ExpertPrecision::Int4Strict, DensePrecision::F16) => {
            format!("{name}.int4.safetensors")
        }
        (ExpertPrecision::Int4 | ExpertPrecision::Int4Strict, DensePrecision::Q8_0) => {
            format!("{name}.q8_0.safetensors")
        }
        (ExpertPrecision::F16, DensePrecision::Q8_0) => {
            panic!("no golden of f16 experts with Q8_0 dense weights")
        }
    };
    let golden = load_golden(&file);
    let chunk = s.chunk;
    let max_ctx = golden
        .prompts
        .iter()
        .map(|p| p.prompt_ids.len() + p.generated_ids.len())
        .max()
        .unwrap();
    let mut engine = load_dir(dir, max_ctx, s);
    let tol_scale = s.tol_scale;
    for (pi, g) in golden.prompts.iter().enumerate() {
        // Logits at every prompt position.
        let rows = prompt_logits(&mut engine.fwd, &g.prompt_ids).unwrap();
        assert_eq!(rows.len(), g.prompt_ids.len());
        let mut worst = 0.0f32;
        let mut worst_ratio = 0.0f32;
        for (t, (r, gr)) in rows.iter().zip(&g.prompt_logits).enumerate() {
            if routing_near_tie(s, g, t) {
                continue;
            }
            let (r, d, i) = worst_vs_golden(r, gr);
            assert!(r <= tol_scale, "{name} p{pi} prompt position {t}: |logit - golden| = {d} at token {i} (golden {}), {r:.2}x the tolerance", gr[i]);
            worst = worst.max(d);
            worst_ratio = worst_ratio.max(r);
        }
        // Greedy decode with per-step logits.
        let out = generate(
            &mut engine.fwd,
            &g.prompt_ids,
            &GenerateOptions {
                max_new_tokens: g.generated_ids.len(),
                sampling: SamplingOptions::greedy(),
                eos_ids: vec![],
                ignore_eos: true,
                record_logits: true,
                pipeline_depth: wgmoe::runtime::generate::DEFAULT_PIPELINE_DEPTH,
            },
            &mut |_| Ok(()),
        )
        .unwrap();
        assert_eq!(out.generated_ids.len(), g.generated_ids.len());
        let mut step_worst = 0.0f32;
        for (s, (&ours, &theirs)) in out.generated_ids.iter().zip(&g.generated_ids).enumerate() {
            if routing_near_tie(setup, g, g.prompt_ids.len() - 1 + s) {
                if ours != theirs {
                    eprintln!("{name} p{pi}: the near tie flipped the token at step {s}; later steps are not comparable");
                    break;
                }
                continue;
            }
            let (r, d, i) = worst_vs_golden(&out.step_logits[s], &g.step_logits[s]);
            assert!(r <= tol_scale, "{name} p{pi} step {s}: |logit - golden| = {d} at token {i} (golden {}), {r:.2}x the tolerance", g.step_logits[s][i]);
            step_worst = step_worst.max(d);
            worst_ratio = worst_ratio.max(r);
            if ours != theirs {
                assert!(g.step_gap[s] < NEAR_TIE * tol_scale,
                    "{name} p{pi} step {s}: token {ours} != golden {theirs} and the golden top-2 gap {} is not a near tie (< {NEAR_TIE})", g.step_gap[s]);
                eprintln!(
                    "{name} p{pi}: near-tie divergence at step {s}; later steps are not comparable"
                );
                break;
            }
        }
        eprintln!("{name} {file} p{pi} (chunk {chunk}, {:?}): max |logit diff| prompt {worst:.2e}, steps {step_worst:.2e} ({worst_ratio:.2}x the f32 tolerance); tokens {:?}", s.executor, out.generated_ids);
    }
}

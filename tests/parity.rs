//! End to end on the GPU (lavapipe in CI): logits and greedy tokens of both fixture models
//! against transformers' float32 goldens (models/goldens, made by tools/make_fixtures.py).

mod common;

use common::*;
use wgmoe::engine::{Engine, EngineOptions, ExpertPrecision};
use wgmoe::generate::{generate, prompt_logits, GenerateOptions};
use wgmoe::backend::plan::{DecodeKernels, PrefillKernels, Switch};
use wgmoe::backend::{DeviceRequest, KernelOverrides};
use wgmoe::model::Executor;
use wgmoe::sampling::SamplingOptions;

/// Allowed |logit - golden| = LOGIT_ATOL + LOGIT_RTOL * |golden|. Weights are the
/// checkpoint's bf16 values held exactly in f16 and everything accumulates in f32, so
/// our own error is summation order (LOGIT_ATOL); the goldens are stored as f16, which
/// rounds by up to half an f16 ulp, 2^-11 relative (0.03 at |logit| = 64).
const LOGIT_ATOL: f32 = 1e-2;
const LOGIT_RTOL: f32 = 1.0 / 2048.0;
/// With f16 arithmetic every expert input is rounded to f16 (2^-11 relative) before its
/// products, in every expert of every layer a logit goes through, and decode steps compound
/// it through the KV cache. Measured on lavapipe with the f16 kernels in prefill and decode:
/// worst 9.7x the f32 tolerance (qwen2moe-tiny decode steps; olmoe-tiny 4.5x), greedy
/// tokens identical; 16x leaves room for other drivers' f16 rounding.
const F16_ARITH_TOL_SCALE: f32 = 16.0;

/// Largest |a - b| beyond the tolerance, as (excess ratio d / allowed, diff, index).
fn worst_vs_golden(ours: &[f32], golden: &[f32]) -> (f32, f32, usize) {
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
/// A greedy token may differ from transformers' only where its top-2 logits are closer
/// than this (a near tie that f32 summation order can flip).
const NEAR_TIE: f32 = 2e-3;

#[derive(Clone, Copy)]
struct Setup {
    precision: ExpertPrecision,
    executor: Executor,
    chunk: usize,
    max_binding: Option<u64>,
    /// Portable kernels even where subgroups exist.
    portable: bool,
    /// Force (Some) the uniform-activation decode kernels on or off.
    uniform_decode: Option<bool>,
    /// Force (Some) f16 arithmetic in the W4A16 kernels on or off.
    f16_arithmetic: Option<bool>,
    /// Force (Some) the window / expert-major prefill kernels on or off.
    window_prefill: Option<bool>,
    /// Multiplies the logit tolerance (1 for f32 arithmetic).
    tol_scale: f32,
}

const F16: Setup = Setup {
    precision: ExpertPrecision::F16,
    executor: Executor::Grouped,
    chunk: 64,
    max_binding: None,
    portable: false,
    uniform_decode: None,
    f16_arithmetic: None,
    window_prefill: None,
    tol_scale: 1.0,
};
const INT4: Setup = Setup {
    precision: ExpertPrecision::Int4,
    executor: Executor::Grouped,
    chunk: 64,
    max_binding: None,
    portable: false,
    uniform_decode: None,
    f16_arithmetic: None,
    window_prefill: None,
    tol_scale: 1.0,
};

fn load(name: &str, max_context: usize, s: Setup) -> Engine {
    load_dir(&fixture(name), max_context, s)
}

fn load_dir(dir: &std::path::Path, max_context: usize, s: Setup) -> Engine {
    let name = dir.display();
    try_load_dir(dir, max_context, s).unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

fn try_load_dir(dir: &std::path::Path, max_context: usize, s: Setup) -> wgmoe::Result<Engine> {
    init_env();
    Engine::load(
        dir,
        &EngineOptions {
            residency: Default::default(),
            adapter: DeviceRequest {
                max_binding: s.max_binding,
                ..Default::default()
            },
            kernels: KernelOverrides {
                portable: s.portable,
                decode: s.uniform_decode.map(|u| if u { DecodeKernels::Uniform } else { DecodeKernels::Storage }),
                prefill: s.window_prefill.map(|w| if w { PrefillKernels::Window } else { PrefillKernels::Storage }),
                f16_arithmetic: s.f16_arithmetic.map(|f| if f { Switch::On } else { Switch::Off }),
            },
            expert_precision: s.precision,
            executor: s.executor,
            max_context,
            prefill_chunk: s.chunk,
            all_logits: true,
        },
    )
}

/// Whether the adapter's subgroups have at least 8 lanes (the subgroup kernels' need).
/// lavapipe with LP_NATIVE_VECTOR_WIDTH=128 has subgroups of 4.
fn subgroup_kernels_available() -> bool {
    init_env();
    let dev = wgmoe::backend::Device::open(&DeviceRequest::default()).expect("a GPU adapter (lavapipe in CI)");
    dev.info().subgroup && dev.info().subgroup_min_size >= 8
}

/// A setup forcing subgroup kernels is refused, naming the option, where subgroups are
/// narrower than 8 lanes.
fn assert_refused(name: &str, s: Setup, option: &str) {
    let err = match try_load_dir(&fixture(name), 64, s) {
        Ok(_) => panic!("{name}: {option} must be refused on an adapter with subgroups below 8 lanes"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(option) && err.contains("8 lanes"), "{err}");
}

/// Compare with the goldens of transformers run on the same expert precision (the INT4
/// goldens use the INT4 round-trip expert weights).
fn check_fixture(name: &str, s: Setup) {
    check_dir(name, &fixture(name), s)
}

fn check_dir(name: &str, dir: &std::path::Path, s: Setup) {
    let file = match s.precision {
        ExpertPrecision::F16 => format!("{name}.safetensors"),
        ExpertPrecision::Int4 => format!("{name}.int4.safetensors"),
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
            },
            &mut |_| Ok(()),
        )
        .unwrap();
        assert_eq!(out.generated_ids.len(), g.generated_ids.len());
        let mut step_worst = 0.0f32;
        for (s, (&ours, &theirs)) in out.generated_ids.iter().zip(&g.generated_ids).enumerate() {
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

#[test]
fn olmoe_f16_matches_transformers() {
    check_fixture("olmoe-tiny", F16);
}

#[test]
fn qwen2moe_f16_matches_transformers() {
    check_fixture("qwen2moe-tiny", F16);
}

#[test]
fn olmoe_int4_matches_transformers_on_int4_weights() {
    check_fixture("olmoe-tiny", INT4);
    check_fixture(
        "olmoe-tiny",
        Setup {
            executor: Executor::PerExpert,
            ..INT4
        },
    );
}

#[test]
fn qwen2moe_int4_matches_transformers_on_int4_weights() {
    check_fixture("qwen2moe-tiny", INT4);
    check_fixture(
        "qwen2moe-tiny",
        Setup {
            executor: Executor::PerExpert,
            ..INT4
        },
    );
}

/// The portable W4A16 kernels (no subgroup operations) give the same results.
#[test]
fn portable_int4_kernels_match_transformers() {
    check_fixture(
        "olmoe-tiny",
        Setup {
            portable: true,
            ..INT4
        },
    );
    check_fixture(
        "qwen2moe-tiny",
        Setup {
            portable: true,
            executor: Executor::PerExpert,
            ..INT4
        },
    );
}

/// The storage kernels in prefill and decode (what GPUs use by default; lavapipe defaults
/// to the window prefill and uniform decode kernels) give the same results.
#[test]
fn storage_kernels_match_transformers() {
    let gpu_like = Setup {
        uniform_decode: Some(false),
        window_prefill: Some(false),
        ..INT4
    };
    check_fixture("olmoe-tiny", gpu_like);
    check_fixture("qwen2moe-tiny", gpu_like);
    check_fixture(
        "qwen2moe-tiny",
        Setup {
            precision: ExpertPrecision::F16,
            ..gpu_like
        },
    );
}

/// Window prefill with uniform decode switched off, and the reverse: each path on its own.
#[test]
fn window_prefill_and_uniform_decode_each_match_transformers() {
    let window = Setup {
        uniform_decode: Some(false),
        window_prefill: Some(true),
        ..INT4
    };
    if subgroup_kernels_available() {
        check_fixture("olmoe-tiny", window);
    } else {
        assert_refused("olmoe-tiny", window, "--prefill-kernels");
    }
    check_fixture(
        "qwen2moe-tiny",
        Setup {
            uniform_decode: Some(true),
            window_prefill: Some(false),
            chunk: 7,
            ..INT4
        },
    );
}

/// f16 arithmetic in the W4A16 kernels (the GPU default where SHADER_F16 exists; forced
/// here on lavapipe): activations are rounded to f16 inside each expert dot product, so the
/// tolerance is F16_ARITH_TOL_SCALE times the f32 one.
#[test]
fn f16_arithmetic_int4_kernels_match_transformers() {
    let s = Setup {
        f16_arithmetic: Some(true),
        uniform_decode: Some(false),
        window_prefill: Some(false),
        tol_scale: F16_ARITH_TOL_SCALE,
        ..INT4
    };
    if !subgroup_kernels_available() {
        // The f16 kernels are subgroup kernels.
        assert_refused("olmoe-tiny", s, "--f16-arithmetic");
        return;
    }
    check_fixture("olmoe-tiny", s);
    check_fixture("qwen2moe-tiny", s);
    check_fixture(
        "qwen2moe-tiny",
        Setup {
            executor: Executor::PerExpert,
            ..s
        },
    );
}

#[test]
fn per_expert_f16_matches_transformers() {
    check_fixture(
        "olmoe-tiny",
        Setup {
            executor: Executor::PerExpert,
            ..F16
        },
    );
    check_fixture(
        "qwen2moe-tiny",
        Setup {
            executor: Executor::PerExpert,
            ..F16
        },
    );
}

/// Prefill split into several submissions must give the same results.
#[test]
fn chunked_prefill_matches_transformers() {
    check_fixture("olmoe-tiny", Setup { chunk: 4, ..F16 });
    check_fixture("qwen2moe-tiny", Setup { chunk: 5, ..INT4 });
}

/// With a small storage-binding cap the embeddings, lm_head and expert pools are split
/// into many chunks (one dispatch each); results must not change.
#[test]
fn split_tensors_match_transformers() {
    let e = load(
        "olmoe-tiny",
        8,
        Setup {
            max_binding: Some(64 << 10),
            ..F16
        },
    );
    assert!(
        e.fwd.weights.embed.chunks.len() > 50,
        "embeddings should be split: {} chunks",
        e.fwd.weights.embed.chunks.len()
    );
    drop(e);
    check_fixture(
        "olmoe-tiny",
        Setup {
            max_binding: Some(64 << 10),
            ..F16
        },
    );
    check_fixture(
        "qwen2moe-tiny",
        Setup {
            max_binding: Some(1 << 20),
            ..F16
        },
    );
    check_fixture(
        "olmoe-tiny",
        Setup {
            max_binding: Some(40 << 10),
            ..INT4
        },
    );
    check_fixture(
        "qwen2moe-tiny",
        Setup {
            max_binding: Some(640 << 10),
            ..INT4
        },
    );
}

/// A model converted by `wgmoe quantize` loads without conversion work and gives the same
/// results as quantising on load; a converted file that fails validation is refused.
#[test]
fn converted_model_matches_and_is_validated() {
    init_env();
    for name in ["olmoe-tiny", "qwen2moe-tiny"] {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join(name);
        wgmoe::convert::write_converted(&fixture(name), &out, &mut |_, _| {}).unwrap();
        check_dir(name, &out, INT4);
        check_dir(
            name,
            &out,
            Setup {
                executor: Executor::PerExpert,
                ..INT4
            },
        );

        let opts = |precision| EngineOptions {
            residency: Default::default(),
            adapter: DeviceRequest::default(),
            kernels: KernelOverrides::default(),
            expert_precision: precision,
            executor: Executor::Grouped,
            max_context: 8,
            prefill_chunk: 8,
            all_logits: false,
        };
        let err = Engine::load(&out, &opts(ExpertPrecision::F16))
            .err()
            .expect("f16 on a converted model")
            .to_string();
        assert!(err.contains("--expert-precision"), "{err}");

        // One flipped byte inside the packed experts.
        let file = out.join("model.safetensors");
        let mut bytes = std::fs::read(&file).unwrap();
        let n = bytes.len();
        bytes[n - 100] ^= 0x10;
        std::fs::write(&file, &bytes).unwrap();
        let err = Engine::load(&out, &opts(ExpertPrecision::Int4))
            .err()
            .expect("corrupt experts")
            .to_string();
        assert!(
            err.contains("checksum") && err.contains("mlp.experts.int4"),
            "{err}"
        );
        bytes[n - 100] ^= 0x10;
        std::fs::write(&file, &bytes).unwrap();
        assert!(Engine::load(&out, &opts(ExpertPrecision::Int4)).is_ok());

        // A config that is not the one the file was converted from.
        let cfg_path = out.join("config.json");
        let cfg = std::fs::read_to_string(&cfg_path).unwrap();
        std::fs::write(
            &cfg_path,
            cfg.replacen(
                "\"max_position_embeddings\": 512",
                "\"max_position_embeddings\": 511",
                1,
            ),
        )
        .unwrap();
        let err = Engine::load(&out, &opts(ExpertPrecision::Int4))
            .err()
            .expect("changed config")
            .to_string();
        assert!(err.contains("source_config_hash"), "{err}");
    }
}

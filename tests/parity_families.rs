//! Qwen3-MoE and Mixtral (grouped-query attention, Qwen3's per-head q/k norm and dense
//! layers among MoE layers, Mixtral's hub tensor names and renormalised top-k) against
//! transformers' goldens, as the older families in tests/parity.rs: greedy tokens equal
//! over the whole golden decode, logits within the tolerance at every prompt position and
//! step, f16 and INT4 experts, both executors, the GPU kernels and the portable ones,
//! chunked prefill.

mod common;

use common::parity::*;
use wgmoe::model::Executor;

const FAMILIES: [&str; 2] = ["qwen3moe-tiny", "mixtral-tiny"];

#[test]
fn qwen3moe_and_mixtral_f16_match_transformers() {
    for name in FAMILIES {
        check_fixture(name, F16);
        check_fixture(
            name,
            Setup {
                executor: Executor::PerExpert,
                ..F16
            },
        );
    }
}

#[test]
fn qwen3moe_and_mixtral_int4_match_transformers_on_int4_weights() {
    for name in FAMILIES {
        check_fixture(name, INT4);
        check_fixture(
            name,
            Setup {
                executor: Executor::PerExpert,
                ..INT4
            },
        );
    }
}

/// The GPU defaults (storage kernels), the portable kernels (no subgroup operations) and
/// prefill in chunks of 3 tokens (several submissions of the KV cache).
#[test]
fn qwen3moe_and_mixtral_on_every_kernel_path() {
    for name in FAMILIES {
        check_fixture(
            name,
            Setup {
                decode: Some(DecodeKernels::Storage),
                prefill: Some(PrefillKernels::Storage),
                ..INT4
            },
        );
        check_fixture(
            name,
            Setup {
                portable: true,
                ..INT4
            },
        );
        check_fixture(name, Setup { chunk: 3, ..INT4 });
    }
}

/// The GPU-shaped kernels (the plan's default on GPUs: coalesced decode, tiled prefill),
/// on every family, f16 and INT4 experts, both executors, reducing through subgroups and
/// through workgroup memory (`--portable-kernels`).
#[test]
fn every_family_on_the_gpu_kernels() {
    for name in [
        "olmoe-tiny",
        "qwen2moe-tiny",
        "qwen3moe-tiny",
        "mixtral-tiny",
    ] {
        check_fixture(name, GPU);
        check_fixture(
            name,
            Setup {
                precision: wgmoe::runtime::engine::ExpertPrecision::F16,
                ..GPU
            },
        );
        check_fixture(
            name,
            Setup {
                portable: true,
                executor: Executor::PerExpert,
                chunk: 3,
                ..GPU
            },
        );
    }
}

/// Q8_0 dense weights (attention, shared experts, dense MLP layers, lm_head; INT4 experts)
/// on every family against transformers run on the Q8_0 round-tripped weights
/// (`<fixture>.q8_0.safetensors`): the adapter's own plan (on a CPU adapter the storage
/// kernels for f16 and INT4, the Q8_0 matvec, GEMM and expert kernels for Q8_0), the GPU
/// kernels, the portable ones with the per-expert executor and 3-token prefill chunks.
#[test]
fn every_family_with_q8_0_dense_weights() {
    for name in [
        "olmoe-tiny",
        "qwen2moe-tiny",
        "qwen3moe-tiny",
        "mixtral-tiny",
    ] {
        check_fixture(name, Q8);
        check_fixture(
            name,
            Setup {
                dense: wgmoe::runtime::engine::DensePrecision::Q8_0,
                ..GPU
            },
        );
        check_fixture(
            name,
            Setup {
                portable: true,
                executor: Executor::PerExpert,
                chunk: 3,
                ..Q8
            },
        );
    }
}

/// The f16 KV cache on every family (INT4 experts; f16 and Q8_0 dense weights): each key
/// and value rounded to f16 (2^-11 relative) once, read by the attention kernels directly.
/// Logits within F16_KV_TOL_SCALE x the f32 tolerance of the goldens, greedy tokens equal
/// up to near ties; the storage, window and GPU-shaped attention kernels.
#[test]
fn every_family_with_an_f16_kv_cache() {
    use wgmoe::runtime::engine::{DensePrecision, KvPrecision};
    for name in [
        "olmoe-tiny",
        "qwen2moe-tiny",
        "qwen3moe-tiny",
        "mixtral-tiny",
    ] {
        let f16_kv = Setup {
            kv: KvPrecision::F16,
            tol_scale: F16_KV_TOL_SCALE,
            ..INT4
        };
        check_fixture(name, f16_kv);
        check_fixture(
            name,
            Setup {
                dense: DensePrecision::Q8_0,
                ..f16_kv
            },
        );
        check_fixture(
            name,
            Setup {
                kv: KvPrecision::F16,
                tol_scale: F16_KV_TOL_SCALE,
                ..GPU
            },
        );
    }
}

/// The f16 and q8_0 KV caches on every family (INT4 experts, Q8_0 dense weights) against
/// the f32 cache on the golden sequences, teacher-forced: mean KL of the next-token
/// distributions and top-1 agreement. The tiny fixtures' routers are near ties at many
/// positions (their weights are random), so q8_0's int8 rounding (max|block| / 254 per
/// value) flips some routing and golden logits are not comparable; the distributions are.
#[test]
fn every_family_with_a_q8_0_kv_cache_keeps_the_distributions() {
    use wgmoe::insight::eval::fidelity;
    use wgmoe::runtime::engine::{DensePrecision, KvPrecision};
    for name in [
        "olmoe-tiny",
        "qwen2moe-tiny",
        "qwen3moe-tiny",
        "mixtral-tiny",
    ] {
        let golden = common::load_golden(&format!("{name}.q8_0.safetensors"));
        let seqs: Vec<Vec<u32>> = golden
            .prompts
            .iter()
            .map(|g| [g.prompt_ids.clone(), g.generated_ids.clone()].concat())
            .collect();
        let ctx = seqs.iter().map(Vec::len).max().unwrap();
        let logits = |kv| {
            let s = Setup {
                kv,
                dense: DensePrecision::Q8_0,
                ..INT4
            };
            let mut e = load(name, ctx, s);
            let rows: Vec<Vec<Vec<f32>>> = seqs
                .iter()
                .map(|q| wgmoe::runtime::generate::prompt_logits(&mut e.fwd, q).unwrap())
                .collect();
            rows.concat()
        };
        let f32_kv = logits(KvPrecision::F32);
        let f16 = fidelity(&f32_kv, &logits(KvPrecision::F16));
        let q8 = fidelity(&f32_kv, &logits(KvPrecision::Q8_0));
        println!("{name}: f16 KV {f16:?}; q8_0 KV {q8:?}");
        assert_eq!(q8.positions, f32_kv.len());
        assert!(
            q8.mean_kl.is_finite() && q8.mean_kl < Q8_KV_MAX_MEAN_KL,
            "{name}: q8_0 KV {q8:?}"
        );
        assert!(
            q8.top1_agreement >= Q8_KV_MIN_TOP1,
            "{name}: q8_0 KV {q8:?}"
        );
        assert!(
            f16.mean_kl < Q8_KV_MAX_MEAN_KL / 100.0,
            "{name}: f16 KV {f16:?}"
        );
    }
}

//! End to end on CUDA (`--features cuda`): the fixture models' logits and greedy tokens
//! against transformers' goldens, as tests/parity.rs and tests/parity_families.rs do on
//! wgpu (same helpers, same tolerances), and partial residency (uploads through pinned
//! staging, events as the fence) giving the golden tokens as tests/residency.rs asks. Without a CUDA device
//! each test prints "not run: no CUDA device" and returns (WGMOE_REQUIRE_CUDA=1: a failure).
#![cfg(feature = "cuda")]

mod common;

use common::engine::{greedy, load, upload};
use common::parity::*;
use common::*;
use wgmoe::backend::{BackendChoice, Device, DeviceRequest};
use wgmoe::model::Executor;
use wgmoe::runtime::engine::ResidencyOptions;

const MODELS: [&str; 4] = [
    "olmoe-tiny",
    "qwen2moe-tiny",
    "qwen3moe-tiny",
    "mixtral-tiny",
];

/// Whether a CUDA device opens (this binary's engines then use it); printed when not.
fn cuda(test: &str) -> bool {
    use_backend(BackendChoice::Cuda);
    init_env();
    match Device::open(&DeviceRequest {
        backend: Some(BackendChoice::Cuda),
        ..Default::default()
    }) {
        Ok(d) => {
            println!("{test}: on `{}`", d.info().name);
            true
        }
        Err(e) if std::env::var_os("WGMOE_REQUIRE_CUDA").is_none() => {
            println!("{test}: not run: no CUDA device ({e})");
            false
        }
        Err(e) => panic!("{test}: WGMOE_REQUIRE_CUDA is set and no CUDA device opens: {e}"),
    }
}

#[test]
fn cuda_f16_matches_transformers() {
    if !cuda("cuda_f16_matches_transformers") {
        return;
    }
    for name in MODELS {
        check_fixture(name, F16);
    }
}

#[test]
fn cuda_int4_matches_transformers_on_int4_weights() {
    if !cuda("cuda_int4_matches_transformers_on_int4_weights") {
        return;
    }
    for name in MODELS {
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

/// Q8_0 dense weights (against the Q8_0 goldens; both executors, both reductions) and the
/// f16 KV cache (within F16_KV_TOL_SCALE x the f32 tolerance, tokens up to near ties; f16
/// and Q8_0 dense weights), as tests/parity_families.rs asks of wgpu.
#[test]
fn cuda_q8_0_dense_weights_and_the_f16_kv_cache_match_transformers() {
    use wgmoe::runtime::engine::{DensePrecision, KvPrecision};
    if !cuda("cuda_q8_0_dense_weights_and_the_f16_kv_cache_match_transformers") {
        return;
    }
    for name in MODELS {
        check_fixture(name, Q8);
        check_fixture(
            name,
            Setup {
                portable: true,
                executor: Executor::PerExpert,
                chunk: 3,
                ..Q8
            },
        );
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
    }
}

#[test]
fn cuda_partial_residency_matches_the_golden_tokens() {
    if !cuda("cuda_partial_residency_matches_the_golden_tokens") {
        return;
    }
    for name in ["olmoe-tiny", "qwen2moe-tiny"] {
        let golden = load_golden(&format!("{name}.int4.safetensors"));
        let cfg = wgmoe::config::ModelConfig::from_dir(&fixture(name)).unwrap();
        let g = &golden.prompts[0];
        let (prompt, want) = (&g.prompt_ids, &g.generated_ids);
        for executor in [Executor::Grouped, Executor::PerExpert] {
            let opts = ResidencyOptions {
                resident_experts: Some(cfg.top_k),
                ..upload()
            };
            let mut e = load(name, 64, opts, executor).unwrap();
            let got = greedy(&mut e, prompt, want.len()).unwrap();
            // A divergence is allowed only at a golden near tie (as tests/residency.rs).
            if let Some(s) = got.iter().zip(want).position(|(a, b)| a != b) {
                assert!(
                    g.step_gap[s] < 2e-3,
                    "{name} {executor:?}, {} resident: step {s}: {} != golden {}",
                    cfg.top_k,
                    got[s],
                    want[s]
                );
            }
            let st = e.fwd.residency.as_ref().map(|r| r.stats());
            assert!(
                st.is_some_and(|s| s.h2d_bytes > 0),
                "{name}: partial residency uploaded nothing"
            );
        }
    }
}

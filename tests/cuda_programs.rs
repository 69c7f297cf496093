//! The forward pass's programs fit the CUDA kernels (`--features cuda`; no GPU needed):
//! each fixture is loaded on the default adapter (lavapipe in CI) with the overrides that
//! give the plan a CUDA device gets (no subgroups, no f16 arithmetic, storage decode and
//! prefill), and every op of every layer program (f16 and INT4 experts, both executors,
//! full and partial residency, CPU experts) must have a CUDA kernel taking exactly its
//! bindings and params size: what the CUDA launcher checks at `prepare`.
#![cfg(feature = "cuda")]

mod common;

use common::engine::{load_on, upload};
use common::fixture;
use common::parity::{try_load_dir, Setup, F16, INT4};
use wgmoe::backend::cuda::{device_info, kernels};
use wgmoe::backend::plan::{DecodeKernels, PrefillKernels, Switch};
use wgmoe::backend::{KernelOverrides, KernelPlan, Prepared};
use wgmoe::engine::{Engine, ResidencyOptions};
use wgmoe::model::Executor;

const MODELS: [&str; 4] = [
    "olmoe-tiny",
    "qwen2moe-tiny",
    "qwen3moe-tiny",
    "mixtral-tiny",
];

fn cuda_like(s: Setup) -> Setup {
    Setup {
        portable: true,
        uniform_decode: Some(false),
        window_prefill: Some(false),
        f16_arithmetic: Some(false),
        ..s
    }
}

fn overrides() -> KernelOverrides {
    KernelOverrides {
        portable: true,
        decode: Some(DecodeKernels::Storage),
        prefill: Some(PrefillKernels::Storage),
        f16_arithmetic: Some(Switch::Off),
    }
}

/// Every op of the engine's layer programs fits its CUDA kernel; returns how many ops.
fn check_engine(what: &str, e: &Engine) -> usize {
    let cuda = KernelPlan::decide(
        &device_info("H200".into(), 141 << 30, 12080, (9, 0), false, 49152, 1024),
        &Default::default(),
    )
    .unwrap();
    let p = &e.fwd.plan;
    assert_eq!(
        (
            p.subgroups,
            p.f16_arithmetic,
            p.uniform_decode,
            p.window_prefill
        ),
        (
            cuda.subgroups,
            cuda.f16_arithmetic,
            cuda.uniform_decode,
            cuda.window_prefill
        ),
        "{what}: not the plan of a CUDA device"
    );
    let mut n = 0;
    for (li, l) in e.fwd.layers.iter().enumerate() {
        let progs: Vec<&Prepared> = [Some(&l.pre), Some(&l.post)]
            .into_iter()
            .chain([
                l.post_decode.as_ref(),
                l.routed_only.as_ref(),
                l.routed_only_decode.as_ref(),
            ])
            .flatten()
            .collect();
        for prog in progs {
            for op in &prog.program().ops {
                for k in std::iter::once(op.kernel).chain(op.decode.map(|d| d.0)) {
                    kernels::check_op(op, k)
                        .unwrap_or_else(|err| panic!("{what}: layer {li}: {err}"));
                    n += 1;
                }
            }
        }
    }
    assert!(n > 0, "{what}: no ops");
    n
}

#[test]
fn every_layer_program_fits_the_cuda_kernels() {
    for name in MODELS {
        for (p, s) in [("f16", F16), ("int4", INT4)] {
            for executor in [Executor::Grouped, Executor::PerExpert] {
                let s = cuda_like(Setup { executor, ..s });
                let e = try_load_dir(&fixture(name), 64, s)
                    .unwrap_or_else(|err| panic!("{name} {p}: {err}"));
                let n = check_engine(&format!("{name} {p} {executor:?}"), &e);
                println!("{name} {p} {executor:?}: {n} ops fit");
            }
        }
    }
}

#[test]
fn partial_residency_and_cpu_expert_programs_fit_the_cuda_kernels() {
    for name in ["olmoe-tiny", "qwen2moe-tiny", "mixtral-tiny"] {
        let cfg = wgmoe::config::ModelConfig::from_dir(&fixture(name)).unwrap();
        for (what, r) in [
            (
                "upload",
                ResidencyOptions {
                    resident_experts: Some(cfg.top_k),
                    ..upload()
                },
            ),
            (
                "auto",
                ResidencyOptions {
                    resident_experts: Some(cfg.top_k),
                    ..Default::default()
                },
            ),
            (
                "n-cpu-moe",
                ResidencyOptions {
                    n_cpu_moe: 1,
                    ..Default::default()
                },
            ),
        ] {
            for executor in [Executor::Grouped, Executor::PerExpert] {
                let e = load_on(name, 64, r.clone(), executor, overrides())
                    .unwrap_or_else(|err| panic!("{name} {what}: {err}"));
                let n = check_engine(&format!("{name} {what} {executor:?}"), &e);
                println!("{name} {what} {executor:?}: {n} ops fit");
            }
        }
    }
}

//! The forward pass's programs fit the CUDA kernels (`--features cuda`; no GPU needed):
//! each fixture is loaded on the default adapter (lavapipe in CI) with the overrides that
//! give the plan a CUDA device gets (no f16 arithmetic, storage decode and prefill; 8-lane
//! or, portable, 1-lane W4A16 kernels), and every op of every layer program (f16 and INT4 experts, both executors,
//! full and partial residency, CPU experts) must have a CUDA kernel taking exactly its
//! bindings and params size: what the CUDA launcher checks at `prepare`.
#![cfg(feature = "cuda")]

mod common;

use common::engine::{load_on, upload};
use common::fixture;
use common::parity::{try_load_dir, Setup, F16, INT4};
use wgmoe::backend::cuda::kernels;
use wgmoe::backend::plan::{DecodeKernels, PrefillKernels, Switch};
use wgmoe::backend::{KernelOverrides, Prepared};
use wgmoe::engine::{Engine, ResidencyOptions};
use wgmoe::model::Executor;

const MODELS: [&str; 4] = [
    "olmoe-tiny",
    "qwen2moe-tiny",
    "qwen3moe-tiny",
    "mixtral-tiny",
];

/// The plan of a CUDA device (subgroups: 8-lane W4A16 kernels where lavapipe's subgroups
/// allow, as a CUDA device's warps do; `portable`: one lane per row).
fn cuda_like(s: Setup, portable: bool) -> Setup {
    Setup {
        portable,
        decode: Some(DecodeKernels::Storage),
        prefill: Some(PrefillKernels::Storage),
        f16_arithmetic: Some(false),
        ..s
    }
}

fn overrides(portable: bool) -> KernelOverrides {
    KernelOverrides {
        portable,
        decode: Some(DecodeKernels::Storage),
        prefill: Some(PrefillKernels::Storage),
        f16_arithmetic: Some(Switch::Off),
    }
}

/// Every op of the engine's layer programs fits its CUDA kernel; returns how many ops.
fn check_engine(what: &str, e: &Engine) -> usize {
    let p = &e.fwd.plan;
    assert!(
        !p.f16_arithmetic && !p.uniform_decode && !p.window_prefill,
        "{what}: not a plan a CUDA device gets"
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
                for o in std::iter::once(op).chain(op.decode.as_deref()) {
                    kernels::check_op(o, o.kernel)
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
                for portable in [false, true] {
                    let s = cuda_like(Setup { executor, ..s }, portable);
                    let e = try_load_dir(&fixture(name), 64, s)
                        .unwrap_or_else(|err| panic!("{name} {p}: {err}"));
                    let what = format!("{name} {p} {executor:?} portable {portable}");
                    let n = check_engine(&what, &e);
                    println!("{what}: {n} ops fit");
                }
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
                for portable in [false, true] {
                    let e = load_on(name, 64, r.clone(), executor, overrides(portable))
                        .unwrap_or_else(|err| panic!("{name} {what}: {err}"));
                    let w = format!("{name} {what} {executor:?} portable {portable}");
                    let n = check_engine(&w, &e);
                    println!("{w}: {n} ops fit");
                }
            }
        }
    }
}

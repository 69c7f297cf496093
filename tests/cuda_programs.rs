//! The forward pass's programs fit the CUDA kernels (`--features cuda`; no GPU needed):
//! each fixture is loaded on the default adapter (lavapipe in CI) with the overrides that
//! give it the plan a CUDA device gets (checked against `KernelPlan::decide` on a CUDA
//! device's report): by default the GPU-shaped kernels (coalesced decode, tiled prefill,
//! reduced with warp shuffles or, portable, in shared memory), and with `--decode-kernels
//! storage --prefill-kernels storage` the storage kernels (8-lane or, portable, 1-lane W4A16
//! kernels). Every op of every layer program (f16 and INT4 experts, both executors, full and
//! partial residency, CPU experts) must have a CUDA kernel taking exactly its bindings and
//! params size: what the CUDA launcher checks at `prepare`.
#![cfg(feature = "cuda")]

mod common;

use common::engine::{load_on, upload};
use common::fixture;
use common::parity::{try_load_dir, Setup, F16, INT4};
use wgmoe::backend::cuda::{device_info, kernels, Properties};
use wgmoe::backend::kernel::{KvFormat, WeightFormat};
use wgmoe::backend::plan::{DecodeKernels, PrefillKernels, Switch};
use wgmoe::backend::{Kernel, KernelOverrides, KernelPlan, Prepared};
use wgmoe::model::Executor;
use wgmoe::runtime::engine::{Engine, ResidencyOptions};

const MODELS: [&str; 4] = [
    "olmoe-tiny",
    "qwen2moe-tiny",
    "qwen3moe-tiny",
    "mixtral-tiny",
];

/// The kernels a CUDA device runs: its default (the GPU-shaped ones) or the storage ones
/// (`--decode-kernels storage --prefill-kernels storage`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Gpu,
    Storage,
}

const MODES: [Mode; 2] = [Mode::Gpu, Mode::Storage];

/// What the user passes on a CUDA device for `mode`.
fn cuda_overrides(mode: Mode, portable: bool) -> KernelOverrides {
    KernelOverrides {
        portable,
        ..match mode {
            Mode::Gpu => KernelOverrides::default(),
            Mode::Storage => KernelOverrides {
                decode: Some(DecodeKernels::Storage),
                prefill: Some(PrefillKernels::Storage),
                ..Default::default()
            },
        }
    }
}

/// The overrides that give lavapipe (a CPU adapter) the plan of a CUDA device.
fn overrides(mode: Mode, portable: bool) -> KernelOverrides {
    let (decode, prefill) = match mode {
        Mode::Gpu => (DecodeKernels::Coalesced, PrefillKernels::Tiled),
        Mode::Storage => (DecodeKernels::Storage, PrefillKernels::Storage),
    };
    KernelOverrides {
        portable,
        decode: Some(decode),
        prefill: Some(prefill),
        f16_arithmetic: Some(Switch::Off),
    }
}

fn cuda_like(s: Setup, mode: Mode, portable: bool) -> Setup {
    let o = overrides(mode, portable);
    Setup {
        portable,
        decode: o.decode,
        prefill: o.prefill,
        f16_arithmetic: Some(false),
        ..s
    }
}

/// The plan an H200 gets with `mode`'s overrides.
fn cuda_plan(mode: Mode, portable: bool) -> KernelPlan {
    let dev = device_info(Properties {
        name: "NVIDIA H200".into(),
        mem: 141 << 30,
        driver_version: 12080,
        capability: (9, 0),
        integrated: false,
        shared: 49152,
        threads: 1024,
        warp: 32,
    });
    KernelPlan::decide(&dev, &cuda_overrides(mode, portable)).unwrap()
}

/// Every op of the engine's layer programs fits its CUDA kernel; returns how many ops and
/// their kernels.
fn check_engine(what: &str, e: &Engine, mode: Mode, portable: bool) -> (usize, Vec<Kernel>) {
    let p = &e.fwd.plan;
    let want = KernelPlan {
        // Window starts: unused by any kernel the plan picks here.
        uniform_align: p.uniform_align,
        ..cuda_plan(mode, portable)
    };
    assert_eq!(
        *p, want,
        "{what}: not the plan a CUDA device gets (lavapipe needs subgroups of 8 or more)"
    );
    let mut n = 0;
    let mut seen: Vec<Kernel> = Vec::new();
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
                    seen.push(o.kernel);
                    n += 1;
                }
            }
        }
    }
    assert!(n > 0, "{what}: no ops");
    // The GPU plan's decode runs the GPU-shaped kernels and its prefill the tiled GEMMs, the
    // storage plan's none of them.
    let gpu_shaped = |k: &Kernel| {
        matches!(
            k,
            Kernel::Matvec(_)
                | Kernel::ExpertGateUp(_)
                | Kernel::ExpertDown(_)
                | Kernel::Gemm(_)
                | Kernel::ExpertGemm(_)
                | Kernel::MoeSort
        ) || *k == Kernel::AttnFlash(KvFormat::F32)
    };
    if mode == Mode::Gpu {
        for k in [
            Kernel::AttnFlash(KvFormat::F32),
            Kernel::Matvec(p.rows(WeightFormat::F16)),
            Kernel::Gemm(WeightFormat::F16),
        ] {
            assert!(seen.contains(&k), "{what}: no {k} in {seen:?}");
        }
        assert!(
            !seen.contains(&Kernel::Attention(KvFormat::F32)),
            "{what}: the scratch-row attention under the GPU plan"
        );
    } else {
        assert!(
            !seen.iter().any(gpu_shaped),
            "{what}: a GPU-shaped kernel under the storage plan: {seen:?}"
        );
    }
    (n, seen)
}

#[test]
fn every_layer_program_fits_the_cuda_kernels() {
    for name in MODELS {
        for (p, s) in [("f16", F16), ("int4", INT4)] {
            for executor in [Executor::Grouped, Executor::PerExpert] {
                for (mode, portable) in MODES.into_iter().flat_map(|m| [(m, false), (m, true)]) {
                    let s = cuda_like(Setup { executor, ..s }, mode, portable);
                    let e = try_load_dir(&fixture(name), 64, s)
                        .unwrap_or_else(|err| panic!("{name} {p}: {err}"));
                    let what = format!("{name} {p} {executor:?} {mode:?} portable {portable}");
                    let (n, seen) = check_engine(&what, &e, mode, portable);
                    if mode == Mode::Gpu {
                        // Every expert on the device: the GPU-shaped halves in its format
                        // for one-token steps (and every step of the per-expert executor),
                        // the tiled expert GEMM over the sorted pairs for the grouped one's
                        // multi-token steps.
                        let f = if p == "f16" {
                            WeightFormat::F16
                        } else {
                            WeightFormat::Q4
                        };
                        let r = e.fwd.plan.rows(f);
                        let mut want = vec![Kernel::ExpertGateUp(r), Kernel::ExpertDown(r)];
                        if executor == Executor::Grouped {
                            want.extend([Kernel::ExpertGemm(f), Kernel::MoeSort]);
                        } else {
                            assert!(
                                !seen.contains(&Kernel::MoeSort),
                                "{what}: the per-expert executor sorts pairs: {seen:?}"
                            );
                        }
                        for k in want {
                            assert!(seen.contains(&k), "{what}: no {k} in {seen:?}");
                        }
                    }
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
                for (mode, portable) in MODES.into_iter().flat_map(|m| [(m, false), (m, true)]) {
                    let e = load_on(name, 64, r.clone(), executor, overrides(mode, portable))
                        .unwrap_or_else(|err| panic!("{name} {what}: {err}"));
                    let w = format!("{name} {what} {executor:?} {mode:?} portable {portable}");
                    let (n, _) = check_engine(&w, &e, mode, portable);
                    println!("{w}: {n} ops fit");
                }
            }
        }
    }
}

//! The CUDA kernels compile (`--features cuda`; no GPU needed): every kernel the kernel
//! plan can pick on a CUDA device has a CUDA version, and NVRTC compiles each of them to
//! PTX for the default, an A100 (compute_80) and an H100/H200 (compute_90) target, and to
//! the CUBINs the device loads (sm_80, sm_90).
//!
//! NVRTC convention: `WGMOE_NVRTC_LIB` names the libnvrtc file (CI: the one in PyPI's
//! `nvidia-cuda-nvrtc-cu12` wheel). When it is set, a failure to load it fails the test.
//! When it is unset and no NVRTC is on the loader path, the compile test prints
//! "not run: no NVRTC" and does not pass silently for lack of a library it was told of.
#![cfg(feature = "cuda")]

use wgmoe::backend::cuda::{device_info, kernels, load, Properties};
use wgmoe::backend::kernel::KvFormat;
use wgmoe::backend::{Kernel, KernelOverrides, KernelPlan};

fn h200() -> wgmoe::backend::DeviceInfo {
    device_info(Properties {
        name: "NVIDIA H200".into(),
        mem: 141 << 30,
        driver_version: 12080,
        capability: (9, 0),
        integrated: false,
        shared: 49152,
        threads: 1024,
        warp: 32,
    })
}

/// Every kernel `plan` can pick on a CUDA device: the GPU-shaped kernels of its reduction
/// (every weight format: f16, INT4, Q8_0) where it runs them, the tiled GEMMs (every format)
/// and the pairs' sort where multi-token steps run them, the storage kernels with f32
/// arithmetic, the W4A16 ones in the plan's variant (8 lanes, or 1 when portable), the
/// scratch-row attention where a step runs it, the KV kernels of every cache format (f32,
/// f16, q8_0); never uniform-window, window or expert-major kernels. The Q8_0 storage
/// matmul has no CUDA port: the engine refuses it on CUDA, naming the option.
fn plan_kernels(plan: &KernelPlan) -> Vec<Kernel> {
    assert!(!plan.f16_arithmetic && !plan.uniform_decode && !plan.window_prefill);
    Kernel::all()
        .into_iter()
        .filter(|k| match k {
            Kernel::Q4GateUp(q) | Kernel::Q4Down(q) | Kernel::Q4DownCombine(q) => {
                *q == plan.q4_storage()
            }
            Kernel::Matvec(r) | Kernel::ExpertGateUp(r) | Kernel::ExpertDown(r) => {
                plan.coalesced_decode && *r == plan.rows(r.format)
            }
            Kernel::AttnFlash(_) => plan.flash_decode() || plan.flash_prefill(),
            Kernel::AttnCombine => plan.flash_decode(),
            Kernel::Attention(_) => !plan.flash_prefill(),
            Kernel::Gemm(_) | Kernel::ExpertGemm(_) => plan.tiled_prefill,
            Kernel::MoeSort => plan.tiled_prefill,
            // The Q8_0 storage matmul (both storage overrides): refused on CUDA.
            Kernel::MatmulQ8 => false,
            Kernel::MatmulUniform
            | Kernel::MatmulWindow
            | Kernel::MatmulQ8Uniform
            | Kernel::MatmulQ8Window
            | Kernel::AttentionWindow(_)
            | Kernel::Q4GateUpSorted
            | Kernel::Q4DownSorted
            | Kernel::MoeGather => false,
            _ => true,
        })
        .collect()
}

#[test]
fn every_kernel_the_cuda_plan_picks_has_a_cuda_version() {
    use wgmoe::backend::kernel::{Reduce, RowsVariant, WeightFormat};
    use wgmoe::backend::plan::{DecodeKernels, PrefillKernels};
    let storage = |portable| KernelOverrides {
        portable,
        decode: Some(DecodeKernels::Storage),
        prefill: Some(PrefillKernels::Storage),
        ..Default::default()
    };
    for o in [
        KernelOverrides::default(),
        KernelOverrides {
            portable: true,
            ..Default::default()
        },
        storage(false),
        storage(true),
    ] {
        let plan = KernelPlan::decide(&h200(), &o).unwrap();
        assert_eq!(plan.subgroups, !o.portable, "warps are subgroups of 32");
        assert_eq!(plan.matmul_window_tokens(2048, 64), 0);
        assert!(!plan.expert_major(true, true, 64));
        // A GPU: the GPU-shaped kernels unless overridden, reduced with warp shuffles or,
        // portable, in shared memory.
        let gpu = o.decode.is_none();
        assert_eq!(plan.coalesced_decode, gpu, "{o:?}");
        assert_eq!(plan.tiled_prefill, gpu, "{o:?}");
        let reduce = if o.portable {
            Reduce::Workgroup
        } else {
            Reduce::Subgroup
        };
        assert_eq!(plan.reduce, reduce, "{o:?}");
        if gpu {
            assert!(plan.flash_decode() && plan.flash_prefill());
            assert_eq!(
                plan.rows(WeightFormat::F16),
                RowsVariant {
                    format: WeightFormat::F16,
                    reduce
                }
            );
        } else {
            assert_eq!(plan.attention(128, 64), Kernel::Attention(KvFormat::F32));
        }
        let picked = plan_kernels(&plan);
        for k in &picked {
            assert!(
                kernels::cuda_kernel(*k).is_some(),
                "{k} has no CUDA version"
            );
        }
        if gpu {
            for k in [
                Kernel::Matvec(plan.rows(WeightFormat::F16)),
                Kernel::ExpertGateUp(plan.rows(WeightFormat::Q4)),
                Kernel::ExpertDown(plan.rows(WeightFormat::F16)),
                Kernel::AttnFlash(KvFormat::F32),
                Kernel::AttnCombine,
                Kernel::Gemm(WeightFormat::F16),
                Kernel::ExpertGemm(WeightFormat::F16),
                Kernel::ExpertGemm(WeightFormat::Q4),
                Kernel::Matvec(plan.rows(WeightFormat::Q8)),
                Kernel::ExpertGateUp(plan.rows(WeightFormat::Q8)),
                Kernel::ExpertDown(plan.rows(WeightFormat::Q8)),
                Kernel::Gemm(WeightFormat::Q8),
                Kernel::ExpertGemm(WeightFormat::Q8),
                Kernel::AttnFlash(KvFormat::F16),
                Kernel::RopeKv(KvFormat::F16),
                Kernel::AttnFlash(KvFormat::Q8),
                Kernel::RopeKv(KvFormat::Q8),
                Kernel::MoeSort,
            ] {
                assert!(picked.contains(&k), "{k} is not among {picked:?}");
            }
        } else {
            for k in [
                Kernel::Attention(KvFormat::F16),
                Kernel::RopeKv(KvFormat::F16),
                Kernel::Attention(KvFormat::Q8),
                Kernel::RopeKv(KvFormat::Q8),
            ] {
                assert!(picked.contains(&k), "{k} is not among {picked:?}");
            }
        }
    }
    // Overrides the CUDA kernels cannot honour are refused, not ignored.
    let o = KernelOverrides {
        decode: Some(wgmoe::backend::plan::DecodeKernels::Uniform),
        ..Default::default()
    };
    assert!(KernelPlan::decide(&h200(), &o).is_err());
    for o in [
        KernelOverrides {
            f16_arithmetic: Some(wgmoe::backend::plan::Switch::On),
            ..Default::default()
        },
        KernelOverrides {
            f16_arithmetic: Some(wgmoe::backend::plan::Switch::On),
            ..storage(false)
        },
    ] {
        assert!(KernelPlan::decide(&h200(), &o).is_err(), "{o:?}");
    }
    let o = KernelOverrides {
        prefill: Some(wgmoe::backend::plan::PrefillKernels::Window),
        ..Default::default()
    };
    assert!(KernelPlan::decide(&h200(), &o).is_err());
}

#[test]
fn nvrtc_compiles_every_cuda_kernel_to_ptx_and_cubin() {
    let required = std::env::var_os(load::NVRTC_ENV).is_some();
    let version = match load::nvrtc() {
        Ok(v) => v,
        Err(e) if !required => {
            println!(
                "not run: no NVRTC ({e}); set {}=/path/to/libnvrtc.so.12 to run it",
                load::NVRTC_ENV
            );
            return;
        }
        Err(e) => panic!("{} is set but NVRTC cannot be used: {e}", load::NVRTC_ENV),
    };
    println!("NVRTC {}.{}", version.0, version.1);
    let all = kernels::kernels();
    assert!(all.len() >= 16, "{all:?}");
    for arch in [None, Some("compute_80"), Some("compute_90")] {
        for &k in &all {
            let ptx = kernels::ptx(k, arch).unwrap_or_else(|e| panic!("{k} ({arch:?}): {e}"));
            let entry = kernels::cuda_kernel(k).unwrap().entry;
            assert!(
                ptx.contains(&format!(".entry {entry}(")),
                "{k} ({arch:?}): no entry point `{entry}` in its PTX"
            );
        }
    }
    // What the device loads: a CUBIN for its own architecture (A100, H100/H200).
    for arch in ["sm_80", "sm_90"] {
        for &k in &all {
            let cubin =
                kernels::binary(k, Some(arch)).unwrap_or_else(|e| panic!("{k} ({arch}): {e}"));
            assert!(
                cubin.starts_with(b"\x7fELF"),
                "{k} ({arch}): not an ELF CUBIN"
            );
        }
    }
    println!(
        "compiled {} CUDA kernels to PTX for 3 targets and CUBIN for 2",
        all.len()
    );
}

#[test]
fn a_kernel_that_does_not_compile_fails_with_the_log() {
    if load::nvrtc().is_err() && std::env::var_os(load::NVRTC_ENV).is_none() {
        println!("not run: no NVRTC");
        return;
    }
    // A params struct of the wrong size trips common.cuh's static_assert.
    let src = kernels::source(Kernel::Embed).unwrap().replacen(
        "WGMOE_SIZE_EmbedParams 16",
        "WGMOE_SIZE_EmbedParams 20",
        1,
    );
    let e = kernels::compile_source("embed (bad size)", &src, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not match its Rust twin"), "{e}");
    let e = kernels::compile_source("broken", "extern \"C\" __global__ void k() { x; }", None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("broken") && e.contains("identifier \"x\" is undefined"),
        "{e}"
    );
}

#[test]
fn the_cuda_sources_check_their_params_layout() {
    // The static_assert in common.cuh ties each CUDA params struct to its Rust twin: every
    // struct a kernel names is checked in its file, with the Rust size defined.
    for k in kernels::kernels() {
        let ck = kernels::cuda_kernel(k).unwrap();
        let src = kernels::source(k).unwrap();
        assert!(
            src.contains(&format!(
                "#define WGMOE_SIZE_{} {}\n",
                ck.params,
                k.params_layout().1
            )),
            "{k}"
        );
        assert!(
            src.contains(&format!("CHECK_PARAMS({});", ck.params)),
            "{k}"
        );
        assert!(
            src.contains(&format!("extern \"C\" __global__ void {}(", ck.entry)),
            "{k}"
        );
    }
}

#[test]
fn the_cuda_flags_are_the_rust_flags() {
    // common.cuh's flag bits, joined before every file, are backend::params::flags.
    let src = kernels::source(Kernel::Embed).unwrap();
    for (name, v) in wgmoe::backend::params::flags::ALL {
        assert!(
            src.contains(&format!("#define {name} {v}u\n")),
            "common.cuh does not define {name} as {v}u"
        );
    }
}

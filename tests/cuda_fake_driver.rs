//! The CUDA backend end to end without a GPU (`--features cuda`): a fake libcuda
//! (tests/cuda_fake_driver.cpp: device memory is host memory, every call done at once, a
//! launch runs the kernel's CPU emulation from tests/cuda_emu.h) is loaded in place of the
//! driver, and the real `backend/cuda` code (allocation, writes, reads, copies, pinned
//! staging, event fences, NVRTC compilation of every kernel file, argument packing, grids)
//! runs the fixture models against transformers' goldens with the parity tests'
//! tolerances, full and partial residency. This checks the backend's logic; it is not a
//! run on a GPU (no real memory spaces or timing). Needs a C++ compiler (`CXX`, default
//! g++) and NVRTC (`WGMOE_NVRTC_LIB`); without them it prints "not run". With
//! `WGMOE_FAKE_CUDA_OUT=DIR` the fake `libcuda.so` is also copied to DIR.
// The fake driver is an ELF shared library built with g++ and loaded RTLD_GLOBAL: Unix only.
#![cfg(all(feature = "cuda", unix))]

mod common;

use common::engine::{greedy, load, upload};
use common::parity::*;
use common::*;
use wgmoe::backend::cuda::{kernels, load as cuda_load};
use wgmoe::backend::{BackendChoice, Device, DeviceRequest};
use wgmoe::model::Executor;
use wgmoe::runtime::engine::ResidencyOptions;

const EMU_H: &str = include_str!("cuda_emu.h");
const FAKE: &str = include_str!("cuda_fake_driver.cpp");

/// Build the fake driver into `dir` and load it in place of libcuda; false (printed) when
/// the machine lacks what it needs.
fn install_fake_driver(dir: &std::path::Path) -> bool {
    let Some(cxx) = common::cxx::compiler() else {
        return false;
    };
    if let Err(e) = cuda_load::nvrtc() {
        if std::env::var_os(cuda_load::NVRTC_ENV).is_some() {
            panic!(
                "{} is set but NVRTC cannot be used: {e}",
                cuda_load::NVRTC_ENV
            );
        }
        println!("not run: no NVRTC ({e})");
        return false;
    }
    let mut files = vec![dir.join("fake_driver.cpp")];
    std::fs::write(&files[0], FAKE).unwrap();
    let mut table = String::from("typedef int (*Dispatch)(const char*, unsigned, unsigned, unsigned, unsigned, void**);\nextern \"C\" {\n");
    let mut names = Vec::new();
    for (file, _) in kernels::SOURCES {
        let stem = file.trim_end_matches(".cu");
        let src = kernels::assemble(file, "").unwrap();
        // Threads that meet (barriers, shuffles) run as coroutines; the others in a loop.
        let barriers = src.contains("__syncthreads()") || src.contains("__shfl_");
        let mut dispatch = String::new();
        for k in kernels::kernels_of(file) {
            let e = kernels::cuda_kernel(k).unwrap().entry;
            dispatch.push_str(&format!(
                "    if (!strcmp(entry, \"{e}\")) {{ emu::launch({e}, {barriers}, gx, gy, gz, block, args); return 0; }}\n"
            ));
        }
        let f = dir.join(format!("{stem}.cpp"));
        // Each file's kernels in a namespace of their own: an inline function two files
        // both define (rows.cuh's reductions) reads its file's emulation state (threadIdx,
        // the coroutines), and linked into one library the linker would keep one copy.
        std::fs::write(
            &f,
            format!(
                "{EMU_H}\nnamespace wgmoe_{stem} {{\n{src}\n}}\nusing namespace wgmoe_{stem};\nextern \"C\" int wgmoe_emu_dispatch_{stem}(const char* entry, unsigned gx, unsigned gy, unsigned gz, unsigned block, void** args) {{\n{dispatch}    return -1;\n}}\n"
            ),
        )
        .unwrap();
        files.push(f);
        table.push_str(&format!(
            "int wgmoe_emu_dispatch_{stem}(const char*, unsigned, unsigned, unsigned, unsigned, void**);\n"
        ));
        names.push(format!("wgmoe_emu_dispatch_{stem}"));
    }
    table.push_str(&format!(
        "Dispatch wgmoe_emu_dispatchers[] = {{ {} }};\nint wgmoe_emu_dispatcher_count = {};\n}}\n",
        names.join(", "),
        names.len()
    ));
    let t = dir.join("table.cpp");
    std::fs::write(&t, table).unwrap();
    files.push(t);
    // The soname cudarc asks for first, so its lookup finds this library once loaded.
    let so = dir.join("libcuda.so");
    let out = std::process::Command::new(&cxx)
        .args(["-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w"])
        .arg("-Wl,-soname,libcuda.so")
        .arg("-o")
        .arg(&so)
        .args(&files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the fake driver does not build:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A copy for running other programs on the fake driver (LD_LIBRARY_PATH), e.g. the CUDA
    // branch of tools/gpu-check.sh without a GPU.
    if let Some(out) = std::env::var_os("WGMOE_FAKE_CUDA_OUT") {
        let out = std::path::Path::new(&out);
        std::fs::create_dir_all(out).unwrap();
        std::fs::copy(&so, out.join("libcuda.so")).unwrap();
    }
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: our own library; loading it runs only the C++ runtime's initialisers.
    let lib = unsafe { Library::open(Some(&so), RTLD_NOW | RTLD_GLOBAL) }.unwrap();
    // Loaded for the life of the process, as a driver is.
    std::mem::forget(lib);
    true
}

#[test]
fn the_cuda_backend_on_a_fake_driver_matches_transformers() {
    let tmp = tempfile::tempdir().unwrap();
    if !install_fake_driver(tmp.path()) {
        return;
    }
    use_backend(BackendChoice::Cuda);
    init_env();
    let dev = Device::open(&DeviceRequest {
        backend: Some(BackendChoice::Cuda),
        ..Default::default()
    })
    .unwrap();
    assert!(dev.info().name.contains("fake"), "{}", dev.info().name);
    assert_eq!(dev.info().backend, "cuda");
    drop(dev);
    // Every family with f16 and INT4 experts, both executors.
    for name in [
        "olmoe-tiny",
        "qwen2moe-tiny",
        "qwen3moe-tiny",
        "mixtral-tiny",
    ] {
        check_fixture(name, F16);
        check_fixture(name, INT4);
        let per_expert = Setup {
            executor: Executor::PerExpert,
            ..INT4
        };
        check_fixture(name, per_expert);
        println!("{name}: f16 and int4 (both executors) match the goldens on the fake driver");
    }
    // The one-lane W4A16 kernels (`--portable-kernels`) as well as the 8-lane default.
    for name in ["olmoe-tiny", "qwen2moe-tiny"] {
        check_fixture(
            name,
            Setup {
                portable: true,
                ..INT4
            },
        );
    }
    // Q8_0 dense weights (the Q8_0 matvec, expert row kernels, GEMMs) against the Q8_0
    // goldens on every family; the f16 KV cache (rope_kv writing pairs, flash attention
    // reading them) with them on two, within F16_KV_TOL_SCALE x the f32 tolerance.
    for name in [
        "olmoe-tiny",
        "qwen2moe-tiny",
        "qwen3moe-tiny",
        "mixtral-tiny",
    ] {
        check_fixture(name, Q8);
    }
    for name in ["olmoe-tiny", "qwen2moe-tiny"] {
        check_fixture(
            name,
            Setup {
                kv: wgmoe::runtime::engine::KvPrecision::F16,
                tol_scale: F16_KV_TOL_SCALE,
                ..Q8
            },
        );
        println!(
            "{name}: q8_0 dense weights with the f16 KV cache match the goldens on the fake driver"
        );
    }
    // Partial residency: misses uploaded through pinned staging and event fences.
    for name in ["olmoe-tiny", "qwen2moe-tiny"] {
        let golden = load_golden(&format!("{name}.int4.safetensors"));
        let cfg = wgmoe::config::ModelConfig::from_dir(&fixture(name)).unwrap();
        for executor in [Executor::Grouped, Executor::PerExpert] {
            for r in [
                ResidencyOptions {
                    resident_experts: Some(cfg.top_k),
                    ..upload()
                },
                ResidencyOptions {
                    resident_experts: Some(cfg.top_k),
                    ..Default::default()
                },
            ] {
                let policy = r.miss_policy;
                let mut e = load(name, 64, r, executor).unwrap();
                for g in &golden.prompts {
                    let got = greedy(&mut e, &g.prompt_ids, g.generated_ids.len()).unwrap();
                    if let Some(s) = got.iter().zip(&g.generated_ids).position(|(a, b)| a != b) {
                        assert!(
                            g.step_gap[s] < NEAR_TIE,
                            "{name} {executor:?} {policy:?}: step {s}: {} != golden {}",
                            got[s],
                            g.generated_ids[s]
                        );
                    }
                }
                let st = e.fwd.residency.as_ref().map(|r| r.stats()).unwrap();
                println!(
                    "{name} {executor:?} {policy:?}, {} resident: hits {} misses {} h2d {} bytes",
                    cfg.top_k, st.expert_hits, st.expert_misses, st.h2d_bytes
                );
            }
        }
    }
    // --profile-kernels: a timing event before and after each launch, read once the stream
    // is done (the fake driver refuses elapsed times of events made without timing or not
    // yet complete); the replays leave the tokens as they were.
    let mut e = load("olmoe-tiny", 64, Default::default(), Executor::Grouped).unwrap();
    let prompt = [3u32, 17, 101, 7];
    let plain = greedy(&mut e, &prompt, 4).unwrap();
    e.fwd.kernel_profile = Some(Default::default());
    let profiled = greedy(&mut e, &prompt, 4).unwrap();
    assert_eq!(profiled, plain, "the profile's replays changed the tokens");
    let p = e.fwd.kernel_profile.as_ref().unwrap();
    assert_eq!(p.clock, Some(wgmoe::backend::ProfileClock::GpuTimestamps));
    assert_eq!(p.decode_steps, 3);
    let launches: usize = p.decode.values().map(|v| v.1).sum();
    // Decode steps at positions 4, 5 and 6 (after the 4-token prompt).
    let want: usize = (4..7)
        .map(|pos| e.fwd.dispatches_per_decode_step(pos))
        .sum();
    assert_eq!(launches, want);
    let secs: f64 = p.decode.values().map(|v| v.0).sum();
    assert!(secs > 0.0 && secs.is_finite(), "{secs}");
    assert!(
        p.decode.keys().any(|(stage, _)| stage == "attention"),
        "{:?}",
        p.decode
    );
    println!(
        "olmoe-tiny: --profile-kernels timed {launches} launches with events on the fake driver"
    );
}

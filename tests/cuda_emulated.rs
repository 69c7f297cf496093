//! The CUDA kernels run on the CPU (`--features cuda`; no GPU needed): each kernel's CUDA
//! C source, as NVRTC gets it, is compiled by the host C++ compiler against a small
//! emulation of CUDA's launch model (tests/cuda_emu.h: blocks in turn, a block's threads
//! as coroutines that meet at __syncthreads and at warp shuffles). The forward pass's layer
//! programs of each fixture, recorded on lavapipe under the plan a CUDA device gets (its
//! default GPU-shaped kernels, and the storage ones it runs when told), then run twice
//! from the same buffer contents: on lavapipe (the WGSL kernels) and through the emulated
//! CUDA kernels with the launcher's argument order and grids. Every buffer must agree.
//! This checks the kernels' logic and the launch convention, not CUDA itself: it is not a
//! run on a GPU. Without a C++ compiler (`CXX`, default `g++`) it prints "not run".
#![cfg(feature = "cuda")]

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::fixture;
use common::parity::{try_load_dir, Setup, F16, INT4, Q8};
use wgmoe::backend::cuda::kernels;
use wgmoe::backend::params::Step;
use wgmoe::backend::params::GEMM_TOKENS;
use wgmoe::backend::plan::{DecodeKernels, PrefillKernels};
use wgmoe::backend::{Buffer, Device, Kernel, Prepared, Program, Resource, Work};
use wgmoe::model::Executor;
use wgmoe::runtime::engine::KvPrecision;

// The tiled prefill kernels against the CPU reference.
#[path = "cuda_emulated/tiled.rs"]
mod tiled;

// The K-plane kernels (GGUF's K-quant and 5-bit blocks) against lavapipe.
#[path = "cuda_emulated/kplanes.rs"]
mod kplanes;

const EMU_H: &str = include_str!("cuda_emu.h");

type Launch = unsafe extern "C" fn(
    *const std::ffi::c_char,
    u32,
    u32,
    u32,
    u32,
    *mut *mut std::ffi::c_void,
) -> i32;

/// The emulated kernels: one shared library per CUDA source file.
struct Emulator {
    _libs: Vec<libloading::Library>,
    launch: HashMap<Kernel, Launch>,
}

impl Emulator {
    /// Launch `k` with cuLaunchKernel's argument convention.
    fn launch(&self, k: Kernel, grid: [u32; 3], block: u32, args: &mut [*mut std::ffi::c_void]) {
        let entry = std::ffi::CString::new(kernels::cuda_kernel(k).unwrap().entry).unwrap();
        // The emulator keeps a launch's state (the block and thread indices, the threads'
        // stacks, `__shared__` arrays) in each library's statics: one launch at a time,
        // whichever test of this file it comes from.
        static LAUNCH: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = LAUNCH.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `args` is the kernel's argument list (see `emulate`).
        let r = unsafe {
            (self.launch[&k])(
                entry.as_ptr(),
                grid[0],
                grid[1],
                grid[2],
                block,
                args.as_mut_ptr(),
            )
        };
        assert_eq!(r, 0, "{k}: no emulated entry point");
    }
}

/// The emulated kernels, built once for the tests of this file (they run in parallel).
fn emulator() -> Option<&'static Emulator> {
    static EMU: std::sync::OnceLock<Option<Emulator>> = std::sync::OnceLock::new();
    EMU.get_or_init(|| {
        // The libraries stay mapped once loaded; their files may go.
        let tmp = tempfile::tempdir().unwrap();
        build(tmp.path())
    })
    .as_ref()
}

fn build(dir: &Path) -> Option<Emulator> {
    let cxx = common::cxx::compiler()?;
    let mut libs = Vec::new();
    let mut launch = HashMap::new();
    for (file, _) in kernels::SOURCES {
        // The very text NVRTC compiles, but for the f16 piece (PTX asm: tests/cuda_emu.h
        // has a C++ one).
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
        let stem = file.trim_end_matches(".cu");
        let cpp = dir.join(format!("{stem}.cpp"));
        // Each file's kernels in a namespace of their own: an inline function two files
        // both define (rows.cuh's reductions) reads its file's emulation state (threadIdx,
        // the coroutines), and linked into one library the linker would keep one copy.
        let so = dir.join(format!("lib{stem}.so"));
        std::fs::write(
            &cpp,
            format!(
                "{EMU_H}\nnamespace wgmoe_{stem} {{\n{src}\n}}\nusing namespace wgmoe_{stem};\nextern \"C\" int wgmoe_emu_launch(const char* entry, unsigned gx, unsigned gy, unsigned gz, unsigned block, void** args) {{\n{dispatch}    return -1;\n}}\n"
            ),
        )
        .unwrap();
        let out = std::process::Command::new(&cxx)
            .args([
                "-std=c++20",
                "-O1",
                "-shared",
                "-fPIC",
                "-pthread",
                "-w",
                "-o",
            ])
            .arg(&so)
            .arg(&cpp)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{file}: the emulated kernels do not compile:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // SAFETY: a library just built from our own source; its initialisers are the C++
        // runtime's.
        let lib = unsafe { libloading::Library::new(&so) }.unwrap();
        // SAFETY: the symbol has exactly the `Launch` signature (written above).
        let f: Launch = unsafe { *lib.get::<Launch>(b"wgmoe_emu_launch").unwrap() };
        for k in kernels::kernels_of(file) {
            launch.insert(k, f);
        }
        libs.push(lib);
    }
    Some(Emulator {
        _libs: libs,
        launch,
    })
}

/// A buffer's bytes on the host, 16-byte aligned as device memory is.
struct Host(Vec<u128>);

impl Host {
    fn new(bytes: &[u8]) -> Self {
        let mut v = vec![0u128; bytes.len().div_ceil(16)];
        bytemuck::cast_slice_mut::<u128, u8>(&mut v)[..bytes.len()].copy_from_slice(bytes);
        Host(v)
    }
    fn words(&self) -> &[u32] {
        bytemuck::cast_slice(&self.0)
    }
}

/// Every distinct buffer a program binds.
fn buffers(p: &Program) -> Vec<Buffer> {
    let mut v: Vec<Buffer> = Vec::new();
    for op in &p.ops {
        for b in &op.binds {
            let buf = match &b.resource {
                Resource::Buffer(b) => b,
                Resource::Window { buffer, .. } => buffer,
            };
            if !v.iter().any(|x| x.same(buf)) {
                v.push(buf.clone());
            }
        }
    }
    v
}

/// Run `p` through the emulated kernels on host copies, as the CUDA launcher would.
fn emulate(
    emu: &Emulator,
    p: &Program,
    bufs: &[Buffer],
    host: &mut [Host],
    step: Step,
    tokens: u32,
) {
    let mut step = step;
    for op in &p.ops {
        let Some((kernel, grid, _)) = op.dispatch(tokens, step.pos0) else {
            continue;
        };
        let (op, _) = op.for_tokens(tokens);
        let ck = kernels::check_op(op, kernel).unwrap();
        let mut params: Vec<u32> = bytemuck::pod_collect_to_vec(&op.params);
        let mut step_ptr: *mut Step = &mut step;
        let mut ptrs: Vec<*mut u8> = ck
            .bindings
            .iter()
            .map(|b| {
                let bound = op.binds.iter().find(|x| x.binding == *b).unwrap();
                let buf = match &bound.resource {
                    Resource::Buffer(b) => b,
                    Resource::Window { buffer, .. } => buffer,
                };
                let i = bufs.iter().position(|x| x.same(buf)).unwrap();
                host[i].0.as_mut_ptr().cast::<u8>()
            })
            .collect();
        let mut args: Vec<*mut std::ffi::c_void> = vec![
            params.as_mut_ptr().cast(),
            (&mut step_ptr as *mut *mut Step).cast(),
        ];
        for p in ptrs.iter_mut() {
            args.push((p as *mut *mut u8).cast());
        }
        // The arguments are the kernel's: params, step pointer, one pointer per binding in
        // order, each to a live host copy of the buffer's whole size.
        emu.launch(kernel, grid, ck.block, &mut args);
    }
}

/// Words that differ beyond f32 rounding: ids and other integers (tiny as floats) must be
/// equal; floats within 1e-4 of max(1, |lavapipe|).
fn differences(emu: &[u32], gpu: &[u32]) -> Vec<(usize, u32, u32)> {
    emu.iter()
        .zip(gpu)
        .enumerate()
        .filter(|(_, (a, b))| {
            if a == b {
                return false;
            }
            let (fa, fb) = (f32::from_bits(**a), f32::from_bits(**b));
            let int_like = |w: u32| w & 0x7fff_ffff < 0x0080_0000;
            if int_like(**a) || int_like(**b) {
                return true;
            }
            if fa.is_nan() && fb.is_nan() {
                return false;
            }
            // NaN against a number differs too.
            (fa - fb).abs() > 1e-4 * fb.abs().max(1.0) || fa.is_nan() != fb.is_nan()
        })
        .map(|(i, (a, b))| (i, *a, *b))
        .collect()
}

/// Run a program on lavapipe and emulated from the same buffer contents; returns the kernels
/// it dispatched.
fn compare(
    emu: &Emulator,
    dev: &Device,
    what: &str,
    program: &Program,
    pos0: usize,
    tokens: usize,
) -> Vec<Kernel> {
    let program = program.clone();
    let bufs = buffers(&program);
    let step_b = dev.step_buffer(pos0, tokens).unwrap();
    let p = dev.prepare(program.clone(), &step_b).unwrap();
    let before: Vec<Vec<u8>> = bufs
        .iter()
        .map(|b| dev.read(b, 0, b.size()).unwrap())
        .collect();
    dev.submit(&[Work::Run {
        program: &p,
        tokens: tokens as u32,
        pos0: pos0 as u32,
    }])
    .unwrap();
    dev.sync().unwrap();
    let after: Vec<Vec<u8>> = bufs
        .iter()
        .map(|b| dev.read(b, 0, b.size()).unwrap())
        .collect();
    let mut host: Vec<Host> = before.iter().map(|b| Host::new(b)).collect();
    let step = Step {
        pos0: pos0 as u32,
        n_tokens: tokens as u32,
        ..Default::default()
    };
    emulate(emu, &program, &bufs, &mut host, step, tokens as u32);
    // The kernels this step dispatched (not every alternative the program holds).
    let mut kernels: Vec<Kernel> = program
        .ops
        .iter()
        .filter_map(|o| o.dispatch(tokens as u32, pos0 as u32).map(|d| d.0))
        .collect();
    kernels.sort();
    kernels.dedup();
    for (i, (h, a)) in host.iter().zip(&after).enumerate() {
        let gpu: &[u32] = &bytemuck::pod_collect_to_vec::<u8, u32>(&a[..a.len() / 4 * 4]);
        let d = differences(&h.words()[..gpu.len()], gpu);
        assert!(
            d.is_empty(),
            "{what} (pos0 {pos0}, {tokens} tokens; kernels {kernels:?}): buffer {i} ({:?}): {} words differ, first (word, emulated CUDA, lavapipe): {:?}",
            bufs[i],
            d.len(),
            &d[..d.len().min(5)]
                .iter()
                .map(|(w, a, b)| (*w, f32::from_bits(*a), f32::from_bits(*b)))
                .collect::<Vec<_>>()
        );
    }
    kernels
}

/// The plan of a CUDA device on lavapipe (tests/cuda_programs.rs checks it is the one):
/// `gpu`, its default, the GPU-shaped kernels (coalesced decode, tiled prefill); else the
/// storage kernels (`--decode-kernels storage --prefill-kernels storage`). `portable`:
/// shared-memory reductions and 1-lane W4A16 kernels instead of warp shuffles.
fn cuda_like(s: Setup, gpu: bool, portable: bool) -> Setup {
    let (decode, prefill) = if gpu {
        (DecodeKernels::Coalesced, PrefillKernels::Tiled)
    } else {
        (DecodeKernels::Storage, PrefillKernels::Storage)
    };
    Setup {
        portable,
        decode: Some(decode),
        prefill: Some(prefill),
        f16_arithmetic: Some(false),
        ..s
    }
}

#[test]
fn emulated_cuda_kernels_match_lavapipe_on_every_layer_program() {
    let Some(emu) = emulator() else {
        return;
    };
    let mut covered: Vec<Kernel> = head_kernels(emu);
    covered.extend(kplanes::k_plane_kernels(emu));
    let mut longest = 0;
    for name in [
        "olmoe-tiny",
        "qwen2moe-tiny",
        "qwen3moe-tiny",
        "mixtral-tiny",
        // A GGUF file's Q4_K experts and its Q4_K/Q6_K downs (and, with Q8_0 dense
        // weights, its Q4_K and Q6_K attention) in their own blocks: the K-plane row
        // kernels, matvec and GEMMs, on the GPU plan; int4-strict rounds its Q6_K downs into
        // affine INT4 (the int4-a32 down kernels).
        "gguf/qwen3moe/qwen3moe-Q4_K_M.gguf",
        // A Q4_0 file's experts and attention in affine INT4: the int4-a32 row kernels,
        // matvec and GEMMs.
        "gguf/qwen3moe/qwen3moe-Q4_0.gguf",
    ] {
        // The GPU plan (a CUDA device's default) in full; of the storage plan, the grouped
        // executor with either reduction: its one-token INT4 steps fuse the combine into
        // the W4A16 down kernel (8 lanes, or 1 when portable), which no other plan runs; the
        // per-expert executor's storage kernels are the GPU plan's multi-token ones.
        let every = [
            (true, Executor::Grouped, false),
            (true, Executor::PerExpert, false),
            (true, Executor::Grouped, true),
            (true, Executor::PerExpert, true),
            (false, Executor::Grouped, false),
            (false, Executor::Grouped, true),
        ];
        // Q8_0 dense weights with the f16 KV cache: the Q8_0 matvec, expert row kernels (a
        // dense MLP, a shared expert), GEMM and expert GEMM, and the f16 cache's rope_kv and
        // flash attention, on the GPU plan (either reduction; the executor concerns only the
        // routed INT4 experts, covered above); the scratch-row attention over the f16 cache
        // on the storage plan (with f16 dense weights: the Q8_0 storage matmul has no CUDA
        // port). The q8_0 KV cache likewise, once each: its rope_kv and flash attention on
        // the GPU plan, its scratch-row attention on the storage plan.
        let q8_kv16 = [
            (true, Executor::Grouped, false),
            (true, Executor::Grouped, true),
        ];
        let kv16_storage = [(false, Executor::Grouped, false)];
        let q8_kvq8 = [(true, Executor::Grouped, false)];
        let kv16 = KvPrecision::F16;
        let kvq8 = KvPrecision::Q8_0;
        for (p, s, configs) in [
            ("f16", F16, &every[..]),
            ("int4", INT4, &every[..]),
            ("q8_0 kv f16", Setup { kv: kv16, ..Q8 }, &q8_kv16[..]),
            (
                "int4-strict",
                Setup {
                    precision: wgmoe::runtime::engine::ExpertPrecision::Int4Strict,
                    ..INT4
                },
                &q8_kv16[..],
            ),
            ("int4 kv f16", Setup { kv: kv16, ..INT4 }, &kv16_storage[..]),
            ("q8_0 kv q8_0", Setup { kv: kvq8, ..Q8 }, &q8_kvq8[..]),
            (
                "int4 kv q8_0",
                Setup { kv: kvq8, ..INT4 },
                &kv16_storage[..],
            ),
        ] {
            for &(gpu, executor, portable) in configs {
                let gguf = name.ends_with(".gguf");
                if gguf && (!["int4", "q8_0 kv f16", "int4-strict"].contains(&p) || !gpu) {
                    continue;
                }
                // A 4-bit file holds the same with int4-strict; its int4 runs the GPU plan
                // once (the row kernels' reductions come from the Q8_0 runs).
                if name.ends_with("Q4_0.gguf")
                    && (p == "int4-strict" || (p == "int4" && executor != Executor::Grouped))
                {
                    continue;
                }
                // The same as int4 on a safetensors checkpoint.
                if !gguf && p == "int4-strict" {
                    continue;
                }
                let s = cuda_like(Setup { executor, ..s }, gpu, portable);
                let mut e = try_load_dir(&fixture(name), 64, s).unwrap();
                // Fill the buffers (activations, KV cache) with a real prefill and decode.
                let prompt: Vec<u32> = (1..=LONG as u32).collect();
                common::engine::greedy(&mut e, &prompt, 2).unwrap();
                let dev = e.fwd.dev.clone();
                let plan = if gpu { "gpu" } else { "storage" };
                let what = format!("{name} {p} {executor:?} {plan} portable {portable}");
                for (li, l) in e.fwd.layers.iter().enumerate() {
                    // Later positions too: attention over several key tiles (the online
                    // softmax's rescaling) and, one token, over both key splits.
                    let mut runs: Vec<(&str, &Prepared, usize, usize)> = vec![
                        ("pre", &l.pre, 0, 8),
                        ("post", &l.post, 0, 8),
                        ("pre", &l.pre, 8, 1),
                        ("post(1)", l.post_for(1), 8, 1),
                        ("pre", &l.pre, 24, 8),
                        ("pre", &l.pre, 40, 1),
                    ];
                    // Fused routing: the one-token programs without router_topk.
                    if let Some((fpre, fpost)) = &l.fused_decode {
                        runs.extend([("fused pre", fpre, 8, 1), ("fused post(1)", fpost, 8, 1)]);
                    }
                    // The tiled GEMMs over several token tiles, the last one partial, and
                    // the expert GEMM over runs of more pairs than a block serves.
                    if gpu {
                        runs.extend([("pre", &l.pre, 0, LONG), ("post", &l.post, 0, LONG)]);
                    }
                    for (part, prep, pos0, t) in runs {
                        let w = format!("{what} layer {li} {part}");
                        covered.extend(compare(emu, &dev, &w, prep.program(), pos0, t));
                        if t == LONG {
                            if let Some(run) = longest_run(&dev, prep.program()) {
                                assert!(run > GEMM_TOKENS, "{w}: longest run of pairs {run}");
                                longest = longest.max(run);
                            }
                        }
                    }
                }
                println!("{what}: {} layers agree", e.fwd.layers.len());
            }
        }
    }
    covered.sort();
    covered.dedup();
    let missing: Vec<Kernel> = kernels::kernels()
        .into_iter()
        .filter(|k| !covered.contains(k))
        .collect();
    assert!(
        missing.is_empty(),
        "CUDA kernels never emulated: {missing:?}"
    );
    println!(
        "{} CUDA kernels emulated; longest run of one expert's pairs {longest}",
        covered.len()
    );
}

/// Tokens of the long steps: three token tiles of the tiled GEMMs (16 each), the last one
/// partial, and with top-3 of at most 7 experts some expert has more than 16 pairs.
const LONG: usize = 40;

/// The longest run of one expert's pairs the program's sort (if any) left in its pairs
/// buffer (moe_sort's layout: run ends at 2 pmax + e), as lavapipe computed it.
fn longest_run(dev: &Device, p: &Program) -> Option<usize> {
    use wgmoe::backend::params::MoeSortParams;
    let op = p.ops.iter().find(|o| o.kernel == Kernel::MoeSort)?;
    let sp: MoeSortParams = bytemuck::pod_read_unaligned(&op.params);
    let Resource::Buffer(b) = &op.binds.iter().find(|b| b.binding == 3)?.resource else {
        panic!("moe_sort's pairs are not a storage buffer");
    };
    let ends: Vec<u32> = bytemuck::pod_collect_to_vec(
        &dev.read(b, 8 * sp.pmax as u64, 4 * sp.n_experts as u64)
            .unwrap(),
    );
    let mut start = 0;
    let mut longest = 0;
    for end in ends {
        longest = longest.max(end.saturating_sub(start) as usize);
        start = end;
    }
    Some(longest)
}

/// The embedding gather and greedy argmax (the head's kernels outside the layer programs),
/// over a table split into chunks and rows with ties, NaN and suppressed ids.
fn head_kernels(emu: &Emulator) -> Vec<Kernel> {
    use common::rng::Rng;
    use wgmoe::backend::params::{flags, ArgmaxParams};
    use wgmoe::backend::{DeviceRequest, Usage};
    use wgmoe::model::ops;
    use wgmoe::model::tensors::F16Matrix;
    common::init_env();
    let dev = Device::open(&DeviceRequest {
        max_binding: Some(4096),
        ..Default::default()
    })
    .unwrap();
    let mut rng = Rng::new(5);
    let mut out = Vec::new();
    let (vocab, hidden) = (50, 100);
    let table = rng.f16s(vocab * hidden, 2.0);
    let m = F16Matrix::upload(&dev, "embed", vocab, hidden, &table).unwrap();
    assert!(m.chunks.len() > 1);
    let ids: Vec<u32> = vec![0, 3, 4, 7, 8, 49, 48, 25, 26];
    let ids_b = dev
        .upload("ids", bytemuck::cast_slice(&ids), Usage::Storage)
        .unwrap();
    let x = dev
        .upload(
            "x",
            bytemuck::cast_slice(&vec![f32::NAN; ids.len() * hidden]),
            Usage::Storage,
        )
        .unwrap();
    let mut prog = Program::default();
    ops::embed(&mut prog, &m, &ids_b, &x, hidden);
    out.extend(compare(emu, &dev, "embed", &prog, 0, ids.len()));
    // The matvec outside the layer programs: the last-token lm_head of a multi-token step
    // (LAST_TOKEN_ONLY, bias, accumulate) and one-token products, over a matrix in chunks,
    // with either reduction; rows of 38 words, so both warps of a block have words.
    for portable in [false, true] {
        use wgmoe::backend::plan::Switch;
        use wgmoe::backend::{KernelOverrides, KernelPlan};
        let plan = KernelPlan::decide(
            dev.info(),
            &KernelOverrides {
                portable,
                decode: Some(DecodeKernels::Coalesced),
                prefill: Some(PrefillKernels::Tiled),
                f16_arithmetic: Some(Switch::Off),
            },
        )
        .unwrap();
        let (rows, k, t) = (21, 300, 5);
        let m = F16Matrix::upload(&dev, "lm_head", rows, k, &rng.f16s(rows * k, 1.0)).unwrap();
        assert!(m.chunks.len() > 1);
        let x = common::gpu::f32_buf(&dev, &rng.vec(t * k, 1.0));
        let bias = common::gpu::f32_buf(&dev, &rng.vec(rows, 1.0));
        let dst = common::gpu::f32_buf(&dev, &rng.vec(t * rows, 1.0));
        let d = common::gpu::dummy(&dev);
        let env = ops::OpEnv {
            plan: &plan,
            chunk: t,
            dummy: &d,
        };
        for (fl, tokens) in [
            (flags::LAST_TOKEN_ONLY, t),
            (flags::LAST_TOKEN_ONLY | flags::MATMUL_ACCUMULATE, t),
            (0, 1),
            (flags::MATMUL_ACCUMULATE, 1),
        ] {
            let mut prog = Program::default();
            ops::matmul(&mut prog, &env, &m, &x, Some(&bias), &dst, rows, fl);
            let ks = compare(
                emu,
                &dev,
                &format!("matvec flags {fl:#b} portable {portable}"),
                &prog,
                0,
                tokens,
            );
            assert!(ks.iter().any(|k| matches!(k, Kernel::Matvec(_))), "{ks:?}");
            out.extend(ks);
        }
    }
    for n in [1usize, 257, 3001] {
        let mut logits = rng.vec(3 * n, 10.0);
        logits[n + n / 2] = f32::NAN;
        let lb = dev
            .upload("logits", bytemuck::cast_slice(&logits), Usage::Storage)
            .unwrap();
        let token = dev.upload("token", &[0u8; 16], Usage::Storage).unwrap();
        let part_bytes = vec![0u8; 16 * ops::argmax_parts(n)];
        let part = dev.upload("part", &part_bytes, Usage::Storage).unwrap();
        let cases = [(0, [0u32; 4]), (flags::ARGMAX_LAST_ROW, [1, 2, 0, 0])];
        for ((fl, suppress), split) in cases.into_iter().flat_map(|c| [(c, false), (c, true)]) {
            let mut prog = Program::default();
            ops::argmax(
                &mut prog,
                &ArgmaxParams {
                    n: n as u32,
                    n_suppress: 2,
                    row_stride: n as u32,
                    flags: fl,
                    suppress,
                },
                &lb,
                &token,
                &part,
                split,
            );
            for rows in [1, 2, 3] {
                out.extend(compare(
                    emu,
                    &dev,
                    &format!("argmax n {n} rows {rows} split {split}"),
                    &prog,
                    0,
                    rows,
                ));
            }
        }
    }
    out
}

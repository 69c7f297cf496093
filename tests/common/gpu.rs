//! The device side of the kernel tests (and benches/kernels.rs, through `#[path]`): a
//! device and kernel plan, buffers, running a program once, reading results back.
//! A missing adapter is a failure, never a skip.

use wgmoe::backend::params::UNIFORM_WINDOW_BYTES;
use wgmoe::backend::plan::PrefillKernels;
use wgmoe::backend::{
    Buffer, Device, DeviceRequest, Dim, Kernel, KernelOverrides, KernelPlan, Op, Program, Usage,
};

pub fn init_env() {
    // Keeps the Vulkan loader quiet, as the README asks users to do.
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
}

/// The backend every GPU test opens: `WGMOE_TEST_BACKEND` (`vulkan`, `cuda`, ... as
/// `--backend`; tools/gpu-check.sh runs the kernel and parity suites on CUDA with it), or
/// the one a test file chose with [`use_backend`] before its first device; by default the
/// best adapter (lavapipe in CI).
pub fn test_backend() -> Option<wgmoe::backend::BackendChoice> {
    *BACKEND.get_or_init(|| {
        let v = std::env::var("WGMOE_TEST_BACKEND").ok()?;
        let b = <wgmoe::backend::BackendChoice as clap::ValueEnum>::from_str(&v, true)
            .unwrap_or_else(|e| panic!("WGMOE_TEST_BACKEND={v}: {e}"));
        Some(b)
    })
}

static BACKEND: std::sync::OnceLock<Option<wgmoe::backend::BackendChoice>> =
    std::sync::OnceLock::new();

/// Make this test binary's devices open `b` (the CUDA test files); call before any device.
pub fn use_backend(b: wgmoe::backend::BackendChoice) {
    let _ = BACKEND.set(Some(b));
    assert_eq!(
        test_backend(),
        Some(b),
        "a device was opened before use_backend"
    );
}

/// A fresh device (no cross-talk of validation errors between parallel tests); `cap`
/// limits the storage binding used to split weights, to force several chunks.
pub fn device(cap: Option<u64>) -> Device {
    init_env();
    Device::open(&DeviceRequest {
        backend: test_backend(),
        max_binding: cap,
        ..Default::default()
    })
    .unwrap_or_else(|e| {
        panic!("kernel tests need a GPU adapter (lavapipe in CI), none usable: {e}")
    })
}

/// The kernel plan of `dev` with the given overrides.
pub fn plan(dev: &Device, o: &KernelOverrides) -> KernelPlan {
    KernelPlan::decide(dev.info(), o)
        .unwrap_or_else(|e| panic!("kernel plan on `{}` ({o:?}): {e}", dev.info().name))
}

/// A device and the kernel plan the model would use on it.
pub struct Gpu {
    pub dev: Device,
    pub plan: KernelPlan,
}

impl Gpu {
    pub fn new(cap: Option<u64>, o: KernelOverrides) -> Self {
        let dev = device(cap);
        let plan = plan(&dev, &o);
        Gpu { dev, plan }
    }

    /// `portable`: no subgroup kernels; otherwise the device's own choice.
    pub fn portable(cap: Option<u64>, portable: bool) -> Self {
        Self::new(
            cap,
            KernelOverrides {
                portable,
                ..Default::default()
            },
        )
    }
}

/// Whether `dev` runs the subgroup kernels (subgroups of at least 8 lanes; lavapipe has 8
/// by default). Lavapipe must report subgroups at all; where they are narrower (4 lanes
/// with LP_NATIVE_VECTOR_WIDTH=128) the plan must not pick `kernel` and the device must
/// refuse to build it, rather than run it wrong: then the test of `kernel` says so and
/// returns without running it.
pub fn subgroup_kernels(dev: &Device, kernel: Kernel) -> bool {
    let info = dev.info();
    if info.name.contains("llvmpipe") && info.backend == "vulkan" {
        assert!(
            info.subgroup,
            "lavapipe has subgroups: {kernel} must be built"
        );
    }
    let wide = info.subgroup && info.subgroup_min_size >= 8;
    let default_plan = plan(dev, &KernelOverrides::default());
    assert_eq!(
        default_plan.subgroups, wide,
        "the plan on `{}` (subgroups of {} lanes)",
        info.name, info.subgroup_min_size
    );
    if !wide {
        let window = KernelOverrides {
            prefill: Some(PrefillKernels::Window),
            ..Default::default()
        };
        let e = KernelPlan::decide(info, &window).expect_err("window kernels without subgroups");
        assert!(e.to_string().contains("8 lanes"), "{e}");
        let mut prog = Program::default();
        prog.push(Op {
            kernel,
            params: vec![0; kernel.params_layout().1],
            binds: Vec::new(),
            grid: [Dim::Const(1); 3],
            decode: None,
            stage: "",
        });
        let step = dev.step_buffer(0, 1).unwrap();
        let e = match dev.prepare(prog, &step) {
            Ok(_) => panic!(
                "{kernel} was built on subgroups of {} lanes",
                info.subgroup_min_size
            ),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("8 lanes"), "{kernel}: {e}");
        eprintln!(
            "{kernel}: NOT RUN: `{}` has subgroups of {} lanes, the kernel needs 8 (refused: {e})",
            info.name, info.subgroup_min_size
        );
    }
    wide
}

pub fn f32_buf(dev: &Device, data: &[f32]) -> Buffer {
    dev.upload("test_f32", bytemuck::cast_slice(data), Usage::Storage)
        .unwrap()
}

pub fn u32_buf(dev: &Device, data: &[u32]) -> Buffer {
    dev.upload("test_u32", bytemuck::cast_slice(data), Usage::Storage)
        .unwrap()
}

pub fn bytes_buf(dev: &Device, data: &[u8]) -> Buffer {
    dev.upload("test_bytes", data, Usage::Storage).unwrap()
}

/// A small buffer for bindings a kernel does not read.
pub fn dummy(dev: &Device) -> Buffer {
    f32_buf(dev, &[0.0; 4])
}

/// A zero-filled buffer holding `data` that can also be bound as 64 KiB uniform windows
/// starting at any row (as the workspace allocates the activations).
pub fn window_buf(dev: &Device, data: &[f32]) -> Buffer {
    let b = dev
        .alloc(
            "window_act",
            (data.len() * 4 + UNIFORM_WINDOW_BYTES) as u64,
            Usage::Window,
        )
        .unwrap();
    dev.write(&b, 0, bytemuck::cast_slice(data)).unwrap();
    b
}

/// A zero-filled buffer holding `data`, usable as storage and as one 64 KiB uniform window
/// at offset 0 (the one-token kernels).
pub fn uniform_buf(dev: &Device, data: &[f32]) -> Buffer {
    let b = dev
        .alloc(
            "uniform_act",
            (data.len() * 4).max(UNIFORM_WINDOW_BYTES) as u64,
            Usage::Window,
        )
        .unwrap();
    dev.write(&b, 0, bytemuck::cast_slice(data)).unwrap();
    b
}

/// Prepare the program, submit it once for a step of `tokens` tokens, wait, and fail on
/// any GPU error.
/// Run a program once; position-sized grids (attention's key splits) at their largest.
pub fn run(dev: &Device, prog: Program, step: &Buffer, tokens: usize) {
    run_at(dev, prog, step, tokens, wgmoe::backend::LONGEST)
}

/// Run a program once for a step at position `pos0` (what `step` holds), its
/// position-sized grids as a real step's.
#[allow(dead_code)] // not every test binary runs attention
pub fn run_at(dev: &Device, prog: Program, step: &Buffer, tokens: usize, pos0: u32) {
    dev.run_once(prog, step, tokens, pos0)
        .unwrap_or_else(|e| panic!("GPU error: {e}"));
}

pub fn read_f32(dev: &Device, buf: &Buffer, n: usize) -> Vec<f32> {
    dev.read_f32(buf, n).unwrap()
}

pub fn read_u32(dev: &Device, buf: &Buffer, n: usize) -> Vec<u32> {
    dev.read_u32(buf, n).unwrap()
}

/// Keep only the ops of `prog` whose index satisfies `keep`.
pub fn keep_ops(prog: &mut Program, keep: impl Fn(usize, &Op) -> bool) {
    let ops = std::mem::take(&mut prog.ops);
    prog.ops = ops
        .into_iter()
        .enumerate()
        .filter(|(i, op)| keep(*i, op))
        .map(|(_, op)| op)
        .collect();
}

/// Change a parameter of a recorded op that its builder does not expose (e.g. an input
/// row stride wider than the row).
pub fn patch_params<P: bytemuck::Pod>(op: &mut Op, f: impl FnOnce(&mut P)) {
    assert_eq!(
        op.params.len(),
        std::mem::size_of::<P>(),
        "{}: params size",
        op.kernel
    );
    let mut p: P = bytemuck::pod_read_unaligned(&op.params);
    f(&mut p);
    op.params = bytemuck::bytes_of(&p).to_vec();
}

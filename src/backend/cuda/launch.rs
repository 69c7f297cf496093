//! Programs on CUDA: `prepare` resolves each op's kernel function (compiled on first use)
//! and turns its bindings into device pointers in the kernel's argument order; `run`
//! launches a step's ops in order on the device's stream with the grids the step's token
//! count gives. Kernel arguments: the params struct by value, the step pointer, then one
//! pointer per binding (kernels/cuda/common.cuh).

use std::ffi::c_void;

use cudarc::driver::sys as cu;

use super::{kernels, ok, CudaDevice, Function};
use crate::backend::NativePrepared as SeamPrepared;
use crate::backend::{Buffer, Kernel, KernelTimes, Op, Prepared, Program, Resource};
use crate::error::{Error, Result};

struct NativeOp {
    main: Function,
    /// The decode alternative (its own kernel, parameters and bindings).
    decode: Option<Box<NativeOp>>,
    /// The params bytes as words (the driver copies them at launch).
    params: Vec<u32>,
    /// Device pointers of the bindings, in the kernel's order.
    ptrs: Vec<cu::CUdeviceptr>,
}

// SAFETY: function handles and device addresses, usable from any thread of the context.
unsafe impl Send for NativeOp {}
unsafe impl Sync for NativeOp {}

/// A program's launches, one entry per op; `step` is the step uniform's address.
pub struct NativePrepared {
    ops: Vec<NativeOp>,
    step: cu::CUdeviceptr,
}

/// The pointers of an op's bindings in the order `kernel` takes them.
fn pointers(dev: &CudaDevice, op: &Op, kernel: Kernel) -> Result<Vec<cu::CUdeviceptr>> {
    let ck = kernels::check_op(op, kernel)?;
    let mut out = Vec::with_capacity(ck.bindings.len());
    for b in ck.bindings {
        let Some(bound) = op.binds.iter().find(|x| x.binding == *b) else {
            continue; // check_op found every one
        };
        let buf: &Buffer = match &bound.resource {
            Resource::Buffer(buf) => buf,
            // No CUDA kernel reads a uniform window: a window binding is its whole buffer,
            // as wgpu binds it to a storage kernel.
            Resource::Window { buffer, .. } => buffer,
        };
        out.push(dev.ptr(buf));
    }
    Ok(out)
}

fn prepare_op(dev: &CudaDevice, op: &Op) -> Result<NativeOp> {
    let decode = match &op.decode {
        Some(d) => Some(Box::new(prepare_op(dev, d)?)),
        None => None,
    };
    Ok(NativeOp {
        main: dev.function(op.kernel)?,
        decode,
        params: bytemuck::pod_collect_to_vec(&op.params),
        ptrs: pointers(dev, op, op.kernel)?,
    })
}

pub fn prepare(dev: &CudaDevice, program: &Program, step: &Buffer) -> Result<NativePrepared> {
    let mut ops = Vec::with_capacity(program.ops.len());
    for op in &program.ops {
        ops.push(prepare_op(dev, op)?);
    }
    Ok(NativePrepared {
        ops,
        step: dev.ptr(step),
    })
}

fn native_of(p: &Prepared) -> Result<&NativePrepared> {
    match &p.native {
        SeamPrepared::Cuda(n) => Ok(n),
        SeamPrepared::Wgpu(_) => Err(Error::Other(
            "internal: a wgpu program submitted to the CUDA device".into(),
        )),
    }
}

/// Launch one op with grid `grid`.
fn launch(dev: &CudaDevice, f: Function, nop: &NativeOp, step: u64, grid: [u32; 3]) -> Result<()> {
    let mut step = step;
    let mut ptrs = nop.ptrs.clone();
    let mut args: Vec<*mut c_void> = Vec::with_capacity(2 + ptrs.len());
    args.push(nop.params.as_ptr() as *mut c_void);
    args.push((&mut step as *mut u64).cast());
    for p in ptrs.iter_mut() {
        args.push((p as *mut u64).cast());
    }
    // SAFETY: `f` is a loaded kernel whose parameters are (params struct, step pointer,
    // one pointer per binding), exactly `args`; every pointer is a live allocation the
    // program's bindings keep alive; the driver copies the arguments before returning.
    ok("cuLaunchKernel", unsafe {
        cu::cuLaunchKernel(
            f.func,
            grid[0],
            grid[1],
            grid[2],
            f.block,
            1,
            1,
            0,
            dev.stream.0,
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}

/// Enqueue a step's launches; returns how many there are.
pub fn run(dev: &CudaDevice, p: &Prepared, tokens: u32, pos0: u32) -> Result<usize> {
    let native = native_of(p)?;
    let mut n = 0;
    for (op, nop) in p.program().ops.iter().zip(&native.ops) {
        let Some((kernel, grid, decode)) = op.dispatch(tokens, pos0) else {
            continue;
        };
        let nop = match (&nop.decode, decode) {
            (Some(d), true) => d,
            _ => nop,
        };
        launch(dev, nop.main, nop, native.step, grid)
            .map_err(|e| Error::Gpu(format!("{kernel}: {e}")))?;
        n += 1;
    }
    Ok(n)
}

/// Every launch of a step timed on the GPU (`--profile-kernels`): a timing event recorded
/// on the stream before and after each, all launches enqueued at once, the stream waited
/// for once, then each pair's elapsed time.
pub fn profile(
    dev: &CudaDevice,
    p: &Prepared,
    tokens: u32,
    pos0: u32,
    times: &mut KernelTimes,
) -> Result<crate::backend::ProfileClock> {
    let native = native_of(p)?;
    // (stage, kernel, start, end): events made so far, destroyed whatever happens.
    let mut marks: Vec<(&'static str, String, cu::CUevent, cu::CUevent)> = Vec::new();
    let timing_event = || -> Result<cu::CUevent> {
        let mut ev = std::ptr::null_mut();
        // SAFETY: out-pointer to a live handle; flags 0: a timing event.
        ok("cuEventCreate", unsafe { cu::cuEventCreate(&mut ev, 0) })?;
        Ok(ev)
    };
    let mut run = || -> Result<()> {
        for (op, nop) in p.program().ops.iter().zip(&native.ops) {
            let Some((kernel, grid, decode)) = op.dispatch(tokens, pos0) else {
                continue;
            };
            let nop = match (&nop.decode, decode) {
                (Some(d), true) => d,
                _ => nop,
            };
            let (a, b) = (timing_event()?, timing_event()?);
            marks.push((op.for_tokens(tokens).0.stage, kernel.name(), a, b));
            // SAFETY: live events and this device's stream.
            ok("cuEventRecord", unsafe {
                cu::cuEventRecord(a, dev.stream.0)
            })?;
            launch(dev, nop.main, nop, native.step, grid)?;
            // SAFETY: as above.
            ok("cuEventRecord", unsafe {
                cu::cuEventRecord(b, dev.stream.0)
            })?;
        }
        // SAFETY: this device's stream.
        ok("cuStreamSynchronize", unsafe {
            cu::cuStreamSynchronize(dev.stream.0)
        })?;
        for (stage, kernel, a, b) in &marks {
            let mut ms = 0f32;
            // SAFETY: two completed timing events of this context.
            ok("cuEventElapsedTime", unsafe {
                cu::cuEventElapsedTime(&mut ms, *a, *b)
            })?;
            let e = times
                .entry((stage.to_string(), kernel.clone()))
                .or_default();
            e.0 += f64::from(ms.max(0.0)) * 1e-3;
            e.1 += 1;
        }
        Ok(())
    };
    let r = run();
    if r.is_err() {
        // Nothing may still be pending on an event destroyed below.
        // SAFETY: this device's stream.
        unsafe { cu::cuStreamSynchronize(dev.stream.0) };
    }
    for (_, _, a, b) in marks {
        // SAFETY: events made above, their work complete.
        unsafe {
            cu::cuEventDestroy_v2(a);
            cu::cuEventDestroy_v2(b);
        }
    }
    r.map(|_| crate::backend::ProfileClock::GpuTimestamps)
}

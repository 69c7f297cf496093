//! Programs on wgpu: each op's pipeline, parameter uniform and bind group are made once
//! (`prepare`); a step only sets them and dispatches with the step's grid (`record`).

use std::num::NonZeroU64;

use super::WgpuDevice;
use crate::backend::params::UNIFORM_WINDOW_BYTES;
use crate::backend::{
    Backend, Buffer, KernelTimes, NativeBuffer as SeamBuffer, NativePrepared as SeamPrepared, Op,
    Prepared, Program, Resource, Usage,
};
use crate::error::{Error, Result};

struct Bound {
    pipeline: ::wgpu::ComputePipeline,
    bind_group: ::wgpu::BindGroup,
}

struct NativeOp {
    main: Bound,
    /// The decode alternative (its own pipeline, parameters and bindings).
    decode: Option<Box<NativeOp>>,
    /// The op's parameter uniform (kept alive with the bind groups).
    _params: Buffer,
}

/// A program's wgpu objects, one entry per op.
pub struct NativePrepared {
    ops: Vec<NativeOp>,
}

pub(super) fn native(b: &Buffer) -> Result<&::wgpu::Buffer> {
    // Unreachable without the `cuda` feature (the other variant is uninhabited).
    #[allow(unreachable_patterns)]
    match b.native() {
        SeamBuffer::Wgpu(n) => Ok(n),
        _ => Err(crate::backend::foreign("buffer", "wgpu")),
    }
}

fn bind(
    dev: &WgpuDevice,
    op: &Op,
    kernel: crate::backend::Kernel,
    params: &Buffer,
    step: &Buffer,
    decode: bool,
) -> Result<Bound> {
    let pipeline = dev.pipeline(kernel)?;
    let layout = pipeline.get_bind_group_layout(0);
    let mut entries = vec![
        ::wgpu::BindGroupEntry {
            binding: 0,
            resource: native(params)?.as_entire_binding(),
        },
        ::wgpu::BindGroupEntry {
            binding: 1,
            resource: native(step)?.as_entire_binding(),
        },
    ];
    for b in &op.binds {
        let resource = match &b.resource {
            Resource::Buffer(buf) => native(buf)?.as_entire_binding(),
            // A kernel that reads binding 2 as storage sees the whole buffer.
            Resource::Window { buffer, .. }
                if !(kernel.uniform_activations() && b.binding == 2) =>
            {
                native(buffer)?.as_entire_binding()
            }
            Resource::Window { buffer, offset } => {
                // One-token steps read the window at the start of the buffer.
                let offset = if decode { 0 } else { *offset };
                let window = UNIFORM_WINDOW_BYTES as u64;
                if !buffer.window_capable() || offset + window > buffer.size() {
                    return Err(Error::Other(format!(
                        "internal: {kernel}: a uniform window at byte {offset} of a buffer of {} bytes ({:?})",
                        buffer.size(),
                        buffer.usage()
                    )));
                }
                ::wgpu::BindingResource::Buffer(::wgpu::BufferBinding {
                    buffer: native(buffer)?,
                    offset,
                    size: NonZeroU64::new(window),
                })
            }
        };
        entries.push(::wgpu::BindGroupEntry {
            binding: b.binding,
            resource,
        });
    }
    if let (Some(counters), true) = (dev.probe_buffer(), kernel.probed()) {
        entries.push(::wgpu::BindGroupEntry {
            binding: crate::backend::probe::BINDING,
            resource: native(counters)?.as_entire_binding(),
        });
    }
    let label = kernel.name();
    let bind_group = dev.device.create_bind_group(&::wgpu::BindGroupDescriptor {
        label: Some(&label),
        layout: &layout,
        entries: &entries,
    });
    Ok(Bound {
        pipeline,
        bind_group,
    })
}

fn prepare_op(dev: &WgpuDevice, op: &Op, step: &Buffer, decode: bool) -> Result<NativeOp> {
    let (_, size) = op.kernel.params_layout();
    if op.params.len() != size {
        return Err(Error::Other(format!(
            "internal: {}: {} parameter bytes, the kernel takes {size}",
            op.kernel,
            op.params.len()
        )));
    }
    let params = dev.alloc(&op.kernel.name(), op.params.len() as u64, Usage::Uniform)?;
    dev.write(&params, 0, &op.params)?;
    let main = bind(dev, op, op.kernel, &params, step, decode)?;
    let decode = match &op.decode {
        Some(d) => Some(Box::new(prepare_op(dev, d, step, true)?)),
        None => None,
    };
    Ok(NativeOp {
        main,
        decode,
        _params: params,
    })
}

pub fn prepare(dev: &WgpuDevice, program: &Program, step: &Buffer) -> Result<NativePrepared> {
    let mut ops = Vec::with_capacity(program.ops.len());
    for op in &program.ops {
        ops.push(prepare_op(dev, op, step, false)?);
    }
    // Pipeline or bind-group validation errors surface here, not at the first step.
    dev.check()?;
    Ok(NativePrepared { ops })
}

fn native_of(p: &Prepared) -> Result<&NativePrepared> {
    #[allow(unreachable_patterns)]
    match &p.native {
        SeamPrepared::Wgpu(n) => Ok(n),
        _ => Err(crate::backend::foreign("program", "wgpu")),
    }
}

/// Record the step's dispatches into `pass`; returns how many there are.
pub fn record(
    p: &Prepared,
    pass: &mut ::wgpu::ComputePass<'_>,
    tokens: u32,
    pos0: u32,
) -> Result<usize> {
    let native = native_of(p)?;
    let mut n = 0;
    for (op, nop) in p.program().ops.iter().zip(&native.ops) {
        let Some((_, [x, y, z], decode)) = op.dispatch(tokens, pos0) else {
            continue;
        };
        let b = match (&nop.decode, decode) {
            (Some(d), true) => &d.main,
            _ => &nop.main,
        };
        pass.set_pipeline(&b.pipeline);
        pass.set_bind_group(0, &b.bind_group, &[]);
        pass.dispatch_workgroups(x, y, z);
        n += 1;
    }
    Ok(n)
}

/// Every dispatch of a step alone, in order, one submission each, with the probe's
/// counters zeroed before and read after it (a probe build).
pub fn probe_ops(
    dev: &WgpuDevice,
    p: &Prepared,
    tokens: u32,
    pos0: u32,
) -> Result<Vec<crate::backend::probe::ProbedOp>> {
    let native = native_of(p)?;
    let mut out = Vec::new();
    for (op, nop) in p.program().ops.iter().zip(&native.ops) {
        let Some((kernel, [x, y, z], decode)) = op.dispatch(tokens, pos0) else {
            continue;
        };
        let b = match (&nop.decode, decode) {
            (Some(d), true) => &d.main,
            _ => &nop.main,
        };
        dev.probe_reset()?;
        let mut enc = dev.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&b.pipeline);
            pass.set_bind_group(0, &b.bind_group, &[]);
            pass.dispatch_workgroups(x, y, z);
        }
        let token = dev.submit_commands(enc.finish());
        dev.wait(token)?;
        let counts = crate::backend::probe::Counts::from_raw(&dev.probe_counts()?);
        out.push(crate::backend::probe::ProbedOp {
            stage: op.for_tokens(tokens).0.stage,
            kernel,
            grid: [x, y, z],
            counts,
        });
    }
    dev.check()?;
    Ok(out)
}

/// One dispatch of a prepared program: its stage, kernel name, pipeline, bind group, grid.
pub(super) type Dispatch<'a> = (
    &'static str,
    String,
    &'a ::wgpu::ComputePipeline,
    &'a ::wgpu::BindGroup,
    [u32; 3],
);

/// A prepared program's dispatches for `tokens` at position `pos0`, in order.
pub(super) fn dispatches(p: &Prepared, tokens: u32, pos0: u32) -> Result<Vec<Dispatch<'_>>> {
    let native = native_of(p)?;
    let mut out = Vec::new();
    for (op, nop) in p.program().ops.iter().zip(&native.ops) {
        let Some((kernel, grid, decode)) = op.dispatch(tokens, pos0) else {
            continue;
        };
        let b = match (&nop.decode, decode) {
            (Some(d), true) => &d.main,
            _ => &nop.main,
        };
        out.push((
            op.for_tokens(tokens).0.stage,
            kernel.name(),
            &b.pipeline,
            &b.bind_group,
            grid,
        ));
    }
    Ok(out)
}

/// Every dispatch of a step alone, one submission each, timed by the wall clock (an adapter
/// without timestamp queries).
pub fn profile_wall(
    dev: &WgpuDevice,
    p: &Prepared,
    tokens: u32,
    pos0: u32,
    times: &mut KernelTimes,
) -> Result<()> {
    for (stage, kernel, pipeline, bind_group, [x, y, z]) in dispatches(p, tokens, pos0)? {
        let t = std::time::Instant::now();
        let mut enc = dev.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, bind_group, &[]);
            pass.dispatch_workgroups(x, y, z);
        }
        let token = dev.submit_commands(enc.finish());
        dev.wait(token)?;
        let e = times.entry((stage.to_string(), kernel)).or_default();
        e.0 += t.elapsed().as_secs_f64();
        e.1 += 1;
    }
    Ok(())
}

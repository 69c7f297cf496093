//! A recorded sequence of kernel dispatches. Bind groups and parameter buffers are made
//! once at load time; a step only writes the shared `Step` uniform and re-encodes the
//! dispatches, whose grid sizes follow the step's token count.

use bytemuck::Pod;

use super::context::{GpuBuffer, GpuContext};
use super::kernels::Kernel;

/// One grid dimension, known at build time or derived from the step's token count.
#[derive(Clone, Copy, Debug)]
pub enum Dim {
    Const(u32),
    Tokens,
    /// ceil(tokens / n)
    TokensDiv(u32),
    /// 1 while the step has more than `first` items at `per_token` items per token (a
    /// window starting at item `first` has work), else 0 (the dispatch is skipped).
    Window {
        first: u32,
        per_token: u32,
    },
    /// 1 when the step's last token lies in [first, first + len), else 0.
    LastIn {
        first: u32,
        len: u32,
    },
}

impl Dim {
    fn eval(self, tokens: u32) -> u32 {
        match self {
            Dim::Const(n) => n,
            Dim::Tokens => tokens,
            Dim::TokensDiv(n) => tokens.div_ceil(n),
            Dim::Window { first, per_token } => u32::from(tokens * per_token > first),
            Dim::LastIn { first, len } => {
                u32::from(tokens > first && tokens - 1 < first.saturating_add(len))
            }
        }
    }
}

pub struct Op {
    pub kernel: Kernel,
    bind_group: wgpu::BindGroup,
    grid: [Dim; 3],
    _params: GpuBuffer,
    /// A kernel of the same parameters and bindings to use instead in one-token steps.
    decode: Option<(Kernel, wgpu::BindGroup, [Dim; 3])>,
}

#[derive(Default)]
pub struct Program {
    pub ops: Vec<Op>,
}

/// Workgroups needed to cover `n` items with 64-wide workgroups.
pub fn groups64(n: usize) -> u32 {
    n.div_ceil(64) as u32
}

impl Program {
    /// Add one dispatch. Binding 0 is the kernel's params, binding 1 the step uniform, and
    /// `buffers` fill bindings 2.. in order, exactly as declared in the WGSL file.
    pub fn push<P: Pod>(
        &mut self,
        ctx: &GpuContext,
        kernel: Kernel,
        params: &P,
        step: &wgpu::Buffer,
        buffers: &[&wgpu::Buffer],
        grid: [Dim; 3],
    ) {
        self.push_with_decode(ctx, kernel, params, step, buffers, grid, None);
    }

    /// Add one dispatch of a window kernel: binding 2 is the 64 KiB uniform window of
    /// `buffers[0]` starting at byte `offset` (a multiple of the adapter's uniform offset
    /// alignment); `decode` as in `push_with_decode` (its window starts at 0).
    #[allow(clippy::too_many_arguments)]
    pub fn push_window<P: Pod>(
        &mut self,
        ctx: &GpuContext,
        kernel: Kernel,
        params: &P,
        step: &wgpu::Buffer,
        buffers: &[&wgpu::Buffer],
        grid: [Dim; 3],
        offset: u64,
        decode: Option<(Kernel, [Dim; 3])>,
    ) {
        let pbuf = ctx.uniform_with(kernel.name(), bytemuck::bytes_of(params));
        let bind_group = bind_group_at(ctx, kernel, &pbuf, step, buffers, offset);
        let decode = decode.map(|(k, g)| (k, make_bind_group(ctx, k, &pbuf, step, buffers), g));
        self.ops.push(Op {
            kernel,
            bind_group,
            grid,
            _params: pbuf,
            decode,
        });
    }

    /// Like `push`, with another kernel (same parameters and bindings) for one-token steps.
    #[allow(clippy::too_many_arguments)]
    pub fn push_with_decode<P: Pod>(
        &mut self,
        ctx: &GpuContext,
        kernel: Kernel,
        params: &P,
        step: &wgpu::Buffer,
        buffers: &[&wgpu::Buffer],
        grid: [Dim; 3],
        decode: Option<(Kernel, [Dim; 3])>,
    ) {
        let pbuf = ctx.uniform_with(kernel.name(), bytemuck::bytes_of(params));
        let bind_group = make_bind_group(ctx, kernel, &pbuf, step, buffers);
        let decode = decode.map(|(k, g)| (k, make_bind_group(ctx, k, &pbuf, step, buffers), g));
        self.ops.push(Op {
            kernel,
            bind_group,
            grid,
            _params: pbuf,
            decode,
        });
    }

    /// The dispatch op `i` makes in a step of `tokens` tokens (None: skipped).
    fn dispatch(&self, i: usize, tokens: u32) -> Option<(Kernel, &wgpu::BindGroup, [u32; 3])> {
        let op = &self.ops[i];
        let (kernel, bind_group, grid) = match &op.decode {
            Some((k, bg, g)) if tokens == 1 => (*k, bg, *g),
            _ => (op.kernel, &op.bind_group, op.grid),
        };
        let g = grid.map(|d| d.eval(tokens));
        (!g.contains(&0)).then_some((kernel, bind_group, g))
    }

    /// Record the step's dispatches; returns how many there are.
    pub fn record(&self, ctx: &GpuContext, pass: &mut wgpu::ComputePass<'_>, tokens: u32) -> usize {
        let mut n = 0;
        for i in 0..self.ops.len() {
            if let Some((kernel, bind_group, [x, y, z])) = self.dispatch(i, tokens) {
                pass.set_pipeline(ctx.kernels.pipeline(kernel));
                pass.set_bind_group(0, bind_group, &[]);
                pass.dispatch_workgroups(x, y, z);
                n += 1;
            }
        }
        n
    }

    /// Dispatches a step of `tokens` tokens makes.
    pub fn dispatches(&self, tokens: u32) -> usize {
        (0..self.ops.len())
            .filter(|&i| self.dispatch(i, tokens).is_some())
            .count()
    }

    /// Run the step's dispatches one submission each, waiting for each, and add the wall
    /// time per kernel to `times` (`WGMOE_PROFILE_KERNELS`: where a step's time goes).
    pub fn profile(
        &self,
        ctx: &GpuContext,
        tokens: u32,
        times: &mut std::collections::BTreeMap<&'static str, (f64, usize)>,
    ) {
        for i in 0..self.ops.len() {
            if let Some((kernel, bind_group, [x, y, z])) = self.dispatch(i, tokens) {
                let t = std::time::Instant::now();
                let mut enc = ctx.device.create_command_encoder(&Default::default());
                {
                    let mut pass = enc.begin_compute_pass(&Default::default());
                    pass.set_pipeline(ctx.kernels.pipeline(kernel));
                    pass.set_bind_group(0, bind_group, &[]);
                    pass.dispatch_workgroups(x, y, z);
                }
                ctx.queue.submit([enc.finish()]);
                let _ = ctx.device.poll(wgpu::PollType::wait_indefinitely());
                let e = times.entry(kernel.name()).or_default();
                e.0 += t.elapsed().as_secs_f64();
                e.1 += 1;
            }
        }
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

pub fn make_bind_group(
    ctx: &GpuContext,
    kernel: Kernel,
    params: &wgpu::Buffer,
    step: &wgpu::Buffer,
    buffers: &[&wgpu::Buffer],
) -> wgpu::BindGroup {
    bind_group_at(ctx, kernel, params, step, buffers, 0)
}

fn bind_group_at(
    ctx: &GpuContext,
    kernel: Kernel,
    params: &wgpu::Buffer,
    step: &wgpu::Buffer,
    buffers: &[&wgpu::Buffer],
    window_offset: u64,
) -> wgpu::BindGroup {
    let layout = ctx.kernels.pipeline(kernel).get_bind_group_layout(0);
    let mut entries = vec![
        wgpu::BindGroupEntry {
            binding: 0,
            resource: params.as_entire_binding(),
        },
        wgpu::BindGroupEntry {
            binding: 1,
            resource: step.as_entire_binding(),
        },
    ];
    for (i, b) in buffers.iter().enumerate() {
        let resource = if i == 0 && kernel.uniform_activation() {
            // A fixed 64 KiB window: the WGSL declares array<vec4<f32>, 4096>.
            wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: b,
                offset: window_offset,
                size: std::num::NonZeroU64::new(super::kernels::UNIFORM_ACTIVATION_BYTES as u64),
            })
        } else {
            b.as_entire_binding()
        };
        entries.push(wgpu::BindGroupEntry {
            binding: 2 + i as u32,
            resource,
        });
    }
    ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(kernel.name()),
        layout: &layout,
        entries: &entries,
    })
}

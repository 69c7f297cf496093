//! What the op builders share (`model::ops`, `model::matmul_q8`): their environment, the
//! grid limit, the GPU-shaped kernels' binding layout and the window matmuls' geometry.

use crate::backend::params::*;
use crate::backend::{Bind, Buffer, Dim, KernelPlan, Resource};
use crate::model::tensors::MatrixChunk;

/// What every builder needs besides its operands.
#[derive(Clone, Copy)]
pub struct OpEnv<'a> {
    pub plan: &'a KernelPlan,
    /// Most tokens of a step (the prefill chunk).
    pub chunk: usize,
    /// A small buffer bound where a kernel's optional input is absent.
    pub dummy: &'a Buffer,
}

/// Most workgroups of one grid dimension (WebGPU's minimum limit).
pub const MAX_GRID: usize = 65535;

/// Bindings by number (the GPU-shaped kernels' layout: activations at 2 and, as vec4s,
/// 3; weights at 10 and scales at 11).
pub(crate) fn numbered(list: &[(u32, &Buffer)]) -> Vec<Bind> {
    list.iter()
        .map(|(binding, b)| Bind {
            binding: *binding,
            resource: Resource::Buffer((*b).clone()),
        })
        .collect()
}

/// The bindings of the matvec and the GEMM over chunk `c`: activations (2, 3), bias, output,
/// the weight words (10) and, for formats with scales, the scales in the same buffer (11).
pub(crate) fn dense_binds(c: &MatrixChunk, src: &Buffer, bias: &Buffer, dst: &Buffer) -> Vec<Bind> {
    let mut b = vec![(2, src), (3, src), (4, bias), (5, dst), (10, &c.buffer)];
    if c.format.has_scales() {
        b.push((11, &c.buffer));
    }
    numbered(&b)
}

/// Multi-token steps' uniform windows of token rows of `src` (k = `cols` floats each), as
/// (tokens per window, windows) where the plan runs the window kernels and every window
/// lies inside the buffer.
pub(crate) fn token_windows(env: &OpEnv, cols: usize, src: &Buffer) -> Option<(usize, usize)> {
    if !src.window_capable() {
        return None;
    }
    let t = env.chunk;
    let tw = env.plan.matmul_window_tokens(cols, t);
    if tw == 0 {
        return None;
    }
    let n = t.div_ceil(tw);
    // The last window must lie inside the buffer.
    (((n - 1) * tw * cols * 4 + UNIFORM_WINDOW_BYTES) as u64 <= src.size()).then_some((tw, n))
}

/// The grid's y and z of window `t0 .. t0 + tw` of a window matmul (8 tokens per
/// invocation; the last token alone with LAST_TOKEN_ONLY): its rows of 8 tokens, and the
/// gate that skips it when the step's tokens (or its last one) lie elsewhere.
pub(crate) fn window_grid(t0: usize, tw: usize, last: bool) -> (Dim, Dim) {
    if last {
        let gate = Dim::LastIn {
            first: t0 as u32,
            len: tw as u32,
        };
        return (Dim::Const(1), gate);
    }
    let ty = (tw as u32).div_ceil(MATMUL_W_TOKENS_PER_THREAD);
    let gate = Dim::Window {
        first: t0 as u32,
        per_token: 1,
    };
    (Dim::Const(ty), gate)
}

//! The Q8_0 dense products of the storage plan (CPU adapters such as llvmpipe), where the
//! GPU-shaped matvec and GEMM (`ops::matmul` on GPUs) lose to kernels in which a lane
//! streams its own weight row: one-token steps read the activations from a uniform window
//! (matmul_q8_u.wgsl), multi-token steps from uniform windows of token rows shared
//! through subgroups (matmul_q8_w.wgsl) where the plan says so, else from storage, 4
//! tokens per invocation (matmul_q8.wgsl). The twins of the f16 storage kernels.

use crate::backend::kernel::Kernel;
use crate::backend::params::*;
use crate::backend::{groups64, Bind, Buffer, Dim, Op, Program, Resource};
use crate::model::op_env::{dense_binds, token_windows, window_grid, OpEnv, MAX_GRID};
use crate::model::tensors::{F16Matrix, MatrixChunk};

/// dst[t, row] (+)= m[row] . src[t] (+ bias[row]) for every chunk of the Q8_0 matrix `m`;
/// `f` holds the flags (the bias flag included).
#[allow(clippy::too_many_arguments)]
pub(crate) fn push(
    prog: &mut Program,
    env: &OpEnv,
    m: &F16Matrix,
    src: &Buffer,
    bias: &Buffer,
    dst: &Buffer,
    out_stride: usize,
    f: u32,
) {
    let last = f & flags::LAST_TOKEN_ONLY != 0;
    let windows = src.window_capable() && src.size() >= UNIFORM_WINDOW_BYTES as u64;
    // One-token steps read the activations from a uniform window where it fits.
    let uniform = windows && env.plan.matmul_decode_uniform(m.cols);
    let (tw, n_windows) = token_windows(env, m.cols, src).unwrap_or((0, 0));
    let windows_fit = n_windows > 0;
    for c in &m.chunks {
        for op in storage_ops(m, c, src, bias, dst, out_stride, f) {
            let decode = uniform.then(|| uniform_op(&op, src));
            if !windows_fit {
                prog.push(op.with_decode_op(decode));
                continue;
            }
            let p: DenseParams = bytemuck::pod_read_unaligned(&op.params);
            for wi in 0..n_windows {
                let t0 = wi * tw;
                let (ty, gate) = window_grid(t0, tw, last);
                let mut binds: Vec<Bind> = op
                    .binds
                    .iter()
                    .filter(|b| b.binding != 3)
                    .cloned()
                    .collect();
                binds[0].resource = Resource::Window {
                    buffer: src.clone(),
                    offset: (t0 * m.cols * 4) as u64,
                };
                let w = Op::new(
                    Kernel::MatmulQ8Window,
                    &MatmulQ8WindowParams {
                        k: p.k,
                        n_rows: p.n_rows,
                        row_base: p.row_base,
                        words_per_row: p.words_per_row,
                        t0: t0 as u32,
                        out_stride: p.out_stride,
                        flags: p.flags,
                        tw: tw as u32,
                        w_row0: p.w_row0,
                        s_word0: p.s_word0,
                        blocks_per_row: p.blocks_per_row,
                        _a: 0,
                    },
                    binds,
                    [op.grid[0], ty, gate],
                );
                // Window 0 serves one-token steps (later windows are skipped).
                prog.push(w.with_decode_op(if wi == 0 { decode.clone() } else { None }));
            }
        }
    }
}

/// The storage kernel over one chunk: a row and 4 tokens per invocation, one dispatch per
/// MAX_GRID x 64 rows.
fn storage_ops(
    m: &F16Matrix,
    c: &MatrixChunk,
    src: &Buffer,
    bias: &Buffer,
    dst: &Buffer,
    out_stride: usize,
    f: u32,
) -> Vec<Op> {
    let last = f & flags::LAST_TOKEN_ONLY != 0;
    let per_dispatch = MAX_GRID * 64;
    let mut ops = Vec::new();
    let mut r0 = 0;
    while r0 < c.rows {
        let n = per_dispatch.min(c.rows - r0);
        ops.push(Op::new(
            Kernel::MatmulQ8,
            &DenseParams {
                k: m.cols as u32,
                n_rows: n as u32,
                row_base: (c.row_start + r0) as u32,
                words_per_row: m.words_per_row(c),
                x_stride: m.cols as u32,
                out_stride: out_stride as u32,
                flags: f,
                w_row0: r0 as u32,
                s_word0: m.scale_word0(c),
                blocks_per_row: m.blocks_per_row(c),
                ..Default::default()
            },
            dense_binds(c, src, bias, dst),
            [
                Dim::Const(groups64(n)),
                if last {
                    Dim::Const(1)
                } else {
                    Dim::TokensDiv(MATMUL_TOKENS_PER_THREAD)
                },
                Dim::Const(1),
            ],
        ));
        r0 += n;
    }
    ops
}

/// The one-token twin of a storage op: the same parameters, the activations (binding 2) as
/// a uniform window at offset 0.
fn uniform_op(op: &Op, src: &Buffer) -> Op {
    let mut d = op.clone();
    d.kernel = Kernel::MatmulQ8Uniform;
    d.grid[1] = Dim::Const(1);
    d.decode = None;
    d.binds.retain(|b| b.binding != 3);
    d.binds[0].resource = Resource::Window {
        buffer: src.clone(),
        offset: 0,
    };
    d
}

//! Op builders: each appends the dispatches of one operation of the model to a program,
//! with the kernel the plan picks for the shapes. The forward pass, the kernel tests and
//! the benches all build their programs with these functions, so a test exercises exactly
//! what a model runs. (The routed experts' ops are in `model::moe`.)

use crate::backend::kernel::{Kernel, WeightFormat, ROWS_PER_WORKGROUP};
use crate::backend::params::*;
use crate::backend::{binds, groups64, Bind, Buffer, Dim, Op, Program, Resource};
use crate::model::tensors::{pad8, F16Matrix, MatrixChunk};

pub use crate::model::attention_ops::{
    attention, attention_batched, flash_part_floats, flash_shape, rope_kv, AttentionBuffers,
    FlashShape,
};
pub(crate) use crate::model::op_env::{dense_binds, numbered, token_windows, window_grid};
pub use crate::model::op_env::{OpEnv, MAX_GRID};

/// x[t, :] = embedding row ids[t], one dispatch per chunk of the table.
pub fn embed(prog: &mut Program, table: &F16Matrix, ids: &Buffer, x: &Buffer, hidden: usize) {
    for c in &table.chunks {
        prog.push(Op::new(
            Kernel::Embed,
            &EmbedParams {
                hidden: hidden as u32,
                row_start: c.row_start as u32,
                rows: c.rows as u32,
                words_per_row: table.words_per_row(c) * 4,
            },
            binds(&[ids, &c.buffer, x]),
            [Dim::Const(groups64(hidden)), Dim::Tokens, Dim::Const(1)],
        ));
    }
}

/// RMSNorm of each token row of `src` (n values) into `dst`.
pub fn rmsnorm(
    prog: &mut Program,
    weight: &Buffer,
    src: &Buffer,
    dst: &Buffer,
    n: usize,
    eps: f32,
) {
    prog.push(rmsnorm_op(weight, src, dst, n, eps));
}

/// The rmsnorm dispatch of [`rmsnorm`], for a builder that places it itself.
pub fn rmsnorm_op(weight: &Buffer, src: &Buffer, dst: &Buffer, n: usize, eps: f32) -> Op {
    Op::new(
        Kernel::RmsNorm,
        &RmsNormParams {
            n: n as u32,
            x_stride: n as u32,
            out_stride: n as u32,
            eps,
            ..Default::default()
        },
        binds(&[src, weight, dst]),
        [Dim::Tokens, Dim::Const(1), Dim::Const(1)],
    )
}

/// Column splits of a one-token matvec over `rows` rows of `words` 16-byte words: enough
/// workgroups to fill a large GPU ([`GPU_MIN_WORKGROUPS`]), each split keeping at least 4
/// words per row; 1 when the rows alone are enough.
pub fn k_splits(rows: usize, words: usize) -> usize {
    let groups = rows.div_ceil(ROWS_PER_WORKGROUP).max(1);
    if groups >= GPU_MIN_WORKGROUPS {
        return 1;
    }
    GPU_MIN_WORKGROUPS
        .div_ceil(groups)
        .min(words.div_ceil(4))
        .max(1)
}

/// Rows per workgroup of a matvec over `rows` rows: ROWS_PER_WORKGROUP, or fewer where that
/// would leave the dispatch short of GPU_MIN_WORKGROUPS (a GGUF file's k or v projection
/// in a block type of its own; a K split would need its partial sums added).
pub fn matvec_group_rows(rows: usize) -> usize {
    (1..=ROWS_PER_WORKGROUP)
        .rev()
        .find(|&r| rows.div_ceil(r) >= GPU_MIN_WORKGROUPS)
        .unwrap_or(1)
}

/// The router's column splits on one-token steps (its f16 rows: one per expert, plus
/// Qwen's shared-expert gate), as `router_matmul` chooses them; the workspace sizes the
/// router's logits for them.
pub fn router_splits(router_rows: usize, hidden: usize) -> usize {
    k_splits(router_rows, pad8(hidden) / 8)
}

/// The GPU-shaped matvec over one chunk of a matrix: dst[t, row] (+)= m[row] . src[t],
/// `splits` column splits (partial sums in rows 0 .. splits of dst; one-token steps),
/// one dispatch per MAX_GRID x 4 rows.
#[allow(clippy::too_many_arguments)]
fn matvec_ops(
    env: &OpEnv,
    m: &F16Matrix,
    c: &MatrixChunk,
    src: &Buffer,
    bias: &Buffer,
    dst: &Buffer,
    out_stride: usize,
    flags: u32,
    splits: usize,
) -> Vec<Op> {
    let last = flags & flags::LAST_TOKEN_ONLY != 0;
    // A split matrix (the router) fills the GPU with its splits.
    let group = if splits > 1 {
        ROWS_PER_WORKGROUP
    } else {
        matvec_group_rows(c.rows)
    };
    let per_dispatch = MAX_GRID * group;
    let mut ops = Vec::new();
    let mut r0 = 0;
    while r0 < c.rows {
        let n = per_dispatch.min(c.rows - r0);
        ops.push(Op::new(
            Kernel::Matvec(env.plan.rows(c.format)),
            &DenseParams {
                k: m.cols as u32,
                n_rows: n as u32,
                row_base: (c.row_start + r0) as u32,
                words_per_row: m.words_per_row(c),
                x_stride: m.cols as u32,
                out_stride: out_stride as u32,
                flags,
                w_row0: r0 as u32,
                s_word0: m.scale_word0(c),
                blocks_per_row: m.blocks_per_row(c),
                group_rows: group as u32,
                ..Default::default()
            },
            dense_binds(c, src, bias, dst),
            [
                Dim::Const(n.div_ceil(group) as u32),
                Dim::Const(splits as u32),
                if last { Dim::Const(1) } else { Dim::Tokens },
            ],
        ));
        r0 += n;
    }
    ops
}

/// dst[t, row] (+)= m[row] . src[t] (+ bias[row]), for every chunk of `m`. `flags`:
/// MATMUL_ACCUMULATE and/or LAST_TOKEN_ONLY (the bias flag follows `bias`). A
/// window-capable `src` lets multi-token steps read it in uniform windows of token rows
/// and one-token steps read one uniform window, where the plan says so; on GPUs one-token
/// steps (and the last token alone) run the coalesced matvec.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    prog: &mut Program,
    env: &OpEnv,
    m: &F16Matrix,
    src: &Buffer,
    bias: Option<&Buffer>,
    dst: &Buffer,
    out_stride: usize,
    flags: u32,
) {
    matmul_split(prog, env, m, src, bias, dst, out_stride, flags, 1);
}

/// The router's logits: `matmul`, with the one-token matvec split over the columns into
/// `splits` partial rows of dst (router_topk adds them).
pub fn router_matmul(
    prog: &mut Program,
    env: &OpEnv,
    m: &F16Matrix,
    src: &Buffer,
    dst: &Buffer,
    out_stride: usize,
) {
    let splits = router_splits(m.rows, m.cols);
    matmul_split(prog, env, m, src, None, dst, out_stride, 0, splits);
}

#[allow(clippy::too_many_arguments)]
fn matmul_split(
    prog: &mut Program,
    env: &OpEnv,
    m: &F16Matrix,
    src: &Buffer,
    bias: Option<&Buffer>,
    dst: &Buffer,
    out_stride: usize,
    flags: u32,
    splits: usize,
) {
    // A matrix whose chunks differ in format (a GGUF file's stacked q, k and v): each run
    // of one format by its own rule (a chunk's dispatches write its rows alone).
    let Some(format) = m.uniform_format() else {
        for run in m.runs_by_format() {
            matmul_split(prog, env, &run, src, bias, dst, out_stride, flags, splits);
        }
        return;
    };
    // Q8_0 matrices: the GPU-shaped kernels (matvec and the tiled GEMM) where the plan runs
    // them, else the Q8_0 storage matmul (CPU adapters), which serves every step alone.
    // A GGUF file's 4- to 6-bit blocks have only the GPU-shaped kernels.
    let q8 = format != WeightFormat::F16;
    if format == WeightFormat::Q8 && !env.plan.coalesced_decode && !env.plan.tiled_prefill {
        let f = flags
            | if bias.is_some() {
                flags::MATMUL_BIAS
            } else {
                0
            };
        let bias = bias.unwrap_or(env.dummy);
        crate::model::matmul_q8::push(prog, env, m, src, bias, dst, out_stride, f);
        return;
    }
    if env.plan.coalesced_decode || q8 {
        let f = flags
            | if bias.is_some() {
                flags::MATMUL_BIAS
            } else {
                0
            };
        let bias_b = bias.unwrap_or(env.dummy);
        if flags & flags::LAST_TOKEN_ONLY != 0 {
            // One token's product, every step: the matvec serves it alone.
            for c in &m.chunks {
                for op in matvec_ops(env, m, c, src, bias_b, dst, out_stride, f, 1) {
                    prog.push(op);
                }
            }
            return;
        }
        // Multi-token steps: the storage matmul, each op with the matvec as its one-token
        // alternative (chunks split into more dispatches add ops of their own).
        let splits = if flags & flags::MATMUL_ACCUMULATE != 0 {
            1
        } else {
            splits
        };
        for c in &m.chunks {
            let mut decode =
                matvec_ops(env, m, c, src, bias_b, dst, out_stride, f, splits).into_iter();
            // The tiled GEMM where the plan says so, the storage matmul otherwise.
            let main = if env.plan.tiled_prefill || q8 {
                gemm_op(m, c, src, bias_b, dst, out_stride, f)
            } else {
                storage_matmul(m, c, src, bias_b, dst, out_stride, f)
            };
            prog.push(main.with_decode_op(decode.next()));
            for extra in decode {
                // Only one-token steps dispatch it.
                let mut extra = extra;
                extra.grid[2] = Dim::OneToken;
                prog.push(extra);
            }
        }
        return;
    }
    let window_capable = src.window_capable();
    let last = flags & flags::LAST_TOKEN_ONLY != 0;
    let f = flags
        | if bias.is_some() {
            flags::MATMUL_BIAS
        } else {
            0
        };
    let bias = bias.unwrap_or(env.dummy);
    let (tw, windows) = token_windows(env, m.cols, src).unwrap_or((0, 0));
    let windows_fit = windows > 0;
    for c in &m.chunks {
        let decode = (window_capable
            && src.size() >= UNIFORM_WINDOW_BYTES as u64
            && env.plan.matmul_decode_uniform(m.cols))
        .then_some((
            Kernel::MatmulUniform,
            [Dim::Const(groups64(c.rows)), Dim::Const(1), Dim::Const(1)],
        ));
        if windows_fit {
            for wi in 0..windows {
                let t0 = wi * tw;
                let (ty, gate) = window_grid(t0, tw, last);
                let mut b = vec![Bind {
                    binding: 2,
                    resource: Resource::Window {
                        buffer: src.clone(),
                        offset: (t0 * m.cols * 4) as u64,
                    },
                }];
                b.extend(binds(&[&c.buffer, bias, dst]).into_iter().map(|mut x| {
                    x.binding += 1;
                    x
                }));
                prog.push(
                    Op::new(
                        Kernel::MatmulWindow,
                        &MatmulWindowParams {
                            k: m.cols as u32,
                            n_rows: c.rows as u32,
                            row_base: c.row_start as u32,
                            vec4_per_row: m.words_per_row(c),
                            t0: t0 as u32,
                            out_stride: out_stride as u32,
                            flags: f,
                            tw: tw as u32,
                        },
                        b,
                        [Dim::Const(groups64(c.rows)), ty, gate],
                    )
                    // Window 0 serves one-token steps (later windows are skipped).
                    .with_decode(if wi == 0 { decode } else { None }),
                );
            }
            continue;
        }
        let mut op = storage_matmul(m, c, src, bias, dst, out_stride, f);
        if decode.is_some() {
            // The one-token kernel reads binding 2 as a uniform window at offset 0.
            op.binds[0].resource = Resource::Window {
                buffer: src.clone(),
                offset: 0,
            };
        }
        let mut op = op.with_decode(decode);
        // The tiled GEMM (it cannot pick the last token alone: the storage matmul can),
        // with the storage op's one-token alternative, or the storage op itself.
        if env.plan.tiled_prefill && !last {
            let one = match op.decode.take() {
                Some(d) => *d,
                None => op,
            };
            prog.push(gemm_op(m, c, src, bias, dst, out_stride, f).with_decode_op(Some(one)));
        } else {
            prog.push(op);
        }
    }
}

/// The tiled GEMM (gemm.wgsl) over one chunk: 16 tokens x 32 rows per workgroup.
fn gemm_op(
    m: &F16Matrix,
    c: &MatrixChunk,
    src: &Buffer,
    bias: &Buffer,
    dst: &Buffer,
    out_stride: usize,
    f: u32,
) -> Op {
    Op::new(
        Kernel::Gemm(c.format),
        &DenseParams {
            k: m.cols as u32,
            n_rows: c.rows as u32,
            row_base: c.row_start as u32,
            words_per_row: m.words_per_row(c),
            x_stride: m.cols as u32,
            out_stride: out_stride as u32,
            flags: f,
            s_word0: m.scale_word0(c),
            blocks_per_row: m.blocks_per_row(c),
            ..Default::default()
        },
        dense_binds(c, src, bias, dst),
        [
            Dim::Const(c.rows.div_ceil(GEMM_ROWS) as u32),
            Dim::TokensDiv(GEMM_TOKENS as u32),
            Dim::Const(1),
        ],
    )
}

/// The storage matmul (matmul.wgsl) over one chunk: 4 tokens per invocation.
fn storage_matmul(
    m: &F16Matrix,
    c: &MatrixChunk,
    src: &Buffer,
    bias: &Buffer,
    dst: &Buffer,
    out_stride: usize,
    f: u32,
) -> Op {
    let last = f & flags::LAST_TOKEN_ONLY != 0;
    Op::new(
        Kernel::Matmul,
        &MatmulParams {
            k: m.cols as u32,
            n_rows: c.rows as u32,
            row_base: c.row_start as u32,
            vec4_per_row: m.words_per_row(c),
            x_stride: m.cols as u32,
            out_stride: out_stride as u32,
            flags: f,
            _a: 0,
        },
        binds(&[src, &c.buffer, bias, dst]),
        [
            Dim::Const(groups64(c.rows)),
            if last {
                Dim::Const(1)
            } else {
                Dim::TokensDiv(MATMUL_TOKENS_PER_THREAD)
            },
            Dim::Const(1),
        ],
    )
}

/// Softmax over the experts, top-k, optionally renormalised, per token.
pub fn router_topk(
    prog: &mut Program,
    p: &RouterTopkParams,
    logits: &Buffer,
    ids: &Buffer,
    weights: &Buffer,
) {
    prog.push(Op::new(
        Kernel::RouterTopk,
        p,
        binds(&[logits, ids, weights]),
        [Dim::Tokens, Dim::Const(1), Dim::Const(1)],
    ));
}

/// The buffers the MoE combine reads and writes.
pub struct CombineBuffers<'a> {
    pub y: &'a Buffer,
    pub weights: &'a Buffer,
    pub shared_y: &'a Buffer,
    pub router: &'a Buffer,
    pub x: &'a Buffer,
    /// COMBINE_RESIDENT: the router's expert ids and the layer's expert -> slot table.
    pub ids: &'a Buffer,
    pub slot_of: &'a Buffer,
    /// COMBINE_HOST: the CPU experts' weighted sum [T, H].
    pub host_y: &'a Buffer,
}

/// x[t] += sum_j w[t, j] y[t, j] (+ gated shared term, + the CPU experts' sum), as
/// `flags` say.
pub fn moe_combine(prog: &mut Program, p: &MoeCombineParams, b: &CombineBuffers) {
    prog.push(Op::new(
        Kernel::MoeCombine,
        p,
        binds(&[
            b.y, b.weights, b.shared_y, b.router, b.x, b.ids, b.slot_of, b.host_y,
        ]),
        [
            Dim::Const(groups64(p.hidden as usize)),
            Dim::Tokens,
            Dim::Const(1),
        ],
    ));
}

/// The argmax of a logits row into ids[0] (greedy decoding on the device). With `split`
/// (GPU plans), two dispatches: `argmax_parts(n)` workgroups each write the best of their
/// share of the row to `part`, then one workgroup reduces those parts; otherwise one
/// workgroup scans the row (`part` is bound but unused), which a CPU adapter runs faster
/// than two dispatches.
pub fn argmax(
    prog: &mut Program,
    p: &ArgmaxParams,
    logits: &Buffer,
    ids: &Buffer,
    part: &Buffer,
    split: bool,
) {
    let one = [Dim::Const(1), Dim::Const(1), Dim::Const(1)];
    if !split {
        prog.push(Op::new(Kernel::Argmax, p, binds(&[logits, ids, part]), one));
        return;
    }
    let parts = argmax_parts(p.n as usize);
    let first = ArgmaxParams {
        flags: p.flags | flags::ARGMAX_PARTS,
        ..*p
    };
    prog.push(Op::new(
        Kernel::Argmax,
        &first,
        binds(&[logits, ids, part]),
        [Dim::Const(parts as u32), Dim::Const(1), Dim::Const(1)],
    ));
    let last = ArgmaxParams {
        n: parts as u32,
        flags: flags::ARGMAX_FROM_PARTS,
        ..*p
    };
    prog.push(Op::new(
        Kernel::Argmax,
        &last,
        binds(&[logits, ids, part]),
        one,
    ));
}

/// Workgroups of the split argmax over a row of `n`: 256 values each (one load a lane),
/// at most 1024, so the second dispatch reads at most 16 KiB. The vocabulary of Qwen3
/// (151,936) takes 594, of OLMoE (50,304) 197, of Mixtral (32,000) 125: a large GPU's
/// SMs all get one.
pub fn argmax_parts(n: usize) -> usize {
    n.div_ceil(256).clamp(1, 1024)
}

/// cos/sin of RoPE for positions [0, rows), as transformers computes them in f32:
/// inv_freq = 1 / theta^(2i/d); angle = pos * inv_freq; emb = cat(freqs, freqs).
pub fn rope_table(theta: f64, head_dim: usize, rows: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| 1.0f32 / (theta as f32).powf((2 * i) as f32 / head_dim as f32))
        .collect();
    let mut t = Vec::with_capacity(rows * half * 2);
    for pos in 0..rows {
        for &f in &inv {
            let a = pos as f32 * f;
            t.push((a as f64).cos() as f32);
            t.push((a as f64).sin() as f32);
        }
    }
    t
}

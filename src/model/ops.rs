//! Op builders: each appends the dispatches of one operation of the model to a program,
//! with the kernel the plan picks for the shapes. The forward pass, the kernel tests and
//! the benches all build their programs with these functions, so a test exercises exactly
//! what a model runs. (The routed experts' ops are in `model::moe`.)

use crate::backend::kernel::{Kernel, KvFormat, WeightFormat, ROWS_PER_WORKGROUP};
use crate::backend::params::*;
use crate::backend::{binds, groups64, Bind, Buffer, Dim, Op, Program, Resource};
use crate::model::tensors::{pad8, F16Matrix, MatrixChunk};

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

/// The buffers of one layer's attention.
pub struct AttentionBuffers<'a> {
    pub qkv: &'a Buffer,
    pub q_norm: Option<&'a Buffer>,
    pub k_norm: Option<&'a Buffer>,
    pub rope: &'a Buffer,
    pub q: &'a Buffer,
    pub cache_k: &'a Buffer,
    pub cache_v: &'a Buffer,
    pub scratch: &'a Buffer,
    /// The flash kernel's per-split partial outputs (one-token steps).
    pub part: &'a Buffer,
    pub out: &'a Buffer,
}

/// How the flash attention kernel covers one layer's heads and keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashShape {
    /// Query heads of a KV head's group per workgroup, and workgroups per group.
    pub g_tile: usize,
    pub head_tiles: usize,
    /// Tokens per workgroup (multi-token steps).
    pub q_tokens: usize,
    /// Keys per tile in workgroup memory.
    pub tk: usize,
    /// Key splits of one-token steps.
    pub splits: usize,
    /// Key splits of multi-token steps (1 for contexts one workgroup walks in its budget).
    pub prefill_splits: usize,
}

/// The flash kernel's shape for a layer of `n_heads` query heads over `n_kv` KV heads of
/// `head_dim`, with a KV cache of `max_context` positions: as many query rows per
/// workgroup as its memory holds (all query heads of a group where they fit, so each K/V
/// row is read once per group), and one-token steps split over the keys until the
/// KV heads x splits make GPU_MIN_WORKGROUPS workgroups (at least ATTN_MIN_CHUNK keys a
/// split).
pub fn flash_shape(n_heads: usize, n_kv: usize, head_dim: usize, max_context: usize) -> FlashShape {
    let group = (n_heads / n_kv.max(1)).max(1);
    let max_qr = ATTN_FLASH_MAX_QR
        .min(ATTN_FLASH_QD / head_dim.max(1))
        .max(1);
    let g_tile = group.min(max_qr);
    let head_tiles = group.div_ceil(g_tile);
    let q_tokens = (max_qr / g_tile).max(1);
    let tk = 32
        .min(ATTN_FLASH_KVD / head_dim.max(1))
        .min(ATTN_FLASH_PD / (g_tile * q_tokens))
        .max(1);
    let wgs = n_kv * head_tiles;
    let splits = if wgs >= GPU_MIN_WORKGROUPS {
        1
    } else {
        GPU_MIN_WORKGROUPS
            .div_ceil(wgs)
            .min(max_context.div_ceil(ATTN_MIN_CHUNK))
            .max(1)
    };
    let prefill_keys = tk * (ATTN_PREFILL_TILE_BUDGET / (head_dim + 64)).max(1);
    let prefill_splits = max_context
        .div_ceil(prefill_keys)
        .clamp(1, ATTN_PREFILL_MAX_SPLITS);
    FlashShape {
        g_tile,
        head_tiles,
        q_tokens,
        tk,
        splits,
        prefill_splits,
    }
}

/// Floats of the flash kernel's partial outputs: one-token steps and steps of up to
/// `tokens` tokens.
pub fn flash_part_floats(
    n_heads: usize,
    n_kv: usize,
    head_dim: usize,
    max_context: usize,
    tokens: usize,
) -> usize {
    let s = flash_shape(n_heads, n_kv, head_dim, max_context);
    let per_split = n_heads * (head_dim + 2);
    // One-token steps: the splits' records, then how many were launched.
    let decode = if s.splits > 1 {
        s.splits * per_split + 1
    } else {
        1
    };
    let prefill = if s.prefill_splits > 1 && tokens > 1 {
        tokens * s.prefill_splits * per_split
    } else {
        1
    };
    decode.max(prefill)
}

/// Optional q/k norm or clip, RoPE, and the step's k, v into the KV cache.
pub fn rope_kv(prog: &mut Program, env: &OpEnv, p: &RopeKvParams, b: &AttentionBuffers) {
    prog.push(Op::new(
        Kernel::RopeKv(env.plan.kv),
        p,
        binds(&[
            b.qkv,
            b.q_norm.unwrap_or(env.dummy),
            b.k_norm.unwrap_or(env.dummy),
            b.rope,
            b.q,
            b.cache_k,
            b.cache_v,
        ]),
        [Dim::Tokens, Dim::Const(1), Dim::Const(1)],
    ));
}

/// The flash attention ops of one-token steps (`decode`) or multi-token steps: with one
/// key split every key, the output written directly; with more, partial outputs, then
/// their combine. One-token steps launch as many splits as their position fills (one per
/// ATTN_MIN_CHUNK keys, at most the shape's), and no combine while one split suffices.
fn flash_ops(
    kv: KvFormat,
    p: &AttentionParams,
    b: &AttentionBuffers,
    max_context: usize,
    decode: bool,
) -> Vec<Op> {
    let (nh, nkv, hd) = (p.n_heads as usize, p.n_kv as usize, p.head_dim as usize);
    let s = flash_shape(nh, nkv, hd, max_context);
    let splits = if decode { s.splits } else { s.prefill_splits };
    let fp = FlashParams {
        n_heads: p.n_heads,
        n_kv: p.n_kv,
        head_dim: p.head_dim,
        g_tile: s.g_tile as u32,
        q_tokens: s.q_tokens as u32,
        tk: s.tk as u32,
        min_chunk: ATTN_MIN_CHUNK as u32,
        splits: splits as u32,
        scale: p.scale,
        flags: if decode && splits > 1 {
            flags::ATTN_LIVE_SPLITS
        } else {
            0
        },
        ..Default::default()
    };
    let (max, min_chunk) = (splits as u32, ATTN_MIN_CHUNK as u32);
    let mut ops = vec![Op::new(
        Kernel::AttnFlash(kv),
        &fp,
        binds(&[b.q, b.cache_k, b.cache_v, b.out, b.part]),
        [
            Dim::Const((nkv * s.head_tiles) as u32),
            if decode {
                Dim::KeySplits { max, min_chunk }
            } else {
                Dim::Const(splits as u32)
            },
            if decode {
                Dim::Const(1)
            } else {
                Dim::TokensDiv(s.q_tokens as u32)
            },
        ],
    )];
    if splits > 1 {
        // One-token steps only, or multi-token steps only (their z is 0 for one token).
        let grid = if decode {
            [
                Dim::Const(p.n_heads),
                Dim::SplitCombine { max, min_chunk },
                Dim::Const(1),
            ]
        } else {
            let many = Dim::Window {
                first: 1,
                per_token: 1,
            };
            [Dim::Const(p.n_heads), Dim::Tokens, many]
        };
        ops.push(
            Op::new(Kernel::AttnCombine, &fp, binds(&[b.part, b.out]), grid)
                .in_stage("attention_combine"),
        );
    }
    ops
}

/// Causal attention of the step's queries over the KV cache (`max_context` positions).
pub fn attention(
    prog: &mut Program,
    env: &OpEnv,
    p: &AttentionParams,
    b: &AttentionBuffers,
    max_context: usize,
) {
    if env.plan.flash_decode() || env.plan.flash_prefill() {
        let mut multi = if env.plan.flash_prefill() {
            flash_ops(env.plan.kv, p, b, max_context, false)
        } else {
            vec![old_attention(env, p, b, env.chunk)]
        }
        .into_iter();
        let mut one = if env.plan.flash_decode() {
            flash_ops(env.plan.kv, p, b, max_context, true)
        } else {
            vec![old_attention(env, p, b, 1)]
        }
        .into_iter();
        if let Some(main) = multi.next() {
            prog.push(main.with_decode_op(one.next()));
        }
        // The combines: each runs only in the steps its grid says.
        for op in multi.chain(one) {
            prog.push(op);
        }
        return;
    }
    prog.push(old_attention(env, p, b, env.chunk));
}

/// The attention of a batched step: one token of each of several sequences, each at its
/// own position over its own KV rows (`tok_pos`, `tok_kv0` in `common/step.wgsl`), so no
/// two tokens may share a workgroup. Flash plans: attn_flash with one token per workgroup
/// over the multi-token key splits; otherwise the scratch-row kernel, one workgroup per
/// (head, token).
pub fn attention_batched(
    env: &OpEnv,
    p: &AttentionParams,
    b: &AttentionBuffers,
    max_context: usize,
) -> Vec<Op> {
    if !(env.plan.flash_decode() || env.plan.flash_prefill()) {
        return vec![Op::new(
            Kernel::Attention(env.plan.kv),
            p,
            binds(&[b.q, b.cache_k, b.cache_v, b.scratch, b.out]),
            [Dim::Const(p.n_heads), Dim::Tokens, Dim::Const(1)],
        )];
    }
    let (nh, nkv, hd) = (p.n_heads as usize, p.n_kv as usize, p.head_dim as usize);
    let s = flash_shape(nh, nkv, hd, max_context);
    let fp = FlashParams {
        n_heads: p.n_heads,
        n_kv: p.n_kv,
        head_dim: p.head_dim,
        g_tile: s.g_tile as u32,
        q_tokens: 1,
        tk: s.tk as u32,
        min_chunk: ATTN_MIN_CHUNK as u32,
        splits: s.prefill_splits as u32,
        scale: p.scale,
        ..Default::default()
    };
    let mut ops = vec![Op::new(
        Kernel::AttnFlash(env.plan.kv),
        &fp,
        binds(&[b.q, b.cache_k, b.cache_v, b.out, b.part]),
        [
            Dim::Const((nkv * s.head_tiles) as u32),
            Dim::Const(s.prefill_splits as u32),
            Dim::Tokens,
        ],
    )];
    if s.prefill_splits > 1 {
        ops.push(
            Op::new(
                Kernel::AttnCombine,
                &fp,
                binds(&[b.part, b.out]),
                [Dim::Const(p.n_heads), Dim::Tokens, Dim::Const(1)],
            )
            .in_stage("attention_combine"),
        );
    }
    ops
}

/// The scratch-row attention kernels (one workgroup per head and token, or 8 tokens) for
/// steps of `tokens` tokens.
fn old_attention(env: &OpEnv, p: &AttentionParams, b: &AttentionBuffers, tokens: usize) -> Op {
    let kernel = env.plan.attention(p.head_dim as usize, tokens);
    let grid = match kernel {
        Kernel::AttentionWindow(_) => [
            Dim::Const(p.n_heads),
            Dim::TokensDiv(ATTENTION_W_TOKENS),
            Dim::Const(1),
        ],
        _ => [Dim::Const(p.n_heads), Dim::Tokens, Dim::Const(1)],
    };
    Op::new(
        kernel,
        p,
        binds(&[b.q, b.cache_k, b.cache_v, b.scratch, b.out]),
        grid,
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

/// Workgroups of the split argmax over a row of `n`: 512 values each (two loads a lane),
/// at most 1024, so the second dispatch reads at most 16 KiB. The vocabulary of Qwen3
/// (151,936) takes 297, of OLMoE (50,304) 99.
pub fn argmax_parts(n: usize) -> usize {
    n.div_ceil(512).clamp(1, 1024)
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

//! The attention op builders: RoPE and the KV store (`rope_kv`), the flash kernel's shape
//! and ops (key splits sized by the step's position on one-token steps, their combine),
//! the batched step's attention and the scratch-row kernels of CPU adapters. Re-exported
//! by `ops`, where the other op builders are.

use crate::backend::kernel::{Kernel, KvFormat};
use crate::backend::params::*;
use crate::backend::{binds, Buffer, Dim, Op, Program};
use crate::model::op_env::OpEnv;

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

//! The forward pass on the GPU. Activation buffers are sized for one prefill chunk at
//! load time and every dispatch is pre-built, so a step is: write the `Step` uniform,
//! encode the dispatches into one compute pass, submit once. With greedy decoding the
//! sampled id is written on the GPU where the next step's embedding reads it, and only
//! those 4 bytes come back to the host.

use crate::config::{Arch, ModelConfig};
use crate::error::{Error, Result};
use crate::gpu::context::map_read;
use crate::gpu::kernels::*;
use crate::gpu::program::{groups64, Dim, Program};
use crate::gpu::tensor::ExpertStore;
use crate::gpu::tensor::F16Matrix;
use crate::gpu::{GpuBuffer, GpuContext};
use crate::model::moe::MoeDispatch;
use crate::model::weights::{Mlp, ModelWeights};

/// How the routed experts of a layer are dispatched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Executor {
    /// One dispatch chain (gate/up, down) per selected expert.
    PerExpert,
    /// All top-k experts of a layer in one dispatch per stage; with INT4 experts the down
    /// projection and the weighted combine are fused.
    Grouped,
}

#[derive(Clone, Debug)]
pub struct ForwardOptions {
    pub executor: Executor,
    /// Positions the KV cache holds (prompt + generated tokens).
    pub max_context: usize,
    /// Most prompt tokens processed by one submission.
    pub prefill_chunk: usize,
    /// Keep logits of every position of a chunk (tests, evaluation), not only the last.
    pub all_logits: bool,
    /// Token ids greedy sampling never picks (EOS when it must not end a response).
    pub suppress: Vec<u32>,
    /// Partial residency: a multi-token step may route to more experts than a layer's cache
    /// holds; its experts then run in batches of resident ones (`routed_only` programs).
    pub expert_batches: bool,
}

/// What the last dispatches of a step compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    /// Nothing past the layers (a prefill chunk that is not the last).
    None,
    /// Logits of the last token only.
    Last,
    /// Logits of the last token, then its argmax into the next step's input.
    LastArgmax,
    /// Logits of every token of the chunk (needs `all_logits`).
    All,
}

pub struct Forward {
    pub cfg: ModelConfig,
    pub weights: ModelWeights,
    pub opts: ForwardOptions,
    step: GpuBuffer,
    ids: GpuBuffer,
    logits: GpuBuffer,
    token_readback: GpuBuffer,
    /// Per layer: attention and router (layer 0 starts with the embedding).
    pre: Vec<Program>,
    /// Per layer: the MLP block (experts, shared expert, combine).
    post: Vec<Program>,
    /// Per layer, when it differs: the MLP block for one-token steps (uniform activations).
    post_decode: Vec<Option<Program>>,
    /// Per layer (`expert_batches`, MoE layers): the routed experts alone, writing each
    /// (token, top-k) pair's output to y: run once per batch of resident experts before the
    /// layer's MLP block, which computes the last batch and combines.
    routed_only: Vec<Option<Program>>,
    /// Router output readback (segmented steps) and the layer's routing on the host.
    topk_ids: GpuBuffer,
    ids_readback: GpuBuffer,
    /// Partial residency: the cache runtime. Also used (full residency) to record a profile.
    pub residency: Option<std::cell::RefCell<crate::model::residency::Residency>>,
    /// Read each layer's routing back to the host even with every expert resident
    /// (profile recording).
    pub record_routing: bool,
    /// Per-layer expert frequencies recorded from the routing (`--write-profile`).
    pub profile: Option<std::cell::RefCell<crate::residency::Profile>>,
    head_last: Program,
    argmax_last: Program,
    head_all: Option<Program>,
    argmax_all: Option<Program>,
    _buffers: Vec<GpuBuffer>,
    /// Dispatches and submissions since creation (for metrics).
    pub counters: std::cell::Cell<(u64, u64)>,
}

fn storage(ctx: &GpuContext, label: &str, bytes: usize) -> GpuBuffer {
    ctx.buffer(
        label,
        bytes as u64,
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
    )
}

/// Tokens per uniform window of rows of `row_bytes` bytes for a chunk of `chunk` tokens:
/// one window when the chunk fits 64 KiB, else the most rows that fit and keep every
/// window's start a multiple of the adapter's uniform offset alignment; 0 when no window
/// can be bound (the storage kernels serve such shapes).
pub fn window_tokens(row_bytes: usize, chunk: usize, align: usize) -> usize {
    if row_bytes == 0 || row_bytes > UNIFORM_ACTIVATION_BYTES {
        return 0;
    }
    let fit = UNIFORM_ACTIVATION_BYTES / row_bytes;
    if chunk <= fit {
        return chunk;
    }
    let align = align.max(4);
    let step = align / gcd(row_bytes, align);
    fit / step * step
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
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

/// Bytes of activation buffers, KV cache and tables `Forward::new` allocates (admission
/// control computes it before anything is allocated).
pub fn workspace_bytes(
    cfg: &ModelConfig,
    max_context: usize,
    chunk: usize,
    all_logits: bool,
) -> u64 {
    let (h, v, k) = (cfg.hidden_size, cfg.vocab_size, cfg.top_k);
    let q_dim = cfg.num_heads * cfg.head_dim;
    let kv_dim = cfg.num_kv_heads * cfg.head_dim;
    let ctxlen = max_context.max(1);
    // As Forward::new clamps it (the binding-size clamp only lowers it further).
    let t = chunk.clamp(1, ctxlen);
    let h_width = (k * cfg.moe_intermediate)
        .max(cfg.shared_expert_intermediate.unwrap_or(0))
        .max(cfg.dense_intermediate);
    let floats = t
        * (4 * h
            + q_dim
            + 2 * kv_dim
            + 2 * q_dim
            + cfg.num_heads * ctxlen
            + cfg.num_experts
            + 1
            + 2 * k
            + h_width
            + k * h)
        + if all_logits { t * v } else { v }
        + ctxlen * cfg.head_dim
        + cfg.num_layers * 2 * ctxlen * kv_dim;
    // Buffers that double as 64 KiB uniform windows extend a window past their data, plus
    // the expert-major prefill buffers (upper bounds: either may be off).
    let window = UNIFORM_ACTIVATION_BYTES;
    let moe_sorted = if t > 1 {
        crate::model::moe::MoeSorted::bytes(t, k, cfg.num_experts, h, cfg.moe_intermediate)
    } else {
        0
    };
    let uniform_extra: usize = 4 * window + moe_sorted;
    // Plus each dispatch's small parameter uniform and buffer rounding to 16 bytes.
    let allowance = 8192 + cfg.num_layers * 4096 + uniform_extra;
    (floats * 4 + t * 4 + cfg.num_layers * cfg.num_experts * 4 + allowance) as u64
}

impl Forward {
    pub fn new(
        ctx: &GpuContext,
        cfg: &ModelConfig,
        weights: ModelWeights,
        mut opts: ForwardOptions,
    ) -> Result<Self> {
        let h = cfg.hidden_size;
        let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let q_dim = nh * hd;
        let kv_dim = nkv * hd;
        let qkv_dim = q_dim + 2 * kv_dim;
        let v = cfg.vocab_size;
        let k = cfg.top_k;
        let ctxlen = opts.max_context.max(1);
        let maxb = ctx.binding_limit() as usize;
        if cfg.num_experts > ROUTER_MAX_EXPERTS {
            return Err(Error::DoesNotFit(format!(
                "num_experts {}: the router kernel supports up to {ROUTER_MAX_EXPERTS} experts",
                cfg.num_experts
            )));
        }
        if hd > ATTENTION_MAX_HEAD_DIM || hd % 2 != 0 {
            return Err(Error::DoesNotFit(format!(
                "head_dim {hd}: attention supports even head dims up to {ATTENTION_MAX_HEAD_DIM}"
            )));
        }
        if ctxlen * kv_dim * 4 > maxb {
            return Err(Error::DoesNotFit(format!(
                "a KV cache of {ctxlen} positions x {kv_dim} floats per layer exceeds the adapter's storage binding limit ({maxb} bytes); at most {} positions fit",
                maxb / (kv_dim * 4)
            )));
        }
        // A chunk's attention scratch (heads x chunk x context floats) must fit one binding.
        let max_chunk = (maxb / (nh * ctxlen * 4)).max(1);
        opts.prefill_chunk = opts.prefill_chunk.clamp(1, max_chunk).min(ctxlen);
        let t = opts.prefill_chunk;
        let logit_rows = if opts.all_logits { t } else { 1 };
        if logit_rows * v * 4 > maxb {
            return Err(Error::DoesNotFit(format!(
                "logits of {logit_rows} rows x {v} exceed the storage binding limit"
            )));
        }
        let shared_i = cfg.shared_expert_intermediate.unwrap_or(0);
        let h_width = (k * cfg.moe_intermediate)
            .max(shared_i)
            .max(cfg.dense_intermediate);
        let router_stride = cfg.num_experts
            + usize::from(cfg.arch == Arch::Qwen2Moe && cfg.shared_expert_intermediate.is_some());

        let step = ctx.buffer(
            "step",
            16,
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        );
        let ids = storage(ctx, "ids", t * 4);
        let x = storage(ctx, "x", t * h * 4);
        // One token's activations can be bound as a 64 KiB uniform for the decode kernels.
        let uniform_fits =
            ctx.limits.max_uniform_buffer_binding_size >= UNIFORM_ACTIVATION_BYTES as u64;
        let uniform_ok = uniform_fits && ctx.uniform_decode;
        let window_ok = uniform_fits && ctx.window_prefill && ctx.kernels.uses_subgroups() && t > 1;
        let align = ctx.limits.min_uniform_buffer_offset_alignment as usize;
        let uniform_decode = uniform_ok
            && h % 4 == 0
            && cfg.moe_intermediate % 4 == 0
            && h * 4 <= UNIFORM_ACTIVATION_BYTES
            && k * cfg.moe_intermediate * 4 <= UNIFORM_ACTIVATION_BYTES;
        // Room for a 64 KiB window starting at any row of the data.
        let uniform_storage = |label: &str, bytes: usize| {
            ctx.buffer(
                label,
                (bytes + UNIFORM_ACTIVATION_BYTES) as u64,
                wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::UNIFORM
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC,
            )
        };
        let xn = uniform_storage("xn", t * h * 4);
        let qkv = storage(ctx, "qkv", t * qkv_dim * 4);
        let q = storage(ctx, "q", t * q_dim * 4);
        let attn = uniform_storage("attn_out", t * q_dim * 4);
        let scratch = storage(ctx, "attn_scratch", t * nh * ctxlen * 4);
        let router = storage(ctx, "router_logits", t * router_stride * 4);
        let topk_ids = storage(ctx, "topk_ids", t * k * 4);
        let topk_w = storage(ctx, "topk_weights", t * k * 4);
        let hbuf = uniform_storage("ffn_h", t * h_width * 4);
        let y = storage(ctx, "ffn_y", t * k * h * 4);
        let shared_y = storage(ctx, "shared_y", t * h * 4);
        let xf = uniform_storage("x_final", t * h * 4);
        let logits = storage(ctx, "logits", logit_rows * v * 4);
        let dummy = storage(ctx, "dummy", 16);
        let token_readback = ctx.buffer(
            "token_readback",
            16,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        );
        let rope = ctx.storage_with(
            "rope",
            bytemuck::cast_slice(&rope_table(cfg.rope_theta, hd, ctxlen)),
        );
        let mut caches = Vec::new();
        for _ in 0..cfg.num_layers {
            caches.push((
                storage(ctx, "cache_k", ctxlen * kv_dim * 4),
                storage(ctx, "cache_v", ctxlen * kv_dim * 4),
            ));
        }

        let eps = cfg.rms_norm_eps as f32;
        let mut pre: Vec<Program> = Vec::new();
        let mut post: Vec<Program> = Vec::new();
        let mut body = Program::default();
        let w = &weights;
        let tok = Dim::Tokens;
        for c in &w.embed.chunks {
            body.push(
                ctx,
                Kernel::Embed,
                &EmbedParams {
                    hidden: h as u32,
                    row_start: c.row_start as u32,
                    rows: c.rows as u32,
                    words_per_row: w.embed.vec4_per_row() * 4,
                },
                &step,
                &[&ids, &c.buffer, &x],
                [Dim::Const(groups64(h)), tok, Dim::Const(1)],
            );
        }
        let norm =
            |prog: &mut Program, weight: &wgpu::Buffer, src: &wgpu::Buffer, dst: &wgpu::Buffer| {
                prog.push(
                    ctx,
                    Kernel::RmsNorm,
                    &RmsNormParams {
                        n: h as u32,
                        x_stride: h as u32,
                        out_stride: h as u32,
                        flags: 0,
                        eps,
                        _pad: [0; 3],
                    },
                    &step,
                    &[src, weight, dst],
                    [tok, Dim::Const(1), Dim::Const(1)],
                );
            };
        let matmul = |prog: &mut Program,
                      m: &F16Matrix,
                      src: &wgpu::Buffer,
                      bias: Option<&wgpu::Buffer>,
                      dst: &wgpu::Buffer,
                      out_stride: usize,
                      flags: u32| {
            let is_uniform = src.usage().contains(wgpu::BufferUsages::UNIFORM);
            let last = flags & matmul_flags::LAST_TOKEN_ONLY != 0;
            let f = flags
                | if bias.is_some() {
                    matmul_flags::BIAS
                } else {
                    0
                };
            // Multi-token steps on CPU adapters: x in 64 KiB uniform windows of tw tokens.
            let tw = if window_ok && is_uniform && m.cols % 4 == 0 {
                window_tokens(m.cols * 4, t, align)
            } else {
                0
            };
            let windows = if tw > 0 { t.div_ceil(tw) } else { 0 };
            let windows_fit = windows > 0
                && ((windows - 1) * tw * m.cols * 4 + UNIFORM_ACTIVATION_BYTES) as u64
                    <= src.size();
            for c in &m.chunks {
                // One-token steps read x from a 64 KiB uniform window when it can hold it.
                let decode = (uniform_ok
                    && is_uniform
                    && src.size() >= UNIFORM_ACTIVATION_BYTES as u64
                    && m.cols * 4 <= UNIFORM_ACTIVATION_BYTES
                    // Short rows gain nothing and pay for binding the 64 KiB window
                    // (measured: olmoe-tiny, K = 64, decoded 40 tok/s without, 24 with).
                    && m.cols >= 256)
                    .then_some((
                        Kernel::MatmulU,
                        [Dim::Const(groups64(c.rows)), Dim::Const(1), Dim::Const(1)],
                    ));
                if windows_fit {
                    for wi in 0..windows {
                        let t0 = wi * tw;
                        let gate = if last {
                            Dim::LastIn {
                                first: t0 as u32,
                                len: tw as u32,
                            }
                        } else {
                            Dim::Window {
                                first: t0 as u32,
                                per_token: 1,
                            }
                        };
                        let ty = if last {
                            1
                        } else {
                            (tw as u32).div_ceil(MATMUL_W_TOKENS_PER_THREAD)
                        };
                        prog.push_window(
                            ctx,
                            Kernel::MatmulW,
                            &MatmulWParams {
                                k: m.cols as u32,
                                n_rows: c.rows as u32,
                                row_base: c.row_start as u32,
                                vec4_per_row: m.vec4_per_row(),
                                t0: t0 as u32,
                                out_stride: out_stride as u32,
                                flags: f,
                                tw: tw as u32,
                            },
                            &step,
                            &[src, &c.buffer, bias.unwrap_or(&dummy), dst],
                            [Dim::Const(groups64(c.rows)), Dim::Const(ty), gate],
                            (t0 * m.cols * 4) as u64,
                            // Window 0 serves one-token steps (later windows are skipped).
                            if wi == 0 { decode } else { None },
                        );
                    }
                    continue;
                }
                prog.push_with_decode(
                    ctx,
                    Kernel::Matmul,
                    &MatmulParams {
                        k: m.cols as u32,
                        n_rows: c.rows as u32,
                        row_base: c.row_start as u32,
                        vec4_per_row: m.vec4_per_row(),
                        x_stride: m.cols as u32,
                        out_stride: out_stride as u32,
                        flags: f,
                        _pad: 0,
                    },
                    &step,
                    &[src, &c.buffer, bias.unwrap_or(&dummy), dst],
                    [
                        Dim::Const(groups64(c.rows)),
                        if last {
                            Dim::Const(1)
                        } else {
                            Dim::TokensDiv(MATMUL_TOKENS_PER_THREAD)
                        },
                        Dim::Const(1),
                    ],
                    decode,
                );
            }
        };
        // Expert-major prefill buffers (CPU adapters, INT4 experts, grouped executor).
        let moe_sorted = (window_ok
            && ctx.kernels.uses_subgroups()
            && opts.executor == Executor::Grouped
            && matches!(
                w.layers.iter().find_map(|l| match &l.mlp {
                    Mlp::Moe { experts, .. } => Some(experts),
                    _ => None,
                }),
                Some(ExpertStore::Int4(_))
            ))
        .then(|| {
            crate::model::moe::MoeSorted::new(ctx, t, k, cfg.num_experts, h, cfg.moe_intermediate)
        });
        let moe = MoeDispatch {
            sorted: moe_sorted.as_ref(),
            fuse_combine: !opts.expert_batches,
            decode_uniform: false,
            ctx,
            step: &step,
            hidden: h,
            top_k: k,
            dummy: &dummy,
            xn: &xn,
            topk_ids: &topk_ids,
            topk_w: &topk_w,
            hbuf: &hbuf,
            y: &y,
            x: &x,
        };
        let moe_dec = uniform_decode.then(|| MoeDispatch {
            sorted: None,
            fuse_combine: true,
            decode_uniform: true,
            ctx,
            step: &step,
            hidden: h,
            top_k: k,
            dummy: &dummy,
            xn: &xn,
            topk_ids: &topk_ids,
            topk_w: &topk_w,
            hbuf: &hbuf,
            y: &y,
            x: &x,
        });
        // The MLP block of a MoE layer: routed experts, Qwen's shared expert, combine.
        let moe_block = |prog: &mut Program,
                         m: &MoeDispatch,
                         experts: &ExpertStore,
                         slot_of: &wgpu::Buffer,
                         shared: Option<&crate::gpu::tensor::ExpertPool>| {
            let mut flags = m.routed(prog, opts.executor, experts, slot_of);
            if let Some(sp) = shared {
                m.swiglu_f16(prog, sp, None, (0, 1), &shared_y);
                flags |= combine_flags::SHARED | combine_flags::SHARED_GATED;
            }
            if flags != 0 {
                prog.push(
                    ctx,
                    Kernel::MoeCombine,
                    &MoeCombineParams {
                        hidden: h as u32,
                        top_k: k as u32,
                        flags,
                        gate_stride: router_stride as u32,
                        gate_col: cfg.num_experts as u32,
                        _pad: [0; 3],
                    },
                    &step,
                    &[&y, &topk_w, &shared_y, &router, &x],
                    [Dim::Const(groups64(h)), tok, Dim::Const(1)],
                );
            }
        };
        let mut post_decode: Vec<Option<Program>> = Vec::new();
        let mut routed_only: Vec<Option<Program>> = Vec::new();

        let mut rope_flags = if cfg.qk_norm { rope_flags::QK_NORM } else { 0 };
        if cfg.clip_qkv.is_some() {
            rope_flags |= rope_flags::CLIP;
        }
        for (l, lw) in w.layers.iter().enumerate() {
            if l > 0 {
                post.push(std::mem::take(&mut body));
            }
            let (ck, cv) = &caches[l];
            norm(&mut body, &lw.attn_norm, &x, &xn);
            matmul(
                &mut body,
                &lw.qkv,
                &xn,
                lw.qkv_bias.as_deref(),
                &qkv,
                qkv_dim,
                0,
            );
            body.push(
                ctx,
                Kernel::RopeKv,
                &RopeKvParams {
                    n_heads: nh as u32,
                    n_kv: nkv as u32,
                    head_dim: hd as u32,
                    qkv_stride: qkv_dim as u32,
                    flags: rope_flags,
                    eps,
                    clip: cfg.clip_qkv.unwrap_or(0.0),
                    rope_rows: ctxlen as u32,
                },
                &step,
                &[
                    &qkv,
                    lw.q_norm.as_deref().unwrap_or(&dummy),
                    lw.k_norm.as_deref().unwrap_or(&dummy),
                    &rope,
                    &q,
                    ck,
                    cv,
                ],
                [tok, Dim::Const(1), Dim::Const(1)],
            );
            let attention = [Dim::Const(nh as u32), tok, Dim::Const(1)];
            // Multi-token steps on CPU adapters: 8 queries per workgroup share K/V loads.
            let (kernel, grid, decode) = if window_ok && hd % 4 == 0 {
                (
                    Kernel::AttentionW,
                    [
                        Dim::Const(nh as u32),
                        Dim::TokensDiv(ATTENTION_W_TOKENS),
                        Dim::Const(1),
                    ],
                    None,
                )
            } else {
                (Kernel::Attention, attention, None)
            };
            body.push_with_decode(
                ctx,
                kernel,
                &AttentionParams {
                    n_heads: nh as u32,
                    n_kv: nkv as u32,
                    head_dim: hd as u32,
                    scratch_stride: ctxlen as u32,
                    scale: (hd as f32).powf(-0.5),
                    _pad: [0; 3],
                },
                &step,
                &[&q, ck, cv, &scratch, &attn],
                grid,
                decode,
            );
            matmul(
                &mut body,
                &lw.o_proj,
                &attn,
                None,
                &x,
                h,
                matmul_flags::ACCUMULATE,
            );
            norm(&mut body, &lw.ffn_norm, &x, &xn);
            match &lw.mlp {
                Mlp::Moe {
                    router: rw,
                    experts,
                    slot_of,
                    shared,
                } => {
                    matmul(&mut body, rw, &xn, None, &router, router_stride, 0);
                    body.push(
                        ctx,
                        Kernel::RouterTopk,
                        &RouterTopkParams {
                            n_experts: cfg.num_experts as u32,
                            top_k: k as u32,
                            logits_stride: router_stride as u32,
                            norm_topk: cfg.norm_topk_prob as u32,
                        },
                        &step,
                        &[&router, &topk_ids, &topk_w],
                        [Dim::Tokens, Dim::Const(1), Dim::Const(1)],
                    );
                    pre.push(std::mem::take(&mut body));
                    moe_block(&mut body, &moe, experts, slot_of, shared.as_ref());
                    routed_only.push(opts.expert_batches.then(|| {
                        let mut p = Program::default();
                        moe.routed(&mut p, opts.executor, experts, slot_of);
                        p
                    }));
                    // Decode steps (one token) use the uniform-activation INT4 kernels.
                    post_decode.push(match (&moe_dec, experts) {
                        (Some(md), ExpertStore::Int4(_)) => {
                            let mut p = Program::default();
                            moe_block(&mut p, md, experts, slot_of, shared.as_ref());
                            Some(p)
                        }
                        _ => None,
                    });
                }
                Mlp::Dense { mlp } => {
                    post_decode.push(None);
                    routed_only.push(None);
                    pre.push(std::mem::take(&mut body));
                    moe.swiglu_f16(&mut body, mlp, None, (0, 1), &shared_y);
                    body.push(
                        ctx,
                        Kernel::MoeCombine,
                        &MoeCombineParams {
                            hidden: h as u32,
                            top_k: k as u32,
                            flags: combine_flags::SHARED,
                            gate_stride: router_stride as u32,
                            gate_col: 0,
                            _pad: [0; 3],
                        },
                        &step,
                        &[&y, &topk_w, &shared_y, &router, &x],
                        [Dim::Const(groups64(h)), tok, Dim::Const(1)],
                    );
                }
            }
        }

        post.push(std::mem::take(&mut body));
        let lm = w.lm_head();
        let mut suppress = [0u32; 4];
        let n_suppress = opts.suppress.len().min(4);
        suppress[..n_suppress].copy_from_slice(&opts.suppress[..n_suppress]);
        let argmax = |all: bool| {
            let mut p = Program::default();
            p.push(
                ctx,
                Kernel::Argmax,
                &ArgmaxParams {
                    n: v as u32,
                    n_suppress: n_suppress as u32,
                    row_stride: v as u32,
                    flags: all as u32,
                    suppress,
                },
                &step,
                &[&logits, &ids],
                [Dim::Const(1), Dim::Const(1), Dim::Const(1)],
            );
            p
        };
        let mut head_last = Program::default();
        norm(&mut head_last, &w.final_norm, &x, &xf);
        matmul(
            &mut head_last,
            lm,
            &xf,
            None,
            &logits,
            v,
            matmul_flags::LAST_TOKEN_ONLY,
        );
        let argmax_last = argmax(false);
        let (head_all, argmax_all) = if opts.all_logits {
            let mut p = Program::default();
            norm(&mut p, &w.final_norm, &x, &xf);
            matmul(&mut p, lm, &xf, None, &logits, v, 0);
            (Some(p), Some(argmax(true)))
        } else {
            (None, None)
        };
        ctx.check()?;
        let ids_readback = ctx.buffer(
            "ids_readback",
            (t * k * 4) as u64,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        );
        let mut buffers = vec![
            x, xn, qkv, q, attn, scratch, router, topk_w, hbuf, y, shared_y, xf, dummy, rope,
        ];
        for (a, b) in caches {
            buffers.push(a);
            buffers.push(b);
        }
        if let Some(w) = moe_sorted {
            buffers.extend([w.pairs, w.xg, w.hg]);
        }
        Ok(Forward {
            cfg: cfg.clone(),
            weights,
            opts,
            step,
            ids,
            logits,
            token_readback,
            pre,
            post,
            post_decode,
            routed_only,
            topk_ids,
            ids_readback,
            residency: None,
            record_routing: false,
            profile: None,
            head_last,
            argmax_last,
            head_all,
            argmax_all,
            _buffers: buffers,
            counters: std::cell::Cell::new((0, 0)),
        })
    }

    /// Layer l's MLP block for a step of n tokens.
    fn post_program(&self, l: usize, n: usize) -> &Program {
        match self.post_decode.get(l) {
            Some(Some(p)) if n == 1 => p,
            _ => &self.post[l],
        }
    }

    /// Dispatches of one decode step (greedy, full residency).
    pub fn dispatches_per_decode_step(&self) -> usize {
        (0..self.pre.len())
            .map(|l| self.pre[l].dispatches(1) + self.post_program(l, 1).dispatches(1))
            .sum::<usize>()
            + self.head_last.dispatches(1)
            + self.argmax_last.dispatches(1)
    }

    /// Process tokens at positions [pos0, pos0 + n). `ids` (if given) are uploaded as the
    /// step's input; otherwise the input is what the previous argmax wrote.
    pub fn submit(
        &self,
        ctx: &GpuContext,
        pos0: usize,
        n: usize,
        ids: Option<&[u32]>,
        head: Head,
    ) -> Result<()> {
        if n == 0 || n > self.opts.prefill_chunk {
            return Err(Error::Other(format!(
                "step of {n} tokens (chunk {})",
                self.opts.prefill_chunk
            )));
        }
        if pos0 + n > self.opts.max_context {
            return Err(Error::option(
                "--max-new-tokens",
                format!(
                    "position {} exceeds the context of {} positions",
                    pos0 + n,
                    self.opts.max_context
                ),
            ));
        }
        if let Some(ids) = ids {
            ctx.write(&self.ids, 0, bytemuck::cast_slice(ids));
        }
        let step = Step {
            pos0: pos0 as u32,
            n_tokens: n as u32,
            _pad: [0; 2],
        };
        ctx.write(&self.step, 0, bytemuck::bytes_of(&step));
        let progs: Vec<&Program> = match head {
            Head::None => vec![],
            Head::Last => vec![&self.head_last],
            Head::LastArgmax => vec![&self.head_last, &self.argmax_last],
            Head::All => match (&self.head_all, &self.argmax_all) {
                (Some(h), Some(a)) => vec![h, a],
                _ => return Err(Error::Other("all-position logits were not enabled".into())),
            },
        };
        let copy_token = matches!(head, Head::LastArgmax | Head::All);
        if self.residency.is_some() || self.record_routing {
            return self.submit_segmented(ctx, n, &progs, copy_token);
        }
        if std::env::var_os("WGMOE_PROFILE_KERNELS").is_some() {
            // Developer aid: every dispatch alone, timed; a table per step on stderr.
            let mut times = std::collections::BTreeMap::new();
            let t = n as u32;
            for l in 0..self.pre.len() {
                self.pre[l].profile(ctx, t, &mut times);
                self.post_program(l, n).profile(ctx, t, &mut times);
            }
            for p in &progs {
                p.profile(ctx, t, &mut times);
            }
            let total: f64 = times.values().map(|v| v.0).sum();
            eprintln!(
                "profile: step of {n} tokens, {:.1} ms in {} dispatches",
                total * 1e3,
                times.values().map(|v| v.1).sum::<usize>()
            );
            for (k, (s, c)) in &times {
                eprintln!(
                    "  {k:<20} {:>9.2} ms {:>5} dispatches {:>5.1}%",
                    s * 1e3,
                    c,
                    100.0 * s / total
                );
            }
        }
        // Every expert resident: the whole step is one compute pass in one submission.
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        let mut dispatches = 0;
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for l in 0..self.pre.len() {
                let post = self.post_program(l, n);
                dispatches += self.pre[l].record(ctx, &mut pass, n as u32);
                dispatches += post.record(ctx, &mut pass, n as u32);
            }
            for p in &progs {
                dispatches += p.record(ctx, &mut pass, n as u32);
            }
        }
        if copy_token {
            enc.copy_buffer_to_buffer(&self.ids, 0, &self.token_readback, 0, 4);
        }
        ctx.queue.submit([enc.finish()]);
        let (d, s) = self.counters.get();
        self.counters.set((d + dispatches as u64, s + 1));
        Ok(())
    }

    /// One step with the routing of every layer brought to the host: submission l holds
    /// layer l-1's MLP and layer l's attention and router, then the router's expert ids
    /// (k per token, a few bytes) are read back, the cache makes them resident (uploads,
    /// then one table publication), and the next submission reads them.
    fn submit_segmented(
        &self,
        ctx: &GpuContext,
        n: usize,
        head: &[&Program],
        copy_token: bool,
    ) -> Result<()> {
        let k = self.cfg.top_k;
        let mut res = self.residency.as_ref().map(|r| r.borrow_mut());
        let mut dispatches = 0;
        let mut submissions = 0;
        // Experts the previous submission's successor reads, per layer: (layer, wanted).
        let mut reads: Option<(usize, Vec<u32>)> = None;
        let layers = self.pre.len();
        for l in 0..=layers {
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                if l > 0 {
                    let post = self.post_program(l - 1, n);
                    dispatches += post.record(ctx, &mut pass, n as u32);
                }
                if l < layers {
                    dispatches += self.pre[l].record(ctx, &mut pass, n as u32);
                } else {
                    for p in head {
                        dispatches += p.record(ctx, &mut pass, n as u32);
                    }
                }
            }
            let routed = l < layers && self.cfg.sparse_layers[l];
            if routed {
                enc.copy_buffer_to_buffer(
                    &self.topk_ids,
                    0,
                    &self.ids_readback,
                    0,
                    (n * k * 4) as u64,
                );
            }
            if l == layers && copy_token {
                enc.copy_buffer_to_buffer(&self.ids, 0, &self.token_readback, 0, 4);
            }
            let token = match res.as_mut() {
                Some(r) => r.fence.submit(ctx, enc.finish()),
                None => {
                    ctx.queue.submit([enc.finish()]);
                    0
                }
            };
            submissions += 1;
            if let (Some(r), Some((rl, wanted))) = (res.as_mut(), reads.take()) {
                r.mark_read(rl, &wanted, token)?;
            }
            if !routed {
                continue;
            }
            let bytes = map_read(ctx, &self.ids_readback, (n * k * 4) as u64)?;
            let ids: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
            let mut wanted: Vec<u32> = Vec::new();
            for &e in &ids {
                if !wanted.contains(&e) {
                    wanted.push(e);
                }
            }
            if let Some(p) = &self.profile {
                let mut p = p.borrow_mut();
                for g in ids.chunks(k) {
                    p.record_group(l, g);
                }
            }
            if let Some(r) = res.as_mut() {
                if let Mlp::Moe {
                    experts: ExpertStore::Int4(pool),
                    slot_of,
                    ..
                } = &self.weights.layers[l].mlp
                {
                    let batches = match r.caches.get(l) {
                        Some(Some(c)) => {
                            let cfg = c.config();
                            crate::residency::expert_batches(
                                &wanted,
                                |e| c.table().slot_of(e).is_some(),
                                cfg.capacity,
                                cfg.spares,
                            )
                        }
                        _ => continue,
                    };
                    // More than one plan's worth of experts: all but the last batch run
                    // here, each in its own submission after its uploads; the next
                    // submission (this layer's MLP block) serves the last batch and
                    // combines.
                    let Some((last, earlier)) = batches.split_last() else {
                        continue;
                    };
                    if !earlier.is_empty() {
                        let Some(Some(routed)) = self.routed_only.get(l) else {
                            return Err(Error::Other(format!(
                                "layer {l}: the {} experts routed in one step need {} cache plans, and expert batches were not built",
                                wanted.len(),
                                batches.len()
                            )));
                        };
                        for b in earlier {
                            r.serve(ctx, l, b, pool, slot_of)?;
                            let mut enc = ctx.device.create_command_encoder(&Default::default());
                            {
                                let mut pass = enc.begin_compute_pass(&Default::default());
                                dispatches += routed.record(ctx, &mut pass, n as u32);
                            }
                            let token = r.fence.submit(ctx, enc.finish());
                            submissions += 1;
                            r.mark_read(l, b, token)?;
                        }
                    }
                    r.serve(ctx, l, last, pool, slot_of)?;
                    reads = Some((l, last.clone()));
                }
            }
        }
        let (d, s) = self.counters.get();
        self.counters.set((d + dispatches as u64, s + submissions));
        Ok(())
    }

    /// The token id written by the last argmax (blocks until the step finished).
    pub fn read_token(&self, ctx: &GpuContext) -> Result<u32> {
        let b = map_read(ctx, &self.token_readback, 4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Logits rows [0, rows) of the last step (row 0 = last token with `Head::Last*`).
    pub fn read_logits(&self, ctx: &GpuContext, rows: usize) -> Result<Vec<f32>> {
        let v = self.cfg.vocab_size;
        let bytes = ctx.read_back(&self.logits, 0, (rows * v * 4) as u64)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Overwrite the next step's input token (after host-side sampling).
    pub fn set_token(&self, ctx: &GpuContext, id: u32) {
        ctx.write(&self.ids, 0, &id.to_le_bytes());
    }
}

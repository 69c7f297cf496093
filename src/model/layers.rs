//! The programs of the layers and the head, built once at load time from the weights, the
//! workspace's buffers, the kernel plan and the forward pass's options: per layer,
//! attention, the router and the MoE block (with its alternatives for one-token steps), and
//! the final norm and lm_head. `Forward` (forward.rs) holds and runs them.

use std::collections::HashMap;

use crate::backend::params::*;
use crate::backend::{Buffer, Device, Prepared, Program};
use crate::config::{ModelConfig, QkNorm};
use crate::error::{Error, Result};
use crate::model::dense_mlp::DenseMlp;
use crate::model::moe::{Executor, FusedRoute, MoeDispatch, MoePairs, MoeSorted};
use crate::model::norm_fold::{self, NormInput};
use crate::model::ops::{self, AttentionBuffers, CombineBuffers, OpEnv};
use crate::model::residency::ExpertPlacement;
use crate::model::tensors::{ExpertStore, F16Matrix};
use crate::model::weights::{Mlp, ModelWeights};
use crate::model::workspace;

#[derive(Clone, Debug)]
pub struct ForwardOptions {
    pub executor: Executor,
    /// Positions the KV cache holds (prompt + generated tokens).
    pub max_context: usize,
    /// Most prompt tokens processed by one submission.
    pub prefill_chunk: usize,
    /// Keep logits of every position of a chunk (tests, evaluation), not only the last.
    pub all_logits: bool,
    /// Logits rows a step returns at least (`Head::All` over that many positions: the
    /// server's prompt scoring); 0: none beyond `all_logits` and `batch`.
    pub score_rows: usize,
    /// Token ids greedy sampling never picks (EOS when it must not end a response).
    pub suppress: Vec<u32>,
    /// Partial residency: a multi-token step may route to more experts than a layer's cache
    /// holds; its experts then run in batches of resident ones (`routed_only` programs).
    pub expert_batches: bool,
    /// Where each layer's routed experts live (empty: all on the device).
    pub placement: Vec<ExpertPlacement>,
    /// Experts each layer's guess of the next MoE layer's routing holds (`predict`
    /// programs; 0: none built).
    pub predict_width: usize,
    /// Most sequences one batched step holds (`serve --parallel`); above 1, each layer
    /// also gets `pre_batched` and the logits hold that many rows.
    pub batch: usize,
}

impl ForwardOptions {
    pub fn placement(&self, layer: usize) -> ExpertPlacement {
        self.placement
            .get(layer)
            .copied()
            .unwrap_or(ExpertPlacement::Device)
    }

    /// Some layer computes routed experts on the CPU.
    pub fn host_experts(&self) -> bool {
        self.placement.iter().any(|p| p.host_term())
    }
}

/// The prepared programs of one layer.
pub struct LayerPrograms {
    /// Attention and router (layer 0 starts with the embedding).
    pub pre: Prepared,
    /// `pre` for batched steps (one token of each of several sequences; `opts.batch` > 1):
    /// attention kernels that keep every token apart.
    pub pre_batched: Option<Prepared>,
    /// The MLP block (experts, shared expert, combine).
    pub post: Prepared,
    /// The MLP block for one-token steps, where it differs (uniform-window kernels).
    pub post_decode: Option<Prepared>,
    /// Partial residency, MoE layers: the routed experts alone, writing each (token, top-k)
    /// pair's output to y; run once per batch of resident experts before the layer's MLP
    /// block, which computes the last batch and combines. With CPU experts
    /// (`host_term`), the device's share of the routed experts, submitted before the CPU
    /// computes the rest; `post` then holds only the shared expert and the combine.
    pub routed_only: Option<Prepared>,
    /// `routed_only` for one-token steps (uniform-window kernels), where it differs.
    pub routed_only_decode: Option<Prepared>,
    /// `post` adds the CPU experts' sum (`host_y`) and, from y, only the pairs with a slot.
    pub host_term: bool,
    /// MoE layers followed by another: the next MoE layer's router applied to this
    /// layer's MLP input (`xn`), its top-k' into `predict_ids` (one-token steps; run after
    /// `pre` in the same submission: the guess `--prefetch next-layer` copies ahead).
    pub predict: Option<Prepared>,
    /// Cached layers with a one-token MLP program of their own: its routed experts alone
    /// (the hits, run while the misses are staged; `post_decode` then computes the misses).
    pub hits_decode: Option<Prepared>,
    /// One-token steps in one submission (every expert resident, the GPU plan):
    /// `pre` without router_topk, and the MLP block whose gate/up computes the top-k
    /// itself (`FFN_ROUTE`): a dispatch fewer a MoE layer. Steps whose routing the host
    /// reads between the two (residency, traces) keep `pre` and `post_decode`.
    pub fused_decode: Option<(Prepared, Prepared)>,
}

impl LayerPrograms {
    /// Attention and router for a step (batched: one token of each of several sequences).
    pub fn pre_for(&self, batched: bool) -> &Prepared {
        match &self.pre_batched {
            Some(p) if batched => p,
            _ => &self.pre,
        }
    }

    /// The attention + router and MLP programs of a step of `n` tokens submitted whole
    /// (no host work between them).
    pub fn step_programs(&self, n: usize, batched: bool) -> (&Prepared, &Prepared) {
        match &self.fused_decode {
            Some((pre, post)) if n == 1 && !batched => (pre, post),
            _ => (self.pre_for(batched), self.post_for(n)),
        }
    }

    /// The MLP block for a step of `n` tokens.
    pub fn post_for(&self, n: usize) -> &Prepared {
        match &self.post_decode {
            Some(p) if n == 1 => p,
            _ => &self.post,
        }
    }

    /// The routed experts alone for a step of `n` tokens.
    pub fn routed_for(&self, n: usize) -> Option<&Prepared> {
        match &self.routed_only_decode {
            Some(p) if n == 1 => Some(p),
            _ => self.routed_only.as_ref(),
        }
    }

    /// A cached layer's routed experts alone in the form `post_for(n)` computes them (so
    /// the hits can run before the misses are copied, and the MLP block, reading a table
    /// of the misses, adds the rest).
    pub fn hits_for(&self, n: usize) -> Option<&Prepared> {
        match (&self.hits_decode, &self.post_decode) {
            (Some(p), _) if n == 1 => Some(p),
            (None, Some(_)) if n == 1 => None,
            _ => self.routed_only.as_ref(),
        }
    }
}

/// The workspace buffers by name.
pub(super) struct Buffers(pub(super) HashMap<String, Buffer>);

impl Buffers {
    pub(super) fn get(&self, name: &str) -> Result<&Buffer> {
        self.0
            .get(name)
            .ok_or_else(|| Error::Other(format!("internal: no workspace buffer `{name}`")))
    }
}

/// Reject what the kernels cannot serve before anything is allocated.
/// Which expert kernels a layer's MLP program uses.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MoeStyle {
    /// Multi-token steps (and one-token steps where no decode program differs).
    Multi,
    /// One-token steps reading uniform windows (CPU adapters).
    DecodeUniform,
    /// One-token steps on the GPU-shaped row kernels.
    DecodeCoalesced,
    /// One-token steps on the storage kernels where multi-token steps are tiled.
    DecodeStorage,
}

/// The expert dispatches of one style of step.
fn moe_dispatch<'a>(
    cfg: &ModelConfig,
    opts: &ForwardOptions,
    env: &OpEnv<'a>,
    b: &'a Buffers,
    sorted: Option<&'a MoeSorted>,
    pairs: Option<&'a MoePairs>,
    style: MoeStyle,
) -> Result<MoeDispatch<'a>> {
    Ok(MoeDispatch {
        tiled: if style == MoeStyle::Multi {
            pairs
        } else {
            None
        },
        plan: env.plan,
        sorted,
        // One-token steps route to at most top_k experts, one batch: always fused.
        fuse_combine: style != MoeStyle::Multi || !opts.expert_batches,
        decode_uniform: style == MoeStyle::DecodeUniform,
        coalesced: style == MoeStyle::DecodeCoalesced,
        one_token: style != MoeStyle::Multi,
        hidden: cfg.hidden_size,
        top_k: cfg.top_k,
        dummy: env.dummy,
        xn: b.get("xn")?,
        topk_ids: b.get("topk_ids")?,
        topk_w: b.get("topk_weights")?,
        hbuf: b.get("ffn_h")?,
        y: b.get("ffn_y")?,
        x: b.get("x")?,
        route: None,
    })
}

/// Every layer's programs: attention and router, then the MLP block.
#[allow(clippy::too_many_arguments)]
pub(super) fn build_layers(
    dev: &Device,
    cfg: &ModelConfig,
    w: &ModelWeights,
    opts: &ForwardOptions,
    env: &OpEnv<'_>,
    b: &Buffers,
    (sorted, pairs): (Option<&MoeSorted>, Option<&MoePairs>),
    step: &Buffer,
) -> Result<Vec<LayerPrograms>> {
    let (h, k) = (cfg.hidden_size, cfg.top_k);
    let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let qkv_dim = (nh + 2 * nkv) * hd;
    let ctxlen = opts.max_context.max(1);
    let eps = cfg.rms_norm_eps as f32;
    let router_stride = workspace::router_stride(cfg);
    let (x, xn) = (b.get("x")?, b.get("xn")?);
    let multi = moe_dispatch(cfg, opts, env, b, sorted, pairs, MoeStyle::Multi)?;
    let single = if env.plan.coalesced_decode {
        Some(moe_dispatch(
            cfg,
            opts,
            env,
            b,
            None,
            None,
            MoeStyle::DecodeCoalesced,
        )?)
    } else if env.plan.q4_decode_uniform(h, cfg.moe_intermediate, k) {
        Some(moe_dispatch(
            cfg,
            opts,
            env,
            b,
            None,
            None,
            MoeStyle::DecodeUniform,
        )?)
    } else if pairs.is_some() {
        // The expert GEMMs would serve one token too, but re-read each row per pair.
        Some(moe_dispatch(
            cfg,
            opts,
            env,
            b,
            None,
            None,
            MoeStyle::DecodeStorage,
        )?)
    } else {
        None
    };
    let coalesced = env.plan.coalesced_decode;
    let dummy = env.dummy;
    let combine = CombineBuffers {
        y: b.get("ffn_y")?,
        weights: b.get("topk_weights")?,
        shared_y: b.get("shared_y")?,
        router: b.get("router_logits")?,
        x,
        ids: dummy,
        slot_of: dummy,
        host_y: dummy,
    };
    let combine_params = |flags: u32, slots: usize| MoeCombineParams {
        hidden: h as u32,
        top_k: k as u32,
        flags,
        gate_stride: router_stride as u32,
        gate_col: cfg.num_experts as u32,
        slots: slots as u32,
        ..Default::default()
    };
    // The routed experts whose outputs wait in y for the combine (never fused into x).
    fn unfused<'a>(m: &MoeDispatch<'a>) -> MoeDispatch<'a> {
        MoeDispatch {
            fuse_combine: false,
            ..m.clone()
        }
    }
    let (multi_y, single_y) = (unfused(&multi), single.as_ref().map(unfused));
    // The MLP block of a MoE layer: routed experts (unless `routed` is None: they run in
    // a submission of their own, the CPU adding its part through host_y), Qwen's shared
    // expert, combine.
    let moe_block = |m: &MoeDispatch,
                     routed: Option<(&ExpertStore, &Buffer)>,
                     host: Option<(&Buffer, usize)>,
                     shared: Option<&DenseMlp>|
     -> Result<Program> {
        let mut prog = Program::default();
        let mut fl = match routed {
            Some((experts, slot_of)) => {
                prog.stage("experts");
                m.routed(&mut prog, opts.executor, experts, slot_of)
            }
            None => 0,
        };
        let mut cb = CombineBuffers { ..combine };
        let mut slots = 0;
        if let Some((slot_of, n)) = host {
            fl |= flags::COMBINE_HOST;
            if n > 0 {
                fl |= flags::COMBINE_ROUTED | flags::COMBINE_RESIDENT;
            }
            cb.ids = b.get("topk_ids")?;
            cb.slot_of = slot_of;
            cb.host_y = b.get("host_y")?;
            slots = n;
        }
        if let Some(sp) = shared {
            prog.stage("shared_expert");
            m.swiglu_dense(&mut prog, sp, combine.shared_y);
            fl |= flags::COMBINE_SHARED | flags::COMBINE_SHARED_GATED;
        }
        if fl != 0 {
            prog.stage("combine");
            let mut cp = combine_params(fl, slots);
            // Fused routing leaves the gate logit in the router's partial rows.
            cp.gate_splits = m.route.map_or(0, |r| r.splits);
            ops::moe_combine(&mut prog, &cp, &cb);
        }
        Ok(prog)
    };
    // Fused routing: the GPU plan's one-token programs (WGSL and CUDA alike).
    let fuse_routing = coalesced;
    let mut rope_fl = match cfg.qk_norm {
        QkNorm::None => 0,
        QkNorm::Projection => flags::ROPE_QK_NORM,
        QkNorm::PerHead => flags::ROPE_QK_NORM_PER_HEAD,
    };
    if cfg.clip_qkv.is_some() {
        rope_fl |= flags::ROPE_CLIP;
    }
    let mut out = Vec::with_capacity(w.layers.len());
    for (l, lw) in w.layers.iter().enumerate() {
        let mut pre = Program::default();
        if l == 0 {
            pre.stage("embed");
            ops::embed(&mut pre, &w.embed, b.get("ids")?, x, h);
        }
        let ab = AttentionBuffers {
            qkv: b.get("qkv")?,
            q_norm: lw.q_norm.as_ref(),
            k_norm: lw.k_norm.as_ref(),
            rope: b.get("rope")?,
            q: b.get("q")?,
            cache_k: b.get(&format!("cache_k.{l}"))?,
            cache_v: b.get(&format!("cache_v.{l}"))?,
            scratch: b.get("attn_scratch")?,
            part: b.get("attn_part")?,
            out: b.get("attn_out")?,
        };
        // The norm folds into the qkv matvecs of one-token steps on the GPU plan.
        pre.stage("qkv_proj");
        let attn_norm = NormInput {
            weight: &lw.attn_norm,
            x,
            xn,
            n: h,
            eps,
            write: false,
            stage: "attn_norm",
        };
        norm_fold::normed_matmul(
            &mut pre,
            env,
            &attn_norm,
            &lw.qkv,
            lw.qkv_bias.as_ref(),
            ab.qkv,
            qkv_dim,
            0,
        );
        pre.stage("rope");
        ops::rope_kv(
            &mut pre,
            env,
            &RopeKvParams {
                n_heads: nh as u32,
                n_kv: nkv as u32,
                head_dim: hd as u32,
                qkv_stride: qkv_dim as u32,
                flags: rope_fl,
                eps,
                clip: cfg.clip_qkv.unwrap_or(0.0),
                rope_rows: ctxlen as u32,
            },
            &ab,
        );
        pre.stage("attention");
        let ap = AttentionParams {
            n_heads: nh as u32,
            n_kv: nkv as u32,
            head_dim: hd as u32,
            scratch_stride: ctxlen as u32,
            scale: (hd as f32).powf(-0.5),
            ..Default::default()
        };
        ops::attention(&mut pre, env, &ap, &ab, ctxlen);
        let batched_attention =
            (opts.batch > 1).then(|| ops::attention_batched(env, &ap, &ab, ctxlen));
        pre.stage("o_proj");
        ops::matmul(
            &mut pre,
            env,
            &lw.o_proj,
            ab.out,
            None,
            x,
            h,
            flags::MATMUL_ACCUMULATE,
        );
        // MoE layers fold the norm into the router's matvecs (which write xn for the
        // experts); a dense layer's MLP reads xn from the norm dispatch.
        let ffn_norm = NormInput {
            weight: &lw.ffn_norm,
            x,
            xn,
            n: h,
            eps,
            write: true,
            stage: "ffn_norm",
        };
        if !matches!(lw.mlp, Mlp::Moe { .. }) {
            pre.stage("ffn_norm");
            ops::rmsnorm(&mut pre, &lw.ffn_norm, x, xn, h, eps);
        }
        let mut hits_decode = None;
        let mut fused_post = None;
        let (post, post_decode, routed_only, routed_only_decode, host_term) = match &lw.mlp {
            Mlp::Moe {
                router,
                experts,
                slot_of,
                shared,
            } => {
                let logits = b.get("router_logits")?;
                pre.stage("router");
                norm_fold::normed_router_matmul(
                    &mut pre,
                    env,
                    &ffn_norm,
                    router,
                    logits,
                    router_stride,
                );
                let splits = if env.plan.coalesced_decode {
                    ops::router_splits(router.rows, h) as u32
                } else {
                    1
                };
                pre.stage("router_topk");
                ops::router_topk(
                    &mut pre,
                    &RouterTopkParams {
                        n_experts: cfg.num_experts as u32,
                        top_k: k as u32,
                        logits_stride: router_stride as u32,
                        norm_topk: cfg.norm_topk_prob as u32,
                        splits,
                        ..Default::default()
                    },
                    logits,
                    b.get("topk_ids")?,
                    b.get("topk_weights")?,
                );
                let placement = opts.placement(l);
                if let (Some(m), ExpertPlacement::Device, true) = (&single, placement, fuse_routing)
                {
                    if opts.executor != Executor::PerExpert {
                        let m = MoeDispatch {
                            route: Some(FusedRoute {
                                logits,
                                experts: cfg.num_experts as u32,
                                stride: router_stride as u32,
                                splits,
                                norm: cfg.norm_topk_prob,
                            }),
                            ..m.clone()
                        };
                        fused_post = Some(moe_block(
                            &m,
                            Some((experts, slot_of)),
                            None,
                            shared.as_ref(),
                        )?);
                    }
                }
                let (post, post_decode, routed_only, routed_only_decode) = if placement.host_term()
                {
                    // The device's share of the routed experts runs first, on its own;
                    // the block combines it with the CPU's.
                    let slots = experts.slots();
                    let post = moe_block(&multi, None, Some((slot_of, slots)), shared.as_ref())?;
                    let routed = |m: &MoeDispatch| {
                        let mut p = Program::default();
                        p.stage("experts");
                        m.routed(&mut p, opts.executor, experts, slot_of);
                        p
                    };
                    let (ro, rod) = if slots > 0 {
                        (Some(routed(&multi_y)), single_y.as_ref().map(routed))
                    } else {
                        (None, None)
                    };
                    (post, None, ro, rod)
                } else {
                    let post = moe_block(&multi, Some((experts, slot_of)), None, shared.as_ref())?;
                    // One-token steps use the uniform-window INT4 kernels, or the
                    // GPU-shaped kernels for every pool.
                    let post_decode = match &single {
                        Some(m) if coalesced || matches!(experts, ExpertStore::Int4(_)) => Some(
                            moe_block(m, Some((experts, slot_of)), None, shared.as_ref())?,
                        ),
                        _ => None,
                    };
                    let routed_only = (placement == ExpertPlacement::Cached).then(|| {
                        let mut p = Program::default();
                        multi.routed(&mut p, opts.executor, experts, slot_of);
                        p
                    });
                    if let (Some(_), Some(m), ExpertPlacement::Cached) =
                        (&post_decode, &single, placement)
                    {
                        let mut p = Program::default();
                        p.stage("experts");
                        m.routed(&mut p, opts.executor, experts, slot_of);
                        hits_decode = Some(p);
                    }
                    (post, post_decode, routed_only, None)
                };
                (
                    post,
                    post_decode,
                    routed_only,
                    routed_only_decode,
                    placement.host_term(),
                )
            }
            Mlp::Dense { mlp } => {
                let dense = |m: &MoeDispatch| {
                    let mut p = Program::default();
                    p.stage("dense_mlp");
                    m.swiglu_dense(&mut p, mlp, combine.shared_y);
                    p.stage("combine");
                    ops::moe_combine(&mut p, &combine_params(flags::COMBINE_SHARED, 0), &combine);
                    p
                };
                let decode = match &single {
                    Some(m) if coalesced => Some(dense(m)),
                    _ => None,
                };
                (dense(&multi), decode, None, None, false)
            }
        };
        let predict = match next_router(cfg, w, l) {
            Some(router) if opts.predict_width > 0 && matches!(lw.mlp, Mlp::Moe { .. }) => {
                let mut p = Program::default();
                p.stage("predict");
                let logits = b.get("predict_logits")?;
                ops::router_matmul(&mut p, env, router, xn, logits, router_stride);
                ops::router_topk(
                    &mut p,
                    &RouterTopkParams {
                        n_experts: cfg.num_experts as u32,
                        top_k: opts.predict_width.min(cfg.num_experts) as u32,
                        logits_stride: router_stride as u32,
                        norm_topk: 0,
                        splits: if env.plan.coalesced_decode {
                            ops::router_splits(router.rows, h) as u32
                        } else {
                            1
                        },
                        ..Default::default()
                    },
                    logits,
                    b.get("predict_ids")?,
                    b.get("predict_weights")?,
                );
                Some(dev.prepare(p, step)?)
            }
            _ => None,
        };
        let pre_batched = batched_attention
            .map(|a| pre.with_stages_replaced(&["attention", "attention_combine"], a));
        // Fused only where the block's gate/up does route and write the ids (else `pre`
        // without router_topk would leave them stale).
        let routes = |p: &Program| {
            p.ops.iter().any(|o| {
                matches!(o.kernel, crate::backend::Kernel::ExpertGateUp(_))
                    && o.params.len() == std::mem::size_of::<ExpertGateUpParams>()
                    && bytemuck::pod_read_unaligned::<ExpertGateUpParams>(&o.params).flags
                        & flags::FFN_ROUTE_WRITE
                        != 0
            })
        };
        let fused_decode = fused_post
            .filter(|p| routes(p))
            .map(|post| {
                let pre = pre.with_stages_replaced(&["router_topk"], Vec::new());
                Ok::<_, Error>((dev.prepare(pre, step)?, dev.prepare(post, step)?))
            })
            .transpose()?;
        out.push(LayerPrograms {
            pre_batched: pre_batched.map(|p| dev.prepare(p, step)).transpose()?,
            pre: dev.prepare(pre, step)?,
            post: dev.prepare(post, step)?,
            post_decode: post_decode.map(|p| dev.prepare(p, step)).transpose()?,
            routed_only: routed_only.map(|p| dev.prepare(p, step)).transpose()?,
            routed_only_decode: routed_only_decode
                .map(|p| dev.prepare(p, step))
                .transpose()?,
            host_term,
            predict,
            hits_decode: hits_decode.map(|p| dev.prepare(p, step)).transpose()?,
            fused_decode,
        });
    }
    Ok(out)
}

/// The router of the first MoE layer after layer `l`.
fn next_router<'w>(cfg: &ModelConfig, w: &'w ModelWeights, l: usize) -> Option<&'w F16Matrix> {
    (l + 1..cfg.num_layers)
        .filter(|&n| cfg.sparse_layers[n])
        .find_map(|n| match &w.layers.get(n)?.mlp {
            Mlp::Moe { router, .. } => Some(router),
            Mlp::Dense { .. } => None,
        })
}

type Heads = (Prepared, (Prepared, Prepared), Option<(Prepared, Prepared)>);

/// Final norm and lm_head (last token, or every token), and the argmax.
pub(super) fn build_head(
    dev: &Device,
    cfg: &ModelConfig,
    w: &ModelWeights,
    opts: &ForwardOptions,
    env: &OpEnv,
    b: &Buffers,
    step: &Buffer,
) -> Result<Heads> {
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    let eps = cfg.rms_norm_eps as f32;
    let (x, xf, logits, ids, part) = (
        b.get("x")?,
        b.get("x_final")?,
        b.get("logits")?,
        b.get("ids")?,
        b.get("argmax_part")?,
    );
    let lm = w.lm_head();
    let mut suppress = [0u32; 4];
    let n_suppress = opts.suppress.len().min(4);
    suppress[..n_suppress].copy_from_slice(&opts.suppress[..n_suppress]);
    let argmax = |all: bool, n_suppress: usize| -> Result<Prepared> {
        let mut p = Program::default();
        p.stage("argmax");
        ops::argmax(
            &mut p,
            &ArgmaxParams {
                n: v as u32,
                n_suppress: n_suppress as u32,
                row_stride: v as u32,
                flags: if all { flags::ARGMAX_LAST_ROW } else { 0 },
                suppress,
            },
            logits,
            ids,
            part,
            // One workgroup over the vocabulary is a GPU's longest dependent wait.
            env.plan.coalesced_decode,
        );
        dev.prepare(p, step)
    };
    let head = |fl: u32| -> Result<Prepared> {
        let mut p = Program::default();
        p.stage("lm_head");
        let norm = NormInput {
            weight: &w.final_norm,
            x,
            xn: xf,
            n: h,
            eps,
            write: false,
            stage: "final_norm",
        };
        norm_fold::normed_matmul(&mut p, env, &norm, lm, None, logits, v, fl);
        dev.prepare(p, step)
    };
    // Batched steps need every row's logits too.
    let all = if opts.all_logits || opts.batch > 1 || opts.score_rows > 1 {
        Some((head(0)?, argmax(true, n_suppress)?))
    } else {
        None
    };
    let last = (argmax(false, n_suppress)?, argmax(false, 0)?);
    Ok((head(flags::LAST_TOKEN_ONLY)?, last, all))
}

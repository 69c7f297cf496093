//! The forward pass. Activation buffers are sized for one prefill chunk at load time (the
//! workspace table) and every dispatch is pre-built and prepared, so a step is: write the
//! step uniform, issue the programs in one submission. With greedy decoding the sampled
//! id is written on the device where the next step's embedding reads it, and only those 4
//! bytes come back to the host. (Submitting steps is in `model::step`.)

use std::collections::HashMap;

use crate::backend::params::*;
use crate::backend::{Buffer, Device, Kernel, KernelPlan, Prepared, Usage};
use crate::config::{ModelConfig, QkNorm};
use crate::error::{Error, Result};
use crate::format::trace::Tracer;
use crate::model::layers::{self, Buffers};
pub use crate::model::layers::{ForwardOptions, LayerPrograms};
use crate::model::moe::{Executor, MoePairs, MoeSorted};
use crate::model::ops::{self, OpEnv};
use crate::model::residency::Residency;
use crate::model::tensors::ExpertStore;
use crate::model::weights::{Mlp, ModelWeights};
use crate::model::workspace::{self, WorkspaceShape};
use crate::residency::Profile;

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

/// Most (token, expert) pairs per expert for which a batched step runs its MLP blocks one
/// token at a time (llama.cpp's gate between its per-token and grouped expert paths is
/// n_tokens * k <= 2 * n_experts).
pub const SOLO_PAIRS_PER_EXPERT: usize = 2;

/// The buffers the per-token MLP blocks of batched steps move rows through
/// (`model::solo`).
pub struct SoloBuffers {
    pub x: Buffer,
    pub router_logits: Buffer,
    /// One row of the widest of x, the router logits and the top-k rows.
    pub row: Buffer,
    /// Token 0's hidden state while row 0 serves the others.
    pub x0: Buffer,
}

/// Most decode steps a generation keeps submitted ahead of the host (`--pipeline-depth`).
pub const MAX_PIPELINE_DEPTH: usize = 8;

/// Dispatch and submission counts since creation (metrics).
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub dispatches: u64,
    pub submissions: u64,
}

pub struct Forward {
    pub dev: Device,
    pub cfg: ModelConfig,
    pub plan: KernelPlan,
    pub weights: ModelWeights,
    pub opts: ForwardOptions,
    pub(crate) step: Buffer,
    pub(crate) ids: Buffer,
    pub(crate) logits: Buffer,
    /// Readback buffers a step's chosen token is copied into, one per step in flight
    /// (`token_slot` says which the next step uses; slot 0 for unpipelined steps).
    pub(crate) token_ring: Vec<Buffer>,
    pub(crate) token_slot: usize,
    /// With `copy_logits`, the step also copies its last logits row into
    /// `logits_ring[token_slot]` (allocated on first use: pipelined steps whose logits
    /// the host reads, for recorded logits or log-probabilities).
    pub(crate) logits_ring: Vec<Buffer>,
    pub(crate) copy_logits: bool,
    pub(crate) topk_ids: Buffer,
    pub(crate) topk_weights: Buffer,
    /// The guess of the next MoE layer's experts (`LayerPrograms::predict`).
    pub(crate) predict_ids: Buffer,
    pub(crate) xn: Buffer,
    pub(crate) route_readback: Buffer,
    /// The CPU experts' weighted sum, [T, H] (with CPU experts).
    pub(crate) host_y: Option<Buffer>,
    pub layers: Vec<LayerPrograms>,
    pub(crate) head_last: Prepared,
    /// The argmax skipping `opts.suppress` (EOS), and (`argmax_eos`) the one that may pick
    /// it; `suppress_eos` says which a step runs.
    pub(crate) argmax_last: Prepared,
    pub(crate) argmax_eos: Prepared,
    /// Greedy steps never pick the suppressed ids (EOS): set per generation from
    /// `ignore_eos`.
    pub suppress_eos: bool,
    pub(crate) head_all: Option<(Prepared, Prepared)>,
    /// Partial residency: the cache runtime.
    pub residency: Option<Residency>,
    /// Read each layer's routing back to the host even with every expert resident
    /// (profile recording).
    pub record_routing: bool,
    /// Per-layer expert frequencies recorded from the routing (`--write-profile`).
    pub profile: Option<Profile>,
    /// Routing traces (`--trace`, `--live`): reads each layer's routing back, like
    /// `record_routing`, with the router's weights (`model::trace_hook`).
    pub trace: Option<Tracer>,
    /// `--profile-kernels`: every step's dispatches replayed and timed, gathered here.
    pub kernel_profile: Option<crate::backend::kernel_profile::KernelProfile>,
    /// The position of the step being submitted (its first token's), which the grids of
    /// position-sized dispatches (attention's key splits) follow.
    pub(crate) step_pos0: u32,
    pub counters: Counters,
    /// The step being submitted is batched (one token of each of several sequences).
    pub(crate) batched: bool,
    /// Batched steps: the rows the per-token MLP blocks move through (`model::solo`).
    pub(crate) solo: Option<SoloBuffers>,
    /// A batched step with at most this many (token, expert) pairs per expert runs its
    /// MLP blocks one token at a time (`model::solo`; 0: never).
    pub solo_pairs_per_expert: usize,
}

/// The workspace buffers, by name.
fn check_shapes(dev: &Device, cfg: &ModelConfig, ctxlen: usize) -> Result<()> {
    let kv_dim = cfg.num_kv_heads * cfg.head_dim;
    let maxb = dev.binding_limit() as usize;
    if cfg.num_experts > ROUTER_MAX_EXPERTS {
        return Err(Error::DoesNotFit(format!(
            "num_experts {}: the router kernel supports up to {ROUTER_MAX_EXPERTS} experts",
            cfg.num_experts
        )));
    }
    let hd = cfg.head_dim;
    if hd > ATTENTION_MAX_HEAD_DIM || !hd.is_multiple_of(2) {
        return Err(Error::DoesNotFit(format!(
            "head_dim {hd}: attention supports even head dims up to {ATTENTION_MAX_HEAD_DIM}"
        )));
    }
    if cfg.qk_norm == QkNorm::PerHead && cfg.num_heads + cfg.num_kv_heads > ROPE_MAX_NORM_HEADS {
        return Err(Error::DoesNotFit(format!(
            "{} query + {} KV heads: the per-head q/k norm supports up to {ROPE_MAX_NORM_HEADS} heads",
            cfg.num_heads, cfg.num_kv_heads
        )));
    }
    if ctxlen * kv_dim * 4 > maxb {
        return Err(Error::DoesNotFit(format!(
            "a KV cache of {ctxlen} positions x {kv_dim} floats per layer exceeds the adapter's storage binding limit ({maxb} bytes); at most {} positions fit",
            maxb / (kv_dim * 4)
        )));
    }
    Ok(())
}

impl Forward {
    pub fn new(
        dev: &Device,
        cfg: &ModelConfig,
        weights: ModelWeights,
        plan: KernelPlan,
        mut opts: ForwardOptions,
    ) -> Result<Self> {
        let ctxlen = opts.max_context.max(1);
        check_shapes(dev, cfg, ctxlen)?;
        if opts.batch > MAX_BATCH {
            return Err(Error::option(
                "--parallel",
                format!(
                    "{}: a batched step holds at most {MAX_BATCH} sequences",
                    opts.batch
                ),
            ));
        }
        if opts.batch > 1 && matches!(dev, Device::Cuda(_)) {
            return Err(Error::option(
                "--parallel",
                "batched steps (more than 1 slot) run on the wgpu backend only: the CUDA kernels do not read per-sequence KV regions yet (use --parallel 1 or --backend vulkan)",
            ));
        }
        let t =
            workspace::effective_chunk(cfg, ctxlen, opts.prefill_chunk, Some(dev.binding_limit()));
        opts.prefill_chunk = t;
        if opts.batch > t {
            return Err(Error::option(
                "--parallel",
                format!(
                    "{} sequences per step exceed the {t}-token chunk the workspace holds (raise --prefill-chunk or lower --parallel)",
                    opts.batch
                ),
            ));
        }
        // Scoring rows are a convenience (fewer readbacks): as many as one binding holds.
        let row_bytes = (cfg.vocab_size as u64 * 4).max(1);
        opts.score_rows = opts
            .score_rows
            .min((dev.binding_limit() / row_bytes) as usize);
        let logit_rows = workspace::logit_rows(opts.all_logits, t, opts.batch, opts.score_rows);
        if (logit_rows * cfg.vocab_size * 4) as u64 > dev.binding_limit() {
            return Err(Error::DoesNotFit(format!(
                "logits of {logit_rows} rows x {} exceed the storage binding limit",
                cfg.vocab_size
            )));
        }
        let int4 = weights.layers.iter().any(|l| {
            matches!(
                &l.mlp,
                Mlp::Moe {
                    experts: ExpertStore::Int4(_),
                    ..
                }
            )
        });
        let expert_major = plan.expert_major(int4, opts.executor == Executor::Grouped, t);
        let shape = WorkspaceShape {
            max_context: ctxlen,
            chunk: t,
            all_logits: opts.all_logits,
            score_rows: opts.score_rows,
            batch: opts.batch.max(1),
            expert_major: Some(expert_major),
            host_experts: opts.host_experts(),
            kv: plan.kv,
        };
        let table = workspace::workspace(cfg, &shape)?;
        let mut map = HashMap::new();
        for r in &table {
            if !r.name.starts_with("moe_") {
                map.insert(r.name.clone(), dev.alloc(&r.name, r.bytes, r.usage)?);
            }
        }
        let b = Buffers(map);
        dev.write(
            b.get("rope")?,
            0,
            bytemuck::cast_slice(&ops::rope_table(cfg.rope_theta, cfg.head_dim, ctxlen)),
        )?;
        let sorted = if expert_major {
            Some(MoeSorted::new(
                dev,
                &table,
                t,
                cfg.top_k,
                cfg.num_experts,
                cfg.hidden_size,
                cfg.moe_intermediate,
            )?)
        } else {
            None
        };
        // Multi-token steps on the tiled GEMMs: the pairs sorted by expert.
        let pairs = if plan.tiled_prefill && t > 1 {
            Some(MoePairs {
                pmax: t * cfg.top_k,
                n_experts: cfg.num_experts,
                buffer: dev.alloc(
                    "moe_pairs",
                    workspace::row(&table, "moe_pairs")?.bytes,
                    Usage::Storage,
                )?,
            })
        } else {
            None
        };
        let step = dev.alloc("step", STEP_BYTES, Usage::Uniform)?;
        let env = OpEnv {
            plan: &plan,
            chunk: t,
            dummy: b.get("dummy")?,
        };
        let layers = layers::build_layers(
            dev,
            cfg,
            &weights,
            &opts,
            &env,
            &b,
            (sorted.as_ref(), pairs.as_ref()),
            &step,
        )?;
        let (head_last, (argmax_last, argmax_eos), head_all) =
            layers::build_head(dev, cfg, &weights, &opts, &env, &b, &step)?;
        let solo = if opts.batch > 1 {
            Some(SoloBuffers {
                x: b.get("x")?.clone(),
                router_logits: b.get("router_logits")?.clone(),
                row: b.get("solo_row")?.clone(),
                x0: b.get("solo_x0")?.clone(),
            })
        } else {
            None
        };
        dev.check()?;
        Ok(Forward {
            dev: dev.clone(),
            cfg: cfg.clone(),
            plan,
            weights,
            opts,
            ids: b.get("ids")?.clone(),
            logits: b.get("logits")?.clone(),
            token_ring: (0..MAX_PIPELINE_DEPTH)
                .map(|i| b.get(&format!("token_ring.{i}")).cloned())
                .collect::<Result<_>>()?,
            token_slot: 0,
            logits_ring: Vec::new(),
            copy_logits: false,
            topk_ids: b.get("topk_ids")?.clone(),
            topk_weights: b.get("topk_weights")?.clone(),
            predict_ids: b.get("predict_ids")?.clone(),
            xn: b.get("xn")?.clone(),
            route_readback: b.get("route_readback")?.clone(),
            host_y: b.0.get("host_y").cloned(),
            step,
            layers,
            head_last,
            argmax_last,
            argmax_eos,
            suppress_eos: true,
            head_all,
            residency: None,
            record_routing: false,
            profile: None,
            trace: None,
            // The developer's switch of old, as --profile-kernels.
            kernel_profile: std::env::var_os("WGMOE_PROFILE_KERNELS").map(|_| Default::default()),
            step_pos0: 0,
            counters: Counters::default(),
            batched: false,
            solo,
            solo_pairs_per_expert: SOLO_PAIRS_PER_EXPERT,
        })
    }

    /// Positions one `Head::All` step returns logits for (the logits buffer's rows).
    pub fn logit_rows(&self) -> usize {
        if self.head_all.is_none() {
            return 1;
        }
        workspace::logit_rows(
            self.opts.all_logits,
            self.opts.prefill_chunk,
            self.opts.batch,
            self.opts.score_rows,
        )
    }

    /// The argmax a greedy step runs.
    pub(crate) fn argmax(&self) -> &Prepared {
        if self.suppress_eos {
            &self.argmax_last
        } else {
            &self.argmax_eos
        }
    }

    /// Dispatches of one decode step (greedy, full residency) at position `pos` (`LONGEST`:
    /// the most any decode step makes, its attention split over the most keys).
    pub fn dispatches_per_decode_step(&self, pos: u32) -> usize {
        self.decode_step_kernels(pos).len()
    }

    /// The (stage, kernel) of each dispatch of one decode step (greedy, full residency) at
    /// position `pos`, in order: the layers' attention and router, their MLP blocks, the
    /// head, the argmax.
    pub fn decode_step_kernels(&self, pos: u32) -> Vec<(&'static str, Kernel)> {
        let progs = self
            .layers
            .iter()
            .flat_map(|l| {
                let (pre, post) = l.step_programs(1, false);
                [pre, post]
            })
            .chain([&self.head_last, &self.argmax_last]);
        progs
            .flat_map(|p| {
                p.program().ops.iter().filter_map(|o| {
                    let (op, _) = o.for_tokens(1);
                    o.dispatch(1, pos).map(|(k, _, _)| (op.stage, k))
                })
            })
            .collect()
    }
}

//! Opening a model directory end to end: config, tokenizer, checkpoint, GPU weights and
//! the forward pass, with the options that must be fixed before the first request.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::checkpoint::Checkpoint;
use crate::config::{GenerationConfig, ModelConfig};
use crate::error::{Error, Result};
use crate::gpu::{AdapterRequest, GpuContext};
use crate::model::forward::Head;
use crate::model::{Forward, ForwardOptions, ModelWeights};
use crate::quant::Q4SlotLayout;
use crate::residency::{build_policy, PolicyKind, Profile};
use crate::tokenizer::Tokenizer;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExpertPrecision {
    F16,
    Int4,
}

/// Expert residency, fixed at start-up.
#[derive(Clone, Debug)]
pub struct ResidencyOptions {
    /// Slots per layer; None = every expert resident (or derived from `vram_budget`).
    pub resident_experts: Option<usize>,
    /// Bytes the runtime may allocate on the GPU; derives `resident_experts` if not given.
    pub vram_budget: Option<u64>,
    pub policy: PolicyKind,
    pub decay: f64,
    pub profile: Option<PathBuf>,
    pub staging_buffers: usize,
    /// Record per-layer expert frequencies (reads each layer's routing back).
    pub record_profile: bool,
}

impl Default for ResidencyOptions {
    fn default() -> Self {
        ResidencyOptions {
            resident_experts: None,
            vram_budget: None,
            policy: PolicyKind::Lru,
            decay: crate::residency::LfuDecay::DEFAULT_DECAY,
            profile: None,
            staging_buffers: 4,
            record_profile: false,
        }
    }
}

#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub residency: ResidencyOptions,
    pub adapter: AdapterRequest,
    pub expert_precision: ExpertPrecision,
    pub executor: crate::model::forward::Executor,
    pub max_context: usize,
    pub prefill_chunk: usize,
    pub all_logits: bool,
}

pub struct Engine {
    pub dir: PathBuf,
    pub ctx: GpuContext,
    pub cfg: ModelConfig,
    pub generation: Option<GenerationConfig>,
    pub tokenizer: Option<Tokenizer>,
    pub fwd: Forward,
    pub load_s: f64,
    /// Expert slots per layer in use (== num_experts at full residency).
    pub resident_experts: usize,
}

/// EOS ids of a model: generation_config.json first, then config.json.
pub fn eos_ids(cfg: &ModelConfig, gen: Option<&GenerationConfig>) -> Vec<u32> {
    let mut v: Vec<u32> = gen.map(|g| g.eos_token_ids.clone()).unwrap_or_default();
    if v.is_empty() {
        v = cfg.eos_token_ids.clone();
    }
    v
}

impl Engine {
    /// Everything but the GPU: cheap checks that must fail before any GPU work.
    pub fn open_host(
        dir: &Path,
    ) -> Result<(ModelConfig, Option<GenerationConfig>, Option<Tokenizer>)> {
        if !dir.is_dir() {
            return Err(Error::bad_file(dir, "model directory not found"));
        }
        let cfg = ModelConfig::from_dir(dir)?;
        let generation = GenerationConfig::from_dir(dir)?;
        let tokenizer = if dir.join("tokenizer.json").exists() {
            Some(Tokenizer::from_dir(dir)?)
        } else {
            None
        };
        Ok((cfg, generation, tokenizer))
    }

    pub fn load(dir: &Path, opts: &EngineOptions) -> Result<Self> {
        let t0 = Instant::now();
        let (cfg, generation, tokenizer) = Self::open_host(dir)?;
        if opts.max_context > cfg.max_position_embeddings {
            return Err(Error::option(
                "--max-new-tokens",
                format!(
                    "prompt + new tokens = {} positions exceed max_position_embeddings = {} of {}",
                    opts.max_context,
                    cfg.max_position_embeddings,
                    dir.join("config.json").display()
                ),
            ));
        }
        let ckpt = Arc::new(Checkpoint::open(dir)?);
        if crate::convert::is_converted(&ckpt) {
            crate::convert::validate_converted(&ckpt, &cfg)?;
        }
        let int4 = opts.expert_precision == ExpertPrecision::Int4;
        let r = &opts.residency;
        let capacity = admit(&cfg, opts, int4)?;
        let partial = capacity < cfg.num_experts;
        let ctx = GpuContext::new(&opts.adapter)?;
        let slots = partial.then_some(capacity + cfg.top_k);
        let mut weights = ModelWeights::load(&ctx, &cfg, &ckpt, int4, slots)?;
        let host = weights.host.take();
        let suppress = eos_ids(&cfg, generation.as_ref());
        let mut fwd = Forward::new(
            &ctx,
            &cfg,
            weights,
            ForwardOptions {
                executor: opts.executor,
                max_context: opts.max_context,
                prefill_chunk: opts.prefill_chunk,
                all_logits: opts.all_logits,
                suppress,
                expert_batches: partial,
            },
        )?;
        warm_up(&ctx, &fwd)?;
        if let Some(host) = host {
            let profile = match &r.profile {
                Some(p) => {
                    let pr = Profile::load(p)?;
                    pr.check_matches(cfg.num_layers, cfg.num_experts)
                        .map_err(|e| {
                            Error::option("--profile", format!("{}: {}", p.display(), e.0))
                        })?;
                    Some(pr)
                }
                None => None,
            };
            if r.policy == PolicyKind::Profile && profile.is_none() {
                return Err(Error::option("--cache-policy", "profile needs --profile FILE (written by `wgmoe run ... --write-profile FILE`)"));
            }
            let policy = build_policy(r.policy, r.decay, profile.as_ref(), capacity)
                .map_err(|e| Error::option("--cache-policy", e.0))?;
            let res = crate::model::residency::Residency::new(
                &ctx,
                host,
                &cfg.sparse_layers,
                cfg.top_k,
                capacity,
                r.staging_buffers,
                policy,
            )?;
            fwd.residency = Some(std::cell::RefCell::new(res));
        }
        if r.record_profile {
            fwd.record_routing = true;
            let name = dir
                .file_name()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_default();
            fwd.profile = Some(std::cell::RefCell::new(Profile::new(
                name,
                cfg.num_layers,
                cfg.num_experts,
            )));
        }
        ctx.sync()?;
        Ok(Engine {
            dir: dir.to_path_buf(),
            ctx,
            cfg,
            generation,
            tokenizer,
            fwd,
            load_s: t0.elapsed().as_secs_f64(),
            resident_experts: capacity,
        })
    }

    pub fn eos_ids(&self) -> Vec<u32> {
        eos_ids(&self.cfg, self.generation.as_ref())
    }
}

/// Admission control: the expert slots per layer, fixed before any allocation. A
/// configuration outside the valid range, or over `--vram-budget`, is refused with what
/// would fit.
/// One short prefill and one decode step, discarded: a device's first submission and each
/// kernel's first dispatch pay one-time costs (llvmpipe compiles a shader variant on first
/// use; lavapipe's first submission took 0.4 s here), which belong to loading, not to the
/// first prompt's time to first token. The first prompt overwrites the KV positions
/// written here; no expert cache is attached yet, so no residency counter moves.
fn warm_up(ctx: &GpuContext, fwd: &Forward) -> Result<()> {
    let n = fwd.opts.prefill_chunk.min(2).min(fwd.opts.max_context);
    if n == 0 {
        return Ok(());
    }
    fwd.submit(ctx, 0, n, Some(&vec![0u32; n]), Head::LastArgmax)?;
    fwd.read_token(ctx)?;
    if n < fwd.opts.max_context {
        fwd.submit(ctx, n, 1, None, Head::LastArgmax)?;
        fwd.read_token(ctx)?;
    }
    fwd.counters.set((0, 0));
    Ok(())
}

fn admit(cfg: &ModelConfig, opts: &EngineOptions, int4: bool) -> Result<usize> {
    let r = &opts.residency;
    let (e, k) = (cfg.num_experts, cfg.top_k);
    if let Some(n) = r.resident_experts {
        if n < k || n > e {
            return Err(Error::option(
                "--resident-experts",
                format!("{n} is outside the valid range {k}..={e} (top_k..=num_experts)"),
            ));
        }
    }
    let sparse = cfg.sparse_layers.iter().filter(|&&s| s).count() as u64;
    let slot = if int4 {
        Q4SlotLayout::new(cfg.hidden_size, cfg.moe_intermediate).bytes as u64
    } else {
        crate::gpu::tensor::ExpertPool::slot_bytes(cfg.hidden_size, cfg.moe_intermediate)
    };
    let budget = r.vram_budget;
    let n = match (r.resident_experts, budget) {
        (Some(n), _) => n,
        (None, None) => e,
        (None, Some(_)) => e,
    };
    let fixed = admission_bytes(cfg, opts, int4, k)
        - sparse * (2 * k) as u64 * slot
        - r.staging_buffers as u64 * slot;
    let need = |n: usize| admission_bytes(cfg, opts, int4, n);
    let _ = n;
    let n = match (r.resident_experts, budget) {
        (None, Some(b)) => {
            // The most experts per layer the budget holds.
            let best = (k..=e).rev().find(|&n| need(n) <= b);
            match best {
                Some(n) => n,
                None => {
                    return Err(Error::DoesNotFit(format!(
                        "--vram-budget {}: even {k} experts per layer (top_k) need {}; non-expert weights, KV cache and workspace alone take {}",
                        crate::inspect::human(b), crate::inspect::human(need(k)), crate::inspect::human(fixed)
                    )))
                }
            }
        }
        (Some(n), Some(b)) if need(n) > b => {
            let fits = (k..=e).rev().find(|&m| need(m) <= b);
            return Err(Error::DoesNotFit(format!(
                "{n} experts per layer need {}; the --vram-budget of {} fits {}",
                crate::inspect::human(need(n)),
                crate::inspect::human(b),
                fits.map_or("none (not even top_k)".to_string(), |m| m.to_string())
            )));
        }
        _ => n,
    };
    if n < e && !int4 {
        return Err(Error::option(
            "--resident-experts",
            "partial residency needs --expert-precision int4",
        ));
    }
    Ok(n)
}

/// GPU bytes the runtime allocates with `n` experts resident per layer: non-routed
/// weights, expert slots (plus top_k spares and the staging buffers below full
/// residency), KV cache and workspace. An upper bound of what the tracker will show.
pub fn admission_bytes(cfg: &ModelConfig, opts: &EngineOptions, int4: bool, n: usize) -> u64 {
    let (e, k) = (cfg.num_experts, cfg.top_k);
    let sparse = cfg.sparse_layers.iter().filter(|&&s| s).count() as u64;
    let slot = if int4 {
        Q4SlotLayout::new(cfg.hidden_size, cfg.moe_intermediate).bytes as u64
    } else {
        crate::gpu::tensor::ExpertPool::slot_bytes(cfg.hidden_size, cfg.moe_intermediate)
    };
    let partial = n < e;
    let chunk = opts.prefill_chunk;
    let spares = if partial { k } else { 0 };
    let staging = if partial {
        opts.residency.staging_buffers as u64 * slot
    } else {
        0
    };
    dense_gpu_bytes(cfg)
        + crate::model::forward::workspace_bytes(cfg, opts.max_context, chunk, opts.all_logits)
        + sparse * (n + spares) as u64 * slot
        + staging
}

/// Bytes of every non-routed weight as the GPU holds it (f16, rows padded to 8 halves),
/// with the shared experts and dense MLPs in their slot layout.
pub fn dense_gpu_bytes(cfg: &ModelConfig) -> u64 {
    let mut total = 0u64;
    for (name, shape) in crate::model::weights::expected_tensors(cfg) {
        let n: usize = match shape.as_slice() {
            [rows, cols] => rows * crate::gpu::tensor::pad8(*cols),
            other => crate::gpu::tensor::pad8(other.iter().product::<usize>()),
        };
        // Biases are kept as f32.
        total += n as u64 * if name.ends_with(".bias") { 4 } else { 2 };
    }
    total
}

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

/// A model path must be a directory with a config.json; say plainly what it is instead.
pub fn check_model_dir(dir: &Path) -> Result<()> {
    const WHAT: &str = "wgmoe takes a Hugging Face model directory (config.json, tokenizer.json and *.safetensors weights)";
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(Error::bad_file(dir, "model directory not found"))
        }
        Err(e) => Err(Error::io(dir, e)),
        Ok(m) if !m.is_dir() => {
            let gguf = dir
                .extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("gguf"));
            let hint = if gguf {
                "; GGUF files are not supported: use the model's Hugging Face checkpoint (safetensors)"
            } else {
                match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                    Some(p) if p.join("config.json").is_file() => {
                        return Err(Error::bad_file(
                            dir,
                            format!("is a file, not a model directory: {WHAT}; pass the directory that holds it, {}", p.display()),
                        ))
                    }
                    _ => "",
                }
            };
            Err(Error::bad_file(
                dir,
                format!("is a file, not a model directory: {WHAT}{hint}"),
            ))
        }
        Ok(_) => {
            let cfg = dir.join("config.json");
            if cfg.exists() {
                return Ok(());
            }
            let empty = std::fs::read_dir(dir)
                .map(|mut d| d.next().is_none())
                .unwrap_or(false);
            Err(Error::bad_file(
                cfg,
                format!(
                    "missing: {}{WHAT}",
                    if empty {
                        "the directory is empty; "
                    } else {
                        ""
                    }
                ),
            ))
        }
    }
}

impl Engine {
    /// Everything but the GPU: cheap checks that must fail before any GPU work.
    pub fn open_host(
        dir: &Path,
    ) -> Result<(ModelConfig, Option<GenerationConfig>, Option<Tokenizer>)> {
        check_model_dir(dir)?;
        let cfg = ModelConfig::from_dir(dir)?;
        let generation = GenerationConfig::from_dir(dir)?;
        if let Some(g) = &generation {
            crate::config::check_eos_in_vocab(
                &g.eos_token_ids,
                cfg.vocab_size,
                &dir.join("generation_config.json"),
            )?;
        }
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
        // Counts against the real tensors, then every tensor's shape (headers only), before
        // anything sized by the config is computed or allocated.
        let (capacity, profile) = check_host(&cfg, &ckpt, opts)?;
        if crate::convert::is_converted(&ckpt) {
            crate::convert::validate_converted(&ckpt, &cfg)?;
        }
        let int4 = opts.expert_precision == ExpertPrecision::Int4;
        let r = &opts.residency;
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
    // A non-finite row (flagged by the argmax) is reported by the first real step; the
    // flag is no token to feed a decode step.
    let flagged = fwd.read_token(ctx)? == crate::generate::NON_FINITE_TOKEN;
    if n < fwd.opts.max_context && !flagged {
        fwd.submit(ctx, n, 1, None, Head::LastArgmax)?;
        fwd.read_token(ctx)?;
    }
    fwd.counters.set((0, 0));
    Ok(())
}

/// Every check `Engine::load` makes before it touches the GPU that needs the checkpoint:
/// the config's counts against the tensors, every tensor's shape, and the admission of
/// the expert residency (`bench` runs it for every configuration before measuring).
///
/// Returns the expert slots per layer and, below full residency, the expert profile the
/// cache policy reads (loaded and checked against the model).
pub fn check_host(
    cfg: &ModelConfig,
    ckpt: &Checkpoint,
    opts: &EngineOptions,
) -> Result<(usize, Option<Profile>)> {
    crate::limits::check_checkpoint(cfg, ckpt)?;
    crate::model::weights::check_tensors(cfg, ckpt)?;
    if opts.expert_precision == ExpertPrecision::F16 && crate::convert::is_converted(ckpt) {
        return Err(Error::option(
            "--expert-precision",
            format!("{} holds INT4 experts (converted by `wgmoe quantize`); f16 experts need the original checkpoint", ckpt.dir().display()),
        ));
    }
    let capacity = admit(cfg, opts, opts.expert_precision == ExpertPrecision::Int4)?;
    let r = &opts.residency;
    if capacity >= cfg.num_experts {
        return Ok((capacity, None));
    }
    let profile = match &r.profile {
        Some(p) => {
            let pr = Profile::load(p)?;
            pr.check_matches(cfg.num_layers, cfg.num_experts)
                .map_err(|e| Error::option("--profile", format!("{}: {}", p.display(), e.0)))?;
            Some(pr)
        }
        None => None,
    };
    if r.policy == PolicyKind::Profile && profile.is_none() {
        return Err(Error::option(
            "--cache-policy",
            "profile needs --profile FILE (written by `wgmoe run ... --write-profile FILE`)",
        ));
    }
    build_policy(r.policy, r.decay, profile.as_ref(), capacity)
        .map_err(|e| Error::option("--cache-policy", e.0))?;
    Ok((capacity, profile))
}

/// GPU bytes with `n` experts resident per layer, from parts computed once: admission is
/// closed-form in `n` (the cost is affine in it on each side of full residency).
#[derive(Clone, Copy, Debug)]
pub struct AdmissionCost {
    /// Non-routed weights, KV cache and workspace.
    pub fixed: u64,
    /// One expert slot in every MoE layer.
    pub per_slot: u64,
    /// Below full residency only: top_k spare slots per MoE layer and the staging buffers.
    pub partial_extra: u64,
    pub num_experts: usize,
    pub top_k: usize,
}

impl AdmissionCost {
    pub fn new(cfg: &ModelConfig, opts: &EngineOptions, int4: bool) -> Result<Self> {
        let (e, k) = (cfg.num_experts, cfg.top_k);
        crate::limits::check_context(cfg, opts.max_context, opts.prefill_chunk)?;
        let overflow = |what: &str| {
            Error::DoesNotFit(format!(
                "{what}: the byte count overflows 64 bits ({} experts per layer, {} MoE layers)",
                e,
                cfg.num_sparse_layers()
            ))
        };
        let sparse = cfg.num_sparse_layers() as u64;
        let slot = if int4 {
            Q4SlotLayout::new(cfg.hidden_size, cfg.moe_intermediate).bytes as u64
        } else {
            crate::gpu::tensor::ExpertPool::slot_bytes(cfg.hidden_size, cfg.moe_intermediate)
        };
        let ws = crate::model::forward::workspace_bytes(
            cfg,
            opts.max_context,
            opts.prefill_chunk,
            opts.all_logits,
        );
        let fixed = dense_gpu_bytes(cfg)
            .checked_add(ws)
            .ok_or_else(|| overflow("weights and workspace"))?;
        let per_slot = sparse
            .checked_mul(slot)
            .ok_or_else(|| overflow("expert slots"))?;
        let staging = (opts.residency.staging_buffers as u64)
            .checked_mul(slot)
            .ok_or_else(|| overflow("--staging-buffers"))?;
        let partial_extra = per_slot
            .checked_mul(k as u64)
            .and_then(|s| s.checked_add(staging))
            .ok_or_else(|| overflow("spare slots and staging"))?;
        let c = AdmissionCost {
            fixed,
            per_slot,
            partial_extra,
            num_experts: e,
            top_k: k,
        };
        // The largest counts must be countable, so `bytes` never overflows.
        per_slot
            .checked_mul(e as u64)
            .and_then(|x| x.checked_add(fixed))
            .and_then(|x| x.checked_add(partial_extra))
            .ok_or_else(|| overflow("all experts"))?;
        Ok(c)
    }

    /// GPU bytes with `n` (<= num_experts) experts resident per layer.
    pub fn bytes(&self, n: usize) -> u64 {
        let extra = if n < self.num_experts {
            self.partial_extra
        } else {
            0
        };
        self.fixed + self.per_slot * n.min(self.num_experts) as u64 + extra
    }

    /// The most experts per layer (top_k..=num_experts) whose bytes fit `budget`.
    pub fn most_within(&self, budget: u64) -> Option<usize> {
        let (e, k) = (self.num_experts, self.top_k);
        if self.bytes(e) <= budget {
            return Some(e);
        }
        let avail = budget.checked_sub(self.fixed + self.partial_extra)?;
        let n = match avail.checked_div(self.per_slot) {
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
            // No MoE layer: every n costs the same.
            None => usize::MAX,
        };
        let n = n.min(e.saturating_sub(1));
        (n >= k && self.bytes(n) <= budget).then_some(n)
    }
}

/// Admission control: the expert slots per layer, fixed before any allocation. A
/// configuration outside the valid range, or over `--vram-budget`, is refused with what
/// would fit.
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
    if r.staging_buffers == 0 || r.staging_buffers > MAX_STAGING_BUFFERS {
        return Err(Error::option(
            "--staging-buffers",
            format!("{} is outside 1..={MAX_STAGING_BUFFERS}", r.staging_buffers),
        ));
    }
    let cost = AdmissionCost::new(cfg, opts, int4)?;
    let human = crate::inspect::human;
    let n = match (r.resident_experts, r.vram_budget) {
        (None, None) => e,
        (Some(n), None) => n,
        (None, Some(b)) => cost.most_within(b).ok_or_else(|| {
            Error::DoesNotFit(format!(
                "--vram-budget {}: even {k} experts per layer (top_k) need {}; non-expert weights, KV cache and workspace alone take {}",
                human(b),
                human(cost.bytes(k)),
                human(cost.fixed)
            ))
        })?,
        (Some(n), Some(b)) => {
            if cost.bytes(n) > b {
                return Err(Error::DoesNotFit(format!(
                    "{n} experts per layer need {}; the --vram-budget of {} fits {}",
                    human(cost.bytes(n)),
                    human(b),
                    cost.most_within(b)
                        .map_or("none (not even top_k)".to_string(), |m| m.to_string())
                )));
            }
            n
        }
    };
    if n < e && !int4 {
        return Err(Error::option(
            "--resident-experts",
            "partial residency needs --expert-precision int4",
        ));
    }
    Ok(n)
}

/// Most mapped staging buffers for expert uploads.
pub const MAX_STAGING_BUFFERS: usize = 1024;

/// GPU bytes the runtime allocates with `n` experts resident per layer: non-routed
/// weights, expert slots (plus top_k spares and the staging buffers below full
/// residency), KV cache and workspace. An upper bound of what the tracker will show
/// (`u64::MAX` for a configuration whose bytes cannot be counted).
pub fn admission_bytes(cfg: &ModelConfig, opts: &EngineOptions, int4: bool, n: usize) -> u64 {
    AdmissionCost::new(cfg, opts, int4).map_or(u64::MAX, |c| c.bytes(n))
}

/// Bytes of every non-routed weight as the GPU holds it (f16, rows padded to 8 halves),
/// with the shared experts and dense MLPs in their slot layout.
pub fn dense_gpu_bytes(cfg: &ModelConfig) -> u64 {
    let mut total = 0u128;
    for (name, shape) in crate::model::weights::expected_tensors(cfg) {
        let n: u128 = match shape.as_slice() {
            [rows, cols] => *rows as u128 * crate::gpu::tensor::pad8(*cols) as u128,
            other => other
                .iter()
                .map(|&d| d as u128)
                .product::<u128>()
                .next_multiple_of(8),
        };
        // Biases are kept as f32.
        total += n * if name.ends_with(".bias") { 4 } else { 2 };
    }
    u64::try_from(total).unwrap_or(u64::MAX)
}

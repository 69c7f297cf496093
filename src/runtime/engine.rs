//! Opening a model directory end to end: config, tokenizer, checkpoint, the device, its
//! kernel plan, the weights and the forward pass, with the options that must be fixed
//! before the first request.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::backend::kernel::{KvFormat, WeightFormat};
use crate::backend::{Device, DeviceRequest, KernelOverrides, KernelPlan};
use crate::config::{GenerationConfig, ModelConfig};
use crate::error::{Error, Result};
use crate::format::checkpoint::Checkpoint;
use crate::model::forward::Head;
use crate::model::residency::{ExpertPlacement, Residency, ResidencyConfig};
use crate::model::{Executor, Forward, ForwardOptions, ModelWeights};
use crate::residency::{build_policy, CacheConfig, MissPolicy, PolicyKind, Prefetch, Profile};
use crate::runtime::admission::{admit, AdmissionInput};
use crate::tokenizer::Tokenizer;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExpertPrecision {
    F16,
    /// INT4 routed experts (block 256, from a safetensors checkpoint). A GGUF file's experts
    /// are held in their own blocks, layer by layer: Q4_0 as affine INT4, Q4_K, Q5_K, Q6_K
    /// and Q5_0/Q5_1 as they are, Q8_0 as stored, float experts as Q8_0.
    Int4,
    /// INT4 experts with every matrix 4-bit: a GGUF file's wider expert matrices (Q5_K,
    /// Q6_K, Q5_0/Q5_1, Q8_0, floats) rounded into affine INT4 (smaller slots, so more
    /// experts resident, at a second rounding); Q4_0 and Q4_K stay as they are. The same as
    /// `int4` for safetensors checkpoints and 4-bit GGUF files.
    #[value(name = "int4-strict")]
    #[serde(rename = "int4-strict")]
    Int4Strict,
}

impl ExpertPrecision {
    /// Whether routed experts are held as INT4 slots (not f16).
    pub fn int4(self) -> bool {
        self != ExpertPrecision::F16
    }

    /// The config as this precision holds the experts.
    pub fn apply(self, mut cfg: ModelConfig) -> ModelConfig {
        if self == ExpertPrecision::Int4Strict {
            for k in cfg.expert_kinds.iter_mut() {
                *k = k.four_bit();
            }
        }
        cfg
    }
}

/// Storage of the dense (non-routed) weights: attention q/k/v/o and lm_head. The router,
/// the shared-expert gate, norms, biases and embeddings stay f16 in either case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum DensePrecision {
    #[value(name = "f16")]
    #[serde(rename = "f16")]
    F16,
    /// ggml's Q8_0 (blocks of 32, one f16 scale; `blocks::q8_0`), quantised on load; a GGUF
    /// file's Q8_0 matrices as stored, and its Q4_0, Q4_K, Q5_K, Q6_K and Q5_0/Q5_1 ones in
    /// their own blocks.
    #[value(name = "q8_0")]
    #[serde(rename = "q8_0")]
    Q8_0,
}

impl DensePrecision {
    pub fn name(self) -> &'static str {
        self.format().name()
    }

    /// The dense matrices' format on the device.
    pub fn format(self) -> WeightFormat {
        match self {
            DensePrecision::F16 => WeightFormat::F16,
            DensePrecision::Q8_0 => WeightFormat::Q8,
        }
    }
}

/// Storage of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvPrecision {
    F32,
    /// Two values per u32, written by rope_kv and read by the attention kernels directly.
    F16,
    /// int8 in blocks of 32 along head_dim (a block per head row when head_dim is not a
    /// multiple of 32), one f32 scale per block (`backend::kernel::KvFormat::Q8`).
    #[value(name = "q8_0")]
    #[serde(rename = "q8_0")]
    Q8_0,
}

impl KvPrecision {
    pub fn name(self) -> &'static str {
        self.format().name()
    }

    pub fn format(self) -> KvFormat {
        match self {
            KvPrecision::F32 => KvFormat::F32,
            KvPrecision::F16 => KvFormat::F16,
            KvPrecision::Q8_0 => KvFormat::Q8,
        }
    }
}

/// A KV format the kernels can hold for this model: a q8_0 cache keeps one position's
/// block scales in workgroup memory while rope_kv writes it.
pub fn check_kv_format(cfg: &ModelConfig, kv: KvFormat) -> Result<()> {
    use crate::backend::params::KV_Q8_MAX_BLOCKS;
    let block = crate::blocks::q8_0::kv::kv_block(cfg.head_dim).max(1);
    let blocks = cfg.num_kv_heads * cfg.head_dim / block;
    if kv == KvFormat::Q8 && blocks > KV_Q8_MAX_BLOCKS {
        return Err(Error::option(
            "--kv-precision",
            format!(
                "q8_0 holds at most {KV_Q8_MAX_BLOCKS} blocks per position; {} KV heads of head_dim {} make {blocks}: use f16",
                cfg.num_kv_heads, cfg.head_dim
            ),
        ));
    }
    Ok(())
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
    /// Staging buffers for uploads (0: top_k plus the prefetch width, so a layer's misses
    /// and the next layer's guesses can all be staged at once).
    pub staging_buffers: usize,
    /// Record per-layer expert frequencies (reads each layer's routing back).
    pub record_profile: bool,
    /// Where misses run (None: `auto` below full residency or with CPU layers).
    pub miss_policy: Option<MissPolicy>,
    /// The first N layers' routed experts all run on the CPU (`--n-cpu-moe`).
    pub n_cpu_moe: usize,
    /// CPU expert threads (None: one per core).
    pub cpu_threads: Option<usize>,
    /// `--prefetch` (None: next-layer below full residency unless every miss runs on the
    /// CPU) and `--prefetch-width` (None: top_k).
    pub prefetch: Option<Prefetch>,
    pub prefetch_width: Option<usize>,
    /// Threads filling staging buffers (None: 2, at most one per core; 0: the submitting
    /// thread fills them).
    pub fill_threads: Option<usize>,
}

impl ResidencyOptions {
    /// `--prefetch` in effect below full residency: explicit, or next-layer unless every
    /// miss runs on the CPU (`--miss-policy cpu` never uploads in decode steps).
    pub fn prefetch(&self, cfg: &ModelConfig) -> Result<Prefetch> {
        let miss = self.miss_policy(cfg);
        match self.prefetch {
            Some(p) if p.guesses() && miss == MissPolicy::Cpu => Err(Error::option(
                "--prefetch",
                "next-layer copies guessed experts to the device; with --miss-policy cpu nothing is copied in decode steps (use --miss-policy auto or upload, or --prefetch off)",
            )),
            Some(p) => Ok(p),
            None if miss == MissPolicy::Cpu => Ok(Prefetch::Off),
            None => Ok(Prefetch::NextLayer),
        }
    }

    /// Experts guessed per layer and step (the prefetch slots of a cached layer); 0 with
    /// prefetch off.
    pub fn prefetch_width(&self, cfg: &ModelConfig) -> Result<usize> {
        if self.prefetch(cfg)? == Prefetch::Off {
            return Ok(0);
        }
        let w = self.prefetch_width.unwrap_or(cfg.top_k);
        if w == 0 || w > cfg.num_experts {
            return Err(Error::option(
                "--prefetch-width",
                format!(
                    "{w} is outside 1..={} (the model's experts per layer)",
                    cfg.num_experts
                ),
            ));
        }
        Ok(w)
    }

    /// Staging buffers: as given, or top_k plus the prefetch width.
    pub fn staging_buffers(&self, cfg: &ModelConfig) -> Result<usize> {
        Ok(match self.staging_buffers {
            0 => cfg.top_k + self.prefetch_width(cfg)?,
            n => n,
        })
    }

    /// Fill threads: as given, or 2 (at most one per core).
    pub fn fill_threads(&self) -> usize {
        self.fill_threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(2)
        })
    }

    /// The miss policy in effect for a model of `layers` layers.
    pub fn miss_policy(&self, cfg: &ModelConfig) -> MissPolicy {
        let partial = self.resident_experts.is_some_and(|n| n < cfg.num_experts)
            || self.vram_budget.is_some()
            || self.n_cpu_moe > 0;
        self.miss_policy.unwrap_or(if partial {
            MissPolicy::Auto
        } else {
            MissPolicy::Upload
        })
    }

    /// MoE layers `--n-cpu-moe` puts on the CPU.
    pub fn cpu_layers(&self, cfg: &ModelConfig) -> usize {
        (0..cfg.num_layers.min(self.n_cpu_moe))
            .filter(|&l| cfg.sparse_layers[l])
            .count()
    }
}

/// Where each layer's routed experts live, for `capacity` resident experts per layer.
pub fn placement(cfg: &ModelConfig, r: &ResidencyOptions, capacity: usize) -> Vec<ExpertPlacement> {
    let miss = r.miss_policy(cfg);
    (0..cfg.num_layers)
        .map(|l| {
            if !cfg.sparse_layers[l] {
                ExpertPlacement::Device
            } else if l < r.n_cpu_moe || capacity == 0 {
                ExpertPlacement::Host
            } else if capacity >= cfg.num_experts {
                ExpertPlacement::Device
            } else if miss == MissPolicy::Upload {
                ExpertPlacement::Cached
            } else {
                ExpertPlacement::Hybrid
            }
        })
        .collect()
}

impl Default for ResidencyOptions {
    fn default() -> Self {
        ResidencyOptions {
            resident_experts: None,
            vram_budget: None,
            policy: PolicyKind::Lru,
            decay: crate::residency::LfuDecay::DEFAULT_DECAY,
            profile: None,
            staging_buffers: 0,
            record_profile: false,
            miss_policy: None,
            n_cpu_moe: 0,
            cpu_threads: None,
            prefetch: None,
            prefetch_width: None,
            fill_threads: None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub residency: ResidencyOptions,
    pub adapter: DeviceRequest,
    pub kernels: KernelOverrides,
    pub expert_precision: ExpertPrecision,
    pub dense_precision: DensePrecision,
    pub kv_precision: KvPrecision,
    pub executor: Executor,
    pub max_context: usize,
    pub prefill_chunk: usize,
    pub all_logits: bool,
    /// Logits rows a step returns at least: the server scores a prompt (`echo` with
    /// `logprobs`) that many positions a readback. 0: the last token's only.
    pub score_rows: usize,
    /// Most sequences one batched step holds (`serve --parallel`; 1: no batched steps).
    pub batch: usize,
}

pub struct Engine {
    pub dir: PathBuf,
    pub dev: Device,
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

/// `Engine::open_config` of a GGUF model: the config and the end-of-generation ids from
/// its metadata (the tensors are checked when the checkpoint opens).
fn gguf_config(path: &Path) -> Result<(ModelConfig, Option<GenerationConfig>)> {
    let model = crate::gguf::GgufModel::open(path)?;
    let cfg = crate::gguf::model_config(&model)?;
    let meta = model.metadata();
    let eos = crate::gguf::tokenizer::eog_ids(meta)?;
    crate::config::check_eos_in_vocab(&eos, cfg.vocab_size, model.path())?;
    let generation = GenerationConfig {
        eos_token_ids: eos,
        bos_token_id: meta.opt_u32("tokenizer.ggml.bos_token_id")?,
        pad_token_id: meta.opt_u32("tokenizer.ggml.padding_token_id")?,
        temperature: None,
        top_k: None,
        top_p: None,
        do_sample: None,
    };
    Ok((cfg, Some(generation)))
}

impl Engine {
    /// Everything but the GPU: cheap checks that must fail before any GPU work.
    pub fn open_host(
        dir: &Path,
    ) -> Result<(ModelConfig, Option<GenerationConfig>, Option<Tokenizer>)> {
        let (cfg, generation) = Self::open_config(dir)?;
        Ok((cfg, generation, Self::own_tokenizer(dir)?))
    }

    /// `open_host` without the tokenizer: the config and generation settings.
    pub fn open_config(dir: &Path) -> Result<(ModelConfig, Option<GenerationConfig>)> {
        if crate::gguf::is_gguf_path(dir) {
            return gguf_config(dir);
        }
        crate::format::checkpoint::check_model_path(dir, true)?;
        let cfg = ModelConfig::from_dir(dir)?;
        let generation = GenerationConfig::from_dir(dir)?;
        if let Some(g) = &generation {
            crate::config::check_eos_in_vocab(
                &g.eos_token_ids,
                cfg.vocab_size,
                &dir.join("generation_config.json"),
            )?;
        }
        Ok((cfg, generation))
    }

    /// The model's own tokenizer: a GGUF's from its metadata, a checkpoint's tokenizer.json
    /// (None without one).
    pub fn own_tokenizer(dir: &Path) -> Result<Option<Tokenizer>> {
        if crate::gguf::is_gguf_path(dir) {
            let model = crate::gguf::GgufModel::open_header(dir)?;
            return Ok(Some(crate::gguf::tokenizer::tokenizer(&model)?));
        }
        if dir.join("tokenizer.json").exists() {
            return Ok(Some(Tokenizer::from_dir(dir)?));
        }
        Ok(None)
    }

    pub fn load(dir: &Path, opts: &EngineOptions) -> Result<Self> {
        Self::load_with(dir, opts, None)
    }

    /// `load` with `tokenizer` in place of the model's own (`--tokenizer`), which is then
    /// not built: it may be one wgmoe cannot build.
    pub fn load_with(
        dir: &Path,
        opts: &EngineOptions,
        tokenizer: Option<Tokenizer>,
    ) -> Result<Self> {
        let t0 = Instant::now();
        let (cfg, generation) = Self::open_config(dir)?;
        let cfg = opts.expert_precision.apply(cfg);
        let tokenizer = match tokenizer {
            Some(t) => Some(t),
            None => Self::own_tokenizer(dir)?,
        };
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
        if crate::format::convert::is_converted(&ckpt) {
            crate::format::convert::validate_converted(&ckpt, &cfg)?;
        }
        let int4 = opts.expert_precision.int4();
        let r = &opts.residency;
        let place = placement(&cfg, r, capacity);
        let dev = Device::open(&opts.adapter)?;
        let mut plan = KernelPlan::decide(dev.info(), &opts.kernels)?;
        // CUDA runs Q8_0 through the GPU-shaped kernels; the Q8_0 storage matmul (both
        // storage overrides) has no CUDA port yet.
        if dev.info().backend == "cuda"
            && opts.dense_precision == DensePrecision::Q8_0
            && !plan.coalesced_decode
            && !plan.tiled_prefill
        {
            return Err(Error::option(
                "--dense-precision",
                "q8_0 with the storage kernels (--decode-kernels storage --prefill-kernels storage) has no CUDA kernels yet: use the default GPU-shaped kernels on CUDA, or f16",
            ));
        }
        plan.kv = opts.kv_precision.format();
        check_kv_format(&cfg, plan.kv)?;
        // Device slots per layer: the cache's (capacity + spares), none for CPU layers.
        let width = r.prefetch_width(&cfg)?;
        let slots: Vec<Option<usize>> = place
            .iter()
            .enumerate()
            .map(|(l, p)| match p {
                ExpertPlacement::Device => None,
                ExpertPlacement::Host => Some(0),
                ExpertPlacement::Cached => Some(
                    CacheConfig::partial(l, cfg.num_experts, cfg.top_k, capacity)
                        .with_prefetch(width)
                        .total_slots(),
                ),
                ExpertPlacement::Hybrid => Some(
                    CacheConfig::hybrid(l, cfg.num_experts, cfg.top_k, capacity)
                        .with_prefetch(width)
                        .total_slots(),
                ),
            })
            .collect();
        let mut weights = ModelWeights::load(
            &dev,
            &cfg,
            &ckpt,
            int4,
            opts.dense_precision.format(),
            &slots,
        )?;
        let host = weights.host.take();
        let suppress = eos_ids(&cfg, generation.as_ref());
        let mut fwd = Forward::new(
            &dev,
            &cfg,
            weights,
            plan,
            ForwardOptions {
                executor: opts.executor,
                max_context: opts.max_context,
                prefill_chunk: opts.prefill_chunk,
                all_logits: opts.all_logits,
                score_rows: opts.score_rows,
                suppress,
                expert_batches: place.contains(&ExpertPlacement::Cached),
                placement: place.clone(),
                predict_width: if width > 0 { width } else { cfg.top_k },
                batch: opts.batch,
            },
        )?;
        warm_up(&mut fwd)?;
        // The warm-up compiled every pipeline a step uses: keep them for the next start. A
        // cache that cannot be written costs only that start's time.
        let pr = dev.pipeline_report();
        if let Some(why) = &pr.cache_note {
            eprintln!(
                "note: ignored the pipeline cache {} ({why}); it is rewritten",
                pr.cache_file.as_deref().unwrap_or("")
            );
        }
        if let Err(e) = dev.save_pipeline_cache() {
            eprintln!("note: {e}");
        }
        if let Some(host) = host {
            let policy = build_policy(r.policy, r.decay, profile.as_ref(), capacity.max(1))
                .map_err(|e| Error::option(policy_option(r.policy), e.0))?;
            let miss = r.miss_policy(&cfg);
            let res = Residency::new(
                &dev,
                host,
                &ResidencyConfig {
                    placement: &place,
                    top_k: cfg.top_k,
                    capacity,
                    staging_buffers: r.staging_buffers(&cfg)?,
                    miss,
                    cpu_threads: r.cpu_threads,
                    prefetch: r.prefetch(&cfg)?,
                    prefetch_width: width,
                    fill_threads: r.fill_threads(),
                },
                policy,
            )?;
            fwd.residency = Some(res);
            if miss == MissPolicy::Auto && place.contains(&ExpertPlacement::Hybrid) {
                let figures = fwd.measure_miss_costs()?;
                if let Some(res) = fwd.residency.as_mut() {
                    res.figures = Some(figures);
                }
            }
        }
        if r.record_profile {
            fwd.record_routing = true;
            let name = dir
                .file_name()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_default();
            fwd.profile = Some(Profile::new(name, cfg.num_layers, cfg.num_experts));
        }
        dev.sync()?;
        Ok(Engine {
            dir: dir.to_path_buf(),
            dev,
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

    /// The header of a routing trace of this engine; `policy` as `--cache-policy` names it.
    pub fn trace_header(&self, policy: &str, decay: f64) -> crate::format::trace::TraceHeader {
        let partial = self.resident_experts < self.cfg.num_experts;
        crate::format::trace::TraceHeader {
            wgmoe_trace: crate::format::trace::TRACE_VERSION,
            model: self.dir.display().to_string(),
            model_type: self.cfg.arch.model_type().to_string(),
            num_layers: self.cfg.num_layers,
            moe_layers: (0..self.cfg.num_layers)
                .filter(|&l| self.cfg.sparse_layers[l])
                .collect(),
            num_experts: self.cfg.num_experts,
            top_k: self.cfg.top_k,
            expert_bytes: crate::runtime::admission::slot_bytes(&self.cfg, true),
            resident_experts_per_layer: self.resident_experts,
            cache_policy: partial.then(|| policy.to_string()),
            decay,
            prefill_chunk: self.fwd.opts.prefill_chunk,
            miss_policy: self
                .fwd
                .residency
                .as_ref()
                .map(|r| r.miss.name().to_string()),
            cpu_layers: self.cpu_layers(),
        }
    }

    /// MoE layers whose routed experts all run on the CPU (no device slots).
    pub fn cpu_layers(&self) -> Vec<usize> {
        (0..self.cfg.num_layers)
            .filter(|&l| self.cfg.sparse_layers[l])
            .filter(|&l| self.fwd.opts.placement(l) == ExpertPlacement::Host)
            .collect()
    }

    /// Trace routing from now on into `path` (JSONL), and into any `extra` sinks.
    pub fn start_trace(
        &mut self,
        path: Option<&Path>,
        policy: &str,
        decay: f64,
        extra: Vec<Box<dyn crate::format::trace::RoutingSink>>,
    ) -> Result<()> {
        let mut t = crate::format::trace::Tracer::new(self.cfg.top_k);
        t.set_host_layers(self.cpu_layers());
        if let Some(p) = path {
            let header = self.trace_header(policy, decay);
            t.add(Box::new(crate::format::trace::JsonlSink::create(
                p, &header,
            )?));
        }
        for s in extra {
            t.add(s);
        }
        self.fwd.trace = Some(t);
        Ok(())
    }

    /// Flush the trace's sinks (the file is complete afterwards).
    pub fn finish_trace(&mut self) -> Result<()> {
        match self.fwd.trace.as_mut() {
            Some(t) => t.finish(),
            None => Ok(()),
        }
    }
}

/// One short prefill and one decode step, discarded: a device's first submission and each
/// kernel's first dispatch pay one-time costs (llvmpipe compiles a shader variant on first
/// use; lavapipe's first submission took 0.4 s here), which belong to loading, not to the
/// first prompt's time to first token. The first prompt overwrites the KV positions
/// written here; no expert cache is attached yet, so no residency counter moves.
fn warm_up(fwd: &mut Forward) -> Result<()> {
    let n = fwd.opts.prefill_chunk.min(2).min(fwd.opts.max_context);
    if n == 0 {
        return Ok(());
    }
    fwd.submit(0, n, Some(&vec![0u32; n]), Head::LastArgmax)?;
    // A non-finite row (flagged by the argmax) is reported by the first real step; the
    // flag is no token to feed a decode step.
    let flagged = fwd.read_token()? == crate::runtime::generate::NON_FINITE_TOKEN;
    if n < fwd.opts.max_context && !flagged {
        fwd.submit(n, 1, None, Head::LastArgmax)?;
        fwd.read_token()?;
    }
    fwd.counters = Default::default();
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
    crate::format::manifest::check_checkpoint(cfg, ckpt)?;
    crate::format::manifest::check_tensors(cfg, ckpt)?;
    if opts.expert_precision == ExpertPrecision::F16 && crate::format::convert::is_converted(ckpt) {
        return Err(Error::option(
            "--expert-precision",
            format!("{} holds INT4 experts (converted by `wgmoe quantize`); f16 experts need the original checkpoint", ckpt.dir().display()),
        ));
    }
    let r = &opts.residency;
    if r.n_cpu_moe > cfg.num_layers {
        return Err(Error::option(
            "--n-cpu-moe",
            format!(
                "{} is more than the model's {} layers",
                r.n_cpu_moe, cfg.num_layers
            ),
        ));
    }
    if let Some(n) = r.resident_experts.filter(|&n| n > cfg.num_experts) {
        // The range of the partial residency the user asks for: the miss policy below
        // full residency (auto unless given), not the upload policy of full residency.
        let lo = match r.miss_policy.unwrap_or(MissPolicy::Auto) {
            MissPolicy::Upload => cfg.top_k,
            _ => 0,
        };
        return Err(Error::option(
            "--resident-experts",
            format!(
                "{n} is outside the valid range {lo}..={e}: the model has {e} experts per layer",
                e = cfg.num_experts
            ),
        ));
    }
    let capacity = admit(
        cfg,
        &AdmissionInput {
            dense: opts.dense_precision.format(),
            kv: opts.kv_precision.format(),
            int4: opts.expert_precision.int4(),
            max_context: opts.max_context,
            prefill_chunk: opts.prefill_chunk,
            all_logits: opts.all_logits,
            score_rows: opts.score_rows,
            batch: opts.batch,
            staging_buffers: r.staging_buffers(cfg)?,
            miss: r.miss_policy(cfg),
            cpu_layers: r.cpu_layers(cfg),
            prefetch_width: r.prefetch_width(cfg)?,
        },
        r.resident_experts,
        r.vram_budget,
    )?;
    if capacity >= cfg.num_experts || capacity == 0 {
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
        .map_err(|e| Error::option(policy_option(r.policy), e.0))?;
    Ok((capacity, profile))
}

/// The option a policy's construction error is about: LFU's only parameter is `--decay`
/// (issue 39, 12); the profile policy's is its file, named by `--cache-policy profile`.
fn policy_option(kind: PolicyKind) -> &'static str {
    match kind {
        PolicyKind::LfuDecay => "--decay",
        _ => "--cache-policy",
    }
}

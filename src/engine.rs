//! Opening a model directory end to end: config, tokenizer, checkpoint, GPU weights and
//! the forward pass, with the options that must be fixed before the first request.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::checkpoint::Checkpoint;
use crate::config::{GenerationConfig, ModelConfig};
use crate::error::{Error, Result};
use crate::gpu::{AdapterRequest, GpuContext};
use crate::model::{Forward, ForwardOptions, ModelWeights};
use crate::tokenizer::Tokenizer;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExpertPrecision {
    F16,
    Int4,
}

#[derive(Clone, Debug)]
pub struct EngineOptions {
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
    pub fn open_host(dir: &Path) -> Result<(ModelConfig, Option<GenerationConfig>, Option<Tokenizer>)> {
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
        let ckpt = Checkpoint::open(dir)?;
        let ctx = GpuContext::new(&opts.adapter)?;
        if crate::convert::is_converted(&ckpt) {
            crate::convert::validate_converted(&ckpt, &cfg)?;
        }
        let weights = ModelWeights::load(&ctx, &cfg, &ckpt, opts.expert_precision == ExpertPrecision::Int4)?;
        let suppress = eos_ids(&cfg, generation.as_ref());
        let fwd = Forward::new(&ctx, &cfg, weights, ForwardOptions {
            executor: opts.executor,
            max_context: opts.max_context,
            prefill_chunk: opts.prefill_chunk,
            all_logits: opts.all_logits,
            suppress,
        })?;
        ctx.sync()?;
        Ok(Engine {
            dir: dir.to_path_buf(),
            ctx,
            cfg,
            generation,
            tokenizer,
            fwd,
            load_s: t0.elapsed().as_secs_f64(),
        })
    }

    pub fn eos_ids(&self) -> Vec<u32> {
        eos_ids(&self.cfg, self.generation.as_ref())
    }
}

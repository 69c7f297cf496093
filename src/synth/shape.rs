//! The shapes `synth` writes: the real checkpoints' (presets from their config.json
//! values) and overrides of them.

use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum SynthArch {
    /// OLMoE-1B-7B (OlmoeForCausalLM): 16 layers, hidden 2048, 64 experts top-8.
    #[value(name = "olmoe-1b-7b")]
    #[serde(rename = "olmoe-1b-7b")]
    Olmoe1b7b,
    /// Qwen1.5-MoE-A2.7B (Qwen2MoeForCausalLM): 24 layers, hidden 2048, 60 experts top-4,
    /// shared expert 5632.
    #[value(name = "qwen1.5-moe-a2.7b")]
    #[serde(rename = "qwen1.5-moe-a2.7b")]
    Qwen15MoeA27b,
}

impl SynthArch {
    pub fn name(self) -> &'static str {
        match self {
            SynthArch::Olmoe1b7b => "olmoe-1b-7b",
            SynthArch::Qwen15MoeA27b => "qwen1.5-moe-a2.7b",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SynthFormat {
    /// wgmoe's converted INT4 format (f16 non-routed tensors, packed INT4 experts).
    Converted,
    /// A bf16 Hugging Face checkpoint with per-expert tensors.
    Hf,
}

/// Every dimension of a synthetic model.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SynthShape {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub experts: usize,
    pub top_k: usize,
    pub expert_intermediate: usize,
    /// Qwen2-MoE only.
    pub shared_expert_intermediate: Option<usize>,
    /// Qwen2-MoE `intermediate_size` (dense MLP layers; none with the presets' layer plan).
    pub dense_intermediate: usize,
    pub vocab: usize,
    pub max_position_embeddings: usize,
}

/// Per-dimension overrides of a preset (the CLI's `--hidden` etc.).
#[derive(Clone, Debug, Default)]
pub struct ShapeOverrides {
    pub hidden: Option<usize>,
    pub layers: Option<usize>,
    pub heads: Option<usize>,
    pub kv_heads: Option<usize>,
    pub experts: Option<usize>,
    pub top_k: Option<usize>,
    pub expert_intermediate: Option<usize>,
    pub shared_expert_intermediate: Option<usize>,
    pub vocab: Option<usize>,
    pub max_position_embeddings: Option<usize>,
}

/// The real checkpoints' config.json values (DESIGN.md section 2).
pub fn preset(arch: SynthArch) -> SynthShape {
    match arch {
        SynthArch::Olmoe1b7b => SynthShape {
            hidden: 2048,
            layers: 16,
            heads: 16,
            kv_heads: 16,
            experts: 64,
            top_k: 8,
            expert_intermediate: 1024,
            shared_expert_intermediate: None,
            dense_intermediate: 1024,
            vocab: 50304,
            max_position_embeddings: 4096,
        },
        SynthArch::Qwen15MoeA27b => SynthShape {
            hidden: 2048,
            layers: 24,
            heads: 16,
            kv_heads: 16,
            experts: 60,
            top_k: 4,
            expert_intermediate: 1408,
            shared_expert_intermediate: Some(5632),
            dense_intermediate: 5632,
            vocab: 151936,
            max_position_embeddings: 8192,
        },
    }
}

impl SynthShape {
    /// The preset with the given dimensions replaced; checked for consistency.
    pub fn resolve(arch: SynthArch, o: &ShapeOverrides) -> Result<Self> {
        let mut s = preset(arch);
        let pos = |flag: &str, v: Option<usize>, cur: usize| -> Result<usize> {
            match v {
                Some(0) => Err(Error::option(flag, "must be greater than 0")),
                Some(x) => Ok(x),
                None => Ok(cur),
            }
        };
        s.hidden = pos("--hidden", o.hidden, s.hidden)?;
        s.layers = pos("--layers", o.layers, s.layers)?;
        s.heads = pos("--heads", o.heads, s.heads)?;
        // Heads given without kv heads: keep the preset's ratio (1:1 in both presets).
        s.kv_heads = pos(
            "--kv-heads",
            o.kv_heads,
            if o.heads.is_some() {
                s.heads
            } else {
                s.kv_heads
            },
        )?;
        s.experts = pos("--experts", o.experts, s.experts)?;
        s.top_k = pos("--top-k", o.top_k, s.top_k)?;
        s.expert_intermediate = pos(
            "--expert-intermediate",
            o.expert_intermediate,
            s.expert_intermediate,
        )?;
        if arch == SynthArch::Olmoe1b7b {
            if o.shared_expert_intermediate.is_some() {
                return Err(Error::option(
                    "--shared-expert-intermediate",
                    "OLMoE has no shared expert",
                ));
            }
            s.dense_intermediate = s.expert_intermediate;
        } else {
            s.shared_expert_intermediate = Some(pos(
                "--shared-expert-intermediate",
                o.shared_expert_intermediate,
                s.shared_expert_intermediate.unwrap_or(5632),
            )?);
        }
        s.vocab = pos("--vocab", o.vocab, s.vocab)?;
        s.max_position_embeddings = pos(
            "--max-position-embeddings",
            o.max_position_embeddings,
            s.max_position_embeddings,
        )?;
        if s.hidden % s.heads != 0 {
            return Err(Error::option(
                "--heads",
                format!("{} does not divide --hidden {}", s.heads, s.hidden),
            ));
        }
        if (s.hidden / s.heads) % 2 != 0 {
            return Err(Error::option(
                "--heads",
                format!(
                    "head dim {} (hidden / heads) is odd; RoPE needs it even",
                    s.hidden / s.heads
                ),
            ));
        }
        if s.heads % s.kv_heads != 0 {
            return Err(Error::option(
                "--kv-heads",
                format!("{} does not divide --heads {}", s.kv_heads, s.heads),
            ));
        }
        if s.top_k > s.experts {
            return Err(Error::option(
                "--top-k",
                format!("{} is larger than --experts {}", s.top_k, s.experts),
            ));
        }
        if s.vocab < 16 {
            return Err(Error::option(
                "--vocab",
                format!(
                    "{} is too small (at least 16: special tokens and a few words)",
                    s.vocab
                ),
            ));
        }
        if s.vocab > u32::MAX as usize / 2 {
            return Err(Error::option(
                "--vocab",
                format!("{} is too large", s.vocab),
            ));
        }
        Ok(s)
    }

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}


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
    /// Qwen3-30B-A3B (Qwen3MoeForCausalLM): 48 layers, hidden 2048, 32 heads of 128 over 4
    /// KV heads, 128 experts top-8 of 768, per-head q/k norm.
    #[value(name = "qwen3-30b-a3b")]
    #[serde(rename = "qwen3-30b-a3b")]
    Qwen3Moe30bA3b,
    /// Mixtral-8x7B (MixtralForCausalLM): 32 layers, hidden 4096, 32 heads over 8 KV heads,
    /// 8 experts top-2 of 14336.
    #[value(name = "mixtral-8x7b")]
    #[serde(rename = "mixtral-8x7b")]
    Mixtral8x7b,
}

impl SynthArch {
    pub fn name(self) -> &'static str {
        match self {
            SynthArch::Olmoe1b7b => "olmoe-1b-7b",
            SynthArch::Qwen15MoeA27b => "qwen1.5-moe-a2.7b",
            SynthArch::Qwen3Moe30bA3b => "qwen3-30b-a3b",
            SynthArch::Mixtral8x7b => "mixtral-8x7b",
        }
    }

    /// Whether config.json gives head_dim (Qwen3) rather than implying hidden / heads.
    pub fn explicit_head_dim(self) -> bool {
        self == SynthArch::Qwen3Moe30bA3b
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SynthFormat {
    /// wgmoe's converted INT4 format (f16 non-routed tensors, packed INT4 experts).
    Converted,
    /// A bf16 Hugging Face checkpoint with per-expert tensors.
    Hf,
    /// One GGUF file (`model.gguf`) in the block types of a llama-quantize scheme
    /// (`--gguf-type`), with a byte-level BPE tokenizer in its metadata.
    Gguf,
}

/// Every dimension of a synthetic model.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SynthShape {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// hidden / heads, except where config.json gives it (Qwen3: 128 with 32 heads over
    /// hidden 2048).
    pub head_dim: usize,
    pub experts: usize,
    pub top_k: usize,
    pub expert_intermediate: usize,
    /// Qwen2-MoE only.
    pub shared_expert_intermediate: Option<usize>,
    /// `intermediate_size` of dense MLP layers (Qwen2-MoE, Qwen3-MoE; none with the
    /// presets' layer plans).
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
    pub head_dim: Option<usize>,
    pub experts: Option<usize>,
    pub top_k: Option<usize>,
    pub expert_intermediate: Option<usize>,
    pub shared_expert_intermediate: Option<usize>,
    pub vocab: Option<usize>,
    pub max_position_embeddings: Option<usize>,
}

/// The real checkpoints' config.json values (models/configs; a test parses both and
/// compares).
pub fn preset(arch: SynthArch) -> SynthShape {
    match arch {
        SynthArch::Olmoe1b7b => SynthShape {
            hidden: 2048,
            layers: 16,
            heads: 16,
            kv_heads: 16,
            head_dim: 128,
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
            head_dim: 128,
            experts: 60,
            top_k: 4,
            expert_intermediate: 1408,
            shared_expert_intermediate: Some(5632),
            dense_intermediate: 5632,
            vocab: 151936,
            max_position_embeddings: 8192,
        },
        SynthArch::Qwen3Moe30bA3b => SynthShape {
            hidden: 2048,
            layers: 48,
            heads: 32,
            kv_heads: 4,
            head_dim: 128,
            experts: 128,
            top_k: 8,
            expert_intermediate: 768,
            shared_expert_intermediate: None,
            dense_intermediate: 6144,
            vocab: 151936,
            max_position_embeddings: 40960,
        },
        SynthArch::Mixtral8x7b => SynthShape {
            hidden: 4096,
            layers: 32,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            experts: 8,
            top_k: 2,
            expert_intermediate: 14336,
            shared_expert_intermediate: None,
            dense_intermediate: 14336,
            vocab: 32000,
            max_position_embeddings: 32768,
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
        let preset_ratio = s.heads / s.kv_heads;
        s.heads = pos("--heads", o.heads, s.heads)?;
        // Heads given without KV heads: keep the preset's ratio where it divides them
        // (1:1 for OLMoE and Qwen1.5, 8:1 for Qwen3, 4:1 for Mixtral).
        let kv_default = if o.heads.is_none() {
            s.kv_heads
        } else if s.heads.is_multiple_of(preset_ratio) {
            s.heads / preset_ratio
        } else {
            s.heads
        };
        s.kv_heads = pos("--kv-heads", o.kv_heads, kv_default)?;
        s.experts = pos("--experts", o.experts, s.experts)?;
        s.top_k = pos("--top-k", o.top_k, s.top_k)?;
        s.expert_intermediate = pos(
            "--expert-intermediate",
            o.expert_intermediate,
            s.expert_intermediate,
        )?;
        match arch {
            SynthArch::Qwen15MoeA27b => {
                s.shared_expert_intermediate = Some(pos(
                    "--shared-expert-intermediate",
                    o.shared_expert_intermediate,
                    s.shared_expert_intermediate.unwrap_or(5632),
                )?);
            }
            _ if o.shared_expert_intermediate.is_some() => {
                return Err(Error::option(
                    "--shared-expert-intermediate",
                    format!("{} has no shared expert", arch.name()),
                ));
            }
            // OLMoE and Mixtral have one intermediate size for every MLP.
            SynthArch::Olmoe1b7b | SynthArch::Mixtral8x7b => {
                s.dense_intermediate = s.expert_intermediate
            }
            SynthArch::Qwen3Moe30bA3b => {}
        }
        s.vocab = pos("--vocab", o.vocab, s.vocab)?;
        s.max_position_embeddings = pos(
            "--max-position-embeddings",
            o.max_position_embeddings,
            s.max_position_embeddings,
        )?;
        if arch.explicit_head_dim() {
            s.head_dim = pos("--head-dim", o.head_dim, s.head_dim)?;
        } else {
            if o.head_dim.is_some() {
                return Err(Error::option(
                    "--head-dim",
                    format!(
                        "{}'s config has no head_dim: it is hidden / heads",
                        arch.name()
                    ),
                ));
            }
            if !s.hidden.is_multiple_of(s.heads) {
                return Err(Error::option(
                    "--heads",
                    format!("{} does not divide --hidden {}", s.heads, s.hidden),
                ));
            }
            s.head_dim = s.hidden / s.heads;
        }
        if !s.head_dim.is_multiple_of(2) {
            return Err(Error::option(
                if arch.explicit_head_dim() {
                    "--head-dim"
                } else {
                    "--heads"
                },
                format!("head dim {} is odd; RoPE needs it even", s.head_dim),
            ));
        }
        if !s.heads.is_multiple_of(s.kv_heads) {
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
        self.head_dim
    }
}

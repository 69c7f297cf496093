//! `config.json` and `generation_config.json`, parsed once into typed structs.
//!
//! The rule here is that a field the published checkpoints carry is *required*: the
//! transformers config classes have defaults that differ from the real models (OlmoeConfig's
//! `intermediate_size` is 2048 where OLMoE-1B-7B uses 1024, Qwen2MoeConfig's `rope_theta` is
//! 10000 where Qwen1.5-MoE uses 1e6), so silently falling back to a default would produce a
//! model that loads and then computes garbage. Only fields that real checkpoints legitimately
//! omit (e.g. `num_key_value_heads` in older configs, `mlp_only_layers`, OLMoE-1B-7B's
//! `rms_norm_eps`) get a default, and that default is the one with the same meaning as the
//! field's absence in transformers. What a family's modeling code does differently is
//! stated once, in `families.rs`, as fields of [`ModelConfig`].

mod families;
mod fields;
mod generation;
mod rope;

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};
use fields::Fields;
pub use generation::GenerationConfig;

/// The model families this runtime implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `model_type: "olmoe"` (OlmoeForCausalLM).
    Olmoe,
    /// `model_type: "qwen2_moe"` (Qwen2MoeForCausalLM).
    Qwen2Moe,
    /// `model_type: "qwen3_moe"` (Qwen3MoeForCausalLM).
    Qwen3Moe,
    /// `model_type: "mixtral"` (MixtralForCausalLM).
    Mixtral,
}

impl Arch {
    pub const SUPPORTED: &'static [&'static str] = &["olmoe", "qwen2_moe", "qwen3_moe", "mixtral"];

    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Olmoe => "olmoe",
            Arch::Qwen2Moe => "qwen2_moe",
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::Mixtral => "mixtral",
        }
    }

    fn from_model_type(s: &str) -> Option<Self> {
        match s {
            "olmoe" => Some(Arch::Olmoe),
            "qwen2_moe" => Some(Arch::Qwen2Moe),
            "qwen3_moe" => Some(Arch::Qwen3Moe),
            "mixtral" => Some(Arch::Mixtral),
            _ => None,
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.model_type())
    }
}

/// RMSNorm of the queries and keys before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Over the whole q and k projections (OLMoE: `self.q_norm(self.q_proj(hidden_states))`,
    /// q_norm over num_heads * head_dim, k_norm over num_kv_heads * head_dim).
    Projection,
    /// Over each head's head_dim, one weight vector shared by the heads (Qwen3-MoE:
    /// `self.q_norm(self.q_proj(hidden_states).view(hidden_shape))`, norm of size head_dim).
    PerHead,
}

impl QkNorm {
    pub fn is_some(self) -> bool {
        self != QkNorm::None
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    /// `num_key_value_heads`; equals `num_heads` when the config omits it (transformers does the same).
    pub num_kv_heads: usize,
    /// `head_dim` when the config gives one, else `hidden_size / num_heads`.
    pub head_dim: usize,
    /// `num_experts` (OLMoE, Qwen; transformers 5 writes `num_local_experts` for Qwen3) or
    /// `num_local_experts` (Mixtral).
    pub num_experts: usize,
    /// `num_experts_per_tok`.
    pub top_k: usize,
    /// Routed expert intermediate size. OLMoE, Mixtral: `intermediate_size`; Qwen:
    /// `moe_intermediate_size`.
    pub moe_intermediate: usize,
    /// Qwen2-MoE: `shared_expert_intermediate_size` (always present for qwen2_moe). Others: None.
    pub shared_expert_intermediate: Option<usize>,
    /// Intermediate size of a dense (non-MoE) MLP layer. Qwen: `intermediate_size` (used by
    /// `mlp_only_layers` / layers off the sparse step). OLMoE, Mixtral: as `moe_intermediate`.
    pub dense_intermediate: usize,
    /// Per layer: true = MoE block, false = dense MLP.
    pub sparse_layers: Vec<bool>,
    /// Renormalise the top-k routing weights to sum to 1 (`norm_topk_prob`, false when
    /// absent; always for Mixtral, whose block renormalises unconditionally).
    pub norm_topk_prob: bool,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: usize,
    /// RMSNorm of q and k: over the projections (OLMoE), per head (Qwen3), none.
    pub qk_norm: QkNorm,
    /// Bias on the q, k and v projections (Qwen2-MoE's attention always has it).
    pub qkv_bias: bool,
    /// OLMoE `clip_qkv`: clamp q, k, v to [-c, c] (null in the published checkpoints).
    pub clip_qkv: Option<f32>,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    /// `eos_token_id` from config.json (an int or a list in the file; empty when null/absent).
    pub eos_token_ids: Vec<u32>,
    /// 64-bit FNV-1a of the raw config.json bytes, as 16 hex digits. Identity of the source
    /// model for later checks (e.g. that a converted model matches the checkpoint it came from).
    pub source_hash: String,
    /// How each layer's routed experts are held with INT4 experts (by layer index; empty:
    /// wgmoe's block-256 INT4 everywhere, a safetensors checkpoint's): a GGUF file's blocks
    /// as they are (Q4_0 as affine INT4, Q4_K/Q5_K/Q6_K/Q5_0/Q5_1 as nibble planes, Q8_0),
    /// its float experts as Q8_0.
    pub expert_kinds: Vec<crate::blocks::quant::SlotKinds>,
    /// The dense matrices a GGUF file stores in a block type the kernels compute as it is
    /// (attention projections, lm_head; Hugging Face names, sorted), and the kind they are
    /// held in with quantised dense weights. Q8_0 and float matrices are not listed (Q8_0
    /// as stored, floats quantised to Q8_0). Empty for safetensors checkpoints.
    pub gguf_dense_kinds: Vec<(String, crate::blocks::quant::Q4Kind)>,
}

impl ModelConfig {
    /// The kind the dense matrix `name` is held in with quantised dense weights, where a
    /// GGUF file stores it in a block type the kernels compute as it is (None: Q8_0).
    pub fn dense_kind(&self, name: &str) -> Option<crate::blocks::quant::Q4Kind> {
        self.gguf_dense_kinds
            .binary_search_by(|x| x.0.as_str().cmp(name))
            .ok()
            .map(|i| self.gguf_dense_kinds[i].1)
    }

    /// A dense matrix stacked from `parts` (name, rows), as held with quantised dense
    /// weights: runs of consecutive parts of one kind (None: Q8_0) and their rows. The
    /// loader uploads each run as its chunks, admission counts them.
    pub fn dense_runs(
        &self,
        parts: &[(String, usize)],
    ) -> Vec<(Option<crate::blocks::quant::Q4Kind>, usize)> {
        let mut runs: Vec<(Option<crate::blocks::quant::Q4Kind>, usize)> = Vec::new();
        for (name, rows) in parts {
            let k = self.dense_kind(name);
            match runs.last_mut() {
                Some(r) if r.0 == k => r.1 += rows,
                _ => runs.push((k, *rows)),
            }
        }
        runs
    }

    /// The kinds of layer `l`'s expert slots with INT4 experts.
    pub fn expert_kinds(&self, l: usize) -> crate::blocks::quant::SlotKinds {
        self.expert_kinds
            .get(l)
            .copied()
            .unwrap_or(crate::blocks::quant::SlotKinds::SYM256)
    }

    /// The INT4 slot of one of layer `l`'s routed experts, its stride the model's largest
    /// slot ([`Self::q4_slot_bytes`]).
    pub fn q4_slot(&self, l: usize) -> crate::blocks::quant::Q4SlotLayout {
        self.unpadded_slot(l).padded_to(self.q4_slot_bytes())
    }

    fn unpadded_slot(&self, l: usize) -> crate::blocks::quant::Q4SlotLayout {
        let k = self.expert_kinds(l);
        crate::blocks::quant::Q4SlotLayout::mixed(
            self.hidden_size,
            self.moe_intermediate,
            k.gate_up,
            k.down,
        )
    }

    /// Bytes of one INT4 expert slot: the largest of the MoE layers' (every layer's slots,
    /// host copies and staging buffers take this stride).
    pub fn q4_slot_bytes(&self) -> usize {
        (0..self.num_layers)
            .filter(|&l| self.sparse_layers.get(l).copied().unwrap_or(true))
            .map(|l| self.unpadded_slot(l).bytes)
            .max()
            .unwrap_or_else(|| self.unpadded_slot(0).bytes)
    }

    /// Reads and parses `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        Self::from_json(&text, &path)
    }

    /// Parses config.json text; `path` is only used to name the file in errors.
    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| Error::bad_file(path, format!("invalid JSON: {e}")))?;
        let Value::Object(obj) = value else {
            return Err(Error::bad_file(path, "expected a JSON object at top level"));
        };
        let f = Fields { obj: &obj, path };

        let model_type = f.req_str("model_type")?;
        let arch = Arch::from_model_type(model_type).ok_or_else(|| {
            Error::field(
                path,
                "model_type",
                format!(
                    "unsupported model type {model_type:?}; supported: {}",
                    Arch::SUPPORTED.join(", ")
                ),
            )
        })?;

        if let Some(act) = f.opt_str("hidden_act")? {
            if act != "silu" {
                return Err(Error::field(
                    path,
                    "hidden_act",
                    format!("{act:?} is not supported (only \"silu\")"),
                ));
            }
        }

        let vocab_size = f.req_pos("vocab_size")?;
        let hidden_size = f.req_pos("hidden_size")?;
        let num_layers = f.req_pos("num_hidden_layers")?;
        let num_heads = f.req_pos("num_attention_heads")?;
        let num_kv_heads = f.opt_pos("num_key_value_heads")?.unwrap_or(num_heads);
        if num_heads % num_kv_heads != 0 {
            return Err(Error::field(
                path,
                "num_key_value_heads",
                format!("{num_kv_heads} does not divide num_attention_heads {num_heads}"),
            ));
        }
        let head_dim = match f.opt_pos("head_dim")? {
            Some(d) => d,
            None => {
                if hidden_size % num_heads != 0 {
                    return Err(Error::field(
                        path,
                        "num_attention_heads",
                        format!("{num_heads} does not divide hidden_size {hidden_size} and no head_dim is given"),
                    ));
                }
                hidden_size / num_heads
            }
        };
        // RoPE is applied to pairs of dimensions.
        if head_dim % 2 != 0 {
            return Err(Error::field(
                path,
                "head_dim",
                format!("{head_dim} is odd; RoPE needs an even head dimension"),
            ));
        }

        let num_experts = families::num_experts(&f, arch)?;
        let top_k = f.req_pos("num_experts_per_tok")?;
        if top_k > num_experts {
            return Err(Error::field(
                path,
                "num_experts_per_tok",
                format!("{top_k} is larger than the {num_experts} experts"),
            ));
        }
        let norm_topk_prob = f.opt_bool("norm_topk_prob")?.unwrap_or(false);
        // Absent from OLMoE-1B-7B's published config: OlmoeConfig's default applies.
        let rms_norm_eps = match (arch, f.opt_f64("rms_norm_eps")?) {
            (_, Some(e)) => e,
            (Arch::Olmoe, None) => 1e-5,
            (_, None) => f.req_f64("rms_norm_eps")?,
        };
        if !(rms_norm_eps > 0.0 && rms_norm_eps.is_finite()) {
            return Err(Error::field(
                path,
                "rms_norm_eps",
                format!("{rms_norm_eps} must be a positive finite number"),
            ));
        }
        let max_position_embeddings = f.req_pos("max_position_embeddings")?;
        let tie_word_embeddings = f.req_bool("tie_word_embeddings")?;
        let rope_theta = rope::parse_rope(&f)?;
        let bos_token_id = f.opt_u32("bos_token_id")?;
        let eos_token_ids = f.id_list("eos_token_id")?;
        check_eos_in_vocab(&eos_token_ids, vocab_size, path)?;
        let fam = families::parse(&f, arch, num_layers, norm_topk_prob)?;

        Ok(ModelConfig {
            arch,
            vocab_size,
            hidden_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            num_experts,
            top_k,
            moe_intermediate: fam.moe_intermediate,
            shared_expert_intermediate: fam.shared_expert_intermediate,
            dense_intermediate: fam.dense_intermediate,
            sparse_layers: fam.sparse_layers,
            norm_topk_prob: fam.norm_topk_prob,
            rope_theta,
            rms_norm_eps,
            max_position_embeddings,
            qk_norm: fam.qk_norm,
            qkv_bias: fam.qkv_bias,
            clip_qkv: fam.clip_qkv,
            tie_word_embeddings,
            bos_token_id,
            eos_token_ids,
            source_hash: fnv1a64_hex(text.as_bytes()),
            expert_kinds: Vec::new(),
            gguf_dense_kinds: Vec::new(),
        })
    }

    /// Number of layers with an MoE block.
    pub fn num_sparse_layers(&self) -> usize {
        self.sparse_layers.iter().filter(|&&s| s).count()
    }

    /// Query heads per KV head (grouped-query attention; 1 without it).
    pub fn kv_group(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }
}

/// An `eos_token_id` the model can never produce (outside the vocabulary) would let
/// generation never stop at EOS: refused, naming the field and the file.
pub fn check_eos_in_vocab(ids: &[u32], vocab_size: usize, path: &Path) -> Result<()> {
    match ids.iter().find(|&&id| id as usize >= vocab_size) {
        Some(&bad) => Err(Error::field(
            path,
            "eos_token_id",
            format!(
                "{bad} is outside the vocabulary (vocab_size {vocab_size}): generation could never stop at it"
            ),
        )),
        None => Ok(()),
    }
}

/// 64-bit FNV-1a of `bytes`, as 16 lowercase hex digits.
pub fn fnv1a64_hex(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_known_values() {
        assert_eq!(fnv1a64_hex(b""), "cbf29ce484222325");
        assert_eq!(fnv1a64_hex(b"a"), "af63dc4c8601ec8c");
    }
}

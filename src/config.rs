//! `config.json` and `generation_config.json`, parsed once into typed structs.
//!
//! The rule here is that a field the published checkpoints carry is *required*: the
//! transformers config classes have defaults that differ from the real models (OlmoeConfig's
//! `intermediate_size` is 2048 where OLMoE-1B-7B uses 1024, Qwen2MoeConfig's `rope_theta` is
//! 10000 where Qwen1.5-MoE uses 1e6), so silently falling back to a default would produce a
//! model that loads and then computes garbage. Only fields that real checkpoints legitimately
//! omit (e.g. `num_key_value_heads` in older configs, `mlp_only_layers`) get a default, and
//! that default is the one with the same meaning as the field's absence in transformers.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The model families this runtime implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `model_type: "olmoe"` (OlmoeForCausalLM).
    Olmoe,
    /// `model_type: "qwen2_moe"` (Qwen2MoeForCausalLM).
    Qwen2Moe,
}

impl Arch {
    pub const SUPPORTED: &'static [&'static str] = &["olmoe", "qwen2_moe"];

    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Olmoe => "olmoe",
            Arch::Qwen2Moe => "qwen2_moe",
        }
    }

    fn from_model_type(s: &str) -> Option<Self> {
        match s {
            "olmoe" => Some(Arch::Olmoe),
            "qwen2_moe" => Some(Arch::Qwen2Moe),
            _ => None,
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.model_type())
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
    pub num_experts: usize,
    /// `num_experts_per_tok`.
    pub top_k: usize,
    /// Routed expert intermediate size. OLMoE: `intermediate_size`; Qwen2-MoE: `moe_intermediate_size`.
    pub moe_intermediate: usize,
    /// Qwen2-MoE: `shared_expert_intermediate_size` (always present for qwen2_moe). OLMoE: None.
    pub shared_expert_intermediate: Option<usize>,
    /// Intermediate size of a dense (non-MoE) MLP layer. Qwen2-MoE: `intermediate_size`
    /// (used by `mlp_only_layers` / layers off the sparse step). OLMoE: same as `moe_intermediate`.
    pub dense_intermediate: usize,
    /// Per layer: true = MoE block, false = dense MLP.
    pub sparse_layers: Vec<bool>,
    /// Renormalise the top-k routing weights to sum to 1 (false when absent).
    pub norm_topk_prob: bool,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: usize,
    /// RMSNorm on the full q and k projections (OLMoE).
    pub qk_norm: bool,
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
}

impl ModelConfig {
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

        let num_experts = f.req_pos("num_experts")?;
        let top_k = f.req_pos("num_experts_per_tok")?;
        if top_k > num_experts {
            return Err(Error::field(
                path,
                "num_experts_per_tok",
                format!("{top_k} is larger than num_experts {num_experts}"),
            ));
        }
        let norm_topk_prob = f.opt_bool("norm_topk_prob")?.unwrap_or(false);
        let rms_norm_eps = f.req_f64("rms_norm_eps")?;
        if !(rms_norm_eps > 0.0 && rms_norm_eps.is_finite()) {
            return Err(Error::field(
                path,
                "rms_norm_eps",
                format!("{rms_norm_eps} must be a positive finite number"),
            ));
        }
        let max_position_embeddings = f.req_pos("max_position_embeddings")?;
        let tie_word_embeddings = f.req_bool("tie_word_embeddings")?;
        let rope_theta = parse_rope(&f)?;
        let bos_token_id = f.opt_u32("bos_token_id")?;
        let eos_token_ids = f.id_list("eos_token_id")?;
        check_eos_in_vocab(&eos_token_ids, vocab_size, path)?;

        let (moe_intermediate, shared_expert_intermediate, dense_intermediate, sparse_layers);
        let (qk_norm, qkv_bias, clip_qkv);
        match arch {
            Arch::Olmoe => {
                moe_intermediate = f.req_pos("intermediate_size")?;
                shared_expert_intermediate = None;
                dense_intermediate = moe_intermediate;
                sparse_layers = vec![true; num_layers];
                qk_norm = true;
                // OLMoE's attention_bias would put a bias on q, k, v *and* o; the published
                // models have none and we implement none.
                if f.opt_bool("attention_bias")? == Some(true) {
                    return Err(Error::field(
                        path,
                        "attention_bias",
                        "true is not supported for olmoe",
                    ));
                }
                qkv_bias = false;
                clip_qkv = match f.opt_f64("clip_qkv")? {
                    None => None,
                    Some(c) if c > 0.0 && c.is_finite() => Some(c as f32),
                    Some(c) => {
                        return Err(Error::field(
                            path,
                            "clip_qkv",
                            format!("{c} must be positive or null"),
                        ))
                    }
                };
            }
            Arch::Qwen2Moe => {
                moe_intermediate = f.req_pos("moe_intermediate_size")?;
                shared_expert_intermediate = Some(f.req_pos("shared_expert_intermediate_size")?);
                dense_intermediate = f.req_pos("intermediate_size")?;
                if f.opt_bool("use_sliding_window")? == Some(true) {
                    return Err(Error::field(
                        path,
                        "use_sliding_window",
                        "sliding-window attention is not supported",
                    ));
                }
                let step = f.req_pos("decoder_sparse_step")?;
                // Absent in the published Qwen1.5-MoE config; absence means "no dense-only layers".
                let mlp_only = f.opt_usize_list("mlp_only_layers")?.unwrap_or_default();
                if let Some(&bad) = mlp_only.iter().find(|&&l| l >= num_layers) {
                    return Err(Error::field(
                        path,
                        "mlp_only_layers",
                        format!("layer {bad} is out of range (num_hidden_layers = {num_layers})"),
                    ));
                }
                // Same rule as Qwen2MoeDecoderLayer.
                sparse_layers = (0..num_layers)
                    .map(|l| !mlp_only.contains(&l) && (l + 1) % step == 0)
                    .collect();
                // transformers 5 states the always-on q/k/v bias as `qkv_bias` (default true);
                // the published config predates the field, and its absence means true.
                qkv_bias = f.opt_bool("qkv_bias")?.unwrap_or(true);
                // transformers 5 writes per-layer attention types; only full attention exists here.
                if let Some(types) = f.get("layer_types") {
                    let Value::Array(items) = types else {
                        return Err(f.wrong("layer_types", "a list of strings", types));
                    };
                    if let Some(bad) = items.iter().find(|t| t.as_str() != Some("full_attention")) {
                        return Err(Error::field(
                            path,
                            "layer_types",
                            format!("{bad} is not supported (only \"full_attention\")"),
                        ));
                    }
                }
                qk_norm = false;
                clip_qkv = None;
            }
        }

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
            moe_intermediate,
            shared_expert_intermediate,
            dense_intermediate,
            sparse_layers,
            norm_topk_prob,
            rope_theta,
            rms_norm_eps,
            max_position_embeddings,
            qk_norm,
            qkv_bias,
            clip_qkv,
            tie_word_embeddings,
            bos_token_id,
            eos_token_ids,
            source_hash: fnv1a64_hex(text.as_bytes()),
        })
    }

    /// Number of layers with an MoE block.
    pub fn num_sparse_layers(&self) -> usize {
        self.sparse_layers.iter().filter(|&&s| s).count()
    }
}

/// RoPE base, from either the classic top-level `rope_theta` (what the published checkpoints
/// carry) or transformers 5's `rope_parameters` object ({"rope_theta": .., "rope_type": "default"}).
/// Any scaling scheme other than plain default RoPE is rejected, since it is not implemented.
fn parse_rope(f: &Fields) -> Result<f64> {
    // transformers 4 writes `rope_scaling: null`; a non-null value means a scaling scheme,
    // unless it only restates default RoPE (transformers 5 aliases rope_scaling to rope_parameters).
    let mut theta_from_objects = None;
    for key in ["rope_scaling", "rope_parameters"] {
        match f.obj.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                // transformers 5 may nest the parameters by layer type; all layers here use
                // full attention.
                let (key, m) = match m.get("full_attention") {
                    Some(Value::Object(inner)) => (format!("{key}.full_attention"), inner),
                    _ => (key.to_string(), m),
                };
                let key = key.as_str();
                check_default_rope(f, key, m)?;
                if let Some(v) = m.get("rope_theta") {
                    let field = format!("{key}.rope_theta");
                    let t = v.as_f64().ok_or_else(|| {
                        Error::field(f.path, &field, format!("expected a number, found {v}"))
                    })?;
                    if let Some((prev_field, prev)) = &theta_from_objects {
                        if *prev != t {
                            return Err(Error::field(
                                f.path,
                                &field,
                                format!("{t} disagrees with {prev_field} = {prev}"),
                            ));
                        }
                    }
                    theta_from_objects = Some((field, t));
                }
            }
            Some(v) => {
                return Err(Error::field(
                    f.path,
                    key,
                    format!("expected an object or null, found {v}"),
                ))
            }
        }
    }
    if let Some(p) = f.opt_f64("partial_rotary_factor")? {
        if p != 1.0 {
            return Err(Error::field(
                f.path,
                "partial_rotary_factor",
                format!("{p} is not supported (only 1.0)"),
            ));
        }
    }
    let top = f.opt_f64("rope_theta")?;
    let theta = match (top, theta_from_objects) {
        (Some(t), Some((field, o))) if t != o => {
            return Err(Error::field(
                f.path,
                "rope_theta",
                format!("{t} disagrees with {field} = {o}"),
            ));
        }
        (Some(t), _) => t,
        (None, Some((_, o))) => o,
        (None, None) => {
            return Err(Error::field(
                f.path,
                "rope_theta",
                "missing (neither rope_theta nor rope_parameters.rope_theta is present)",
            ));
        }
    };
    if !(theta > 0.0 && theta.is_finite()) {
        return Err(Error::field(
            f.path,
            "rope_theta",
            format!("{theta} must be a positive finite number"),
        ));
    }
    Ok(theta)
}

fn check_default_rope(f: &Fields, key: &str, m: &Map<String, Value>) -> Result<()> {
    // Older configs spell it "type", newer ones "rope_type".
    for tkey in ["rope_type", "type"] {
        match m.get(tkey) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "default" => {}
            Some(v) => {
                return Err(Error::field(
                    f.path,
                    format!("{key}.{tkey}"),
                    format!("RoPE type {v} is not supported (only \"default\")"),
                ));
            }
        }
    }
    if let Some(v) = m.get("partial_rotary_factor") {
        if v.as_f64() != Some(1.0) && !v.is_null() {
            return Err(Error::field(
                f.path,
                format!("{key}.partial_rotary_factor"),
                format!("{v} is not supported (only 1.0)"),
            ));
        }
    }
    Ok(())
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

/// Settings from `generation_config.json` (all optional in the file).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub do_sample: Option<bool>,
}

impl GenerationConfig {
    /// Reads `dir/generation_config.json`; a missing file is `Ok(None)`.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join("generation_config.json");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(&path, e)),
        };
        Self::from_json(&text, &path).map(Some)
    }

    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| Error::bad_file(path, format!("invalid JSON: {e}")))?;
        let Value::Object(obj) = value else {
            return Err(Error::bad_file(path, "expected a JSON object at top level"));
        };
        let f = Fields { obj: &obj, path };
        let temperature = f.opt_f64("temperature")?.map(|t| t as f32);
        if let Some(t) = temperature {
            if !(t >= 0.0 && t.is_finite()) {
                return Err(Error::field(
                    path,
                    "temperature",
                    format!("{t} must be a non-negative finite number"),
                ));
            }
        }
        let top_p = f.opt_f64("top_p")?.map(|p| p as f32);
        if let Some(p) = top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(Error::field(
                    path,
                    "top_p",
                    format!("{p} must be in (0, 1]"),
                ));
            }
        }
        Ok(GenerationConfig {
            eos_token_ids: f.id_list("eos_token_id")?,
            bos_token_id: f.opt_u32("bos_token_id")?,
            pad_token_id: f.opt_u32("pad_token_id")?,
            temperature,
            // top_k = 0 means "disabled" in transformers; keep it as given.
            top_k: f.opt_usize("top_k")?,
            top_p,
            do_sample: f.opt_bool("do_sample")?,
        })
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

/// Typed access to the fields of one JSON object, with errors naming file and field.
/// A JSON `null` is treated the same as an absent field.
struct Fields<'a> {
    obj: &'a Map<String, Value>,
    path: &'a Path,
}

impl<'a> Fields<'a> {
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn missing(&self, key: &str) -> Error {
        Error::field(self.path, key, "missing (required)")
    }

    fn wrong(&self, key: &str, want: &str, v: &Value) -> Error {
        Error::field(self.path, key, format!("expected {want}, found {v}"))
    }

    fn req_str(&self, key: &str) -> Result<&'a str> {
        self.opt_str(key)?.ok_or_else(|| self.missing(key))
    }

    fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.wrong(key, "a string", v)),
        }
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => as_usize(v)
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a non-negative integer", v)),
        }
    }

    /// A dimension: present, > 0, and within the bound `crate::limits` sets for it (so
    /// nothing sized by it can be absurd).
    fn opt_pos(&self, key: &str) -> Result<Option<usize>> {
        match self.opt_usize(key)? {
            Some(0) => Err(Error::field(self.path, key, "must be greater than 0")),
            Some(v) => match crate::limits::max_of(key) {
                Some(max) if v > max => Err(Error::field(
                    self.path,
                    key,
                    format!("{v} is larger than wgmoe supports ({max}; published models are far below it)"),
                )),
                _ => Ok(Some(v)),
            },
            None => Ok(None),
        }
    }

    fn req_pos(&self, key: &str) -> Result<usize> {
        self.opt_pos(key)?.ok_or_else(|| self.missing(key))
    }

    fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => as_u32(v)
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a token id (u32)", v)),
        }
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a number", v)),
        }
    }

    fn req_f64(&self, key: &str) -> Result<f64> {
        self.opt_f64(key)?.ok_or_else(|| self.missing(key))
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong(key, "true or false", v)),
        }
    }

    fn req_bool(&self, key: &str) -> Result<bool> {
        self.opt_bool(key)?.ok_or_else(|| self.missing(key))
    }

    /// A token id given as an int or a list of ints; empty when absent.
    fn id_list(&self, key: &str) -> Result<Vec<u32>> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| as_u32(v).ok_or_else(|| self.wrong(key, "a list of token ids", v)))
                .collect(),
            Some(v) => as_u32(v)
                .map(|id| vec![id])
                .ok_or_else(|| self.wrong(key, "a token id or a list of them", v)),
        }
    }

    fn opt_usize_list(&self, key: &str) -> Result<Option<Vec<usize>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    as_usize(v).ok_or_else(|| self.wrong(key, "a list of non-negative integers", v))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(v) => Err(self.wrong(key, "a list of non-negative integers", v)),
        }
    }
}

/// Accepts integers, and floats with an integral value (some tools write `2048.0`).
fn as_usize(v: &Value) -> Option<usize> {
    if let Some(u) = v.as_u64() {
        return usize::try_from(u).ok();
    }
    let f = v.as_f64()?;
    if f >= 0.0 && f.fract() == 0.0 && f <= u32::MAX as f64 {
        Some(f as usize)
    } else {
        None
    }
}

fn as_u32(v: &Value) -> Option<u32> {
    as_usize(v).and_then(|u| u32::try_from(u).ok())
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

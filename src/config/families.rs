//! What each family's modeling code does differently, read from its config fields (the
//! transformers modeling files are the reference), and what is refused because wgmoe does
//! not implement it (naming the field, never ignoring it).

use serde_json::Value;

use super::fields::Fields;
use super::{Arch, QkNorm};
use crate::error::{Error, Result};

/// The family-dependent fields of a `ModelConfig`.
pub(super) struct Family {
    pub moe_intermediate: usize,
    pub shared_expert_intermediate: Option<usize>,
    pub dense_intermediate: usize,
    pub sparse_layers: Vec<bool>,
    pub norm_topk_prob: bool,
    pub qk_norm: QkNorm,
    pub qkv_bias: bool,
    pub clip_qkv: Option<f32>,
}

/// Routed experts per MoE layer. Real Qwen checkpoints write `num_experts`, transformers 5
/// writes `num_local_experts` (Mixtral's own name): both are accepted, and must agree.
pub(super) fn num_experts(f: &Fields, arch: Arch) -> Result<usize> {
    let (a, b) = (f.opt_pos("num_experts")?, f.opt_pos("num_local_experts")?);
    match (a, b) {
        (Some(x), Some(y)) if x != y => Err(Error::field(
            f.path,
            "num_local_experts",
            format!("{y} disagrees with num_experts = {x}"),
        )),
        (Some(x), _) | (None, Some(x)) => Ok(x),
        (None, None) => Err(Error::field(
            f.path,
            match arch {
                Arch::Mixtral => "num_local_experts",
                _ => "num_experts",
            },
            "missing (required)",
        )),
    }
}

/// Layers with an MoE block, as Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer decide:
/// `layer_idx not in mlp_only_layers and (layer_idx + 1) % decoder_sparse_step == 0`.
fn qwen_sparse_layers(f: &Fields, num_layers: usize) -> Result<Vec<bool>> {
    let step = f.req_pos("decoder_sparse_step")?;
    // Absent in the published Qwen1.5-MoE config; absence means "no dense-only layers".
    let mlp_only = f.opt_usize_list("mlp_only_layers")?.unwrap_or_default();
    if let Some(&bad) = mlp_only.iter().find(|&&l| l >= num_layers) {
        return Err(Error::field(
            f.path,
            "mlp_only_layers",
            format!("layer {bad} is out of range (num_hidden_layers = {num_layers})"),
        ));
    }
    Ok((0..num_layers)
        .map(|l| !mlp_only.contains(&l) && (l + 1) % step == 0)
        .collect())
}

/// Only full attention over the whole context is implemented: a sliding window that would
/// apply is refused, naming the field (a window that is set but switched off by
/// `use_sliding_window: false`, as in Qwen1.5-MoE's config, does not apply).
fn refuse_sliding_window(f: &Fields, arch: Arch) -> Result<()> {
    let use_window = f.opt_bool("use_sliding_window")?;
    if use_window == Some(true) {
        return Err(Error::field(
            f.path,
            "use_sliding_window",
            "sliding-window attention is not supported",
        ));
    }
    // Mixtral has no switch: a non-null window applies.
    if arch == Arch::Mixtral {
        if let Some(w) = f.get("sliding_window") {
            return Err(Error::field(
                f.path,
                "sliding_window",
                format!("{w}: sliding-window attention is not supported (the published Mixtral configs set null)"),
            ));
        }
    }
    // transformers 5 writes per-layer attention types; only full attention exists here.
    if let Some(types) = f.get("layer_types") {
        let Value::Array(items) = types else {
            return Err(f.wrong("layer_types", "a list of strings", types));
        };
        if let Some(bad) = items.iter().find(|t| t.as_str() != Some("full_attention")) {
            return Err(Error::field(
                f.path,
                "layer_types",
                format!("{bad} is not supported (only \"full_attention\")"),
            ));
        }
    }
    Ok(())
}

/// A bias on q, k, v *and* o (`attention_bias`): wgmoe implements biases on q, k, v only.
fn refuse_attention_bias(f: &Fields, arch: Arch) -> Result<()> {
    if f.opt_bool("attention_bias")? == Some(true) {
        return Err(Error::field(
            f.path,
            "attention_bias",
            format!("true is not supported for {arch} (a bias on the output projection)"),
        ));
    }
    Ok(())
}

pub(super) fn parse(
    f: &Fields,
    arch: Arch,
    num_layers: usize,
    norm_topk_prob: bool,
) -> Result<Family> {
    Ok(match arch {
        Arch::Olmoe => {
            let moe_intermediate = f.req_pos("intermediate_size")?;
            refuse_attention_bias(f, arch)?;
            let clip_qkv = match f.opt_f64("clip_qkv")? {
                None => None,
                Some(c) if c > 0.0 && c.is_finite() => Some(c as f32),
                Some(c) => {
                    return Err(Error::field(
                        f.path,
                        "clip_qkv",
                        format!("{c} must be positive or null"),
                    ))
                }
            };
            Family {
                moe_intermediate,
                shared_expert_intermediate: None,
                dense_intermediate: moe_intermediate,
                sparse_layers: vec![true; num_layers],
                norm_topk_prob,
                qk_norm: QkNorm::Projection,
                qkv_bias: false,
                clip_qkv,
            }
        }
        Arch::Qwen2Moe => {
            refuse_sliding_window(f, arch)?;
            Family {
                moe_intermediate: f.req_pos("moe_intermediate_size")?,
                shared_expert_intermediate: Some(f.req_pos("shared_expert_intermediate_size")?),
                dense_intermediate: f.req_pos("intermediate_size")?,
                sparse_layers: qwen_sparse_layers(f, num_layers)?,
                norm_topk_prob,
                qk_norm: QkNorm::None,
                // transformers 5 states the always-on q/k/v bias as `qkv_bias` (default
                // true); the published config predates the field, and its absence means true.
                qkv_bias: f.opt_bool("qkv_bias")?.unwrap_or(true),
                clip_qkv: None,
            }
        }
        Arch::Qwen3Moe => {
            refuse_sliding_window(f, arch)?;
            refuse_attention_bias(f, arch)?;
            Family {
                moe_intermediate: f.req_pos("moe_intermediate_size")?,
                // Qwen3-MoE has no shared expert.
                shared_expert_intermediate: None,
                dense_intermediate: f.req_pos("intermediate_size")?,
                sparse_layers: qwen_sparse_layers(f, num_layers)?,
                norm_topk_prob,
                qk_norm: QkNorm::PerHead,
                qkv_bias: false,
                clip_qkv: None,
            }
        }
        Arch::Mixtral => {
            refuse_sliding_window(f, arch)?;
            // MixtralSparseMoeBlock: softmax over all experts, top-k, then always
            // `routing_weights /= routing_weights.sum(dim=-1, keepdim=True)`.
            if f.opt_bool("norm_topk_prob")? == Some(false) {
                return Err(Error::field(
                    f.path,
                    "norm_topk_prob",
                    "false is not what Mixtral computes (its top-k weights are always renormalised)",
                ));
            }
            let i = f.req_pos("intermediate_size")?;
            Family {
                moe_intermediate: i,
                shared_expert_intermediate: None,
                dense_intermediate: i,
                sparse_layers: vec![true; num_layers],
                norm_topk_prob: true,
                qk_norm: QkNorm::None,
                qkv_bias: false,
                clip_qkv: None,
            }
        }
    })
}

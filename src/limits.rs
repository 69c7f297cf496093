//! Bounds on the sizes a config.json can claim.
//!
//! Two lines of defence, both before anything proportional to a count is allocated or
//! iterated:
//! - `config.rs` refuses dimensions beyond the `MAX_*` bounds below (generous: every
//!   published model is far inside them), so parsing a config never allocates more than a
//!   few kilobytes whatever it says;
//! - [`check_checkpoint`] compares the counts with the checkpoint's real tensors (layers
//!   from the `model.layers.N.` prefixes, experts per layer from the expert tensors, vocab
//!   and hidden size from the embedding's shape), reading only the safetensors headers.
//!   After it and `check_tensors` pass, every weight size is bounded by the file sizes;
//!   what remains (KV cache and workspace, proportional to the context) is computed with
//!   checked arithmetic by the callers.

use std::collections::{BTreeMap, BTreeSet};

use crate::checkpoint::{Checkpoint, ExpertLayout};
use crate::config::ModelConfig;
use crate::error::{Error, Result};

pub const MAX_LAYERS: usize = 1 << 14;
pub const MAX_EXPERTS: usize = 1 << 16;
pub const MAX_VOCAB: usize = 1 << 24;
pub const MAX_HIDDEN: usize = 1 << 18;
pub const MAX_HEADS: usize = 1 << 14;
pub const MAX_HEAD_DIM: usize = 1 << 14;
pub const MAX_INTERMEDIATE: usize = 1 << 22;

/// The bound `config.rs` applies to a dimension field, if any.
pub fn max_of(field: &str) -> Option<usize> {
    Some(match field {
        "num_hidden_layers" => MAX_LAYERS,
        "num_experts" | "num_experts_per_tok" => MAX_EXPERTS,
        "vocab_size" => MAX_VOCAB,
        "hidden_size" => MAX_HIDDEN,
        "num_attention_heads" | "num_key_value_heads" => MAX_HEADS,
        "head_dim" => MAX_HEAD_DIM,
        "intermediate_size" | "moe_intermediate_size" | "shared_expert_intermediate_size" => {
            MAX_INTERMEDIATE
        }
        _ => return None,
    })
}

/// `model.layers.{N}.rest` -> (N, rest).
fn layer_of(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("model.layers.")?;
    let (n, rest) = rest.split_once('.')?;
    Some((n.parse().ok()?, rest))
}

/// Check the config's counts against the checkpoint's tensors: `num_hidden_layers`
/// against the layers the checkpoint holds, `num_experts` against each MoE layer's experts,
/// `vocab_size` and `hidden_size` against `model.embed_tokens.weight`. Reads headers only;
/// the work is proportional to the number of tensors in the files, never to a count in
/// the config.
pub fn check_checkpoint(cfg: &ModelConfig, ckpt: &Checkpoint) -> Result<()> {
    let config = ckpt.dir().join("config.json");
    // Per layer index: the expert ids of the hub's per-expert tensor names.
    let mut layers: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    for name in ckpt.names() {
        if let Some((l, rest)) = layer_of(name) {
            let experts = layers.entry(l).or_default();
            if let Some(e) = rest
                .strip_prefix("mlp.experts.")
                .and_then(|r| r.split_once('.'))
                .and_then(|(e, _)| e.parse::<usize>().ok())
            {
                experts.insert(e);
            }
        }
    }
    let held = layers.len();
    if cfg.num_layers > held {
        let range = match (layers.keys().next(), layers.keys().next_back()) {
            (Some(a), Some(b)) => format!(" (model.layers.{a} .. model.layers.{b})"),
            _ => String::new(),
        };
        return Err(Error::field(
            &config,
            "num_hidden_layers",
            format!(
                "{} layers, but the checkpoint holds tensors of {held} layers{range}",
                cfg.num_layers
            ),
        ));
    }
    for l in (0..cfg.num_layers).filter(|&l| cfg.sparse_layers[l]) {
        let Some(per_expert) = layers.get(&l) else {
            return Err(Error::field(
                &config,
                "num_hidden_layers",
                format!(
                    "{} layers, but the checkpoint has no tensors of layer {l} (model.layers.{l}.*)",
                    cfg.num_layers
                ),
            ));
        };
        let held = if crate::convert::is_converted(ckpt) {
            first_dim(ckpt, &crate::convert::experts_tensor(l))
        } else {
            match ckpt.expert_layout(l) {
                Ok(ExpertLayout::Fused) => {
                    first_dim(ckpt, &format!("model.layers.{l}.mlp.experts.gate_up_proj"))
                }
                Ok(ExpertLayout::PerExpert) => Some(per_expert.len()),
                // Missing or ambiguous expert tensors: check_tensors names them.
                Err(_) => None,
            }
        };
        if let Some(held) = held {
            if cfg.num_experts > held {
                return Err(Error::field(
                    &config,
                    "num_experts",
                    format!(
                        "{} experts, but layer {l} of the checkpoint holds {held}",
                        cfg.num_experts
                    ),
                ));
            }
        }
    }
    if let Ok(info) = ckpt.info("model.embed_tokens.weight") {
        if let [rows, cols] = info.shape[..] {
            for (field, want, got, what) in [
                ("vocab_size", cfg.vocab_size, rows, "rows"),
                ("hidden_size", cfg.hidden_size, cols, "columns"),
            ] {
                if want != got {
                    return Err(Error::field(
                        &config,
                        field,
                        format!(
                            "{want}, but model.embed_tokens.weight in {} has {got} {what}",
                            info.file.display()
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

fn first_dim(ckpt: &Checkpoint, name: &str) -> Option<usize> {
    ckpt.shape_of(name).and_then(|s| s.first().copied())
}

/// Refuse a context (KV-cache positions) and prefill chunk whose KV cache and workspace
/// would not even be countable: an upper bound of every term of
/// `model::forward::workspace_bytes`, in u128, must stay below 2^62 bytes, so that function's
/// arithmetic cannot overflow. (Whether the bytes fit the adapter is admission's job.)
pub fn check_context(cfg: &ModelConfig, max_context: usize, chunk: usize) -> Result<()> {
    let c = max_context.max(1) as u128;
    let t = (chunk as u128).clamp(1, c);
    let (h, v, k, e) = (
        cfg.hidden_size as u128,
        cfg.vocab_size as u128,
        cfg.top_k as u128,
        cfg.num_experts as u128,
    );
    let hd = cfg.head_dim as u128;
    let q = cfg.num_heads as u128 * hd;
    let kv = cfg.num_kv_heads as u128 * hd;
    let layers = cfg.num_layers as u128;
    let inter = (cfg.moe_intermediate as u128)
        .max(cfg.shared_expert_intermediate.unwrap_or(0) as u128)
        .max(cfg.dense_intermediate as u128);
    let per_token = 4 * h
        + 3 * q
        + 2 * kv
        + cfg.num_heads as u128 * c
        + e
        + 2 * k
        + 2
        + k * (inter + h)
        + inter
        + v;
    // Expert-major prefill buffers: per (token, top-k) pair an input and an output row.
    let sorted = t * k * (2 * h + 2 * inter + 1024) + e;
    let floats = t * per_token + c * hd + layers * 2 * c * kv + sorted + layers * (e + 4096);
    let bytes = floats * 4 + (1 << 22);
    if bytes >= 1 << 62 {
        return Err(Error::DoesNotFit(format!(
            "a context of {max_context} positions (prefill chunk {chunk}) needs about {} bytes of KV cache and workspace (more than 2^62)",
            bytes
        )));
    }
    Ok(())
}

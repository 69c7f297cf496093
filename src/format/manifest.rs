//! The manifest of a model: every tensor its config implies, with its shape, and the
//! check (reading no data) that a checkpoint holds each with that shape and a readable
//! dtype, the same checks loading and `quantize` make before they read anything.

use std::collections::{BTreeMap, BTreeSet};

use crate::blocks::quant::Q4SlotLayout;
use crate::config::{Arch, ModelConfig, QkNorm};
use crate::error::{Error, Result};
use crate::format::checkpoint::{Checkpoint, ExpertLayout, ExpertProj};
use crate::format::identity::{
    dense_storage, experts_tensor, ggml_q8_row_bytes, is_converted, is_dense_weight, DenseStorage,
};

/// Every non-routed tensor the model needs, with its shape (routed experts excluded: their
/// layout varies and is checked by `check_tensors`).
pub fn expected_tensors(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    let q_dim = cfg.num_heads * cfg.head_dim;
    let kv_dim = cfg.num_kv_heads * cfg.head_dim;
    let mut t = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
    for l in 0..cfg.num_layers {
        let p = format!("model.layers.{l}");
        t.push((format!("{p}.input_layernorm.weight"), vec![h]));
        t.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        t.push((format!("{p}.self_attn.q_proj.weight"), vec![q_dim, h]));
        t.push((format!("{p}.self_attn.k_proj.weight"), vec![kv_dim, h]));
        t.push((format!("{p}.self_attn.v_proj.weight"), vec![kv_dim, h]));
        t.push((format!("{p}.self_attn.o_proj.weight"), vec![h, q_dim]));
        if cfg.qkv_bias {
            t.push((format!("{p}.self_attn.q_proj.bias"), vec![q_dim]));
            t.push((format!("{p}.self_attn.k_proj.bias"), vec![kv_dim]));
            t.push((format!("{p}.self_attn.v_proj.bias"), vec![kv_dim]));
        }
        match cfg.qk_norm {
            QkNorm::None => {}
            QkNorm::Projection => {
                t.push((format!("{p}.self_attn.q_norm.weight"), vec![q_dim]));
                t.push((format!("{p}.self_attn.k_norm.weight"), vec![kv_dim]));
            }
            QkNorm::PerHead => {
                t.push((format!("{p}.self_attn.q_norm.weight"), vec![cfg.head_dim]));
                t.push((format!("{p}.self_attn.k_norm.weight"), vec![cfg.head_dim]));
            }
        }
        if cfg.sparse_layers[l] {
            t.push((format!("{p}.mlp.gate.weight"), vec![cfg.num_experts, h]));
            if let (Arch::Qwen2Moe, Some(si)) = (cfg.arch, cfg.shared_expert_intermediate) {
                t.push((
                    format!("{p}.mlp.shared_expert.gate_proj.weight"),
                    vec![si, h],
                ));
                t.push((format!("{p}.mlp.shared_expert.up_proj.weight"), vec![si, h]));
                t.push((
                    format!("{p}.mlp.shared_expert.down_proj.weight"),
                    vec![h, si],
                ));
                t.push((format!("{p}.mlp.shared_expert_gate.weight"), vec![1, h]));
            }
        } else {
            let i = cfg.dense_intermediate;
            t.push((format!("{p}.mlp.gate_proj.weight"), vec![i, h]));
            t.push((format!("{p}.mlp.up_proj.weight"), vec![i, h]));
            t.push((format!("{p}.mlp.down_proj.weight"), vec![h, i]));
        }
    }
    t.push(("model.norm.weight".to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        t.push(("lm_head.weight".to_string(), vec![v, h]));
    }
    t
}

/// Check, without reading any data, that the checkpoint holds every tensor the config
/// implies with the right shape and a readable dtype (the same checks loading makes).
pub fn check_tensors(cfg: &ModelConfig, ckpt: &Checkpoint) -> Result<()> {
    let q8 = dense_storage(ckpt)? == DenseStorage::Q8_0;
    for (name, shape) in expected_tensors(cfg) {
        if name == "lm_head.weight" && cfg.tie_word_embeddings && !ckpt.contains(&name) {
            continue;
        }
        if let (true, true, &[rows, cols]) = (q8, is_dense_weight(&name), &shape[..]) {
            ckpt.raw_u8(&name, &[rows, ggml_q8_row_bytes(cols)])?;
            continue;
        }
        let info = ckpt.info(&name)?;
        if info.shape != shape {
            return Err(Error::BadTensor {
                path: info.file,
                name,
                msg: format!("expected shape {shape:?}, found {:?}", info.shape),
            });
        }
    }
    // A Q8_0 conversion of tied embeddings holds the lm_head's Q8_0 copy.
    if q8 && cfg.tie_word_embeddings {
        let [rows, cols] = [cfg.vocab_size, cfg.hidden_size];
        ckpt.raw_u8("lm_head.weight", &[rows, ggml_q8_row_bytes(cols)])?;
    }
    let (e, h, i) = (cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate);
    for l in (0..cfg.num_layers).filter(|&l| cfg.sparse_layers[l]) {
        if is_converted(ckpt) {
            ckpt.raw_u8(&experts_tensor(l), &[e, Q4SlotLayout::new(h, i).bytes])?;
            continue;
        }
        for ex in 0..e {
            for proj in [ExpertProj::Gate, ExpertProj::Up, ExpertProj::Down] {
                ckpt.check_expert(l, ex, proj, e, h, i)?;
            }
        }
    }
    Ok(())
}

/// The [rows, cols] of a dense weight (`is_dense_weight`) of the model: what a Q8_0
/// conversion stores as ggml blocks of [rows, ggml_q8_row_bytes(cols)] under the same name
/// (`lm_head.weight` also for tied embeddings: the head's Q8_0 copy). None for any other
/// tensor.
pub fn q8_stored_shape(cfg: &ModelConfig, name: &str) -> Option<[usize; 2]> {
    if !is_dense_weight(name) {
        return None;
    }
    if name == "lm_head.weight" {
        return Some([cfg.vocab_size, cfg.hidden_size]);
    }
    expected_tensors(cfg)
        .into_iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, s)| match s[..] {
            [r, c] => Some([r, c]),
            _ => None,
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
    // Per layer index: the expert ids of the hub's per-expert tensor names (OLMoE/Qwen's
    // `mlp.experts.E.*`, Mixtral's `block_sparse_moe.experts.E.*`).
    let mut layers: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    for name in ckpt.names() {
        if let Some((l, rest)) = layer_of(name) {
            let experts = layers.entry(l).or_default();
            if let Some(e) = rest
                .strip_prefix("mlp.experts.")
                .or_else(|| rest.strip_prefix("block_sparse_moe.experts."))
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
        let held = if is_converted(ckpt) {
            first_dim(ckpt, &experts_tensor(l))
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

//! GGUF metadata -> the same [`ModelConfig`] the Hugging Face path builds.
//!
//! Keys are read as llama.cpp reads them for the arch (src/models/{olmoe,qwen2moe,qwen3moe,
//! llama}.cpp, `llama_model::load_hparams`), and what llama.cpp's graph for the arch computes
//! is what the config says: top-k renormalisation is fixed per arch there (qwen3moe and
//! llama always, olmoe and qwen2moe never), so it is here. Every key under `<arch>.` is
//! either used, checked against what wgmoe implements, or refused naming it: a key this
//! module does not know may change the computation, and is never ignored.

use crate::blocks::quant::{Q4Kind, SlotKinds};
use crate::config::{check_eos_in_vocab, fnv1a64_hex, Arch, ModelConfig, QkNorm};
use crate::error::{Error, Result};
use crate::limits;

use super::meta::{MetaValue, Metadata};
use super::model::GgufModel;
use super::names;
use super::types::GgmlType;

/// `general.architecture` values wgmoe runs (llama only with `llama.expert_count`).
pub const SUPPORTED_ARCHS: &[&str] = &["olmoe", "qwen2moe", "qwen3moe", "llama"];

/// The family of a GGUF model, from `general.architecture` (and `llama.expert_count`).
pub fn arch_of(meta: &Metadata) -> Result<(Arch, String)> {
    let name = meta.req_str("general.architecture")?;
    let arch = match name {
        "olmoe" => Arch::Olmoe,
        "qwen2moe" => Arch::Qwen2Moe,
        "qwen3moe" => Arch::Qwen3Moe,
        "llama" => match meta.opt_u64("llama.expert_count")? {
            Some(n) if n > 0 => Arch::Mixtral,
            _ => {
                return Err(meta.error(
                    "llama.expert_count",
                    "missing or 0: a dense llama model; wgmoe runs Mixture-of-Experts models only",
                ))
            }
        },
        other => {
            return Err(meta.error(
                "general.architecture",
                format!(
                    "{other:?} is not supported; supported: {} (llama with llama.expert_count, i.e. Mixtral)",
                    SUPPORTED_ARCHS.join(", ")
                ),
            ))
        }
    };
    Ok((arch, name.to_string()))
}

/// Keys under `<arch>.` this module reads or checks.
const KNOWN_KEYS: &[&str] = &[
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "expert_feed_forward_length",
    "expert_shared_feed_forward_length",
    "expert_count",
    "expert_used_count",
    "expert_shared_count",
    "expert_weights_scale",
    "expert_weights_norm",
    "expert_gating_func",
    "leading_dense_block_count",
    "vocab_size",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "attention.sliding_window",
    "attention.clamp_kqv",
    "rope.freq_base",
    "rope.dimension_count",
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scaling.original_context_length",
    "rope.scaling.finetuned",
];

/// The `ModelConfig` of `model`, from its metadata, checked against its tensors' shapes.
pub fn model_config(model: &GgufModel) -> Result<ModelConfig> {
    if model.names().next().is_none() {
        // llama.cpp's vocabulary files (`--vocab-only`): a tokenizer, not a model.
        return Err(Error::bad_file(
            model.path(),
            "holds no tensors: a vocabulary-only GGUF (tokenizer metadata only) is not a model; give it as `--tokenizer FILE` beside a model",
        ));
    }
    let meta = model.metadata();
    let (arch, a) = arch_of(meta)?;
    let key = |k: &str| format!("{a}.{k}");
    for (k, _) in meta.entries() {
        if let Some(rest) = k.strip_prefix(&format!("{a}.")) {
            if !KNOWN_KEYS.contains(&rest) {
                return Err(meta.error(
                    k,
                    "is not a key wgmoe knows for this architecture (it may change the computation, so it is not ignored)",
                ));
            }
        }
    }
    let dim = |k: &str, max: usize| -> Result<Option<usize>> { uniform_dim(meta, &key(k), max) };
    let req = |k: &str, max: usize| -> Result<usize> {
        dim(k, max)?.ok_or_else(|| meta.missing(&key(k)))
    };

    let hidden_size = req("embedding_length", limits::MAX_HIDDEN)?;
    let num_layers = req("block_count", limits::MAX_LAYERS)?;
    let num_heads = req("attention.head_count", limits::MAX_HEADS)?;
    let num_kv_heads = dim("attention.head_count_kv", limits::MAX_HEADS)?.unwrap_or(num_heads);
    if num_heads % num_kv_heads != 0 {
        return Err(meta.error(
            &key("attention.head_count_kv"),
            format!("{num_kv_heads} does not divide attention.head_count {num_heads}"),
        ));
    }
    let head_dim = match dim("attention.key_length", limits::MAX_HEAD_DIM)? {
        Some(d) => d,
        None if hidden_size % num_heads == 0 => hidden_size / num_heads,
        None => {
            return Err(meta.error(
                &key("attention.head_count"),
                format!("{num_heads} does not divide embedding_length {hidden_size} and no attention.key_length is given"),
            ))
        }
    };
    if let Some(v) = dim("attention.value_length", limits::MAX_HEAD_DIM)? {
        if v != head_dim {
            return Err(meta.error(
                &key("attention.value_length"),
                format!("{v} differs from the key length {head_dim}; wgmoe needs equal key and value heads"),
            ));
        }
    }
    if head_dim % 2 != 0 {
        return Err(meta.error(
            &key("attention.key_length"),
            format!("{head_dim} is odd; RoPE needs an even head dimension"),
        ));
    }
    if let Some(r) = dim("rope.dimension_count", limits::MAX_HEAD_DIM)? {
        if r != head_dim {
            return Err(meta.error(
                &key("rope.dimension_count"),
                format!("{r}: RoPE on part of the head ({head_dim}) is not supported"),
            ));
        }
    }
    check_rope_scaling(meta, &a)?;

    let num_experts = req("expert_count", limits::MAX_EXPERTS)?;
    let top_k = req("expert_used_count", limits::MAX_EXPERTS)?;
    if top_k > num_experts {
        return Err(meta.error(
            &key("expert_used_count"),
            format!("{top_k} is larger than the {num_experts} experts"),
        ));
    }
    let ff = dim("feed_forward_length", limits::MAX_INTERMEDIATE)?;
    let expert_ff = dim("expert_feed_forward_length", limits::MAX_INTERMEDIATE)?;
    let (moe_intermediate, dense_intermediate) = match arch {
        // llama.cpp's olmoe and llama graphs size the experts by feed_forward_length.
        Arch::Olmoe | Arch::Mixtral => {
            let i = ff.ok_or_else(|| meta.missing(&key("feed_forward_length")))?;
            if let Some(e) = expert_ff.filter(|&e| e != i) {
                return Err(meta.error(
                    &key("expert_feed_forward_length"),
                    format!("{e} disagrees with feed_forward_length {i}"),
                ));
            }
            (i, i)
        }
        Arch::Qwen2Moe | Arch::Qwen3Moe => {
            let e = expert_ff.ok_or_else(|| meta.missing(&key("expert_feed_forward_length")))?;
            (e, ff.unwrap_or(e))
        }
    };
    let shared_expert_intermediate = match arch {
        Arch::Qwen2Moe => {
            if let Some(n) = meta.opt_u64(&key("expert_shared_count"))? {
                if n != 1 {
                    return Err(meta.error(
                        &key("expert_shared_count"),
                        format!("{n} shared experts: wgmoe implements one"),
                    ));
                }
            }
            // llama.cpp: n_ff_shexp, else feed_forward_length.
            Some(
                dim(
                    "expert_shared_feed_forward_length",
                    limits::MAX_INTERMEDIATE,
                )?
                .or(ff)
                .ok_or_else(|| meta.missing(&key("expert_shared_feed_forward_length")))?,
            )
        }
        _ => {
            for k in ["expert_shared_feed_forward_length", "expert_shared_count"] {
                if meta.opt_u64(&key(k))?.is_some_and(|n| n > 0) {
                    return Err(meta.error(
                        &key(k),
                        format!("shared experts are not part of {a} models"),
                    ));
                }
            }
            None
        }
    };
    let norm_topk_prob = matches!(arch, Arch::Qwen3Moe | Arch::Mixtral);
    check_moe_keys(meta, &a, norm_topk_prob)?;

    let rms_norm_eps = meta
        .opt_f64(&key("attention.layer_norm_rms_epsilon"))?
        .ok_or_else(|| meta.missing(&key("attention.layer_norm_rms_epsilon")))?;
    if !(rms_norm_eps > 0.0 && rms_norm_eps.is_finite()) {
        return Err(meta.error(
            &key("attention.layer_norm_rms_epsilon"),
            format!("{rms_norm_eps} must be a positive finite number"),
        ));
    }
    // llama.cpp's default when the key is absent.
    let rope_theta = meta.opt_f64(&key("rope.freq_base"))?.unwrap_or(10_000.0);
    if !(rope_theta > 0.0 && rope_theta.is_finite()) {
        return Err(meta.error(
            &key("rope.freq_base"),
            format!("{rope_theta} must be a positive finite number"),
        ));
    }
    let max_position_embeddings =
        meta.opt_u64(&key("context_length"))?
            .filter(|&n| n > 0)
            .ok_or_else(|| meta.missing(&key("context_length")))? as usize;
    if let Some(c) = meta.opt_f64(&key("attention.clamp_kqv"))? {
        return Err(meta.error(
            &key("attention.clamp_kqv"),
            format!("{c}: clamping q/k/v is not what llama.cpp's {a} graph does"),
        ));
    }
    // llama.cpp's graphs for these four archs attend over the whole context: a window in
    // the metadata (Qwen1.5-MoE's converter writes one with use_sliding_window false) is
    // not applied there, and not here.

    let vocab_size = names::vocab_rows(model, hidden_size)?;
    if let Some(v) = meta.opt_u64(&key("vocab_size"))? {
        if v != vocab_size as u64 {
            return Err(meta.error(
                &key("vocab_size"),
                format!("{v} disagrees with token_embd.weight's {vocab_size} rows"),
            ));
        }
    }
    if vocab_size > limits::MAX_VOCAB {
        return Err(meta.error(
            &key("vocab_size"),
            format!(
                "{vocab_size} is larger than wgmoe supports ({})",
                limits::MAX_VOCAB
            ),
        ));
    }

    let bos_token_id = meta.opt_u32("tokenizer.ggml.bos_token_id")?;
    let eos_token_ids = super::tokenizer::eog_ids(meta)?;
    check_eos_in_vocab(&eos_token_ids, vocab_size, meta.path())?;

    let cfg = ModelConfig {
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
        // llama.cpp's graphs for these archs have an MoE block in every layer.
        sparse_layers: vec![true; num_layers],
        norm_topk_prob,
        rope_theta,
        rms_norm_eps,
        max_position_embeddings,
        qk_norm: match arch {
            Arch::Olmoe => QkNorm::Projection,
            Arch::Qwen3Moe => QkNorm::PerHead,
            _ => QkNorm::None,
        },
        qkv_bias: model.contains("blk.0.attn_q.bias"),
        clip_qkv: None,
        tie_word_embeddings: !model.contains(names::OUTPUT),
        bos_token_id,
        eos_token_ids,
        source_hash: fnv1a64_hex(model.shards()[0].kv_bytes()),
        expert_kinds: Vec::new(),
        gguf_dense_kinds: Vec::new(),
    };
    let mut cfg = cfg;
    let tensors = super::source::hf_tensors(model, &cfg)?;
    let ty = |name: &str| tensors.iter().find(|t| t.name == name).map(|t| t.ty);
    // Each layer's experts in their own blocks: gate/up in one kind (the wider of the two
    // where it holds the other exactly, else Q8_0), down in its own.
    cfg.expert_kinds = (0..cfg.num_layers)
        .map(|l| {
            let p = |proj: &str| ty(&format!("model.layers.{l}.mlp.experts.0.{proj}.weight"));
            let (g, u, d) = (
                expert_kind(p("gate_proj")),
                expert_kind(p("up_proj")),
                expert_kind(p("down_proj")),
            );
            SlotKinds {
                gate_up: joint_kind(g, u),
                down: d,
            }
        })
        .collect();
    // The matrices the loader's dense_matrix reads (not the embedding table, whose tied
    // lm_head copy stays Q8_0) stored in a block type the kernels compute as it is.
    let mut kinds: Vec<(String, Q4Kind)> = tensors
        .iter()
        .filter(|t| {
            t.shape.len() == 2
                && (t.name == "lm_head.weight"
                    || [".q_proj.", ".k_proj.", ".v_proj.", ".o_proj."]
                        .iter()
                        .any(|p| t.name.contains(p) && t.name.contains(".self_attn.")))
        })
        .filter_map(|t| native_kind(t.ty).map(|k| (t.name.clone(), k)))
        .collect();
    // Shared experts in their own blocks too: gate and up in one kind (as the routed
    // experts'), down in its own.
    for l in 0..cfg.num_layers {
        let p = format!("model.layers.{l}.mlp.shared_expert");
        let kind = |proj: &str| ty(&format!("{p}.{proj}.weight")).and_then(native_kind);
        let gate_up = match (kind("gate_proj"), kind("up_proj")) {
            (Some(g), Some(u)) => Some(joint_kind(g, u)).filter(|&k| k != Q4Kind::Q8),
            _ => None,
        };
        if let Some(k) = gate_up {
            kinds.push((format!("{p}.gate_proj.weight"), k));
            kinds.push((format!("{p}.up_proj.weight"), k));
        }
        if let Some(k) = kind("down_proj") {
            kinds.push((format!("{p}.down_proj.weight"), k));
        }
    }
    kinds.sort();
    cfg.gguf_dense_kinds = kinds;
    Ok(cfg)
}

/// The kind wgmoe holds a GGUF block type in as it is, where its kernels compute one:
/// Q4_0 as affine INT4, Q4_K/Q5_K/Q6_K and Q5_0/Q5_1 as nibble planes (None: Q8_0, which
/// the Q8_0 kernels read as stored, and the float types).
pub fn native_kind(t: GgmlType) -> Option<Q4Kind> {
    match t {
        GgmlType::Q4_0 => Some(Q4Kind::Affine32),
        GgmlType::Q4_K => Some(Q4Kind::Q4K),
        GgmlType::Q5_K => Some(Q4Kind::Q5K),
        GgmlType::Q6_K => Some(Q4Kind::Q6K),
        GgmlType::Q5_0 | GgmlType::Q5_1 => Some(Q4Kind::Q5A),
        _ => None,
    }
}

/// The kind an expert matrix of type `t` is held in: its own, or Q8_0 (Q8_0 as stored,
/// floats quantised).
fn expert_kind(t: Option<GgmlType>) -> Q4Kind {
    t.and_then(native_kind).unwrap_or(Q4Kind::Q8)
}

/// One kind for gate and up (the fused gate/up kernels read both in one format): theirs
/// where they agree, Q5_K for Q4_K beside Q5_K (it holds Q4_K exactly), Q8_0 otherwise.
fn joint_kind(g: Q4Kind, u: Q4Kind) -> Q4Kind {
    match (g, u) {
        _ if g == u => g,
        (Q4Kind::Q4K, Q4Kind::Q5K) | (Q4Kind::Q5K, Q4Kind::Q4K) => Q4Kind::Q5K,
        _ => Q4Kind::Q8,
    }
}

/// A dimension that llama.cpp accepts as a number or a per-layer array: wgmoe needs the
/// same value in every layer.
fn uniform_dim(meta: &Metadata, key: &str, max: usize) -> Result<Option<usize>> {
    let v = match meta.get(key) {
        None => return Ok(None),
        Some(MetaValue::Array(a)) => {
            let mut vals = a.items.iter().map(|v| v.as_i128());
            let first = vals.next().flatten();
            if first.is_none() || vals.any(|v| v != first) {
                return Err(meta.error(
                    key,
                    "differs between layers (or is not a list of integers); wgmoe needs one value for every layer",
                ));
            }
            first.unwrap_or(0)
        }
        Some(v) => v.as_i128().ok_or_else(|| {
            meta.error(key, format!("expected an integer, found {}", v.type_name()))
        })?,
    };
    if v <= 0 {
        return Err(meta.error(key, "must be greater than 0"));
    }
    if v > max as i128 {
        return Err(meta.error(
            key,
            format!("{v} is larger than wgmoe supports ({max}; published models are far below it)"),
        ));
    }
    Ok(Some(v as usize))
}

fn check_rope_scaling(meta: &Metadata, a: &str) -> Result<()> {
    let tkey = format!("{a}.rope.scaling.type");
    let fkey = format!("{a}.rope.scaling.factor");
    let factor = meta.opt_f64(&fkey)?;
    match meta.opt_str(&tkey)? {
        None | Some("none") => {}
        Some("linear") if factor.is_none_or(|f| f == 1.0) => {}
        Some(t) => {
            return Err(meta.error(
                &tkey,
                format!("RoPE scaling {t:?} is not supported (only none)"),
            ))
        }
    }
    if let Some(f) = factor.filter(|&f| f != 0.0 && f != 1.0) {
        return Err(meta.error(&fkey, format!("{f}: RoPE scaling is not supported")));
    }
    Ok(())
}

/// Router keys whose value must be what wgmoe (and llama.cpp's graph for the arch)
/// computes: softmax gating, no weight scale, no leading dense layers.
fn check_moe_keys(meta: &Metadata, a: &str, norm_topk: bool) -> Result<()> {
    let k = |s: &str| format!("{a}.{s}");
    if let Some(s) = meta.opt_f64(&k("expert_weights_scale"))? {
        if s != 1.0 && s != 0.0 {
            return Err(meta.error(
                &k("expert_weights_scale"),
                format!("{s}: scaled expert weights are not supported"),
            ));
        }
    }
    if let Some(n) = meta.opt_bool(&k("expert_weights_norm"))? {
        if n != norm_topk {
            return Err(meta.error(
                &k("expert_weights_norm"),
                format!("{n} is not what llama.cpp's {a} graph computes (it renormalises the top-k weights: {norm_topk})"),
            ));
        }
    }
    // LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX = 1.
    if let Some(g) = meta.opt_u64(&k("expert_gating_func"))? {
        if g != 1 {
            return Err(meta.error(
                &k("expert_gating_func"),
                format!("{g}: only softmax gating (1) is supported"),
            ));
        }
    }
    if let Some(n) = meta.opt_u64(&k("leading_dense_block_count"))? {
        if n > 0 {
            return Err(meta.error(
                &k("leading_dense_block_count"),
                format!("{n} dense layers before the MoE layers are not part of {a} models"),
            ));
        }
    }
    Ok(())
}

/// An error for a key of the model's metadata (for callers outside this module).
pub fn key_error(model: &GgufModel, key: &str, msg: impl Into<String>) -> Error {
    model.metadata().error(key, msg)
}

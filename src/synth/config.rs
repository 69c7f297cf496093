//! The config.json and generation_config.json of a synthetic model, in the real
//! checkpoints' form.

use serde_json::{json, Value};

use super::shape::{SynthArch, SynthShape};
use super::vocab::specials;
use super::NOTE_UNIFORM_ROUTING;

/// config.json in the published checkpoints' form, marked synthetic.
pub fn config_json(arch: SynthArch, s: &SynthShape, seed: u64) -> Value {
    let sp = specials(arch, s.vocab);
    let mut v = match arch {
        SynthArch::Olmoe1b7b => json!({
            "architectures": ["OlmoeForCausalLM"],
            "attention_bias": false,
            "attention_dropout": 0.0,
            "bos_token_id": null,
            "clip_qkv": null,
            "eos_token_id": sp.eos,
            "hidden_act": "silu",
            "hidden_size": s.hidden,
            "initializer_range": 0.02,
            "intermediate_size": s.expert_intermediate,
            "max_position_embeddings": s.max_position_embeddings,
            "model_type": "olmoe",
            "norm_topk_prob": false,
            "num_attention_heads": s.heads,
            "num_experts": s.experts,
            "num_experts_per_tok": s.top_k,
            "num_hidden_layers": s.layers,
            "num_key_value_heads": s.kv_heads,
            "output_router_logits": false,
            "pad_token_id": sp.pad,
            "rms_norm_eps": 1e-05,
            "rope_scaling": null,
            "rope_theta": 10000.0,
            "router_aux_loss_coef": 0.01,
            "tie_word_embeddings": false,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.43.0.dev0",
            "use_cache": true,
            "vocab_size": s.vocab,
        }),
        SynthArch::Qwen15MoeA27b => json!({
            "architectures": ["Qwen2MoeForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": sp.bos_config,
            "decoder_sparse_step": 1,
            "eos_token_id": sp.eos,
            "hidden_act": "silu",
            "hidden_size": s.hidden,
            "initializer_range": 0.02,
            "intermediate_size": s.dense_intermediate,
            "max_position_embeddings": s.max_position_embeddings,
            "max_window_layers": s.layers.min(21),
            "model_type": "qwen2_moe",
            "moe_intermediate_size": s.expert_intermediate,
            "norm_topk_prob": false,
            "num_attention_heads": s.heads,
            "num_experts": s.experts,
            "num_experts_per_tok": s.top_k,
            "num_hidden_layers": s.layers,
            "num_key_value_heads": s.kv_heads,
            "output_router_logits": false,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.001,
            "shared_expert_intermediate_size": s.shared_expert_intermediate.unwrap_or(5632),
            "sliding_window": 32768,
            "tie_word_embeddings": false,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.40.0.dev0",
            "use_cache": true,
            "use_sliding_window": false,
            "vocab_size": s.vocab,
        }),
        SynthArch::Qwen3Moe30bA3b => json!({
            "architectures": ["Qwen3MoeForCausalLM"],
            "attention_bias": false,
            "attention_dropout": 0.0,
            "bos_token_id": sp.bos_config,
            "decoder_sparse_step": 1,
            "eos_token_id": sp.eos,
            "head_dim": s.head_dim,
            "hidden_act": "silu",
            "hidden_size": s.hidden,
            "initializer_range": 0.02,
            "intermediate_size": s.dense_intermediate,
            "max_position_embeddings": s.max_position_embeddings,
            "max_window_layers": s.layers,
            "mlp_only_layers": [],
            "model_type": "qwen3_moe",
            "moe_intermediate_size": s.expert_intermediate,
            "norm_topk_prob": true,
            "num_attention_heads": s.heads,
            "num_experts": s.experts,
            "num_experts_per_tok": s.top_k,
            "num_hidden_layers": s.layers,
            "num_key_value_heads": s.kv_heads,
            "output_router_logits": false,
            "rms_norm_eps": 1e-06,
            "rope_scaling": null,
            "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.001,
            "sliding_window": null,
            "tie_word_embeddings": false,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.51.0",
            "use_cache": true,
            "use_sliding_window": false,
            "vocab_size": s.vocab,
        }),
        SynthArch::Mixtral8x7b => json!({
            "architectures": ["MixtralForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": sp.bos_config,
            "eos_token_id": sp.eos,
            "hidden_act": "silu",
            "hidden_size": s.hidden,
            "initializer_range": 0.02,
            "intermediate_size": s.expert_intermediate,
            "max_position_embeddings": s.max_position_embeddings,
            "model_type": "mixtral",
            "num_attention_heads": s.heads,
            "num_experts_per_tok": s.top_k,
            "num_hidden_layers": s.layers,
            "num_key_value_heads": s.kv_heads,
            "num_local_experts": s.experts,
            "output_router_logits": false,
            "rms_norm_eps": 1e-05,
            "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.02,
            "sliding_window": null,
            "tie_word_embeddings": false,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.36.0.dev0",
            "use_cache": true,
            "vocab_size": s.vocab,
        }),
    };
    if let Value::Object(m) = &mut v {
        m.insert("wgmoe_synthetic".into(), json!(true));
        m.insert("wgmoe_synthetic_arch".into(), json!(arch.name()));
        m.insert("wgmoe_synthetic_seed".into(), json!(seed));
        m.insert(
            "wgmoe_synthetic_note".into(),
            json!(format!(
                "random weights written by `wgmoe synth`: {NOTE_UNIFORM_ROUTING}"
            )),
        );
    }
    v
}

pub(super) fn generation_config_json(arch: SynthArch, s: &SynthShape) -> Value {
    let sp = specials(arch, s.vocab);
    let mut v = json!({"eos_token_id": sp.eos, "transformers_version": "4.43.0.dev0"});
    if let Some(p) = sp.pad {
        v["pad_token_id"] = json!(p);
    }
    if let Some(b) = sp.bos_config {
        v["bos_token_id"] = json!(b);
    }
    v
}

// ---------------------------------------------------------------------------------------
// Deterministic random values
// ---------------------------------------------------------------------------------------

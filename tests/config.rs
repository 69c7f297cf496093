//! config.json and generation_config.json: the published forms, transformers 5's forms,
//! and every bad value failing with an error naming the file and field. No GPU needed.

mod common;

use std::fs;
use std::path::Path;

use tempfile::TempDir;

use common::st::*;
use wgmoe::config::{Arch, GenerationConfig, ModelConfig, QkNorm};

// The published configs (as on the Hub), trimmed of fields that play no part.
const OLMOE_HUB_CONFIG: &str = r#"{
  "architectures": ["OlmoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "clip_qkv": null, "eos_token_id": 50279, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 1024, "max_position_embeddings": 4096,
  "model_type": "olmoe", "norm_topk_prob": false, "num_attention_heads": 16, "num_experts": 64,
  "num_experts_per_tok": 8, "num_hidden_layers": 16, "num_key_value_heads": 16,
  "output_router_logits": false, "pad_token_id": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "rope_theta": 10000.0, "router_aux_loss_coef": 0.01, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 50304
}"#;

const QWEN_HUB_CONFIG: &str = r#"{
  "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
  "model_type": "qwen2_moe", "num_attention_heads": 16, "num_hidden_layers": 24,
  "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936, "decoder_sparse_step": 1,
  "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4,
  "num_experts": 60, "norm_topk_prob": false, "output_router_logits": false, "router_aux_loss_coef": 0.001
}"#;

// Qwen3-30B-A3B's and Mixtral-8x7B-v0.1's published configs, as committed under models/configs.
const QWEN3_HUB_CONFIG: &str = include_str!("../models/configs/qwen3-30b-a3b.json");
const MIXTRAL_HUB_CONFIG: &str = include_str!("../models/configs/mixtral-8x7b-v0.1.json");

/// `base` with `edit` applied to its JSON object.
fn edited(
    base: &str,
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> String {
    let mut v: serde_json::Value = serde_json::from_str(base).unwrap();
    edit(v.as_object_mut().unwrap());
    v.to_string()
}

fn parse(text: &str) -> wgmoe::Result<ModelConfig> {
    ModelConfig::from_json(text, Path::new("/ckpt/config.json"))
}

// ---------------------------------------------------------------------------------------------
// config.json

#[test]
fn config_olmoe_hub() {
    let c = parse(OLMOE_HUB_CONFIG).unwrap();
    assert_eq!(c.arch, Arch::Olmoe);
    assert_eq!(
        (c.vocab_size, c.hidden_size, c.num_layers),
        (50304, 2048, 16)
    );
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (16, 16, 128));
    assert_eq!(
        (
            c.num_experts,
            c.top_k,
            c.moe_intermediate,
            c.dense_intermediate
        ),
        (64, 8, 1024, 1024)
    );
    assert_eq!(c.shared_expert_intermediate, None);
    assert_eq!(c.sparse_layers, vec![true; 16]);
    assert!(!c.norm_topk_prob);
    assert_eq!(
        (c.rope_theta, c.rms_norm_eps, c.max_position_embeddings),
        (10000.0, 1e-5, 4096)
    );
    assert!(c.qk_norm == QkNorm::Projection && !c.qkv_bias);
    assert_eq!(c.clip_qkv, None);
    assert!(!c.tie_word_embeddings);
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (None, vec![50279])
    );
    assert_eq!(c.source_hash.len(), 16);
    // The hash identifies the exact bytes.
    assert_ne!(
        c.source_hash,
        parse(&format!("{OLMOE_HUB_CONFIG} ")).unwrap().source_hash
    );
}

#[test]
fn config_qwen_hub() {
    let c = parse(QWEN_HUB_CONFIG).unwrap();
    assert_eq!(c.arch, Arch::Qwen2Moe);
    assert_eq!((c.vocab_size, c.num_layers, c.head_dim), (151936, 24, 128));
    assert_eq!((c.num_experts, c.top_k, c.moe_intermediate), (60, 4, 1408));
    assert_eq!(
        (c.shared_expert_intermediate, c.dense_intermediate),
        (Some(5632), 5632)
    );
    assert_eq!(c.sparse_layers, vec![true; 24]);
    assert_eq!((c.rope_theta, c.rms_norm_eps), (1e6, 1e-6));
    assert!(c.qk_norm == QkNorm::None && c.qkv_bias);
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(151643), vec![151643])
    );
}

#[test]
fn config_qwen_sparse_layers_and_options() {
    let text = edited(QWEN_HUB_CONFIG, |m| {
        m.insert("num_hidden_layers".into(), 6.into());
        m.insert("decoder_sparse_step".into(), 2.into());
        m.insert("mlp_only_layers".into(), serde_json::json!([3]));
        m.insert("eos_token_id".into(), serde_json::json!([7, 9]));
        m.insert("head_dim".into(), 64.into());
        m.insert("num_key_value_heads".into(), serde_json::Value::Null);
    });
    let c = parse(&text).unwrap();
    // (l + 1) % 2 == 0 → layers 1, 3, 5; layer 3 is forced dense.
    assert_eq!(
        c.sparse_layers,
        vec![false, true, false, false, false, true]
    );
    assert_eq!(c.num_sparse_layers(), 2);
    assert_eq!(c.eos_token_ids, vec![7, 9]);
    assert_eq!((c.head_dim, c.num_kv_heads), (64, 16));
}

#[test]
fn config_rope_parameters_form_accepted() {
    // What transformers 5 writes: no top-level rope_theta.
    let text = edited(QWEN_HUB_CONFIG, |m| {
        m.remove("rope_theta");
        m.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_theta": 1000000.0, "rope_type": "default"}),
        );
    });
    assert_eq!(parse(&text).unwrap().rope_theta, 1e6);
    // Both forms present and agreeing is fine; disagreeing is an error.
    let both = edited(OLMOE_HUB_CONFIG, |m| {
        m.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_theta": 10000.0, "rope_type": "default"}),
        );
    });
    assert_eq!(parse(&both).unwrap().rope_theta, 10000.0);
    let clash = edited(OLMOE_HUB_CONFIG, |m| {
        m.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_theta": 500.0, "rope_type": "default"}),
        );
    });
    assert_mentions(&err_string(parse(&clash)), &["rope_theta", "500"]);
}

#[test]
fn config_rope_scaling_rejected() {
    let text = edited(OLMOE_HUB_CONFIG, |m| {
        m.insert(
            "rope_scaling".into(),
            serde_json::json!({"type": "linear", "factor": 2.0}),
        );
    });
    assert_mentions(
        &err_string(parse(&text)),
        &["config.json", "rope_scaling.type", "linear"],
    );
    let text = edited(OLMOE_HUB_CONFIG, |m| {
        m.remove("rope_theta");
        m.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_theta": 1e4, "rope_type": "yarn", "factor": 4.0}),
        );
    });
    assert_mentions(
        &err_string(parse(&text)),
        &["rope_parameters.rope_type", "yarn"],
    );
}

#[test]
fn config_missing_rope_theta_is_error() {
    let text = edited(QWEN_HUB_CONFIG, |m| {
        m.remove("rope_theta");
    });
    assert_mentions(
        &err_string(parse(&text)),
        &["config.json", "rope_theta", "missing"],
    );
}

#[test]
fn config_missing_required_fields() {
    for (base, field) in [
        (OLMOE_HUB_CONFIG, "hidden_size"),
        (OLMOE_HUB_CONFIG, "intermediate_size"),
        (OLMOE_HUB_CONFIG, "num_experts"),
        (OLMOE_HUB_CONFIG, "tie_word_embeddings"),
        (QWEN_HUB_CONFIG, "moe_intermediate_size"),
        (QWEN_HUB_CONFIG, "shared_expert_intermediate_size"),
        (QWEN_HUB_CONFIG, "decoder_sparse_step"),
        (QWEN_HUB_CONFIG, "model_type"),
        (QWEN_HUB_CONFIG, "rms_norm_eps"),
        (QWEN3_HUB_CONFIG, "moe_intermediate_size"),
        (QWEN3_HUB_CONFIG, "num_experts"),
        (QWEN3_HUB_CONFIG, "decoder_sparse_step"),
        (MIXTRAL_HUB_CONFIG, "num_local_experts"),
        (MIXTRAL_HUB_CONFIG, "intermediate_size"),
        (MIXTRAL_HUB_CONFIG, "rms_norm_eps"),
    ] {
        let text = edited(base, |m| {
            m.remove(field);
        });
        let msg = err_string(parse(&text));
        assert_mentions(&msg, &["config.json", field, "missing"]);
    }
}

/// OLMoE-1B-7B-0924's published config has no rms_norm_eps: OlmoeConfig's default 1e-5.
#[test]
fn config_olmoe_without_rms_norm_eps() {
    let text = edited(OLMOE_HUB_CONFIG, |m| {
        m.remove("rms_norm_eps");
    });
    assert_eq!(parse(&text).unwrap().rms_norm_eps, 1e-5);
}

#[test]
fn config_qwen3_hub() {
    let c = parse(QWEN3_HUB_CONFIG).unwrap();
    assert_eq!(c.arch, Arch::Qwen3Moe);
    assert_eq!(
        (c.vocab_size, c.hidden_size, c.num_layers),
        (151936, 2048, 48)
    );
    // head_dim is given: 32 heads of 128 are 4096 wide over hidden 2048; GQA groups of 8.
    assert_eq!(
        (c.num_heads, c.num_kv_heads, c.head_dim, c.kv_group()),
        (32, 4, 128, 8)
    );
    assert_eq!((c.num_experts, c.top_k, c.moe_intermediate), (128, 8, 768));
    assert_eq!(
        (c.shared_expert_intermediate, c.dense_intermediate),
        (None, 6144)
    );
    assert!(c.sparse_layers.iter().all(|&s| s));
    assert!(c.qk_norm == QkNorm::PerHead && !c.qkv_bias && c.norm_topk_prob);
    assert_eq!(
        (c.rope_theta, c.rms_norm_eps, c.max_position_embeddings),
        (1e6, 1e-6, 40960)
    );
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(151643), vec![151645])
    );
}

/// transformers 5 writes Qwen3's expert count as `num_local_experts` and RoPE as
/// `rope_parameters`: the same model.
#[test]
fn config_qwen3_transformers5_form() {
    let text = edited(QWEN3_HUB_CONFIG, |m| {
        let n = m.remove("num_experts").unwrap();
        m.insert("num_local_experts".into(), n);
        m.remove("rope_theta");
        m.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_theta": 1000000.0, "rope_type": "default"}),
        );
        m.insert("mlp_only_layers".into(), serde_json::json!([0, 47]));
    });
    let c = parse(&text).unwrap();
    assert_eq!((c.num_experts, c.rope_theta), (128, 1e6));
    assert_eq!(c.num_sparse_layers(), 46);
    assert!(!c.sparse_layers[0] && c.sparse_layers[1] && !c.sparse_layers[47]);
    let text = edited(QWEN3_HUB_CONFIG, |m| {
        m.insert("num_local_experts".into(), 64.into());
    });
    assert_mentions(
        &err_string(parse(&text)),
        &["config.json", "num_local_experts", "128"],
    );
}

#[test]
fn config_mixtral_hub() {
    let c = parse(MIXTRAL_HUB_CONFIG).unwrap();
    assert_eq!(c.arch, Arch::Mixtral);
    assert_eq!(
        (c.vocab_size, c.hidden_size, c.num_layers),
        (32000, 4096, 32)
    );
    assert_eq!(
        (c.num_heads, c.num_kv_heads, c.head_dim, c.kv_group()),
        (32, 8, 128, 4)
    );
    assert_eq!((c.num_experts, c.top_k, c.moe_intermediate), (8, 2, 14336));
    assert_eq!(c.shared_expert_intermediate, None);
    assert!(c.sparse_layers.iter().all(|&s| s));
    assert!(c.qk_norm == QkNorm::None && !c.qkv_bias && c.norm_topk_prob);
    assert_eq!((c.rope_theta, c.rms_norm_eps), (1e6, 1e-5));
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(1), vec![2])
    );
}

/// What a valid config of the new families can still get wrong, each naming its field.
#[test]
fn config_new_families_invalid_values() {
    use serde_json::json;
    let cases: Vec<(String, &str)> = vec![
        (
            edited(QWEN3_HUB_CONFIG, |m| {
                m.insert("num_key_value_heads".into(), 5.into());
            }),
            "num_key_value_heads",
        ),
        (
            edited(QWEN3_HUB_CONFIG, |m| {
                m.insert("head_dim".into(), 127.into());
            }),
            "head_dim",
        ),
        (
            edited(QWEN3_HUB_CONFIG, |m| {
                m.insert("num_experts_per_tok".into(), 129.into());
            }),
            "num_experts_per_tok",
        ),
        (
            edited(QWEN3_HUB_CONFIG, |m| {
                m.insert("mlp_only_layers".into(), json!([3, 48]));
            }),
            "mlp_only_layers",
        ),
        (
            edited(QWEN3_HUB_CONFIG, |m| {
                m.insert("use_sliding_window".into(), true.into());
            }),
            "use_sliding_window",
        ),
        (
            edited(QWEN3_HUB_CONFIG, |m| {
                m.insert("attention_bias".into(), true.into());
            }),
            "attention_bias",
        ),
        (
            edited(QWEN3_HUB_CONFIG, |m| {
                m.insert(
                    "rope_scaling".into(),
                    json!({"rope_type": "yarn", "factor": 4.0}),
                );
            }),
            "rope_scaling",
        ),
        (
            edited(MIXTRAL_HUB_CONFIG, |m| {
                m.insert("sliding_window".into(), 4096.into());
            }),
            "sliding_window",
        ),
        (
            edited(MIXTRAL_HUB_CONFIG, |m| {
                m.insert("num_experts_per_tok".into(), 9.into());
            }),
            "num_experts_per_tok",
        ),
        (
            edited(MIXTRAL_HUB_CONFIG, |m| {
                m.insert("norm_topk_prob".into(), false.into());
            }),
            "norm_topk_prob",
        ),
        (
            edited(MIXTRAL_HUB_CONFIG, |m| {
                m.remove("head_dim");
                m.insert("num_attention_heads".into(), 30.into());
                m.insert("num_key_value_heads".into(), 10.into());
            }),
            "num_attention_heads",
        ),
        (
            edited(MIXTRAL_HUB_CONFIG, |m| {
                m.insert("eos_token_id".into(), 32000.into());
            }),
            "eos_token_id",
        ),
    ];
    for (text, field) in cases {
        assert_mentions(&err_string(parse(&text)), &["config.json", field]);
    }
}

#[test]
fn config_unknown_model_type() {
    let text = edited(OLMOE_HUB_CONFIG, |m| {
        m.insert("model_type".into(), "llama".into());
    });
    assert_mentions(
        &err_string(parse(&text)),
        &["model_type", "llama", "olmoe", "qwen2_moe"],
    );
}

#[test]
fn config_invalid_values() {
    let cases: Vec<(String, &str)> = vec![
        (
            edited(QWEN_HUB_CONFIG, |m| {
                m.insert("use_sliding_window".into(), true.into());
            }),
            "use_sliding_window",
        ),
        (
            edited(OLMOE_HUB_CONFIG, |m| {
                m.insert("num_key_value_heads".into(), 3.into());
            }),
            "num_key_value_heads",
        ),
        (
            edited(OLMOE_HUB_CONFIG, |m| {
                m.insert("num_experts_per_tok".into(), 65.into());
            }),
            "num_experts_per_tok",
        ),
        (
            edited(OLMOE_HUB_CONFIG, |m| {
                m.insert("hidden_size".into(), 0.into());
            }),
            "hidden_size",
        ),
        (
            edited(OLMOE_HUB_CONFIG, |m| {
                m.insert("hidden_size".into(), "big".into());
            }),
            "hidden_size",
        ),
        (
            edited(OLMOE_HUB_CONFIG, |m| {
                m.insert("hidden_act".into(), "gelu".into());
            }),
            "hidden_act",
        ),
        (
            edited(QWEN_HUB_CONFIG, |m| {
                m.insert("mlp_only_layers".into(), serde_json::json!([24]));
            }),
            "mlp_only_layers",
        ),
        (
            edited(QWEN_HUB_CONFIG, |m| {
                m.insert(
                    "layer_types".into(),
                    serde_json::json!(["sliding_attention"]),
                );
            }),
            "layer_types",
        ),
        (
            edited(OLMOE_HUB_CONFIG, |m| {
                m.insert("eos_token_id".into(), serde_json::json!([1, "x"]));
            }),
            "eos_token_id",
        ),
    ];
    for (text, field) in cases {
        assert_mentions(&err_string(parse(&text)), &["config.json", field]);
    }
}

#[test]
fn config_file_errors() {
    let dir = TempDir::new().unwrap();
    assert_mentions(
        &err_string(ModelConfig::from_dir(dir.path())),
        &["config.json"],
    );
    fs::write(
        dir.path().join("config.json"),
        "{ \"model_type\": \"olmoe\", ",
    )
    .unwrap();
    assert_mentions(
        &err_string(ModelConfig::from_dir(dir.path())),
        &["config.json", "invalid JSON"],
    );
    fs::write(dir.path().join("config.json"), "[1, 2]").unwrap();
    assert_mentions(
        &err_string(ModelConfig::from_dir(dir.path())),
        &["config.json"],
    );
    fs::write(dir.path().join("config.json"), OLMOE_HUB_CONFIG).unwrap();
    assert_eq!(ModelConfig::from_dir(dir.path()).unwrap().hidden_size, 2048);
}

#[test]
fn generation_config() {
    let dir = TempDir::new().unwrap();
    assert!(GenerationConfig::from_dir(dir.path()).unwrap().is_none());
    fs::write(
        dir.path().join("generation_config.json"),
        r#"{"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
            "do_sample": true, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "transformers_version": "4.37.0"}"#,
    )
    .unwrap();
    let g = GenerationConfig::from_dir(dir.path()).unwrap().unwrap();
    assert_eq!(g.eos_token_ids, vec![151645, 151643]);
    assert_eq!(
        (g.bos_token_id, g.pad_token_id),
        (Some(151643), Some(151643))
    );
    assert_eq!(
        (g.temperature, g.top_k, g.top_p, g.do_sample),
        (Some(0.7), Some(20), Some(0.8), Some(true))
    );
    fs::write(dir.path().join("generation_config.json"), "{oops").unwrap();
    assert_mentions(
        &err_string(GenerationConfig::from_dir(dir.path())),
        &["generation_config.json"],
    );
    fs::write(
        dir.path().join("generation_config.json"),
        r#"{"top_p": "high"}"#,
    )
    .unwrap();
    assert_mentions(
        &err_string(GenerationConfig::from_dir(dir.path())),
        &["generation_config.json", "top_p"],
    );
}

// ---------------------------------------------------------------------------------------------

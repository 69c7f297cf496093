//! Loader tests: config parsing, safetensors checkpoints (single, sharded, hub and fused expert
//! layouts), dtype conversion, tokenizer and chat template, and that every bad input fails with
//! an error naming the file, field or tensor at fault. No GPU needed.

use std::fs;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use tempfile::TempDir;

use wgmoe::checkpoint::{Checkpoint, DType, ExpertLayout, ExpertProj};
use wgmoe::config::{Arch, GenerationConfig, ModelConfig};
use wgmoe::tokenizer::{TextStream, Tokenizer};

// ---------------------------------------------------------------------------------------------
// Helpers

/// A tensor to write: name, dtype, shape, raw little-endian bytes.
struct T {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

fn t_f32(name: &str, shape: &[usize], vals: &[f32]) -> T {
    assert_eq!(shape.iter().product::<usize>(), vals.len());
    T {
        name: name.into(),
        dtype: Dtype::F32,
        shape: shape.to_vec(),
        bytes: vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

fn t_bf16(name: &str, shape: &[usize], vals: &[f32]) -> T {
    assert_eq!(shape.iter().product::<usize>(), vals.len());
    T {
        name: name.into(),
        dtype: Dtype::BF16,
        shape: shape.to_vec(),
        bytes: vals
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_bits().to_le_bytes())
            .collect(),
    }
}

fn t_bf16_bits(name: &str, bits: &[u16]) -> T {
    T {
        name: name.into(),
        dtype: Dtype::BF16,
        shape: vec![bits.len()],
        bytes: bits.iter().flat_map(|b| b.to_le_bytes()).collect(),
    }
}

fn t_f16_bits(name: &str, bits: &[u16]) -> T {
    T {
        name: name.into(),
        dtype: Dtype::F16,
        shape: vec![bits.len()],
        bytes: bits.iter().flat_map(|b| b.to_le_bytes()).collect(),
    }
}

fn serialize(tensors: &[T]) -> Vec<u8> {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                TensorView::new(t.dtype, t.shape.clone(), &t.bytes).unwrap(),
            )
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

fn write_st(path: &Path, tensors: &[T]) {
    fs::write(path, serialize(tensors)).unwrap();
}

/// Writes shards and an index mapping every tensor to its shard.
fn write_sharded(dir: &Path, shards: &[(&str, Vec<T>)]) {
    let mut map = serde_json::Map::new();
    for (file, tensors) in shards {
        write_st(&dir.join(file), tensors);
        for t in tensors {
            map.insert(t.name.clone(), serde_json::Value::String(file.to_string()));
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

fn err_string<T>(r: wgmoe::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

fn assert_mentions(msg: &str, needles: &[&str]) {
    for n in needles {
        assert!(
            msg.contains(n),
            "error message {msg:?} does not mention {n:?}"
        );
    }
}

/// Deterministic pseudo-random values exactly representable in bf16.
fn pattern(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            bf16::from_f32((s % 2001) as f32 / 1000.0 - 1.0).to_f32()
        })
        .collect()
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join(name)
}

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
    assert!(c.qk_norm && !c.qkv_bias);
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
    assert!(!c.qk_norm && c.qkv_bias);
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
        (OLMOE_HUB_CONFIG, "rms_norm_eps"),
        (OLMOE_HUB_CONFIG, "tie_word_embeddings"),
        (QWEN_HUB_CONFIG, "moe_intermediate_size"),
        (QWEN_HUB_CONFIG, "shared_expert_intermediate_size"),
        (QWEN_HUB_CONFIG, "decoder_sparse_step"),
        (QWEN_HUB_CONFIG, "model_type"),
    ] {
        let text = edited(base, |m| {
            m.remove(field);
        });
        let msg = err_string(parse(&text));
        assert_mentions(&msg, &["config.json", field, "missing"]);
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
// Checkpoints

#[test]
fn single_file_checkpoint() {
    let dir = TempDir::new().unwrap();
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            t_f32("a", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            t_bf16("b", &[4], &[0.5, -1.0, 2.0, 1024.0]),
            t_f16_bits("c", &[0x3C00, 0xC000]),
        ],
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ck.dir(), dir.path());
    assert_eq!(ck.names().collect::<Vec<_>>(), vec!["a", "b", "c"]);
    assert!(ck.contains("a") && !ck.contains("z"));
    let info = ck.info("b").unwrap();
    assert_eq!((info.dtype, info.shape.clone()), (DType::BF16, vec![4]));
    assert_eq!(info.file, dir.path().join("model.safetensors"));
    assert_eq!(
        ck.read_f32("a", &[2, 3]).unwrap(),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
    assert_eq!(
        ck.read_f32("b", &[4]).unwrap(),
        vec![0.5, -1.0, 2.0, 1024.0]
    );
    assert_eq!(ck.read_f32("c", &[2]).unwrap(), vec![1.0, -2.0]);
    assert_eq!(ck.read_f16("a", &[2, 3]).unwrap()[5], f16::from_f32(6.0));
    assert_eq!(
        ck.read_rows_f32("a", &[2, 3], 1, 1).unwrap(),
        vec![4.0, 5.0, 6.0]
    );
}

#[test]
fn sharded_checkpoint() {
    let dir = TempDir::new().unwrap();
    write_sharded(
        dir.path(),
        &[
            (
                "model-00001-of-00002.safetensors",
                vec![
                    t_f32("x.weight", &[2], &[1.0, 2.0]),
                    t_bf16("y.weight", &[1], &[3.0]),
                ],
            ),
            (
                "model-00002-of-00002.safetensors",
                vec![t_f32("z.weight", &[2, 2], &[4.0, 5.0, 6.0, 7.0])],
            ),
        ],
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(
        ck.names().collect::<Vec<_>>(),
        vec!["x.weight", "y.weight", "z.weight"]
    );
    assert_eq!(
        ck.info("z.weight").unwrap().file,
        dir.path().join("model-00002-of-00002.safetensors")
    );
    assert_eq!(
        ck.info("y.weight").unwrap().file,
        dir.path().join("model-00001-of-00002.safetensors")
    );
    assert_eq!(ck.read_f32("x.weight", &[2]).unwrap(), vec![1.0, 2.0]);
    assert_eq!(ck.read_f32("y.weight", &[1]).unwrap(), vec![3.0]);
    assert_eq!(
        ck.read_f32("z.weight", &[2, 2]).unwrap(),
        vec![4.0, 5.0, 6.0, 7.0]
    );
    assert_eq!(ck.files().count(), 2);
}

#[test]
fn dtype_conversions_known_values() {
    let dir = TempDir::new().unwrap();
    // bf16 bit patterns and the f16 bit patterns they must become (round to nearest even).
    let cases: [(u16, u16); 8] = [
        (0x3F80, 0x3C00), // 1.0
        (0xC000, 0xC000), // -2.0
        (0x4049, 0x4248), // 3.140625 (exact in f16)
        (0x0000, 0x0000), // +0
        (0x8000, 0x8000), // -0
        (0x477F, 0x7BF8), // 65280, the largest bf16 below f16's max 65504
        (0x3380, 0x0001), // 2^-24 → smallest f16 subnormal
        (0x33C0, 0x0002), // 1.5 * 2^-24 → tie, rounds to even (2 * 2^-24)
    ];
    let mut bf: Vec<u16> = cases.iter().map(|c| c.0).collect();
    bf.push(0x3300); // 2^-25 → tie between 0 and 2^-24, rounds to even (0)
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            t_bf16_bits("bf", &bf),
            t_f32("f32", &[3], &[0.1, 65504.0, -1.0e-3]),
            t_f16_bits("f16", &[0x3555, 0x7BFF, 0x0001, 0x8001]),
            // 65536 (beyond f16), then 999424 (the issue's norm weight).
            t_bf16_bits("big", &[0x3F80, 0x4780, 0x4974]),
            t_f32("big32", &[2], &[1.0, 1.0e6]),
            t_f16_bits("inf16", &[0x3C00, 0x3C00, 0xFC00]),
            t_bf16_bits("nan", &[0x3F80, 0x7FC0]),
            t_f32("rows", &[3, 2], &[1.0, 1.0, 1.0, 1.0, 1.0, f32::INFINITY]),
        ],
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    let got: Vec<u16> = ck
        .read_f16("bf", &[bf.len()])
        .unwrap()
        .iter()
        .map(|h| h.to_bits())
        .collect();
    let mut want: Vec<u16> = cases.iter().map(|c| c.1).collect();
    want.push(0x0000);
    assert_eq!(got, want);
    // bf16 → f32 is exact (the bits are the top half of the f32).
    let f = ck.read_f32("bf", &[bf.len()]).unwrap();
    assert_eq!(&f[..3], &[1.0, -2.0, 3.140625]);
    assert_eq!(f[5], 65280.0);
    assert_eq!(f[6], 2f32.powi(-24));
    // f32 → f16.
    let h: Vec<u16> = ck
        .read_f16("f32", &[3])
        .unwrap()
        .iter()
        .map(|h| h.to_bits())
        .collect();
    assert_eq!(h, vec![0x2E66, 0x7BFF, f16::from_f32(-1.0e-3).to_bits()]);
    // f16 → f32 is exact; f16 → f16 is a copy.
    let f = ck.read_f32("f16", &[4]).unwrap();
    assert_eq!(
        f,
        vec![1365.0 / 4096.0, 65504.0, 2f32.powi(-24), -(2f32.powi(-24))]
    );
    let h: Vec<u16> = ck
        .read_f16("f16", &[4])
        .unwrap()
        .iter()
        .map(|h| h.to_bits())
        .collect();
    assert_eq!(h, vec![0x3555, 0x7BFF, 0x0001, 0x8001]);
    // Values beyond the f16 range are refused as f16 (never a silent inf), naming the
    // tensor, the first bad element and its value; as f32 they are exact.
    let e = err_string(ck.read_f16("big", &[3]));
    for part in ["`big`", "element 1 ", "65536", "f16 range"] {
        assert!(e.contains(part), "{e}");
    }
    assert_eq!(ck.read_f32("big", &[3]).unwrap()[2], 999424.0);
    let e = err_string(ck.read_f16("big32", &[2]));
    assert!(e.contains("element 1 ") && e.contains("1000000"), "{e}");
    // Non-finite values are refused by every read, rows included (the index is the flat
    // index in the tensor).
    for e in [
        err_string(ck.read_f16("inf16", &[3])),
        err_string(ck.read_f32("inf16", &[3])),
        err_string(ck.read_rows_f16("inf16", &[3], 0, 1)),
    ] {
        assert!(
            e.contains("`inf16`") && e.contains("element 2 ") && e.contains("-inf"),
            "{e}"
        );
    }
    for e in [
        err_string(ck.read_rows_f32("rows", &[3, 2], 2, 1)),
        err_string(ck.read_rows_f16("rows", &[3, 2], 1, 2)),
    ] {
        assert!(e.contains("element 5 ") && e.contains("inf"), "{e}");
    }
    assert_eq!(
        ck.read_rows_f32("rows", &[3, 2], 1, 1).unwrap(),
        vec![1.0, 1.0]
    );
    let e = err_string(ck.read_f32("nan", &[2]));
    assert!(e.contains("element 1 ") && e.contains("NaN"), "{e}");
}

#[test]
fn read_rows_of_3d_tensor() {
    let dir = TempDir::new().unwrap();
    let vals: Vec<f32> = (0..24).map(|v| v as f32).collect();
    write_st(
        &dir.path().join("model.safetensors"),
        &[t_bf16("t", &[2, 3, 4], &vals)],
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    // 2-D view [6, 4]: rows 2..5.
    assert_eq!(
        ck.read_rows_f32("t", &[2, 3, 4], 2, 3).unwrap(),
        (8..20).map(|v| v as f32).collect::<Vec<_>>()
    );
    assert_eq!(
        ck.read_rows_f16("t", &[2, 3, 4], 5, 1).unwrap(),
        (20..24)
            .map(|v| f16::from_f32(v as f32))
            .collect::<Vec<_>>()
    );
    assert!(ck.read_rows_f32("t", &[2, 3, 4], 5, 0).unwrap().is_empty());
    assert_mentions(
        &err_string(ck.read_rows_f32("t", &[2, 3, 4], 4, 3)),
        &["`t`", "out of range"],
    );
    assert_mentions(
        &err_string(ck.read_rows_f32("t", &[6, 4], 0, 1)),
        &["`t`", "[6, 4]", "[2, 3, 4]"],
    );
}

/// Writes the same experts in hub (per-expert) and fused layouts, and checks both read back
/// identically and equal to the source matrices.
#[test]
fn hub_and_fused_expert_layouts_agree() {
    let (layers, e_n, h, i) = (2usize, 3usize, 5usize, 4usize);
    // want[l][e] = (gate [I,H], up [I,H], down [H,I])
    let want: Vec<Vec<[Vec<f32>; 3]>> = (0..layers)
        .map(|l| {
            (0..e_n)
                .map(|e| {
                    let s = (l * 10 + e) as u32 * 3;
                    [
                        pattern(i * h, s),
                        pattern(i * h, s + 1),
                        pattern(h * i, s + 2),
                    ]
                })
                .collect()
        })
        .collect();

    let hub = TempDir::new().unwrap();
    let mut hub_t = Vec::new();
    for (l, experts) in want.iter().enumerate() {
        for (e, [g, u, d]) in experts.iter().enumerate() {
            let p = format!("model.layers.{l}.mlp.experts.{e}");
            hub_t.push(t_bf16(&format!("{p}.gate_proj.weight"), &[i, h], g));
            hub_t.push(t_bf16(&format!("{p}.up_proj.weight"), &[i, h], u));
            hub_t.push(t_bf16(&format!("{p}.down_proj.weight"), &[h, i], d));
        }
    }
    write_st(&hub.path().join("model.safetensors"), &hub_t);

    let fused = TempDir::new().unwrap();
    let mut fused_t = Vec::new();
    for (l, experts) in want.iter().enumerate() {
        // [E, 2I, H]: per expert, gate rows then up rows. [E, H, I] for down.
        let gate_up: Vec<f32> = experts
            .iter()
            .flat_map(|[g, u, _]| g.iter().chain(u.iter()).copied())
            .collect();
        let down: Vec<f32> = experts
            .iter()
            .flat_map(|[_, _, d]| d.iter().copied())
            .collect();
        fused_t.push(t_f32(
            &format!("model.layers.{l}.mlp.experts.gate_up_proj"),
            &[e_n, 2 * i, h],
            &gate_up,
        ));
        fused_t.push(t_f32(
            &format!("model.layers.{l}.mlp.experts.down_proj"),
            &[e_n, h, i],
            &down,
        ));
    }
    write_st(&fused.path().join("model.safetensors"), &fused_t);

    let ck_hub = Checkpoint::open(hub.path()).unwrap();
    let ck_fused = Checkpoint::open(fused.path()).unwrap();
    for (l, experts) in want.iter().enumerate() {
        assert_eq!(ck_hub.expert_layout(l).unwrap(), ExpertLayout::PerExpert);
        assert_eq!(ck_fused.expert_layout(l).unwrap(), ExpertLayout::Fused);
        for (e, mats) in experts.iter().enumerate() {
            for (k, proj) in [ExpertProj::Gate, ExpertProj::Up, ExpertProj::Down]
                .into_iter()
                .enumerate()
            {
                let a = ck_hub.read_expert_f32(l, e, proj, e_n, h, i).unwrap();
                let b = ck_fused.read_expert_f32(l, e, proj, e_n, h, i).unwrap();
                assert_eq!(a, mats[k], "hub layer {l} expert {e} {proj:?}");
                assert_eq!(b, mats[k], "fused layer {l} expert {e} {proj:?}");
                let a16 = ck_hub.read_expert_f16(l, e, proj, e_n, h, i).unwrap();
                let b16 = ck_fused.read_expert_f16(l, e, proj, e_n, h, i).unwrap();
                assert_eq!(a16, b16);
            }
        }
    }
    // Wrong dimensions name the tensor and both shapes; out-of-range experts and layers fail.
    assert_mentions(
        &err_string(ck_hub.read_expert_f32(0, 0, ExpertProj::Down, e_n, h, i + 1)),
        &[
            "model.layers.0.mlp.experts.0.down_proj.weight",
            "[5, 5]",
            "[5, 4]",
        ],
    );
    assert_mentions(
        &err_string(ck_fused.read_expert_f32(1, 0, ExpertProj::Gate, e_n + 1, h, i)),
        &[
            "model.layers.1.mlp.experts.gate_up_proj",
            "[4, 8, 5]",
            "[3, 8, 5]",
        ],
    );
    assert_mentions(
        &err_string(ck_fused.read_expert_f32(0, 3, ExpertProj::Up, e_n, h, i)),
        &["expert 3"],
    );
    assert_mentions(
        &err_string(ck_hub.expert_layout(2)),
        &["model.layers.2.mlp.experts"],
    );
}

#[test]
fn missing_checkpoint_files() {
    let dir = TempDir::new().unwrap();
    assert_mentions(
        &err_string(Checkpoint::open(dir.path())),
        &["model.safetensors"],
    );
}

#[test]
fn truncated_safetensors() {
    let dir = TempDir::new().unwrap();
    let bytes = serialize(&[t_f32("w", &[16], &[1.0; 16])]);
    let path = dir.path().join("model.safetensors");
    // Cut inside the data, inside the header, and inside the 8-byte length prefix.
    for keep in [bytes.len() - 4, 20, 3, 0] {
        fs::write(&path, &bytes[..keep]).unwrap();
        assert_mentions(
            &err_string(Checkpoint::open(dir.path())),
            &["model.safetensors"],
        );
    }
}

#[test]
fn corrupt_header() {
    let dir = TempDir::new().unwrap();
    let mut bytes = serialize(&[t_f32("w", &[4], &[1.0; 4])]);
    let path = dir.path().join("model.safetensors");
    // Garbage length prefix.
    bytes[..8].copy_from_slice(b"\xde\xad\xbe\xef\xde\xad\xbe\xef");
    fs::write(&path, &bytes).unwrap();
    assert_mentions(
        &err_string(Checkpoint::open(dir.path())),
        &["model.safetensors", "header"],
    );
    // Valid length, garbage JSON.
    let mut bytes = serialize(&[t_f32("w", &[4], &[1.0; 4])]);
    bytes[8] = b'#';
    fs::write(&path, &bytes).unwrap();
    assert_mentions(
        &err_string(Checkpoint::open(dir.path())),
        &["model.safetensors", "header"],
    );
}

#[test]
fn index_naming_missing_shard() {
    let dir = TempDir::new().unwrap();
    write_sharded(
        dir.path(),
        &[(
            "model-00001-of-00002.safetensors",
            vec![t_f32("a", &[1], &[1.0])],
        )],
    );
    let index = serde_json::json!({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}});
    fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    assert_mentions(
        &err_string(Checkpoint::open(dir.path())),
        &["model-00002-of-00002.safetensors", "`b`"],
    );
}

#[test]
fn index_naming_tensor_absent_from_shard() {
    let dir = TempDir::new().unwrap();
    write_sharded(
        dir.path(),
        &[(
            "model-00001-of-00001.safetensors",
            vec![t_f32("a", &[1], &[1.0])],
        )],
    );
    let index = serde_json::json!({"weight_map": {"a": "model-00001-of-00001.safetensors", "ghost": "model-00001-of-00001.safetensors"}});
    fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    assert_mentions(
        &err_string(Checkpoint::open(dir.path())),
        &["ghost", "model-00001-of-00001.safetensors"],
    );
}

#[test]
fn bad_index_files() {
    let dir = TempDir::new().unwrap();
    fs::write(dir.path().join("model.safetensors.index.json"), "{not json").unwrap();
    assert_mentions(
        &err_string(Checkpoint::open(dir.path())),
        &["model.safetensors.index.json"],
    );
    fs::write(
        dir.path().join("model.safetensors.index.json"),
        r#"{"metadata": {}}"#,
    )
    .unwrap();
    assert_mentions(
        &err_string(Checkpoint::open(dir.path())),
        &["model.safetensors.index.json", "weight_map"],
    );
    fs::write(
        dir.path().join("model.safetensors.index.json"),
        r#"{"weight_map": {"a": "../escape.safetensors"}}"#,
    )
    .unwrap();
    assert_mentions(
        &err_string(Checkpoint::open(dir.path())),
        &["model.safetensors.index.json", "weight_map.a"],
    );
}

#[test]
fn missing_tensor_wrong_shape_unsupported_dtype() {
    let dir = TempDir::new().unwrap();
    let ints: Vec<u8> = [1i32, 2, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            t_f32("w", &[2, 2], &[1.0; 4]),
            T {
                name: "ids".into(),
                dtype: Dtype::I32,
                shape: vec![3],
                bytes: ints,
            },
        ],
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    let msg = err_string(ck.read_f32("nope.weight", &[1]));
    assert_mentions(&msg, &["nope.weight", "not found"]);
    assert_mentions(&err_string(ck.info("nope.weight")), &["nope.weight"]);
    let msg = err_string(ck.read_f16("w", &[4, 1]));
    assert_mentions(&msg, &["`w`", "model.safetensors", "[4, 1]", "[2, 2]"]);
    assert!(ck.contains("ids"));
    for msg in [
        err_string(ck.read_f32("ids", &[3])),
        err_string(ck.read_f16("ids", &[3])),
        err_string(ck.info("ids")),
    ] {
        assert_mentions(&msg, &["`ids`", "model.safetensors", "I32"]);
    }
}

#[test]
fn expert_layout_both_is_error() {
    let dir = TempDir::new().unwrap();
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            t_f32(
                "model.layers.0.mlp.experts.0.gate_proj.weight",
                &[1],
                &[0.0],
            ),
            t_f32("model.layers.0.mlp.experts.gate_up_proj", &[1], &[0.0]),
        ],
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_mentions(
        &err_string(ck.expert_layout(0)),
        &["layer 0", "gate_up_proj"],
    );
}

// ---------------------------------------------------------------------------------------------
// Tokenizer

#[test]
fn bad_tokenizer_files() {
    let dir = TempDir::new().unwrap();
    assert_mentions(
        &err_string(Tokenizer::from_dir(dir.path())),
        &["tokenizer.json"],
    );
    fs::write(dir.path().join("tokenizer.json"), "{\"model\": 12}").unwrap();
    assert_mentions(
        &err_string(Tokenizer::from_dir(dir.path())),
        &["tokenizer.json"],
    );
    // A good tokenizer.json with a malformed tokenizer_config.json.
    fs::copy(
        fixture("olmoe-tiny").join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    fs::write(dir.path().join("tokenizer_config.json"), "{,}").unwrap();
    assert_mentions(
        &err_string(Tokenizer::from_dir(dir.path())),
        &["tokenizer_config.json"],
    );
    fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"eos_token": 5}"#,
    )
    .unwrap();
    assert_mentions(
        &err_string(Tokenizer::from_dir(dir.path())),
        &["tokenizer_config.json", "eos_token"],
    );
}

/// tokenizer_config.json variants: AddedToken-object special tokens, the list-of-templates
/// form, add_bos_token, an unknown tokenizer_class, and raise_exception.
#[test]
fn tokenizer_config_variants_and_chat_template() {
    let dir = TempDir::new().unwrap();
    fs::copy(
        fixture("olmoe-tiny").join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    let template = "{% for m in messages %}{% if m['role'] == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}\
                    {{ bos_token }}<{{ m.role }}>{{ m['content'].strip() }}{{ eos_token }}\n{% endfor %}\
                    {% if add_generation_prompt %}<assistant>{% endif %}";
    let cfg = serde_json::json!({
        "tokenizer_class": "SomeFutureTokenizer",
        "bos_token": {"content": "<|endoftext|>", "lstrip": false, "special": true},
        "eos_token": "<|padding|>",
        "add_bos_token": true,
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": template}
        ]
    });
    fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.bos_token(), Some("<|endoftext|>"));
    assert_eq!(tok.eos_token(), Some("<|padding|>"));
    assert_eq!(tok.chat_template(), Some(template));
    let msgs = vec![
        ("user".to_string(), "  hi there ".to_string()),
        ("assistant".to_string(), "yo".to_string()),
    ];
    let text = tok.apply_chat_template(&msgs, true).unwrap();
    assert_eq!(text, "<|endoftext|><user>hi there<|padding|>\n<|endoftext|><assistant>yo<|padding|>\n<assistant>");
    let err = err_string(tok.apply_chat_template(&[("bad".to_string(), String::new())], false));
    assert_mentions(&err, &["tokenizer_config.json", "no bad roles"]);

    // add_bos_token prepends BOS once when special tokens are requested.
    let bos = tok.bos_token_id().unwrap();
    let plain = tok.encode("hello", false).unwrap();
    assert_ne!(plain.first(), Some(&bos));
    let with = tok.encode("hello", true).unwrap();
    assert_eq!(with[0], bos);
    assert_eq!(&with[1..], &plain[..]);

    // A chat_template.jinja file takes precedence (what transformers 5 saves).
    fs::write(
        dir.path().join("chat_template.jinja"),
        "{{ messages | length }}{{ undefined_var }}",
    )
    .unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.apply_chat_template(&msgs, false).unwrap(), "2");
    fs::write(dir.path().join("chat_template.jinja"), "{% for %}").unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_mentions(
        &err_string(tok.apply_chat_template(&msgs, false)),
        &["chat_template.jinja"],
    );

    // No template at all.
    fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
    fs::write(dir.path().join("tokenizer_config.json"), "{}").unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert!(tok.chat_template().is_none());
    assert_mentions(
        &err_string(tok.apply_chat_template(&msgs, true)),
        &["no chat template"],
    );
}

/// Streaming decode: byte-level BPE splits multi-byte characters across tokens; the stream
/// must hold them back until complete and its concatenation must equal a full decode.
#[test]
fn text_stream_multibyte() {
    let tok = Tokenizer::from_dir(&fixture("olmoe-tiny")).unwrap();
    let text = "Grüße, 世界! 🌍🚀 naïve café — ok";
    let ids = tok.encode(text, false).unwrap();
    let mut stream = TextStream::new();
    let mut out = String::new();
    let mut held = 0;
    for &id in &ids {
        let piece = stream.push(&tok, id).unwrap();
        assert!(
            !piece.contains('\u{FFFD}'),
            "partial character emitted: {piece:?}"
        );
        held += usize::from(piece.is_empty());
        out.push_str(&piece);
    }
    // Some characters (the emoji at least) span several byte-level tokens.
    assert!(
        held > 0,
        "no token was held back; the test text no longer exercises split characters"
    );
    out.push_str(&stream.finish(&tok).unwrap());
    assert_eq!(out, tok.decode(&ids).unwrap());
    assert_eq!(out, text);
    assert_eq!(stream.ids(), &ids[..]);
}

// ---------------------------------------------------------------------------------------------
// Committed fixtures (models/, made by tools/make_fixtures.py with the real transformers classes)

/// Every tensor the checkpoint of `c` must hold, with its shape (derived from the config alone).
fn expected_tensors(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, v) = (c.hidden_size, c.vocab_size);
    let q = c.num_heads * c.head_dim;
    let kv = c.num_kv_heads * c.head_dim;
    let mut out = vec![
        ("model.embed_tokens.weight".to_string(), vec![v, h]),
        ("model.norm.weight".to_string(), vec![h]),
    ];
    if !c.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![v, h]));
    }
    for l in 0..c.num_layers {
        let p = format!("model.layers.{l}");
        out.push((format!("{p}.input_layernorm.weight"), vec![h]));
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        out.push((format!("{p}.self_attn.q_proj.weight"), vec![q, h]));
        out.push((format!("{p}.self_attn.k_proj.weight"), vec![kv, h]));
        out.push((format!("{p}.self_attn.v_proj.weight"), vec![kv, h]));
        out.push((format!("{p}.self_attn.o_proj.weight"), vec![h, q]));
        if c.qk_norm {
            out.push((format!("{p}.self_attn.q_norm.weight"), vec![q]));
            out.push((format!("{p}.self_attn.k_norm.weight"), vec![kv]));
        }
        if c.qkv_bias {
            out.push((format!("{p}.self_attn.q_proj.bias"), vec![q]));
            out.push((format!("{p}.self_attn.k_proj.bias"), vec![kv]));
            out.push((format!("{p}.self_attn.v_proj.bias"), vec![kv]));
        }
        assert!(c.sparse_layers[l], "fixtures have only MoE layers");
        out.push((format!("{p}.mlp.gate.weight"), vec![c.num_experts, h]));
        for e in 0..c.num_experts {
            let i = c.moe_intermediate;
            out.push((format!("{p}.mlp.experts.{e}.gate_proj.weight"), vec![i, h]));
            out.push((format!("{p}.mlp.experts.{e}.up_proj.weight"), vec![i, h]));
            out.push((format!("{p}.mlp.experts.{e}.down_proj.weight"), vec![h, i]));
        }
        if let Some(s) = c.shared_expert_intermediate {
            out.push((
                format!("{p}.mlp.shared_expert.gate_proj.weight"),
                vec![s, h],
            ));
            out.push((format!("{p}.mlp.shared_expert.up_proj.weight"), vec![s, h]));
            out.push((
                format!("{p}.mlp.shared_expert.down_proj.weight"),
                vec![h, s],
            ));
            out.push((format!("{p}.mlp.shared_expert_gate.weight"), vec![1, h]));
        }
    }
    out
}

/// Opens a fixture's checkpoint, checks it holds exactly the tensors its config implies, reads
/// every tensor (f16 and f32 agree) and every routed expert.
fn check_fixture_checkpoint(c: &ModelConfig, dir: &Path, shards: usize) -> Checkpoint {
    let ck = Checkpoint::open(dir).unwrap();
    assert_eq!(ck.files().count(), shards);
    let want = expected_tensors(c);
    let mut want_names: Vec<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
    want_names.sort();
    assert_eq!(ck.names().collect::<Vec<_>>(), want_names);
    for (name, shape) in &want {
        let info = ck.info(name).unwrap();
        assert_eq!(info.dtype, DType::BF16, "{name}");
        let f = ck.read_f32(name, shape).unwrap();
        let h = ck.read_f16(name, shape).unwrap();
        assert_eq!(f.len(), shape.iter().product::<usize>());
        assert!(f.iter().all(|x| x.is_finite()), "{name}");
        // The fixture weights are small: bf16 → f16 must be their nearest f16.
        assert!(
            f.iter().zip(&h).all(|(a, b)| f16::from_f32(*a) == *b),
            "{name}"
        );
    }
    let (e_n, hd, i) = (c.num_experts, c.hidden_size, c.moe_intermediate);
    for l in 0..c.num_layers {
        assert_eq!(ck.expert_layout(l).unwrap(), ExpertLayout::PerExpert);
        for e in 0..e_n {
            for proj in [ExpertProj::Gate, ExpertProj::Up, ExpertProj::Down] {
                let w = ck.read_expert_f32(l, e, proj, e_n, hd, i).unwrap();
                assert_eq!(w.len(), hd * i);
                assert!(
                    w.iter().any(|&x| x != 0.0),
                    "layer {l} expert {e} {proj:?} is all zero"
                );
            }
        }
    }
    ck
}

/// The golden prompts (text in the metadata, ids as I64 tensors) of a fixture.
fn golden_prompts(fixture_name: &str) -> Vec<(String, Vec<u32>)> {
    let path = fixture("goldens").join(format!("{fixture_name}.safetensors"));
    let bytes = fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let meta = meta.metadata().clone().unwrap();
    (0..2)
        .map(|p| {
            let text = meta[&format!("p{p}.text")].clone();
            let t = st.tensor(&format!("p{p}.prompt_ids")).unwrap();
            assert_eq!(t.dtype(), Dtype::I64);
            let ids = t
                .data()
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
                .collect();
            (text, ids)
        })
        .collect()
}

fn check_fixture_tokenizer(tok: &Tokenizer, fixture_name: &str) {
    for (text, ids) in golden_prompts(fixture_name) {
        // The fixture tokenizers add no special tokens, so both modes give transformers' ids.
        assert_eq!(
            tok.encode(&text, true).unwrap(),
            ids,
            "{fixture_name}: {text:?}"
        );
        assert_eq!(tok.encode(&text, false).unwrap(), ids);
        assert_eq!(tok.decode(&ids).unwrap(), text);
    }
    let text = "Round trip: naïve café, 42 × 7 = 294!\n  indented";
    let ids = tok.encode(text, false).unwrap();
    assert_eq!(tok.decode(&ids).unwrap(), text);
    let mut stream = TextStream::new();
    let mut out = String::new();
    for &id in &ids {
        out.push_str(&stream.push(tok, id).unwrap());
    }
    out.push_str(&stream.finish(tok).unwrap());
    assert_eq!(out, text);
}

#[test]
fn fixture_olmoe_tiny() {
    let dir = fixture("olmoe-tiny");
    let c = ModelConfig::from_dir(&dir).unwrap();
    assert_eq!(c.arch, Arch::Olmoe);
    assert_eq!((c.vocab_size, c.hidden_size, c.num_layers), (50304, 64, 2));
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (4, 2, 16));
    assert_eq!((c.num_experts, c.top_k, c.moe_intermediate), (7, 3, 96));
    assert_eq!(c.shared_expert_intermediate, None);
    assert!(c.qk_norm && !c.qkv_bias && !c.norm_topk_prob && !c.tie_word_embeddings);
    assert_eq!(c.clip_qkv, None);
    assert_eq!(
        (c.rope_theta, c.rms_norm_eps, c.max_position_embeddings),
        (10000.0, 1e-5, 512)
    );
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (None, vec![50279])
    );
    let g = GenerationConfig::from_dir(&dir).unwrap().unwrap();
    assert_eq!(
        (g.eos_token_ids.clone(), g.pad_token_id),
        (vec![50279], Some(1))
    );

    check_fixture_checkpoint(&c, &dir, 1);

    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.eos_token(), Some("<|endoftext|>"));
    assert_eq!(tok.bos_token(), None);
    assert!(tok.vocab_size() <= c.vocab_size);
    check_fixture_tokenizer(&tok, "olmoe-tiny");
    let chat = tok
        .apply_chat_template(&[("user".into(), "Hi".into())], true)
        .unwrap();
    assert_eq!(chat, "<|user|>\nHi\n<|assistant|>\n");
    let chat = tok
        .apply_chat_template(
            &[
                ("user".into(), "Hi".into()),
                ("assistant".into(), "Hello".into()),
            ],
            false,
        )
        .unwrap();
    assert_eq!(chat, "<|user|>\nHi\n<|assistant|>\nHello<|endoftext|>");
}

#[test]
fn fixture_qwen2moe_tiny() {
    let dir = fixture("qwen2moe-tiny");
    let c = ModelConfig::from_dir(&dir).unwrap();
    assert_eq!(c.arch, Arch::Qwen2Moe);
    assert_eq!((c.vocab_size, c.hidden_size, c.num_layers), (2048, 256, 2));
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (4, 2, 64));
    assert_eq!((c.num_experts, c.top_k, c.moe_intermediate), (6, 3, 320));
    assert_eq!(
        (c.shared_expert_intermediate, c.dense_intermediate),
        (Some(384), 512)
    );
    assert_eq!(c.sparse_layers, vec![true, true]);
    assert!(!c.qk_norm && c.qkv_bias && !c.norm_topk_prob && !c.tie_word_embeddings);
    assert_eq!((c.rope_theta, c.rms_norm_eps), (1e6, 1e-6));
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(2045), vec![2045])
    );
    let g = GenerationConfig::from_dir(&dir).unwrap().unwrap();
    assert_eq!(
        (g.eos_token_ids.clone(), g.bos_token_id),
        (vec![2047, 2045], Some(2045))
    );

    let ck = check_fixture_checkpoint(&c, &dir, 3);
    // Tensors really come from different shards.
    assert_eq!(
        ck.info("lm_head.weight").unwrap().file,
        dir.join("model-00001-of-00003.safetensors")
    );
    assert_eq!(
        ck.info("model.norm.weight").unwrap().file,
        dir.join("model-00003-of-00003.safetensors")
    );

    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    assert_eq!(tok.eos_token_id(), Some(2047));
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(2045));
    assert_eq!(tok.vocab_size(), 2048);
    check_fixture_tokenizer(&tok, "qwen2moe-tiny");
    let chat = tok
        .apply_chat_template(&[("user".into(), "Hi".into())], true)
        .unwrap();
    assert_eq!(chat, "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    // Special tokens in rendered chat text encode as single ids and are skipped by decode.
    let ids = tok.encode(&chat, false).unwrap();
    assert_eq!(ids[0], tok.token_to_id("<|im_start|>").unwrap());
    assert_eq!(
        tok.decode(&ids).unwrap(),
        "system\nYou are a helpful assistant\nuser\nHi\nassistant\n"
    );
}

/// The OLMoE fixture rewritten in transformers 5's fused expert layout (as `save_file(model.state_dict())`
/// would write it) reads back the same expert matrices as the hub layout the fixture uses.
#[test]
fn fixture_experts_fused_roundtrip() {
    let dir = fixture("olmoe-tiny");
    let c = ModelConfig::from_dir(&dir).unwrap();
    let ck = Checkpoint::open(&dir).unwrap();
    let (e_n, h, i) = (c.num_experts, c.hidden_size, c.moe_intermediate);
    let mut tensors = Vec::new();
    for l in 0..c.num_layers {
        let mut gate_up = Vec::new();
        let mut down = Vec::new();
        for e in 0..e_n {
            gate_up.extend(
                ck.read_expert_f32(l, e, ExpertProj::Gate, e_n, h, i)
                    .unwrap(),
            );
            gate_up.extend(ck.read_expert_f32(l, e, ExpertProj::Up, e_n, h, i).unwrap());
            down.extend(
                ck.read_expert_f32(l, e, ExpertProj::Down, e_n, h, i)
                    .unwrap(),
            );
        }
        tensors.push(t_bf16(
            &format!("model.layers.{l}.mlp.experts.gate_up_proj"),
            &[e_n, 2 * i, h],
            &gate_up,
        ));
        tensors.push(t_bf16(
            &format!("model.layers.{l}.mlp.experts.down_proj"),
            &[e_n, h, i],
            &down,
        ));
    }
    let out = TempDir::new().unwrap();
    write_st(&out.path().join("model.safetensors"), &tensors);
    let fused = Checkpoint::open(out.path()).unwrap();
    for l in 0..c.num_layers {
        assert_eq!(fused.expert_layout(l).unwrap(), ExpertLayout::Fused);
        for e in 0..e_n {
            for proj in [ExpertProj::Gate, ExpertProj::Up, ExpertProj::Down] {
                assert_eq!(
                    fused.read_expert_f16(l, e, proj, e_n, h, i).unwrap(),
                    ck.read_expert_f16(l, e, proj, e_n, h, i).unwrap(),
                    "layer {l} expert {e} {proj:?}"
                );
            }
        }
    }
}

//! The committed fixtures (models/, made by tools/make_fixtures.py with the real
//! transformers classes) load as configs, checkpoints and tokenizers. No GPU needed.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use half::f16;

use common::st::*;
use safetensors::Dtype;
use tempfile::TempDir;
use wgmoe::config::{Arch, GenerationConfig, ModelConfig, QkNorm};
use wgmoe::format::checkpoint::{Checkpoint, DType, ExpertLayout, ExpertProj};
use wgmoe::tokenizer::{TextStream, Tokenizer};

fn fixture(name: &str) -> PathBuf {
    common::fixture(name)
}

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
        match c.qk_norm {
            QkNorm::None => {}
            QkNorm::Projection => {
                out.push((format!("{p}.self_attn.q_norm.weight"), vec![q]));
                out.push((format!("{p}.self_attn.k_norm.weight"), vec![kv]));
            }
            QkNorm::PerHead => {
                out.push((format!("{p}.self_attn.q_norm.weight"), vec![c.head_dim]));
                out.push((format!("{p}.self_attn.k_norm.weight"), vec![c.head_dim]));
            }
        }
        if c.qkv_bias {
            out.push((format!("{p}.self_attn.q_proj.bias"), vec![q]));
            out.push((format!("{p}.self_attn.k_proj.bias"), vec![kv]));
            out.push((format!("{p}.self_attn.v_proj.bias"), vec![kv]));
        }
        if !c.sparse_layers[l] {
            // A dense MLP layer among the MoE ones (Qwen3-MoE mlp_only_layers).
            let d = c.dense_intermediate;
            out.push((format!("{p}.mlp.gate_proj.weight"), vec![d, h]));
            out.push((format!("{p}.mlp.up_proj.weight"), vec![d, h]));
            out.push((format!("{p}.mlp.down_proj.weight"), vec![h, d]));
            continue;
        }
        let i = c.moe_intermediate;
        if c.arch == Arch::Mixtral {
            // The hub's Mixtral names: block_sparse_moe, w1 (gate), w3 (up), w2 (down).
            out.push((
                format!("{p}.block_sparse_moe.gate.weight"),
                vec![c.num_experts, h],
            ));
            for e in 0..c.num_experts {
                let x = format!("{p}.block_sparse_moe.experts.{e}");
                out.push((format!("{x}.w1.weight"), vec![i, h]));
                out.push((format!("{x}.w3.weight"), vec![i, h]));
                out.push((format!("{x}.w2.weight"), vec![h, i]));
            }
            continue;
        }
        out.push((format!("{p}.mlp.gate.weight"), vec![c.num_experts, h]));
        for e in 0..c.num_experts {
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
    for l in (0..c.num_layers).filter(|&l| c.sparse_layers[l]) {
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
    assert!(
        c.qk_norm == QkNorm::Projection
            && !c.qkv_bias
            && !c.norm_topk_prob
            && !c.tie_word_embeddings
    );
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
    assert!(c.qk_norm == QkNorm::None && c.qkv_bias && !c.norm_topk_prob && !c.tie_word_embeddings);
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

#[test]
fn fixture_qwen3moe_tiny() {
    let dir = fixture("qwen3moe-tiny");
    let c = ModelConfig::from_dir(&dir).unwrap();
    assert_eq!(c.arch, Arch::Qwen3Moe);
    assert_eq!((c.vocab_size, c.hidden_size, c.num_layers), (2048, 64, 3));
    // head_dim is given and differs from hidden / heads: q is 128 wide over hidden 64.
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (4, 2, 32));
    assert_eq!((c.num_experts, c.top_k, c.moe_intermediate), (7, 3, 96));
    assert_eq!(
        (c.shared_expert_intermediate, c.dense_intermediate),
        (None, 192)
    );
    // mlp_only_layers [1]: a dense MLP between two MoE layers.
    assert_eq!(c.sparse_layers, vec![true, false, true]);
    assert!(
        c.qk_norm == QkNorm::PerHead && !c.qkv_bias && c.norm_topk_prob && !c.tie_word_embeddings
    );
    assert_eq!((c.rope_theta, c.rms_norm_eps), (1e6, 1e-6));
    let g = GenerationConfig::from_dir(&dir).unwrap().unwrap();
    assert_eq!(g.eos_token_ids, vec![2047, 2045]);

    let ck = check_fixture_checkpoint(&c, &dir, 4);
    assert_eq!(
        ck.info("model.layers.0.self_attn.q_norm.weight")
            .unwrap()
            .shape,
        vec![32]
    );

    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    check_fixture_tokenizer(&tok, "qwen3moe-tiny");
    let chat = tok
        .apply_chat_template(&[("user".into(), "Hi".into())], true)
        .unwrap();
    assert_eq!(
        chat,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn fixture_mixtral_tiny() {
    let dir = fixture("mixtral-tiny");
    let c = ModelConfig::from_dir(&dir).unwrap();
    assert_eq!(c.arch, Arch::Mixtral);
    assert_eq!((c.vocab_size, c.hidden_size, c.num_layers), (2048, 128, 2));
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (8, 2, 16));
    // num_local_experts; Mixtral's experts are `intermediate_size` wide.
    assert_eq!((c.num_experts, c.top_k, c.moe_intermediate), (5, 3, 320));
    assert_eq!(c.shared_expert_intermediate, None);
    assert_eq!(c.sparse_layers, vec![true, true]);
    // Mixtral always renormalises the top-k weights.
    assert!(c.qk_norm == QkNorm::None && !c.qkv_bias && c.norm_topk_prob && !c.tie_word_embeddings);
    assert_eq!((c.rope_theta, c.rms_norm_eps), (1e6, 1e-5));
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(1), vec![2])
    );

    let ck = check_fixture_checkpoint(&c, &dir, 5);
    assert!(ck.contains("model.layers.1.block_sparse_moe.experts.4.w2.weight"));

    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.eos_token(), Some("</s>"));
    assert_eq!(tok.bos_token(), Some("<s>"));
    check_fixture_tokenizer(&tok, "mixtral-tiny");
    let chat = tok
        .apply_chat_template(&[("user".into(), "Hi".into())], true)
        .unwrap();
    assert_eq!(chat, "<s>[INST] Hi [/INST]");
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

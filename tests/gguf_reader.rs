//! The GGUF reader on hand-built files: every value type, tensors and their bytes, splits,
//! directories, and each kind of broken file refused with an error naming the file and the
//! key or tensor. No GPU, no fixtures.

mod gguf_writer;

use std::path::Path;

use gguf_writer::{s, tiny_model, Gguf, V};
use tempfile::TempDir;
use wgmoe::config::{Arch, QkNorm};
use wgmoe::gguf::{model_config, GgmlType, GgufModel, MetaValue, ModelTensors};

fn open_err(g: &Gguf, dir: &Path, name: &str) -> String {
    let p = dir.join(name);
    g.write(&p);
    match GgufModel::open(&p) {
        Ok(_) => panic!("{name}: opened a broken file"),
        Err(e) => e.to_string(),
    }
}

fn q8_block(d: f32, q: i8) -> Vec<u8> {
    let mut b = half::f16::from_f32(d).to_le_bytes().to_vec();
    b.extend(std::iter::repeat_n(q as u8, 32));
    b
}

#[test]
fn reads_every_value_type_tensors_and_bytes() {
    let dir = TempDir::new().unwrap();
    let p = dir.path().join("m.gguf");
    let q8: Vec<u8> = (0..4).flat_map(|i| q8_block(0.5, i as i8 - 2)).collect();
    let g = Gguf {
        alignment: 64,
        ..Default::default()
    }
    .kv("general.alignment", V::U32(64))
    .kv("a.u8", V::U8(7))
    .kv("a.i8", V::I8(-7))
    .kv("a.u16", V::U16(700))
    .kv("a.i16", V::I16(-700))
    .kv("a.u32", V::U32(70000))
    .kv("a.i32", V::I32(-70000))
    .kv("a.f32", V::F32(1.5))
    .kv("a.bool", V::Bool(true))
    .kv("a.str", s("héllo"))
    .kv("a.u64", V::U64(1 << 40))
    .kv("a.i64", V::I64(-(1 << 40)))
    .kv("a.f64", V::F64(2.25))
    .kv("a.arr", V::Arr(5, vec![V::I32(1), V::I32(-2)]))
    .kv("a.strs", V::Arr(8, vec![s("x"), s("yz")]))
    .kv("a.empty", V::Arr(6, vec![]))
    .f32_tensor("v", &[3])
    .tensor("m", &[64, 2], 8, q8.clone());
    g.write(&p);
    let m = GgufModel::open(&p).unwrap();
    let meta = m.metadata();
    assert_eq!(meta.get("a.u8"), Some(&MetaValue::U8(7)));
    assert_eq!(meta.get("a.i16"), Some(&MetaValue::I16(-700)));
    assert_eq!(meta.opt_u64("a.u32").unwrap(), Some(70000));
    assert_eq!(meta.opt_f64("a.f32").unwrap(), Some(1.5));
    assert_eq!(meta.opt_bool("a.bool").unwrap(), Some(true));
    assert_eq!(meta.opt_str("a.str").unwrap(), Some("héllo"));
    assert_eq!(meta.opt_u64("a.u64").unwrap(), Some(1 << 40));
    assert_eq!(meta.get("a.i64"), Some(&MetaValue::I64(-(1 << 40))));
    assert_eq!(meta.opt_f64("a.f64").unwrap(), Some(2.25));
    assert_eq!(meta.opt_str_array("a.strs").unwrap().unwrap(), ["x", "yz"]);
    assert_eq!(meta.opt_array("a.empty", 6).unwrap().unwrap().len(), 0);
    // Wrong types name the key.
    let e = meta.opt_u64("a.i64").unwrap_err().to_string();
    assert!(e.contains("a.i64") && e.contains("m.gguf"), "{e}");
    let e = meta.opt_str("a.u8").unwrap_err().to_string();
    assert!(e.contains("`a.u8`") && e.contains("u8"), "{e}");

    let f = &m.shards()[0];
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    let v = m.tensor("v").unwrap();
    assert_eq!(v.ggml_type, GgmlType::F32);
    assert_eq!(v.to_f32().unwrap(), vec![0.0, 0.01, 0.02]);
    let t = m.tensor("m").unwrap();
    assert_eq!(t.ggml_type, GgmlType::Q8_0);
    assert_eq!(t.ne, &[64, 2]);
    assert_eq!(t.data, &q8[..]);
    assert_eq!(t.file_offset % 64, 0);
    let y = t.to_f32().unwrap();
    assert_eq!(y.len(), 128);
    assert_eq!((y[0], y[32], y[127]), (-1.0, -0.5, 0.5));
    let e = m.tensor("nope").unwrap_err().to_string();
    assert!(e.contains("`nope`"), "{e}");
}

#[test]
fn version_2_files_read_like_version_3() {
    let dir = TempDir::new().unwrap();
    let p = dir.path().join("v2.gguf");
    Gguf {
        version: 2,
        ..Default::default()
    }
    .kv("k", V::U32(1))
    .f32_tensor("t", &[4, 2])
    .write(&p);
    let m = GgufModel::open(&p).unwrap();
    assert_eq!(m.shards()[0].version(), 2);
    assert_eq!(m.tensor("t").unwrap().to_f32().unwrap().len(), 8);
}

#[test]
fn bad_magic_and_versions_are_refused() {
    let dir = TempDir::new().unwrap();
    let p = dir.path().join("x.gguf");
    let mut b = Gguf::default().bytes();
    b[0] = b'G';
    b[3] = b'X';
    std::fs::write(&p, &b).unwrap();
    let e = GgufModel::open(&p).unwrap_err().to_string();
    assert!(e.contains("x.gguf") && e.contains("not a GGUF file"), "{e}");
    for (v, want) in [
        (1, "version 1"),
        (4, "version 4"),
        (0x0300_0000, "big-endian"),
    ] {
        let g = Gguf {
            version: v,
            ..Default::default()
        };
        let e = open_err(&g, dir.path(), "v.gguf");
        assert!(e.contains(want), "{v}: {e}");
    }
}

#[test]
fn truncated_files_name_what_was_cut() {
    let dir = TempDir::new().unwrap();
    let g = Gguf::default()
        .kv("general.name", s("a model"))
        .f32_tensor("first", &[8])
        .f32_tensor("second.weight", &[1000]);
    let full = g.bytes();
    let p = dir.path().join("cut.gguf");
    // Cut inside the second tensor's data.
    std::fs::write(&p, &full[..full.len() - 10]).unwrap();
    let e = GgufModel::open(&p).unwrap_err().to_string();
    assert!(
        e.contains("`second.weight`") && e.contains("past the end") && e.contains("cut.gguf"),
        "{e}"
    );
    // Cut inside the metadata.
    std::fs::write(&p, &full[..60]).unwrap();
    let e = GgufModel::open(&p).unwrap_err().to_string();
    assert!(e.contains("truncated") && e.contains("general.name"), "{e}");
    // A header claiming more entries than the file can hold.
    let mut b = full.clone();
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    let e = GgufModel::open(&p).unwrap_err().to_string();
    assert!(e.contains("cannot fit"), "{e}");
    // An array claiming more elements than bytes left.
    let g = Gguf::default().kv("big", V::Arr(8, vec![s("a")]));
    let mut b = g.bytes();
    let at = 24 + 8 + 3 + 4 + 4; // header, key "big", type, element type
    b[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    let e = GgufModel::open(&p).unwrap_err().to_string();
    assert!(e.contains("`big`") && e.contains("cannot fit"), "{e}");
}

#[test]
fn overlapping_and_misaligned_tensors_are_refused() {
    let dir = TempDir::new().unwrap();
    let mut g = Gguf::default()
        .f32_tensor("a", &[16])
        .f32_tensor("b", &[16]);
    g.tensors[1].offset = Some(32);
    let e = open_err(&g, dir.path(), "overlap.gguf");
    assert!(
        e.contains("`b`") && e.contains("overlaps tensor `a`"),
        "{e}"
    );

    let mut g = Gguf::default().f32_tensor("a", &[16]);
    g.tensors[0].offset = Some(4);
    let e = open_err(&g, dir.path(), "misaligned.gguf");
    assert!(e.contains("`a`") && e.contains("alignment 32"), "{e}");

    let g = Gguf::default().kv("general.alignment", V::U32(48));
    let e = open_err(&g, dir.path(), "align.gguf");
    assert!(
        e.contains("general.alignment") && e.contains("power of two"),
        "{e}"
    );
    let g = Gguf::default().kv("general.alignment", V::U64(64));
    let e = open_err(&g, dir.path(), "align64.gguf");
    assert!(e.contains("general.alignment") && e.contains("u32"), "{e}");

    // A custom alignment is honoured: offsets that are multiples of 32 but not of 256 fail.
    let mut g = Gguf {
        alignment: 256,
        ..Default::default()
    }
    .kv("general.alignment", V::U32(256))
    .f32_tensor("a", &[8])
    .f32_tensor("b", &[8]);
    g.tensors[1].offset = Some(32);
    let e = open_err(&g, dir.path(), "align256.gguf");
    assert!(e.contains("`b`") && e.contains("alignment 256"), "{e}");
}

#[test]
fn malformed_entries_are_refused() {
    let dir = TempDir::new().unwrap();
    let g = Gguf::default().kv("k", V::U8(1)).kv("k", V::U8(2));
    assert!(open_err(&g, dir.path(), "dupkey.gguf").contains("`k`: appears twice"));
    let g = Gguf::default().f32_tensor("t", &[1]).f32_tensor("t", &[1]);
    assert!(open_err(&g, dir.path(), "dupt.gguf").contains("`t`"));
    let g = Gguf::default().kv("n", V::Arr(9, vec![V::Arr(0, vec![])]));
    assert!(open_err(&g, dir.path(), "nested.gguf").contains("nested"));
    let g = Gguf::default().tensor("t", &[32], 31, vec![0; 18]);
    let e = open_err(&g, dir.path(), "type.gguf");
    assert!(e.contains("`t`") && e.contains("type id 31"), "{e}");
    let g = Gguf::default().tensor("t", &[40], 8, vec![0; 34 * 2]);
    let e = open_err(&g, dir.path(), "rows.gguf");
    assert!(e.contains("`t`") && e.contains("q8_0 blocks"), "{e}");
    let g = Gguf::default().tensor("t", &[1, 1, 1, 1, 1], 0, vec![0; 4]);
    assert!(open_err(&g, dir.path(), "dims.gguf").contains("5 dimensions"));
}

#[test]
fn unsupported_block_types_are_listed_but_refused_for_compute() {
    let dir = TempDir::new().unwrap();
    let p = dir.path().join("iq.gguf");
    let mut g = tiny_model("qwen3moe");
    // blk.1.ffn_down_exps as IQ2_XXS: ne[0] must be a multiple of 256 for it, so the tiny
    // model gets a file of its own shape with that type.
    let t = g
        .tensors
        .iter_mut()
        .find(|t| t.name == "blk.1.ffn_up_exps.weight")
        .unwrap();
    t.ne = vec![256, 1, 1];
    t.type_id = 16; // IQ2_XXS: 66 bytes per 256
    t.data = vec![0; 66];
    g.write(&p);
    let m = GgufModel::open(&p).unwrap();
    let view = m.tensor("blk.1.ffn_up_exps.weight").unwrap();
    assert_eq!(view.ggml_type, GgmlType::IQ2_XXS);
    let e = view.to_f32().unwrap_err().to_string();
    assert!(
        e.contains("iq2_xxs") && e.contains("`blk.1.ffn_up_exps.weight`"),
        "{e}"
    );
    // The model is refused (shape first: the shape check names the tensor too).
    let e = model_config(&m).unwrap_err().to_string();
    assert!(e.contains("`blk.1.ffn_up_exps.weight`"), "{e}");

    // Right shape, unsupported type: refused naming type and tensor.
    let mut g = tiny_model("qwen3moe");
    let t = g
        .tensors
        .iter_mut()
        .find(|t| t.name == "blk.0.attn_q.weight")
        .unwrap();
    t.type_id = 39; // MXFP4, 32 elements in 17 bytes: [16, 16] is not whole blocks, use TQ2 shape
    t.ne = vec![16, 16];
    t.type_id = 26; // I32: a type wgmoe does not compute with
    t.data = vec![0; 16 * 16 * 4];
    g.write(&p);
    let m = GgufModel::open(&p).unwrap();
    let e = model_config(&m).unwrap_err().to_string();
    assert!(
        e.contains("`blk.0.attn_q.weight`") && e.contains("i32 is not supported"),
        "{e}"
    );
}

#[test]
fn splits_are_found_from_any_shard_and_a_missing_shard_is_named() {
    let dir = TempDir::new().unwrap();
    let base = |no: u16| {
        Gguf::default()
            .kv("split.no", V::U16(no))
            .kv("split.count", V::U16(3))
            .kv("split.tensors.count", V::I32(3))
    };
    base(0)
        .kv("general.name", s("split model"))
        .f32_tensor("a", &[4])
        .write(&dir.path().join("m-00001-of-00003.gguf"));
    base(1)
        .f32_tensor("b", &[5])
        .write(&dir.path().join("m-00002-of-00003.gguf"));
    base(2)
        .f32_tensor("c", &[6])
        .write(&dir.path().join("m-00003-of-00003.gguf"));
    for start in ["m-00001-of-00003.gguf", "m-00003-of-00003.gguf"] {
        let m = GgufModel::open(&dir.path().join(start)).unwrap();
        assert_eq!(m.shards().len(), 3);
        assert_eq!(m.names().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(m.tensor("c").unwrap().to_f32().unwrap().len(), 6);
        assert!(m
            .tensor("c")
            .unwrap()
            .file
            .ends_with("m-00003-of-00003.gguf"));
        assert_eq!(
            m.metadata().opt_str("general.name").unwrap(),
            Some("split model")
        );
    }
    // A directory holding one split set is that model.
    let m = GgufModel::open(dir.path()).unwrap();
    assert_eq!(m.shards().len(), 3);

    std::fs::remove_file(dir.path().join("m-00002-of-00003.gguf")).unwrap();
    let e = GgufModel::open(&dir.path().join("m-00001-of-00003.gguf"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("m-00002-of-00003.gguf") && e.contains("shard 2 of 3"),
        "{e}"
    );
    // A shard that is not the one its name says.
    base(0)
        .f32_tensor("b", &[5])
        .write(&dir.path().join("m-00002-of-00003.gguf"));
    let e = GgufModel::open(&dir.path().join("m-00001-of-00003.gguf"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("split.no"), "{e}");
}

#[test]
fn directories_with_one_model_are_accepted_and_others_refused() {
    let dir = TempDir::new().unwrap();
    let e = GgufModel::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("no .gguf file"), "{e}");
    Gguf::default()
        .f32_tensor("a", &[4])
        .write(&dir.path().join("one.gguf"));
    assert!(GgufModel::open(dir.path()).unwrap().contains("a"));
    assert!(wgmoe::gguf::is_gguf_path(dir.path()));
    Gguf::default().write(&dir.path().join("two.gguf"));
    let e = GgufModel::open(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("2 GGUF models") && e.contains("one.gguf") && e.contains("two.gguf"),
        "{e}"
    );
}

#[test]
fn experts_are_contiguous_slices_of_the_3d_tensors() {
    let dir = TempDir::new().unwrap();
    let p = dir.path().join("e.gguf");
    tiny_model("olmoe").write(&p);
    let m = GgufModel::open(&p).unwrap();
    let down = m.tensor("blk.1.ffn_down_exps.weight").unwrap();
    assert_eq!(down.ne, &[8, 16, 4]);
    let all = down.to_f32().unwrap();
    for e in 0..4 {
        let x = down.expert(e).unwrap();
        assert_eq!(x.ne, &[8, 16]);
        assert_eq!(x.data.len(), 8 * 16 * 4);
        assert_eq!(x.to_f32().unwrap(), &all[e * 128..(e + 1) * 128]);
        assert_eq!(x.file_offset, down.file_offset + (e * 512) as u64);
    }
    let e = down.expert(4).unwrap_err().to_string();
    assert!(e.contains("expert 4 is out of range"), "{e}");
    assert!(m.tensor("output_norm.weight").unwrap().expert(0).is_err());
}

#[test]
fn metadata_of_each_family_becomes_its_model_config() {
    let dir = TempDir::new().unwrap();
    for (arch, want) in [
        ("olmoe", Arch::Olmoe),
        ("qwen2moe", Arch::Qwen2Moe),
        ("qwen3moe", Arch::Qwen3Moe),
        ("llama", Arch::Mixtral),
    ] {
        let mut g = tiny_model(arch);
        if arch == "llama" {
            g.set("llama.rope.dimension_count", V::U32(8));
        }
        let p = dir.path().join(format!("{arch}.gguf"));
        g.write(&p);
        let m = GgufModel::open(&p).unwrap();
        let cfg = model_config(&m).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert_eq!(cfg.arch, want);
        assert_eq!(
            (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.head_dim),
            (16, 2, 2, 8)
        );
        assert_eq!(
            (cfg.num_experts, cfg.top_k, cfg.moe_intermediate),
            (4, 2, 8)
        );
        assert_eq!(cfg.vocab_size, 12);
        assert_eq!(cfg.max_position_embeddings, 128);
        assert_eq!(cfg.eos_token_ids, vec![11]);
        assert!(!cfg.tie_word_embeddings);
        assert_eq!(cfg.sparse_layers, vec![true, true]);
        assert_eq!(
            cfg.norm_topk_prob,
            matches!(want, Arch::Qwen3Moe | Arch::Mixtral)
        );
        assert_eq!(
            cfg.qk_norm,
            match want {
                Arch::Olmoe => QkNorm::Projection,
                Arch::Qwen3Moe => QkNorm::PerHead,
                _ => QkNorm::None,
            }
        );
        assert_eq!(cfg.qkv_bias, want == Arch::Qwen2Moe);
        assert_eq!(
            cfg.shared_expert_intermediate,
            (want == Arch::Qwen2Moe).then_some(24)
        );
        let names = ModelTensors::resolve(&m, &cfg).unwrap();
        assert_eq!(names.layers.len(), 2);
        assert_eq!(names.lm_head(), "output.weight");
        assert_eq!(names.layers[1].shared.is_some(), want == Arch::Qwen2Moe);
    }
}

/// Each change to a valid file and the key or tensor its refusal must name.
#[test]
fn config_refusals_name_the_key_or_tensor() {
    let dir = TempDir::new().unwrap();
    type Edit = fn(&mut Gguf);
    let cases: Vec<(&str, &str, Edit, &str)> = vec![
        (
            "qwen3moe",
            "unknown arch",
            |g| g.set("general.architecture", s("gpt2")),
            "\"gpt2\" is not supported",
        ),
        (
            "llama",
            "dense llama",
            |g| g.remove("llama.expert_count"),
            "llama.expert_count",
        ),
        (
            "qwen3moe",
            "partial rope",
            |g| g.set("qwen3moe.rope.dimension_count", V::U32(4)),
            "qwen3moe.rope.dimension_count",
        ),
        (
            "qwen3moe",
            "unknown key",
            |g| g.set("qwen3moe.attention.logit_softcapping", V::F32(30.0)),
            "qwen3moe.attention.logit_softcapping",
        ),
        (
            "olmoe",
            "rope scaling",
            |g| g.set("olmoe.rope.scaling.type", s("yarn")),
            "olmoe.rope.scaling.type",
        ),
        (
            "olmoe",
            "missing eps",
            |g| g.remove("olmoe.attention.layer_norm_rms_epsilon"),
            "olmoe.attention.layer_norm_rms_epsilon",
        ),
        (
            "qwen3moe",
            "per-layer heads",
            |g| {
                g.set(
                    "qwen3moe.attention.head_count",
                    V::Arr(4, vec![V::U32(2), V::U32(4)]),
                )
            },
            "qwen3moe.attention.head_count",
        ),
        (
            "qwen3moe",
            "top-k > experts",
            |g| g.set("qwen3moe.expert_used_count", V::U32(5)),
            "qwen3moe.expert_used_count",
        ),
        (
            "qwen2moe",
            "two shared experts",
            |g| g.set("qwen2moe.expert_shared_count", V::U32(2)),
            "qwen2moe.expert_shared_count",
        ),
        (
            "qwen3moe",
            "norm disagrees",
            |g| g.set("qwen3moe.expert_weights_norm", V::Bool(false)),
            "qwen3moe.expert_weights_norm",
        ),
        (
            "qwen3moe",
            "sigmoid gating",
            |g| g.set("qwen3moe.expert_gating_func", V::U32(2)),
            "qwen3moe.expert_gating_func",
        ),
        (
            "qwen3moe",
            "shape",
            |g| {
                g.tensors
                    .iter_mut()
                    .find(|t| t.name == "blk.1.ffn_up_exps.weight")
                    .unwrap()
                    .ne = vec![16, 8, 3]
            },
            "`blk.1.ffn_up_exps.weight`",
        ),
        (
            "qwen3moe",
            "missing tensor",
            |g| g.tensors.retain(|t| t.name != "blk.1.attn_k_norm.weight"),
            "`blk.1.attn_k_norm.weight`",
        ),
        (
            "qwen3moe",
            "extra tensor",
            |g| {
                g.tensors.push(gguf_writer::T {
                    name: "rope_freqs.weight".into(),
                    ne: vec![4],
                    type_id: 0,
                    data: vec![0; 16],
                    offset: None,
                })
            },
            "`rope_freqs.weight`",
        ),
        (
            "qwen3moe",
            "eos outside vocab",
            |g| g.set("tokenizer.ggml.eos_token_id", V::U32(99)),
            "eos_token_id",
        ),
        (
            "qwen3moe",
            "vocab_size",
            |g| g.set("qwen3moe.vocab_size", V::U32(13)),
            "qwen3moe.vocab_size",
        ),
    ];
    for (arch, what, edit, want) in cases {
        let mut g = tiny_model(arch);
        edit(&mut g);
        let p = dir.path().join("c.gguf");
        g.write(&p);
        let e = match GgufModel::open(&p).and_then(|m| model_config(&m)) {
            Ok(_) => panic!("{what}: accepted"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(want) && e.contains("c.gguf"), "{what}: {e}");
    }
}

#[test]
fn a_tied_lm_head_and_a_fused_gate_up_are_recognised() {
    let dir = TempDir::new().unwrap();
    let mut g = tiny_model("qwen3moe");
    g.tensors.retain(|t| t.name != "output.weight");
    for l in 0..2 {
        g.tensors.retain(|t| {
            t.name != format!("blk.{l}.ffn_gate_exps.weight")
                && t.name != format!("blk.{l}.ffn_up_exps.weight")
        });
        g = g.f32_tensor(&format!("blk.{l}.ffn_gate_up_exps.weight"), &[16, 16, 4]);
    }
    let p = dir.path().join("t.gguf");
    g.write(&p);
    let m = GgufModel::open(&p).unwrap();
    let cfg = model_config(&m).unwrap();
    assert!(cfg.tie_word_embeddings);
    let names = ModelTensors::resolve(&m, &cfg).unwrap();
    assert_eq!(names.lm_head(), "token_embd.weight");
    assert!(matches!(
        names.layers[0].experts,
        wgmoe::gguf::names::Experts::FusedGateUp { .. }
    ));
}

//! The GGUF fixtures made by llama.cpp (models/gguf/, tools/make_gguf_fixtures.py): each file
//! opens and validates, its metadata gives the ModelConfig the Hugging Face config of the same
//! model gives, the block types llama-quantize chose are there, the Q/K rows are in the order
//! the converter wrote, and the tokenizer in each file tokenizes as `llama-tokenize` did.

use std::path::{Path, PathBuf};

use serde_json::Value;
use wgmoe::config::{Arch, ModelConfig};
use wgmoe::gguf::{model_config, GgmlType, GgufModel, ModelTensors};

const FAMILIES: &[(&str, Arch)] = &[
    ("olmoe", Arch::Olmoe),
    ("qwen2moe", Arch::Qwen2Moe),
    ("qwen3moe", Arch::Qwen3Moe),
    ("mixtral", Arch::Mixtral),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gguf")
}

fn gguf_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    v.sort();
    v
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The fields of a ModelConfig that describe the computation (not the token ids, which GGUF
/// takes from the tokenizer rather than config.json, nor the source hash).
fn computation(c: &ModelConfig) -> ModelConfig {
    ModelConfig {
        bos_token_id: None,
        eos_token_ids: Vec::new(),
        source_hash: String::new(),
        expert_kinds: Vec::new(),
        gguf_dense_kinds: Vec::new(),
        ..c.clone()
    }
}

#[test]
fn every_fixture_gives_the_config_of_its_hf_model() {
    for &(family, arch) in FAMILIES {
        let dir = root().join(family);
        let hf = ModelConfig::from_dir(&dir).unwrap();
        assert_eq!(hf.arch, arch);
        let files = gguf_files(&dir);
        assert!(files.len() >= 4, "{family}: {files:?}");
        for f in files {
            let m = GgufModel::open(&f).unwrap_or_else(|e| panic!("{e}"));
            let cfg = model_config(&m).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(computation(&cfg), computation(&hf), "{}", f.display());
            // Experts in their own blocks, layer by layer: Q4_0 as affine INT4, the K-quants
            // as they are, Q8_0 and F16 as Q8_0; a Q4_K_M file's ffn_down is Q6_K on the
            // layers llama-quantize gives more bits, Q4_K on the others.
            use wgmoe::blocks::quant::Q4Kind::{Affine32, Q4K, Q5K, Q6K, Q8};
            let name = f.file_name().unwrap().to_string_lossy().to_string();
            for l in 0..cfg.num_layers {
                let down = m
                    .info(&format!("blk.{l}.ffn_down_exps.weight"))
                    .unwrap()
                    .ggml_type;
                let want = if name.contains("Q4_0") {
                    (Affine32, Affine32)
                } else if name.contains("_K_M") {
                    let gu = if name.contains("Q5_K_M") { Q5K } else { Q4K };
                    match down {
                        GgmlType::Q6_K => (gu, Q6K),
                        GgmlType::Q5_K => (gu, Q5K),
                        _ => (gu, Q4K),
                    }
                } else if name.contains("Q6_K") {
                    (Q6K, Q6K)
                } else {
                    (Q8, Q8)
                };
                let k = cfg.expert_kinds(l);
                assert_eq!((k.gate_up, k.down), want, "{name} layer {l} ({down} down)");
            }
            // The HF EOS is among the ids that end generation, as in llama.cpp.
            for id in &hf.eos_token_ids {
                assert!(cfg.eos_token_ids.contains(id), "{}: {:?}", f.display(), cfg);
            }
            ModelTensors::resolve(&m, &cfg).unwrap();
        }
    }
}

/// Types present in a file, with counts.
fn types(m: &GgufModel) -> std::collections::BTreeMap<GgmlType, usize> {
    let mut t = std::collections::BTreeMap::new();
    for n in m.names() {
        *t.entry(m.info(n).unwrap().ggml_type).or_default() += 1;
    }
    t
}

#[test]
fn llama_quantize_chose_the_block_types_of_each_scheme() {
    for &(family, _) in FAMILIES {
        let dir = root().join(family);
        let open = |q: &str| GgufModel::open(&dir.join(format!("{family}-{q}.gguf"))).unwrap();
        let q4km = open("Q4_K_M");
        let t = types(&q4km);
        assert!(
            t.contains_key(&GgmlType::Q4_K) && t.contains_key(&GgmlType::Q6_K),
            "{family}: {t:?}"
        );
        // Norms and the router stay F32; lm_head is Q6_K.
        assert_eq!(
            q4km.tensor("blk.0.ffn_gate_inp.weight").unwrap().ggml_type,
            GgmlType::F32
        );
        assert_eq!(
            q4km.tensor("output_norm.weight").unwrap().ggml_type,
            GgmlType::F32
        );
        assert_eq!(
            q4km.tensor("output.weight").unwrap().ggml_type,
            GgmlType::Q6_K
        );
        // use_more_bits: of 2 layers, the last gets Q6_K experts' down, the first Q4_K.
        assert_eq!(
            q4km.tensor("blk.0.ffn_down_exps.weight").unwrap().ggml_type,
            GgmlType::Q4_K
        );
        assert_eq!(
            q4km.tensor("blk.1.ffn_down_exps.weight").unwrap().ggml_type,
            GgmlType::Q6_K
        );
        let t = types(&open("Q6_K"));
        assert!(t.contains_key(&GgmlType::Q6_K), "{family}: {t:?}");
        let t = types(&open("Q8_0"));
        assert!(t.contains_key(&GgmlType::Q8_0), "{family}: {t:?}");
        let q4 = open("Q4_0");
        assert_eq!(
            q4.tensor("blk.0.ffn_up_exps.weight").unwrap().ggml_type,
            GgmlType::Q4_0
        );
    }
    let q5 = GgufModel::open(&root().join("qwen3moe/qwen3moe-Q5_K_M.gguf")).unwrap();
    assert!(types(&q5).contains_key(&GgmlType::Q5_K));
    // Every tensor of every fixture dequantises (the CPU references cover what llama.cpp wrote).
    for &(family, _) in FAMILIES {
        for f in gguf_files(&root().join(family)) {
            let m = GgufModel::open(&f).unwrap();
            for n in m.names() {
                let v = m.tensor(n).unwrap().to_f32().unwrap();
                assert!(v.iter().all(|x| x.is_finite()), "{}: {n}", f.display());
            }
        }
    }
}

/// Layer 0's q/k rows in the f16 files against the HF checkpoint's (models/gguf/*/hf_qk.json):
/// Mixtral's are permuted by the converter and `unpermute_rows` restores them; Qwen3-MoE's are
/// not permuted.
#[test]
fn qk_rows_are_in_the_order_the_converter_wrote() {
    for (family, permuted) in [("mixtral", true), ("qwen3moe", false)] {
        let dir = root().join(family);
        let m = GgufModel::open(&dir.join(format!("{family}-F16.gguf"))).unwrap();
        let cfg = model_config(&m).unwrap();
        let hf = json(&dir.join("hf_qk.json"));
        for (proj, tensor) in [
            ("q_proj", "blk.0.attn_q.weight"),
            ("k_proj", "blk.0.attn_k.weight"),
        ] {
            let t = m.tensor(tensor).unwrap();
            assert_eq!(t.ggml_type, GgmlType::F16);
            let bytes = if permuted {
                wgmoe::gguf::permute::unpermute_rows(t.data, t.row_bytes() as usize, cfg.head_dim)
                    .unwrap()
            } else {
                t.data.to_vec()
            };
            let vals = wgmoe::gguf::dequant::dequantize(GgmlType::F16, &bytes).unwrap();
            let cols = t.cols() as usize;
            let rows = hf[proj]["rows"].as_array().unwrap();
            assert_eq!(rows.len() as u64, t.rows());
            let mut direct_equal = true;
            for (r, row) in rows.iter().enumerate() {
                for (c, v) in row.as_array().unwrap().iter().enumerate() {
                    let want = v.as_f64().unwrap() as f32;
                    assert_eq!(vals[r * cols + c], want, "{family} {proj} row {r} col {c}");
                    let raw = wgmoe::gguf::dequant::dequantize(
                        GgmlType::F16,
                        &t.data[(r * cols + c) * 2..(r * cols + c) * 2 + 2],
                    )
                    .unwrap()[0];
                    direct_equal &= raw == want;
                }
            }
            // The file's own order is the HF order exactly when it is not permuted.
            assert_eq!(direct_equal, !permuted, "{family} {proj}");
        }
    }
}

fn check_ids(tok: &wgmoe::tokenizer::Tokenizer, text: &str, want: &Value, bos: bool, what: &str) {
    let want: Vec<u32> = want
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let got = tok.encode(text, bos).unwrap();
    // The one deliberate difference: text that starts with the BOS token gets no second BOS
    // from wgmoe (tokenizer.rs, as for checkpoints); llama.cpp adds one and warns.
    let bos_id = tok.bos_token_id();
    if bos
        && tok.add_bos_token() == Some(true)
        && want.len() >= 2
        && bos_id.is_some()
        && want[..2] == [bos_id.unwrap(); 2]
    {
        assert_eq!(
            got,
            want[1..],
            "{what}: {text:?} (bos {bos}, text starts with BOS)"
        );
        return;
    }
    assert_eq!(got, want, "{what}: {text:?} (bos {bos})");
}

#[test]
fn tokenizers_in_the_files_tokenize_as_llama_tokenize() {
    let dir = root().join("tokenizers");
    let mut names = Vec::new();
    for f in gguf_files(&dir) {
        let name = f.file_stem().unwrap().to_string_lossy().to_string();
        let golden = json(&dir.join(format!("{name}.json")));
        let m = GgufModel::open(&f).unwrap();
        let tok = wgmoe::gguf::tokenizer::tokenizer(&m).unwrap_or_else(|e| panic!("{name}: {e}"));
        let cases = golden["cases"].as_array().unwrap();
        assert!(cases.len() >= 15);
        for c in cases {
            let text = c["text"].as_str().unwrap();
            check_ids(&tok, text, &c["ids"], true, &name);
            check_ids(&tok, text, &c["ids_no_bos"], false, &name);
        }
        // Decoding gives the text back for ordinary strings.
        let ids = tok.encode("Hello, world! 123", false).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), "Hello, world! 123", "{name}");
        names.push(name);
    }
    for want in [
        "default",
        "gpt2",
        "llama-spm",
        "llama-spm512",
        "olmo",
        "qwen2",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
    }
}

#[test]
fn model_fixtures_tokenize_their_prompts_and_render_their_templates() {
    for &(family, _) in FAMILIES {
        let dir = root().join(family);
        let goldens = json(&dir.join("goldens.json"));
        let texts = goldens["prompt_texts"].as_array().unwrap();
        for f in gguf_files(&dir) {
            let file = f.file_name().unwrap().to_string_lossy().to_string();
            let runs = goldens["files"][&file]
                .as_array()
                .unwrap_or_else(|| panic!("{file}: no goldens"));
            let m = GgufModel::open(&f).unwrap();
            let cfg = model_config(&m).unwrap();
            let tok = wgmoe::gguf::tokenizer::tokenizer(&m).unwrap();
            assert_eq!(runs.len(), texts.len());
            for (run, text) in runs.iter().zip(texts) {
                check_ids(&tok, text.as_str().unwrap(), &run["prompt"], true, &file);
                let toks = run["tokens"].as_array().unwrap();
                assert_eq!(toks.len(), 8);
                assert!(toks
                    .iter()
                    .all(|t| (t.as_u64().unwrap() as usize) < cfg.vocab_size));
            }
            let msgs = vec![("user".to_string(), "Hi".to_string())];
            let chat = tok.apply_chat_template(&msgs, true).unwrap();
            assert!(chat.contains("Hi"), "{file}: {chat:?}");
        }
    }
}

#[test]
fn inspect_lists_types_per_class() {
    let m = GgufModel::open(&root().join("qwen2moe/qwen2moe-Q4_K_M.gguf")).unwrap();
    let i = wgmoe::insight::inspect::inspect_gguf(&m);
    use wgmoe::insight::inspect::TensorClass as C;
    let experts = &i.classes[&C::RoutedExperts];
    assert_eq!(experts.tensors, 6);
    assert_eq!(experts.types.values().sum::<usize>(), 6);
    assert!(experts.types.contains_key("q6_K") && experts.types.contains_key("q4_K"));
    assert_eq!(i.classes[&C::SharedExperts].tensors, 8);
    assert_eq!(i.classes[&C::Router].types["f32"], 2);
    assert_eq!(i.classes[&C::LmHead].types["q6_K"], 1);
    let total: u64 = i.classes.values().map(|c| c.bytes).sum();
    assert_eq!(total, i.tensor_bytes);
    assert!(i.tensor_bytes < i.file_bytes);
    let table = wgmoe::insight::inspect::gguf_table(&i);
    assert!(
        table.contains("routed_experts") && table.contains("q6_K x"),
        "{table}"
    );
}

#[test]
fn wgmoe_inspect_prints_a_gguf_files_classes_and_types() {
    let f = root().join("mixtral/mixtral-Q4_K_M.gguf");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wgmoe"))
        .arg("inspect")
        .arg(&f)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("Mixtral, 2 layers, hidden 256, 3 experts top-2"),
        "{text}"
    );
    assert!(
        text.contains("routed_experts") && text.contains("q4_K x") && text.contains("q6_K x"),
        "{text}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wgmoe"))
        .args(["inspect", "--json"])
        .arg(&f)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["loadable"], true);
    assert_eq!(v["classes"]["lm_head"]["types"]["q6_K"], 1);
}

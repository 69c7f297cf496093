//! `wgmoe synth --format gguf`: a synthetic model as one GGUF file in a llama-quantize
//! scheme's block types. The file is read back by wgmoe's GGUF reader as the shape asked
//! for, holds the types llama-quantize gives that scheme (its Q6_K layers included), and
//! runs: every family, the schemes, fallbacks for rows that are not whole super-blocks.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::cli::{assert_error, assert_ok, json_of, wgmoe};
use wgmoe::gguf::{GgmlType, GgufModel};

fn synth(arch: &str, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "synth",
        "--arch",
        arch,
        "--format",
        "gguf",
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    assert_ok(&wgmoe(args));
}

fn types(m: &GgufModel, filter: impl Fn(&str) -> bool) -> BTreeMap<GgmlType, usize> {
    let mut t = BTreeMap::new();
    for n in m.names().filter(|n| filter(n)) {
        *t.entry(m.info(n).unwrap().ggml_type).or_default() += 1;
    }
    t
}

/// `wgmoe run DIR --prompt-ids 1,2,3 -n N --json`: n tokens generated; the run too.
fn run_ids(dir: &Path, n: usize) -> (common::cli::Run, serde_json::Value) {
    let r = wgmoe([
        "run",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "-n",
        &n.to_string(),
        "--json",
        "--ignore-eos",
    ]);
    let v = json_of(&r);
    assert_eq!(v["generated_ids"].as_array().map(Vec::len), Some(n), "{v}");
    (r, v)
}

/// Q4_K_M on 8 layers of an OLMoE shape: the file reads back as the shape, its ffn_down
/// and attn_v are Q6_K on layers 0, 3, 6 and 7 (llama-quantize's use_more_bits) and Q4_K
/// elsewhere, output Q6_K; it runs with every matrix held in its own blocks, and the same
/// seed gives the same bytes.
#[test]
fn a_q4_k_m_file_reads_back_and_runs() {
    common::init_env();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("olmoe");
    let shape = [
        "--hidden",
        "256",
        "--layers",
        "8",
        "--heads",
        "4",
        "--experts",
        "6",
        "--top-k",
        "2",
        "--expert-intermediate",
        "256",
        "--vocab",
        "600",
    ];
    synth("olmoe-1b-7b", &dir, &shape);
    let m = GgufModel::open(&dir.join("model.gguf")).unwrap();
    let cfg = wgmoe::gguf::model_config(&m).unwrap();
    assert_eq!(
        (
            cfg.hidden_size,
            cfg.num_layers,
            cfg.num_experts,
            cfg.top_k,
            cfg.moe_intermediate,
            cfg.vocab_size
        ),
        (256, 8, 6, 2, 256, 600)
    );
    let down_q6: Vec<usize> = (0..8)
        .filter(|l| {
            m.info(&format!("blk.{l}.ffn_down_exps.weight"))
                .unwrap()
                .ggml_type
                == GgmlType::Q6_K
        })
        .collect();
    assert_eq!(down_q6, [0, 3, 6, 7]);
    for l in 0..8 {
        let v = m.info(&format!("blk.{l}.attn_v.weight")).unwrap().ggml_type;
        assert_eq!(v == GgmlType::Q6_K, down_q6.contains(&l), "layer {l}: {v}");
        let k = cfg.expert_kinds(l);
        use wgmoe::blocks::quant::Q4Kind;
        assert_eq!(k.gate_up, Q4Kind::Q4K);
        assert_eq!(k.down == Q4Kind::Q6K, down_q6.contains(&l));
    }
    assert_eq!(m.info("output.weight").unwrap().ggml_type, GgmlType::Q6_K);
    assert_eq!(
        m.info("token_embd.weight").unwrap().ggml_type,
        GgmlType::Q4_K
    );
    assert_eq!(
        types(&m, |n| n.ends_with("norm.weight")
            || n.contains("ffn_gate_inp"))
        .keys()
        .collect::<Vec<_>>(),
        [&GgmlType::F32]
    );
    let (r, _) = run_ids(&dir, 4);
    // Only the embedding table changes form (the lookup reads f16 rows).
    assert!(
        r.stderr
            .contains("converted at load time: embeddings q4_K x1 -> f16 ("),
        "{r}"
    );
    // Deterministic in the seed; another seed, other bytes.
    let again = tmp.path().join("again");
    synth("olmoe-1b-7b", &again, &shape);
    let a = std::fs::read(dir.join("model.gguf")).unwrap();
    assert!(a == std::fs::read(again.join("model.gguf")).unwrap());
    let other = tmp.path().join("other");
    let mut seeded = shape.to_vec();
    seeded.extend(["--seed", "7"]);
    synth("olmoe-1b-7b", &other, &seeded);
    assert!(a != std::fs::read(other.join("model.gguf")).unwrap());
    // Its tokenizer is the file's: one token per byte for text.
    let r = wgmoe([
        "run",
        dir.to_str().unwrap(),
        "-p",
        "Hi!",
        "-n",
        "2",
        "--json",
    ]);
    let v = json_of(&r);
    assert_eq!(v["prompt_ids"].as_array().map(Vec::len), Some(3), "{v}");
}

/// The other families and schemes run; an 8-expert (Mixtral) Q4_K_M file has Q8_0 attn_k
/// and attn_v and a Q5_K attn_output; expert rows of 96 columns (not whole super-blocks)
/// fall back to Q5_0 (Q4_K) and Q8_0 (Q6_K), as llama-quantize's do.
#[test]
fn every_family_and_scheme_runs() {
    common::init_env();
    let tmp = tempfile::tempdir().unwrap();
    let small = |extra: &[&'static str]| {
        let mut v = vec![
            "--hidden", "256", "--layers", "2", "--heads", "4", "--vocab", "400",
        ];
        v.extend_from_slice(extra);
        v
    };
    let cases: [(&str, Vec<&str>, &str); 5] = [
        (
            "qwen1.5-moe-a2.7b",
            small(&[
                "--experts",
                "5",
                "--top-k",
                "2",
                "--expert-intermediate",
                "96",
                "--shared-expert-intermediate",
                "256",
            ]),
            "q4_k_m",
        ),
        (
            "qwen3-30b-a3b",
            small(&[
                "--kv-heads",
                "2",
                "--head-dim",
                "64",
                "--experts",
                "7",
                "--top-k",
                "3",
                "--expert-intermediate",
                "256",
            ]),
            "q5_k_m",
        ),
        (
            "mixtral-8x7b",
            small(&[
                "--kv-heads",
                "2",
                "--experts",
                "8",
                "--top-k",
                "2",
                "--expert-intermediate",
                "256",
            ]),
            "q4_k_m",
        ),
        (
            "olmoe-1b-7b",
            small(&[
                "--experts",
                "4",
                "--top-k",
                "2",
                "--expert-intermediate",
                "256",
            ]),
            "q8_0",
        ),
        (
            "qwen3-30b-a3b",
            small(&[
                "--kv-heads",
                "1",
                "--head-dim",
                "64",
                "--experts",
                "4",
                "--top-k",
                "2",
                "--expert-intermediate",
                "256",
            ]),
            "q4_0",
        ),
    ];
    for (i, (arch, shape, scheme)) in cases.iter().enumerate() {
        let dir = tmp.path().join(format!("m{i}"));
        let mut args = shape.clone();
        args.extend(["--gguf-type", scheme]);
        synth(arch, &dir, &args);
        let m = GgufModel::open(&dir.join("model.gguf")).unwrap();
        let cfg = wgmoe::gguf::model_config(&m).unwrap_or_else(|e| panic!("{arch} {scheme}: {e}"));
        assert_eq!(cfg.hidden_size, 256);
        let ty = |n: &str| m.info(n).unwrap().ggml_type;
        match (*arch, *scheme) {
            ("qwen1.5-moe-a2.7b", _) => {
                // Layer 0 and 1 of 2 both get more bits; rows of 96 fall back.
                assert_eq!(ty("blk.1.ffn_down_exps.weight"), GgmlType::Q8_0);
                assert_eq!(ty("blk.1.ffn_gate_exps.weight"), GgmlType::Q4_K);
                assert_eq!(ty("blk.1.ffn_down_shexp.weight"), GgmlType::Q6_K);
                assert_eq!(cfg.shared_expert_intermediate, Some(256));
            }
            ("mixtral-8x7b", _) => {
                assert_eq!(ty("blk.0.attn_k.weight"), GgmlType::Q8_0);
                assert_eq!(ty("blk.0.attn_v.weight"), GgmlType::Q8_0);
                assert_eq!(ty("blk.0.attn_output.weight"), GgmlType::Q5_K);
                assert_eq!(
                    m.metadata().req_str("general.architecture").unwrap(),
                    "llama"
                );
            }
            (_, "q5_k_m") => assert_eq!(ty("blk.0.ffn_gate_exps.weight"), GgmlType::Q5_K),
            (_, "q8_0") => assert_eq!(ty("output.weight"), GgmlType::Q8_0),
            (_, "q4_0") => {
                assert_eq!(ty("blk.0.ffn_down_exps.weight"), GgmlType::Q4_0);
                assert_eq!(ty("output.weight"), GgmlType::Q6_K);
            }
            _ => {}
        }
        run_ids(&dir, 3);
    }
}

/// A vocabulary too small for the 256 byte symbols is refused, naming the option.
#[test]
fn a_vocabulary_without_room_for_the_bytes_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    let r = wgmoe([
        "synth",
        "--arch",
        "olmoe-1b-7b",
        "--format",
        "gguf",
        "-o",
        dir.to_str().unwrap(),
        "--hidden",
        "256",
        "--layers",
        "1",
        "--heads",
        "4",
        "--experts",
        "4",
        "--top-k",
        "2",
        "--expert-intermediate",
        "256",
        "--vocab",
        "200",
    ]);
    assert_error(&r, &["--vocab", "256 byte symbols"]);
}

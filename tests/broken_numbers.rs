//! Never run silently on broken numbers: a NaN or infinite weight, a finite bf16 weight
//! beyond the f16 range, an INT4 block whose scale would overflow, a converted file with a
//! non-finite scale are refused by every command that converts them, naming the tensor,
//! the element and the value; and at run time a non-finite logits row is an error naming
//! the step, never a token (greedy: `argmax.wgsl` flags the row; sampling: the host checks
//! the row it reads back).

mod common;

use std::path::{Path, PathBuf};

use common::cli::*;
use serde_json::Value;

/// The shard of a sharded fixture that holds `tensor`.
fn shard_of(dir: &Path, tensor: &str) -> PathBuf {
    let index: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    dir.join(index["weight_map"][tensor].as_str().unwrap())
}

/// Every command that reads the weights refuses the model, naming `words`; the model is
/// untouched and quantize leaves no output directory.
fn refused_everywhere(dir: &Path, words: &[&str]) {
    let d = s(dir);
    let out = dir.parent().unwrap().join("converted");
    let o = s(&out);
    for args in [
        vec!["run", &d, "--prompt-ids", "1,2", "-n", "2"],
        vec![
            "run",
            &d,
            "--prompt-ids",
            "1,2",
            "-n",
            "2",
            "--temperature",
            "0.7",
        ],
        vec![
            "run",
            &d,
            "--prompt-ids",
            "1,2",
            "-n",
            "2",
            "--resident-experts",
            "4",
        ],
        vec![
            "run",
            &d,
            "--prompt-ids",
            "1,2",
            "-n",
            "2",
            "--expert-precision",
            "f16",
        ],
        vec!["eval", &d, "--prompt-ids", "1,2", "-n", "2"],
        vec!["bench", &d, "--prompts", "1", "--blocks", "1", "-n", "2"],
        vec!["quantize", &d, "-o", &o],
    ] {
        let r = run_untouched(dir, &args);
        assert_error(&r, words);
        assert!(!out.exists(), "quantize left {}", out.display());
    }
}

#[test]
fn non_finite_weights_are_refused() {
    // A norm weight (dense, f16 on the GPU) and an expert matrix (INT4 or f16).
    for (tensor, index, value, shown) in [
        (
            "model.layers.1.post_attention_layernorm.weight",
            7,
            f32::NAN,
            "NaN",
        ),
        (
            "model.layers.0.mlp.experts.2.up_proj.weight",
            100,
            f32::INFINITY,
            "inf",
        ),
        ("model.norm.weight", 0, f32::NEG_INFINITY, "-inf"),
    ] {
        let (_t, dir) = copy_fixture(OLMOE);
        set_element(&dir.join("model.safetensors"), tensor, index, value);
        refused_everywhere(
            &dir,
            &[tensor, &format!("element {index} "), shown, "non-finite"],
        );
    }
    // In a shard of the sharded fixture.
    let (_t, dir) = copy_fixture(QWEN);
    let tensor = "model.layers.1.mlp.experts.3.down_proj.weight";
    set_element(&shard_of(&dir, tensor), tensor, 321, f32::NAN);
    refused_everywhere(&dir, &[tensor, "element 321 ", "NaN"]);
}

#[test]
fn weights_beyond_f16_are_refused_never_made_inf() {
    // 999424 is a valid bf16 norm weight; as f16 it would be +inf.
    let (_t, dir) = copy_fixture(OLMOE);
    let norm = "model.layers.0.input_layernorm.weight";
    set_element(&dir.join("model.safetensors"), norm, 3, 999424.0);
    refused_everywhere(
        &dir,
        &[norm, "element 3 ", "999424", "outside the f16 range"],
    );

    // An expert weight of 10^5: fine as INT4 (its block scale 10^5 / 7 fits f16), refused
    // as an f16 expert.
    let (_t, dir) = copy_fixture(OLMOE);
    let expert = "model.layers.1.mlp.experts.5.gate_proj.weight";
    set_element(&dir.join("model.safetensors"), expert, 10, 100000.0);
    let d = s(&dir);
    json_of(&wgmoe([
        "run",
        &d,
        "--prompt-ids",
        "1,2",
        "-n",
        "2",
        "--json",
    ]));
    let r = run_untouched(
        &dir,
        &[
            "run",
            &d,
            "--prompt-ids",
            "1,2",
            "-n",
            "2",
            "--expert-precision",
            "f16",
        ],
    );
    assert_error(&r, &[expert, "element 10 ", "outside the f16 range"]);
    let out = dir.parent().unwrap().join("converted");
    assert_ok(&wgmoe(["quantize", &d, "-o", &s(&out)]));

    // 10^7: its INT4 block's f16 scale would be infinite.
    let (_t, dir) = copy_fixture(OLMOE);
    set_element(&dir.join("model.safetensors"), expert, 10, 1.0e7);
    let d = s(&dir);
    for args in [
        vec!["run", &d, "--prompt-ids", "1,2", "-n", "2"],
        vec!["quantize", &d, "-o", &s(&dir.parent().unwrap().join("c2"))],
    ] {
        let r = run_untouched(&dir, &args);
        assert_error(&r, &[expert, "element 10 ", "INT4 block", "f16 scale"]);
    }
}

/// Overwrite bytes of a tensor of a converted model.safetensors, then recompute the layer
/// checksums the header records (as anyone can), keeping the header's length.
fn poke_converted(path: &Path, tensor: &str, at: usize, bytes: &[u8]) {
    let mut file = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&file[8..8 + n]).unwrap();
    let start = 8 + n + header[tensor]["data_offsets"][0].as_u64().unwrap() as usize;
    file[start + at..start + at + bytes.len()].copy_from_slice(bytes);
    let old: Vec<String> = serde_json::from_str(
        header["__metadata__"]["wgmoe.expert_checksums"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let mut text = String::from_utf8(file[8..8 + n].to_vec()).unwrap();
    for (l, sum) in old.iter().enumerate() {
        let name = format!("model.layers.{l}.mlp.experts.int4");
        let r = &header[&name]["data_offsets"];
        let (a, b) = (
            r[0].as_u64().unwrap() as usize,
            r[1].as_u64().unwrap() as usize,
        );
        let new = format!(
            "{:016x}",
            wgmoe::format::convert::fast_hash(&file[8 + n + a..8 + n + b])
        );
        text = text.replace(sum.as_str(), &new);
    }
    assert_eq!(text.len(), n);
    file[8..8 + n].copy_from_slice(text.as_bytes());
    std::fs::write(path, file).unwrap();
}

#[test]
fn converted_models_with_broken_numbers_are_refused() {
    let (t, src) = copy_fixture(OLMOE);
    let conv = t.path().join("conv");
    assert_ok(&wgmoe([
        "quantize",
        &s(&src),
        "-o",
        &s(&conv),
        "--dense-precision",
        "f16",
    ]));
    let layout = wgmoe::blocks::quant::Q4SlotLayout::new(64, 96);
    let file = conv.join("model.safetensors");
    let good = std::fs::read(&file).unwrap();
    // An infinite scale of expert 1 of layer 1 (with a checksum that matches).
    let tensor = "model.layers.1.mlp.experts.int4";
    poke_converted(&file, tensor, layout.bytes + layout.up_s + 2, &[0x00, 0x7C]);
    let r = run_untouched(&conv, &["run", &s(&conv), "--prompt-ids", "1,2", "-n", "2"]);
    assert_error(&r, &[tensor, "expert 1", "f16 scale of inf"]);
    // A NaN in an f16 tensor of the converted file.
    std::fs::write(&file, &good).unwrap();
    set_element(&file, "model.layers.0.self_attn.k_proj.weight", 9, f32::NAN);
    let r = run_untouched(&conv, &["run", &s(&conv), "--prompt-ids", "1,2", "-n", "2"]);
    assert_error(
        &r,
        &[
            "model.layers.0.self_attn.k_proj.weight",
            "element 9 ",
            "NaN",
        ],
    );

    // An infinite Q8_0 scale in a dense weight of a Q8_0 conversion (row 1, block 1 of
    // k_proj's [kv_dim, 64]: two blocks of 34 bytes per row).
    let q8 = t.path().join("q8");
    assert_ok(&wgmoe(["quantize", &s(&src), "-o", &s(&q8)]));
    let file = q8.join("model.safetensors");
    let tensor = "model.layers.0.self_attn.k_proj.weight";
    poke_converted(&file, tensor, 3 * 34, &[0x00, 0x7C]);
    let r = run_untouched(&q8, &["run", &s(&q8), "--prompt-ids", "1,2", "-n", "2"]);
    assert_error(&r, &[tensor, "block 1 of row 1", "f16 scale of inf"]);

    // 10^7 in a dense weight: its Q8_0 block's f16 scale (max|w| / 127) would be infinite.
    let (t, src) = copy_fixture(OLMOE);
    set_element(&src.join("model.safetensors"), tensor, 70, 1.0e7);
    let out = t.path().join("q8");
    let r = run_untouched(&src, &["quantize", &s(&src), "-o", &s(&out)]);
    assert_error(&r, &[tensor, "element [1, 6]", "Q8_0"]);
    assert!(!out.join("model.safetensors").exists(), "{r}");
}

mod runtime {
    //! Numbers that break down while running (not in the weights): here NaNs written into
    //! the final norm's GPU buffer of a loaded model, before the first step or between
    //! decode steps.
    use super::common;
    use wgmoe::runtime::engine::{Engine, EngineOptions, ExpertPrecision};
    use wgmoe::runtime::generate::{generate, prompt_logits, GenerateOptions};
    use wgmoe::runtime::sampling::SamplingOptions;

    fn engine() -> Engine {
        common::init_env();
        Engine::load(
            &common::fixture("olmoe-tiny"),
            &EngineOptions {
                residency: Default::default(),
                adapter: Default::default(),
                kernels: Default::default(),
                expert_precision: ExpertPrecision::Int4,
                dense_precision: wgmoe::runtime::engine::DensePrecision::F16,
                kv_precision: wgmoe::runtime::engine::KvPrecision::F32,
                executor: wgmoe::model::Executor::Grouped,
                max_context: 32,
                prefill_chunk: 64,
                all_logits: true,
                score_rows: 0,
                batch: 1,
            },
        )
        .expect("load the fixture")
    }

    fn opts(sampled: bool) -> GenerateOptions {
        GenerateOptions {
            max_new_tokens: 8,
            sampling: if sampled {
                SamplingOptions {
                    temperature: 0.8,
                    top_k: 0,
                    top_p: 1.0,
                    seed: 5,
                }
            } else {
                SamplingOptions::greedy()
            },
            eos_ids: vec![],
            ignore_eos: true,
            record_logits: false,
            pipeline_depth: wgmoe::runtime::generate::DEFAULT_PIPELINE_DEPTH,
        }
    }

    const NAN_F16: [u8; 2] = [0x00, 0x7E];

    #[test]
    fn non_finite_logits_are_an_error_naming_the_step() {
        let mut e = engine();
        let norm = e.fwd.weights.final_norm.clone();
        let dev = e.dev.clone();
        let ckpt =
            wgmoe::format::checkpoint::Checkpoint::open(&common::fixture("olmoe-tiny")).unwrap();
        let good: Vec<u8> = ckpt
            .read_f16("model.norm.weight", &[64])
            .unwrap()
            .iter()
            .flat_map(|h| h.to_le_bytes())
            .collect();
        let nan = NAN_F16.repeat(64);
        let prompt = [1u32, 2, 3];
        for sampled in [false, true] {
            // Broken before the first token: the prefill step.
            dev.write(&norm, 0, &nan).unwrap();
            let err = generate(&mut e.fwd, &prompt, &opts(sampled), &mut |_| Ok(()))
                .expect_err("NaN logits must not give a token")
                .to_string();
            assert!(
                err.contains("non-finite logits")
                    && err.contains("prefill step")
                    && err.contains("position 2"),
                "sampled {sampled}: {err}"
            );
            // Broken after the second token is read. The steps already in flight then ran
            // on good weights (a sampled run is at depth 1): at depth d the first broken
            // step is decode step d + 1, and no token comes from it or after it.
            for depth in [1usize, 2, 4] {
                dev.write(&norm, 0, &good).unwrap();
                let mut o = opts(sampled);
                o.pipeline_depth = depth;
                let d = if sampled { 1 } else { depth };
                let mut seen = Vec::new();
                let err = generate(&mut e.fwd, &prompt, &o, &mut |id| {
                    seen.push(id);
                    if seen.len() == 2 {
                        dev.write(&norm, 0, &nan).unwrap();
                    }
                    Ok(())
                })
                .expect_err("NaN logits must not give a token")
                .to_string();
                assert_eq!(
                    seen.len(),
                    d + 1,
                    "sampled {sampled}, depth {depth}: no token after the NaNs"
                );
                let (step, pos) = (d + 1, prompt.len() + d);
                assert!(
                    err.contains(&format!("decode step {step}"))
                        && err.contains(&format!("position {pos}")),
                    "sampled {sampled}, depth {depth}: {err}"
                );
            }
            // And the teacher-forced logits `eval` reads.
            let err = prompt_logits(&mut e.fwd, &prompt)
                .expect_err("NaN rows")
                .to_string();
            assert!(err.contains("prompt position 0"), "{err}");
            // Repaired, the same engine generates again (the flag is per step).
            dev.write(&norm, 0, &good).unwrap();
            let g = generate(&mut e.fwd, &prompt, &opts(sampled), &mut |_| Ok(())).unwrap();
            assert_eq!(g.generated_ids.len(), 8);
        }
    }
}

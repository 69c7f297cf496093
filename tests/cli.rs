//! End-to-end tests of the `wgmoe` binary: every bad input must end in one `error: ` line
//! that names what is at fault (file, tensor, config field or option), a non-zero exit, no
//! panic, and untouched model files; good input must produce consistent output.
//!
//! Every test works on copies of the fixtures in a temporary directory.

mod common;

use std::io::Read;
use std::process::Stdio;

use common::cli::*;
use serde_json::Value;

// ---------------------------------------------------------------------------------------
// Bad input: model directory, config, weights, tokenizer
// ---------------------------------------------------------------------------------------

#[test]
fn model_dir_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("no-such-model");
    let r = run_untouched(tmp.path(), &["run", &s(&dir), "-p", "hi", "-n", "2"]);
    assert_error(&r, &["no-such-model"]);
    assert!(!dir.exists(), "the missing model directory was created");
    for sub in ["inspect", "quantize"] {
        let mut args = vec![sub.to_string(), s(&dir)];
        if sub == "quantize" {
            args.extend(["-o".into(), s(&tmp.path().join("out"))]);
        }
        let r = run_untouched(tmp.path(), &args);
        assert_error(&r, &["no-such-model"]);
    }
}

#[test]
fn config_missing() {
    let (_t, dir) = copy_fixture(OLMOE);
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let r = run_untouched(&dir, &["run", &s(&dir), "-p", "hi", "-n", "2"]);
    assert_error(&r, &["config.json"]);
}

#[test]
fn config_malformed() {
    let (_t, dir) = copy_fixture(OLMOE);
    std::fs::write(dir.join("config.json"), "{\"model_type\": \"olmoe\",\n").unwrap();
    let r = run_untouched(&dir, &["run", &s(&dir), "-p", "hi", "-n", "2"]);
    assert_error(&r, &["config.json"]);
}

#[test]
fn config_missing_required_field() {
    let (_t, dir) = copy_fixture(OLMOE);
    edit_config(&dir, |c| {
        c.remove("hidden_size");
    });
    let r = run_untouched(&dir, &["run", &s(&dir), "-p", "hi", "-n", "2"]);
    assert_error(&r, &["config.json", "hidden_size"]);
}

#[test]
fn config_unknown_model_type() {
    let (_t, dir) = copy_fixture(OLMOE);
    edit_config(&dir, |c| {
        c.insert("model_type".into(), Value::String("mixtral_9000".into()));
    });
    let r = run_untouched(&dir, &["run", &s(&dir), "-p", "hi", "-n", "2"]);
    assert_error(&r, &["config.json", "model_type", "mixtral_9000"]);
}

#[test]
fn safetensors_shard_missing() {
    let (_t, dir) = copy_fixture(QWEN);
    std::fs::remove_file(dir.join("model-00002-of-00003.safetensors")).unwrap();
    let r = run_untouched(&dir, &["run", &s(&dir), "-p", "hi", "-n", "2"]);
    assert_error(&r, &["model-00002-of-00003.safetensors"]);
}

#[test]
fn safetensors_truncated() {
    // Cut in the data section, and inside the 8-byte header length.
    for (fixture, file) in [
        (OLMOE, "model.safetensors"),
        (QWEN, "model-00003-of-00003.safetensors"),
    ] {
        for cut in [None, Some(4u64)] {
            let (_t, dir) = copy_fixture(fixture);
            let p = dir.join(file);
            let len = std::fs::metadata(&p).unwrap().len();
            let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            f.set_len(cut.unwrap_or(len / 2)).unwrap();
            drop(f);
            let r = run_untouched(&dir, &["run", &s(&dir), "-p", "hi", "-n", "2"]);
            assert_error(&r, &[file]);
        }
    }
}

#[test]
fn safetensors_corrupt_header() {
    // Header length 2^64-1 (absurd) and 0 (empty JSON).
    for fill in [0xffu8, 0x00] {
        let (_t, dir) = copy_fixture(OLMOE);
        let p = dir.join("model.safetensors");
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[..8].fill(fill);
        std::fs::write(&p, bytes).unwrap();
        let r = run_untouched(&dir, &["run", &s(&dir), "-p", "hi", "-n", "2"]);
        assert_error(&r, &["model.safetensors"]);
    }
}

#[test]
fn safetensors_tensor_missing() {
    let (_t, dir) = copy_fixture(OLMOE);
    let victim = "model.layers.1.self_attn.q_proj.weight";
    rewrite_safetensors(&dir.join("model.safetensors"), |n, sh| {
        (n != victim).then(|| sh.to_vec())
    });
    let r = run_untouched(&dir, &["run", &s(&dir), "-p", "hi", "-n", "2"]);
    assert_error(&r, &[victim]);
}

#[test]
fn safetensors_tensor_missing_expert() {
    let (_t, dir) = copy_fixture(OLMOE);
    let victim = "model.layers.0.mlp.experts.3.up_proj.weight";
    rewrite_safetensors(&dir.join("model.safetensors"), |n, sh| {
        (n != victim).then(|| sh.to_vec())
    });
    for precision in ["int4", "f16"] {
        let r = run_untouched(
            &dir,
            &[
                "run",
                &s(&dir),
                "-p",
                "hi",
                "-n",
                "2",
                "--expert-precision",
                precision,
            ],
        );
        assert_error(&r, &[victim]);
    }
}

#[test]
fn safetensors_tensor_wrong_shape() {
    let (_t, dir) = copy_fixture(OLMOE);
    let victim = "model.layers.0.self_attn.k_proj.weight";
    rewrite_safetensors(&dir.join("model.safetensors"), |n, sh| {
        Some(if n == victim {
            sh.iter().rev().copied().collect()
        } else {
            sh.to_vec()
        })
    });
    let r = run_untouched(&dir, &["run", &s(&dir), "-p", "hi", "-n", "2"]);
    assert_error(&r, &[victim]);
}

#[test]
fn tokenizer_garbage() {
    let (_t, dir) = copy_fixture(OLMOE);
    std::fs::write(
        dir.join("tokenizer.json"),
        b"\x00garbage{{{ not a tokenizer",
    )
    .unwrap();
    let r = run_untouched(&dir, &["run", &s(&dir), "-p", "hi", "-n", "2"]);
    assert_error(&r, &["tokenizer.json"]);
}

// ---------------------------------------------------------------------------------------
// Bad input: prompt and options
// ---------------------------------------------------------------------------------------

#[test]
fn prompt_ids_outside_vocab() {
    let (_t, dir) = copy_fixture(OLMOE);
    let r = run_untouched(
        &dir,
        &["run", &s(&dir), "--prompt-ids", "999999", "-n", "2"],
    );
    assert_error(&r, &["--prompt-ids", "999999"]);
}

#[test]
fn prompt_longer_than_max_position_embeddings() {
    let (_t, dir) = copy_fixture(OLMOE);
    edit_config(&dir, |c| {
        c.insert("max_position_embeddings".into(), 8.into());
    });
    let r = run_untouched(
        &dir,
        &[
            "run",
            &s(&dir),
            "--prompt-ids",
            "1,2,3,4,5,6,7,8,9",
            "-n",
            "2",
        ],
    );
    assert_error(&r, &["max_position_embeddings"]);
}

#[test]
fn max_new_tokens_clamped_to_max_position_embeddings() {
    let (_t, dir) = copy_fixture(OLMOE);
    edit_config(&dir, |c| {
        c.insert("max_position_embeddings".into(), 8.into());
    });
    let r = run_untouched(
        &dir,
        &[
            "run",
            &s(&dir),
            "--prompt-ids",
            "1,2,3,4,5,6",
            "-n",
            "5",
            "--json",
            "--ignore-eos",
        ],
    );
    let v = json_of(&r);
    assert!(
        r.stderr
            .lines()
            .any(|l| l.starts_with("note: ") && l.contains("max_position_embeddings")),
        "no note about the clamp:\n{r}"
    );
    let gen = ids(&v, "generated_ids");
    assert!(
        !gen.is_empty() && gen.len() <= 2,
        "8 positions - 6 prompt tokens allow 2 new tokens:\n{r}"
    );
    assert_eq!(
        v["metrics"]["generated_tokens"].as_u64(),
        Some(gen.len() as u64),
        "{r}"
    );
}

#[test]
fn adapter_not_found() {
    let (_t, dir) = copy_fixture(OLMOE);
    let r = run_untouched(
        &dir,
        &[
            "run",
            &s(&dir),
            "-p",
            "hi",
            "-n",
            "2",
            "--adapter",
            "nonexistent-gpu",
        ],
    );
    assert_error(&r, &["--adapter", "nonexistent-gpu"]);
}

#[test]
fn top_p_zero() {
    let (_t, dir) = copy_fixture(OLMOE);
    let r = run_untouched(
        &dir,
        &["run", &s(&dir), "-p", "hi", "-n", "2", "--top-p", "0"],
    );
    assert_error(&r, &["--top-p"]);
}

#[test]
fn temperature_negative_with_equals() {
    let (_t, dir) = copy_fixture(OLMOE);
    let r = run_untouched(
        &dir,
        &["run", &s(&dir), "-p", "hi", "-n", "2", "--temperature=-1"],
    );
    assert_error(&r, &["--temperature"]);
}

#[test]
fn temperature_negative() {
    // `--temperature -1` as two arguments, as users type it.
    let (_t, dir) = copy_fixture(OLMOE);
    let r = run_untouched(
        &dir,
        &[
            "run",
            &s(&dir),
            "-p",
            "hi",
            "-n",
            "2",
            "--temperature",
            "-1",
        ],
    );
    assert_error(&r, &["--temperature"]);
}

#[test]
fn greedy_conflicts_with_temperature() {
    let (_t, dir) = copy_fixture(OLMOE);
    let r = run_untouched(
        &dir,
        &[
            "run",
            &s(&dir),
            "-p",
            "hi",
            "-n",
            "2",
            "--greedy",
            "--temperature",
            "0.7",
        ],
    );
    assert_error(&r, &["--greedy", "--temperature"]);
}

#[test]
fn quantize_converted_dir_and_f16_on_converted() {
    let (t, dir) = copy_fixture(OLMOE);
    let conv = t.path().join("converted");
    let r = run_untouched(&dir, &["quantize", &s(&dir), "-o", &s(&conv)]);
    assert_ok(&r);

    // Quantizing the output again is refused, and writes nothing.
    let again = t.path().join("again");
    let r = run_untouched(&conv, &["quantize", &s(&conv), "-o", &s(&again)]);
    assert_error(&r, &["model.safetensors"]);
    assert!(
        !again.join("model.safetensors").exists(),
        "a refused quantize wrote output:\n{r}"
    );

    // f16 experts need the original weights.
    let r = run_untouched(
        &conv,
        &[
            "run",
            &s(&conv),
            "-p",
            "hi",
            "-n",
            "2",
            "--expert-precision",
            "f16",
        ],
    );
    assert_error(&r, &["--expert-precision"]);

    // Issue 24, defect 4: `eval` has no --expert-precision, so its error names the
    // directory and what it needs.
    let r = run_untouched(
        &conv,
        &["eval", &s(&conv), "--prompt-ids", "1,2", "-n", "2"],
    );
    assert_error(&r, &[&s(&conv), "original Hugging Face checkpoint"]);
    assert!(!r.stderr.contains("--expert-precision"), "{r}");
}

#[test]
fn quantize_refuses_checkpoint_missing_a_tensor() {
    // The converter should validate the checkpoint against its config instead of writing
    // a converted model that can never load.
    let (t, dir) = copy_fixture(OLMOE);
    let victim = "model.layers.1.self_attn.q_proj.weight";
    rewrite_safetensors(&dir.join("model.safetensors"), |n, sh| {
        (n != victim).then(|| sh.to_vec())
    });
    let out = t.path().join("converted");
    let r = run_untouched(&dir, &["quantize", &s(&dir), "-o", &s(&out)]);
    assert_error(&r, &[victim]);
}

// ---------------------------------------------------------------------------------------
// Good input
// ---------------------------------------------------------------------------------------

#[test]
fn run_json_output_and_metrics() {
    let (_t, dir) = copy_fixture(OLMOE);
    let (r, v) = run_json(&dir, &["-p", HELLO, "-n", "5"]);
    let vocab = vocab_size(&dir);
    let prompt = ids(&v, "prompt_ids");
    let gen = ids(&v, "generated_ids");
    assert!(!prompt.is_empty(), "{r}");
    assert_eq!(gen.len(), 5, "{r}");
    assert!(
        prompt.iter().chain(&gen).all(|&t| t < vocab),
        "ids outside the vocabulary:\n{r}"
    );
    assert!(v["text"].is_string(), "{r}");
    let m = &v["metrics"];
    assert!(
        m["ttft_s"]
            .as_f64()
            .is_some_and(|x| x > 0.0 && x.is_finite()),
        "ttft_s:\n{r}"
    );
    assert!(
        m["decode_tokens_per_s"]
            .as_f64()
            .is_some_and(|x| x > 0.0 && x.is_finite()),
        "decode_tokens_per_s:\n{r}"
    );
    assert_eq!(
        m["prompt_tokens"].as_u64(),
        Some(prompt.len() as u64),
        "{r}"
    );
    assert_eq!(m["generated_tokens"].as_u64(), Some(5), "{r}");
    assert!(
        m["adapter"].as_str().is_some_and(|s| !s.is_empty()),
        "adapter:\n{r}"
    );
    assert!(
        m["backend"].as_str().is_some_and(|s| !s.is_empty()),
        "backend:\n{r}"
    );
}

#[test]
fn run_sharded_qwen() {
    let (_t, dir) = copy_fixture(QWEN);
    let (r, v) = run_json(&dir, &["-p", HELLO, "-n", "3", "--ignore-eos"]);
    let gen = ids(&v, "generated_ids");
    assert_eq!(gen.len(), 3, "{r}");
    assert!(gen.iter().all(|&t| t < vocab_size(&dir)), "{r}");
}

#[test]
fn prompt_ids_match_text_prompt_and_greedy_is_deterministic() {
    let (_t, dir) = copy_fixture(OLMOE);
    let (r1, a) = run_json(&dir, &["-p", HELLO, "-n", "5"]);
    let (r2, b) = run_json(&dir, &["-p", HELLO, "-n", "5"]);
    assert_eq!(
        ids(&a, "generated_ids"),
        ids(&b, "generated_ids"),
        "greedy differs between runs:\n{r1}\n{r2}"
    );
    let prompt: Vec<String> = ids(&a, "prompt_ids")
        .iter()
        .map(|x| x.to_string())
        .collect();
    let (r3, c) = run_json(&dir, &["--prompt-ids", &prompt.join(","), "-n", "5"]);
    assert_eq!(ids(&c, "prompt_ids"), ids(&a, "prompt_ids"), "{r3}");
    assert_eq!(
        ids(&c, "generated_ids"),
        ids(&a, "generated_ids"),
        "--prompt-ids differs from -p:\n{r1}\n{r3}"
    );
}

#[test]
fn seeded_sampling_is_reproducible() {
    let (_t, dir) = copy_fixture(OLMOE);
    let args = [
        "-p",
        HELLO,
        "-n",
        "8",
        "--temperature",
        "0.8",
        "--top-k",
        "20",
        "--seed",
        "7",
    ];
    let (r1, a) = run_json(&dir, &args);
    let (r2, b) = run_json(&dir, &args);
    assert_eq!(
        ids(&a, "generated_ids").len(),
        ids(&b, "generated_ids").len()
    );
    assert_eq!(
        ids(&a, "generated_ids"),
        ids(&b, "generated_ids"),
        "same seed, different tokens:\n{r1}\n{r2}"
    );
    assert!(
        ids(&a, "generated_ids")
            .iter()
            .all(|&t| t < vocab_size(&dir)),
        "{r1}"
    );
}

#[test]
fn executors_agree() {
    let (_t, dir) = copy_fixture(OLMOE);
    let (r1, a) = run_json(&dir, &["-p", HELLO, "-n", "5", "--executor", "per-expert"]);
    let (r2, b) = run_json(&dir, &["-p", HELLO, "-n", "5", "--executor", "grouped"]);
    assert_eq!(
        ids(&a, "generated_ids"),
        ids(&b, "generated_ids"),
        "executors disagree:\n{r1}\n{r2}"
    );
}

#[test]
fn f16_experts_run() {
    let (_t, dir) = copy_fixture(OLMOE);
    let (r, v) = run_json(&dir, &["-p", HELLO, "-n", "5", "--expert-precision", "f16"]);
    let gen = ids(&v, "generated_ids");
    assert_eq!(gen.len(), 5, "{r}");
    assert!(gen.iter().all(|&t| t < vocab_size(&dir)), "{r}");
    assert_eq!(
        v["metrics"]["expert_precision"].as_str(),
        Some("f16"),
        "{r}"
    );
}

#[test]
fn text_mode_streams_decoded_text() {
    let (_t, dir) = copy_fixture(OLMOE);
    let (_, v) = run_json(&dir, &["-p", HELLO, "-n", "5"]);
    let r = run_untouched(&dir, &["run", &s(&dir), "-p", HELLO, "-n", "5"]);
    assert_ok(&r);
    let text = v["text"].as_str().unwrap();
    assert!(!text.is_empty());
    assert_eq!(
        r.stdout.trim_end_matches('\n'),
        text,
        "streamed text differs from the JSON text:\n{r}"
    );
}

#[test]
fn text_mode_without_tokenizer_prints_ids() {
    // With no tokenizer.json, --prompt-ids still works; text mode prints one id per line.
    let (_t, dir) = copy_fixture(OLMOE);
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let r = run_untouched(
        &dir,
        &[
            "run",
            &s(&dir),
            "--prompt-ids",
            "1,2",
            "-n",
            "3",
            "--ignore-eos",
        ],
    );
    assert_ok(&r);
    let lines: Vec<&str> = r.stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 3, "{r}");
    assert!(lines.iter().all(|l| l.trim().parse::<u32>().is_ok()), "{r}");
}

#[test]
fn devices_lists_adapters() {
    let r = wgmoe(["devices"]);
    assert_ok(&r);
    assert!(
        r.stdout.lines().any(|l| l.starts_with("[0] ")),
        "no adapter listed:\n{r}"
    );
    let r = wgmoe(["devices", "--json"]);
    let v = json_of(&r);
    let list = v.as_array().unwrap_or_else(|| panic!("not an array:\n{r}"));
    assert!(!list.is_empty(), "{r}");
    assert!(
        list.iter()
            .all(|a| a["name"].is_string() && a["backend"].is_string()),
        "{r}"
    );
}

#[test]
fn inspect_prints_class_table() {
    for (fixture, classes) in [
        (
            OLMOE,
            &[
                "routed_experts",
                "router",
                "attention",
                "norms",
                "embeddings",
                "lm_head",
            ][..],
        ),
        (
            QWEN,
            &[
                "routed_experts",
                "router",
                "attention",
                "embeddings",
                "lm_head",
            ][..],
        ),
        (
            QWEN3,
            &[
                "routed_experts",
                "dense_mlp",
                "router",
                "attention",
                "norms",
            ][..],
        ),
        (
            MIXTRAL,
            &["routed_experts", "router", "attention", "norms"][..],
        ),
    ] {
        let (_t, dir) = copy_fixture(fixture);
        let r = run_untouched(&dir, &["inspect", &s(&dir)]);
        assert_ok(&r);
        assert!(
            r.stdout.lines().any(|l| l.starts_with("class")),
            "no table header:\n{r}"
        );
        for c in classes {
            assert!(
                r.stdout.lines().any(|l| l.starts_with(c)),
                "no `{c}` row:\n{r}"
            );
        }
        let r = run_untouched(&dir, &["inspect", &s(&dir), "--json"]);
        json_of(&r);
    }
}

/// `inspect --max-context N` prints the arithmetic of weights + KV cache + workspace, and a
/// run over N positions tracks a GPU peak within 5% of it, never above.
#[test]
fn inspect_total_bounds_the_runtime_peak_within_5_percent() {
    for fixture in [OLMOE, QWEN, QWEN3, MIXTRAL] {
        let (_t, dir) = copy_fixture(fixture);
        let (r, run) = run_json(&dir, &["-p", HELLO, "-n", "5", "--ignore-eos"]);
        let n = run["prompt_ids"].as_array().map(|a| a.len()).unwrap_or(0) + 5;
        let peak = run["metrics"]["peak_gpu_bytes"].as_u64().unwrap_or(0);
        let ctx = n.to_string();
        let ri = run_untouched(
            &dir,
            &["inspect", &s(&dir), "--json", "--max-context", &ctx],
        );
        let total = json_of(&ri)["total_gpu_bytes_int4"].as_u64().unwrap_or(0);
        assert!(
            peak <= total && peak as f64 >= 0.95 * total as f64,
            "{fixture}: runtime peak {peak} vs inspect total {total}\n{r}\n{ri}"
        );
        let rt = run_untouched(&dir, &["inspect", &s(&dir), "--max-context", &ctx]);
        assert_ok(&rt);
        assert!(
            rt.stdout.contains(&format!("({total} bytes)")),
            "the table prints the same total:\n{rt}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Closed stdout (`wgmoe ... | head`)
// ---------------------------------------------------------------------------------------

fn run_with_closed_stdout(args: &[&str]) -> Run {
    let mut child = command()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn wgmoe");
    // Close the read end before the child writes anything.
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    Run {
        cmd: format!("wgmoe {} | (stdout closed)", args.join(" ")),
        code: status.code(),
        stdout: String::new(),
        stderr,
    }
}

#[test]
fn closed_stdout_does_not_panic() {
    let (_t, dir) = copy_fixture(OLMOE);
    let d = s(&dir);
    let mut failures = Vec::new();
    for args in [
        vec!["devices", "--json"],
        vec!["devices"],
        vec!["run", d.as_str(), "-p", HELLO, "-n", "3"],
        vec!["run", d.as_str(), "-p", HELLO, "-n", "3", "--json"],
    ] {
        let r = run_with_closed_stdout(&args);
        let panicked = r.stderr.contains("panicked") || r.stderr.contains("RUST_BACKTRACE");
        if panicked || r.code.is_none() {
            failures.push(r.to_string());
        }
    }
    assert!(
        failures.is_empty(),
        "panics with stdout closed:\n{}",
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// The on-disk pipeline cache
// ---------------------------------------------------------------------------------------

/// `run --json` with the cache directory at `cache`: its generated ids and metrics.
fn run_cached(cache: &std::path::Path, extra: &[&str]) -> (Value, Run) {
    let dir = common::fixture(QWEN3);
    let mut c = command();
    c.env("XDG_CACHE_HOME", cache)
        .args([
            "run",
            &dir.display().to_string(),
            "--prompt-ids",
            "3,17,101",
            "-n",
            "4",
            "--json",
        ])
        .args(extra);
    let out = c.output().unwrap();
    let r = Run {
        cmd: format!("run {QWEN3} {extra:?}"),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert_ok(&r);
    (json_of(&r), r)
}

#[test]
fn the_pipeline_cache_is_written_loaded_and_a_damaged_one_ignored() {
    let t = tempfile::tempdir().unwrap();
    let files = |t: &std::path::Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(t.join("wgmoe/pipelines"))
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default()
    };
    // --no-pipeline-cache: nothing read, nothing written.
    let (off, _) = run_cached(t.path(), &["--no-pipeline-cache"]);
    assert_eq!(off["metrics"]["pipeline_cache"], "off");
    assert!(files(t.path()).is_empty());
    // First start: compiled and written; second: the driver takes the file's pipelines.
    let (first, _) = run_cached(t.path(), &[]);
    assert_eq!(first["metrics"]["pipeline_cache"], "created", "{first}");
    assert!(first["metrics"]["pipeline_compile_s"].as_f64().unwrap() > 0.0);
    let written = files(t.path());
    assert_eq!(written.len(), 1, "{written:?}");
    let name = written[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        name.contains("vulkan") && name.contains(env!("CARGO_PKG_VERSION")),
        "{name}"
    );
    let (second, _) = run_cached(t.path(), &[]);
    assert_eq!(second["metrics"]["pipeline_cache"], "loaded", "{second}");
    // A damaged file is never handed to the driver: ignored with a note naming it,
    // rewritten, and the tokens are the same throughout.
    let mut bytes = std::fs::read(&written[0]).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x5a;
    std::fs::write(&written[0], &bytes).unwrap();
    let (damaged, r) = run_cached(t.path(), &[]);
    assert_eq!(
        damaged["metrics"]["pipeline_cache"], "replaced",
        "{damaged}"
    );
    assert!(
        r.stderr.contains("ignored the pipeline cache") && r.stderr.contains(&name),
        "{r}"
    );
    std::fs::write(&written[0], b"not a cache").unwrap();
    let (garbage, _) = run_cached(t.path(), &[]);
    assert_eq!(garbage["metrics"]["pipeline_cache"], "replaced");
    let (again, _) = run_cached(t.path(), &[]);
    assert_eq!(again["metrics"]["pipeline_cache"], "loaded", "{again}");
    for v in [&first, &second, &damaged, &garbage, &again] {
        assert_eq!(ids(v, "generated_ids"), ids(&off, "generated_ids"));
    }
}

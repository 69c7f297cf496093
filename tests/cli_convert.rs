//! Converted models end to end: `wgmoe quantize` with either dense precision, then `run`
//! against quantising on load (the same tokens), old f16 conversions, the refusal of a
//! stored precision that cannot be converted, and `wgmoe eval`'s rows per precision.

mod common;

use std::path::Path;

use common::cli::*;
use serde_json::Value;

#[test]
fn quantize_then_run_matches_quantize_on_load() {
    for fixture in [OLMOE, QWEN, QWEN3, MIXTRAL] {
        let (t, dir) = copy_fixture(fixture);
        // The default stores the dense weights as Q8_0.
        let conv = t.path().join("converted");
        let r = run_untouched(&dir, &["quantize", &s(&dir), "-o", &s(&conv)]);
        assert_ok(&r);
        assert!(r.stderr.contains("q8_0 dense"), "{r}");
        for f in ["model.safetensors", "config.json", "tokenizer.json"] {
            assert!(conv.join(f).is_file(), "quantize did not write {f}:\n{r}");
        }
        assert!(!conv.join("model.safetensors.partial").exists(), "{r}");
        let f16 = t.path().join("converted-f16");
        let r = run_untouched(
            &dir,
            &[
                "quantize",
                &s(&dir),
                "-o",
                &s(&f16),
                "--dense-precision",
                "f16",
            ],
        );
        assert_ok(&r);
        let size = |d: &Path| {
            std::fs::metadata(d.join("model.safetensors"))
                .unwrap()
                .len()
        };
        assert!(
            size(&conv) < size(&f16),
            "{fixture}: the q8_0 conversion ({} bytes) is not smaller than the f16 one ({})",
            size(&conv),
            size(&f16)
        );

        let args = [
            "-p",
            HELLO,
            "-n",
            "5",
            "--ignore-eos",
            "--dense-precision",
            "q8_0",
        ];
        let (r1, on_load) = run_json(&dir, &args);
        for d in [&conv, &f16] {
            let (r2, converted) = run_json(d, &args);
            assert_eq!(
                ids(&converted, "prompt_ids"),
                ids(&on_load, "prompt_ids"),
                "{r2}"
            );
            assert_eq!(
                ids(&converted, "generated_ids"),
                ids(&on_load, "generated_ids"),
                "converted model differs from quantise-on-load:\n{r1}\n{r2}"
            );
        }

        // The f16 values are gone from a Q8_0 conversion: refused, naming both.
        let r = run_untouched(
            &conv,
            &[
                "run",
                &s(&conv),
                "-p",
                "hi",
                "-n",
                "2",
                "--dense-precision",
                "f16",
            ],
        );
        assert_error(&r, &["--dense-precision f16", "q8_0", &s(&conv)]);

        // `inspect` says what each conversion stores.
        for (d, want) in [(&conv, "q8_0"), (&f16, "f16")] {
            let v = json_of(&run_untouched(d, &["inspect", &s(d), "--json"]));
            assert_eq!(v["stored_dense_precision"], want, "{fixture}: {v}");
            let r = run_untouched(d, &["inspect", &s(d)]);
            assert!(
                r.stdout
                    .contains(&format!("dense weights: stored as {want}")),
                "{r}"
            );
        }
    }
}

/// `wgmoe eval` measures each precision against f16 experts, f16 dense weights and an f32
/// KV cache on the reference's greedy sequence. Measured on lavapipe with this prompt
/// (12 positions), mean KL: INT4 experts 1.39 (olmoe) and 1.24 (mixtral) nats, q8_0 dense
/// 0.014 and 0.012, f16 KV 7.2e-6 and 5.7e-6 (top-1 100% for both); the random-weight
/// fixtures' routers are near ties, so even q8_0's rounding flips some routing. A broken
/// kernel gives whole nats, as INT4's ~18x coarser rounding does.
const EVAL_Q8_DENSE_MAX_MEAN_KL: f64 = 0.1;
const EVAL_F16_KV_MAX_MEAN_KL: f64 = 1e-4;

#[test]
fn eval_reports_every_precision_against_the_reference() {
    for fixture in [OLMOE, MIXTRAL] {
        let (_t, dir) = copy_fixture(fixture);
        let base = ["eval", &s(&dir), "-p", HELLO, "-n", "12"];
        let r = run_untouched(&dir, &[&base[..], &["--json"]].concat());
        let v = json_of(&r);
        let rows = v["precisions"].as_array().expect("precisions").clone();
        let key = |e: &Value| {
            format!(
                "{}/{}/{}",
                e["experts"].as_str().unwrap_or("?"),
                e["dense_precision"].as_str().unwrap_or("?"),
                e["kv_precision"].as_str().unwrap_or("?")
            )
        };
        let keys: Vec<String> = rows.iter().map(key).collect();
        assert_eq!(
            keys,
            [
                "int4/f16/f32",
                "f16/q8_0/f32",
                "f16/f16/f16",
                "int4/q8_0/f16"
            ],
            "{r}"
        );
        for e in &rows {
            let (mean, max) = (e["mean_kl"].as_f64(), e["max_kl"].as_f64());
            let top1 = e["top1_agreement"].as_f64().unwrap_or(-1.0);
            assert!(
                mean.is_some_and(|m| m.is_finite() && m >= 0.0)
                    && max.is_some_and(|m| m.is_finite() && m >= mean.unwrap_or(0.0)),
                "{fixture}: {e}"
            );
            assert!((0.0..=1.0).contains(&top1), "{fixture}: {e}");
            assert_eq!(e["positions"], 12, "{fixture}: {e}");
        }
        let mean = |i: usize| rows[i]["mean_kl"].as_f64().unwrap_or(f64::NAN);
        assert!(
            mean(1) < EVAL_Q8_DENSE_MAX_MEAN_KL,
            "{fixture}: {}",
            rows[1]
        );
        assert!(mean(2) < EVAL_F16_KV_MAX_MEAN_KL, "{fixture}: {}", rows[2]);
        for i in [1, 2] {
            assert!(
                rows[i]["top1_agreement"].as_f64() >= Some(0.9),
                "{}",
                rows[i]
            );
        }
        // Today's fields are the INT4 row's.
        assert_eq!(v["int4_vs_f16"]["mean_kl"], rows[0]["mean_kl"], "{r}");
        assert_eq!(v["int4_vs_f16"]["positions"], 12, "{r}");
        assert_eq!(v["reference_ids"].as_array().map(Vec::len), Some(12), "{r}");

        // The text output: a line per precision.
        let r = run_untouched(&dir, &base);
        assert_ok(&r);
        for label in ["int4 experts", "q8_0 dense", "f16 KV", "(the defaults)"] {
            assert!(
                r.stdout
                    .lines()
                    .any(|l| l.contains(label) && l.contains("mean KL")),
                "no `{label}` line:\n{r}"
            );
        }
    }

    // One candidate, chosen by the options: the reference's own precisions give 0.
    let (_t, dir) = copy_fixture(OLMOE);
    let r = run_untouched(
        &dir,
        &[
            "eval",
            &s(&dir),
            "-p",
            HELLO,
            "-n",
            "6",
            "--kv-precision",
            "f32",
            "--json",
        ],
    );
    let v = json_of(&r);
    let rows = v["precisions"].as_array().expect("precisions");
    assert_eq!(rows.len(), 1, "{r}");
    assert_eq!(rows[0]["experts"], "f16", "{r}");
    assert_eq!(rows[0]["max_kl"].as_f64(), Some(0.0), "{r}");
    assert_eq!(rows[0]["top1_agreement"].as_f64(), Some(1.0), "{r}");
    assert!(v.get("int4_vs_f16").is_none(), "{r}");
}

/// A converted model written before `wgmoe.dense_precision` existed stores f16 dense
/// weights: it loads with either precision. A Q8_0 conversion of tied embeddings holds the
/// lm_head's Q8_0 copy, and gives quantise-on-load's tokens.
#[test]
fn old_conversions_are_f16_and_tied_embeddings_convert_to_q8_0() {
    let (t, dir) = copy_fixture(OLMOE);
    let old = t.path().join("old");
    assert_ok(&run_untouched(
        &dir,
        &[
            "quantize",
            &s(&dir),
            "-o",
            &s(&old),
            "--dense-precision",
            "f16",
        ],
    ));
    let file = old.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    let (_, md) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut meta = md.metadata().clone().unwrap();
    assert_eq!(meta.remove("wgmoe.dense_precision").as_deref(), Some("f16"));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let views: Vec<_> = st.tensors();
    std::fs::write(&file, safetensors::serialize(views, Some(meta)).unwrap()).unwrap();
    let args = ["-p", HELLO, "-n", "4", "--ignore-eos"];
    let (_, want) = run_json(&dir, &[&args[..], &["--dense-precision", "f16"]].concat());
    let (r, got) = run_json(&old, &[&args[..], &["--dense-precision", "f16"]].concat());
    assert_eq!(
        ids(&got, "generated_ids"),
        ids(&want, "generated_ids"),
        "{r}"
    );
    let (_, want) = run_json(&dir, &args);
    let (r, got) = run_json(&old, &args);
    assert_eq!(
        ids(&got, "generated_ids"),
        ids(&want, "generated_ids"),
        "{r}"
    );
    let v = json_of(&run_untouched(&old, &["inspect", &s(&old), "--json"]));
    assert_eq!(v["stored_dense_precision"], "f16", "{v}");

    // Tied embeddings: no lm_head.weight in the checkpoint.
    edit_config(&dir, |c| {
        c.insert("tie_word_embeddings".into(), Value::Bool(true));
    });
    rewrite_safetensors(&dir.join("model.safetensors"), |n, sh| {
        (n != "lm_head.weight").then(|| sh.to_vec())
    });
    let conv = t.path().join("tied");
    assert_ok(&run_untouched(
        &dir,
        &["quantize", &s(&dir), "-o", &s(&conv)],
    ));
    let (_, want) = run_json(&dir, &args);
    let (r, got) = run_json(&conv, &args);
    assert_eq!(
        ids(&got, "generated_ids"),
        ids(&want, "generated_ids"),
        "{r}"
    );
}

//! Sizes a config or an option can claim, and code a checkpoint carries (the chat
//! template): every one is bounded before anything proportional to it is allocated or
//! iterated, and fails fast with one `error:` line naming the field or option. Each command
//! here is killed (and the test fails) if it runs longer than `LIMIT` seconds: these inputs
//! once aborted on a 10^12-byte allocation or hung.

mod common;

use std::path::Path;

use common::cli::*;
use serde_json::Value;

const LIMIT: u64 = 60;
const MAX: &str = "18446744073709551615";

fn within(args: &[&str]) -> Run {
    wgmoe_within(LIMIT, args)
}

#[test]
fn layer_counts_beyond_the_checkpoint_are_refused_before_any_per_layer_work() {
    for (layers, words) in [
        (
            1_000_000_000_000u64,
            &["num_hidden_layers", "larger than wgmoe supports"][..],
        ),
        (
            10_000,
            &["num_hidden_layers", "holds tensors of 2 layers"][..],
        ),
        (3, &["num_hidden_layers", "holds tensors of 2 layers"][..]),
    ] {
        let (t, dir) = copy_fixture(OLMOE);
        edit_config(&dir, |c| {
            c.insert("num_hidden_layers".into(), layers.into());
        });
        let d = s(&dir);
        let out = s(&t.path().join("out"));
        let before = snapshot(&dir);
        for args in [
            vec!["run", &d, "-p", "hi", "-n", "2"],
            vec!["inspect", &d],
            vec!["quantize", &d, "-o", &out],
            vec!["bench", &d, "--prompts", "1", "--blocks", "1", "-n", "2"],
        ] {
            let r = within(&args);
            let mut names = vec!["config.json"];
            names.extend_from_slice(words);
            assert_error(&r, &names);
        }
        assert_eq!(before, snapshot(&dir));
        assert!(!t.path().join("out").exists());
    }
    // The sharded fixture too.
    let (_t, dir) = copy_fixture(QWEN);
    edit_config(&dir, |c| {
        c.insert("num_hidden_layers".into(), 1000.into());
    });
    let r = within(&["run", &s(&dir), "-p", "hi", "-n", "2"]);
    assert_error(&r, &["num_hidden_layers", "holds tensors of 2 layers"]);
}

#[test]
fn expert_and_vocab_counts_beyond_the_checkpoint_are_refused() {
    for (field, value, words) in [
        (
            "num_experts",
            1_000_000_000u64,
            &["num_experts", "larger than wgmoe supports"][..],
        ),
        (
            "num_experts",
            60_000,
            &["num_experts", "layer 0 of the checkpoint holds 7"][..],
        ),
        (
            "vocab_size",
            1_000_000,
            &["vocab_size", "model.embed_tokens.weight", "50304 rows"][..],
        ),
        (
            "hidden_size",
            1_000_000_000_000,
            &["hidden_size", "larger than wgmoe supports"][..],
        ),
        (
            "num_attention_heads",
            1 << 40,
            &["num_attention_heads", "larger than wgmoe supports"][..],
        ),
    ] {
        let (_t, dir) = copy_fixture(OLMOE);
        edit_config(&dir, |c| {
            c.insert(field.into(), value.into());
        });
        let d = s(&dir);
        // With a budget, admission once rebuilt the tensor list per candidate count.
        for args in [
            vec!["run", &d, "-p", "hi", "-n", "2", "--vram-budget", "1GiB"],
            vec!["run", &d, "-p", "hi", "-n", "2"],
            vec!["inspect", &d, "--max-context", "16"],
        ] {
            let r = within(&args);
            assert_error(&r, words);
        }
    }
}

#[test]
fn context_and_token_counts_do_not_wrap() {
    let (_t, dir) = copy_fixture(OLMOE);
    let d = s(&dir);
    let r = run_untouched(&dir, &["inspect", &d, "--max-context", MAX]);
    assert_error(&r, &["--ctx-size", MAX, "max_position_embeddings = 512"]);
    let r = run_untouched(&dir, &["inspect", &d, "--max-context", "513"]);
    assert_error(&r, &["--ctx-size", "513", "max_position_embeddings"]);
    // A huge chunk is clamped to the context, as the forward pass does.
    let r = run_untouched(
        &dir,
        &[
            "inspect",
            &d,
            "--json",
            "--max-context",
            "64",
            "--prefill-chunk",
            MAX,
        ],
    );
    let total = json_of(&r)["total_gpu_bytes_int4"].as_u64().unwrap_or(0);
    let r2 = run_untouched(
        &dir,
        &[
            "inspect",
            &d,
            "--json",
            "--max-context",
            "64",
            "--prefill-chunk",
            "64",
        ],
    );
    assert_eq!(Some(total), json_of(&r2)["total_gpu_bytes_int4"].as_u64());
    // `run -n MAX` means as many as fit.
    let r = within(&[
        "run",
        &d,
        "--prompt-ids",
        "1,2",
        "-n",
        MAX,
        "--json",
        "--ignore-eos",
    ]);
    assert_eq!(ids(&json_of(&r), "generated_ids").len(), 510, "{r}");
    assert!(
        r.stderr.contains("note: generating at most 510 tokens"),
        "{r}"
    );
    for (args, names) in [
        (
            vec!["eval", &d, "--prompt-ids", "1,2", "-n", MAX],
            vec!["--max-new-tokens", "max_position_embeddings"],
        ),
        (
            vec!["bench", &d, "-n", MAX],
            vec!["--max-new-tokens", "max_position_embeddings"],
        ),
        (
            vec!["bench", &d, "--prompts", "2", "--blocks", MAX],
            vec!["--blocks", "overflow"],
        ),
        (
            vec!["run", &d, "-p", "hi", "--resident-experts", MAX],
            vec!["--resident-experts", "0..=7"],
        ),
        (
            vec![
                "run",
                &d,
                "-p",
                "hi",
                "--resident-experts",
                "4",
                "--staging-buffers",
                MAX,
            ],
            vec!["--staging-buffers", MAX],
        ),
    ] {
        let r = within(&args);
        assert_error(&r, &names);
    }
    // A config that claims a context of 10^18 positions: refused when counted, not wrapped.
    edit_config(&dir, |c| {
        c.insert(
            "max_position_embeddings".into(),
            1_000_000_000_000_000_000u64.into(),
        );
    });
    let r = within(&["run", &d, "--prompt-ids", "1", "-n", "100000000000000000"]);
    assert_error(&r, &["does not fit", "100000000000000001 positions"]);
    let r = within(&["inspect", &d, "--max-context", "100000000000000000"]);
    assert_error(&r, &["--ctx-size", "100000000000000000 positions"]);
}

fn set_chat_template(dir: &Path, template: &str) {
    let p = dir.join("tokenizer_config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    v["chat_template"] = Value::String(template.into());
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
}

#[test]
fn chat_templates_are_bounded() {
    for template in [
        // 10^10 iterations.
        "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
        // Unbounded recursion.
        "{% for x in [1] recursive %}{{ loop([x]) }}{% endfor %}",
    ] {
        let (_t, dir) = copy_fixture(OLMOE);
        set_chat_template(&dir, template);
        let before = snapshot(&dir);
        let r = within(&["run", &s(&dir), "-p", "hi", "-n", "2", "--chat"]);
        assert_error(&r, &["tokenizer_config.json", "chat_template"]);
        assert_eq!(before, snapshot(&dir));
    }
    // A template that loops a lot but ends still renders.
    let (_t, dir) = copy_fixture(OLMOE);
    set_chat_template(
        &dir,
        "{% for a in range(1000) %}{% endfor %}{{ messages[0]['content'] }}",
    );
    let r = within(&["run", &s(&dir), "-p", "hi", "-n", "2", "--chat", "--json"]);
    json_of(&r);
}

#[test]
fn eos_outside_the_vocabulary_is_refused() {
    let (_t, dir) = copy_fixture(OLMOE);
    edit_config(&dir, |c| {
        c.insert("eos_token_id".into(), 999_999.into());
    });
    let r = run_untouched(&dir, &["run", &s(&dir), "-p", "hi", "-n", "2"]);
    assert_error(
        &r,
        &["config.json", "eos_token_id", "999999", "vocab_size 50304"],
    );

    let (_t, dir) = copy_fixture(QWEN);
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": [2045, 5000]}"#,
    )
    .unwrap();
    let d = s(&dir);
    for args in [
        vec!["run", &d, "--prompt-ids", "1", "-n", "2"],
        vec!["bench", &d, "--prompts", "1", "--blocks", "1", "-n", "2"],
    ] {
        let r = run_untouched(&dir, &args);
        assert_error(&r, &["generation_config.json", "eos_token_id", "5000"]);
    }
}

/// Admission with `--vram-budget` is closed-form: the most experts per layer it grants
/// is exactly the largest count whose bytes fit, found by trying every count (which the
/// runtime no longer does).
#[test]
fn admission_in_closed_form_matches_trying_every_count() {
    use wgmoe::residency::MissPolicy;
    use wgmoe::runtime::admission::{AdmissionCost, AdmissionInput};
    for fixture in [OLMOE, QWEN] {
        // The fixture's shapes with 64 experts, so that many counts are partial residency.
        let path = common::fixture(fixture).join("config.json");
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        v["num_experts"] = 64.into();
        let cfg = wgmoe::config::ModelConfig::from_json(&v.to_string(), &path).unwrap();
        for (miss, cpu_layers) in [
            (MissPolicy::Upload, 0),
            (MissPolicy::Cpu, 0),
            (MissPolicy::Auto, 1),
        ] {
            let input = AdmissionInput {
                dense: wgmoe::backend::kernel::WeightFormat::F16,
                kv: wgmoe::backend::kernel::KvFormat::F32,
                int4: true,
                max_context: 100,
                prefill_chunk: 64,
                all_logits: false,
                score_rows: 0,
                batch: 1,
                staging_buffers: 2,
                miss,
                cpu_layers,
                prefetch_width: 0,
            };
            let c = AdmissionCost::new(&cfg, &input).unwrap();
            let (k, e) = (cfg.top_k, cfg.num_experts);
            let min = c.min_experts();
            assert_eq!(min, if miss == MissPolicy::Upload { k } else { 0 });
            let lo = c.bytes(min).saturating_sub(1000);
            let hi = c.bytes(e) + 1000;
            let step = ((hi - lo) / 500).max(1);
            let mut granted = std::collections::BTreeSet::new();
            for b in (lo..=hi).step_by(step as usize).chain([
                c.bytes(k),
                c.bytes(e),
                c.bytes(e) - 1,
                c.bytes(1),
                c.bytes(k - 1),
            ]) {
                let brute = (min..=e).rev().find(|&n| c.bytes(n) <= b);
                assert_eq!(c.most_within(b), brute, "{fixture} {miss:?}: budget {b}");
                if let Some(n) = brute {
                    granted.insert(n);
                }
            }
            assert!(granted.len() > 20, "{fixture}: budgets spanned {granted:?}");
            assert_eq!(
                wgmoe::runtime::admission::admission_bytes(&cfg, &input, e).unwrap(),
                c.bytes(e)
            );
            // Below full residency, fewer slots never cost more (full residency needs no
            // spares or staging, so it can cost less than one expert fewer).
            for n in min..e - 1 {
                assert!(c.bytes(n) <= c.bytes(n + 1), "{fixture} {miss:?}: n {n}");
            }
        }
    }
}

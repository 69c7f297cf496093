//! Quick end-to-end checks of `wgmoe bench` and `wgmoe synth` through the real binary, on
//! the first adapter (lavapipe in CI). Tiny shapes and token counts only: the whole file
//! runs in seconds. Nothing here asserts a time; only that the measurements are consistent.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn wgmoe(args: &[&str]) -> (String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_wgmoe"));
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        c.env("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let out = c
        .args(args)
        .current_dir(repo())
        .stdin(Stdio::null())
        .output()
        .expect("spawn wgmoe");
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "wgmoe {}\nexit {:?}\n--- stdout\n{so}\n--- stderr\n{se}",
        args.join(" "),
        out.status.code()
    );
    (so, se)
}

fn num(o: &Value, k: &str) -> f64 {
    o[k].as_f64()
        .unwrap_or_else(|| panic!("field `{k}` is not a number: {o:#}"))
}

/// `--plot` output: a self-contained SVG document with, in each of its two panels (decode
/// rate, H2D bytes), a polyline (two points or more) or circles for every series.
fn check_plot(path: &Path, series: &[&str], min_points: usize) {
    let svg = std::fs::read_to_string(path).expect("the plot is written");
    let t = svg.trim();
    assert!(t.starts_with("<svg") && t.ends_with("</svg>"), "{svg}");
    assert!(t.contains("xmlns=\"http://www.w3.org/2000/svg\""));
    assert_eq!(t.matches("<svg").count(), 1);
    // XML-ish: every element opened is closed (self-closing or with its end tag).
    for tag in ["g", "text"] {
        assert_eq!(
            t.matches(&format!("<{tag} ")).count() + t.matches(&format!("<{tag}>")).count(),
            t.matches(&format!("</{tag}>")).count(),
            "<{tag}> balanced"
        );
    }
    assert!(t.contains("resident experts per layer") && t.contains("decode tok/s"));
    assert!(t.contains("H2D"), "H2D axis");
    assert!(t.contains("olmoe-tiny"), "title names the model");
    let drawn = |s: &str| {
        let a = format!("data-series=\"{s}\"");
        (
            t.matches(&format!("<polyline {a}")).count(),
            t.matches(&format!("<circle {a}")).count(),
        )
    };
    for s in series {
        let (lines, circles) = drawn(s);
        assert!(lines + circles > 0, "series `{s}` not drawn:\n{svg}");
        assert_eq!(
            circles,
            2 * min_points,
            "`{s}`: one marker per point per panel"
        );
        assert_eq!(lines, if min_points >= 2 { 2 } else { 0 }, "`{s}`");
        assert!(t.contains(&format!(">{s}</text>")), "`{s}` in the legend");
    }
    let all = t.matches("<polyline ").count() + t.matches("<circle data-series").count();
    let ours: usize = series.iter().map(|s| drawn(s).0 + drawn(s).1).sum();
    assert_eq!(all, ours, "no other series:\n{svg}");
}

#[test]
fn bench_writes_consistent_records() {
    let tmp = tempfile::tempdir().unwrap();
    let json_out = tmp.path().join("bench.json");
    let plot = tmp.path().join("bench.svg");
    let (prompts, blocks, n) = (2u64, 2u64, 4u64);
    let (stdout, _) = wgmoe(&[
        "bench",
        "models/olmoe-tiny",
        "--prompts",
        &prompts.to_string(),
        "--blocks",
        &blocks.to_string(),
        "-n",
        &n.to_string(),
        "--warmup",
        "1",
        "--executor",
        "grouped,per-expert",
        "--json-out",
        json_out.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    // One configuration per series: a marker each, no line.
    check_plot(&plot, &["int4/grouped", "int4/per-expert"], 1);
    assert!(
        stdout.contains("int4/grouped") && stdout.contains("int4/per-expert"),
        "table:\n{stdout}"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json_out).unwrap()).unwrap();
    let recs = v.as_array().expect("a JSON array");
    assert_eq!(recs.len(), 2, "one record per configuration");
    let execs: Vec<&str> = recs
        .iter()
        .map(|r| r["executor"].as_str().unwrap())
        .collect();
    assert_eq!(execs, ["grouped", "per-expert"]);
    for r in recs {
        for k in [
            "wgmoe_version",
            "git_revision",
            "date_utc",
            "model_dir",
            "model_type",
            "config_hash",
            "synthetic",
            "note",
            "adapter",
            "backend",
            "driver",
            "expert_precision",
            "executor",
            "resident_experts_per_layer",
            "cache_policy",
            "prompt_set",
            "prompts",
            "prompt_names",
            "prompt_tokens",
            "blocks",
            "new_tokens",
            "warmup",
            "responses",
            "concurrency",
            "max_context",
            "generated_tokens",
            "decode_tokens",
            "decode_s",
            "decode_tokens_per_s",
            "block_decode_tokens_per_s",
            "block_rate_spread",
            "ttft_s_mean",
            "response_s_mean",
            "prefill_tokens",
            "prefill_tokens_per_s",
            "load_s",
            "peak_gpu_bytes",
            "peak_rss_bytes",
            "dispatches_per_token",
            "submissions_per_token",
            "dispatches_per_decode_step",
            "h2d_bytes",
            "expert_hits",
            "expert_misses",
            "expert_evictions",
            "upload_seconds_per_miss",
        ] {
            assert!(r.get(k).is_some(), "field `{k}` missing: {r:#}");
        }
        assert_eq!(
            r["decode_tokens"].as_u64(),
            Some(blocks * prompts * (n - 1)),
            "{r:#}"
        );
        assert_eq!(
            r["generated_tokens"].as_u64(),
            Some(blocks * prompts * n),
            "{r:#}"
        );
        assert_eq!(r["responses"].as_u64(), Some(blocks * prompts));
        assert_eq!(r["synthetic"], Value::Bool(false));
        assert_eq!(r["expert_precision"], "int4");
        let pt: u64 = r["prompt_tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .sum();
        assert_eq!(r["prefill_tokens"].as_u64(), Some(pt * blocks));
        assert_eq!(
            r["max_context"].as_u64().unwrap(),
            r["prompt_tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap())
                .max()
                .unwrap()
                + n
        );
        for k in [
            "decode_tokens_per_s",
            "ttft_s_mean",
            "response_s_mean",
            "prefill_tokens_per_s",
            "dispatches_per_token",
            "submissions_per_token",
        ] {
            let x = num(r, k);
            assert!(x.is_finite() && x > 0.0, "{k} = {x}");
        }
        assert!(num(r, "response_s_mean") >= num(r, "ttft_s_mean"));
        let blocks_v = r["block_decode_tokens_per_s"].as_array().unwrap();
        assert_eq!(blocks_v.len() as u64, blocks);
        assert!(
            blocks_v
                .iter()
                .all(|b| b.as_f64().is_some_and(|x| x.is_finite() && x > 0.0)),
            "{blocks_v:?}"
        );
        let spread = num(r, "block_rate_spread");
        assert!(spread.is_finite() && spread >= 0.0);
        assert!(r["peak_gpu_bytes"].as_u64().unwrap() > 0);
        // Pooled rate = decode tokens / decode seconds.
        let pooled = num(r, "decode_tokens") / num(r, "decode_s");
        assert!((pooled - num(r, "decode_tokens_per_s")).abs() <= 1e-9 * pooled);
        for k in [
            "h2d_bytes",
            "expert_hits",
            "expert_misses",
            "expert_evictions",
            "upload_seconds_per_miss",
        ] {
            assert!(r[k].is_null() || r[k].is_number(), "{k}: {}", r[k]);
        }
        let date = r["date_utc"].as_str().unwrap();
        assert!(
            date.len() == 20 && date.ends_with('Z') && date.as_bytes()[10] == b'T',
            "{date}"
        );
    }
}

/// A residency sweep: every configuration reports its cache counters, and the uploaded
/// bytes are the misses times one packed expert.
#[test]
fn bench_residency_sweep_reports_cache_counters() {
    let tmp = tempfile::tempdir().unwrap();
    let json_out = tmp.path().join("bench.json");
    let plot = tmp.path().join("sweep.svg");
    wgmoe(&[
        "bench",
        "models/olmoe-tiny",
        "--prompts",
        "2",
        "--blocks",
        "1",
        "-n",
        "6",
        "--warmup",
        "1",
        "--resident-experts",
        "3,7",
        "--cache-policy",
        "lru,lfu-decay",
        "--miss-policy",
        "upload",
        "--json-out",
        json_out.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    // Each policy's curve runs from 3 resident experts to full residency (7).
    check_plot(&plot, &["int4/grouped lru", "int4/grouped lfu-decay"], 2);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json_out).unwrap()).unwrap();
    let recs = v.as_array().unwrap();
    assert_eq!(
        recs.len(),
        3,
        "N = 3 with 2 policies; N = 7 (all resident) once"
    );
    // olmoe-tiny: hidden 64, expert intermediate 96 -> one packed expert is 9728 bytes.
    let slot = wgmoe::blocks::quant::Q4SlotLayout::new(64, 96).bytes as u64;
    for r in recs {
        let n = r["resident_experts_per_layer"].as_u64().unwrap();
        let misses = r["expert_misses"].as_u64().unwrap();
        // Copies: the misses, and the guesses copied ahead (next-layer prefetch, the
        // default below full residency; null at full residency).
        let ahead = r["prefetch_issued"].as_u64().unwrap_or(0);
        assert_eq!(
            r["h2d_bytes"].as_u64().unwrap(),
            (misses + ahead) * slot,
            "{r:#}"
        );
        if n == 3 {
            assert!(
                misses > 0 && r["expert_evictions"].as_u64().unwrap() > 0,
                "{r:#}"
            );
            assert!(r["cache_policy"].is_string());
            assert!(num(r, "upload_seconds_per_miss") > 0.0);
            // Misses per decode token: the decode steps' own, at most top_k of the 7
            // experts in each layer (the prompt's chunks are not divided by decode tokens).
            let per_tok = num(r, "expert_misses_per_token");
            let cap = num(r, "top_k") * num(r, "num_layers");
            assert!(per_tok > 0.0 && per_tok <= cap, "{per_tok} > {cap}: {r:#}");
            assert!(
                per_tok * num(r, "decode_tokens") <= misses as f64 + 1e-6,
                "{r:#}"
            );
        } else {
            assert_eq!(n, 7);
            assert_eq!(misses, 0);
            assert!(r["cache_policy"].is_null());
        }
    }
}

/// A miss-policy sweep: the CPU computes what is not resident (all of it at N = 0),
/// uploads are counted apart, and each record says where its misses ran. A policy that
/// cannot serve a count is refused before anything is measured.
#[test]
fn bench_miss_policy_sweep_reports_cpu_experts() {
    let tmp = tempfile::tempdir().unwrap();
    let json_out = tmp.path().join("bench.json");
    let args = |miss: &str| {
        vec![
            "bench".to_string(),
            "models/olmoe-tiny".into(),
            "--prompts".into(),
            "2".into(),
            "--blocks".into(),
            "1".into(),
            "-n".into(),
            "4".into(),
            "--warmup".into(),
            "0".into(),
            "--resident-experts".into(),
            "0,3".into(),
            "--miss-policy".into(),
            miss.into(),
            "--json-out".into(),
            json_out.to_str().unwrap().into(),
        ]
    };
    let a = args("cpu,auto");
    wgmoe(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json_out).unwrap()).unwrap();
    let recs = v.as_array().unwrap();
    assert_eq!(recs.len(), 4, "N = 0 and 3, each with cpu and auto");
    let slot = wgmoe::blocks::quant::Q4SlotLayout::new(64, 96).bytes as u64;
    for r in recs {
        let n = r["resident_experts_per_layer"].as_u64().unwrap();
        assert!(r["miss_policy"].is_string(), "{r:#}");
        let uploaded = r["uploaded_misses"].as_u64().unwrap();
        let ahead = r["prefetch_issued"].as_u64().unwrap_or(0);
        assert_eq!(
            r["h2d_bytes"].as_u64().unwrap(),
            (uploaded + ahead) * slot,
            "{r:#}"
        );
        assert!(r["cpu_expert_pairs"].as_u64().unwrap() > 0, "{r:#}");
        if n == 0 {
            assert_eq!(uploaded, 0, "{r:#}");
        }
    }
    // Every miss uploaded into no slot at all: refused, naming the option, nothing written.
    std::fs::remove_file(&json_out).unwrap();
    let a = args("upload");
    let out = Command::new(env!("CARGO_BIN_EXE_wgmoe"))
        .args(&a)
        .current_dir(repo())
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--resident-experts"),
        "{err}"
    );
    assert!(err.contains("nothing was measured"), "{err}");
}

const TINY: &[&str] = &[
    "--hidden",
    "64",
    "--layers",
    "2",
    "--heads",
    "4",
    "--experts",
    "5",
    "--top-k",
    "2",
    "--expert-intermediate",
    "96",
    "--vocab",
    "512",
];

fn synth(arch: &str, out: &Path, extra: &[&str]) {
    let mut args = vec!["synth", "--arch", arch, "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let (_, stderr) = wgmoe(&args);
    assert!(
        stderr.contains("uniformly"),
        "synth must say random weights route uniformly:\n{stderr}"
    );
}

fn run_json(dir: &Path, n: usize) -> Value {
    let (stdout, _) = wgmoe(&[
        "run",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "-n",
        &n.to_string(),
        "--json",
        "--ignore-eos",
    ]);
    let v: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(
        v["generated_ids"].as_array().map(Vec::len),
        Some(n),
        "{v:#}"
    );
    v
}

#[test]
fn synthetic_models_load_and_run() {
    let tmp = tempfile::tempdir().unwrap();

    // Converted INT4 (default format): loads, validates, runs; deterministic in the seed.
    let conv = tmp.path().join("olmoe-conv");
    synth("olmoe-1b-7b", &conv, TINY);
    let cfg_text = std::fs::read_to_string(conv.join("config.json")).unwrap();
    let cfg_json: Value = serde_json::from_str(&cfg_text).unwrap();
    assert_eq!(cfg_json["wgmoe_synthetic"], Value::Bool(true));
    assert_eq!(cfg_json["model_type"], "olmoe");
    assert_eq!(cfg_json["rope_theta"].as_f64(), Some(10000.0));
    let cfg = wgmoe::config::ModelConfig::from_dir(&conv).unwrap();
    assert_eq!(
        (
            cfg.hidden_size,
            cfg.num_layers,
            cfg.num_experts,
            cfg.top_k,
            cfg.moe_intermediate,
            cfg.vocab_size
        ),
        (64, 2, 5, 2, 96, 512)
    );
    let ckpt = wgmoe::format::checkpoint::Checkpoint::open(&conv).unwrap();
    assert!(wgmoe::format::convert::is_converted(&ckpt));
    wgmoe::format::convert::validate_converted(&ckpt, &cfg).unwrap();
    drop(ckpt);
    let tok = wgmoe::tokenizer::Tokenizer::from_dir(&conv).unwrap();
    assert_eq!(tok.vocab_size(), 512);
    let ids = tok
        .encode("The old clockmaker walked along the river", true)
        .unwrap();
    assert_eq!(ids.len(), 7);
    assert!(
        !ids.contains(&tok.token_to_id("<unk>").unwrap()),
        "bench words are in the vocabulary: {ids:?}"
    );
    run_json(&conv, 4);

    let again = tmp.path().join("olmoe-conv-again");
    synth("olmoe-1b-7b", &again, TINY);
    assert_eq!(
        std::fs::read(conv.join("model.safetensors")).unwrap(),
        std::fs::read(again.join("model.safetensors")).unwrap(),
        "same seed, same bytes"
    );

    // bf16 Hugging Face checkpoint, sharded under a small shard size; quantised on load.
    let hf = tmp.path().join("olmoe-hf");
    let mut extra = TINY.to_vec();
    extra.extend_from_slice(&["--format", "hf", "--max-shard-bytes", "200000"]);
    synth("olmoe-1b-7b", &hf, &extra);
    assert!(hf.join("model.safetensors.index.json").is_file());
    assert!(hf.join("model-00001-of-00003.safetensors").is_file());
    let ckpt = wgmoe::format::checkpoint::Checkpoint::open(&hf).unwrap();
    assert!(ckpt.contains("model.layers.1.mlp.experts.4.down_proj.weight"));
    assert!(!wgmoe::format::convert::is_converted(&ckpt));
    drop(ckpt);
    run_json(&hf, 4);

    // Qwen1.5-MoE shape: q/k/v bias, shared expert with its gate.
    let qwen = tmp.path().join("qwen-conv");
    synth(
        "qwen1.5-moe-a2.7b",
        &qwen,
        &[
            "--hidden",
            "64",
            "--layers",
            "2",
            "--heads",
            "4",
            "--experts",
            "6",
            "--top-k",
            "2",
            "--expert-intermediate",
            "80",
            "--shared-expert-intermediate",
            "96",
            "--vocab",
            "300",
        ],
    );
    let cfg = wgmoe::config::ModelConfig::from_dir(&qwen).unwrap();
    assert_eq!(
        (cfg.shared_expert_intermediate, cfg.qkv_bias, cfg.rope_theta),
        (Some(96), true, 1e6)
    );
    run_json(&qwen, 3);

    // A synthetic model is flagged in the bench record.
    let json_out = tmp.path().join("bench.json");
    wgmoe(&[
        "bench",
        conv.to_str().unwrap(),
        "--prompts",
        "1",
        "--blocks",
        "1",
        "-n",
        "2",
        "--warmup",
        "0",
        "--json-out",
        json_out.to_str().unwrap(),
    ]);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json_out).unwrap()).unwrap();
    assert_eq!(v[0]["synthetic"], Value::Bool(true));
    assert!(v[0]["note"].as_str().unwrap().contains("uniformly"));
    assert_eq!(v[0]["decode_tokens"].as_u64(), Some(1));
}

/// Qwen3-MoE and Mixtral shapes from `synth`: per-head q/k norm with head_dim given (q wider
/// than hidden) and GQA groups of 4; Mixtral's hub tensor names in the bf16 format. Both
/// load and run in both formats.
#[test]
fn synthetic_qwen3_and_mixtral_load_and_run() {
    let tmp = tempfile::tempdir().unwrap();
    let q3 = tmp.path().join("qwen3-conv");
    let shape = [
        "--hidden",
        "64",
        "--layers",
        "2",
        "--heads",
        "8",
        "--kv-heads",
        "2",
        "--head-dim",
        "16",
        "--experts",
        "9",
        "--top-k",
        "3",
        "--expert-intermediate",
        "40",
        "--vocab",
        "400",
    ];
    synth("qwen3-30b-a3b", &q3, &shape);
    let cfg = wgmoe::config::ModelConfig::from_dir(&q3).unwrap();
    assert_eq!(cfg.arch, wgmoe::config::Arch::Qwen3Moe);
    assert_eq!(
        (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.hidden_size
        ),
        (8, 2, 16, 64)
    );
    assert_eq!(cfg.qk_norm, wgmoe::config::QkNorm::PerHead);
    assert!(cfg.norm_topk_prob);
    run_json(&q3, 3);
    let q3_hf = tmp.path().join("qwen3-hf");
    let mut extra = shape.to_vec();
    extra.extend_from_slice(&["--format", "hf"]);
    synth("qwen3-30b-a3b", &q3_hf, &extra);
    let ckpt = wgmoe::format::checkpoint::Checkpoint::open(&q3_hf).unwrap();
    assert_eq!(
        ckpt.info("model.layers.0.self_attn.q_norm.weight")
            .unwrap()
            .shape,
        vec![16]
    );
    drop(ckpt);
    run_json(&q3_hf, 3);

    let mx_hf = tmp.path().join("mixtral-hf");
    synth(
        "mixtral-8x7b",
        &mx_hf,
        &[
            "--hidden",
            "64",
            "--layers",
            "2",
            "--heads",
            "8",
            "--experts",
            "4",
            "--expert-intermediate",
            "72",
            "--vocab",
            "300",
            "--format",
            "hf",
        ],
    );
    let cfg = wgmoe::config::ModelConfig::from_dir(&mx_hf).unwrap();
    assert_eq!(cfg.arch, wgmoe::config::Arch::Mixtral);
    // The preset's 4:1 ratio of heads to KV heads, kept for --heads 8.
    assert_eq!((cfg.num_heads, cfg.num_kv_heads, cfg.top_k), (8, 2, 2));
    let ckpt = wgmoe::format::checkpoint::Checkpoint::open(&mx_hf).unwrap();
    assert!(ckpt.contains("model.layers.1.block_sparse_moe.experts.3.w2.weight"));
    assert!(ckpt.contains("model.layers.0.block_sparse_moe.gate.weight"));
    drop(ckpt);
    run_json(&mx_hf, 3);
    let tok = wgmoe::tokenizer::Tokenizer::from_dir(&mx_hf).unwrap();
    assert_eq!(
        tok.apply_chat_template(&[("user".into(), "Hi".into())], true)
            .unwrap(),
        "<s>[INST] Hi [/INST]"
    );
}

/// Shape options the presets cannot honour are refused, naming the option.
#[test]
fn synth_refuses_impossible_shapes() {
    let tmp = tempfile::tempdir().unwrap();
    for (arch, args, flag) in [
        ("mixtral-8x7b", &["--head-dim", "64"][..], "--head-dim"),
        ("qwen3-30b-a3b", &["--head-dim", "63"][..], "--head-dim"),
        (
            "qwen3-30b-a3b",
            &["--heads", "32", "--kv-heads", "5"][..],
            "--kv-heads",
        ),
        (
            "mixtral-8x7b",
            &["--shared-expert-intermediate", "64"][..],
            "--shared-expert-intermediate",
        ),
        ("mixtral-8x7b", &["--top-k", "9"][..], "--top-k"),
    ] {
        let out = tmp.path().join("x");
        let mut c = Command::new(env!("CARGO_BIN_EXE_wgmoe"));
        c.args(["synth", "--arch", arch, "-o", out.to_str().unwrap()])
            .args(args);
        let o = c.stdin(Stdio::null()).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains(flag),
            "{arch} {args:?}: {err}"
        );
        assert!(!out.exists(), "nothing written for a refused shape");
    }
}

//! `wgmoe plan`: the real configs' byte counts (INT4 expert bytes pinned), the fit against
//! the VRAM in closed form, a model too big for one machine, bandwidths from `devices
//! --measure`'s file, and bad input (the byte counts against the loader: plan_bytes.rs).

mod common;

use common::cli::*;
use common::{fixture, repo};
use serde_json::Value;

const GIB: u64 = 1 << 30;

/// (config file, INT4 bytes of one expert, MoE layers, experts per layer).
const REAL: [(&str, u64, u64, u64); 4] = [
    ("olmoe-1b-7b-0924.json", 3_194_880, 16, 64),
    ("qwen1.5-moe-a2.7b.json", 4_395_008, 24, 60),
    ("qwen3-30b-a3b.json", 2_396_160, 48, 128),
    ("mixtral-8x7b-v0.1.json", 89_456_640, 32, 8),
];

#[test]
fn real_configs_pin_expert_bytes_and_fit_the_most_experts_the_vram_holds() {
    for (file, expert, layers, experts) in REAL {
        let path = config(file);
        for policy in ["upload", "cpu", "auto"] {
            let mut previous = 0;
            for vram in ["4GiB", "8GiB", "12GiB"] {
                let p = plan_json(&[
                    &path,
                    "--vram",
                    vram,
                    "--ram",
                    "64GiB",
                    "--miss-policy",
                    policy,
                    "--json",
                ]);
                let what = format!("{file} {policy} {vram}");
                assert_eq!(p["miss_policy"], policy, "{what}");
                assert_eq!(u(&p, "expert_bytes"), expert, "{what}");
                assert_eq!(u(&p, "moe_layers"), layers, "{what}");
                assert_eq!(u(&p, "num_experts"), experts, "{what}");
                assert_eq!(
                    u(&p, "routed_expert_bytes"),
                    layers * experts * expert,
                    "{what}"
                );
                let per = u(&p, "bytes_per_resident_expert");
                assert_eq!(per, layers * expert);
                let comps: u64 = p["components"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| c["bytes"].as_u64().unwrap())
                    .sum();
                assert_eq!(
                    comps,
                    u(&p, "non_routed_bytes"),
                    "{what}: components add up"
                );
                let k = u(&p, "top_k");
                let fixed =
                    u(&p, "non_routed_bytes") + u(&p, "kv_cache_bytes") + u(&p, "workspace_bytes");
                let host = u(&p, "host_experts_bytes");
                let staging = u(&p, "staging_bytes");
                // Next-layer prefetch (the default with uploads): top_k prefetch slots.
                let w = u(&p, "prefetch_width");
                assert_eq!(w, if policy == "cpu" { 0 } else { k }, "{what}");
                // Device bytes with n < experts resident: upload keeps top_k spares and
                // needs n >= top_k; cpu and auto keep min(top_k, n) spares (staging once
                // n > 0) plus the CPU experts' buffers; both the prefetch slots once n > 0.
                let at = |n: u64| {
                    if policy == "upload" {
                        fixed + (n + k + w) * per + staging
                    } else if n > 0 {
                        fixed + host + (n + k.min(n) + w) * per + staging
                    } else {
                        fixed + host
                    }
                };
                let lo = if policy == "upload" { k } else { 0 };
                assert_eq!(u(&p, "min_resident_experts"), lo, "{what}");
                if policy == "upload" {
                    assert_eq!(host, 0, "{what}");
                } else {
                    assert!(host > 0, "{what}");
                }
                assert_eq!(u(&p, "hot_bytes"), at(lo), "{what}: the hot part");
                assert_eq!(u(&p, "all_resident_bytes"), fixed + experts * per, "{what}");
                let v = u(&p, "vram_bytes");
                assert_eq!(
                    v,
                    vram.trim_end_matches("GiB").parse::<u64>().unwrap() * GIB
                );
                match p["resident_experts_per_layer"].as_u64() {
                    Some(n) if n == experts => {
                        assert!(u(&p, "all_resident_bytes") <= v);
                        assert_eq!(u(&p, "gpu_bytes"), u(&p, "all_resident_bytes"));
                        assert_eq!(u(&p, "host_source_bytes"), 0);
                    }
                    Some(n) => {
                        // The most that fits: n fits, n + 1 (or every expert) does not.
                        assert_eq!(u(&p, "gpu_bytes"), at(n), "{what}");
                        assert!(
                            at(n) <= v && (at(n + 1) > v || n + 1 == experts),
                            "{what}: {n}"
                        );
                        assert!(u(&p, "all_resident_bytes") > v);
                        assert_eq!(u(&p, "host_source_bytes"), u(&p, "routed_expert_bytes"));
                        assert!(n >= previous);
                        previous = n;
                        let cmd = p["command"].as_str().unwrap();
                        assert!(cmd.ends_with(&format!("--resident-experts {n}")), "{cmd}");
                        assert_eq!(
                            cmd.contains("--miss-policy"),
                            policy != "auto",
                            "{what}: {cmd}"
                        );
                    }
                    None => {
                        assert!(u(&p, "hot_bytes") > v, "{what}");
                        assert_eq!(p["fits"], false);
                        assert!(p["command"].is_null());
                    }
                }
                // CPU misses fit at least as many experts as uploads (fewer spares).
                if policy != "upload" {
                    let up = p["resident_experts_per_layer_upload"].as_u64();
                    let here = p["resident_experts_per_layer"].as_u64();
                    assert!(here >= up, "{what}: {here:?} vs upload {up:?}");
                }
            }
        }
    }
}

#[test]
fn qwen3_on_12gib_reads_as_arithmetic_and_ends_with_the_command() {
    let cfg = config("qwen3-30b-a3b.json");
    let args = [
        "plan",
        &cfg,
        "--vram",
        "12GiB",
        "--ram",
        "32GiB",
        "--device-gbps",
        "400",
        "--h2d-gbps",
        "25",
        "--miss-policy",
        "upload",
    ];
    let r = wgmoe(args);
    assert_ok(&r);
    let p = plan_json(&[&args[1..], &["--json"]].concat());
    let n = u(&p, "resident_experts_per_layer");
    for want in [
        "48 layers x 128 experts x 2,396,160 B = 14,722,007,040 B",
        "each further resident expert per layer costs 48 x 2,396,160 = 115,015,680 B",
        &format!("-> {n} of 128 experts per layer resident"),
        "t_token = t_compute + t_transfer",
        "given as --device-gbps and --h2d-gbps",
        "Verdict: partial residency",
    ] {
        assert!(r.stdout.contains(want), "missing `{want}`:\n{r}");
    }
    let last = r.stdout.trim_end().lines().last().unwrap();
    assert_eq!(
        last.trim(),
        format!("wgmoe run MODEL_DIR --miss-policy upload --resident-experts {n}"),
        "{r}"
    );
    // The prediction is the formula of its own terms.
    let pr = &p["predictions"][0];
    let f = |k: &str| pr[k].as_f64().unwrap();
    let read = f("bytes_read_per_token");
    assert!((f("t_compute_s") - read / 400e9).abs() < 1e-12);
    let hit = n as f64 / 128.0;
    assert!((f("hit_rate") - hit).abs() < 1e-12);
    let misses = 48.0 * 8.0 * (1.0 - hit);
    assert!((f("misses_per_token") - misses).abs() < 1e-9);
    assert!((f("t_transfer_s") - misses * 2_396_160.0 / 25e9).abs() < 1e-12);
    let tps = 1.0 / (read / 400e9 + misses * 2_396_160.0 / 25e9);
    assert!((p["predicted_decode_tokens_per_s"].as_f64().unwrap() - tps).abs() < 1e-6 * tps);
    // A measured hit rate replaces uniform routing.
    let q = plan_json(&[
        &config("qwen3-30b-a3b.json"),
        "--vram",
        "12GiB",
        "--device-gbps",
        "400",
        "--h2d-gbps",
        "25",
        "--hit-rate",
        "0.9",
        "--json",
    ]);
    assert!((q["predictions"][0]["misses_per_token"].as_f64().unwrap() - 38.4).abs() < 1e-9);
    assert!(q["predicted_decode_tokens_per_s"].as_f64().unwrap() > tps);
}

/// CPU misses: the device reads only the hits, the CPU the misses; auto predicts both and
/// takes the faster; without a CPU figure there is no CPU prediction.
#[test]
fn cpu_misses_are_predicted_from_the_cpu_bandwidth_and_auto_takes_the_faster() {
    let cfg = config("qwen3-30b-a3b.json");
    let base = [
        cfg.as_str(),
        "--vram",
        "8GiB",
        "--ram",
        "32GiB",
        "--device-gbps",
        "400",
        "--h2d-gbps",
        "25",
    ];
    let with = |extra: &[&str]| plan_json(&[&base[..], extra, &["--json"]].concat());
    let cpu = with(&["--miss-policy", "cpu", "--cpu-gbps", "40"]);
    let n = u(&cpu, "resident_experts_per_layer");
    let preds = cpu["predictions"].as_array().unwrap();
    assert_eq!(preds.len(), 1, "{cpu}");
    let p = &preds[0];
    assert_eq!(p["miss_policy"], "cpu");
    let f = |k: &str| p[k].as_f64().unwrap();
    let hit = n as f64 / 128.0;
    let misses = 48.0 * 8.0 * (1.0 - hit);
    let miss_bytes = misses * 2_396_160.0;
    assert!((f("misses_per_token") - misses).abs() < 1e-9);
    assert_eq!(f("t_transfer_s"), 0.0);
    assert!((f("t_cpu_s") - miss_bytes / 40e9).abs() < 1e-12);
    // Same plan with uploads: the device reads every routed expert, the CPU none.
    let up = with(&["--miss-policy", "upload"]);
    let pu = &up["predictions"][0];
    assert_eq!(pu["miss_policy"], "upload");
    let read_all = pu["bytes_read_per_token"].as_f64().unwrap();
    assert!((f("bytes_read_per_token") - (read_all - miss_bytes).round()).abs() <= 1.0);
    assert!((f("t_token_s") - (f("t_compute_s") + f("t_cpu_s"))).abs() < 1e-12);
    assert!(
        (cpu["predicted_decode_tokens_per_s"].as_f64().unwrap() - 1.0 / f("t_token_s")).abs()
            < 1e-9
    );
    let r = wgmoe(
        [
            &["plan"][..],
            &base[..],
            &["--miss-policy", "cpu", "--cpu-gbps", "40"],
        ]
        .concat(),
    );
    assert_ok(&r);
    for want in [
        "t_token = t_compute + t_cpu",
        "CPU experts 40.0 GB/s",
        "--miss-policy cpu --resident-experts",
    ] {
        assert!(r.stdout.contains(want), "missing `{want}`:\n{r}");
    }
    // Auto: both predictions, the faster one is the headline.
    for cpu_gbps in ["1", "400"] {
        let a = with(&["--cpu-gbps", cpu_gbps]);
        assert_eq!(a["miss_policy"], "auto");
        let ps = a["predictions"].as_array().unwrap();
        assert_eq!(ps.len(), 2, "{a}");
        let best = ps
            .iter()
            .map(|p| p["tokens_per_s"].as_f64().unwrap())
            .fold(0.0, f64::max);
        assert_eq!(a["predicted_decode_tokens_per_s"].as_f64().unwrap(), best);
        let cmd = a["command"].as_str().unwrap();
        assert!(!cmd.contains("--miss-policy"), "{cmd}");
    }
    // A round trip counts once per sync point: every MoE layer's routing readback and the
    // token's below full residency, the token's alone at full residency.
    let rt = with(&[
        "--miss-policy",
        "cpu",
        "--cpu-gbps",
        "40",
        "--round-trip-us",
        "100",
    ]);
    let p = &rt["predictions"][0];
    assert_eq!(p["sync_points_per_token"], 49, "{rt}");
    assert!((p["t_sync_s"].as_f64().unwrap() - 49.0 * 100e-6).abs() < 1e-12);
    let g = |k: &str| p[k].as_f64().unwrap();
    assert!((g("t_token_s") - (g("t_compute_s") + g("t_cpu_s") + g("t_sync_s"))).abs() < 1e-12);
    assert_eq!(
        cpu["predictions"][0]["t_sync_s"], 0.0,
        "no round trip given: not counted"
    );
    let full = plan_json(&[
        &config("olmoe-1b-7b-0924.json"),
        "--vram",
        "12GiB",
        "--device-gbps",
        "400",
        "--h2d-gbps",
        "25",
        "--round-trip-us",
        "100",
        "--json",
    ]);
    assert_eq!(full["predictions"][0]["sync_points_per_token"], 1, "{full}");
    let bad = wgmoe([
        "plan",
        &cfg,
        "--vram",
        "8GiB",
        "--device-gbps",
        "1",
        "--h2d-gbps",
        "1",
        "--round-trip-us=-3",
    ]);
    assert_error(&bad, &["--round-trip-us"]);
    // No CPU figure: the CPU prediction is left out, not guessed.
    let none = with(&["--miss-policy", "cpu"]);
    assert!(
        none["predictions"].as_array().unwrap().is_empty()
            && none["predicted_decode_tokens_per_s"].is_null(),
        "{none}"
    );
    // Every expert on the CPU fits a card that holds none of them.
    let tiny = plan_json(&[&cfg, "--vram", "4GiB", "--ram", "32GiB", "--json"]);
    assert_eq!(tiny["fits"], true, "{tiny}");
    let small = u(&tiny, "resident_experts_per_layer");
    assert!(small < 8, "{small}");
    assert!(
        tiny["resident_experts_per_layer_upload"].is_null(),
        "{tiny}"
    );
}

#[test]
fn a_model_too_big_for_one_machine_is_named_with_what_serving_it_takes() {
    let path = repo().join("tests/data/too-big-moe.config.json");
    let path = path.display().to_string();
    let args = [path.as_str(), "--vram", "24GiB", "--ram", "128GiB"];
    let r = wgmoe(["plan"].iter().chain(args.iter()));
    assert_ok(&r);
    for want in [
        "Too big for one machine",
        "bf16",
        "fp8",
        "int4",
        "server of 8",
        "vLLM with expert parallelism",
        "SGLang with expert parallelism",
        "Verdict: too big for one machine",
    ] {
        assert!(r.stdout.contains(want), "missing `{want}`:\n{r}");
    }
    assert!(!r.stdout.contains("Run it"), "{r}");
    let mut a = args.to_vec();
    a.push("--json");
    let p = plan_json(&a);
    let params = u(&p, "parameters");
    assert!(params > 300_000_000_000, "{params}");
    assert_eq!(p["fits"], false);
    assert!(p["command"].is_null() && p["predicted_decode_tokens_per_s"].is_null());
    let c = &p["cluster"];
    let gpu = 80 * GIB;
    assert_eq!(u(c, "gpu_memory_bytes"), gpu);
    let needs = c["needs"].as_array().unwrap();
    let bf16 = needs[0]["weight_bytes"].as_u64().unwrap();
    assert_eq!(bf16, 2 * params);
    assert_eq!(needs[1]["weight_bytes"].as_u64().unwrap(), params);
    assert_eq!(
        needs[2]["weight_bytes"].as_u64().unwrap(),
        u(&p, "non_routed_bytes") + u(&p, "routed_expert_bytes")
    );
    for n in needs {
        let w = n["weight_bytes"].as_u64().unwrap();
        assert_eq!(n["min_gpus"].as_u64().unwrap(), w.div_ceil(gpu));
        let lo = n["gpus_with_headroom"][0].as_u64().unwrap();
        let hi = n["gpus_with_headroom"][1].as_u64().unwrap();
        assert_eq!(lo, (w as u128 * 120).div_ceil(gpu as u128 * 100) as u64);
        assert_eq!(hi, (w as u128 * 130).div_ceil(gpu as u128 * 100) as u64);
        assert_eq!(n["servers_of_8"][0].as_u64().unwrap(), lo.div_ceil(8));
        assert_eq!(n["servers_of_8"][1].as_u64().unwrap(), hi.div_ceil(8));
    }
    // --gpu-memory changes the count.
    let mut a = args.to_vec();
    a.extend(["--gpu-memory", "141GB", "--json"]);
    let p2 = plan_json(&a);
    let n2 = p2["cluster"]["needs"][0]["min_gpus"].as_u64().unwrap();
    assert_eq!(n2, bf16.div_ceil(141_000_000_000));
}

#[test]
fn bandwidths_come_from_the_measurements_file_and_say_so() {
    let cache = tempfile::tempdir().unwrap();
    let dir = cache.path().join("wgmoe");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("bandwidth.json"),
        r#"{"entries":[{"adapter":"Test GPU","backend":"vulkan","driver":"x 1","device_type":"DiscreteGpu","device_read_gbps":500.0,"h2d_gbps":12.5,"write_buffer_gbps":10.0,"read_bytes":268435456,"h2d_bytes":67108864,"repetitions":5,"date_utc":"2025-01-01T00:00:00Z"}]}"#,
    )
    .unwrap();
    let run = |extra: &[&str]| {
        let mut c = command();
        c.env("XDG_CACHE_HOME", cache.path())
            .args([
                "plan",
                &config("olmoe-1b-7b-0924.json"),
                "--vram",
                "2GiB",
                "--ram",
                "64GiB",
            ])
            .args(extra);
        let o = c.output().unwrap();
        Run {
            cmd: "wgmoe plan".into(),
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into(),
            stderr: String::from_utf8_lossy(&o.stderr).into(),
        }
    };
    let r = run(&[]);
    assert_ok(&r);
    assert!(
        r.stdout
            .contains("measured by `wgmoe devices --measure` on Test GPU")
            && r.stdout
                .contains("device read 500.0 GB/s, host->device 12.5 GB/s"),
        "{r}"
    );
    let j = json_of(&run(&["--h2d-gbps", "25", "--json"]));
    assert_eq!(j["bandwidths"]["device_read_gbps"], 500.0);
    assert_eq!(j["bandwidths"]["h2d_gbps"], 25.0);
    assert!(j["bandwidths"]["source"]
        .as_str()
        .unwrap()
        .contains("--h2d-gbps"));
    let e = run(&["--adapter", "radeon"]);
    assert_error(&e, &["--adapter", "radeon"]);
    // No file: no prediction, and the hint.
    let empty = tempfile::tempdir().unwrap();
    let mut c = command();
    c.env("XDG_CACHE_HOME", empty.path()).args([
        "plan",
        &config("olmoe-1b-7b-0924.json"),
        "--vram",
        "2GiB",
        "--json",
    ]);
    let o = c.output().unwrap();
    assert!(o.status.success());
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(j["predicted_decode_tokens_per_s"].is_null() && j["bandwidths"].is_null());
}

#[test]
fn bad_input_is_named() {
    let cfg = config("olmoe-1b-7b-0924.json");
    let r = wgmoe(["plan", &cfg, "--vram", "12XB"]);
    assert_no_panic(&r);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(
        r.stderr.contains("--vram") && r.stderr.contains("12XB"),
        "{r}"
    );
    for (args, names) in [
        (
            vec!["/nonexistent/config.json", "--vram", "8GiB"],
            vec!["/nonexistent/config.json"],
        ),
        (
            vec![&cfg, "--vram", "8GiB", "--context", "0"],
            vec!["--ctx-size"],
        ),
        (
            vec![&cfg, "--vram", "8GiB", "--context", "999999999"],
            vec!["--ctx-size", "max_position_embeddings"],
        ),
        (
            vec![&cfg, "--vram", "8GiB", "--hit-rate", "1.5"],
            vec!["--hit-rate"],
        ),
        (
            vec![
                &cfg,
                "--vram",
                "8GiB",
                "--device-gbps",
                "0",
                "--h2d-gbps",
                "3",
            ],
            vec!["--device-gbps"],
        ),
        (
            vec![&cfg, "--vram", "8GiB", "--staging-buffers", "0"],
            vec!["--staging-buffers"],
        ),
    ] {
        let mut a = vec!["plan"];
        a.extend(args);
        assert_error(&wgmoe(&a), &names);
    }
    let t = tempfile::tempdir().unwrap();
    let bad = t.path().join("config.json");
    std::fs::write(&bad, "{\"model_type\": \"olmoe\"").unwrap();
    assert_error(
        &wgmoe(["plan", &bad.display().to_string(), "--vram", "8GiB"]),
        &["config.json", "JSON"],
    );
    assert_error(
        &wgmoe(["plan", &t.path().display().to_string(), "--vram", "8GiB"]),
        &["config.json"],
    );
}

/// `devices --measure` stores the adapter's figures (keyed by adapter and driver) where
/// `plan` finds them; a second measurement replaces the first. Speeds are not asserted.
#[test]
fn devices_measure_stores_what_plan_predicts_with() {
    let cache = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let o = command()
            .env("XDG_CACHE_HOME", cache.path())
            .args(args)
            .output()
            .unwrap();
        Run {
            cmd: format!("wgmoe {}", args.join(" ")),
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into(),
            stderr: String::from_utf8_lossy(&o.stderr).into(),
        }
    };
    let r = run(&["devices", "--measure"]);
    assert_ok(&r);
    for want in [
        "device read:",
        "host -> device:",
        "queue write:",
        "CPU experts:",
        "round trip:",
        "stored in",
    ] {
        assert!(r.stdout.contains(want), "{r}");
    }
    assert_ok(&run(&["devices", "--measure"]));
    let file = cache.path().join("wgmoe/bandwidth.json");
    let store: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let entries = store["entries"].as_array().unwrap();
    assert_eq!(
        entries.len(),
        1,
        "the second measurement replaced the first"
    );
    let m = &entries[0];
    let devices = json_of(&wgmoe(["devices", "--json"]));
    let default = devices
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["default"] == true)
        .unwrap();
    assert_eq!(m["adapter"], default["name"]);
    for k in [
        "device_read_gbps",
        "h2d_gbps",
        "write_buffer_gbps",
        "cpu_expert_gbps",
        "round_trip_us",
    ] {
        let v = m[k].as_f64().unwrap();
        assert!(v.is_finite() && v > 0.0, "{k}: {v}");
    }
    let cpu = m["device_type"] == "Cpu";
    assert_eq!(cpu, r.stderr.contains("these are CPU numbers"), "{r}");
    let p = run(&[
        "plan",
        &config("qwen3-30b-a3b.json"),
        "--vram",
        "8GiB",
        "--json",
    ]);
    let p = json_of(&p);
    assert_eq!(p["bandwidths"]["device_read_gbps"], m["device_read_gbps"]);
    assert_eq!(p["bandwidths"]["h2d_gbps"], m["h2d_gbps"]);
    assert_eq!(p["bandwidths"]["software_adapter"], cpu);
    assert_eq!(p["bandwidths"]["cpu_expert_gbps"], m["cpu_expert_gbps"]);
    assert!(m["cpu_threads"].as_u64().unwrap() >= 1);
    assert!(p["predicted_decode_tokens_per_s"].as_f64().unwrap() > 0.0);
    // Auto below full residency: the upload and the CPU prediction.
    assert_eq!(p["predictions"].as_array().unwrap().len(), 2, "{p}");
}

/// Issue 24, defect 1: `plan` plans the context `chat` and `serve` allocate by default,
/// min(max_position_embeddings, 4096), so a fixture with 512 positions plans as it is.
#[test]
fn plan_defaults_to_the_context_chat_and_serve_use() {
    let dir = s(&fixture(OLMOE));
    let r = wgmoe(["plan", &dir, "--vram", "1GiB"]);
    assert_ok(&r);
    assert!(r.stdout.contains("Context 512 positions"), "{r}");
    assert_eq!(
        u(&plan_json(&[&dir, "--vram", "1GiB", "--json"]), "context"),
        512
    );
    // A real config: 4096 of its 4096 (OLMoE), at most 4096 (Qwen3: 40960).
    let q3 = plan_json(&[&config("qwen3-30b-a3b.json"), "--vram", "24GiB", "--json"]);
    assert_eq!(u(&q3, "context"), 4096);
    // -c/--ctx-size as llama.cpp names it, and the old --context still accepted.
    for flag in ["-c", "--ctx-size", "--context"] {
        let p = plan_json(&[&dir, "--vram", "1GiB", flag, "100", "--json"]);
        assert_eq!(u(&p, "context"), 100, "{flag}");
    }
}

/// Issue 24, defect 2: the RAM limit is what stays on the host while running (the host
/// source below full residency); a model one card holds fits whatever the RAM, and no
/// multi-GPU engine is recommended for a model one 80 GiB card holds.
#[test]
fn ram_counts_what_stays_on_the_host_and_one_card_is_never_a_cluster() {
    let mixtral = config("mixtral-8x7b-v0.1.json");
    let args = [mixtral.as_str(), "--vram", "80GiB", "--ram", "24GiB"];
    let r = wgmoe(["plan"].iter().chain(args.iter()));
    assert_ok(&r);
    for bad in ["Too big", "vllm", "vLLM", "tensor-parallel", "GPUs"] {
        assert!(!r.stdout.contains(bad), "`{bad}` in a plan that fits:\n{r}");
    }
    assert_eq!(
        r.stdout
            .matches("Host RAM holds what stays on the host")
            .count(),
        1,
        "the RAM limit is said once:\n{r}"
    );
    assert!(r.stdout.contains("Verdict: all experts resident"), "{r}");
    let mut a = args.to_vec();
    a.push("--json");
    let p = plan_json(&a);
    assert_eq!(p["fits"], true, "{p}");
    assert_eq!(u(&p, "resident_experts_per_layer"), 8);
    assert_eq!(p["command"], "wgmoe run MODEL_DIR", "{p}");
    assert!(p["cluster"].is_null(), "{p}");
    assert_eq!(p["one_gpu_holds"], true, "{p}");
    // A 16 GiB card and 16 GiB of RAM: part of the experts fit, their source does not:
    // too big for this machine, and the way out is a bigger card or more RAM, not a
    // cluster (one 80 GiB card holds it).
    let small = [mixtral.as_str(), "--vram", "16GiB", "--ram", "16GiB"];
    let r = wgmoe(["plan"].iter().chain(small.iter()));
    assert_ok(&r);
    assert!(r.stdout.contains("Verdict: too big for one machine"), "{r}");
    assert!(
        r.stdout.contains("a card with at least") && r.stdout.contains("host RAM of at least"),
        "{r}"
    );
    assert!(
        !r.stdout.contains("vLLM") && !r.stdout.contains("GPUs"),
        "{r}"
    );
    let mut a = small.to_vec();
    a.push("--json");
    let p = plan_json(&a);
    assert_eq!(p["fits"], false, "{p}");
    assert!(p["cluster"].is_null() && p["command"].is_null(), "{p}");
    // The same card with RAM for the source: partial residency.
    let p = plan_json(&[&mixtral, "--vram", "16GiB", "--ram", "32GiB", "--json"]);
    assert_eq!(p["fits"], true, "{p}");
    assert_eq!(p["verdict"], "partial residency", "{p}");
}

/// Issue 24, defect 11: counts of one are singular ("at least 1 GPU", "1 server").
#[test]
fn plan_counts_of_one_are_singular() {
    let path = repo().join("tests/data/too-big-moe.config.json");
    let path = path.display().to_string();
    let p = plan_json(&[&path, "--vram", "24GiB", "--ram", "128GiB", "--json"]);
    let int4 = u(&p["cluster"]["needs"][2], "weight_bytes");
    // A GPU just larger than the INT4 weights: they alone fit one, the KV cache and
    // workspace do not.
    let gpu = (int4 + 1).to_string();
    let r = wgmoe([
        "plan",
        &path,
        "--vram",
        "24GiB",
        "--ram",
        "128GiB",
        "--gpu-memory",
        &gpu,
    ]);
    assert_ok(&r);
    assert!(r.stdout.contains("at least 1 GPU;"), "{r}");
    assert!(r.stdout.contains("= 1 server of 8"), "{r}");
    assert!(
        !r.stdout.contains(" 1 GPUs") && !r.stdout.contains("(s)"),
        "{r}"
    );
}

#[test]
fn prefetch_slots_that_block_a_resident_expert_are_named() {
    let cfg = config("mixtral-8x7b-v0.1.json");
    let args = [cfg.as_str(), "--vram", "12GiB", "--device-gbps", "400"];
    let p = plan_json(&[&args[..], &["--json"]].concat());
    let n = u(&p, "resident_experts_per_layer");
    let m = u(&p, "resident_experts_without_prefetch");
    let next = u(&p, "next_resident_bytes");
    assert!(m > n, "{p}");
    assert!(next > 12 * GIB, "n + 1 needs more than the card: {p}");
    let text = wgmoe([&["plan"][..], &args[..]].concat());
    assert_ok(&text);
    for want in [
        format!("+ {} prefetch slots", u(&p, "prefetch_width")),
        format!("n = {} needs", n + 1),
        format!("with --prefetch off, n = {m} fits"),
    ] {
        assert!(text.stdout.contains(&want), "missing `{want}`:\n{text}");
    }
    // Taking the advice gives the residency it promised, and nothing more to say.
    let off = plan_json(&[&args[..], &["--prefetch", "off", "--json"]].concat());
    assert_eq!(u(&off, "resident_experts_per_layer"), m, "{off}");
    assert!(off["resident_experts_without_prefetch"].is_null(), "{off}");
    // Every expert resident: no misses in the heading.
    let full = wgmoe([
        "plan",
        &cfg,
        "--vram",
        "80GiB",
        "--device-gbps",
        "400",
        "--h2d-gbps",
        "25",
    ]);
    assert_ok(&full);
    assert!(
        full.stdout.contains("misses none: every expert resident"),
        "{full}"
    );
    assert!(!full.stdout.contains("uploaded from host RAM"), "{full}");
}

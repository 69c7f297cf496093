//! `wgmoe plan`: the real configs' byte counts (INT4 expert bytes pinned), the fit against
//! the VRAM in closed form, the byte counts against what the loader allocates on the
//! fixtures, a model too big for one machine, bandwidths from `devices --measure`'s file,
//! and bad input.

mod common;

use common::cli::*;
use common::{fixture, init_env, repo};
use serde_json::Value;

const GIB: u64 = 1 << 30;

/// (config file, INT4 bytes of one expert, MoE layers, experts per layer).
const REAL: [(&str, u64, u64, u64); 4] = [
    ("olmoe-1b-7b-0924.json", 3_194_880, 16, 64),
    ("qwen1.5-moe-a2.7b.json", 4_395_008, 24, 60),
    ("qwen3-30b-a3b.json", 2_396_160, 48, 128),
    ("mixtral-8x7b-v0.1.json", 89_456_640, 32, 8),
];

fn plan_json(args: &[&str]) -> Value {
    let mut a = vec!["plan"];
    a.extend_from_slice(args);
    json_of(&wgmoe(&a))
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("`{k}` is not an integer: {v}"))
}

fn config(name: &str) -> String {
    repo()
        .join("models/configs")
        .join(name)
        .display()
        .to_string()
}

#[test]
fn real_configs_pin_expert_bytes_and_fit_the_most_experts_the_vram_holds() {
    for (file, expert, layers, experts) in REAL {
        let path = config(file);
        let mut previous = 0;
        for vram in ["8GiB", "12GiB"] {
            let p = plan_json(&[&path, "--vram", vram, "--ram", "64GiB", "--json"]);
            assert_eq!(u(&p, "expert_bytes"), expert, "{file}");
            assert_eq!(u(&p, "moe_layers"), layers, "{file}");
            assert_eq!(u(&p, "num_experts"), experts, "{file}");
            assert_eq!(
                u(&p, "routed_expert_bytes"),
                layers * experts * expert,
                "{file}"
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
                "{file}: components add up"
            );
            let k = u(&p, "top_k");
            let fixed =
                u(&p, "non_routed_bytes") + u(&p, "kv_cache_bytes") + u(&p, "workspace_bytes");
            let extra = k * per + u(&p, "staging_bytes");
            assert_eq!(
                u(&p, "hot_bytes"),
                fixed + k * per + extra,
                "{file}: the hot part"
            );
            assert_eq!(u(&p, "all_resident_bytes"), fixed + experts * per, "{file}");
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
                    let at = |n: u64| fixed + n * per + extra;
                    assert_eq!(u(&p, "gpu_bytes"), at(n));
                    assert!(
                        at(n) <= v && (at(n + 1) > v || n + 1 == experts),
                        "{file} {vram}: {n}"
                    );
                    assert!(u(&p, "all_resident_bytes") > v);
                    assert_eq!(u(&p, "host_source_bytes"), u(&p, "routed_expert_bytes"));
                    assert!(n >= previous);
                    previous = n;
                    let cmd = p["command"].as_str().unwrap();
                    assert!(cmd.ends_with(&format!("--resident-experts {n}")), "{cmd}");
                }
                None => {
                    assert!(u(&p, "hot_bytes") > v, "{file} {vram}");
                    assert_eq!(p["fits"], false);
                    assert!(p["command"].is_null());
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
        format!("wgmoe run MODEL_DIR --resident-experts {n}"),
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
        "server(s) of 8",
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
            vec!["--context"],
        ),
        (
            vec![&cfg, "--vram", "8GiB", "--context", "999999999"],
            vec!["--context", "max_position_embeddings"],
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

/// The planner's bytes are what the loader allocates: the non-routed weights plus N + top_k
/// slots per MoE layer exactly, and a run's peak within the plan's total.
#[test]
fn plan_byte_counts_equal_the_loaders_allocations_on_the_fixtures() {
    use wgmoe::backend::{Device, DeviceRequest};
    init_env();
    for name in [OLMOE, QWEN, QWEN3, MIXTRAL] {
        let dir = fixture(name);
        let cfg = wgmoe::config::ModelConfig::from_dir(&dir).unwrap();
        let (e, k) = (cfg.num_experts as u64, cfg.top_k as u64);
        let n = k + 1;
        let ctx = 40u64;
        let p = plan_json(&[
            &dir.display().to_string(),
            "--vram",
            "64GiB",
            "--context",
            &ctx.to_string(),
            "--json",
        ]);
        let dev = Device::open(&DeviceRequest::default()).unwrap();
        let ckpt = std::sync::Arc::new(wgmoe::checkpoint::Checkpoint::open(&dir).unwrap());
        let before = dev.tracker().current();
        let w = wgmoe::model::ModelWeights::load(&dev, &cfg, &ckpt, true, Some((n + k) as usize))
            .unwrap();
        let loaded = dev.tracker().current() - before;
        assert_eq!(
            loaded,
            u(&p, "non_routed_bytes") + (n + k) * u(&p, "bytes_per_resident_expert"),
            "{name}: weights with {n} + {k} slots per MoE layer"
        );
        drop(w);
        let full = wgmoe::model::ModelWeights::load(&dev, &cfg, &ckpt, true, None).unwrap();
        assert_eq!(
            dev.tracker().current() - before,
            u(&p, "non_routed_bytes") + u(&p, "routed_expert_bytes"),
            "{name}: every expert resident"
        );
        drop(full);
        // A run at N = top_k + 1 with the plan's context: its peak is within the plan's
        // total at that N (the workspace counts kernels' buffers a device may not use).
        let hot = u(&p, "hot_bytes");
        let at_n = hot + (n - k) * u(&p, "bytes_per_resident_expert");
        let r = wgmoe([
            "run",
            &dir.display().to_string(),
            "--json",
            "--prompt-ids",
            "1,2,3,4,5",
            "-n",
            &(ctx - 5).to_string(),
            "--ignore-eos",
            "--resident-experts",
            &n.to_string(),
        ]);
        let run = json_of(&r);
        let peak = run["metrics"]["peak_gpu_bytes"].as_u64().unwrap();
        assert!(n < e);
        assert!(
            peak <= at_n && peak as f64 >= 0.95 * at_n as f64,
            "{name}: runtime peak {peak} vs plan {at_n}\n{r}"
        );
    }
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
    for k in ["device_read_gbps", "h2d_gbps", "write_buffer_gbps"] {
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
    assert!(p["predicted_decode_tokens_per_s"].as_f64().unwrap() > 0.0);
}

//! One flag name per concept and options that say what they do: `-c/--ctx-size` and
//! `--vram` in every command (the old names as hidden aliases), only the options a command
//! accepts in its help, `--chat` refusing token ids, `--adapter` by index, errors naming
//! their option, and `-n 0`.

mod common;

use common::cli::*;
use common::fixture;

/// Issue 24, defect 5: `chat` and `serve` do not list `--write-profile` (it records a
/// calibration run, which only `run` makes), and do not accept it.
#[test]
fn commands_list_only_the_options_they_accept() {
    for sub in ["chat", "serve"] {
        let r = wgmoe([sub, "--help"]);
        assert_ok(&r);
        assert!(!r.stdout.contains("--write-profile"), "{r}");
        let r = wgmoe([sub, "m", "--write-profile", "p.json"]);
        assert_eq!(r.code, Some(2), "{r}");
        assert!(
            r.stderr.contains("unexpected argument '--write-profile'"),
            "{r}"
        );
    }
    let r = wgmoe(["run", "--help"]);
    assert!(r.stdout.contains("--write-profile"), "{r}");
}

/// Issue 24, defect 6: `--chat` renders text; with `--prompt-ids` it is refused, not
/// silently ignored.
#[test]
fn chat_with_prompt_ids_is_refused() {
    let r = wgmoe(["run", &s(&fixture(QWEN3)), "--prompt-ids", "1,2", "--chat"]);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(
        r.stderr
            .contains("'--prompt-ids <PROMPT_IDS>' cannot be used with '--chat'"),
        "{r}"
    );
    let help = wgmoe(["run", "--help"]).stdout;
    assert!(
        help.contains("not with\n          --prompt-ids") || help.contains("not with --prompt-ids"),
        "{help}"
    );
}

/// One name per concept: `-c/--ctx-size` for the context and `--vram` for GPU memory
/// in every command's help; the old names still work, unlisted.
#[test]
fn one_flag_name_per_concept() {
    for (sub, want, old) in [
        ("plan", "-c, --ctx-size <N>", "--context "),
        ("inspect", "-c, --ctx-size <N>", "--max-context"),
        ("chat", "-c, --ctx-size <N>", "--context "),
        ("serve", "-c, --ctx-size <N>", "--context "),
        ("kernels", "-c, --ctx-size <N>", "--context "),
        ("run", "-c, --ctx-size <N>", "--context "),
        ("bench", "--vram <SIZE>", "--vram-budget"),
        ("bench", "--cpu-experts", "--vram-budget"),
        ("bench", "--tokenizer <FILE>", "--vram-budget"),
        ("eval", "--tokenizer <FILE>", "--vram-budget"),
        (
            "kernels",
            "--expert-precision <EXPERT_PRECISION>",
            "--f16-experts",
        ),
        (
            "plan",
            "--expert-precision <EXPERT_PRECISION>",
            "--int4-strict",
        ),
        ("plan", "--vram <VRAM>", "--vram-budget"),
        ("plan", "--adapter <INDEX|NAME>", "--vram-budget"),
        ("run", "--vram <SIZE>", "--vram-budget"),
        ("chat", "--vram <SIZE>", "--vram-budget"),
    ] {
        let r = wgmoe([sub, "--help"]);
        assert_ok(&r);
        assert!(r.stdout.contains(want), "{sub}: {want}\n{r}");
        assert!(!r.stdout.contains(old), "{sub}: {old}\n{r}");
    }
    let dir = s(&fixture(OLMOE));
    for args in [
        vec!["inspect", &dir, "--max-context", "16", "--json"],
        vec!["inspect", &dir, "-c", "16", "--json"],
        vec![
            "plan",
            &dir,
            "--vram-budget",
            "1GiB",
            "--context",
            "16",
            "--json",
        ],
    ] {
        let v = json_of(&wgmoe(&args));
        assert!(v["kv_cache_bytes"].as_u64().unwrap() > 0, "{v}");
    }
    let r = wgmoe([
        "run",
        &dir,
        "--prompt-ids",
        "1",
        "-n",
        "2",
        "--vram-budget",
        "1KiB",
    ]);
    assert_error(&r, &["--vram 1.0 KiB"]);
}

/// `--adapter N` picks the adapter `wgmoe devices` numbers N; a name no adapter has gets
/// the numbered list with each adapter's backend.
#[test]
fn adapters_are_numbered_and_picked_by_index() {
    let list = json_of(&wgmoe(["devices", "--json"]));
    let list = list.as_array().unwrap().clone();
    assert!(!list.is_empty());
    let dir = s(&fixture(OLMOE));
    let r = wgmoe([
        "run",
        &dir,
        "--prompt-ids",
        "1",
        "-n",
        "2",
        "--adapter",
        "no such card",
    ]);
    assert_error(&r, &["--adapter", "no such card", "[0] "]);
    for (i, a) in list.iter().enumerate() {
        let listed = format!(
            "[{i}] {} ({})",
            a["name"].as_str().unwrap(),
            a["backend"].as_str().unwrap()
        );
        assert!(r.stderr.contains(&listed), "{listed}\n{r}");
    }
    let r = wgmoe([
        "run",
        &dir,
        "--prompt-ids",
        "1",
        "-n",
        "2",
        "--adapter",
        "99",
    ]);
    assert_error(&r, &["--adapter", "no adapter [99]"]);
    // Every adapter by its index, GL included where it runs the kernels.
    for (i, a) in list.iter().enumerate() {
        if a["backend"] == "gl" {
            continue;
        }
        let v = json_of(&wgmoe([
            "run",
            &dir,
            "--prompt-ids",
            "1",
            "-n",
            "2",
            "--json",
            "--adapter",
            &i.to_string(),
        ]));
        assert_eq!(v["metrics"]["adapter"], a["name"], "[{i}] {v}");
        assert_eq!(v["metrics"]["backend"], a["backend"], "[{i}] {v}");
    }
    // `devices --adapter N` marks that one as the default.
    let r = wgmoe(["devices", "--adapter", &(list.len() - 1).to_string()]);
    assert_ok(&r);
    let marked = r
        .stdout
        .lines()
        .find(|l| l.contains("<- default"))
        .unwrap_or("");
    assert!(marked.starts_with(&format!("[{}]", list.len() - 1)), "{r}");
}

/// Errors about a file an option names say which option.
#[test]
fn file_errors_name_their_option() {
    let r = wgmoe(["run", &s(&fixture(OLMOE)), "-f", "/nonexistent/prompt.txt"]);
    assert_error(&r, &["-f/--file", "/nonexistent/prompt.txt"]);
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    // Under a regular file nothing can be created (root included).
    let out = file.join("out");
    let r = wgmoe(["quantize", &s(&fixture(OLMOE)), "-o", &s(&out)]);
    assert_error(&r, &["-o/--out", &s(&out)]);
    let r = wgmoe([
        "synth",
        "--arch",
        "olmoe-1b-7b",
        "--layers",
        "1",
        "--experts",
        "2",
        "--top-k",
        "1",
        "--hidden",
        "256",
        "--vocab",
        "64",
        "-o",
        &s(&out),
    ]);
    assert_error(&r, &["-o/--out", &s(&out)]);
}

/// `-n 0` runs the prompt and reports the prefill (documented in --help).
#[test]
fn run_n_0_runs_the_prompt_only() {
    let dir = s(&fixture(OLMOE));
    let r = wgmoe(["run", &dir, "--prompt-ids", "1,2,3", "-n", "0"]);
    assert_ok(&r);
    assert!(r.stdout.is_empty(), "no text, not even a newline: {r}");
    assert!(r.stderr.contains("3 prompt tokens prefilled in"), "{r}");
    assert!(!r.stderr.contains("decode"), "{r}");
    let v = json_of(&wgmoe([
        "run",
        &dir,
        "--prompt-ids",
        "1,2,3",
        "-n",
        "0",
        "--json",
    ]));
    assert_eq!(v["generated_ids"], serde_json::json!([]), "{v}");
    assert!(
        v["metrics"]["prefill_tokens_per_s"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    let help = wgmoe(["run", "--help"]).stdout;
    assert!(help.contains("0 runs the prompt only"), "{help}");
}

/// Issue 39, defect 4: `kernels` takes `--kv-precision` (docs/models.md lists it among the
/// commands that do) and counts `run`'s default f16 cache unless told otherwise.
#[test]
fn kernels_takes_the_kv_precision() {
    let dir = s(&fixture(OLMOE));
    let kv_of = |extra: &[&str]| {
        let mut args = vec!["kernels", &dir, "--stages", "decode", "-c", "64", "--json"];
        args.extend_from_slice(extra);
        let v = json_of(&wgmoe(&args));
        let attention = v["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["stage"] == "decode/attention")
            .unwrap_or_else(|| panic!("no attention stage: {v}"))["kv_bytes"]
            .as_u64()
            .unwrap();
        (v["kv_precision"].as_str().unwrap().to_string(), attention)
    };
    let (default, f16) = kv_of(&[]);
    assert_eq!(default, "f16");
    let (name, f32) = kv_of(&["--kv-precision", "f32"]);
    assert_eq!(name, "f32");
    assert_eq!(f32, 2 * f16, "f32 {f32} against f16 {f16}");
    assert_eq!(kv_of(&["--kv-precision", "q8_0"]).0, "q8_0");
}

/// Issue 39 (friction): `kernels` runs for minutes on a software adapter and says on stderr
/// what it is doing, stage by stage, while stdout stays the report.
#[test]
fn kernels_reports_progress_on_stderr() {
    let dir = s(&fixture(OLMOE));
    let r = wgmoe(["kernels", &dir, "-c", "64", "--json"]);
    assert_ok(&r);
    json_of(&r);
    let progress: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.starts_with("kernels: "))
        .collect();
    for want in [
        "building",
        "probing decode",
        "probing a prefill chunk",
        "timing",
    ] {
        assert!(
            progress.iter().any(|l| l.contains(want)),
            "no `{want}` progress line: {progress:?}\n{r}"
        );
    }
}

/// Issue 39 (friction): `-n -1` is a bad count for `-n`, not clap's tip to write `-- -1`
/// (which would pass -1 as the model).
#[test]
fn a_negative_count_is_a_bad_value_of_its_option() {
    let dir = s(&fixture(OLMOE));
    for sub in [
        vec!["run", &dir, "-p", "hi", "-n", "-1"],
        vec!["bench", &dir, "-n", "-1"],
        vec!["chat", &dir, "-n", "-1"],
        vec!["eval", &dir, "--prompt-ids", "1,2", "-n", "-1"],
    ] {
        let r = wgmoe(&sub);
        assert_eq!(r.code, Some(2), "{r}");
        assert!(
            r.stderr.contains("invalid value '-1'") && r.stderr.contains("--max-new-tokens"),
            "{r}"
        );
        assert!(!r.stderr.contains("'-- -1'"), "{r}");
    }
}

/// `kernels --expert-precision f16` (the name every command uses) counts f16 experts, as
/// the old `--f16-experts` still does; int4 reads fewer bytes.
#[test]
fn kernels_takes_the_expert_precision() {
    let dir = s(&fixture(OLMOE));
    let bytes = |extra: &[&str]| {
        let mut args = vec!["kernels", &dir, "--stages", "decode", "-c", "64", "--json"];
        args.extend_from_slice(extra);
        let v = json_of(&wgmoe(&args));
        v["bytes_per_token"]
            .as_u64()
            .unwrap_or_else(|| panic!("{v}"))
    };
    let f16 = bytes(&["--expert-precision", "f16"]);
    assert_eq!(bytes(&["--f16-experts"]), f16);
    assert!(bytes(&[]) < f16);
    let r = wgmoe(["plan", &dir, "--vram", "1GiB", "--expert-precision", "f16"]);
    assert_error(&r, &["--expert-precision", "INT4"]);
}

/// Issue 39 (friction): `run -c/--ctx-size N` sizes the KV cache to N positions and stops
/// generating when it is full; a prompt that does not fit, 0, or more than the model's
/// max_position_embeddings is an error naming the option.
#[test]
fn run_takes_the_ctx_size() {
    let dir = s(&fixture(QWEN3));
    let (r, v) = run_json_with(&dir, &["-c", "7"]);
    assert_eq!(v["generated_ids"].as_array().unwrap().len(), 4, "{v}");
    assert!(r.stderr.contains("--ctx-size is 7"), "{r}");
    // The tokens are the first ones of an unlimited run.
    let (_, full) = run_json_with(&dir, &[]);
    assert_eq!(
        v["generated_ids"].as_array().unwrap()[..],
        full["generated_ids"].as_array().unwrap()[..4],
    );
    for (c, says) in [
        (
            "2",
            "3 prompt tokens do not fit in a context of 2 positions",
        ),
        ("0", "must be at least 1"),
        ("513", "exceeds max_position_embeddings = 512"),
    ] {
        let r = wgmoe([
            "run",
            &dir,
            "--prompt-ids",
            "1,2,3",
            "-n",
            "8",
            "--ctx-size",
            c,
        ]);
        assert_error(&r, &["--ctx-size", says]);
    }
}

fn run_json_with(dir: &str, extra: &[&str]) -> (Run, serde_json::Value) {
    let mut args = vec![
        "run",
        dir,
        "--prompt-ids",
        "1,2,3",
        "-n",
        "8",
        "--ignore-eos",
        "--json",
    ];
    args.extend_from_slice(extra);
    let r = wgmoe(&args);
    let v = json_of(&r);
    (r, v)
}

/// Issue 39 (friction): `plan --adapter INDEX` picks the stored measurements of the
/// adapter `wgmoe devices` numbers INDEX (as `run --adapter` does), not the latest entry.
#[test]
fn plan_takes_an_adapter_index() {
    let list = json_of(&wgmoe(["devices", "--json"]));
    let first = list[0]["name"].as_str().unwrap().to_string();
    let cache = tempfile::tempdir().unwrap();
    let dir = cache.path().join("wgmoe");
    std::fs::create_dir_all(&dir).unwrap();
    let entry = |name: &str, read: f64, date: &str| {
        serde_json::json!({"adapter": name, "backend": "vulkan", "driver": "x 1",
            "device_type": "Cpu", "device_read_gbps": read, "h2d_gbps": 3.0,
            "write_buffer_gbps": 3.0, "read_bytes": 1024, "h2d_bytes": 1024,
            "repetitions": 1, "date_utc": date})
    };
    let store = serde_json::json!({"entries": [
        entry(&first, 7.0, "2025-01-01T00:00:00Z"),
        entry("Later GPU", 900.0, "2026-01-01T00:00:00Z"),
    ]});
    std::fs::write(dir.join("bandwidth.json"), store.to_string()).unwrap();
    let plan = |extra: &[&str]| {
        let o = command()
            .env("XDG_CACHE_HOME", cache.path())
            .args(["plan", &config("olmoe-1b-7b-0924.json"), "--vram", "2GiB"])
            .args(["--ram", "64GiB", "--json"])
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    assert_eq!(plan(&[])["bandwidths"]["device_read_gbps"], 900.0);
    let by_index = plan(&["--adapter", "0"]);
    assert_eq!(
        by_index["bandwidths"]["device_read_gbps"], 7.0,
        "{by_index}"
    );
    assert!(by_index["bandwidths"]["source"]
        .as_str()
        .unwrap()
        .contains(&first));
    assert_eq!(
        plan(&["--adapter", "later"])["bandwidths"]["device_read_gbps"],
        900.0
    );
    let r = wgmoe([
        "plan",
        &config("olmoe-1b-7b-0924.json"),
        "--vram",
        "2GiB",
        "--adapter",
        "99",
    ]);
    assert_error(&r, &["--adapter", "no adapter [99]"]);
}

/// Issue 39 (friction): `bench --cpu-experts` and `bench --vram` as `run` takes them, and
/// `bench --tokenizer`/`eval --tokenizer` in place of the model's own tokenizer.
#[test]
fn bench_takes_cpu_experts_vram_and_a_tokenizer() {
    let dir = fixture(QWEN3);
    let rec = |extra: &[&str]| rec_in(&dir, extra);
    let cpu = rec(&["--cpu-experts"]);
    assert_eq!(cpu["resident_experts_per_layer"], 0, "{cpu}");
    // The budget derives the residency: below what every expert needs (1.12 MiB here),
    // fewer are resident; above it, all.
    let small = rec(&["--vram", "1100KiB"]);
    let n = small["resident_experts_per_layer"].as_u64().unwrap();
    assert!(n < small["num_experts"].as_u64().unwrap(), "{small}");
    let big = rec(&["--vram", "1400KiB"]);
    assert_eq!(
        big["resident_experts_per_layer"], big["num_experts"],
        "{big}"
    );
    let r = quick_bench(&dir, &["--vram", "1GiB", "--resident-experts", "3"]);
    assert_eq!(r.code, Some(2), "{r}");
    // A model directory without tokenizer.json: the prompts are bytes, unless --tokenizer.
    let bare = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if name != "tokenizer.json" && name != "tokenizer_config.json" {
            std::fs::copy(&p, bare.path().join(&name)).unwrap();
        }
    }
    let bytes = rec_in(bare.path(), &[]);
    let tok = dir.join("tokenizer.json");
    let given = rec_in(bare.path(), &["--tokenizer", tok.to_str().unwrap()]);
    let own = rec_in(&dir, &[]);
    assert_eq!(given["prompt_tokens"], own["prompt_tokens"], "{given}");
    assert_ne!(given["prompt_tokens"], bytes["prompt_tokens"], "{bytes}");
    let r = quick_bench(bare.path(), &["--tokenizer", "/no/such/tokenizer.json"]);
    assert_error(&r, &["--tokenizer", "/no/such/tokenizer.json"]);
    // eval encodes -p with --tokenizer (the bare directory has none of its own).
    let eval = |model: &std::path::Path, extra: &[&str]| {
        let mut args = vec!["eval", model.to_str().unwrap(), "-p", HELLO, "-n", "2"];
        args.extend_from_slice(&["--expert-precision", "int4", "--json"]);
        args.extend_from_slice(extra);
        wgmoe(&args)
    };
    let r = eval(bare.path(), &[]);
    assert_error(&r, &["tokenizer.json", "needed to encode --prompt"]);
    let v = json_of(&eval(bare.path(), &["--tokenizer", tok.to_str().unwrap()]));
    let own = json_of(&eval(&dir, &[]));
    assert_eq!(v["prompt_ids"], own["prompt_ids"], "{v}");
}

fn rec_in(dir: &std::path::Path, extra: &[&str]) -> serde_json::Value {
    let out = tempfile::tempdir().unwrap();
    let json = out.path().join("b.json");
    let mut args = vec!["-n", "2", "--json-out", json.to_str().unwrap()];
    args.extend_from_slice(extra);
    assert_ok(&quick_bench(dir, &args));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    v[0].clone()
}

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

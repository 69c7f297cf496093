//! `run --live`: off (with a note) when stdout is not a terminal, so piped output is the
//! plain text; in a terminal (a pseudo-terminal from util-linux's `script`), frames of the
//! grid are drawn over each other and the text follows.

mod common;

use common::cli::*;
use common::fixture;

#[test]
fn live_is_off_when_stdout_is_not_a_terminal() {
    let args = |live: bool| {
        let mut a = vec![
            "run".to_string(),
            s(&fixture(QWEN3)),
            "--prompt-ids".into(),
            "1,2,3,4".into(),
            "-n".into(),
            "6".into(),
            "--ignore-eos".into(),
        ];
        if live {
            a.push("--live".into());
        }
        a
    };
    let plain = wgmoe(args(false));
    let live = wgmoe(args(true));
    assert_ok(&live);
    assert!(
        live.stderr
            .contains("--live is off: stdout is not a terminal"),
        "{live}"
    );
    assert_eq!(live.stdout, plain.stdout);
    assert!(!live.stdout.contains('\x1b'));
}

#[test]
fn live_draws_frames_in_a_terminal() {
    let t = tempfile::tempdir().unwrap();
    let log = t.path().join("typescript");
    let cmd = format!(
        "{} run {} --prompt-ids 1,2,3,4 -n 12 --ignore-eos --resident-experts 4 --live",
        env!("CARGO_BIN_EXE_wgmoe"),
        s(&fixture(QWEN3))
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &cmd, &s(&log)])
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .env("COLUMNS", "200")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("util-linux `script` runs the command in a pseudo-terminal");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let screen = std::fs::read_to_string(&log).unwrap();
    assert!(
        screen.contains("wgmoe live:") && screen.contains("4 of 7 expert slots per layer, lru"),
        "{screen}"
    );
    assert!(screen.contains("\x1b[48;5;"), "coloured cells");
    // The final frame says every step was seen: 4 prompt tokens + 11 decoded = 12 steps
    // (one prefill step, 11 decode steps), 15 tokens.
    assert!(
        screen.contains("step 12  tokens 15  wgmoe live:"),
        "{screen}"
    );
    // Frames after the first are drawn over the previous one (cursor up 5 lines: title,
    // legend, two MoE layers, text).
    assert!(screen.contains("\x1b[5A"), "{screen}");
}

/// The marks of one grid line of a frame: the text of each cell after its colours.
fn marks(line: &str) -> Vec<char> {
    line.split("\x1b[38;5;")
        .skip(1)
        .map(|cell| {
            let text = &cell[cell.find('m').unwrap() + 1..];
            // Cells are three characters wide at 200 columns: the mark is centred.
            text.chars().take(3).find(|c| *c != ' ').unwrap_or(' ')
        })
        .collect()
}

/// Issue 24, defect 3: `--live` marks with `*` what is on the GPU (what the trace of the
/// same run says) and with `c` what the CPU computed, not every expert chosen.
#[test]
fn live_marks_what_is_on_the_gpu_and_what_the_cpu_computed() {
    let t = tempfile::tempdir().unwrap();
    let log = t.path().join("typescript");
    let trace = t.path().join("t.jsonl");
    let cmd = format!(
        "{} run {} --prompt-ids 1,2,3,4 -n 12 --ignore-eos --resident-experts 4 --miss-policy cpu --live --trace {}",
        env!("CARGO_BIN_EXE_wgmoe"),
        s(&fixture(QWEN3)),
        s(&trace)
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &cmd, &s(&log)])
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .env("COLUMNS", "200")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("util-linux `script` runs the command in a pseudo-terminal");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let screen = std::fs::read_to_string(&log).unwrap();
    assert!(
        screen.contains("*: on the GPU, c: computed on the CPU"),
        "{screen}"
    );
    let last = &screen[screen.rfind("step 12  tokens 15").expect("the final frame")..];
    let rows: Vec<Vec<char>> = last.lines().skip(2).take(2).map(marks).collect();
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let on = on_gpu_at_the_end(&lines);
    let mut cpu = std::collections::BTreeSet::new();
    for v in &lines {
        let ids = v["experts"].as_array().unwrap();
        for (i, c) in v["cpu"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            if c == true {
                cpu.insert((v["layer"].as_u64().unwrap(), ids[i].as_u64().unwrap()));
            }
        }
    }
    assert!(!cpu.is_empty(), "the CPU computed misses");
    for (row, layer) in rows.iter().zip([0u64, 2]) {
        assert_eq!(row.len(), 7, "{last}");
        for (e, &m) in row.iter().enumerate() {
            let key = (layer, e as u64);
            let want = if on.get(&key).copied().unwrap_or(false) {
                '*'
            } else if cpu.contains(&key) {
                'c'
            } else {
                ' '
            };
            assert_eq!(m, want, "layer {layer} expert {e}:\n{last}");
        }
    }
}

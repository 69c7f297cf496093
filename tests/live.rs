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
        screen.contains("wgmoe live:") && screen.contains("4 of 7 experts resident, lru"),
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

//! `wgmoe chat` through the real binary with stdin not a terminal: lines in, answers out.
//! Two turns equal to fresh `wgmoe run`s of the conversation, the second prefilling only
//! its new tokens; /reset, /stats, /exit and unknown commands; the context limit with and
//! without --context-shift; Ctrl-C during an answer and at the prompt.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::cli::*;
use common::fixture;
use wgmoe::session::chat::{chat_prompt, Message, Role};
use wgmoe::session::common_prefix;
use wgmoe::tokenizer::Tokenizer;

const LIMIT: Duration = Duration::from_secs(120);

/// `wgmoe chat ARGS` with `input` on stdin (then closed).
fn chat(args: &[String], input: &str) -> Run {
    let mut child = command()
        .arg("chat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn wgmoe chat");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_string();
    let writer = std::thread::spawn(move || {
        // The command may exit (`/exit`) before reading everything.
        let _ = stdin.write_all(input.as_bytes());
    });
    let read = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = r.read_to_end(&mut s);
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out = read(Box::new(child.stdout.take().unwrap()));
    let err = read(Box::new(child.stderr.take().unwrap()));
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("wgmoe chat {args:?} did not finish within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    writer.join().unwrap();
    Run {
        cmd: format!("wgmoe chat {}", args.join(" ")),
        code: status.code(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// (prompt, cached, prefilled, generated) of each turn's summary line on stderr.
fn turns(r: &Run) -> Vec<[usize; 4]> {
    r.stderr
        .lines()
        .filter(|l| l.starts_with('[') && l.contains(" prompt tokens ("))
        .map(|l| {
            let nums: Vec<usize> = l
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .take(4)
                .map(|s| s.parse().unwrap())
                .collect();
            [nums[0], nums[1], nums[2], nums[3]]
        })
        .collect()
}

#[test]
fn two_turns_equal_fresh_runs_and_the_second_prefills_only_its_new_tokens() {
    let dir = fixture(OLMOE);
    let m = dir.display().to_string();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let n = 6;
    let ns = n.to_string();
    let (u1, u2) = ("Hello there", "Tell me more");
    let r = chat(
        &strings(&[&m, "-n", &ns, "--ignore-eos"]),
        &format!("{u1}\n{u2}\n/stats\n"),
    );
    assert_ok(&r);
    // Turn 1 is `run --chat`; turn 2 is a fresh run of the whole conversation.
    let first = json_of(&wgmoe(strings(&[
        "run",
        &m,
        "--chat",
        "-p",
        u1,
        "-n",
        &ns,
        "--ignore-eos",
        "--json",
    ])));
    let p1: Vec<u32> = ids(&first, "prompt_ids")
        .iter()
        .map(|&x| x as u32)
        .collect();
    let g1: Vec<u32> = ids(&first, "generated_ids")
        .iter()
        .map(|&x| x as u32)
        .collect();
    let a1 = wgmoe(strings(&[
        "run",
        &m,
        "--chat",
        "-p",
        u1,
        "-n",
        &ns,
        "--ignore-eos",
    ]));
    assert_ok(&a1);
    let conv = [
        Message::new(Role::User, u1),
        Message::new(Role::Assistant, tok.decode(&g1).unwrap()),
        Message::new(Role::User, u2),
    ];
    let p2 = chat_prompt(&tok, &conv).unwrap();
    let ids2: Vec<String> = p2.iter().map(|t| t.to_string()).collect();
    let a2 = wgmoe(strings(&[
        "run",
        &m,
        "--prompt-ids",
        &ids2.join(","),
        "-n",
        &ns,
        "--ignore-eos",
    ]));
    assert_ok(&a2);
    let answers = format!("{}{}", a1.stdout, a2.stdout);
    assert!(
        r.stdout.starts_with(&answers),
        "answers differ from fresh runs:\n{r}\nexpected:\n{answers}"
    );
    // The per-turn prefill split.
    let mut held = p1.clone();
    held.extend_from_slice(&g1[..n - 1]);
    let shared = common_prefix(&held, &p2);
    assert!(shared >= p1.len());
    let t = turns(&r);
    assert_eq!(
        t,
        vec![
            [p1.len(), 0, p1.len(), n],
            [p2.len(), shared, p2.len() - shared, n]
        ],
        "{r}"
    );
    // /stats: the last turn and the session.
    let stats = &r.stdout[answers.len()..];
    assert!(
        stats.starts_with(&format!(
            "last turn: {} prompt tokens ({shared} cached, {} prefilled), {n} generated",
            p2.len(),
            p2.len() - shared
        )),
        "{r}"
    );
    assert!(stats.contains("session: 2 turns"), "{r}");
    assert!(
        stats.contains(&format!(
            "the cache holds {} of 512 positions",
            p2.len() + n - 1
        )),
        "{r}"
    );
}

#[test]
fn reset_exit_and_unknown_commands() {
    let dir = fixture(QWEN3);
    let m = dir.display().to_string();
    let r = chat(
        &strings(&[&m, "-n", "3", "--ignore-eos", "--system", "Be brief."]),
        "first\n/nonsense\n\n/reset\nfirst\n/exit\nnever read\n",
    );
    assert_ok(&r);
    assert!(r.stderr.contains("unknown command /nonsense"), "{r}");
    let t = turns(&r);
    assert_eq!(t.len(), 2, "/exit stops reading:\n{r}");
    // After /reset the conversation is the system message and the new line again: the
    // same prompt, all of it but its last token cached.
    assert_eq!(t[0][0], t[1][0], "{r}");
    assert_eq!(t[1][1], t[0][0] - 1, "{r}");
    // The answers are the same (greedy, same prompt).
    let out = r.stdout.as_bytes();
    let half = out.len() / 2;
    assert!(out.len() > 2 && out[..half] == out[half..], "{r}");
    // A template that refuses a system message is named before loading.
    let r = chat(&strings(&[&s(&fixture(MIXTRAL)), "--system", "x"]), "");
    assert_error(&r, &["--system", "the chat template refuses it"]);
}

#[test]
fn a_full_context_is_refused_or_shifted() {
    let dir = fixture(OLMOE);
    let m = dir.display().to_string();
    let input = "one two three\nfour five six\nseven eight nine\nten eleven twelve\n";
    let args = |shift: bool| {
        let mut v = strings(&[&m, "-n", "8", "--ignore-eos", "--ctx-size", "48"]);
        if shift {
            v.push("--context-shift".into());
        }
        v
    };
    let r = chat(&args(false), input);
    assert_ok(&r);
    let t = turns(&r);
    assert!(t.len() < 4, "{r}");
    assert!(
        r.stderr.contains("exceed the context of 48 positions")
            && r.stderr.contains("--context-shift"),
        "{r}"
    );
    assert!(t.iter().all(|x| x[0] + x[3] <= 48), "{r}");
    let r = chat(&args(true), input);
    assert_ok(&r);
    let t = turns(&r);
    assert_eq!(t.len(), 4, "{r}");
    assert!(
        r.stderr
            .contains("(context shift: the 2 oldest messages were dropped)"),
        "{r}"
    );
    assert!(t.iter().all(|x| x[0] + x[3] <= 48), "{r}");
}

#[test]
fn ctrl_c_stops_an_answer_and_at_the_prompt_ends_the_chat() {
    let (_t, dir) = copy_fixture(OLMOE);
    // Room for more tokens than any adapter makes in the test's time.
    edit_config(&dir, |c| {
        c.insert("max_position_embeddings".into(), 8192.into());
    });
    let mut child = command()
        .arg("chat")
        .arg(s(&dir))
        .args(["-n", "8000", "--ignore-eos", "--ctx-size", "8192"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let (tx, rx) = mpsc::channel::<(bool, String)>();
    let mut out = child.stdout.take().unwrap();
    let txo = tx.clone();
    let out_thread = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 256];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
            let _ = txo.send((true, String::from_utf8_lossy(&all).into_owned()));
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    let err = child.stderr.take().unwrap();
    let err_thread = std::thread::spawn(move || {
        let mut all = String::new();
        for l in BufReader::new(err).lines().map_while(|l| l.ok()) {
            all.push_str(&l);
            all.push('\n');
            let _ = tx.send((false, all.clone()));
        }
        all
    });
    // Waits until stdout or stderr satisfies `f`.
    let wait = |f: &dyn Fn(bool, &str) -> bool| {
        let t0 = Instant::now();
        while t0.elapsed() < LIMIT {
            if let Ok((o, text)) = rx.recv_timeout(Duration::from_millis(50)) {
                if f(o, &text) {
                    return;
                }
            }
        }
        panic!("timed out waiting");
    };
    let sigint = |pid: u32| {
        let st = std::process::Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    };
    writeln!(stdin, "Tell me a long story").unwrap();
    stdin.flush().unwrap();
    wait(&|o, t| o && !t.is_empty());
    sigint(child.id());
    wait(&|o, t| !o && t.contains("stopped by Ctrl-C"));
    // The session goes on: the next line is answered from the kept conversation.
    writeln!(stdin, "/stats").unwrap();
    stdin.flush().unwrap();
    // One turn, singular (issue 24, defect 11).
    wait(&|o, t| o && t.contains("session: 1 turn,"));
    // At the prompt, Ctrl-C leaves: a newline, status 0.
    std::thread::sleep(Duration::from_millis(200));
    sigint(child.id());
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < LIMIT,
            "chat did not exit on Ctrl-C at the prompt"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(stdin);
    let out = out_thread.join().unwrap();
    let err = err_thread.join().unwrap();
    assert_eq!(status.code(), Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.ends_with("positions\n\n"), "{out:?}");
    let r = Run {
        cmd: "wgmoe chat".into(),
        code: status.code(),
        stdout: out.clone(),
        stderr: err.clone(),
    };
    let t = turns(&r);
    assert_eq!(t.len(), 1, "{r}");
    assert!((1..8000).contains(&t[0][3]), "{r}");
    assert!(err.contains("stopped by Ctrl-C]"), "{r}");
    assert!(!err.contains("panicked"), "{err}");
}

/// A copy of the OLMoE fixture whose tokenizer has no chat template.
fn without_template() -> (tempfile::TempDir, std::path::PathBuf) {
    let (t, dir) = copy_fixture(OLMOE);
    let p = dir.join("tokenizer_config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(&p, v.to_string()).unwrap();
    (t, dir)
}

/// A model without a chat template chats in plain `User:`/`Assistant:` lines, with a
/// one-line note; `--chat-template` picks a built-in template or a file instead.
#[test]
fn chat_without_a_template_falls_back_and_chat_template_picks_one() {
    let (t, dir) = without_template();
    let m = s(&dir);
    let r = chat(&strings(&[&m, "-n", "2", "--ignore-eos"]), "hello\n");
    assert_ok(&r);
    let notes: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains("has no chat template"))
        .collect();
    assert_eq!(notes.len(), 1, "{r}");
    assert!(
        notes[0].contains("plain User:/Assistant: lines") && notes[0].contains("--chat-template"),
        "{r}"
    );
    // The prompt is the plain rendering: `run --chat` shows its ids.
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let prompt_of = |extra: &[&str]| {
        let mut a = vec!["run", &m, "-p", "hello", "--chat", "-n", "1", "--json"];
        a.extend_from_slice(extra);
        ids(&json_of(&wgmoe(&a)), "prompt_ids")
            .into_iter()
            .map(|x| x as u32)
            .collect::<Vec<u32>>()
    };
    let plain = tok.encode("User: hello\nAssistant:", false).unwrap();
    assert_eq!(prompt_of(&[]), plain);
    assert_eq!(prompt_of(&["--chat-template", "plain"]), plain);
    let chatml = tok
        .encode(
            "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
            false,
        )
        .unwrap();
    assert_eq!(prompt_of(&["--chat-template", "chatml"]), chatml);
    // A Jinja file.
    let file = t.path().join("t.jinja");
    std::fs::write(
        &file,
        "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}",
    )
    .unwrap();
    assert_eq!(
        prompt_of(&["--chat-template", &s(&file)]),
        tok.encode("<<hello>>", false).unwrap()
    );
    let r = wgmoe([
        "run",
        &m,
        "-p",
        "x",
        "--chat",
        "--chat-template",
        "nonesuch",
    ]);
    assert_error(
        &r,
        &["--chat-template", "nonesuch", "chatml, llama-2, plain"],
    );
    // llama-2 folds a system message into the first turn.
    let mut tok = Tokenizer::from_dir(&dir).unwrap();
    wgmoe::session::template::choose(&mut tok, Some("llama-2"), &dir).unwrap();
    let text = tok
        .apply_chat_template(
            &[
                ("system".into(), "Be brief.".into()),
                ("user".into(), "hi".into()),
                ("assistant".into(), "yes".into()),
                ("user".into(), "more".into()),
            ],
            true,
        )
        .unwrap();
    assert!(
        text.contains("[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nhi [/INST] yes ")
            && text.ends_with("[INST] more [/INST]"),
        "{text:?}"
    );
}

/// A template's refusal names the message and the rule in wgmoe's words, then the
/// template's own text.
#[test]
fn a_template_refusal_names_the_message_and_the_rule() {
    let dir = fixture(MIXTRAL);
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let e = chat_prompt(
        &tok,
        &[
            Message::new(Role::System, "Be brief."),
            Message::new(Role::User, "hi"),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("message 0 (system): this chat template takes no system message"),
        "{e}"
    );
    assert!(
        e.contains("says: \"Conversation roles must alternate"),
        "{e}"
    );
    let e = chat_prompt(
        &tok,
        &[Message::new(Role::User, "a"), Message::new(Role::User, "b")],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("message 1 (user): the roles must alternate"),
        "{e}"
    );
}

/// Issue 39, defect 10: after /reset, /stats counts the new conversation only (no last
/// turn, no turns, no positions of its own), and then its first turn.
#[test]
fn reset_starts_the_stats_over() {
    let m = s(&fixture(OLMOE));
    let r = chat(
        &strings(&[&m, "-n", "3", "--ignore-eos"]),
        "first\nsecond\n/reset\n/stats\nfirst\n/stats\n",
    );
    assert_ok(&r);
    let t = turns(&r);
    assert_eq!(t.len(), 3, "{r}");
    let after_reset = r
        .stdout
        .lines()
        .find(|l| l.starts_with("last turn:"))
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(after_reset, "last turn: none yet", "{r}");
    let sessions: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.starts_with("session:"))
        .collect();
    assert_eq!(sessions.len(), 2, "{r}");
    assert!(
        sessions[0].starts_with("session: 0 turns, 0 prompt tokens")
            && sessions[0].contains("the conversation holds 0 of 512 positions"),
        "{r}"
    );
    // The first turn after /reset, alone: its prompt and answer are what the cache holds.
    let [p, cached, _, n] = t[2];
    assert!(
        sessions[1].starts_with(&format!(
            "session: 1 turn, {p} prompt tokens ({cached} cached"
        )),
        "{r}"
    );
    assert!(
        sessions[1].contains(&format!("the cache holds {} of 512", p + n - 1)),
        "{r}"
    );
}

/// Issue 39, defects 11 and 13: a message that fits without --context-shift fits with it
/// (the answer is cut where the context ends, as without); a message alone too long is
/// not told that --context-shift would help.
#[test]
fn context_shift_never_refuses_what_fits_without_it() {
    let dir = fixture(OLMOE);
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let ctx = 48;
    // A message whose prompt leaves fewer positions than the shift's reserve (half the
    // context), but some.
    let mut words = String::new();
    let mut len = 0;
    for w in [
        "one", "two", "three", "four", "five", "six", "seven", "eight",
    ]
    .iter()
    .cycle()
    {
        words.push_str(w);
        words.push(' ');
        len = chat_prompt(&tok, &[Message::new(Role::User, words.trim_end())])
            .unwrap()
            .len();
        if len + ctx / 2 > ctx {
            break;
        }
    }
    assert!(len < ctx - 1, "{len}");
    let line = format!("{}\n", words.trim_end());
    for shift in [false, true] {
        let mut args = strings(&[&s(&dir), "-n", "40", "--ignore-eos", "--ctx-size", "48"]);
        if shift {
            args.push("--context-shift".into());
        }
        let r = chat(&args, &line);
        assert_ok(&r);
        let t = turns(&r);
        assert_eq!(t.len(), 1, "shift {shift}:\n{r}");
        assert_eq!(t[0][0], len, "{r}");
        assert!(t[0][0] + t[0][3] <= ctx, "{r}");
    }
    // Too long alone: no --context-shift advice.
    let long = format!("{}\n", words.repeat(4));
    let r = chat(&strings(&[&s(&dir), "-n", "4", "--ctx-size", "48"]), &long);
    assert_ok(&r);
    assert!(
        r.stderr.contains("exceed the context of 48 positions"),
        "{r}"
    );
    assert!(!r.stderr.contains("--context-shift"), "{r}");
}

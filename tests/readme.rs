//! The guides' commands stay true: every fenced `wgmoe ...` line of README.md and
//! docs/*.md that runs on what the repository holds (a path under `models/`, `docs/` or
//! `tests/data/`, or what an earlier such command wrote) is run with the built binary and
//! must succeed. `cargo run --release -- ARGS` is `wgmoe ARGS`; `printf '...' | wgmoe ...`
//! feeds the text to stdin; `wgmoe serve` starts on a free port and the guide's `curl`
//! bodies are posted to it. Each file runs in its own directory, with `models`, `tests` and
//! `bench` linked and `docs` copied, so what the commands write stays there. An output
//! excerpt (a `text` block opening with `$ wgmoe ...`) is what that command prints: its
//! lines, in order, are lines of the command's output (lines may be left out, marked `...`
//! or not; none changed).

mod common;

use std::path::{Path, PathBuf};

use common::cli::*;
use common::repo;
use common::server::Server;

/// One command of a guide.
#[derive(Debug)]
struct Line {
    /// `file:line`, for messages.
    at: String,
    args: Vec<String>,
    stdin: Option<String>,
    /// The next line of the same block (a `curl`'s documented answer).
    next: Option<String>,
}

/// The command lines of the fenced blocks of `text` (in a `text` block, which shows
/// output, only the lines after a `$ ` prompt), continuation lines joined: (`file:line`,
/// the line, the line after it in the block).
fn fenced_lines(name: &str, text: &str) -> Vec<(String, String, Option<String>)> {
    let mut out = Vec::new();
    // None: outside a block; Some(true): a `text` block (output, with `$ ` commands).
    let mut block: Option<bool> = None;
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if let Some(info) = l.trim_start().strip_prefix("```") {
            block = match block {
                None => Some(info.trim() == "text"),
                Some(_) => None,
            };
            i += 1;
            continue;
        }
        let cmd = match (block, l.strip_prefix("$ ")) {
            (None, _) | (Some(true), None) => {
                i += 1;
                continue;
            }
            (_, Some(c)) => c,
            (Some(false), None) => l,
        };
        let at = format!("{name}:{}", i + 1);
        let mut cmd = cmd.to_string();
        while cmd.ends_with('\\') && i + 1 < lines.len() {
            cmd.pop();
            i += 1;
            cmd.push_str(lines[i].trim_start());
        }
        let next = lines
            .get(i + 1)
            .filter(|n| !n.trim_start().starts_with("```"))
            .map(|n| n.to_string());
        out.push((at, cmd, next));
        i += 1;
    }
    out
}

/// Splits `cmd` as a shell would; the comment after `#` goes.
fn split(at: &str, cmd: &str) -> Vec<String> {
    let mut v = shlex::split(cmd).unwrap_or_else(|| panic!("{at}: not a shell command: {cmd}"));
    if let Some(c) = v.iter().position(|a| a.starts_with('#')) {
        v.truncate(c);
    }
    v
}

/// The wgmoe commands (and curls) of a guide.
fn commands(name: &str, text: &str) -> (Vec<Line>, Vec<Line>) {
    let (mut wgmoe, mut curl) = (Vec::new(), Vec::new());
    for (at, cmd, next) in fenced_lines(name, text) {
        let (stdin, rest) = match cmd.split_once(" | ") {
            Some((p, rest)) if p.starts_with("printf ") => {
                let text = split(&at, p)[1].replace("\\n", "\n");
                (Some(text), rest.to_string())
            }
            _ => (None, cmd.clone()),
        };
        let rest = match rest.split_once("cargo run --release -- ") {
            Some((_, args)) => format!("wgmoe {args}"),
            None => rest,
        };
        if rest.starts_with("wgmoe ") {
            let args = split(&at, &rest)[1..].to_vec();
            wgmoe.push(Line {
                at,
                args,
                stdin,
                next,
            });
        } else if rest.starts_with("curl ") {
            let args = split(&at, &rest);
            curl.push(Line {
                at,
                args,
                stdin: None,
                next,
            });
        }
    }
    (wgmoe, curl)
}

/// The options whose value is a file or directory the command writes.
const OUTPUTS: [&str; 5] = ["-o", "--out", "--trace", "--json-out", "--plot"];

fn runs_here(l: &Line, written: &[String]) -> bool {
    l.args.iter().any(|a| {
        ["models/", "docs/", "tests/data/"]
            .iter()
            .any(|p| a.starts_with(p))
            || written.contains(a)
    })
}

/// A working directory for one guide: `models`, `tests` and `bench` linked, `docs` copied.
fn workdir() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    for d in ["models", "tests", "bench"] {
        common::symlink_dir(&repo().join(d), &t.path().join(d)).unwrap();
    }
    let docs = t.path().join("docs");
    std::fs::create_dir(&docs).unwrap();
    for e in std::fs::read_dir(repo().join("docs")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), docs.join(e.file_name())).unwrap();
    }
    t
}

fn run_in(dir: &Path, l: &Line, cache: &Path) -> Run {
    use std::io::Write;
    use std::process::Stdio;
    let mut c = command();
    c.args(&l.args)
        .current_dir(dir)
        .env("XDG_CACHE_HOME", cache)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if l.stdin.is_some() {
        c.stdin(Stdio::piped());
    }
    let mut child = c.spawn().expect("spawn wgmoe");
    if let Some(text) = &l.stdin {
        let mut i = child.stdin.take().unwrap();
        i.write_all(text.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    Run {
        cmd: format!("{}: wgmoe {}", l.at, l.args.join(" ")),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `wgmoe serve ARGS` on a free port: the model and the options but `--port`.
fn start_server(l: &Line) -> Server {
    let mut model = None;
    let mut rest: Vec<&str> = Vec::new();
    let mut it = l.args[1..].iter();
    while let Some(a) = it.next() {
        if a == "--port" {
            it.next();
        } else if model.is_none() && !a.starts_with('-') {
            model = Some(repo().join(a));
        } else {
            rest.push(a);
        }
    }
    Server::start(
        &model.unwrap_or_else(|| panic!("{}: no model", l.at)),
        &rest,
    )
}

/// POSTs a guide's `curl ... URL -d BODY` to `srv`; the answer must be what the guide
/// shows next (an error body, or a success).
fn post_curl(srv: &Server, l: &Line) {
    let url = l
        .args
        .iter()
        .find(|a| a.contains("localhost:") || a.contains("127.0.0.1:"))
        .unwrap_or_else(|| panic!("{}: no URL in {:?}", l.at, l.args));
    let path = &url[url.find('/').unwrap_or_else(|| panic!("{}: {url}", l.at))..];
    let body = l
        .args
        .iter()
        .position(|a| a == "-d")
        .map(|i| l.args[i + 1].clone())
        .unwrap_or_else(|| panic!("{}: no -d BODY", l.at));
    let (status, text) = srv.post_raw(path, &body, None);
    let error = l
        .next
        .as_deref()
        .is_some_and(|n| n.starts_with("{\"error\""));
    assert_eq!(
        status == 200,
        !error,
        "{}: POST {path} {body} answered {status}: {text}\n{}",
        l.at,
        srv.stderr()
    );
}

fn guides() -> Vec<PathBuf> {
    let mut v = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    v.extend(docs);
    v
}

#[test]
fn the_guides_commands_run_on_the_fixtures() {
    let mut ran = Vec::new();
    for guide in guides() {
        let name = guide.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&guide).unwrap();
        let (lines, curls) = commands(&name, &text);
        let dir = workdir();
        let cache = tempfile::tempdir().unwrap();
        let mut written: Vec<String> = Vec::new();
        let mut server: Option<Server> = None;
        for l in &lines {
            if !runs_here(l, &written) {
                continue;
            }
            for w in l.args.windows(2) {
                if OUTPUTS.contains(&w[0].as_str()) {
                    written.push(w[1].clone());
                }
            }
            if l.args[0] == "serve" {
                server = Some(start_server(l));
                // The guide's curls of this server: those after it in the file.
                let line_no =
                    |at: &str| -> usize { at.rsplit(':').next().unwrap().parse().unwrap() };
                for c in curls.iter().filter(|c| line_no(&c.at) > line_no(&l.at)) {
                    post_curl(server.as_ref().unwrap(), c);
                    ran.push(c.at.clone());
                }
            } else {
                let r = run_in(dir.path(), l, cache.path());
                assert_ok(&r);
            }
            ran.push(l.at.clone());
        }
        drop(server);
    }
    // The README's own: the fixture run of its first command, run, chat, serve with its
    // curl, and plan.
    println!("ran: {ran:?}");
    let readme = ran.iter().filter(|a| a.starts_with("README.md:")).count();
    assert!(readme >= 6, "only {readme} README commands ran: {ran:?}");
    assert!(ran.len() >= 15, "{ran:?}");
}

/// An output excerpt: a `text` block that opens with `$ wgmoe ...`, and the lines it shows.
#[derive(Debug)]
struct Excerpt {
    line: Line,
    shown: Vec<String>,
}

fn excerpts(name: &str, text: &str) -> Vec<Excerpt> {
    let lines: Vec<&str> = text.lines().collect();
    let fence = |j: usize| lines[j].trim_start().starts_with("```");
    let (mut out, mut inside, mut i) = (Vec::new(), false, 0);
    while i < lines.len() {
        if !fence(i) {
            i += 1;
            continue;
        }
        let text_block = lines[i].trim_start().trim_start_matches('`').trim() == "text";
        match lines.get(i + 1).and_then(|c| c.strip_prefix("$ wgmoe ")) {
            Some(cmd) if !inside && text_block => {
                let mut cmd = cmd.to_string();
                let mut j = i + 2;
                while cmd.ends_with('\\') && j < lines.len() {
                    cmd.pop();
                    cmd.push_str(lines[j].trim_start());
                    j += 1;
                }
                let end = (j..lines.len()).find(|&k| fence(k)).unwrap_or(lines.len());
                let at = format!("{name}:{}", i + 2);
                out.push(Excerpt {
                    line: Line {
                        args: split(&at, &cmd),
                        at,
                        stdin: None,
                        next: None,
                    },
                    shown: lines[j..end]
                        .iter()
                        .map(|l| l.trim_end().to_string())
                        .collect(),
                });
                i = end + 1;
            }
            _ => {
                inside = !inside;
                i += 1;
            }
        }
    }
    out
}

/// The first line of `shown` that is not found, in order, among the lines of `printed`
/// (a line `...` marks lines left out).
fn first_line_not_printed<'a>(shown: &'a [String], printed: &str) -> Option<&'a str> {
    let mut printed = printed.lines().map(str::trim_end);
    shown
        .iter()
        .filter(|s| s.as_str() != "...")
        .find(|s| !printed.any(|p| p == s.as_str()))
        .map(String::as_str)
}

#[test]
fn the_guides_excerpts_are_what_the_commands_print() {
    let mut checked = Vec::new();
    for guide in guides() {
        let name = guide.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&guide).unwrap();
        let dir = workdir();
        let cache = tempfile::tempdir().unwrap();
        for e in excerpts(&name, &text) {
            if !runs_here(&e.line, &[]) {
                continue;
            }
            assert!(
                !["serve", "chat"].contains(&e.line.args[0].as_str()),
                "{}: an excerpt of a server or chat cannot be checked",
                e.line.at
            );
            let r = run_in(dir.path(), &e.line, cache.path());
            assert_ok(&r);
            if let Some(l) = first_line_not_printed(&e.shown, &r.stdout) {
                panic!("{}: the excerpt shows a line the command does not print (in that order):\n  {l}\n{r}", e.line.at);
            }
            checked.push(e.line.at);
        }
    }
    println!("checked: {checked:?}");
    // The README's plan excerpt and the planning guide's are among them.
    assert!(
        checked.iter().any(|a| a.starts_with("README.md:")),
        "{checked:?}"
    );
    assert!(
        checked
            .iter()
            .filter(|a| a.starts_with("planning.md:"))
            .count()
            >= 3,
        "{checked:?}"
    );
}

#[test]
fn excerpts_are_read_in_order_and_a_changed_line_is_caught() {
    let text = "```sh\n$ wgmoe run models/a\n```\n```text\n$ wgmoe plan models/b \\\n  --vram 1GiB\nA\n...\nC\n```\n```text\nplain\n```\n";
    let e = excerpts("t.md", text);
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].line.args, ["plan", "models/b", "--vram", "1GiB"]);
    assert_eq!(e[0].shown, ["A", "...", "C"]);
    assert_eq!(first_line_not_printed(&e[0].shown, "A\nB\nC  \n"), None);
    assert_eq!(first_line_not_printed(&e[0].shown, "C\nA\n"), Some("C"));
    assert_eq!(first_line_not_printed(&e[0].shown, "A\nB\n"), Some("C"));
}

#[test]
fn the_lines_are_read_as_a_shell_reads_them() {
    let text = "x\n```text\nwgmoe plan: output\n$ wgmoe plan models/b\n```\n```sh\n$ wgmoe run models/a -p \"two words\" \\\n    -n 2   # a comment\nprintf 'a\\nb\\n' | wgmoe chat models/a\ncurl -s localhost:1/v1/x -d '{\"k\": 1}'\n{\"error\": 1}\n```\nwgmoe run models/outside\n";
    let (w, c) = commands("t.md", text);
    assert_eq!(w.len(), 3, "{w:?}");
    assert_eq!(w[0].args, ["plan", "models/b"]);
    let w = &w[1..];
    assert_eq!(w[0].args, ["run", "models/a", "-p", "two words", "-n", "2"]);
    assert_eq!(w[1].stdin.as_deref(), Some("a\nb\n"));
    assert_eq!(w[1].args, ["chat", "models/a"]);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].next.as_deref(), Some("{\"error\": 1}"));
    assert!(runs_here(&w[0], &[]));
}

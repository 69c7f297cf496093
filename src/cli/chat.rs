//! `wgmoe chat`: a terminal chat over one session. In a terminal, rustyline edits lines
//! and keeps their history; otherwise lines are read from stdin and answers written to
//! stdout, so a script (or a test) can hold a conversation. Answers stream as they come;
//! each turn's prefill split and speed go to stderr.

use std::io::{BufRead, IsTerminal, Write};

use wgmoe::error::{Error, Result};
use wgmoe::runtime::generate::{Flow, GenerateOptions};
use wgmoe::session::chat::{chat_prompt, fit, Message, Role};
use wgmoe::session::template;
use wgmoe::session::{Session, TurnStats};
use wgmoe::tokenizer::{TextStream, Tokenizer};

use super::random_seed;
use super::run::sampling_options;
use crate::{stdout_error, ChatArgs};

const HELP: &str = "/reset: start over (keeps --system) · /stats: the last turn's numbers · /exit: leave (or Ctrl-D) · Ctrl-C stops an answer · a line ending in \\ continues on the next";

/// Where lines come from: the line editor in a terminal, plain stdin otherwise. `None`
/// is the end: Ctrl-D, end of input, or Ctrl-C at the editor's prompt.
enum Input {
    Editor(Box<rustyline::DefaultEditor>),
    Plain(std::io::StdinLock<'static>),
}

impl Input {
    fn open() -> Result<Self> {
        if std::io::stdin().is_terminal() && std::io::stdout().is_terminal() {
            let ed = rustyline::DefaultEditor::new()
                .map_err(|e| Error::Other(format!("cannot open the line editor: {e}")))?;
            Ok(Input::Editor(Box::new(ed)))
        } else {
            Ok(Input::Plain(std::io::stdin().lock()))
        }
    }

    fn terminal(&self) -> bool {
        matches!(self, Input::Editor(_))
    }

    fn line(&mut self, prompt: &str) -> Result<Option<String>> {
        match self {
            Input::Editor(ed) => match ed.readline(prompt) {
                Ok(l) => {
                    if !l.trim().is_empty() {
                        let _ = ed.add_history_entry(l.as_str());
                    }
                    Ok(Some(l))
                }
                Err(rustyline::error::ReadlineError::Interrupted)
                | Err(rustyline::error::ReadlineError::Eof) => Ok(None),
                Err(e) => Err(Error::Other(format!("reading the input: {e}"))),
            },
            Input::Plain(r) => {
                let mut l = String::new();
                match r.read_line(&mut l) {
                    Ok(0) => Ok(None),
                    Ok(_) => {
                        if l.ends_with('\n') {
                            l.pop();
                            if l.ends_with('\r') {
                                l.pop();
                            }
                        }
                        Ok(Some(l))
                    }
                    Err(e) => Err(Error::io("<stdin>", e)),
                }
            }
        }
    }

    /// One message: lines ending in `\` continue on the next.
    fn message(&mut self) -> Result<Option<String>> {
        let mut text = String::new();
        let mut prompt = "> ";
        loop {
            let Some(l) = self.line(prompt)? else {
                return Ok(if text.is_empty() { None } else { Some(text) });
            };
            match l.strip_suffix('\\') {
                Some(head) => {
                    text.push_str(head);
                    text.push('\n');
                    prompt = ". ";
                }
                None => {
                    text.push_str(&l);
                    return Ok(Some(text));
                }
            }
        }
    }
}

fn turn_line(s: &TurnStats) -> String {
    format!(
        "{} prompt tokens ({} cached, {} prefilled), {} generated; TTFT {:.3}s, prefill {:.1} tok/s, decode {:.1} tok/s",
        s.prompt_tokens,
        s.cached_tokens,
        s.prefilled_tokens,
        s.generated_tokens,
        s.ttft_s,
        s.prefill_tokens_per_s,
        s.decode_tokens_per_s
    )
}

/// The last turn and the conversation's totals (since the start or the last /reset);
/// `cleared`: /reset came after the last turn.
fn print_stats(session: &Session, cleared: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let t = &session.totals;
    let last = match &session.last {
        Some(s) => format!("last turn: {}", turn_line(s)),
        None => "last turn: none yet".into(),
    };
    let held = session.cached().len();
    let cache = if cleared {
        format!(
            "the conversation holds 0 of {} positions ({} cached from before /reset, reused where the next prompt starts the same)",
            session.max_context(),
            wgmoe::units::count(held, "token")
        )
    } else {
        format!(
            "the cache holds {held} of {} positions",
            session.max_context()
        )
    };
    writeln!(
        out,
        "{last}\nsession: {}, {} prompt tokens ({} cached, {} prefilled), {} generated; {cache}",
        wgmoe::units::count(t.requests, "turn"),
        t.prompt_tokens,
        t.cached_tokens,
        t.prefilled_tokens,
        t.generated_tokens,
    )
    .and_then(|_| out.flush())
    .map_err(stdout_error)
}

pub fn chat(a: ChatArgs) -> Result<()> {
    let (cfg, gen, tok) = super::open_host(&a.model, a.load.tokenizer.as_deref())?;
    let mut tok = tok.ok_or_else(|| {
        Error::bad_file(
            a.model.join("tokenizer.json"),
            "missing: chat needs the tokenizer",
        )
    })?;
    let note = template::choose(&mut tok, a.load.chat_template.as_deref(), &a.model)?;
    let mut history: Vec<Message> = a
        .system
        .iter()
        .map(|s| Message::new(Role::System, s.clone()))
        .collect();
    // The template must accept the conversation's start (some refuse a system message).
    let mut probe = history.clone();
    probe.push(Message::new(Role::User, "hello"));
    chat_prompt(&tok, &probe).map_err(|e| match &a.system {
        Some(_) => Error::option("--system", format!("the chat template refuses it: {e}")),
        None => e,
    })?;
    if a.max_new_tokens == 0 {
        return Err(Error::option("--max-new-tokens", "must be at least 1"));
    }
    let seed = a.sampling.seed.unwrap_or_else(random_seed);
    let sampling = sampling_options(&a.sampling, gen.as_ref(), seed)?;
    let ctx = super::ctx_size(&a.load, &cfg, &a.model)?;
    let mut engine = super::load_engine(&a.model, &a.load, ctx, 1, 0)?;
    engine.tokenizer = None;
    if let Some(n) = note {
        eprintln!("{n}");
    }
    let mut session = Session::new(engine);
    let shift = a.load.context_shift;
    wgmoe::interrupt::install()?;
    let mut input = Input::open()?;
    if input.terminal() {
        eprintln!("{HELP}");
    }
    let eos_ids = session.engine.eos_ids();
    // Since /reset, with no turn yet: the cache holds only earlier tokens.
    let mut cleared = false;
    loop {
        wgmoe::interrupt::clear();
        wgmoe::interrupt::set_at_prompt(true);
        let msg = input.message();
        wgmoe::interrupt::set_at_prompt(false);
        // The end (the editor has already moved to a new line).
        let Some(msg) = msg? else {
            return Ok(());
        };
        let cmd = msg.trim();
        match cmd {
            "" => continue,
            "/exit" | "/quit" => return Ok(()),
            "/reset" => {
                history.retain(|m| m.role == Role::System);
                // The new conversation's numbers start from zero; the cache keeps its
                // tokens, reused where the next prompt starts the same.
                session.reset_stats();
                cleared = true;
                eprintln!("(conversation cleared)");
                continue;
            }
            "/stats" => {
                print_stats(&session, cleared)?;
                continue;
            }
            "/help" => {
                eprintln!("{HELP}");
                continue;
            }
            c if c.starts_with('/') && !c.contains(char::is_whitespace) => {
                eprintln!("unknown command {c}: {HELP}");
                continue;
            }
            _ => {}
        }
        history.push(Message::new(Role::User, msg.clone()));
        // With context shift, room for a full answer (up to half the context); without,
        // an answer is cut where the context ends.
        let reserve = if shift {
            a.max_new_tokens.min(ctx / 2).max(1)
        } else {
            1
        };
        let fitted = match fit(&tok, &history, ctx, (reserve, 1), shift) {
            Ok(Ok(f)) => f,
            Ok(Err(too_long)) => {
                // Context shift drops earlier turns: no help for a message alone.
                eprintln!(
                    "error: {too_long}: {}",
                    if too_long.droppable {
                        "/reset to start over, or restart with --context-shift"
                    } else {
                        "shorten the message (or restart with a larger --ctx-size)"
                    }
                );
                history.pop();
                continue;
            }
            Err(e) => {
                eprintln!("error: {e}");
                history.pop();
                continue;
            }
        };
        if fitted.dropped > 0 {
            eprintln!(
                "(context shift: the {} oldest messages were dropped)",
                fitted.dropped
            );
            history = fitted.messages;
        }
        let prompt = fitted.prompt;
        let opts = GenerateOptions {
            max_new_tokens: a.max_new_tokens.min(ctx - prompt.len()),
            sampling: sampling.clone(),
            eos_ids: eos_ids.clone(),
            ignore_eos: a.ignore_eos,
            record_logits: false,
            pipeline_depth: a.load.gpu.pipeline_depth,
        };
        let (g, stats) = answer(&mut session, &tok, &prompt, &opts)?;
        cleared = false;
        history.push(Message::new(Role::Assistant, tok.decode(&g)?));
        eprintln!(
            "[{}{}]",
            turn_line(&stats),
            if stats.interrupted {
                "; stopped by Ctrl-C"
            } else {
                ""
            }
        );
    }
}

/// Generate and stream one answer; returns its token ids.
fn answer(
    session: &mut Session,
    tok: &Tokenizer,
    prompt: &[u32],
    opts: &GenerateOptions,
) -> Result<(Vec<u32>, TurnStats)> {
    let mut stream = TextStream::new();
    let stdout = std::io::stdout();
    let mut on_token = |id: u32| -> Result<Flow> {
        let s = stream.push(tok, id)?;
        let mut out = stdout.lock();
        out.write_all(s.as_bytes())
            .and_then(|_| out.flush())
            .map_err(stdout_error)?;
        Ok(Flow::Continue)
    };
    let (g, stats) = session.generate(prompt, opts, &mut on_token)?;
    let tail = stream.finish(tok)?;
    out!("{tail}");
    Ok((g.generated_ids, stats))
}

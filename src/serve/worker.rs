//! The one thread that owns the engine: the GPU is one stream, so requests are served one
//! at a time, in arrival order, from a bounded queue. Each job reports back through its
//! own channel (started, text pieces, done or an error); a send that fails means the
//! client went away, and the generation stops at that token.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use tokio::sync::mpsc::UnboundedSender;

use crate::error::{Error, Result};
use crate::format::tokenizer::{TextStream, Tokenizer};
use crate::runtime::generate::{Flow, GenerateOptions};
use crate::runtime::sampling::{random_seed, SamplingOptions};
use crate::serve::api::{ApiError, PromptInput, Request, SamplingRequest};
use crate::session::chat::fit;
use crate::session::stop::StopStrings;
use crate::session::{Session, SessionTotals, TurnStats};

/// OpenAI's default `max_tokens` for `/v1/completions`.
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

pub enum Event {
    /// The prompt fits and generation starts (the HTTP status is decided here).
    Started,
    Text(String),
    Done(Box<Done>),
    Error(ApiError),
}

pub struct Done {
    /// "stop" (EOS or a stop string) or "length".
    pub finish_reason: &'static str,
    pub stats: TurnStats,
}

pub struct Job {
    pub id: u64,
    pub endpoint: &'static str,
    pub request: Request,
    pub events: UnboundedSender<Event>,
    pub queued: Instant,
}

/// The server's options the worker applies to every request.
#[derive(Clone, Debug)]
pub struct Defaults {
    /// Sampling when a request sets none of temperature, top_p, top_k.
    pub sampling: SamplingOptions,
    /// Seed when a request gives none (None: a random one per request).
    pub seed: Option<u64>,
    /// Drop the oldest turns of a conversation that does not fit.
    pub context_shift: bool,
}

/// The last request, for `/stats`.
#[derive(Clone, Debug, Serialize)]
pub struct LastRequest {
    pub id: u64,
    pub endpoint: &'static str,
    /// "stop", "length", "cancelled" (the client went away) or "error".
    pub finish_reason: &'static str,
    pub queued_s: f64,
    pub total_s: f64,
    /// Messages dropped by context shift.
    pub dropped_messages: usize,
    #[serde(flatten)]
    pub stats: TurnStats,
}

/// What `/stats` shows, written by the worker.
#[derive(Debug, Default, Serialize)]
pub struct Stats {
    pub served: u64,
    pub failed: u64,
    pub rejected_queue_full: u64,
    pub cancelled: u64,
    pub cache_tokens: usize,
    pub last: Option<LastRequest>,
    pub totals: SessionTotals,
}

#[derive(Default)]
pub struct Shared {
    pub stats: Mutex<Stats>,
    /// Jobs sent and not yet taken by the worker.
    pub waiting: AtomicUsize,
    /// Jobs admitted and not finished (waiting plus the one being served): at most
    /// `--max-queue` + 1.
    pub pending: AtomicUsize,
}

impl Shared {
    pub fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        // A panic elsewhere cannot leave these counters half-written in a harmful way.
        self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The sampling of a request: its own fields over the server's defaults.
pub fn sampling(d: &Defaults, r: &SamplingRequest) -> SamplingOptions {
    let base = &d.sampling;
    let mut s = if r.temperature.is_none() && r.top_p.is_none() && r.top_k.is_none() {
        base.clone()
    } else {
        // OpenAI's temperature default is 1 when a request asks for sampling otherwise.
        let greedy = base.is_greedy();
        SamplingOptions {
            temperature: r
                .temperature
                .unwrap_or(if greedy { 1.0 } else { base.temperature }),
            top_k: r.top_k.unwrap_or(if greedy { 0 } else { base.top_k }),
            top_p: r.top_p.unwrap_or(base.top_p),
            seed: 0,
        }
    };
    s.seed = r.seed.or(d.seed).unwrap_or_else(random_seed);
    s
}

/// Serve jobs until every sender is gone.
pub fn run(mut session: Session, jobs: Receiver<Job>, shared: Arc<Shared>, defaults: Defaults) {
    let Some(tok) = session.engine.tokenizer.take() else {
        return;
    };
    while let Ok(job) = jobs.recv() {
        shared.waiting.fetch_sub(1, Ordering::SeqCst);
        let t0 = Instant::now();
        let queued_s = t0.duration_since(job.queued).as_secs_f64();
        let r = serve_one(&mut session, &tok, &defaults, &job);
        let total_s = job.queued.elapsed().as_secs_f64();
        // Free before answering: a client's next request must find room.
        shared.pending.fetch_sub(1, Ordering::SeqCst);
        let mut st = shared.stats();
        st.cache_tokens = session.cached().len();
        st.totals = session.totals.clone();
        let (reason, stats, dropped, done) = match r {
            Ok(Outcome {
                finish_reason,
                stats,
                dropped,
                done,
            }) => {
                if finish_reason == "cancelled" {
                    st.cancelled += 1;
                } else {
                    st.served += 1;
                }
                (finish_reason, stats, dropped, done)
            }
            Err(e) => {
                st.failed += 1;
                eprintln!(
                    "request {} {}: error {}: {}",
                    job.id, job.endpoint, e.status, e.message
                );
                let _ = job.events.send(Event::Error(e));
                continue;
            }
        };
        eprintln!(
            "request {} {}: queued {queued_s:.3}s; {} prompt tokens ({} cached, {} prefilled{}), {} generated ({reason}); TTFT {:.3}s, prefill {:.1} tok/s, decode {:.1} tok/s; total {total_s:.3}s",
            job.id,
            job.endpoint,
            stats.prompt_tokens,
            stats.cached_tokens,
            stats.prefilled_tokens,
            if dropped > 0 { format!(", {dropped} messages dropped by context shift") } else { String::new() },
            stats.generated_tokens,
            stats.ttft_s,
            stats.prefill_tokens_per_s,
            stats.decode_tokens_per_s,
        );
        let stats_copy = stats.clone();
        st.last = Some(LastRequest {
            id: job.id,
            endpoint: job.endpoint,
            finish_reason: reason,
            queued_s,
            total_s,
            dropped_messages: dropped,
            stats,
        });
        drop(st);
        if done {
            let _ = job.events.send(Event::Done(Box::new(Done {
                finish_reason: reason,
                stats: stats_copy,
            })));
        }
    }
}

struct Outcome {
    finish_reason: &'static str,
    stats: TurnStats,
    dropped: usize,
    /// Generation ran: the client gets `Done` (sent once `/stats` shows the request).
    done: bool,
}

fn context_error(prompt: usize, reserve: usize, ctx: usize, explicit: bool) -> ApiError {
    let param = if explicit && prompt < ctx {
        "max_tokens"
    } else {
        "messages"
    };
    ApiError::invalid(
        param,
        format!(
            "the context is {ctx} positions: {prompt} prompt tokens + {reserve} new tokens do not fit (shorten the conversation, lower max_tokens, or start the server with --context-shift)"
        ),
    )
    .with_code("context_length_exceeded")
}

/// The prompt tokens of a request, the messages dropped to fit, and the most new tokens.
fn prompt_of(
    session: &Session,
    tok: &Tokenizer,
    defaults: &Defaults,
    req: &Request,
) -> std::result::Result<(Vec<u32>, usize, usize), ApiError> {
    let ctx = session.max_context();
    let explicit = req.max_tokens.is_some();
    let (prompt, dropped) = match &req.prompt {
        PromptInput::Chat(msgs) => {
            let reserve = req.max_tokens.unwrap_or(1);
            match fit(tok, msgs, ctx, reserve, defaults.context_shift) {
                Ok(Ok(f)) => (f.prompt, f.dropped),
                Ok(Err(t)) => return Err(context_error(t.prompt_tokens, t.reserve, ctx, explicit)),
                Err(e) => return Err(ApiError::invalid("messages", e.to_string())),
            }
        }
        PromptInput::Text(s) => {
            let ids = tok
                .encode(s, true)
                .map_err(|e| ApiError::invalid("prompt", e.to_string()))?;
            (ids, 0)
        }
        PromptInput::Ids(ids) => {
            let v = session.engine.cfg.vocab_size;
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= v) {
                return Err(ApiError::invalid(
                    "prompt",
                    format!("token id {bad} is outside the vocabulary (vocab_size {v})"),
                ));
            }
            (ids.clone(), 0)
        }
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid(
            "prompt",
            "the prompt encodes to no tokens",
        ));
    }
    let room = ctx.saturating_sub(prompt.len());
    let max_new = match req.max_tokens {
        Some(n) if n > room => {
            return Err(context_error(prompt.len(), n, ctx, true).with_param(&req.prompt))
        }
        Some(n) => n,
        None if matches!(req.prompt, PromptInput::Chat(_)) => room,
        None => COMPLETIONS_DEFAULT_MAX_TOKENS.min(room),
    };
    if max_new == 0 {
        return Err(context_error(prompt.len(), 1, ctx, false).with_param(&req.prompt));
    }
    Ok((prompt, dropped, max_new))
}

impl ApiError {
    /// `/v1/completions` names `prompt` where chat names `messages`.
    fn with_param(mut self, p: &PromptInput) -> Self {
        if self.param.as_deref() == Some("messages") && !matches!(p, PromptInput::Chat(_)) {
            self.param = Some("prompt".into());
        }
        self
    }
}

fn serve_one(
    session: &mut Session,
    tok: &Tokenizer,
    defaults: &Defaults,
    job: &Job,
) -> std::result::Result<Outcome, ApiError> {
    let req = &job.request;
    let (prompt, dropped, max_new) = prompt_of(session, tok, defaults, req)?;
    if job.events.send(Event::Started).is_err() {
        // Gone while queued: nothing ran.
        return Ok(Outcome {
            finish_reason: "cancelled",
            stats: TurnStats::default(),
            dropped,
            done: false,
        });
    }
    let opts = GenerateOptions {
        max_new_tokens: max_new,
        sampling: sampling(defaults, &req.sampling),
        eos_ids: session.engine.eos_ids(),
        ignore_eos: req.ignore_eos,
        record_logits: false,
    };
    let mut stream = TextStream::new();
    let mut stops = StopStrings::new(req.stop.clone());
    let (mut gone, mut hit) = (false, false);
    let events = &job.events;
    let mut on_token = |id: u32| -> Result<Flow> {
        let (text, stop) = stops.push(&stream.push(tok, id)?);
        if (!text.is_empty() && events.send(Event::Text(text)).is_err()) || events.is_closed() {
            gone = true;
            return Ok(Flow::Stop);
        }
        hit = stop;
        Ok(if stop { Flow::Stop } else { Flow::Continue })
    };
    let (g, stats) = session
        .generate(&prompt, &opts, &mut on_token)
        .map_err(server_error)?;
    if !hit && !gone {
        let (text, stop) = stops.push(&stream.finish(tok).map_err(server_error)?);
        hit = stop;
        let text = if stop { text } else { text + &stops.finish() };
        if !text.is_empty() {
            let _ = job.events.send(Event::Text(text));
        }
    }
    let finish_reason = if gone {
        "cancelled"
    } else if hit || g.stopped_by_eos {
        "stop"
    } else {
        "length"
    };
    Ok(Outcome {
        finish_reason,
        stats,
        dropped,
        done: true,
    })
}

fn server_error(e: Error) -> ApiError {
    ApiError::status(500, "server_error", "generation_failed", e.to_string())
}

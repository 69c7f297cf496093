//! What the HTTP side and the worker thread (`scheduler`) share: a job per request with
//! its own event channel (started, text pieces, done or an error; a send that fails means
//! the client went away), the counters `/health`, `/metrics` and `/stats` show, and a
//! request's prompt and sampling.
//!
//! Shutdown (`Shared::draining`, `Shared::abort`, set by `serve`'s drain): while draining,
//! what was admitted before is still served, queued jobs included; once the drain timeout
//! passes, every answer being generated ends at once with finish_reason "abort" (the text
//! so far, usage as usual) and every job still queued is refused with 503
//! `shutting_down` without running.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;
use tokio::sync::mpsc::UnboundedSender;

use crate::runtime::sampling::{random_seed, SamplingOptions};
use crate::serve::api::{ApiError, PromptInput, Request, SamplingRequest};
use crate::session::chat::fit;
use crate::session::{SessionTotals, TurnStats};
use crate::tokenizer::Tokenizer;

/// OpenAI's default `max_tokens` for `/v1/completions`.
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

pub enum Event {
    /// The prompt fits and generation starts (the HTTP status is decided here).
    Started,
    /// A generated token's log-probabilities (requests that ask for them), sent before
    /// the text it adds.
    Logprob(crate::serve::logprobs::Logprob),
    /// A scored prompt's tokens (`echo` with `logprobs`), the first one unscored, sent
    /// once the whole prompt has run and before any generated token.
    Prompt(Vec<crate::serve::logprobs::Logprob>),
    Text(String),
    Done(Box<Done>),
    Error(ApiError),
}

pub struct Done {
    /// "stop" (EOS or a stop string), "length", or "abort" (ended by the drain timeout at
    /// shutdown).
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
    /// "stop", "length", "abort" (ended at shutdown), "cancelled" (the client went away)
    /// or "error".
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
    /// Decode steps run, and the tokens they ran (one per request in the step): their
    /// ratio is the mean batch.
    pub decode_steps: u64,
    pub decode_step_tokens: u64,
    /// Decode steps that ran more than one request together.
    pub batched_steps: u64,
    /// What decode steps cost on this adapter, as `--batching auto` measured them.
    pub step_costs: crate::runtime::batch::StepCosts,
    pub last: Option<LastRequest>,
    pub totals: SessionTotals,
}

#[derive(Default)]
pub struct Shared {
    pub stats: Mutex<Stats>,
    /// Jobs sent and not yet taken by the worker.
    pub waiting: AtomicUsize,
    /// Jobs admitted and not finished (waiting plus the one being served): at most
    /// `--max-queue` + 1. The drain ends when this is 0. Admission adds to it before it
    /// reads `draining` (and the drain sets `draining` before it reads this), so a request
    /// is either refused or waited for.
    pub pending: AtomicUsize,
    /// Set once at the first SIGTERM/Ctrl-C and never cleared: the HTTP side refuses new
    /// requests (503 `shutting_down`) and `/health` answers 503 "draining"; jobs already
    /// admitted (queued or generating) are still served.
    pub draining: AtomicBool,
    /// Set once when `--drain-timeout` runs out (after `draining`): the worker ends the
    /// answer it generates at the next token (finish_reason "abort", the text so far) and
    /// refuses each job it takes from the queue with 503 `shutting_down`, without running it.
    pub abort: AtomicBool,
    /// Slots (`--parallel`) and those serving a request now.
    pub slots_total: AtomicUsize,
    pub slots_busy: AtomicUsize,
    /// Requests ended by `abort`: answers cut short plus queued jobs refused (for the
    /// shutdown's "aborted N requests" line).
    pub aborted: AtomicUsize,
}

impl Shared {
    pub fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        // A panic elsewhere cannot leave these counters half-written in a harmful way.
        self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// 503 `shutting_down`: a request the server will not run because it is stopping.
pub fn shutting_down(why: &str) -> ApiError {
    ApiError::status(
        503,
        "server_error",
        "shutting_down",
        format!("the server is shutting down: {why}; retry on another server or later"),
    )
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

/// `shift_helps`: older turns are there that `--context-shift` (not on) would drop; it
/// cannot help a prompt alone.
fn context_error(
    prompt: usize,
    reserve: usize,
    ctx: usize,
    explicit: bool,
    shift_helps: bool,
) -> ApiError {
    let param = if explicit && prompt < ctx {
        "max_tokens"
    } else {
        "messages"
    };
    let advice = match (explicit, shift_helps) {
        (true, true) => "shorten the conversation, lower max_tokens, or start the server with --context-shift to drop its oldest turns",
        (false, true) => "shorten the conversation, or start the server with --context-shift to drop its oldest turns",
        (true, false) => "shorten the prompt or lower max_tokens",
        (false, false) => "shorten the prompt",
    };
    ApiError::invalid(
        param,
        format!("the context is {ctx} positions: {prompt} prompt tokens + {reserve} new tokens do not fit ({advice})"),
    )
    .with_code("context_length_exceeded")
}

/// The prompt tokens of a request in a slot of `ctx` positions, the messages dropped to
/// fit, and the most new tokens.
pub fn prompt_of(
    ctx: usize,
    vocab: usize,
    tok: &Tokenizer,
    defaults: &Defaults,
    req: &Request,
) -> std::result::Result<(Vec<u32>, usize, usize), ApiError> {
    let explicit = req.max_tokens.is_some();
    let (prompt, dropped) = match &req.prompt {
        PromptInput::Chat(msgs) => {
            let reserve = req.max_tokens.unwrap_or(1);
            match fit(tok, msgs, ctx, (reserve, reserve), defaults.context_shift) {
                Ok(Ok(f)) => (f.prompt, f.dropped),
                Ok(Err(t)) => {
                    let helps = t.droppable && !defaults.context_shift;
                    return Err(context_error(
                        t.prompt_tokens,
                        t.reserve,
                        ctx,
                        explicit,
                        helps,
                    ));
                }
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
            let v = vocab;
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
    if prompt.len() > ctx {
        return Err(context_error(prompt.len(), 0, ctx, false, false).with_param(&req.prompt));
    }
    let max_new = match req.max_tokens {
        Some(n) if n > room => {
            return Err(context_error(prompt.len(), n, ctx, true, false).with_param(&req.prompt))
        }
        Some(n) => n,
        None if matches!(req.prompt, PromptInput::Chat(_)) => room,
        None => COMPLETIONS_DEFAULT_MAX_TOKENS.min(room),
    };
    // `max_tokens` 0 (completions' `echo`) scores or echoes the prompt alone.
    if max_new == 0 && req.max_tokens != Some(0) {
        return Err(context_error(prompt.len(), 1, ctx, false, false).with_param(&req.prompt));
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

/// One job: prompt, generation, the events. `abort` (`Shared::abort`) ends the answer at
/// the next token with finish_reason "abort".
/// 500 `generation_failed`: the engine failed while serving the request.
pub fn server_error(message: String) -> ApiError {
    ApiError::status(500, "server_error", "generation_failed", message)
}

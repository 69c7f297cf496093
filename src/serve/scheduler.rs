//! The one thread that owns the engine, serving up to `--parallel` requests at once by
//! continuous batching (`runtime::batch`): each request holds a slot (its own KV region)
//! from admission to its last token. Every iteration runs one prefill chunk of the
//! earliest request still prefilling (so a long prompt delays the others by one chunk per
//! token, not by its whole prefill), then one decode step of every request that has a
//! token to run: one forward over one token of each. Sampling, stop strings, `max_tokens`
//! and cancellation are per request; a client that goes away frees its slot at its next
//! token.
//!
//! Shutdown (`Shared::draining`, `Shared::abort`): while draining, everything admitted is
//! still served; once `abort` is set, every running request ends at once with
//! finish_reason "abort" (the text so far) and queued ones are refused with 503.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::runtime::batch::{Batching, Slots};
use crate::runtime::sampling::{sample, Rng, SamplingOptions};
use crate::serve::api::ApiError;
use crate::serve::logprobs::Logprob;
use crate::serve::worker::{
    prompt_of, sampling, server_error, shutting_down, Defaults, Done, Event, Job, LastRequest,
    Shared,
};
use crate::session::stop::StopStrings;
use crate::session::{Session, TurnStats};
use crate::tokenizer::{TextStream, Tokenizer};

/// How often an idle worker looks at the shutdown flags.
const IDLE_POLL: Duration = Duration::from_millis(50);

/// One admitted request.
struct Seq {
    job: Job,
    slot: usize,
    prompt: Vec<u32>,
    dropped: usize,
    max_new: usize,
    /// Prompt tokens the slot already held.
    cached: usize,
    /// Prompt tokens whose K/V are in the slot (cached ones included).
    ran: usize,
    sampling: SamplingOptions,
    rng: Rng,
    /// Ids a choice skips (EOS when the request ignores it).
    suppress: Vec<u32>,
    stops: StopStrings,
    stream: TextStream,
    generated: Vec<u32>,
    /// The token chosen and not yet run (its K/V are written by the next decode step).
    next: Option<u32>,
    admitted: Instant,
    queued_s: f64,
    first_token: Option<Instant>,
    /// A stop string was found (its text and what follows are never shown).
    hit: bool,
    stopped_by_eos: bool,
    /// A scored prompt (`echo` with `logprobs`): its tokens' log-probabilities so far,
    /// sent as one `Event::Prompt` when the prompt has run.
    scored: Option<Vec<Logprob>>,
}

/// How a request ended.
enum End {
    Finished(&'static str),
    Failed(ApiError),
}

struct Worker<'a> {
    session: Session,
    tok: &'a Tokenizer,
    shared: Arc<Shared>,
    defaults: Defaults,
    slots: Slots,
    eos: Vec<u32>,
    active: Vec<Seq>,
    waiting: VecDeque<Job>,
}

/// Serve jobs with `parallel` slots until every sender is gone.
pub fn run(
    session: Session,
    tok: Arc<Tokenizer>,
    jobs: Receiver<Job>,
    shared: Arc<Shared>,
    defaults: Defaults,
    parallel: usize,
    batching: Batching,
) {
    let slots = match Slots::new(&session.engine.fwd, parallel) {
        Ok(mut s) => {
            s.batching = batching;
            s
        }
        Err(e) => {
            eprintln!("error: {e}");
            return;
        }
    };
    shared.slots_total.store(slots.len(), Ordering::SeqCst);
    let eos = session.engine.eos_ids();
    let mut w = Worker {
        session,
        tok: &tok,
        shared,
        defaults,
        slots,
        eos,
        active: Vec::new(),
        waiting: VecDeque::new(),
    };
    w.serve(&jobs);
}

impl Worker<'_> {
    fn serve(&mut self, jobs: &Receiver<Job>) {
        loop {
            if self.active.is_empty() && self.waiting.is_empty() {
                match jobs.recv_timeout(IDLE_POLL) {
                    Ok(j) => self.take(j),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            while let Ok(j) = jobs.try_recv() {
                self.take(j);
            }
            if self.shared.abort.load(Ordering::SeqCst) {
                self.abort_all();
                continue;
            }
            self.admit();
            self.prefill_one();
            self.decode_step();
            self.publish();
        }
    }

    /// A job from the channel waits here for a slot (still counted in `Shared::waiting`).
    fn take(&mut self, j: Job) {
        self.waiting.push_back(j);
    }

    fn pop_waiting(&mut self) -> Option<Job> {
        let j = self.waiting.pop_front()?;
        self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
        Some(j)
    }

    /// Every request ends now (`--drain-timeout` ran out): running ones with "abort",
    /// queued ones with 503.
    fn abort_all(&mut self) {
        for seq in std::mem::take(&mut self.active) {
            self.shared.aborted.fetch_add(1, Ordering::SeqCst);
            self.finish(seq, End::Finished("abort"));
        }
        while let Some(job) = self.pop_waiting() {
            self.shared.aborted.fetch_add(1, Ordering::SeqCst);
            self.refuse(
                &job,
                shutting_down("the request was still queued when the drain timeout ran out"),
            );
        }
        self.publish();
    }

    /// Give free slots to waiting jobs, in arrival order.
    fn admit(&mut self) {
        while self.active.len() < self.slots.len() {
            let Some(job) = self.pop_waiting() else {
                return;
            };
            let ctx = self.slots.per_slot;
            let vocab = self.session.engine.cfg.vocab_size;
            let (prompt, dropped, max_new) =
                match prompt_of(ctx, vocab, self.tok, &self.defaults, &job.request) {
                    Ok(p) => p,
                    Err(e) => {
                        self.refuse(&job, e);
                        continue;
                    }
                };
            if job.events.send(Event::Started).is_err() {
                // Gone while queued: nothing ran.
                self.shared.pending.fetch_sub(1, Ordering::SeqCst);
                let mut st = self.shared.stats();
                st.cancelled += 1;
                continue;
            }
            let busy: Vec<usize> = self.active.iter().map(|s| s.slot).collect();
            let free = (0..self.slots.len()).filter(|s| !busy.contains(s));
            let Some(slot) = self.slots.choose(&prompt, free) else {
                self.refuse(&job, server_error("internal: no free slot".into()));
                continue;
            };
            // A scored prompt needs every position's logits: it runs from position 0.
            let scored = job.request.scores_prompt().then(Vec::new);
            let cached = if scored.is_some() {
                self.slots.claim_fresh(slot);
                0
            } else {
                self.slots.claim(slot, &prompt)
            };
            let req = &job.request;
            let sampling = sampling(&self.defaults, &req.sampling);
            let suppress = if req.ignore_eos {
                self.eos.clone()
            } else {
                Vec::new()
            };
            let queued_s = job.queued.elapsed().as_secs_f64();
            self.active.push(Seq {
                slot,
                dropped,
                max_new,
                cached,
                ran: cached,
                rng: Rng::new(sampling.seed),
                sampling,
                suppress,
                stops: StopStrings::new(req.stop.clone()),
                stream: TextStream::new(),
                generated: Vec::new(),
                next: None,
                admitted: Instant::now(),
                queued_s,
                first_token: None,
                hit: false,
                stopped_by_eos: false,
                scored,
                prompt,
                job,
            });
        }
    }

    /// One chunk of the earliest admitted request still prefilling.
    fn prefill_one(&mut self) {
        let Some(i) = self.active.iter().position(|s| s.ran < s.prompt.len()) else {
            return;
        };
        let chunk = self.session.engine.fwd.opts.prefill_chunk.max(1);
        let s = &self.active[i];
        if s.max_new == 0 && s.scored.is_none() {
            // `echo` with `max_tokens` 0: the prompt's text is the whole answer.
            let seq = self.active.remove(i);
            self.finish(seq, End::Finished("length"));
            return;
        }
        // A scored prompt runs as many positions a time as the logits hold (its rows come
        // back to the host: at most SCORE_ROWS of them at once).
        let step = match s.scored {
            Some(_) => chunk.min(self.session.engine.fwd.logit_rows()),
            None => chunk,
        };
        let m = step.min(s.prompt.len() - s.ran);
        let last = s.ran + m == s.prompt.len();
        let part = s.prompt[s.ran..s.ran + m].to_vec();
        let slot = s.slot;
        if s.scored.is_some() {
            if let Some(end) = self.score_chunk(i, &part, last) {
                let seq = self.active.remove(i);
                self.finish(seq, end);
            }
            return;
        }
        let r = self
            .slots
            .prefill(&mut self.session.engine.fwd, slot, &part, last);
        match r {
            Err(e) => {
                let seq = self.active.remove(i);
                self.finish(seq, End::Failed(server_error(e.to_string())));
            }
            Ok(logits) => {
                self.active[i].ran += m;
                if let Some(row) = logits {
                    if let Some(end) = self.choose(i, &row) {
                        let seq = self.active.remove(i);
                        self.finish(seq, end);
                    }
                }
            }
        }
    }

    /// One chunk of a scored prompt: every position's logits scores the token after it
    /// (the first token is unscored); after the last chunk the prompt's entries go out,
    /// and its last row chooses the first new token. Some when the request ends.
    fn score_chunk(&mut self, i: usize, part: &[u32], last: bool) -> Option<End> {
        let slot = self.active[i].slot;
        let rows = match self.slots.score(&mut self.session.engine.fwd, slot, part) {
            Ok(r) => r,
            Err(e) => return Some(End::Failed(server_error(e.to_string()))),
        };
        let tok = self.tok;
        let s = &mut self.active[i];
        let n = s.job.request.logprobs.unwrap_or(0);
        let entries = s.scored.get_or_insert_with(Vec::new);
        if s.ran == 0 {
            match crate::serve::logprobs::unscored(tok, s.prompt[0]) {
                Ok(e) => entries.push(e),
                Err(e) => return Some(End::Failed(server_error(e.to_string()))),
            }
        }
        for (j, row) in rows.iter().enumerate() {
            let q = s.ran + j;
            let Some(&id) = s.prompt.get(q + 1) else {
                break;
            };
            if row.iter().any(|x| !x.is_finite()) {
                self.slots.forget(slot);
                return Some(End::Failed(server_error(format!(
                    "non-finite logits (NaN or infinite) at prompt position {q}: the model's numbers broke down"
                ))));
            }
            match Logprob::of(tok, row, id, n) {
                Ok(e) => entries.push(e),
                Err(e) => return Some(End::Failed(server_error(e.to_string()))),
            }
        }
        s.ran += part.len();
        if !last {
            return None;
        }
        let entries = s.scored.take().unwrap_or_default();
        if s.job.events.send(Event::Prompt(entries)).is_err() {
            return Some(End::Finished("cancelled"));
        }
        if s.max_new == 0 {
            s.first_token = Some(Instant::now());
            return Some(End::Finished("length"));
        }
        let row = rows.last()?;
        self.choose(i, row)
    }

    /// The next token of every request that has one to run, in one forward.
    fn decode_step(&mut self) {
        let idx: Vec<usize> = (0..self.active.len())
            .filter(|&i| self.active[i].next.is_some())
            .collect();
        if idx.is_empty() {
            return;
        }
        let items: Vec<(usize, u32)> = idx
            .iter()
            .map(|&i| (self.active[i].slot, self.active[i].next.unwrap_or(0)))
            .collect();
        let rows = self.slots.decode(&mut self.session.engine.fwd, &items);
        {
            let mut st = self.shared.stats();
            st.batched_steps = self.slots.batched_steps;
            st.step_costs = self.slots.costs.clone();
        }
        {
            let mut st = self.shared.stats();
            st.decode_steps += 1;
            st.decode_step_tokens += items.len() as u64;
        }
        let mut ended: Vec<(usize, End)> = Vec::new();
        match rows {
            Err(e) => {
                for &i in &idx {
                    ended.push((i, End::Failed(server_error(e.to_string()))));
                }
            }
            Ok(rows) => {
                for (&i, row) in idx.iter().zip(&rows) {
                    if let Some(end) = self.choose(i, row) {
                        ended.push((i, end));
                    }
                }
            }
        }
        // Remove from the back so the indices stay valid.
        ended.sort_by_key(|e| std::cmp::Reverse(e.0));
        for (i, end) in ended {
            let seq = self.active.remove(i);
            self.finish(seq, end);
        }
    }

    /// Choose request i's next token from its logits row and stream it; Some when the
    /// request ends with it.
    fn choose(&mut self, i: usize, row: &[f32]) -> Option<End> {
        let tok = self.tok;
        let eos = &self.eos;
        let s = &mut self.active[i];
        s.next = None;
        if row.iter().any(|x| !x.is_finite()) {
            self.slots.forget(s.slot);
            return Some(End::Failed(server_error(format!(
                "non-finite logits (NaN or infinite) at position {}: the model's numbers broke down; no token was chosen",
                s.prompt.len() + s.generated.len() - 1
            ))));
        }
        let id = sample(row, &s.sampling, &s.suppress, &mut s.rng);
        if s.first_token.is_none() {
            s.first_token = Some(Instant::now());
        }
        s.generated.push(id);
        if let Some(n) = s.job.request.logprobs {
            let lp = match Logprob::of(tok, row, id, n) {
                Ok(lp) => lp,
                Err(e) => return Some(End::Failed(server_error(e.to_string()))),
            };
            if s.job.events.send(Event::Logprob(lp)).is_err() {
                return Some(End::Finished("cancelled"));
            }
        }
        let piece = match s.stream.push(tok, id) {
            Ok(p) => p,
            Err(e) => return Some(End::Failed(server_error(e.to_string()))),
        };
        let (text, stop) = s.stops.push(&piece);
        if (!text.is_empty() && s.job.events.send(Event::Text(text)).is_err())
            || s.job.events.is_closed()
        {
            return Some(End::Finished("cancelled"));
        }
        s.hit = stop;
        if !s.job.request.ignore_eos && eos.contains(&id) {
            s.stopped_by_eos = true;
            return Some(End::Finished("stop"));
        }
        if stop {
            return Some(End::Finished("stop"));
        }
        if s.generated.len() >= s.max_new {
            return Some(End::Finished("length"));
        }
        s.next = Some(id);
        None
    }

    fn refuse(&self, job: &Job, e: ApiError) {
        self.shared.pending.fetch_sub(1, Ordering::SeqCst);
        self.shared.stats().failed += 1;
        eprintln!(
            "request {} {}: error {}: {}",
            job.id, job.endpoint, e.status, e.message
        );
        let _ = job.events.send(Event::Error(e));
    }

    /// Answer a request that ended and free its slot.
    fn finish(&mut self, mut s: Seq, end: End) {
        // The slot is free before the client hears of the end: a /health right after a
        // response sees it idle.
        self.publish();
        let reason = match end {
            End::Failed(e) => {
                self.slots.forget(s.slot);
                self.refuse(&s.job, e);
                return;
            }
            End::Finished(r) => r,
        };
        let gone = reason == "cancelled";
        if !gone && !s.hit {
            let tail = s.stream.finish(self.tok).unwrap_or_default();
            let (text, stop) = s.stops.push(&tail);
            let text = if stop { text } else { text + &s.stops.finish() };
            if !text.is_empty() {
                let _ = s.job.events.send(Event::Text(text));
            }
        }
        let n = s.generated.len();
        let prefilled = s.prompt.len() - s.cached;
        let ttft_s = s
            .first_token
            .map_or(0.0, |t| t.duration_since(s.admitted).as_secs_f64());
        let decode_s = s.first_token.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let stats = TurnStats {
            prompt_tokens: s.prompt.len(),
            cached_tokens: s.cached,
            prefilled_tokens: prefilled,
            generated_tokens: n,
            ttft_s,
            prefill_tokens_per_s: prefilled as f64 / ttft_s.max(1e-9),
            decode_s,
            decode_tokens_per_s: if n > 1 && decode_s > 0.0 {
                (n - 1) as f64 / decode_s
            } else {
                0.0
            },
            stopped_by_eos: s.stopped_by_eos,
            cancelled: gone,
            interrupted: false,
        };
        let t = &mut self.session.totals;
        t.requests += 1;
        t.prompt_tokens += s.prompt.len() as u64;
        t.cached_tokens += s.cached as u64;
        t.prefilled_tokens += prefilled as u64;
        t.generated_tokens += n as u64;
        self.session.last = Some(stats.clone());
        let total_s = s.job.queued.elapsed().as_secs_f64();
        // Free before answering: a client's next request must find room.
        self.shared.pending.fetch_sub(1, Ordering::SeqCst);
        {
            let mut st = self.shared.stats();
            if gone {
                st.cancelled += 1;
            } else {
                st.served += 1;
            }
            st.totals = self.session.totals.clone();
            st.last = Some(LastRequest {
                id: s.job.id,
                endpoint: s.job.endpoint,
                finish_reason: reason,
                queued_s: s.queued_s,
                total_s,
                dropped_messages: s.dropped,
                stats: stats.clone(),
            });
        }
        eprintln!(
            "request {} {}: slot {}; queued {:.3}s; {} prompt tokens ({} cached, {} prefilled{}), {} generated ({reason}); TTFT {:.3}s, prefill {:.1} tok/s, decode {:.1} tok/s; total {total_s:.3}s",
            s.job.id,
            s.job.endpoint,
            s.slot,
            s.queued_s,
            stats.prompt_tokens,
            stats.cached_tokens,
            stats.prefilled_tokens,
            if s.dropped > 0 { format!(", {} messages dropped by context shift", s.dropped) } else { String::new() },
            n,
            stats.ttft_s,
            stats.prefill_tokens_per_s,
            stats.decode_tokens_per_s,
        );
        if !gone {
            let _ = s.job.events.send(Event::Done(Box::new(Done {
                finish_reason: reason,
                stats,
            })));
        }
    }

    /// What `/health`, `/metrics` and `/stats` show of the slots.
    fn publish(&self) {
        self.shared
            .slots_busy
            .store(self.active.len(), Ordering::SeqCst);
        let mut st = self.shared.stats();
        st.cache_tokens = self.slots.cached_tokens();
    }
}

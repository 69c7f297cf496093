//! A loaded engine plus a KV cache whose contents are a known token sequence, for the
//! commands that keep a model loaded across requests (`chat`, `serve`).
//!
//! The cache is positional: the K/V of token i sit at position i. A request shares its
//! longest common prefix with what the cache holds, and only the rest is prefilled (as
//! llama-server's `cache_prompt`). At least the last prompt token always runs, since its
//! logits choose the first new token.

pub mod chat;
pub mod stop;
pub mod template;

use crate::error::{Error, Result};
use crate::runtime::engine::Engine;
use crate::runtime::generate::{generate_from, Flow, GenerateOptions, Generation};

/// What one request did: its prefill split and its timings.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TurnStats {
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V were already in the cache.
    pub cached_tokens: usize,
    /// Prompt tokens run through the model (`prompt_tokens - cached_tokens`).
    pub prefilled_tokens: usize,
    pub generated_tokens: usize,
    /// Time to first token: the prefill of the new tokens plus the first choice.
    pub ttft_s: f64,
    pub prefill_tokens_per_s: f64,
    pub decode_s: f64,
    pub decode_tokens_per_s: f64,
    pub stopped_by_eos: bool,
    /// `on_token` ended it (a stop string, a client that went away).
    pub cancelled: bool,
    /// Ctrl-C ended it.
    pub interrupted: bool,
}

/// Totals since the session started.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SessionTotals {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub prefilled_tokens: u64,
    pub generated_tokens: u64,
}

pub struct Session {
    pub engine: Engine,
    /// Tokens whose K/V occupy cache positions 0..cached.len().
    cached: Vec<u32>,
    pub last: Option<TurnStats>,
    pub totals: SessionTotals,
}

pub use crate::runtime::batch::common_prefix;

impl Session {
    pub fn new(engine: Engine) -> Self {
        Session {
            engine,
            cached: Vec::new(),
            last: None,
            totals: SessionTotals::default(),
        }
    }

    /// Positions the KV cache holds: prompt plus generated tokens must fit.
    pub fn max_context(&self) -> usize {
        self.engine.fwd.opts.max_context
    }

    /// The token sequence the KV cache holds.
    pub fn cached(&self) -> &[u32] {
        &self.cached
    }

    /// Start the numbers over (chat's /reset): no last turn, zero totals. The cache is
    /// kept (its prefix is reused where the next prompt starts the same).
    pub fn reset_stats(&mut self) {
        self.last = None;
        self.totals = SessionTotals::default();
    }

    /// Forget the cache contents (the next request prefills everything).
    pub fn clear_cache(&mut self) {
        self.cached.clear();
    }

    /// Prompt tokens a request for `prompt` would take from the cache.
    pub fn reusable(&self, prompt: &[u32]) -> usize {
        common_prefix(&self.cached, prompt).min(prompt.len().saturating_sub(1))
    }

    /// Generate from `prompt`, reusing the cached prefix. `opts.max_new_tokens` must fit the
    /// context after the prompt (callers check first, to say which of their inputs is too
    /// long). `on_token` sees every token and may end the generation.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_token: &mut dyn FnMut(u32) -> Result<Flow>,
    ) -> Result<(Generation, TurnStats)> {
        let ctx = self.max_context();
        if prompt.is_empty() {
            return Err(Error::option("prompt", "the prompt has no tokens"));
        }
        if prompt.len() + opts.max_new_tokens > ctx {
            return Err(Error::option(
                "max_tokens",
                format!(
                    "{} prompt tokens + {} new tokens exceed the context of {ctx} positions",
                    prompt.len(),
                    opts.max_new_tokens
                ),
            ));
        }
        let start = self.reusable(prompt);
        // Positions from `start` on are overwritten now: until this turn completes, the
        // cache is known to hold only the shared prefix.
        self.cached.truncate(start);
        let g = match generate_from(&mut self.engine.fwd, prompt, start, opts, on_token) {
            Ok(g) => g,
            Err(e) => {
                // A failed step may have written part of a chunk: trust nothing.
                self.cached.clear();
                return Err(e);
            }
        };
        let n = g.generated_ids.len();
        // No token: nothing ran (max_new_tokens 0). Otherwise the prompt ran, and every
        // generated token but the last (chosen, never run: its K/V are not in the cache).
        if n > 0 {
            self.cached = prompt.to_vec();
            self.cached.extend_from_slice(&g.generated_ids[..n - 1]);
        }
        let prefilled = if n > 0 { prompt.len() - start } else { 0 };
        let stats = TurnStats {
            prompt_tokens: prompt.len(),
            cached_tokens: start,
            prefilled_tokens: prefilled,
            generated_tokens: n,
            ttft_s: g.ttft_s,
            prefill_tokens_per_s: prefilled as f64 / g.prefill_s.max(1e-9),
            decode_s: g.decode_s,
            decode_tokens_per_s: g.decode_tokens_per_s(),
            stopped_by_eos: g.stopped_by_eos,
            cancelled: g.cancelled,
            interrupted: g.interrupted,
        };
        let t = &mut self.totals;
        t.requests += 1;
        t.prompt_tokens += prompt.len() as u64;
        t.cached_tokens += start as u64;
        t.prefilled_tokens += prefilled as u64;
        t.generated_tokens += n as u64;
        self.last = Some(stats.clone());
        Ok((g, stats))
    }
}

//! Several sequences on one engine (`serve --parallel N`): the KV cache is split into N
//! fixed regions ("slots") of `max_context / N` positions, a slot's position p at cache
//! row `slot * per_slot + p`. A fixed split rather than paged blocks: every attention
//! kernel then reads one contiguous run of rows per sequence (`tok_kv0` in
//! `shaders/common/step.wgsl`), so the batched step needs no block table, and a slot's
//! memory is known when the server starts (as llama-server's `n_ctx / n_parallel`).
//!
//! Each slot remembers the tokens its rows hold, so a returning conversation is sent to
//! the slot that shares the longest prefix with it and only its new tokens run.
//!
//! One decode step runs the next token of every decoding sequence together
//! (`Forward::submit_batch`): one forward over B tokens at their own positions. A prefill
//! runs in chunks of one sequence between decode steps (`prefill`).

use std::time::Instant;

use crate::error::{Error, Result};
use crate::model::{Forward, Head};

/// Length of the longest common prefix of `a` and `b`.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// When a decode step of several sequences runs as one batched forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Batching {
    /// Whichever is faster as measured on this adapter: one batched forward, or one
    /// one-token step per sequence (each size measured, and again every
    /// `REMEASURE_EVERY` steps).
    Auto,
    /// Always one batched forward.
    On,
    /// One one-token step per sequence (no batching; each sequence still has its slot).
    Off,
}

/// Steps of a size between two measurements of the choice `Batching::Auto` did not take.
pub const REMEASURE_EVERY: u64 = 64;

/// What decode steps cost here (seconds per step, smoothed), for `Batching::Auto`: the
/// multi-token kernels can cost more per token than the one-token ones at small batches
/// (CPU adapters: every expert pair computed in an 8-lane window), so where batching
/// pays is measured, not assumed.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct StepCosts {
    /// A one-token step.
    pub single: Option<f64>,
    /// A batched step, by its number of sequences.
    pub batched: Vec<Option<f64>>,
    /// Per size, steps since the choice not taken was last measured.
    #[serde(skip)]
    since: Vec<u64>,
}

impl StepCosts {
    fn smooth(old: Option<f64>, new: f64) -> f64 {
        old.map_or(new, |o| 0.7 * o + 0.3 * new)
    }

    /// Whether a step of `b` sequences runs batched.
    fn batched(&mut self, b: usize) -> bool {
        if self.batched.len() <= b {
            self.batched.resize(b + 1, None);
            self.since.resize(b + 1, 0);
        }
        let (Some(single), Some(batched)) = (self.single, self.batched[b]) else {
            // Measure what is missing (one-token steps first).
            return self.single.is_some();
        };
        let faster = batched < single * b as f64;
        self.since[b] += 1;
        if self.since[b] >= REMEASURE_EVERY {
            self.since[b] = 0;
            return !faster;
        }
        faster
    }
}

/// The slots of a batched engine and what their KV regions hold.
pub struct Slots {
    /// Positions of each slot's region.
    pub per_slot: usize,
    /// Per slot, the tokens whose K/V occupy its positions 0..len.
    cached: Vec<Vec<u32>>,
    /// Per slot, when it was last chosen (the least recently used empty-prefix slot is
    /// reused first, so other conversations keep their caches longest).
    last_used: Vec<u64>,
    clock: u64,
    pub batching: Batching,
    pub costs: StepCosts,
    /// Decode steps run as one batched forward, and as one-token steps per sequence.
    pub batched_steps: u64,
    pub single_steps: u64,
}

impl Slots {
    /// `n` slots over the engine's KV cache.
    pub fn new(fwd: &Forward, n: usize) -> Result<Self> {
        let ctx = fwd.opts.max_context;
        if n == 0 {
            return Err(Error::option("--parallel", "must be at least 1"));
        }
        if n > 1 && fwd.opts.batch < n {
            return Err(Error::Other(format!(
                "internal: {n} slots on an engine built for batches of {}",
                fwd.opts.batch
            )));
        }
        let per_slot = ctx / n;
        if per_slot < 2 {
            return Err(Error::option(
                "--parallel",
                format!("{n} slots over a context of {ctx} positions leave fewer than 2 each (raise --ctx-size or lower --parallel)"),
            ));
        }
        Ok(Slots {
            per_slot,
            cached: vec![Vec::new(); n],
            last_used: vec![0; n],
            clock: 0,
            batching: Batching::Auto,
            costs: StepCosts::default(),
            batched_steps: 0,
            single_steps: 0,
        })
    }

    pub fn len(&self) -> usize {
        self.cached.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cached.is_empty()
    }

    /// The first cache row of `slot`'s region.
    pub fn kv0(&self, slot: usize) -> usize {
        slot * self.per_slot
    }

    /// The tokens `slot`'s region holds.
    pub fn cached(&self, slot: usize) -> &[u32] {
        &self.cached[slot]
    }

    /// Tokens held over all slots.
    pub fn cached_tokens(&self) -> usize {
        self.cached.iter().map(Vec::len).sum()
    }

    /// Of the `free` slots, the one whose tokens share the longest prefix with `prompt`
    /// (ties: the least recently used).
    pub fn choose(&self, prompt: &[u32], free: impl IntoIterator<Item = usize>) -> Option<usize> {
        free.into_iter().max_by_key(|&s| {
            (
                common_prefix(&self.cached[s], prompt),
                std::cmp::Reverse(self.last_used[s]),
            )
        })
    }

    /// Take `slot` for `prompt`: keep its shared prefix (all but the last prompt token at
    /// most, whose logits choose the first new token) and return how many tokens that is.
    pub fn claim(&mut self, slot: usize, prompt: &[u32]) -> usize {
        self.clock += 1;
        self.last_used[slot] = self.clock;
        let keep = common_prefix(&self.cached[slot], prompt).min(prompt.len().saturating_sub(1));
        self.cached[slot].truncate(keep);
        keep
    }

    /// Take `slot` and run it from position 0 (a scored prompt needs every position's
    /// logits, which a kept prefix would not give).
    pub fn claim_fresh(&mut self, slot: usize) {
        self.clock += 1;
        self.last_used[slot] = self.clock;
        self.cached[slot].clear();
    }

    /// Run `tokens` in `slot` after what it holds and return each one's logits row, in
    /// steps of as many positions as the engine's logits hold (one readback a step).
    pub fn score(
        &mut self,
        fwd: &mut Forward,
        slot: usize,
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>> {
        self.room(slot, self.cached[slot].len() + tokens.len())?;
        let step = fwd.opts.prefill_chunk.min(fwd.logit_rows()).max(1);
        let v = fwd.cfg.vocab_size;
        let mut rows = Vec::with_capacity(tokens.len());
        for part in tokens.chunks(step) {
            let pos = self.cached[slot].len();
            let r = fwd
                .submit_at(pos, part.len(), Some(part), Head::All, self.kv0(slot))
                .and_then(|()| fwd.read_logits(part.len()));
            match r {
                Ok(l) => rows.extend(l.chunks(v).map(<[f32]>::to_vec)),
                Err(e) => {
                    self.forget(slot);
                    return Err(e);
                }
            }
            self.cached[slot].extend_from_slice(part);
        }
        Ok(rows)
    }

    /// Forget what `slot` holds (after a failed step: trust nothing).
    pub fn forget(&mut self, slot: usize) {
        self.cached[slot].clear();
    }

    /// Run `tokens` (the prompt's next part, in chunks of the engine's prefill chunk) in
    /// `slot` after what it holds. With `last`, return the logits of its last token.
    pub fn prefill(
        &mut self,
        fwd: &mut Forward,
        slot: usize,
        tokens: &[u32],
        last: bool,
    ) -> Result<Option<Vec<f32>>> {
        self.room(slot, self.cached[slot].len() + tokens.len())?;
        let chunk = fwd.opts.prefill_chunk.max(1);
        let n_chunks = tokens.len().div_ceil(chunk);
        for (c, part) in tokens.chunks(chunk).enumerate() {
            let pos = self.cached[slot].len();
            let head = if last && c + 1 == n_chunks {
                Head::Last
            } else {
                Head::None
            };
            let r = fwd.submit_at(pos, part.len(), Some(part), head, self.kv0(slot));
            if let Err(e) = r {
                self.forget(slot);
                return Err(e);
            }
            self.cached[slot].extend_from_slice(part);
        }
        if !last {
            return Ok(None);
        }
        let l = fwd.read_logits(1);
        if l.is_err() {
            self.forget(slot);
        }
        l.map(Some)
    }

    /// One decode step: each `(slot, id)` runs token `id` after what its slot holds, all
    /// in one forward (or one one-token step each: `batching`); the logits row of each
    /// comes back in the same order.
    pub fn decode(&mut self, fwd: &mut Forward, items: &[(usize, u32)]) -> Result<Vec<Vec<f32>>> {
        for &(slot, _) in items {
            self.room(slot, self.cached[slot].len() + 1)?;
        }
        let r = self.decode_step(fwd, items);
        match r {
            Ok(rows) => {
                for &(slot, id) in items {
                    self.cached[slot].push(id);
                }
                Ok(rows)
            }
            Err(e) => {
                for &(slot, _) in items {
                    self.forget(slot);
                }
                Err(e)
            }
        }
    }

    fn decode_step(&mut self, fwd: &mut Forward, items: &[(usize, u32)]) -> Result<Vec<Vec<f32>>> {
        let v = fwd.cfg.vocab_size;
        let b = items.len();
        let batched = b > 1
            && match self.batching {
                Batching::On => true,
                Batching::Off => false,
                Batching::Auto => self.costs.batched(b),
            };
        let t0 = Instant::now();
        if !batched {
            let mut rows = Vec::with_capacity(b);
            for &(slot, id) in items {
                let pos = self.cached[slot].len();
                fwd.submit_at(pos, 1, Some(&[id]), Head::Last, self.kv0(slot))?;
                rows.push(fwd.read_logits(1)?);
            }
            if b > 0 {
                let per = t0.elapsed().as_secs_f64() / b as f64;
                self.costs.single = Some(StepCosts::smooth(self.costs.single, per));
                self.single_steps += b as u64;
            }
            return Ok(rows);
        }
        let tokens: Vec<(usize, usize, u32)> = items
            .iter()
            .map(|&(slot, id)| (self.cached[slot].len(), self.kv0(slot), id))
            .collect();
        fwd.submit_batch(&tokens)?;
        let l = fwd.read_logits(b)?;
        let dt = t0.elapsed().as_secs_f64();
        if self.costs.batched.len() <= b {
            self.costs.batched.resize(b + 1, None);
            self.costs.since.resize(b + 1, 0);
        }
        self.costs.batched[b] = Some(StepCosts::smooth(self.costs.batched[b], dt));
        self.batched_steps += 1;
        Ok(l.chunks(v).map(<[f32]>::to_vec).collect())
    }

    fn room(&self, slot: usize, len: usize) -> Result<()> {
        if slot >= self.len() || len > self.per_slot {
            return Err(Error::Other(format!(
                "internal: slot {slot} asked for {len} positions of {}",
                self.per_slot
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_measures_both_then_keeps_the_faster_and_remeasures() {
        let mut c = StepCosts::default();
        // Nothing measured: a one-token step first, then a batched one.
        assert!(!c.batched(4));
        c.single = Some(0.1);
        assert!(c.batched(4));
        // Batched 4 costs 0.3 s < 4 x 0.1 s: batched, until the other is measured again.
        c.batched[4] = Some(0.3);
        let runs: Vec<bool> = (0..REMEASURE_EVERY).map(|_| c.batched(4)).collect();
        assert!(runs[..runs.len() - 1].iter().all(|&b| b));
        assert!(!runs[runs.len() - 1], "one-token steps are measured again");
        // Batched 4 at 0.5 s > 0.4 s: one-token steps.
        c.batched[4] = Some(0.5);
        assert!(!c.batched(4));
        // Each size on its own.
        assert!(c.batched(2), "size 2 is not measured yet");
    }
}

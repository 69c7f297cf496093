//! Replaying a recorded routing through the cache exactly as the runtime serves it.
//!
//! A step of one layer wants a set of distinct experts (every token of a prefill chunk, or
//! the one token of a decode step). The runtime splits a set larger than one plan can serve
//! into [`expert_batches`] and plans each batch in the layer's [`ExpertCache`] with the
//! policy; [`replay`] does the same with a fence that completes at once, so its counts are
//! the run's counts. [`belady_steps`] is the offline optimum over the same steps.

use std::collections::HashMap;

use super::batches::expert_batches;
use super::cache::{CacheConfig, ExpertCache};
use super::error::ConfigError;
use super::fence::MockFence;
use super::policy::Policy;
use super::prefetch_gate::PrefetchGate;

/// Outcome of running a trace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

impl SimStats {
    /// hits / (hits + misses); 0 for an empty trace.
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

/// Distinct ids in first-appearance order (what the runtime plans).
pub fn distinct(ids: &[u32]) -> Vec<u32> {
    let mut d: Vec<u32> = Vec::with_capacity(ids.len());
    for &e in ids {
        if !d.contains(&e) {
            d.push(e);
        }
    }
    d
}

/// Runs the cache of `layer` (`capacity` published slots, `top_k` spares below full
/// residency, as the runtime builds it) with `policy` over `steps` (each the ids one step
/// wanted; repeats allowed) and returns each step's counts.
pub fn replay(
    layer: usize,
    steps: &[Vec<u32>],
    num_experts: usize,
    top_k: usize,
    capacity: usize,
    policy: &mut dyn Policy,
) -> Result<Vec<SimStats>, ConfigError> {
    let none = vec![Vec::new(); steps.len()];
    Ok(replay_prefetch(
        layer,
        steps,
        &none,
        num_experts,
        top_k,
        capacity,
        0,
        policy,
        None,
    )?
    .into_iter()
    .map(|s| s.cache)
    .collect())
}

/// One step of [`replay_prefetch`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefetchSimStats {
    /// Hits (resident before the step), misses (copied on demand) and evictions.
    pub cache: SimStats,
    /// Guessed experts copied ahead, those the step wanted, and those released unused.
    pub issued: u64,
    pub used: u64,
    pub wasted: u64,
    /// Of the step's distinct experts, those its guess held (`guessed` counts the steps'
    /// distinct experts where a guess existed).
    pub predicted: u64,
    pub guessed: u64,
}

/// [`replay`] with `--prefetch next-layer`: before step s is served, the experts of
/// `guesses[s]` (the recorded guess for this layer; empty: none) that are not resident are
/// copied ahead into the layer's `width` prefetch slots, exactly as the runtime does
/// (the same cache, its prefetch slots, the same settle and plans). With `gate` (the
/// gated `next-layer`), copies are made only while the gate is open, and every guess's
/// copy candidates are judged, as the runtime judges them.
#[allow(clippy::too_many_arguments)]
pub fn replay_prefetch(
    layer: usize,
    steps: &[Vec<u32>],
    guesses: &[Vec<u32>],
    num_experts: usize,
    top_k: usize,
    capacity: usize,
    width: usize,
    policy: &mut dyn Policy,
    mut gate: Option<&mut PrefetchGate>,
) -> Result<Vec<PrefetchSimStats>, ConfigError> {
    let config = CacheConfig::partial(layer, num_experts, top_k, capacity).with_prefetch(width);
    let mut cache = ExpertCache::<MockFence>::new(config)?;
    let mut fence = MockFence::new();
    let mut out = Vec::with_capacity(steps.len());
    let fail = |t: usize, e: &dyn std::fmt::Display| ConfigError::new(format!("step {t}: {e}"));
    for (t, ids) in steps.iter().enumerate() {
        let before = cache.stats();
        let wanted = distinct(ids);
        let guess = guesses.get(t).map_or(&[][..], |g| &g[..]);
        let mut st = PrefetchSimStats::default();
        if !guess.is_empty() {
            st.guessed = wanted.len() as u64;
            st.predicted = wanted.iter().filter(|e| guess.contains(e)).count() as u64;
            let mut open = true;
            if let (Some(g), true) = (gate.as_deref_mut(), config.prefetch > 0) {
                let cands = cache.prefetch_candidates(guess);
                open = g.is_open();
                let chosen = cands.iter().filter(|e| wanted.contains(e)).count();
                g.record(cands.len(), chosen, open);
            }
            if config.prefetch > 0 && open {
                let placed = cache.prefetch(guess, &fence).map_err(|e| fail(t, &e))?;
                if !placed.is_empty() {
                    let copy = fence.submit();
                    cache
                        .complete_prefetch(&placed, copy)
                        .map_err(|e| fail(t, &e))?;
                }
            }
        }
        cache.settle_prefetch(&wanted).map_err(|e| fail(t, &e))?;
        let batches = expert_batches(
            &wanted,
            |e| cache.table().slot_of(e).is_some(),
            config.capacity,
            config.spares,
        );
        for batch in &batches {
            let plan = cache.plan(batch, policy, &fence).map_err(|e| fail(t, &e))?;
            if !plan.is_all_hits() {
                let copy = fence.submit();
                cache
                    .complete_uploads(&plan, copy)
                    .map_err(|e| fail(t, &e))?;
            }
            cache.publish(&plan, policy).map_err(|e| fail(t, &e))?;
            let read = fence.submit();
            cache
                .mark_read(plan.wanted(), read)
                .map_err(|e| fail(t, &e))?;
            fence.complete_all();
        }
        let after = cache.stats();
        st.cache = SimStats {
            hits: after.hits - before.hits,
            misses: after.misses - before.misses,
            evictions: after.evictions - before.evictions,
        };
        st.issued = after.prefetch_issued - before.prefetch_issued;
        st.used = after.prefetch_used - before.prefetch_used;
        st.wasted = after.prefetch_wasted - before.prefetch_wasted;
        out.push(st);
    }
    Ok(out)
}

/// Belady's optimal policy over `steps` with `capacity` resident experts and `spares`
/// unpublished slots (the runtime's top_k), per step.
///
/// A step the runtime serves in one plan (at most `capacity` distinct experts, at most
/// `spares` of them missing) keeps its whole set resident and evicts the experts whose next
/// use is farthest: the classic rule. A step served in batches need not keep its set, so
/// here it keeps, of the resident and wanted experts, the `capacity` used soonest: a bound
/// on every set the batches could leave. The optimum over those moves is a ceiling for
/// every policy (each step costs its wanted experts that were not resident, for all alike).
pub fn belady_steps(steps: &[Vec<u32>], capacity: usize, spares: usize) -> Vec<SimStats> {
    let groups: Vec<Vec<u32>> = steps.iter().map(|g| distinct(g)).collect();
    // next_use[t][i]: the next step after t that wants groups[t][i] (u64::MAX: never).
    let mut next_use: Vec<Vec<u64>> = vec![Vec::new(); groups.len()];
    let mut seen: HashMap<u32, u64> = HashMap::new();
    for t in (0..groups.len()).rev() {
        next_use[t] = groups[t]
            .iter()
            .map(|e| seen.get(e).copied().unwrap_or(u64::MAX))
            .collect();
        for &e in &groups[t] {
            seen.insert(e, t as u64);
        }
    }
    let mut resident: HashMap<u32, u64> = HashMap::new(); // expert -> its next use
    let mut out = Vec::with_capacity(groups.len());
    for (t, group) in groups.iter().enumerate() {
        let hits = group.iter().filter(|e| resident.contains_key(e)).count();
        let one_plan = group.len() <= capacity && group.len() - hits <= spares.min(capacity);
        let mut s = SimStats {
            hits: hits as u64,
            misses: (group.len() - hits) as u64,
            evictions: 0,
        };
        for (i, &e) in group.iter().enumerate() {
            resident.insert(e, next_use[t][i]);
        }
        if resident.len() > capacity {
            // Farthest next use first (ties: the lowest id first).
            let mut order: Vec<(u32, u64)> = resident
                .iter()
                .filter(|(e, _)| !one_plan || !group.contains(e))
                .map(|(&e, &n)| (e, n))
                .collect();
            order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let drop = resident.len() - capacity;
            for &(e, _) in order.iter().take(drop) {
                resident.remove(&e);
                s.evictions += 1;
            }
        }
        out.push(s);
    }
    out
}

/// The sum of per-step counts.
pub fn total(steps: &[SimStats]) -> SimStats {
    steps.iter().fold(SimStats::default(), |a, s| SimStats {
        hits: a.hits + s.hits,
        misses: a.misses + s.misses,
        evictions: a.evictions + s.evictions,
    })
}

#[cfg(test)]
#[path = "replay_tests.rs"]
mod tests;

//! Eviction policies: which published expert to drop when a routed group needs room.
//!
//! One [`Policy`] object may serve every layer (its state is keyed by layer) or one per layer.
//! The cache calls [`Policy::on_access`] once per distinct expert of every published group,
//! [`Policy::choose_victim`] when it must evict, and [`Policy::on_evict`] for each eviction.
//! Candidates are always published experts that are not part of the group being served,
//! sorted by expert id.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

use super::error::ConfigError;
use super::profile::Profile;

/// An eviction policy.
pub trait Policy: Send {
    /// The name used by `--cache-policy`.
    fn name(&self) -> &'static str;

    /// `expert` of `layer` was used by the group served at `step` (steps increase per layer).
    fn on_access(&mut self, layer: usize, expert: u32, step: u64);

    /// Picks the expert to evict among `candidates` (non-empty, sorted by id) at `step`.
    /// Returning `None` or an expert outside `candidates` makes the cache fall back to the
    /// first candidate.
    fn choose_victim(&mut self, layer: usize, candidates: &[u32], step: u64) -> Option<u32>;

    /// `expert` of `layer` was evicted (its GPU copy dropped).
    fn on_evict(&mut self, _layer: usize, _expert: u32) {}
}

/// The policies `--cache-policy` can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    Lru,
    LfuDecay,
    Profile,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 3] = [PolicyKind::Lru, PolicyKind::LfuDecay, PolicyKind::Profile];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::LfuDecay => "lfu-decay",
            PolicyKind::Profile => "profile",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PolicyKind {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                ConfigError::new(format!(
                    "unknown cache policy `{s}`; expected one of lru, lfu-decay, profile"
                ))
            })
    }
}

/// Builds the policy `kind` names. `decay` is used by LFU-decay only; `profile` is required
/// by (and only used by) the profile policy, which pins `pinned_per_layer` experts per layer
/// (normally the cache capacity).
pub fn build_policy(
    kind: PolicyKind,
    decay: f64,
    profile: Option<&Profile>,
    pinned_per_layer: usize,
) -> Result<Box<dyn Policy>, ConfigError> {
    Ok(match kind {
        PolicyKind::Lru => Box::new(Lru::new()),
        PolicyKind::LfuDecay => Box::new(LfuDecay::new(decay)?),
        PolicyKind::Profile => {
            let profile = profile.ok_or_else(|| {
                ConfigError::new("cache policy `profile` needs a profile file (--profile FILE)")
            })?;
            Box::new(StaticProfile::new(profile, pinned_per_layer))
        }
    })
}

/// Least recently used (the Horizon runtime's policy).
#[derive(Debug, Default, Clone)]
pub struct Lru {
    /// (layer, expert) -> (step, sequence number) of the last access.
    last: HashMap<(usize, u32), (u64, u64)>,
    seq: u64,
}

impl Lru {
    pub fn new() -> Self {
        Self::default()
    }

    /// When `expert` was last used, as an orderable key; never-used experts sort first.
    fn recency(&self, layer: usize, expert: u32) -> (u64, u64) {
        self.last.get(&(layer, expert)).copied().unwrap_or((0, 0))
    }
}

impl Policy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn on_access(&mut self, layer: usize, expert: u32, step: u64) {
        self.seq += 1;
        self.last.insert((layer, expert), (step, self.seq));
    }

    fn choose_victim(&mut self, layer: usize, candidates: &[u32], _step: u64) -> Option<u32> {
        candidates
            .iter()
            .copied()
            .min_by_key(|&e| (self.recency(layer, e), e))
    }
}

/// Least frequently used with exponential decay (Strata's decayed access counter): on each
/// access `count = count * decay^(steps since the last access) + 1`; the victim is the
/// candidate whose count, decayed to the current step, is smallest (ties: least recent).
#[derive(Debug, Clone)]
pub struct LfuDecay {
    decay: f64,
    /// (layer, expert) -> (count at `last`, step of the last access).
    counts: HashMap<(usize, u32), (f64, u64)>,
}

impl LfuDecay {
    pub const DEFAULT_DECAY: f64 = 0.95;

    /// `decay` must lie in (0, 1]; 1 is plain LFU.
    pub fn new(decay: f64) -> Result<Self, ConfigError> {
        if !(decay.is_finite() && decay > 0.0 && decay <= 1.0) {
            return Err(ConfigError::new(format!(
                "LFU decay must be in (0, 1] (1 = no decay); got {decay}"
            )));
        }
        Ok(Self {
            decay,
            counts: HashMap::new(),
        })
    }

    pub fn decay(&self) -> f64 {
        self.decay
    }

    /// The decayed count of `expert` as seen at `step`.
    pub fn score(&self, layer: usize, expert: u32, step: u64) -> f64 {
        match self.counts.get(&(layer, expert)) {
            Some(&(count, last)) => count * self.factor(step.saturating_sub(last)),
            None => 0.0,
        }
    }

    fn factor(&self, dt: u64) -> f64 {
        // dt beyond i32 decays to 0 (or stays 1 without decay) either way.
        match i32::try_from(dt) {
            Ok(dt) => self.decay.powi(dt),
            Err(_) => self.decay.powf(dt as f64),
        }
    }

    fn last_step(&self, layer: usize, expert: u32) -> u64 {
        self.counts.get(&(layer, expert)).map_or(0, |&(_, s)| s)
    }
}

impl Policy for LfuDecay {
    fn name(&self) -> &'static str {
        "lfu-decay"
    }

    fn on_access(&mut self, layer: usize, expert: u32, step: u64) {
        let score = self.score(layer, expert, step);
        self.counts.insert((layer, expert), (score + 1.0, step));
    }

    fn choose_victim(&mut self, layer: usize, candidates: &[u32], step: u64) -> Option<u32> {
        candidates.iter().copied().min_by(|&a, &b| {
            self.score(layer, a, step)
                .total_cmp(&self.score(layer, b, step))
                .then(self.last_step(layer, a).cmp(&self.last_step(layer, b)))
                .then(a.cmp(&b))
        })
    }
}

/// Static profile: pins the `pinned_per_layer` experts measured most frequent on a calibration
/// pass and evicts only unpinned experts (least recently used first). Only when every
/// candidate is pinned (a group of unpinned experts needs the room) does it evict the pinned
/// candidate with the lowest profile count; that expert comes back on its next use.
#[derive(Debug, Clone)]
pub struct StaticProfile {
    pinned: Vec<HashSet<u32>>,
    counts: Vec<Vec<u64>>,
    lru: Lru,
}

impl StaticProfile {
    pub fn new(profile: &Profile, pinned_per_layer: usize) -> Self {
        let pinned = (0..profile.num_layers)
            .map(|l| profile.top(l, pinned_per_layer).into_iter().collect())
            .collect();
        Self {
            pinned,
            counts: profile.counts.clone(),
            lru: Lru::new(),
        }
    }

    pub fn is_pinned(&self, layer: usize, expert: u32) -> bool {
        self.pinned.get(layer).is_some_and(|p| p.contains(&expert))
    }

    fn count(&self, layer: usize, expert: u32) -> u64 {
        self.counts
            .get(layer)
            .and_then(|c| c.get(expert as usize))
            .copied()
            .unwrap_or(0)
    }
}

impl Policy for StaticProfile {
    fn name(&self) -> &'static str {
        "profile"
    }

    fn on_access(&mut self, layer: usize, expert: u32, step: u64) {
        self.lru.on_access(layer, expert, step);
    }

    fn choose_victim(&mut self, layer: usize, candidates: &[u32], step: u64) -> Option<u32> {
        let unpinned: Vec<u32> = candidates
            .iter()
            .copied()
            .filter(|&e| !self.is_pinned(layer, e))
            .collect();
        if !unpinned.is_empty() {
            return self.lru.choose_victim(layer, &unpinned, step);
        }
        candidates
            .iter()
            .copied()
            .min_by_key(|&e| (self.count(layer, e), self.lru.recency(layer, e), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_least_recently_used() {
        let mut p = Lru::new();
        p.on_access(0, 0, 1);
        p.on_access(0, 1, 2);
        p.on_access(0, 2, 3);
        p.on_access(0, 0, 4);
        assert_eq!(p.choose_victim(0, &[0, 1, 2], 5), Some(1));
        assert_eq!(p.choose_victim(0, &[0, 2], 5), Some(2));
        // Layers are independent: on layer 1 nothing was seen, lowest id first.
        assert_eq!(p.choose_victim(1, &[0, 1, 2], 5), Some(0));
        // Within one step, the earlier access is the older one.
        p.on_access(0, 5, 6);
        p.on_access(0, 4, 6);
        assert_eq!(p.choose_victim(0, &[4, 5], 7), Some(5));
        assert_eq!(p.choose_victim(0, &[], 7), None);
    }

    #[test]
    fn lfu_decay_weighs_frequency_against_recency() {
        // Expert 0: used at steps 1, 2, 3. Expert 1: used once at step 4.
        let trace = [(0, 1), (0, 2), (0, 3), (1, 4)];
        let mut plain = LfuDecay::new(1.0).unwrap();
        let mut fast = LfuDecay::new(0.5).unwrap();
        for (e, s) in trace {
            plain.on_access(0, e, s);
            fast.on_access(0, e, s);
        }
        // No decay: 3 accesses beat 1.
        assert_eq!(plain.score(0, 0, 5), 3.0);
        assert_eq!(plain.choose_victim(0, &[0, 1], 5), Some(1));
        // decay 0.5: expert 0 = (1*0.5+1)*0.5+1 = 1.75 at step 3 -> 0.4375 at step 5;
        // expert 1 = 1 at step 4 -> 0.5 at step 5. The old burst loses.
        assert!((fast.score(0, 0, 5) - 0.4375).abs() < 1e-12);
        assert!((fast.score(0, 1, 5) - 0.5).abs() < 1e-12);
        assert_eq!(fast.choose_victim(0, &[0, 1], 5), Some(0));
        // Huge gaps decay to zero without overflow.
        assert_eq!(fast.score(0, 1, u64::MAX), 0.0);
    }

    #[test]
    fn lfu_decay_rejects_bad_decay() {
        for d in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            let err = LfuDecay::new(d).unwrap_err();
            assert!(err.0.contains("(0, 1]"), "{err}");
        }
    }

    #[test]
    fn profile_pins_most_frequent_and_evicts_unpinned_first() {
        let mut prof = Profile::new("m", 1, 4);
        prof.counts[0] = vec![10, 50, 5, 40];
        let mut p = StaticProfile::new(&prof, 2);
        assert!(p.is_pinned(0, 1) && p.is_pinned(0, 3));
        assert!(!p.is_pinned(0, 0) && !p.is_pinned(0, 2) && !p.is_pinned(7, 1));
        // Pinned 1 and 3 were used long ago, unpinned 0 and 2 recently: still evict unpinned,
        // least recent of them.
        p.on_access(0, 1, 1);
        p.on_access(0, 3, 1);
        p.on_access(0, 2, 2);
        p.on_access(0, 0, 3);
        assert_eq!(p.choose_victim(0, &[0, 1, 2, 3], 4), Some(2));
        assert_eq!(p.choose_victim(0, &[0, 1, 3], 4), Some(0));
        // Only pinned candidates: the one with the lower profile count goes.
        assert_eq!(p.choose_victim(0, &[1, 3], 4), Some(3));
    }

    #[test]
    fn policy_kind_parses_cli_names() {
        for k in PolicyKind::ALL {
            assert_eq!(k.as_str().parse::<PolicyKind>().unwrap(), k);
        }
        let err = "fifo".parse::<PolicyKind>().unwrap_err();
        assert!(err.0.contains("lru, lfu-decay, profile"));
        let prof = Profile::new("m", 2, 4);
        for k in PolicyKind::ALL {
            let p = build_policy(k, 0.9, Some(&prof), 2).unwrap();
            assert_eq!(p.name(), k.as_str());
        }
        assert!(build_policy(PolicyKind::Profile, 0.9, None, 2).is_err());
        assert!(build_policy(PolicyKind::LfuDecay, 2.0, None, 2).is_err());
    }
}

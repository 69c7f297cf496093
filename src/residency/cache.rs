//! The expert cache of one layer: which experts have a GPU copy, in which slot, and the
//! state machine that changes that set without a reader ever seeing a partly written slot.
//!
//! A layer has `capacity` published slots plus `spares` unpublished ones (`capacity + spares`
//! slots in GPU memory, fixed at construction). Serving one routed group goes:
//!
//! 1. [`plan`](ExpertCache::plan): hits vs misses; each miss gets a free slot that no
//!    in-flight submission reads; victims (published experts outside the group) are chosen by
//!    the policy. Nothing visible changes: [`table`](ExpertCache::table) is still the previous
//!    generation and victims stay readable.
//! 2. The caller stages and copies each upload, then [`complete_uploads`](ExpertCache::complete_uploads)
//!    with the copy's submission token.
//! 3. [`publish`](ExpertCache::publish): one transition to a new generation in which every
//!    expert of the group is mapped and the victims are gone. A victim's slot becomes free but
//!    is written again only after every submission that read it has completed.
//!
//! Any failure before step 3 is undone by [`abort`](ExpertCache::abort), which restores the
//! slots and leaves the previous generation untouched. Submissions that read through the table
//! are recorded with [`mark_read`](ExpertCache::mark_read).

use std::fmt;

use super::error::{CacheError, ConfigError};
use super::fence::Fence;
use super::policy::Policy;

/// The table entry of an expert without a GPU copy.
pub const NO_SLOT: u32 = u32::MAX;

/// The fixed shape of one layer's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    pub layer: usize,
    pub num_experts: usize,
    pub top_k: usize,
    /// Published slots: at most this many experts are resident at once.
    pub capacity: usize,
    /// Unpublished slots that uploads land in while the previous generation stays readable.
    pub spares: usize,
    /// Unpublished slots that prefetched experts land in ([`ExpertCache::prefetch`]), beside
    /// the spares, so a step's misses always find `spares` slots (0: no prefetch).
    pub prefetch: usize,
}

impl CacheConfig {
    /// Full residency: every expert has a slot, no spares needed.
    pub fn full(layer: usize, num_experts: usize, top_k: usize) -> Self {
        Self {
            layer,
            num_experts,
            top_k,
            capacity: num_experts,
            spares: 0,
            prefetch: 0,
        }
    }

    /// `capacity` resident experts with the smallest spare count that always works
    /// (`top_k` below full residency, none at full residency).
    pub fn partial(layer: usize, num_experts: usize, top_k: usize, capacity: usize) -> Self {
        let spares = if capacity >= num_experts { 0 } else { top_k };
        Self {
            layer,
            num_experts,
            top_k,
            capacity,
            spares,
            prefetch: 0,
        }
    }

    /// A cache beside CPU-computed misses: `capacity` resident experts (any count from 1),
    /// groups of at most min(top_k, capacity) experts sent to it, as many spare slots.
    /// Only the experts chosen for the device are planned; the others run on the CPU.
    pub fn hybrid(layer: usize, num_experts: usize, top_k: usize, capacity: usize) -> Self {
        let group = top_k.min(capacity);
        Self {
            layer,
            num_experts,
            top_k: group,
            capacity,
            spares: if capacity >= num_experts { 0 } else { group },
            prefetch: 0,
        }
    }

    /// The same cache with `width` prefetch slots below full residency (none at full
    /// residency: every expert is resident already).
    pub fn with_prefetch(self, width: usize) -> Self {
        Self {
            prefetch: if self.capacity >= self.num_experts {
                0
            } else {
                width
            },
            ..self
        }
    }

    /// Slots in GPU memory: `capacity + spares + prefetch`.
    pub fn total_slots(&self) -> usize {
        self.capacity + self.spares + self.prefetch
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let (e, k, c, s) = (self.num_experts, self.top_k, self.capacity, self.spares);
        let l = self.layer;
        if e == 0 || e >= NO_SLOT as usize {
            return Err(ConfigError::new(format!(
                "layer {l}: the number of experts must be in 1..{NO_SLOT}; got {e}"
            )));
        }
        if k == 0 || k > e {
            return Err(ConfigError::new(format!(
                "layer {l}: top_k must be in 1..={e}; got {k}"
            )));
        }
        if c < k || c > e {
            return Err(ConfigError::new(format!(
                "layer {l}: resident experts per layer must be in top_k..=num_experts = {k}..={e}; got {c}"
            )));
        }
        if c < e && s < k {
            return Err(ConfigError::new(format!(
                "layer {l}: partial residency ({c} of {e} experts) needs at least top_k = {k} spare \
                 slots so a group's misses can be uploaded while the previous generation stays \
                 readable; got {s}"
            )));
        }
        if self.prefetch > e {
            return Err(ConfigError::new(format!(
                "layer {l}: {} prefetch slots for {e} experts; at most {e}",
                self.prefetch
            )));
        }
        if c + s + self.prefetch >= NO_SLOT as usize {
            return Err(ConfigError::new(format!(
                "layer {l}: {c} + {s} + {} slots is too many",
                self.prefetch
            )));
        }
        Ok(())
    }
}

/// The lifecycle of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Holds no addressable expert; writable once its last reader has completed.
    Free,
    /// Holds an expert of the current generation.
    Published,
    /// Reserved by the open plan for an upload; not in the table.
    Uploading,
    /// Holds (or is being copied) an expert guessed for the layer's next step; not in the
    /// table until a plan that wants it is published ([`ExpertCache::prefetch`]).
    Prefetched,
}

/// What the cache knows about one slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotInfo<T> {
    pub state: SlotState,
    /// The expert held (published) or being uploaded; `None` when free.
    pub expert: Option<u32>,
    /// The last submission that read this slot.
    pub last_read: Option<T>,
    /// The last submission that copied an expert into this slot.
    pub last_write: Option<T>,
}

/// The expert -> slot table of one generation, as uploaded to the GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotTable {
    generation: u64,
    slot_of: Vec<u32>,
}

impl SlotTable {
    fn empty(num_experts: usize) -> Self {
        Self {
            generation: 0,
            slot_of: vec![NO_SLOT; num_experts],
        }
    }

    /// Starts at 0 (nothing resident) and increases by one per publication that changes the
    /// mapping.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn slot_of(&self, expert: u32) -> Option<u32> {
        self.slot_of
            .get(expert as usize)
            .copied()
            .filter(|&s| s != NO_SLOT)
    }

    /// One word per expert: its slot, or [`NO_SLOT`]. These are the bytes the GPU table holds.
    pub fn words(&self) -> &[u32] {
        &self.slot_of
    }

    /// Resident `(expert, slot)` pairs in expert order.
    pub fn resident(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.slot_of
            .iter()
            .enumerate()
            .filter(|(_, &s)| s != NO_SLOT)
            .map(|(e, &s)| (e as u32, s))
    }

    pub fn resident_count(&self) -> usize {
        self.slot_of.iter().filter(|&&s| s != NO_SLOT).count()
    }
}

/// An expert placed in a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub expert: u32,
    pub slot: u32,
}

/// How to serve one routed group. Produced by [`ExpertCache::plan`]; hand it back to
/// `complete_uploads`, `publish` or `abort`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    id: u64,
    layer: usize,
    base_generation: u64,
    wanted: Vec<u32>,
    hits: Vec<Placement>,
    uploads: Vec<Placement>,
    /// Misses already copied by a prefetch: published without a copy.
    prefetched: Vec<Placement>,
    evictions: Vec<Placement>,
}

impl Plan {
    pub fn id(&self) -> u64 {
        self.id
    }
    pub fn layer(&self) -> usize {
        self.layer
    }
    /// The generation readers see until this plan is published.
    pub fn base_generation(&self) -> u64 {
        self.base_generation
    }
    /// The group's distinct experts, in first-appearance order.
    pub fn wanted(&self) -> &[u32] {
        &self.wanted
    }
    pub fn hits(&self) -> &[Placement] {
        &self.hits
    }
    /// Copies to make: each missing expert into its (unpublished) target slot.
    pub fn uploads(&self) -> &[Placement] {
        &self.uploads
    }
    /// Misses a prefetch already copied into their (unpublished) slots: no copy to make.
    pub fn prefetched(&self) -> &[Placement] {
        &self.prefetched
    }
    /// Published experts this plan drops at publication.
    pub fn evictions(&self) -> &[Placement] {
        &self.evictions
    }
    /// Nothing to copy (prefetched misses need none).
    pub fn is_all_hits(&self) -> bool {
        self.uploads.is_empty()
    }
}

/// Per-layer counters. Hits, misses, evictions and uploads count published groups only; an
/// aborted plan counts in `aborts` and its group is counted when retried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub uploads: u64,
    pub publishes: u64,
    pub aborts: u64,
    /// `plan` calls refused with [`CacheError::NotNow`].
    pub not_now: u64,
    /// Experts copied ahead by [`ExpertCache::prefetch`] (counted when their copy is
    /// submitted), those a published plan then used (not counted in `misses`), and those
    /// released unused.
    pub prefetch_issued: u64,
    pub prefetch_used: u64,
    pub prefetch_wasted: u64,
}

/// What an abort undid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbortReport {
    pub plan: u64,
    /// The generation still published (the plan's base generation).
    pub generation: u64,
    /// Slots returned to the free state.
    pub released_slots: Vec<u32>,
}

struct OpenPlan<T> {
    plan: Plan,
    uploads_done: bool,
    /// Upload target slots as they were before the plan.
    saved: Vec<(u32, SlotInfo<T>)>,
}

/// The residency state of one layer, generic over the fence that says when a submission
/// has retired.
pub struct ExpertCache<F: Fence> {
    pub(super) config: CacheConfig,
    pub(super) table: SlotTable,
    pub(super) slots: Vec<SlotInfo<F::Token>>,
    open: Option<OpenPlan<F::Token>>,
    next_plan: u64,
    step: u64,
    pub(super) stats: CacheStats,
    /// Per slot: a prefetched slot's copy was submitted (`complete_prefetch`).
    pub(super) prefetch_copied: Vec<bool>,
}

impl<F: Fence> fmt::Debug for ExpertCache<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExpertCache")
            .field("config", &self.config)
            .field("generation", &self.table.generation)
            .field("slots", &self.slots)
            .field("open_plan", &self.open.as_ref().map(|o| o.plan.id))
            .field("stats", &self.stats)
            .finish()
    }
}

type CacheResult<T, F> = Result<T, CacheError<<F as Fence>::Token>>;

impl<F: Fence> ExpertCache<F> {
    pub fn new(config: CacheConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let free = SlotInfo {
            state: SlotState::Free,
            expert: None,
            last_read: None,
            last_write: None,
        };
        Ok(Self {
            config,
            table: SlotTable::empty(config.num_experts),
            slots: vec![free; config.total_slots()],
            open: None,
            next_plan: 1,
            step: 0,
            stats: CacheStats::default(),
            prefetch_copied: vec![false; config.total_slots()],
        })
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// The published generation: what every reader must use.
    pub fn table(&self) -> &SlotTable {
        &self.table
    }

    pub fn generation(&self) -> u64 {
        self.table.generation
    }

    pub fn slots(&self) -> &[SlotInfo<F::Token>] {
        &self.slots
    }

    pub fn published_count(&self) -> usize {
        self.table.resident_count()
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Zeroes the counters (e.g. after warm-up); the residency state is untouched.
    pub fn reset_stats(&mut self) {
        self.stats = CacheStats::default();
    }

    /// The id of the plan awaiting publish or abort.
    pub fn open_plan(&self) -> Option<u64> {
        self.open.as_ref().map(|o| o.plan.id)
    }

    /// Groups published so far (the step passed to the policy).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Plans how to serve `wanted` (one routed group; repeated ids allowed).
    ///
    /// On success the upload targets are reserved and the plan is open until published or
    /// aborted. [`CacheError::NotNow`] and every other refusal leave the state untouched.
    pub fn plan(
        &mut self,
        wanted: &[u32],
        policy: &mut dyn Policy,
        fence: &F,
    ) -> CacheResult<Plan, F> {
        let layer = self.config.layer;
        if let Some(open) = &self.open {
            return Err(CacheError::PlanInFlight {
                layer,
                open: open.plan.id,
            });
        }
        let mut distinct: Vec<u32> = Vec::with_capacity(wanted.len());
        for &e in wanted {
            if e as usize >= self.config.num_experts {
                return Err(CacheError::UnknownExpert {
                    layer,
                    expert: e,
                    num_experts: self.config.num_experts,
                });
            }
            if !distinct.contains(&e) {
                distinct.push(e);
            }
        }
        if distinct.len() > self.config.capacity {
            return Err(CacheError::NeverFits {
                layer,
                distinct: distinct.len(),
                capacity: self.config.capacity,
            });
        }
        let mut hits = Vec::new();
        let mut misses = Vec::new();
        let mut prefetched = Vec::new();
        for &e in &distinct {
            match (self.table.slot_of(e), self.prefetched_slot(e)) {
                (Some(slot), _) => hits.push(Placement { expert: e, slot }),
                (None, Some(slot)) => prefetched.push(Placement { expert: e, slot }),
                (None, None) => misses.push(e),
            }
        }

        // Upload targets: free slots whose last reader has retired.
        let free: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].state == SlotState::Free)
            .collect();
        if misses.len() > free.len() {
            return Err(CacheError::GroupTooLarge {
                layer,
                misses: misses.len(),
                free: free.len(),
            });
        }
        let (ready, mut pending): (Vec<usize>, Vec<usize>) = free
            .into_iter()
            .partition(|&i| self.slots[i].last_read.is_none_or(|t| fence.is_complete(t)));
        if ready.len() < misses.len() {
            pending.sort_by_key(|&i| self.slots[i].last_read);
            let need = misses.len() - ready.len();
            // Pending slots all have a reader in flight; waiting for the need-th oldest one
            // frees enough of them.
            let wait_for = pending
                .get(need - 1)
                .and_then(|&i| self.slots[i].last_read)
                .ok_or(CacheError::GroupTooLarge {
                    layer,
                    misses: misses.len(),
                    free: ready.len() + pending.len(),
                })?;
            self.stats.not_now += 1;
            return Err(CacheError::NotNow { layer, wait_for });
        }

        // Victims: just enough to keep the published count within capacity.
        let published = self.published_count();
        let need =
            (published + misses.len() + prefetched.len()).saturating_sub(self.config.capacity);
        let mut candidates: Vec<u32> = self
            .table
            .resident()
            .map(|(e, _)| e)
            .filter(|e| !distinct.contains(e))
            .collect();
        let mut evictions = Vec::with_capacity(need);
        for _ in 0..need {
            let choice = policy
                .choose_victim(layer, &candidates, self.step)
                .filter(|v| candidates.contains(v))
                .or_else(|| candidates.first().copied());
            // |candidates| = published - hits >= need because |distinct| <= capacity.
            let (Some(victim), Some(slot)) = (choice, choice.and_then(|v| self.table.slot_of(v)))
            else {
                return Err(CacheError::NeverFits {
                    layer,
                    distinct: distinct.len(),
                    capacity: self.config.capacity,
                });
            };
            candidates.retain(|&c| c != victim);
            evictions.push(Placement {
                expert: victim,
                slot,
            });
        }

        let uploads: Vec<Placement> = misses
            .iter()
            .zip(&ready)
            .map(|(&expert, &slot)| Placement {
                expert,
                slot: slot as u32,
            })
            .collect();
        let mut saved = Vec::with_capacity(uploads.len());
        for u in &uploads {
            let slot = &mut self.slots[u.slot as usize];
            saved.push((u.slot, *slot));
            slot.state = SlotState::Uploading;
            slot.expert = Some(u.expert);
        }
        let plan = Plan {
            id: self.next_plan,
            layer,
            base_generation: self.table.generation,
            wanted: distinct,
            hits,
            uploads,
            prefetched,
            evictions,
        };
        self.next_plan += 1;
        self.open = Some(OpenPlan {
            plan: plan.clone(),
            uploads_done: false,
            saved,
        });
        Ok(plan)
    }

    /// Records that every upload of `plan` was copied into its slot by submission
    /// `upload_token`. Readers submitted after that submission on the same queue see the data.
    pub fn complete_uploads(&mut self, plan: &Plan, upload_token: F::Token) -> CacheResult<(), F> {
        let open = self.open_mut(plan)?;
        open.uploads_done = true;
        let targets: Vec<u32> = open.plan.uploads.iter().map(|u| u.slot).collect();
        for s in targets {
            self.slots[s as usize].last_write = Some(upload_token);
        }
        Ok(())
    }

    /// Publishes `plan` in one step: the new generation maps every expert of the group and
    /// drops the victims. Returns the generation now published.
    pub fn publish(&mut self, plan: &Plan, policy: &mut dyn Policy) -> CacheResult<u64, F> {
        let layer = self.config.layer;
        let open = self.open_mut(plan)?;
        if !open.uploads_done && !open.plan.uploads.is_empty() {
            return Err(CacheError::UploadsIncomplete {
                layer,
                plan: plan.id,
            });
        }
        let Some(open) = self.open.take() else {
            return Err(CacheError::StalePlan {
                layer,
                plan: plan.id,
            });
        };
        let plan = open.plan;

        let mut next = self.table.slot_of.clone();
        for v in &plan.evictions {
            next[v.expert as usize] = NO_SLOT;
            let slot = &mut self.slots[v.slot as usize];
            slot.state = SlotState::Free;
            slot.expert = None;
            policy.on_evict(layer, v.expert);
        }
        for u in plan.uploads.iter().chain(&plan.prefetched) {
            next[u.expert as usize] = u.slot;
            self.slots[u.slot as usize].state = SlotState::Published;
            self.prefetch_copied[u.slot as usize] = false;
        }
        let changed =
            !plan.uploads.is_empty() || !plan.prefetched.is_empty() || !plan.evictions.is_empty();
        if changed {
            self.table = SlotTable {
                generation: self.table.generation + 1,
                slot_of: next,
            };
        }

        for &e in &plan.wanted {
            policy.on_access(layer, e, self.step);
        }
        self.step += 1;
        self.stats.hits += plan.hits.len() as u64;
        self.stats.misses += plan.uploads.len() as u64;
        self.stats.uploads += plan.uploads.len() as u64;
        self.stats.prefetch_used += plan.prefetched.len() as u64;
        self.stats.evictions += plan.evictions.len() as u64;
        self.stats.publishes += 1;
        Ok(self.table.generation)
    }

    /// Undoes `plan` after a failure before publication (staging map failure, copy failure):
    /// its target slots return to their previous state and the published generation is
    /// untouched. The report says what was undone.
    pub fn abort(&mut self, plan: &Plan) -> CacheResult<AbortReport, F> {
        self.open_mut(plan)?;
        let Some(open) = self.open.take() else {
            return Err(CacheError::StalePlan {
                layer: self.config.layer,
                plan: plan.id,
            });
        };
        let mut released_slots = Vec::with_capacity(open.saved.len());
        for (slot, info) in open.saved {
            self.slots[slot as usize] = info;
            released_slots.push(slot);
        }
        self.stats.aborts += 1;
        Ok(AbortReport {
            plan: open.plan.id,
            generation: self.table.generation,
            released_slots,
        })
    }

    /// Records that submission `token` reads the slots of `experts` (all resident in the
    /// current generation). Nothing is recorded if one is not resident.
    pub fn mark_read(&mut self, experts: &[u32], token: F::Token) -> CacheResult<(), F> {
        let mut slots = Vec::with_capacity(experts.len());
        for &e in experts {
            let slot = self.table.slot_of(e).ok_or(CacheError::NotResident {
                layer: self.config.layer,
                expert: e,
                generation: self.table.generation,
            })?;
            slots.push(slot);
        }
        for s in slots {
            Self::record_read(&mut self.slots[s as usize], token);
        }
        Ok(())
    }

    /// Records that submission `token` may read any published slot (for executors that read
    /// the expert ids on the GPU).
    pub fn mark_all_read(&mut self, token: F::Token) {
        for slot in self
            .slots
            .iter_mut()
            .filter(|s| s.state == SlotState::Published)
        {
            Self::record_read(slot, token);
        }
    }

    fn record_read(slot: &mut SlotInfo<F::Token>, token: F::Token) {
        slot.last_read = Some(slot.last_read.map_or(token, |t| t.max(token)));
    }

    fn open_mut(&mut self, plan: &Plan) -> CacheResult<&mut OpenPlan<F::Token>, F> {
        let layer = self.config.layer;
        match &mut self.open {
            Some(open) if open.plan.id == plan.id && plan.layer == layer => Ok(open),
            _ => Err(CacheError::StalePlan {
                layer,
                plan: plan.id,
            }),
        }
    }

    /// Checks the structural invariants; `Err` names the first one broken.
    pub fn check_invariants(&self) -> Result<(), String> {
        let published = self
            .slots
            .iter()
            .filter(|s| s.state == SlotState::Published)
            .count();
        if published > self.config.capacity {
            return Err(format!(
                "{published} published slots exceed capacity {}",
                self.config.capacity
            ));
        }
        if published != self.table.resident_count() {
            return Err(format!(
                "{published} published slots but {} table entries",
                self.table.resident_count()
            ));
        }
        for (e, s) in self.table.resident() {
            let slot = self
                .slots
                .get(s as usize)
                .ok_or(format!("expert {e} maps to missing slot {s}"))?;
            if slot.state != SlotState::Published || slot.expert != Some(e) {
                return Err(format!("expert {e} maps to slot {s} holding {slot:?}"));
            }
        }
        let uploading = self
            .slots
            .iter()
            .filter(|s| s.state == SlotState::Uploading)
            .count();
        let expected = self.open.as_ref().map_or(0, |o| o.plan.uploads.len());
        if uploading != expected {
            return Err(format!(
                "{uploading} uploading slots but the open plan has {expected} uploads"
            ));
        }
        if let Some(s) = self
            .slots
            .iter()
            .find(|s| s.state == SlotState::Free && s.expert.is_some())
        {
            return Err(format!("free slot holds an expert: {s:?}"));
        }
        self.check_prefetch_invariants()
    }
}

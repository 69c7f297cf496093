//! Prefetching into a layer's cache: experts guessed for the layer's next step (the next
//! layer's router applied to the current layer's hidden state, `--prefetch next-layer`)
//! are copied into unpublished prefetch slots ahead of time. They stay out of the table
//! until the real routing is known; a plan that wants one publishes it without a copy,
//! and [`settle_prefetch`](ExpertCache::settle_prefetch) releases the others (a wrong
//! guess costs its copy, nothing else).
//!
//! A prefetch slot is taken only when it is free and no submission in flight reads it
//! (the rule every upload follows), and never one the spares need: the cache holds
//! `capacity + spares + prefetch` slots, prefetches use at most `prefetch` of them, so a
//! step's misses always find `spares`.

use super::cache::{ExpertCache, Placement, SlotInfo, SlotState};
use super::error::CacheError;
use super::fence::Fence;

/// `--prefetch`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Prefetch {
    /// Copy experts only when the router has chosen them.
    #[default]
    Off,
    /// After a layer's attention, apply the next MoE layer's router to this layer's
    /// hidden state and copy the guessed experts while this layer's experts compute, in
    /// each layer only while its recent guesses pay for their copies (`PrefetchGate`).
    NextLayer,
    /// next-layer without the gate: every guess copied, paying or not.
    NextLayerUngated,
}

impl Prefetch {
    pub fn name(self) -> &'static str {
        match self {
            Prefetch::Off => "off",
            Prefetch::NextLayer => "next-layer",
            Prefetch::NextLayerUngated => "next-layer-ungated",
        }
    }

    /// Next-layer guesses are made and copied (gated or not).
    pub fn guesses(self) -> bool {
        self != Prefetch::Off
    }

    /// A layer's copies stop while its guesses do not pay.
    pub fn gated(self) -> bool {
        self == Prefetch::NextLayer
    }
}

/// What settling a step's prefetches found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settled {
    /// Prefetched experts the step wants (published by its plan, without a copy).
    pub used: Vec<Placement>,
    /// Prefetched experts the step does not want: released (their copy was wasted).
    pub wasted: Vec<Placement>,
}

type CacheResult<T, F> = Result<T, CacheError<<F as Fence>::Token>>;

impl<F: Fence> ExpertCache<F> {
    /// The prefetch slot holding `expert`, if one does.
    pub fn prefetched_slot(&self, expert: u32) -> Option<u32> {
        self.slots
            .iter()
            .position(|s| s.state == SlotState::Prefetched && s.expert == Some(expert))
            .map(|i| i as u32)
    }

    /// Experts held in prefetch slots, with their slots.
    pub fn prefetched(&self) -> Vec<Placement> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state == SlotState::Prefetched)
            .filter_map(|(i, s)| {
                s.expert.map(|expert| Placement {
                    expert,
                    slot: i as u32,
                })
            })
            .collect()
    }

    /// What a prefetch of `guess` would copy, as the gate judges it: the guessed experts
    /// not resident, at most as many as the prefetch slots.
    pub fn prefetch_candidates(&self, guess: &[u32]) -> Vec<u32> {
        guess
            .iter()
            .copied()
            .filter(|&e| self.table().slot_of(e).is_none())
            .take(self.config.prefetch)
            .collect()
    }

    /// Reserve prefetch slots for `guess` (in order): each expert not resident, not already
    /// prefetched and not being uploaded gets a free slot no submission in flight reads,
    /// while prefetch slots remain. Never waits: a guess that finds no ready slot is
    /// skipped. The caller copies each returned expert into its slot, then
    /// [`complete_prefetch`](Self::complete_prefetch) (or
    /// [`cancel_prefetch`](Self::cancel_prefetch) if the copy failed).
    pub fn prefetch(&mut self, guess: &[u32], fence: &F) -> CacheResult<Vec<Placement>, F> {
        let layer = self.config.layer;
        if let Some(&e) = guess
            .iter()
            .find(|&&e| e as usize >= self.config.num_experts)
        {
            return Err(CacheError::UnknownExpert {
                layer,
                expert: e,
                num_experts: self.config.num_experts,
            });
        }
        let held = self
            .slots
            .iter()
            .filter(|s| s.state == SlotState::Prefetched)
            .count();
        let mut room = self.config.prefetch.saturating_sub(held);
        let mut out = Vec::new();
        for &e in guess {
            if room == 0 {
                break;
            }
            let busy = self.table.slot_of(e).is_some()
                || self
                    .slots
                    .iter()
                    .any(|s| s.expert == Some(e) && s.state != SlotState::Free);
            if busy {
                continue;
            }
            let Some(i) = (0..self.slots.len()).find(|&i| {
                self.slots[i].state == SlotState::Free
                    && self.slots[i].last_read.is_none_or(|t| fence.is_complete(t))
            }) else {
                break;
            };
            let slot = &mut self.slots[i];
            slot.state = SlotState::Prefetched;
            slot.expert = Some(e);
            self.prefetch_copied[i] = false;
            out.push(Placement {
                expert: e,
                slot: i as u32,
            });
            room -= 1;
        }
        Ok(out)
    }

    /// Records that submission `token` copies each of `placed` into its prefetch slot.
    pub fn complete_prefetch(
        &mut self,
        placed: &[Placement],
        token: F::Token,
    ) -> CacheResult<(), F> {
        for p in placed {
            self.held_prefetch(p)?;
        }
        for p in placed {
            let i = p.slot as usize;
            self.slots[i].last_write = Some(token);
            self.prefetch_copied[i] = true;
        }
        self.stats.prefetch_issued += placed.len() as u64;
        Ok(())
    }

    /// Returns the prefetch slots of `placed`, whose copy was never submitted, to free.
    pub fn cancel_prefetch(&mut self, placed: &[Placement]) -> CacheResult<(), F> {
        for p in placed {
            self.held_prefetch(p)?;
        }
        for p in placed {
            self.release_prefetch(p.slot as usize);
        }
        Ok(())
    }

    /// The layer's routing of a step is known (`wanted`: its distinct experts): the
    /// prefetched experts it wants stay for the step's plan, the others are released.
    /// A prefetched expert whose copy was not submitted yet is a caller bug, reported.
    pub fn settle_prefetch(&mut self, wanted: &[u32]) -> CacheResult<Settled, F> {
        let held = self.prefetched();
        if let Some(p) = held.iter().find(|p| !self.prefetch_copied[p.slot as usize]) {
            return Err(CacheError::PrefetchNotCopied {
                layer: self.config.layer,
                expert: p.expert,
            });
        }
        let mut settled = Settled::default();
        for p in held {
            let i = p.slot as usize;
            if wanted.contains(&p.expert) {
                settled.used.push(p);
            } else {
                self.release_prefetch(i);
                settled.wasted.push(p);
            }
        }
        self.stats.prefetch_wasted += settled.wasted.len() as u64;
        Ok(settled)
    }

    fn held_prefetch(&self, p: &Placement) -> CacheResult<(), F> {
        match self.slots.get(p.slot as usize) {
            Some(SlotInfo {
                state: SlotState::Prefetched,
                expert: Some(e),
                ..
            }) if *e == p.expert => Ok(()),
            _ => Err(CacheError::NotResident {
                layer: self.config.layer,
                expert: p.expert,
                generation: self.table.generation(),
            }),
        }
    }

    fn release_prefetch(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        slot.state = SlotState::Free;
        slot.expert = None;
        self.prefetch_copied[i] = false;
    }

    /// The prefetch part of `check_invariants`.
    pub(super) fn check_prefetch_invariants(&self) -> Result<(), String> {
        let held = self.prefetched();
        if held.len() > self.config.prefetch {
            return Err(format!(
                "{} prefetched slots exceed the {} prefetch slots",
                held.len(),
                self.config.prefetch
            ));
        }
        for (i, p) in held.iter().enumerate() {
            if self.table.slot_of(p.expert).is_some() {
                return Err(format!("prefetched expert {} is also published", p.expert));
            }
            if held[..i].iter().any(|q| q.expert == p.expert) {
                return Err(format!("expert {} prefetched twice", p.expert));
            }
        }
        Ok(())
    }
}

//! The prefetch gate: `--prefetch next-layer` copies a layer's guesses only while they pay.
//!
//! A next-layer guess is judged when the layer's real routing is known: each guessed
//! expert that was not resident (the ones a prefetch copies) either was chosen by the
//! router (the copy saved a miss) or not (its bytes crossed the bus for nothing). The gate
//! keeps the last [`WINDOW`] judgements of its layer and closes while their precision is
//! below the break-even the cost model gives. A closed layer goes on guessing and being
//! judged (the guess is computed on the device either way; only the copies stop), so the
//! gate re-opens as soon as its recent guesses would pay again. A layer starts closed and
//! opens once [`MIN_JUDGED`] judgements show its guesses pay: a layer that is never right
//! costs no bus time at all.
//!
//! The break-even: a right guess saves at most the part of a miss's copy that the layer's
//! compute hides, a wrong one costs its whole transfer twice (its own bus time, and the
//! wait of the misses queued behind it on the one copy engine). With the copy fully hidden
//! that is a precision of 2/3, and then the wasted bytes are at most half the used ones:
//! the gated default moves at most 1.5x the bytes of `--prefetch off` for the same hits.

use std::collections::VecDeque;

/// Judged guesses a gate remembers.
pub const WINDOW: usize = 64;
/// Judged guesses before a gate may open (a fresh layer copies nothing until then).
pub const MIN_JUDGED: usize = 16;
/// Re-opening needs the break-even plus this margin (no flapping at the edge).
pub const REOPEN_MARGIN: f64 = 0.05;
/// The cost of a wrong copy, in transfers (see the module doc).
const WRONG_COPY_COST: f64 = 2.0;
/// The break-even with the copy fully hidden (`break_even_precision(c, c)`), which is
/// also the gate's threshold where no cost figures were measured.
pub const HIDDEN_COPY_BREAK_EVEN: f64 = WRONG_COPY_COST / (1.0 + WRONG_COPY_COST);

/// The precision at which a guess pays: `copy_s` the transfer of one expert, `hidden_s`
/// the part of it the layer's compute hides (at most `copy_s`). 2/3 when fully hidden, 1
/// when nothing is.
pub fn break_even_precision(copy_s: f64, hidden_s: f64) -> f64 {
    if !(copy_s > 0.0 && copy_s.is_finite()) {
        return HIDDEN_COPY_BREAK_EVEN;
    }
    let hidden = hidden_s.clamp(0.0, copy_s);
    let wrong = WRONG_COPY_COST * copy_s;
    wrong / (hidden + wrong)
}

/// One layer's gate.
#[derive(Clone, Debug)]
pub struct PrefetchGate {
    outcomes: VecDeque<bool>,
    chosen: usize,
    threshold: f64,
    open: bool,
    /// Guesses judged while closed (not copied), and the times the gate closed.
    pub held_back: u64,
    pub closings: u64,
}

impl PrefetchGate {
    pub fn new(threshold: f64) -> Self {
        PrefetchGate {
            outcomes: VecDeque::with_capacity(WINDOW),
            chosen: 0,
            threshold: threshold.clamp(0.0, 1.0),
            open: false,
            held_back: 0,
            closings: 0,
        }
    }

    /// Copy this layer's guesses now.
    pub fn is_open(&self) -> bool {
        self.open
    }

    pub fn threshold(&self) -> f64 {
        self.threshold
    }

    /// A new break-even (the cost model's figures were measured, or changed).
    pub fn set_threshold(&mut self, threshold: f64) {
        self.threshold = threshold.clamp(0.0, 1.0);
    }

    /// The share of the remembered judgements the router chose; None before any.
    pub fn precision(&self) -> Option<f64> {
        (!self.outcomes.is_empty()).then(|| self.chosen as f64 / self.outcomes.len() as f64)
    }

    /// A step's guesses judged: `judged` copy candidates, `chosen` of them routed. `copied`:
    /// whether the gate let them be copied (those that were not count as held back).
    pub fn record(&mut self, judged: usize, chosen: usize, copied: bool) {
        let chosen = chosen.min(judged);
        if !copied {
            self.held_back += judged as u64;
        }
        for i in 0..judged {
            if self.outcomes.len() == WINDOW {
                if self.outcomes.pop_front() == Some(true) {
                    self.chosen -= 1;
                }
            }
            let hit = i < chosen;
            self.outcomes.push_back(hit);
            self.chosen += hit as usize;
        }
        let Some(p) = self.precision() else {
            return;
        };
        if self.open && p < self.threshold {
            self.open = false;
            self.closings += 1;
        } else if !self.open
            && self.outcomes.len() >= MIN_JUDGED
            && p >= self.threshold + REOPEN_MARGIN
        {
            self.open = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_break_even_is_two_thirds_when_the_copy_is_hidden() {
        assert!((break_even_precision(1.0, 1.0) - 2.0 / 3.0).abs() < 1e-12);
        assert!((break_even_precision(1.0, 5.0) - 2.0 / 3.0).abs() < 1e-12);
        assert!((break_even_precision(1.0, 0.0) - 1.0).abs() < 1e-12);
        let half = break_even_precision(1.0, 0.5);
        assert!(half > 2.0 / 3.0 && half < 1.0, "{half}");
        assert!((break_even_precision(0.0, 1.0) - 2.0 / 3.0).abs() < 1e-12);
        assert!((break_even_precision(f64::NAN, 1.0) - 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn a_layer_copies_only_once_its_guesses_have_shown_they_pay() {
        let mut g = PrefetchGate::new(2.0 / 3.0);
        assert!(!g.is_open(), "a fresh layer is held back");
        g.record(8, 8, false);
        assert!(!g.is_open(), "8 judgements are too few");
        g.record(8, 8, false);
        assert!(g.is_open(), "16 of 16 right");
        assert_eq!(g.held_back, 16);
        // Poor guesses close it.
        g.record(8, 0, true);
        assert!(g.is_open(), "16 of 24 right: at the break-even");
        g.record(8, 0, true);
        assert!(!g.is_open(), "16 of 32 right");
        assert_eq!((g.closings, g.held_back), (1, 16));
        // Closed: judged but not copied; good guesses push the bad ones out of the window.
        for _ in 0..3 {
            g.record(8, 8, false);
        }
        assert!(!g.is_open(), "{:?} is below 2/3 + margin", g.precision());
        g.record(8, 8, false);
        assert!(g.is_open(), "{:?}", g.precision());
        assert_eq!(g.held_back, 16 + 4 * 8);
    }

    #[test]
    fn a_layer_that_never_guesses_well_never_copies() {
        let mut g = PrefetchGate::new(2.0 / 3.0);
        for _ in 0..100 {
            g.record(4, 2, false);
        }
        assert!(!g.is_open());
        assert_eq!(g.held_back, 400);
        assert_eq!(g.precision(), Some(0.5));
    }

    #[test]
    fn a_layer_that_guesses_well_stays_open() {
        let mut g = PrefetchGate::new(2.0 / 3.0);
        for _ in 0..100 {
            let open = g.is_open();
            g.record(4, 3, open);
        }
        assert!(g.is_open());
        assert_eq!(g.closings, 0);
        assert_eq!(g.held_back, 16, "held back until 16 were judged");
        assert_eq!(g.precision(), Some(0.75));
    }

    #[test]
    fn the_window_forgets_old_judgements() {
        let mut g = PrefetchGate::new(0.5);
        g.record(WINDOW, 0, true);
        assert_eq!(g.precision(), Some(0.0));
        g.record(WINDOW, WINDOW, false);
        assert_eq!(g.precision(), Some(1.0));
        g.record(3, 7, false);
        assert_eq!(g.precision(), Some(1.0), "chosen is capped at judged");
    }
}

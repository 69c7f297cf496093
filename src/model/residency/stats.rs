//! The counters of partial residency (`run --json`, the bench), and their reset.

use super::{ExpertPlacement, Residency};
use crate::residency::{CostFigures, MissPolicy, Prefetch};

/// Counters reported in `--json` metrics and by the bench.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ResidencyStats {
    pub expert_hits: u64,
    pub expert_misses: u64,
    pub expert_evictions: u64,
    pub h2d_bytes: u64,
    pub upload_seconds: f64,
    pub hits_per_layer: Vec<u64>,
    pub misses_per_layer: Vec<u64>,
    pub evictions_per_layer: Vec<u64>,
    pub staging_buffers: usize,
    pub staging_peak_in_use: usize,
    /// Where misses ran (`--miss-policy`).
    pub miss_policy: MissPolicy,
    /// (token, expert) pairs computed on the CPU, and the seconds it took.
    pub cpu_expert_pairs: u64,
    pub cpu_expert_seconds: f64,
    /// Misses copied to the device (the others ran on the CPU).
    pub uploaded_misses: u64,
    /// Distinct experts per routed group computed on the CPU (misses not uploaded; every
    /// expert of a layer without device slots).
    pub cpu_misses: u64,
    /// The cost model's figures, when measured.
    pub cost_figures: Option<CostFigures>,
    /// Threads and instruction set of the CPU expert kernel.
    pub cpu_threads: usize,
    pub cpu_isa: Option<&'static str>,
    /// Threads filling staging buffers off the submitting thread (0: on it).
    pub fill_threads: usize,
    /// Seconds the device waited for a copy: from when it ran out of submitted work to
    /// when the copy it waited for was submitted (its staging full).
    pub upload_stall_seconds: f64,
    /// `--prefetch` and its width (experts guessed per layer and step).
    pub prefetch: Prefetch,
    pub prefetch_width: usize,
    /// Guessed experts copied ahead, those the real router then chose, and the bytes of
    /// the others (wrong guesses), in total and per layer.
    pub prefetch_issued: u64,
    pub prefetch_used: u64,
    pub prefetch_wasted_bytes: u64,
    /// Of the experts the router chose where a guess was made (decode steps, layers after
    /// the first MoE layer), the share the guess held; null before any guess.
    pub prefetch_accuracy: Option<f64>,
    pub prefetch_issued_per_layer: Vec<u64>,
    pub prefetch_used_per_layer: Vec<u64>,
    pub prefetch_wasted_bytes_per_layer: Vec<u64>,
    pub prefetch_accuracy_per_layer: Vec<Option<f64>>,
    /// `--prefetch next-layer`'s gate: the layers whose copies it holds back at the end
    /// (their recent guesses below the break-even), the guesses it judged without copying,
    /// and each layer's break-even precision (null where the layer has no cache).
    pub prefetch_gated_layers: Vec<usize>,
    pub prefetch_held_back: u64,
    pub prefetch_break_even_per_layer: Vec<Option<f64>>,
}

impl Residency {
    pub fn stats(&self) -> ResidencyStats {
        let mut s = ResidencyStats {
            h2d_bytes: self.h2d_bytes,
            upload_seconds: self.upload_seconds,
            staging_buffers: self.staging_bufs.len(),
            staging_peak_in_use: self.staging.stats().peak_in_use,
            miss_policy: self.miss,
            cpu_expert_pairs: self.cpu_pairs,
            cpu_expert_seconds: self.cpu_seconds,
            cpu_misses: self.cpu_misses.iter().sum(),
            cost_figures: self.figures,
            cpu_threads: self.cpu.as_ref().map_or(0, |c| c.threads()),
            cpu_isa: self.cpu.as_ref().map(|c| c.isa()),
            fill_threads: self.fills.threads(),
            upload_stall_seconds: self.stall_seconds,
            prefetch: self.prefetch,
            prefetch_width: self.prefetch_width,
            ..Default::default()
        };
        let slot = self.host.slot_bytes as u64;
        let share = |hit: u64, of: u64| (of > 0).then(|| hit as f64 / of as f64);
        for (l, c) in self.caches.iter().enumerate() {
            let st = c.as_ref().map(|c| c.stats()).unwrap_or_default();
            s.expert_hits += st.hits;
            s.expert_evictions += st.evictions;
            s.hits_per_layer.push(st.hits);
            s.evictions_per_layer.push(st.evictions);
            s.prefetch_issued += st.prefetch_issued;
            s.prefetch_used += st.prefetch_used;
            s.prefetch_wasted_bytes += st.prefetch_wasted * slot;
            s.prefetch_issued_per_layer.push(st.prefetch_issued);
            s.prefetch_used_per_layer.push(st.prefetch_used);
            s.prefetch_wasted_bytes_per_layer
                .push(st.prefetch_wasted * slot);
            let (p, g) = (self.predicted[l], self.guessed[l]);
            s.prefetch_accuracy_per_layer.push(share(p, g));
            let gate = &self.gates[l];
            // A layer never guessed for (the first MoE layer) has nothing to gate.
            if c.is_some() && self.prefetch.gated() && !gate.is_open() && gate.precision().is_some()
            {
                s.prefetch_gated_layers.push(l);
            }
            s.prefetch_held_back += gate.held_back;
            s.prefetch_break_even_per_layer
                .push((c.is_some() && self.prefetch.gated()).then(|| gate.threshold()));
        }
        s.prefetch_accuracy = share(self.predicted.iter().sum(), self.guessed.iter().sum());
        // Misses, per layer and in total: uploaded ones in caches without CPU experts
        // (counted at publication), and every expert that had no slot when routed beside
        // CPU experts (those the policy admitted were computed on the CPU that step too).
        s.uploaded_misses = self.admitted;
        for (l, c) in self.caches.iter().enumerate() {
            let mut m = self.cpu_misses[l];
            if let (Some(c), Some(ExpertPlacement::Cached)) = (c, self.placement.get(l)) {
                let st = c.stats();
                s.uploaded_misses += st.uploads;
                m += st.misses;
            }
            s.misses_per_layer.push(m);
        }
        s.expert_misses = s.misses_per_layer.iter().sum();
        s
    }

    /// Zero every counter (after warm-up).
    pub fn reset_stats(&mut self) {
        for c in self.caches.iter_mut().flatten() {
            c.reset_stats();
        }
        self.h2d_bytes = 0;
        self.upload_seconds = 0.0;
        self.cpu_pairs = 0;
        self.cpu_seconds = 0.0;
        self.cpu_misses.iter_mut().for_each(|m| *m = 0);
        self.admitted = 0;
        self.stall_seconds = 0.0;
        self.guessed.iter_mut().for_each(|x| *x = 0);
        self.predicted.iter_mut().for_each(|x| *x = 0);
        // The gates keep what they learned; only their counts restart.
        for g in &mut self.gates {
            g.held_back = 0;
            g.closings = 0;
        }
    }
}

//! Routing traces: which experts every token chose in every MoE layer, with the router's
//! weights and whether each expert was resident, as one JSONL line per (token, layer)
//! after a header line.
//!
//! The runtime reports each step's routing to a [`Tracer`] (`model::trace_hook` reads the
//! router's ids and weights back per layer); the tracer works out hits and evictions from
//! the cache's published tables before and after the step and hands complete records to
//! its sinks: the JSONL writer ([`JsonlSink`]), the live terminal grid. [`read_trace`]
//! reads a file back for `simulate` and `heatmap`, naming the line of any malformed record.

mod grid;
mod jsonl;
mod read;

pub use grid::{Grid, Observed};
pub use jsonl::JsonlSink;
pub use read::{read_trace, StepGroups, Trace};

use serde::{Deserialize, Serialize};

use crate::error::Result;

/// The format version written in every header. Version 2 added `loaded` and `cpu`; a
/// version 1 trace (no CPU experts then) is read as one whose misses were all uploaded.
/// Version 3 added the next-layer guess (`predicted`), what was prefetched
/// (`prefetched`, `prefetch_issued`) and the device's wait for copies (`stall_s`).
pub const TRACE_VERSION: u32 = 3;

/// The first line of a trace: what ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceHeader {
    pub wgmoe_trace: u32,
    pub model: String,
    pub model_type: String,
    pub num_layers: usize,
    /// The layers with routed experts.
    pub moe_layers: Vec<usize>,
    pub num_experts: usize,
    pub top_k: usize,
    /// INT4 bytes of one expert (what a miss uploads).
    pub expert_bytes: u64,
    pub resident_experts_per_layer: usize,
    /// None at full residency.
    pub cache_policy: Option<String>,
    pub decay: f64,
    pub prefill_chunk: usize,
    /// Where the run's misses went (`upload`, `cpu`, `auto`); None at full residency and
    /// in traces written before CPU experts existed.
    #[serde(default)]
    pub miss_policy: Option<String>,
    /// MoE layers whose routed experts all ran on the CPU (`--n-cpu-moe`,
    /// `--resident-experts 0`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_layers: Vec<usize>,
}

/// One (token, layer) record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceLine {
    /// The forward step (submission of one chunk or one decoded token) it belongs to.
    pub step: u64,
    /// Position of the token in its sequence.
    pub token: usize,
    pub phase: Phase,
    pub layer: usize,
    /// The router's top-k, in its order.
    pub experts: Vec<u32>,
    pub weights: Vec<f32>,
    /// Per expert: resident when the step's layer was served.
    pub hit: Vec<bool>,
    /// Experts the cache evicted serving this step's layer (on the step's first line of
    /// the layer only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evicted: Vec<u32>,
    /// Experts that came onto the GPU since the layer's previous step: uploaded misses
    /// and published admissions (on the step's first line of the layer only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loaded: Vec<u32>,
    /// Per expert: computed on the CPU (a miss the policy left there, or a layer whose
    /// experts all run on the CPU). Left out when none was.
    #[serde(default, skip_serializing_if = "none_true")]
    pub cpu: Vec<bool>,
    /// A warm-up response (bench): replayed, not counted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warmup: bool,
    /// The guess of this token's experts in this layer: this layer's router applied to
    /// the previous MoE layer's hidden state (one-token steps; what `--prefetch
    /// next-layer` copies ahead), best first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub predicted: Vec<u32>,
    /// Per expert: served from a copy a prefetch made ahead (left out when none was).
    #[serde(default, skip_serializing_if = "none_true")]
    pub prefetched: Vec<bool>,
    /// Experts copied ahead for this layer's step, used or not (on the step's first line
    /// of the layer only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefetch_issued: Vec<u32>,
    /// Seconds the device waited for this layer's copies in the step (first line only).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stall_s: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn none_true(v: &[bool]) -> bool {
    !v.contains(&true)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Prefill,
    Decode,
}

/// One layer of one step, complete.
#[derive(Clone, Debug)]
pub struct LayerRouting<'a> {
    pub step: u64,
    pub pos0: usize,
    pub phase: Phase,
    pub warmup: bool,
    pub layer: usize,
    pub top_k: usize,
    /// tokens x top_k.
    pub ids: &'a [u32],
    pub weights: &'a [f32],
    pub hit: &'a [bool],
    /// Per expert of `ids`: computed on the CPU.
    pub cpu: &'a [bool],
    pub evicted: &'a [u32],
    /// Experts resident now that were not after the layer's previous step.
    pub loaded: &'a [u32],
    /// The guess made for this layer at the previous MoE layer (one token), if any.
    pub predicted: &'a [u32],
    /// Per expert of `ids`: served from a prefetch copy.
    pub prefetched: &'a [bool],
    /// Experts copied ahead for this layer in the step, and the device's wait for copies.
    pub prefetch_issued: &'a [u32],
    pub stall_s: f64,
}

/// Where routing records go.
pub trait RoutingSink: Send {
    fn layer(&mut self, r: &LayerRouting<'_>) -> Result<()>;
    /// The step is complete (every layer reported).
    fn end_step(&mut self) -> Result<()> {
        Ok(())
    }
    fn finish(&mut self) -> Result<()> {
        Ok(())
    }
}

struct Pending {
    layer: usize,
    ids: Vec<u32>,
    weights: Vec<f32>,
    /// Per expert, resident before the step (None: every expert is).
    before: Option<Vec<bool>>,
    /// Misses are uploaded into the cache this step (false: computed on the CPU, and any
    /// admission is published at the layer's next step).
    uploads: bool,
    guess: Vec<u32>,
    /// Routed experts served from a prefetch copy.
    prefetched: Vec<u32>,
    issued: Vec<u32>,
    stall_s: f64,
}

/// Collects a step's routing layer by layer and reports it to the sinks when the step ends.
pub struct Tracer {
    sinks: Vec<Box<dyn RoutingSink>>,
    top_k: usize,
    step: u64,
    pos0: usize,
    phase: Phase,
    warmup: bool,
    pending: Vec<Pending>,
    /// Layers whose routed experts all run on the CPU (no device slots).
    host_layers: Vec<usize>,
    /// Per layer, what it held after its last step (the base of `loaded`).
    known: std::collections::BTreeMap<usize, Vec<bool>>,
}

impl Tracer {
    pub fn new(top_k: usize) -> Self {
        Tracer {
            sinks: Vec::new(),
            top_k,
            step: 0,
            pos0: 0,
            phase: Phase::Prefill,
            warmup: false,
            pending: Vec::new(),
            host_layers: Vec::new(),
            known: Default::default(),
        }
    }

    /// `layers` compute every routed expert on the CPU: none is ever resident there.
    pub fn set_host_layers(&mut self, layers: Vec<usize>) {
        self.host_layers = layers;
    }

    pub fn add(&mut self, sink: Box<dyn RoutingSink>) {
        self.sinks.push(sink);
    }

    /// Mark the steps from now on as warm-up (or not).
    pub fn set_warmup(&mut self, on: bool) {
        self.warmup = on;
    }

    pub fn begin_step(&mut self, pos0: usize, phase: Phase) {
        self.pos0 = pos0;
        self.phase = phase;
        self.pending.clear();
    }

    /// Layer `layer` routed its tokens to `ids` (tokens x top_k) with `weights`;
    /// `before`: which experts were resident before the step served it.
    pub fn layer(
        &mut self,
        layer: usize,
        ids: &[u32],
        weights: &[f32],
        before: Option<Vec<bool>>,
        uploads: bool,
    ) {
        let (before, uploads) = if self.host_layers.contains(&layer) {
            let e = ids.iter().max().map_or(0, |&m| m as usize + 1);
            (Some(vec![false; e]), false)
        } else {
            (before, uploads)
        };
        self.pending.push(Pending {
            layer,
            ids: ids.to_vec(),
            weights: weights.to_vec(),
            before,
            uploads,
            guess: Vec::new(),
            prefetched: Vec::new(),
            issued: Vec::new(),
            stall_s: 0.0,
        });
    }

    /// The guess made for `layer`'s routing just reported, and its experts served from a
    /// prefetch copy.
    pub fn prefetch(&mut self, layer: usize, guess: Option<&[u32]>, prefetched: &[u32]) {
        if let Some(p) = self.pending.iter_mut().rev().find(|p| p.layer == layer) {
            p.guess = guess.map(<[u32]>::to_vec).unwrap_or_default();
            p.prefetched = prefetched.to_vec();
        }
    }

    /// What the step copied ahead for `layer`, and the device's wait for its copies.
    pub fn layer_copies(&mut self, layer: usize, issued: Vec<u32>, stall_s: f64) {
        if let Some(p) = self.pending.iter_mut().rev().find(|p| p.layer == layer) {
            p.issued = issued;
            p.stall_s = stall_s;
        }
    }

    /// The step is done; `after(layer)` says which experts each layer holds now.
    pub fn end_step(&mut self, after: impl Fn(usize) -> Option<Vec<bool>>) -> Result<()> {
        let pending = std::mem::take(&mut self.pending);
        for p in &pending {
            let resident = |set: &Option<Vec<bool>>, e: u32| {
                set.as_ref()
                    .is_none_or(|s| s.get(e as usize).copied().unwrap_or(false))
            };
            let hit: Vec<bool> = p.ids.iter().map(|&e| resident(&p.before, e)).collect();
            let prefetched: Vec<bool> = p.ids.iter().map(|e| p.prefetched.contains(e)).collect();
            // A miss of a layer that does not upload in the step ran on the CPU (unless a
            // prefetch had copied it).
            let cpu: Vec<bool> = hit
                .iter()
                .zip(&prefetched)
                .map(|(&h, &f)| !h && !f && !p.uploads)
                .collect();
            // Evicted: resident before, uploaded now or held after the last step, and gone
            // after. Loaded: held after and not after the last step.
            let now = after(p.layer);
            let mut evicted: Vec<u32> = Vec::new();
            let mut loaded: Vec<u32> = Vec::new();
            if let Some(now) = &now {
                let held = |set: &Option<Vec<bool>>, e: usize| {
                    set.as_ref()
                        .is_some_and(|b| b.get(e).copied().unwrap_or(false))
                };
                // Before the layer's first step nothing was known to be loaded (a cache
                // starts empty), so `loaded` then lists all it holds.
                let base = self.known.get(&p.layer).cloned();
                let was = |e: usize| {
                    held(&p.before, e)
                        || held(&base, e)
                        || ((p.uploads || p.prefetched.contains(&(e as u32)))
                            && p.ids.contains(&(e as u32)))
                };
                for (e, &r) in now.iter().enumerate() {
                    if !r && was(e) {
                        evicted.push(e as u32);
                    }
                    if r && !held(&base, e) {
                        loaded.push(e as u32);
                    }
                }
                self.known.insert(p.layer, now.clone());
            }
            let rec = LayerRouting {
                step: self.step,
                pos0: self.pos0,
                phase: self.phase,
                warmup: self.warmup,
                layer: p.layer,
                top_k: self.top_k,
                ids: &p.ids,
                weights: &p.weights,
                hit: &hit,
                cpu: &cpu,
                evicted: &evicted,
                loaded: &loaded,
                predicted: &p.guess,
                prefetched: &prefetched,
                prefetch_issued: &p.issued,
                stall_s: p.stall_s,
            };
            for s in &mut self.sinks {
                s.layer(&rec)?;
            }
        }
        for s in &mut self.sinks {
            s.end_step()?;
        }
        self.step += 1;
        Ok(())
    }

    /// Flush every sink (the JSONL file is complete after this).
    pub fn finish(&mut self) -> Result<()> {
        for s in &mut self.sinks {
            s.finish()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// (layer, hit, evicted, step) of each record.
    type Seen = Vec<(usize, Vec<bool>, Vec<u32>, u64)>;
    struct Collect(Arc<Mutex<Seen>>);
    impl RoutingSink for Collect {
        fn layer(&mut self, r: &LayerRouting<'_>) -> Result<()> {
            self.0
                .lock()
                .unwrap()
                .push((r.layer, r.hit.to_vec(), r.evicted.to_vec(), r.step));
            Ok(())
        }
    }

    #[test]
    fn hits_come_from_before_and_evictions_from_before_and_after() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let mut t = Tracer::new(2);
        t.add(Box::new(Collect(got.clone())));
        t.begin_step(0, Phase::Prefill);
        // Layer 0: 4 experts, {0, 1} resident; tokens want [0, 2] and [3, 2]; afterwards
        // {2, 3} resident: 0 and 1 evicted (0 was used, 1 was not).
        t.layer(
            0,
            &[0, 2, 3, 2],
            &[0.5; 4],
            Some(vec![true, true, false, false]),
            true,
        );
        // Layer 1: every expert resident.
        t.layer(1, &[1, 0, 1, 3], &[0.5; 4], None, true);
        // Layer 2: CPU misses: {0, 1} resident, 2 and 3 computed on the CPU (never loaded),
        // 1 evicted by an admission.
        t.layer(
            2,
            &[0, 2, 3, 2],
            &[0.5; 4],
            Some(vec![true, true, false, false]),
            false,
        );
        t.end_step(|l| match l {
            0 => Some(vec![false, false, true, true]),
            2 => Some(vec![true, false, false, false]),
            _ => None,
        })
        .unwrap();
        let got = got.lock().unwrap();
        assert_eq!(got[0], (0, vec![true, false, false, false], vec![0, 1], 0));
        assert_eq!(got[1], (1, vec![true; 4], vec![], 0));
        assert_eq!(got[2], (2, vec![true, false, false, false], vec![1], 0));
    }
}

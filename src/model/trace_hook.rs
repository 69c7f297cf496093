//! The forward pass's side of routing traces: the routing read back (ids and the router's
//! weights) and what each layer's cache held before and after a step, handed to the `Tracer`.
//! `model::step` calls these at four points; with no tracer they do nothing.

use crate::error::Result;
use crate::format::trace::Phase;
use crate::model::forward::Forward;

impl Forward {
    /// Whether a step must read its routing back for the tracer.
    pub(crate) fn tracing(&self) -> bool {
        self.trace.is_some()
    }

    /// A step of `n` tokens from `pos0` starts; `prefill`: its ids come from the prompt.
    pub(crate) fn trace_begin(&mut self, pos0: usize, prefill: bool) {
        if let Some(t) = self.trace.as_mut() {
            t.begin_step(
                pos0,
                if prefill {
                    Phase::Prefill
                } else {
                    Phase::Decode
                },
            );
        }
    }

    /// Per expert, whether layer `l`'s cache holds it now (None: every expert resident).
    fn resident_flags(&self, l: usize) -> Option<Vec<bool>> {
        let cache = self.residency.as_ref()?.caches.get(l)?.as_ref()?;
        Some(
            (0..self.cfg.num_experts as u32)
                .map(|e| cache.table().slot_of(e).is_some())
                .collect(),
        )
    }

    /// Layer `l` routed its tokens to `ids` with `weights` (both read back, `top_k` per
    /// token), before the cache serves them; `guess`: what the previous MoE layer
    /// predicted for it; `prefetched`: the routed experts a prefetch copied ahead.
    pub(crate) fn trace_layer(
        &mut self,
        l: usize,
        ids: &[u32],
        weights: &[f32],
        guess: Option<&[u32]>,
        prefetched: &[u32],
    ) {
        let before = self.resident_flags(l);
        // Only a cached layer uploads its misses in the step; a CPU-experts layer computes
        // them and publishes any admission at its next step.
        let uploads = self
            .residency
            .as_ref()
            .is_none_or(|r| r.placement(l) == crate::model::residency::ExpertPlacement::Cached);
        if let Some(t) = self.trace.as_mut() {
            t.layer(l, ids, weights, before, uploads);
            t.prefetch(l, guess, prefetched);
        }
    }

    /// Every layer of the step was served: report it.
    pub(crate) fn trace_end_step(&mut self) -> Result<()> {
        let Some(mut t) = self.trace.take() else {
            return Ok(());
        };
        if let Some(r) = self.residency.as_mut() {
            // The waits of the step's last layers are known once the device finishes them.
            if let Err(e) = r.resolve_stalls() {
                self.trace = Some(t);
                return Err(e);
            }
            for l in 0..self.cfg.num_layers {
                let (issued, stall) = r.step_copies(l);
                t.layer_copies(l, issued, stall);
            }
        }
        let r = t.end_step(|l| self.resident_flags(l));
        self.trace = Some(t);
        r
    }
}

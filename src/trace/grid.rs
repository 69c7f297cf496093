//! The layer x expert grid of a trace: activation counts, the resident set and evictions,
//! built record by record (the heat map draws it; `run --live` draws it as it grows).

use super::{LayerRouting, Trace};

#[derive(Clone, Debug, PartialEq)]
pub struct Grid {
    /// The MoE layers (model indices): the grid's rows.
    pub layers: Vec<usize>,
    pub num_experts: usize,
    /// `counts[row][expert]`: tokens routed to it (warm-up excluded).
    pub counts: Vec<Vec<u64>>,
    /// Resident now (every expert when nothing is cached).
    pub resident: Vec<Vec<bool>>,
    pub evictions: Vec<Vec<u64>>,
    /// Counted tokens per row.
    pub tokens: Vec<u64>,
}

impl Grid {
    /// An empty grid; `partial`: the cache starts empty (else every expert is resident).
    pub fn new(layers: Vec<usize>, num_experts: usize, partial: bool) -> Self {
        let n = layers.len();
        Grid {
            layers,
            num_experts,
            counts: vec![vec![0; num_experts]; n],
            resident: vec![vec![!partial; num_experts]; n],
            evictions: vec![vec![0; num_experts]; n],
            tokens: vec![0; n],
        }
    }

    /// Add one layer of one step: `ids`/`hit` are tokens x top_k; misses become resident,
    /// `evicted` experts leave.
    pub fn observe(
        &mut self,
        layer: usize,
        ids: &[u32],
        hit: &[bool],
        evicted: &[u32],
        top_k: usize,
        counted: bool,
    ) {
        let Some(row) = self.layers.iter().position(|&l| l == layer) else {
            return;
        };
        let e = self.num_experts;
        for (&x, &h) in ids.iter().zip(hit) {
            let x = x as usize;
            if x >= e {
                continue;
            }
            if counted {
                self.counts[row][x] += 1;
            }
            if !h {
                self.resident[row][x] = true;
            }
        }
        for &x in evicted {
            if let Some(r) = self.resident[row].get_mut(x as usize) {
                *r = false;
            }
            if counted {
                if let Some(c) = self.evictions[row].get_mut(x as usize) {
                    *c += 1;
                }
            }
        }
        if counted {
            self.tokens[row] += (ids.len() / top_k.max(1)) as u64;
        }
    }

    /// One record of a live run.
    pub fn observe_routing(&mut self, r: &LayerRouting<'_>) {
        self.observe(r.layer, r.ids, r.hit, r.evicted, r.top_k, !r.warmup);
    }

    /// The grid of a whole trace file.
    pub fn of_trace(t: &Trace) -> Self {
        let h = &t.header;
        let mut g = Grid::new(
            h.moe_layers.clone(),
            h.num_experts,
            h.resident_experts_per_layer < h.num_experts,
        );
        for r in &t.lines {
            g.observe(r.layer, &r.experts, &r.hit, &r.evicted, h.top_k, !r.warmup);
        }
        g
    }

    pub fn max_count(&self) -> u64 {
        self.counts.iter().flatten().copied().max().unwrap_or(0)
    }

    pub fn max_evictions(&self) -> u64 {
        self.evictions.iter().flatten().copied().max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_residency_and_evictions_follow_the_records() {
        let mut g = Grid::new(vec![0, 2], 4, true);
        // Layer 0, two tokens of top-2: [0, 1] [1, 3], all misses.
        g.observe(0, &[0, 1, 1, 3], &[false; 4], &[], 2, true);
        // Next step: [2, 1]; 1 hits, 2 misses and 0 is evicted.
        g.observe(0, &[2, 1], &[false, true], &[0], 2, true);
        // A warm-up record moves residency, not counts.
        g.observe(2, &[3, 0], &[false, false], &[], 2, false);
        g.observe(5, &[3, 0], &[false, false], &[], 2, true);
        assert_eq!(g.counts[0], vec![1, 3, 1, 1]);
        assert_eq!(g.resident[0], vec![false, true, true, true]);
        assert_eq!(g.evictions[0], vec![1, 0, 0, 0]);
        assert_eq!(g.tokens, vec![3, 0]);
        assert_eq!(g.counts[1], vec![0; 4]);
        assert_eq!(g.resident[1], vec![true, false, false, true]);
        assert_eq!((g.max_count(), g.max_evictions()), (3, 1));
        assert!(Grid::new(vec![0], 3, false).resident[0].iter().all(|&r| r));
    }
}

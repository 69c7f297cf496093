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
    /// On the GPU now (every expert when nothing is cached).
    pub resident: Vec<Vec<bool>>,
    pub evictions: Vec<Vec<u64>>,
    /// `cpu[row][expert]`: tokens whose expert was computed on the CPU (warm-up excluded).
    pub cpu: Vec<Vec<u64>>,
    /// Counted tokens per row.
    pub tokens: Vec<u64>,
    /// Records without `loaded` (trace format 1, before CPU experts): every miss was
    /// uploaded, so a miss becomes resident.
    pub misses_load: bool,
}

/// One layer of one step as the grid takes it.
pub struct Observed<'a> {
    pub layer: usize,
    /// tokens x top_k.
    pub ids: &'a [u32],
    pub hit: &'a [bool],
    /// Per id: computed on the CPU (may be empty: none).
    pub cpu: &'a [bool],
    pub evicted: &'a [u32],
    pub loaded: &'a [u32],
    pub top_k: usize,
    pub counted: bool,
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
            cpu: vec![vec![0; num_experts]; n],
            tokens: vec![0; n],
            misses_load: false,
        }
    }

    /// `layers` keep no expert on the GPU (all computed on the CPU).
    pub fn set_host_layers(&mut self, layers: &[usize]) {
        for (row, l) in self.layers.iter().enumerate() {
            if layers.contains(l) {
                self.resident[row].iter_mut().for_each(|r| *r = false);
            }
        }
    }

    /// Add one layer of one step: hits were on the GPU, `loaded` experts arrive,
    /// `evicted` ones leave.
    pub fn observe(&mut self, o: &Observed<'_>) {
        let Some(row) = self.layers.iter().position(|&l| l == o.layer) else {
            return;
        };
        let (e, counted) = (self.num_experts, o.counted);
        for (i, (&x, &h)) in o.ids.iter().zip(o.hit).enumerate() {
            let x = x as usize;
            if x >= e {
                continue;
            }
            let on_cpu = o.cpu.get(i).copied().unwrap_or(false);
            if counted {
                self.counts[row][x] += 1;
                if on_cpu {
                    self.cpu[row][x] += 1;
                }
            }
            if h || (self.misses_load && !on_cpu) {
                self.resident[row][x] = true;
            }
        }
        for &x in o.loaded {
            if let Some(r) = self.resident[row].get_mut(x as usize) {
                *r = true;
            }
        }
        let evicted = o.evicted;
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
            self.tokens[row] += (o.ids.len() / o.top_k.max(1)) as u64;
        }
    }

    /// One record of a live run.
    pub fn observe_routing(&mut self, r: &LayerRouting<'_>) {
        self.observe(&Observed {
            layer: r.layer,
            ids: r.ids,
            hit: r.hit,
            cpu: r.cpu,
            evicted: r.evicted,
            loaded: r.loaded,
            top_k: r.top_k,
            counted: !r.warmup,
        });
    }

    /// The grid of a whole trace file.
    pub fn of_trace(t: &Trace) -> Self {
        let h = &t.header;
        let mut g = Grid::new(
            h.moe_layers.clone(),
            h.num_experts,
            h.resident_experts_per_layer < h.num_experts,
        );
        g.set_host_layers(&h.cpu_layers);
        g.misses_load = h.wgmoe_trace < 2;
        for r in &t.lines {
            g.observe(&Observed {
                layer: r.layer,
                ids: &r.experts,
                hit: &r.hit,
                cpu: &r.cpu,
                evicted: &r.evicted,
                loaded: &r.loaded,
                top_k: h.top_k,
                counted: !r.warmup,
            });
        }
        g
    }

    /// Experts on the GPU now, over all rows.
    pub fn resident_count(&self) -> usize {
        self.resident.iter().flatten().filter(|&&r| r).count()
    }

    pub fn max_cpu(&self) -> u64 {
        self.cpu.iter().flatten().copied().max().unwrap_or(0)
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
        let obs = |layer, ids, hit, cpu, evicted, loaded, counted| Observed {
            layer,
            ids,
            hit,
            cpu,
            evicted,
            loaded,
            top_k: 2,
            counted,
        };
        // Layer 0, two tokens of top-2: [0, 1] [1, 3], all misses, uploaded.
        g.observe(&obs(
            0,
            &[0, 1, 1, 3],
            &[false; 4],
            &[],
            &[],
            &[0, 1, 3],
            true,
        ));
        // Next step: [2, 1]; 1 hits, 2 is uploaded and 0 is evicted.
        g.observe(&obs(0, &[2, 1], &[false, true], &[], &[0], &[2], true));
        // A warm-up record moves residency, not counts.
        g.observe(&obs(2, &[3, 0], &[false, false], &[], &[], &[3, 0], false));
        g.observe(&obs(5, &[3, 0], &[false, false], &[], &[], &[], true));
        assert_eq!(g.counts[0], vec![1, 3, 1, 1]);
        assert_eq!(g.resident[0], vec![false, true, true, true]);
        assert_eq!(g.evictions[0], vec![1, 0, 0, 0]);
        assert_eq!(g.tokens, vec![3, 0]);
        assert_eq!(g.counts[1], vec![0; 4]);
        assert_eq!(g.resident[1], vec![true, false, false, true]);
        assert_eq!((g.max_count(), g.max_evictions()), (3, 1));
        assert!(Grid::new(vec![0], 3, false).resident[0].iter().all(|&r| r));
        // Misses computed on the CPU stay off the GPU and are counted as CPU work.
        let mut c = Grid::new(vec![0], 4, true);
        c.observe(&obs(
            0,
            &[0, 1],
            &[false, false],
            &[true, true],
            &[],
            &[],
            true,
        ));
        assert_eq!(c.resident_count(), 0);
        assert_eq!(c.cpu[0], vec![1, 1, 0, 0]);
        // A format-1 trace: a miss was an upload.
        let mut old = Grid::new(vec![0], 4, true);
        old.misses_load = true;
        old.observe(&obs(0, &[0, 1], &[false, false], &[], &[], &[], true));
        assert_eq!(old.resident[0], vec![true, true, false, false]);
    }
}

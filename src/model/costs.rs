//! The cost model's figures (`--miss-policy auto`), measured at start-up on this machine:
//! the host-to-device copy of one expert slot, the CPU expert kernel on one expert, and
//! the device's expert kernels on one expert. Each is the median of a few repetitions of
//! exactly what the runtime does per miss; nothing is assumed.

use std::time::Instant;

use crate::backend::cpu::ExpertPair;
use crate::backend::Work;
use crate::error::{Error, Result};
use crate::model::forward::Forward;
use crate::model::residency::ExpertPlacement;
use crate::model::tensors::ExpertStore;
use crate::model::weights::Mlp;
use crate::residency::{CostFigures, NO_SLOT};

/// Repetitions per figure (the median is kept).
const REPS: usize = 5;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

impl Forward {
    /// Measure the figures on the first layer with a cache beside CPU experts. Must run
    /// before the first step (the layer's cache is empty: its slot table is rewritten
    /// here and restored).
    pub fn measure_miss_costs(&mut self) -> Result<CostFigures> {
        let dev = self.dev.clone();
        let k = self.cfg.top_k;
        let h = self.cfg.hidden_size;
        let Some(r) = self.residency.as_mut() else {
            return Err(Error::Other(
                "internal: no residency runtime to measure".into(),
            ));
        };
        let Some(l) = (0..self.layers.len()).find(|&l| r.placement(l) == ExpertPlacement::Hybrid)
        else {
            return Err(Error::Other(
                "internal: no layer with a cache beside CPU experts".into(),
            ));
        };
        let Mlp::Moe {
            experts: ExpertStore::Int4(pool),
            slot_of,
            ..
        } = &self.weights.layers[l].mlp
        else {
            return Err(Error::Other(format!(
                "internal: layer {l} has no INT4 expert pool"
            )));
        };
        let slot_bytes = r.host.slot_bytes as u64;

        // Host to device: staging fill and copy of expert 0 into slot 0, as an upload.
        let mut h2d = Vec::with_capacity(REPS);
        for _ in 0..REPS {
            h2d.push(r.time_upload(&dev, l, 0, pool, 0)?);
        }

        // The CPU kernel on one (token, expert) pair, a different expert each time (as a
        // miss is: its bytes come from memory, not from the cache of the last repetition).
        let x = vec![0.01f32; h];
        let mut out = vec![0.0f32; h];
        let mut cpu = Vec::with_capacity(REPS);
        for rep in 0..REPS {
            let pair = [ExpertPair {
                token: 0,
                expert: (rep % self.cfg.num_experts.max(1)) as u32,
                weight: 1.0,
            }];
            let t0 = Instant::now();
            r.compute_on_cpu(l, &x, &pair, &mut out)?;
            cpu.push(t0.elapsed().as_secs_f64());
        }
        r.reset_stats();

        // The device's routed experts for one token whose k choices are all expert 0 (in
        // slot 0): k expert reads per step.
        let mut table = vec![NO_SLOT; self.cfg.num_experts];
        table[0] = 0;
        dev.write(slot_of, 0, bytemuck::cast_slice(&table))?;
        dev.write(&self.topk_ids, 0, bytemuck::cast_slice(&vec![0u32; k]))?;
        dev.write(
            &self.topk_weights,
            0,
            bytemuck::cast_slice(&vec![0.0f32; k]),
        )?;
        dev.write_step(&self.step, 0, 1)?;
        let Some(routed) = self.layers[l].routed_for(1) else {
            return Err(Error::Other(format!(
                "internal: layer {l} has no routed program"
            )));
        };
        let mut gpu = Vec::with_capacity(REPS);
        for i in 0..=REPS {
            let t0 = Instant::now();
            let s = dev.submit(&[Work::Run {
                program: routed,
                tokens: 1,
                pos0: crate::backend::LONGEST,
            }])?;
            dev.wait(s.token)?;
            // The first run pays one-time costs (pipeline compilation on llvmpipe).
            if i > 0 {
                gpu.push(t0.elapsed().as_secs_f64());
            }
        }
        // Back to the empty table the cache holds.
        let words: Vec<u32> = match r.caches.get(l).and_then(|c| c.as_ref()) {
            Some(c) => c.table().words().to_vec(),
            None => vec![NO_SLOT; self.cfg.num_experts],
        };
        dev.write(slot_of, 0, bytemuck::cast_slice(&words))?;
        dev.sync()?;
        let s = slot_bytes as f64;
        Ok(CostFigures {
            h2d_bytes_per_s: s / median(h2d),
            cpu_bytes_per_s: s / median(cpu),
            gpu_bytes_per_s: k as f64 * s / median(gpu),
            slot_bytes,
        })
    }
}

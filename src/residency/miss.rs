//! Where a routed expert that has no device slot runs: uploaded into the cache (the
//! classic path), computed on the CPU from the host source, or chosen per miss by a cost
//! model. Device-independent arithmetic: the runtime measures the figures at start-up and
//! asks [`choose_uploads`] per routed layer and step.
//!
//! The cost model (seconds for the work one missed expert brings):
//! - upload: `slot / h2d + uses · slot / gpu` (copy it, then every use reads it on the
//!   device);
//! - CPU: `uses · slot / cpu` (every use reads it from host memory);
//!
//! where `uses` = the step's pairs routed to it plus the uses expected while it would stay
//! resident ([`Reuse`]). Uploading pays iff `1 / h2d < uses · (1 / cpu - 1 / gpu)`: never
//! when the CPU computes an expert at least as fast as the device (a software adapter), and
//! on a GPU once the expected reuse covers the copy.

/// `--miss-policy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MissPolicy {
    /// Every miss is uploaded into the cache (needs top_k resident experts per layer).
    #[default]
    Upload,
    /// Misses are computed on the CPU; experts are admitted into the cache only in
    /// multi-token steps (prefill): each layer's most-used missing experts of the chunk,
    /// at most the spare slots per step.
    Cpu,
    /// Per miss, the cost model picks upload or CPU from figures measured at start-up.
    Auto,
}

impl MissPolicy {
    pub fn name(self) -> &'static str {
        match self {
            MissPolicy::Upload => "upload",
            MissPolicy::Cpu => "cpu",
            MissPolicy::Auto => "auto",
        }
    }
}

/// Throughputs measured on the machine, in bytes of one expert slot per second.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct CostFigures {
    /// Host to device copy of a slot.
    pub h2d_bytes_per_s: f64,
    /// The CPU expert kernel, one token per expert.
    pub cpu_bytes_per_s: f64,
    /// The device's expert kernels, one token per expert.
    pub gpu_bytes_per_s: f64,
    pub slot_bytes: u64,
}

impl CostFigures {
    /// Seconds of the upload choice and of the CPU choice for an expert used `uses` times.
    pub fn seconds(&self, uses: f64) -> (f64, f64) {
        let s = self.slot_bytes as f64;
        let upload = s / self.h2d_bytes_per_s + uses * s / self.gpu_bytes_per_s;
        let cpu = uses * s / self.cpu_bytes_per_s;
        (upload, cpu)
    }

    /// Whether uploading an expert used `uses` times costs less than computing it on the
    /// CPU each time.
    pub fn upload_pays(&self, uses: f64) -> bool {
        let (up, cpu) = self.seconds(uses);
        up.is_finite() && up < cpu
    }
}

/// Per layer, an estimate of how often each expert will be used: an exponential moving
/// average of its pairs per step, and of the layer's uploads per step (how fast the cache
/// turns over). An expert expected to stay resident `capacity / uploads-per-step` steps
/// is expected to be used `rate · that` times more.
#[derive(Clone, Debug)]
pub struct Reuse {
    rate: Vec<Vec<f32>>,
    uploads: Vec<f32>,
}

/// Weight of the newest step in the averages (a memory of about 16 steps).
const REUSE_DECAY: f32 = 1.0 / 16.0;
/// The longest a resident expert is assumed to stay, in steps (a cache that never turns
/// over would otherwise promise unbounded reuse).
const MAX_LIFETIME_STEPS: f32 = 256.0;

impl Reuse {
    pub fn new(layers: usize, experts: usize) -> Self {
        Reuse {
            rate: vec![vec![0.0; experts]; layers],
            uploads: vec![0.0; layers],
        }
    }

    /// One step of `layer`: `pairs[e]` pairs routed to expert e (absent: 0), `uploads`
    /// experts uploaded.
    pub fn observe(&mut self, layer: usize, pairs: &[(u32, usize)], uploads: usize) {
        let (Some(rate), Some(up)) = (self.rate.get_mut(layer), self.uploads.get_mut(layer)) else {
            return;
        };
        for r in rate.iter_mut() {
            *r *= 1.0 - REUSE_DECAY;
        }
        for &(e, n) in pairs {
            if let Some(r) = rate.get_mut(e as usize) {
                *r += REUSE_DECAY * n as f32;
            }
        }
        *up = *up * (1.0 - REUSE_DECAY) + REUSE_DECAY * uploads as f32;
    }

    /// Uses of `expert` expected while it would stay in a cache of `capacity` slots.
    pub fn expected(&self, layer: usize, expert: u32, capacity: usize) -> f64 {
        let rate = self
            .rate
            .get(layer)
            .and_then(|r| r.get(expert as usize))
            .copied()
            .unwrap_or(0.0);
        let turnover = self.uploads.get(layer).copied().unwrap_or(0.0);
        let lifetime = (capacity as f32 / turnover.max(1e-3)).min(MAX_LIFETIME_STEPS);
        f64::from(rate * lifetime)
    }
}

/// One routed layer's step: which missing experts to upload. `misses` are (expert, pairs
/// this step), `room` the most uploads this step can take (spare slots, and capacity left
/// after the hits). `tokens` is the step's token count. Returns the experts to upload, the
/// most used first; every other miss runs on the CPU.
pub fn choose_uploads(
    policy: MissPolicy,
    misses: &[(u32, usize)],
    room: usize,
    tokens: usize,
    expected_reuse: impl Fn(u32) -> f64,
    figures: Option<&CostFigures>,
) -> Vec<u32> {
    let mut order: Vec<(u32, usize)> = misses.to_vec();
    // Most pairs first, then the lower id: deterministic.
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let take = |it: Vec<(u32, usize)>| it.into_iter().take(room).map(|(e, _)| e).collect();
    match policy {
        MissPolicy::Upload => take(order),
        MissPolicy::Cpu if tokens > 1 => take(order),
        MissPolicy::Cpu => Vec::new(),
        MissPolicy::Auto => match figures {
            Some(f) => take(
                order
                    .into_iter()
                    .filter(|&(e, n)| f.upload_pays(n as f64 + expected_reuse(e)))
                    .collect(),
            ),
            // Nothing measured: the CPU (no device copy is ever worse than a wrong guess).
            None => Vec::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU-like machine: PCIe 4.0 x16 (~25 GB/s), the device's experts at 2 TB/s, the
    /// CPU at 40 GB/s; a 2.4 MB slot (Qwen3-30B-A3B).
    fn gpu_machine() -> CostFigures {
        CostFigures {
            h2d_bytes_per_s: 25e9,
            cpu_bytes_per_s: 40e9,
            gpu_bytes_per_s: 2e12,
            slot_bytes: 2_396_160,
        }
    }

    #[test]
    fn costs_by_hand() {
        let f = gpu_machine();
        let (up, cpu) = f.seconds(1.0);
        // 2.39616e6 / 25e9 = 95.8 us, plus 1.2 us on the device; 59.9 us on the CPU.
        assert!((up - (95.8464e-6 + 1.19808e-6)).abs() < 1e-9, "{up}");
        assert!((cpu - 59.904e-6).abs() < 1e-9, "{cpu}");
        // One use: the CPU wins; two uses: upload 98.2 us vs CPU 119.8 us.
        assert!(!f.upload_pays(1.0));
        assert!(f.upload_pays(2.0));
        // Break-even at 1/h2d = uses (1/cpu - 1/gpu): uses = 40/25 / (1 - 0.02) = 1.6327.
        assert!(!f.upload_pays(1.63) && f.upload_pays(1.64));
    }

    #[test]
    fn a_device_no_faster_than_the_cpu_never_uploads() {
        // lavapipe: the "device" is the same CPU, slower than the native kernel.
        let f = CostFigures {
            h2d_bytes_per_s: 10e9,
            cpu_bytes_per_s: 10e9,
            gpu_bytes_per_s: 3e9,
            slot_bytes: 1_000_000,
        };
        for uses in [1.0, 10.0, 1e6] {
            assert!(!f.upload_pays(uses));
        }
        let misses = [(3, 5), (1, 1)];
        assert!(choose_uploads(MissPolicy::Auto, &misses, 8, 1, |_| 1e6, Some(&f)).is_empty());
    }

    #[test]
    fn choices_per_policy() {
        let f = gpu_machine();
        let misses = [(7, 1), (2, 3), (5, 3), (9, 1)];
        // Upload: every miss, the most used first, as room allows.
        assert_eq!(
            choose_uploads(MissPolicy::Upload, &misses, 3, 1, |_| 0.0, None),
            vec![2, 5, 7]
        );
        // Cpu: nothing in a one-token step; in a prefill chunk, the most used.
        assert!(choose_uploads(MissPolicy::Cpu, &misses, 3, 1, |_| 0.0, None).is_empty());
        assert_eq!(
            choose_uploads(MissPolicy::Cpu, &misses, 2, 16, |_| 0.0, None),
            vec![2, 5]
        );
        // Auto: 3 pairs pay for the copy, 1 pair alone does not; expected reuse can.
        assert_eq!(
            choose_uploads(MissPolicy::Auto, &misses, 8, 4, |_| 0.0, Some(&f)),
            vec![2, 5]
        );
        assert_eq!(
            choose_uploads(
                MissPolicy::Auto,
                &misses,
                8,
                4,
                |e| if e == 9 { 1.0 } else { 0.0 },
                Some(&f)
            ),
            vec![2, 5, 9]
        );
        assert_eq!(
            choose_uploads(MissPolicy::Auto, &misses, 1, 4, |_| 0.0, Some(&f)),
            vec![2]
        );
        // Nothing measured: no upload.
        assert!(choose_uploads(MissPolicy::Auto, &misses, 8, 4, |_| 9.0, None).is_empty());
    }

    #[test]
    fn reuse_follows_recent_use_and_turnover() {
        let mut r = Reuse::new(2, 4);
        for _ in 0..64 {
            r.observe(0, &[(1, 1)], 1);
        }
        // Expert 1 used once per step, one upload per step: a 4-slot cache keeps an
        // expert about 4 steps, so about 4 more uses.
        let e1 = r.expected(0, 1, 4);
        assert!((e1 - 4.0).abs() < 0.1, "{e1}");
        assert!(r.expected(0, 2, 4) < 1e-6);
        // No turnover: bounded by MAX_LIFETIME_STEPS.
        for _ in 0..400 {
            r.observe(1, &[(3, 2)], 0);
        }
        let e3 = r.expected(1, 3, 4);
        assert!(
            e3 > 400.0 && e3 <= 2.0 * MAX_LIFETIME_STEPS as f64 + 1e-3,
            "{e3}"
        );
        // Out of range: nothing, no panic.
        r.observe(9, &[(1, 1)], 0);
        assert_eq!(r.expected(9, 99, 4), 0.0);
    }
}

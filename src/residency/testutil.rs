//! Seeded randomness and synthetic routing traces for the residency tests.

/// SplitMix64: small, seeded, good enough for test traces.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `steps` groups of `k` distinct experts out of `num_experts`, drawn with Zipf-like weights
/// `1 / rank^s` (ranks assigned to experts by a seeded shuffle; `s = 0` is uniform).
pub fn zipf_trace(
    rng: &mut Rng,
    steps: usize,
    num_experts: usize,
    k: usize,
    s: f64,
) -> Vec<Vec<u32>> {
    let mut ids: Vec<u32> = (0..num_experts as u32).collect();
    for i in (1..ids.len()).rev() {
        let j = rng.below(i + 1);
        ids.swap(i, j);
    }
    let weights: Vec<f64> = (0..num_experts)
        .map(|r| 1.0 / ((r + 1) as f64).powf(s))
        .collect();
    let total: f64 = weights.iter().sum();
    (0..steps)
        .map(|_| {
            let mut group = Vec::with_capacity(k);
            while group.len() < k {
                let mut x = rng.unit() * total;
                let mut r = 0;
                while r + 1 < num_experts && x >= weights[r] {
                    x -= weights[r];
                    r += 1;
                }
                if !group.contains(&ids[r]) {
                    group.push(ids[r]);
                }
            }
            group
        })
        .collect()
}

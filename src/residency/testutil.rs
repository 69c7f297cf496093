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

/// The fewest misses any schedule achieves, by dynamic programming over resident sets: a
/// step served in one plan keeps its set (evicting just enough others); one served in
/// batches may keep any `capacity` of the resident and wanted experts.
pub fn brute_force_min_misses(steps: &[Vec<u32>], capacity: usize, spares: usize) -> u64 {
    use std::collections::BTreeMap;
    let mut states: BTreeMap<u64, u64> = BTreeMap::from([(0u64, 0u64)]);
    for step in steps {
        let g = super::replay::distinct(step);
        let gmask: u64 = g.iter().fold(0, |m, &e| m | 1 << e);
        let mut next: BTreeMap<u64, u64> = BTreeMap::new();
        for (&set, &cost) in &states {
            let missing = (gmask & !set).count_ones() as usize;
            let c = cost + missing as u64;
            let mut keep = |s: u64| {
                let e = next.entry(s).or_insert(u64::MAX);
                *e = (*e).min(c);
            };
            let union = set | gmask;
            if g.len() <= capacity && missing <= spares.min(capacity) {
                let need = (union.count_ones() as usize).saturating_sub(capacity);
                let evictable: Vec<u64> = (0..64).filter(|&e| set & !gmask & 1 << e != 0).collect();
                for sub in 0u64..1 << evictable.len() {
                    if sub.count_ones() as usize == need {
                        let mut s = union;
                        for (i, &e) in evictable.iter().enumerate() {
                            if sub & 1 << i != 0 {
                                s &= !(1 << e);
                            }
                        }
                        keep(s);
                    }
                }
            } else {
                let members: Vec<u64> = (0..64).filter(|&e| union & 1 << e != 0).collect();
                for sub in 0u64..1 << members.len() {
                    if sub.count_ones() as usize <= capacity {
                        let s = members
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| sub & 1 << i != 0)
                            .fold(0u64, |m, (_, &e)| m | 1 << e);
                        keep(s);
                    }
                }
            }
        }
        states = next;
    }
    states.values().copied().min().unwrap_or(0)
}

//! Token selection. Greedy runs on the GPU (argmax.wgsl); temperature / top-k / top-p
//! sampling runs here on the logits row read back from the GPU, with a seeded RNG so a
//! run is reproducible.

#[derive(Clone, Debug)]
pub struct SamplingOptions {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means no top-k filter.
    pub top_k: usize,
    /// 1 means no nucleus filter.
    pub top_p: f32,
    pub seed: u64,
}

impl SamplingOptions {
    pub fn greedy() -> Self {
        SamplingOptions {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

/// A seed when none is given (`--seed`, a request's `seed`): std's per-process random hasher keys mixed with
/// the time, so two runs differ.
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.write_u32(std::process::id());
    h.finish()
}

/// SplitMix64: small, fast, the same everywhere, and good enough to draw one uniform
/// number per token (sampling) or per request (`wgmoe loadtest`'s prompts and plan).
#[derive(Clone, Debug)]
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
    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in `0..n` (n > 0; the bias of the modulo is below 2^-50 for the n used).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Index of the largest value, lowest index on ties, skipping `suppress` (as argmax.wgsl).
pub fn argmax(logits: &[f32], suppress: &[u32]) -> u32 {
    let mut best = 0usize;
    let mut bv = f32::NEG_INFINITY;
    let mut found = false;
    for (i, &v) in logits.iter().enumerate() {
        if suppress.contains(&(i as u32)) {
            continue;
        }
        if !found || v > bv {
            best = i;
            bv = v;
            found = true;
        }
    }
    best as u32
}

/// Sample one token: temperature, then top-k, then top-p (as transformers' warpers).
pub fn sample(logits: &[f32], opts: &SamplingOptions, suppress: &[u32], rng: &mut Rng) -> u32 {
    if opts.is_greedy() {
        return argmax(logits, suppress);
    }
    let mut cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(i, v)| !suppress.contains(&(*i as u32)) && v.is_finite())
        .map(|(i, &v)| (i as u32, v / opts.temperature))
        .collect();
    if cand.is_empty() {
        return argmax(logits, suppress);
    }
    cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if opts.top_k > 0 && cand.len() > opts.top_k {
        cand.truncate(opts.top_k);
    }
    let m = cand[0].1;
    let mut probs: Vec<f64> = cand.iter().map(|c| ((c.1 - m) as f64).exp()).collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    if opts.top_p < 1.0 {
        let mut acc = 0.0;
        let mut keep = probs.len();
        for (i, p) in probs.iter().enumerate() {
            acc += p;
            if acc >= opts.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        probs.truncate(keep);
        let t: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= t);
    }
    let u = rng.next_f64();
    let mut acc = 0.0;
    for (i, p) in probs.iter().enumerate() {
        acc += p;
        if u < acc {
            return cand[i].0;
        }
    }
    cand[probs.len() - 1].0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_prefers_lowest_index_and_skips_suppressed() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0], &[]), 1);
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0], &[1]), 2);
    }

    #[test]
    fn top_k_one_is_greedy_and_sampling_is_seeded() {
        let logits = [0.1, 2.0, 1.9, -1.0];
        let o = SamplingOptions {
            temperature: 1.0,
            top_k: 1,
            top_p: 1.0,
            seed: 1,
        };
        assert_eq!(sample(&logits, &o, &[], &mut Rng::new(1)), 1);
        let o = SamplingOptions {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 7,
        };
        let a: Vec<u32> = {
            let mut r = Rng::new(7);
            (0..32).map(|_| sample(&logits, &o, &[], &mut r)).collect()
        };
        let b: Vec<u32> = {
            let mut r = Rng::new(7);
            (0..32).map(|_| sample(&logits, &o, &[], &mut r)).collect()
        };
        assert_eq!(a, b);
        assert!(
            a.iter().any(|&t| t != 1),
            "temperature 1 should not always pick the argmax"
        );
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // p(1) ~ 0.84: with top_p 0.5 only token 1 survives.
        let logits = [0.0, 3.0, 1.0, -2.0];
        let o = SamplingOptions {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            seed: 3,
        };
        let mut r = Rng::new(3);
        assert!((0..64).all(|_| sample(&logits, &o, &[], &mut r) == 1));
    }
}

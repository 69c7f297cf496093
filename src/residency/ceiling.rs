//! What a policy could achieve at best, and a simulator to compare policies against it.
//!
//! - [`belady`]: Belady's optimal offline policy on a trace of routed groups (evict the
//!   resident expert, outside the current group, whose next use is farthest away).
//! - [`frequency_ceiling`]: for a static placement, the sum of the `capacity` largest access
//!   probabilities.
//! - [`simulate`]: the real [`ExpertCache`](super::ExpertCache) driven by a policy on a
//!   trace, with a fence that completes immediately (`super::replay`).
//!
//! All three count the same way: every distinct expert of a group is one access, a hit if it
//! was resident, a miss otherwise; cold misses count; evictions happen only when full.

use super::error::ConfigError;
use super::policy::Policy;
use super::replay::{belady_steps, distinct, replay, total, SimStats};

fn check_groups(groups: &[Vec<u32>], capacity: usize) -> Result<(), ConfigError> {
    match groups.iter().position(|g| g.len() > capacity) {
        Some(t) => Err(ConfigError::new(format!(
            "step {t} wants {} distinct experts but the capacity is {capacity}",
            groups[t].len()
        ))),
        None => Ok(()),
    }
}

/// Belady's optimal policy on `trace` (per step, the group wanted by one layer) with
/// `capacity` resident experts; every group must fit (see [`super::belady_steps`] for
/// steps that do not).
pub fn belady(trace: &[Vec<u32>], capacity: usize) -> Result<SimStats, ConfigError> {
    let groups: Vec<Vec<u32>> = trace.iter().map(|g| distinct(g)).collect();
    check_groups(&groups, capacity)?;
    // Every group fits one plan (spares: the capacity).
    Ok(total(&belady_steps(&groups, capacity, capacity)))
}

/// Belady's hit rate on `trace` with `capacity` resident experts.
pub fn belady_hit_rate(trace: &[Vec<u32>], capacity: usize) -> Result<f64, ConfigError> {
    belady(trace, capacity).map(|s| s.hit_rate())
}

/// The hit rate of the best static placement: the sum of the `capacity` largest
/// `probabilities` (each expert's share of the layer's accesses; non-finite or negative
/// values count as 0).
pub fn frequency_ceiling(probabilities: &[f64], capacity: usize) -> f64 {
    let mut p: Vec<f64> = probabilities
        .iter()
        .map(|&x| if x.is_finite() && x > 0.0 { x } else { 0.0 })
        .collect();
    p.sort_by(|a, b| b.total_cmp(a));
    p.iter().take(capacity).sum()
}

/// Under uniform routing, the expected number of distinct experts `tokens` tokens touch:
/// `E * (1 - (1 - k/E)^n)`.
pub fn expected_experts_touched(num_experts: usize, top_k: usize, tokens: u64) -> f64 {
    if num_experts == 0 {
        return 0.0;
    }
    let e = num_experts as f64;
    let miss = 1.0 - (top_k as f64 / e).min(1.0);
    e * (1.0 - miss.powf(tokens as f64))
}

/// Runs the real [`ExpertCache`](super::ExpertCache) of `layer` on `trace` with `policy` (the fence completes
/// every submission at once, so `NotNow` never happens). Spares: the largest group size;
/// every group must fit.
pub fn simulate(
    layer: usize,
    trace: &[Vec<u32>],
    num_experts: usize,
    capacity: usize,
    policy: &mut dyn Policy,
) -> Result<SimStats, ConfigError> {
    let groups: Vec<Vec<u32>> = trace.iter().map(|g| distinct(g)).collect();
    check_groups(&groups, capacity)?;
    let top_k = groups.iter().map(Vec::len).max().unwrap_or(1).max(1);
    Ok(total(&replay(
        layer,
        &groups,
        num_experts,
        top_k,
        capacity,
        policy,
    )?))
}

#[cfg(test)]
mod tests {
    use super::super::policy::{LfuDecay, Lru, StaticProfile};
    use super::super::profile::Profile;
    use super::super::testutil::{brute_force_min_misses, zipf_trace, Rng};
    use super::*;

    fn singles(refs: &[u32]) -> Vec<Vec<u32>> {
        refs.iter().map(|&r| vec![r]).collect()
    }

    /// The textbook reference string (Silberschatz): 3 frames, OPT 9 faults, LRU 12.
    const TEXTBOOK: [u32; 20] = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1];

    #[test]
    fn belady_and_lru_match_the_textbook() {
        let trace = singles(&TEXTBOOK);
        let opt = belady(&trace, 3).unwrap();
        assert_eq!((opt.misses, opt.hits), (9, 11));
        assert_eq!(opt.evictions, 6);
        let lru = simulate(0, &trace, 8, 3, &mut Lru::new()).unwrap();
        assert_eq!((lru.misses, lru.hits), (12, 8));
        assert_eq!(lru.evictions, 9);
        assert!((belady_hit_rate(&trace, 3).unwrap() - 11.0 / 20.0).abs() < 1e-12);
    }

    #[test]
    fn infeasible_traces_are_errors_and_empty_ones_are_zero() {
        assert!(belady(&[vec![0, 1, 2]], 2).is_err());
        assert!(simulate(0, &[vec![0, 1, 2]], 4, 2, &mut Lru::new()).is_err());
        assert_eq!(belady_hit_rate(&[], 2).unwrap(), 0.0);
    }

    #[test]
    fn belady_is_optimal_on_small_grouped_traces() {
        let mut rng = Rng::new(11);
        for case in 0..300 {
            let e = 4 + rng.below(4);
            let k = 1 + rng.below(3);
            let cap = k + rng.below(e - k + 1);
            let steps = 4 + rng.below(14);
            let trace: Vec<Vec<u32>> = (0..steps)
                .map(|_| {
                    let n = 1 + rng.below(k);
                    (0..n).map(|_| rng.below(e) as u32).collect()
                })
                .collect();
            let opt = belady(&trace, cap).unwrap();
            assert_eq!(
                opt.misses,
                // Groups of at most cap experts: every step is one plan.
                brute_force_min_misses(&trace, cap, cap),
                "case {case}: E={e} cap={cap} {trace:?}"
            );
        }
    }

    #[test]
    fn belady_bounds_every_policy_on_skewed_traces() {
        let mut rng = Rng::new(42);
        let (e, k) = (32usize, 4usize);
        for s in [0.0, 0.8, 1.2] {
            let trace = zipf_trace(&mut rng, 3_000, e, k, s);
            let mut prof = Profile::new("zipf", 1, e);
            for g in &trace {
                prof.record_group(0, g);
            }
            for cap in [k, 8, 16, 24, e] {
                let opt = belady(&trace, cap).unwrap();
                let runs = [
                    simulate(0, &trace, e, cap, &mut Lru::new()).unwrap(),
                    simulate(0, &trace, e, cap, &mut LfuDecay::new(0.95).unwrap()).unwrap(),
                    simulate(0, &trace, e, cap, &mut LfuDecay::new(1.0).unwrap()).unwrap(),
                    simulate(0, &trace, e, cap, &mut StaticProfile::new(&prof, cap)).unwrap(),
                ];
                for r in runs {
                    assert_eq!(r.hits + r.misses, opt.hits + opt.misses);
                    assert!(
                        opt.hit_rate() >= r.hit_rate(),
                        "s={s} cap={cap}: belady {} < {}",
                        opt.hit_rate(),
                        r.hit_rate()
                    );
                }
                if cap == e {
                    // Full residency: only cold misses, for everyone.
                    assert_eq!(opt.misses, runs[0].misses);
                    assert_eq!(runs[0].evictions, 0);
                }
            }
        }
    }

    #[test]
    fn skew_makes_caching_pay() {
        // On a skewed trace the frequency-aware policies beat the uniform ratio C/E clearly.
        let mut rng = Rng::new(5);
        let (e, k, cap) = (64usize, 8usize, 32usize);
        let trace = zipf_trace(&mut rng, 4_000, e, k, 1.2);
        let lfu = simulate(0, &trace, e, cap, &mut LfuDecay::new(0.99).unwrap()).unwrap();
        assert!(
            lfu.hit_rate() > cap as f64 / e as f64 + 0.1,
            "{}",
            lfu.hit_rate()
        );
    }

    #[test]
    fn frequency_ceiling_sums_the_largest_probabilities() {
        let p = [0.1, 0.4, 0.2, 0.3];
        assert!((frequency_ceiling(&p, 2) - 0.7).abs() < 1e-12);
        assert!((frequency_ceiling(&p, 1) - 0.4).abs() < 1e-12);
        assert_eq!(frequency_ceiling(&p, 0), 0.0);
        assert!((frequency_ceiling(&p, 10) - 1.0).abs() < 1e-12);
        assert!((frequency_ceiling(&[0.5, f64::NAN, -1.0, 0.25], 2) - 0.75).abs() < 1e-12);
        // Uniform routing: a cache is only a smaller copy, C/E.
        let uniform = vec![1.0 / 64.0; 64];
        assert!((frequency_ceiling(&uniform, 16) - 0.25).abs() < 1e-12);
        // From a profile.
        let mut prof = Profile::new("m", 1, 4);
        prof.counts[0] = vec![1, 4, 2, 3];
        assert!((frequency_ceiling(&prof.probabilities(0), 2) - 0.7).abs() < 1e-12);
    }

    #[test]
    fn experts_touched_under_uniform_routing() {
        assert_eq!(expected_experts_touched(64, 8, 0), 0.0);
        assert!((expected_experts_touched(64, 8, 1) - 8.0).abs() < 1e-9);
        // OLMoE: 64 experts, top-8, 16 tokens touch about 56.5.
        let t = expected_experts_touched(64, 8, 16);
        assert!((t - 64.0 * (1.0 - (56.0f64 / 64.0).powi(16))).abs() < 1e-9);
        assert!(expected_experts_touched(64, 64, 3) == 64.0);
    }
}

//! Replay and Belady over steps: hand-computed traces for every policy (steps that fit one
//! plan and steps served in batches), Belady against an exhaustive optimum, and Belady at
//! least every policy on random traces (proptest).

use super::*;
use crate::residency::testutil::brute_force_min_misses;
use crate::residency::{LfuDecay, Lru, Profile, StaticProfile};

fn singles(refs: &[u32]) -> Vec<Vec<u32>> {
    refs.iter().map(|&r| vec![r]).collect()
}

fn hm(s: &[SimStats]) -> (u64, u64, u64) {
    let t = total(s);
    (t.hits, t.misses, t.evictions)
}

/// 4 experts, top-1, 2 resident; steps [0] [1] [0] [2] [1] [0].
const SMALL: [u32; 6] = [0, 1, 0, 2, 1, 0];

#[test]
fn lru_on_a_hand_computed_trace() {
    // [0]m [1]m [0]h [2]m evicts 1, [1]m evicts 0 (used at 2; 2 at 3), [0]m evicts 2.
    let s = replay(0, &singles(&SMALL), 4, 1, 2, &mut Lru::new()).unwrap();
    assert_eq!(hm(&s), (1, 5, 3));
    assert_eq!(
        s[2],
        SimStats {
            hits: 1,
            misses: 0,
            evictions: 0
        }
    );
    assert_eq!(
        s[5],
        SimStats {
            hits: 0,
            misses: 1,
            evictions: 1
        }
    );
}

#[test]
fn lfu_decay_on_a_hand_computed_trace() {
    // Plain LFU: at [2] expert 0 has 2 uses, 1 has 1: evict 1. At [1]: 0 (2) vs 2 (1):
    // evict 2. [0] hits.
    let s = replay(
        0,
        &singles(&SMALL),
        4,
        1,
        2,
        &mut LfuDecay::new(1.0).unwrap(),
    )
    .unwrap();
    assert_eq!(hm(&s), (2, 4, 2));
    // decay 0.1: at [2] (step 3) expert 0 = (0.1^2 + 1) * 0.1 = 0.101, 1 = 0.01: evict 1;
    // at [1] (step 4) expert 0 = 0.0101, 2 = 0.1: evict 0; at [0] (step 5) 2 = 0.01,
    // 1 = 0.1: evict 2.
    let s = replay(
        0,
        &singles(&SMALL),
        4,
        1,
        2,
        &mut LfuDecay::new(0.1).unwrap(),
    )
    .unwrap();
    assert_eq!(hm(&s), (1, 5, 3));
}

#[test]
fn static_profile_on_a_hand_computed_trace() {
    // Pinned {0, 1} (counts 3, 2, 1, 0). At [2] both candidates are pinned: evict the lower
    // count, 1. At [1]: unpinned 2 goes. [0] hits.
    let mut prof = Profile::new("m", 1, 4);
    prof.counts[0] = vec![3, 2, 1, 0];
    let mut p = StaticProfile::new(&prof, 2);
    let s = replay(0, &singles(&SMALL), 4, 1, 2, &mut p).unwrap();
    assert_eq!(hm(&s), (2, 4, 2));
    assert_eq!(
        s[4],
        SimStats {
            hits: 0,
            misses: 1,
            evictions: 1
        }
    );
}

#[test]
fn belady_on_a_hand_computed_trace() {
    // At [2]: 0 is next used at step 5, 1 at step 4: evict 0. [1] hits. At [0]: neither 1
    // nor 2 is used again: the lower id, 1, goes.
    let s = belady_steps(&singles(&SMALL), 2, 1);
    assert_eq!(hm(&s), (2, 4, 2));
    assert_eq!(s[4].hits, 1);
}

/// 6 experts, top-2, 3 resident (2 spares): a prefill step wanting 5 experts, then [1, 4].
#[test]
fn a_step_larger_than_a_plan_runs_in_batches() {
    let steps = vec![vec![0, 1, 2, 3, 4, 0], vec![1, 4]];
    // Batches [0, 1], [2, 3] (evicts 0, the older of the step), [4] (evicts 1): {2, 3, 4}.
    // Then [4, 1]: 4 hits, 1 misses and evicts 2.
    let s = replay(0, &steps, 6, 2, 3, &mut Lru::new()).unwrap();
    assert_eq!(
        s[0],
        SimStats {
            hits: 0,
            misses: 5,
            evictions: 2
        }
    );
    assert_eq!(
        s[1],
        SimStats {
            hits: 1,
            misses: 1,
            evictions: 1
        }
    );
    // Belady keeps the 3 used soonest of {0..4}: 1 and 4 (step 1), then 3: both hit.
    let b = belady_steps(&steps, 3, 2);
    assert_eq!(
        b[0],
        SimStats {
            hits: 0,
            misses: 5,
            evictions: 2
        }
    );
    assert_eq!(
        b[1],
        SimStats {
            hits: 2,
            misses: 0,
            evictions: 0
        }
    );
}

#[test]
fn every_expert_resident_only_misses_cold() {
    let steps = vec![vec![0, 1], vec![2, 3], vec![1, 0], vec![3, 2]];
    let s = replay(0, &steps, 4, 2, 4, &mut Lru::new()).unwrap();
    assert_eq!(hm(&s), (4, 4, 0));
    assert_eq!(hm(&belady_steps(&steps, 4, 0)), (4, 4, 0));
}

fn random_steps(rng: &mut crate::residency::testutil::Rng, e: usize, k: usize) -> Vec<Vec<u32>> {
    let steps = 3 + rng.below(10);
    (0..steps)
        .map(|_| {
            // Mostly decode-like groups of up to k, sometimes a prefill of several tokens.
            let tokens = if rng.below(4) == 0 {
                1 + rng.below(4)
            } else {
                1
            };
            (0..tokens * (1 + rng.below(k)))
                .map(|_| rng.below(e) as u32)
                .collect()
        })
        .collect()
}

#[test]
fn belady_steps_is_optimal_on_small_traces() {
    let mut rng = crate::residency::testutil::Rng::new(7);
    for case in 0..300 {
        let e = 3 + rng.below(5);
        let k = 1 + rng.below(2);
        let cap = k + rng.below(e - k + 1);
        let steps = random_steps(&mut rng, e, k);
        let spares = if cap < e { k } else { 0 };
        let b = total(&belady_steps(&steps, cap, spares));
        assert_eq!(
            b.misses,
            brute_force_min_misses(&steps, cap, spares),
            "case {case}: E={e} k={k} cap={cap} {steps:?}"
        );
    }
}

mod property {
    use super::*;
    use proptest::prelude::*;

    /// (experts, top_k, capacity, steps).
    fn traces() -> impl Strategy<Value = (usize, usize, usize, Vec<Vec<u32>>)> {
        (2usize..10, 1usize..4).prop_flat_map(|(e, k)| {
            let k = k.min(e);
            let step = prop::collection::vec(0..e as u32, 1..=(3 * k));
            (Just(e), Just(k), k..=e, prop::collection::vec(step, 1..60))
        })
    }

    proptest! {
        #[test]
        fn belady_hits_at_least_every_policy((e, k, cap, steps) in traces()) {
            let b = total(&belady_steps(&steps, cap, if cap < e { k } else { 0 }));
            let mut prof = Profile::new("p", 1, e);
            for s in &steps {
                prof.record_group(0, s);
            }
            let mut policies: Vec<Box<dyn Policy>> = vec![
                Box::new(Lru::new()),
                Box::new(LfuDecay::new(1.0).unwrap()),
                Box::new(LfuDecay::new(0.9).unwrap()),
                Box::new(LfuDecay::new(0.5).unwrap()),
                Box::new(StaticProfile::new(&prof, cap)),
            ];
            for p in policies.iter_mut() {
                let r = total(&replay(0, &steps, e, k, cap, p.as_mut()).unwrap());
                prop_assert_eq!(r.hits + r.misses, b.hits + b.misses);
                prop_assert!(b.hits >= r.hits, "{}: belady {} < {}", p.name(), b.hits, r.hits);
            }
        }
    }
}

/// SMALL under LRU with a guess per step: the true next set (an oracle) turns every miss
/// but the first into a used prefetch; a guess of an expert never wanted is wasted, every
/// time, and changes nothing else.
#[test]
fn prefetch_replay_with_oracle_and_wrong_guesses() {
    let steps = singles(&SMALL);
    let plain = replay(0, &steps, 4, 1, 2, &mut Lru::new()).unwrap();
    let oracle: Vec<Vec<u32>> = steps.to_vec();
    let s = replay_prefetch(0, &steps, &oracle, 4, 1, 2, 1, &mut Lru::new(), None).unwrap();
    let sum = |f: fn(&PrefetchSimStats) -> u64| s.iter().map(f).sum::<u64>();
    // Hits as without prefetch (resident before); each plain miss comes from the prefetch.
    assert_eq!(sum(|x| x.cache.hits), total(&plain).hits);
    assert_eq!(sum(|x| x.cache.misses), 0);
    assert_eq!(sum(|x| x.used), total(&plain).misses);
    assert_eq!((sum(|x| x.issued), sum(|x| x.wasted)), (5, 0));
    assert_eq!((sum(|x| x.predicted), sum(|x| x.guessed)), (6, 6));
    // Expert 3 is never wanted: every guess of it is copied and released.
    let wrong = vec![vec![3u32]; steps.len()];
    let w = replay_prefetch(0, &steps, &wrong, 4, 1, 2, 1, &mut Lru::new(), None).unwrap();
    assert_eq!(
        w.iter().map(|x| x.cache).collect::<Vec<_>>(),
        plain,
        "wrong guesses change no hit nor miss"
    );
    assert_eq!(w.iter().map(|x| x.wasted).sum::<u64>(), 6);
    assert_eq!(w.iter().map(|x| x.predicted).sum::<u64>(), 0);
    // No prefetch slots: the guesses are scored, nothing is copied.
    let z = replay_prefetch(0, &steps, &oracle, 4, 1, 2, 0, &mut Lru::new(), None).unwrap();
    assert_eq!(z.iter().map(|x| x.issued).sum::<u64>(), 0);
    assert_eq!(z.iter().map(|x| x.predicted).sum::<u64>(), 6);
}

/// The gated replay: a guess never wanted is judged every step and never copied; an
/// oracle's guesses are held back for the gate's first 16 judgements, then copied.
#[test]
fn gated_prefetch_replay_copies_only_paying_guesses() {
    use crate::residency::PrefetchGate;
    // 40 steps over experts 0..8, one wanted per step, 4 resident.
    let refs: Vec<u32> = (0..40u32).map(|t| (t * 3) % 8).collect();
    let steps = singles(&refs);
    let plain = replay(0, &steps, 8, 1, 4, &mut Lru::new()).unwrap();
    // Expert 7 is wanted 1 step in 8: guessing it every step is right an eighth of the time.
    let poor = vec![vec![7u32]; steps.len()];
    let mut gate = PrefetchGate::new(2.0 / 3.0);
    let p = replay_prefetch(
        0,
        &steps,
        &poor,
        8,
        1,
        4,
        1,
        &mut Lru::new(),
        Some(&mut gate),
    )
    .unwrap();
    assert_eq!(p.iter().map(|x| x.issued).sum::<u64>(), 0, "never copied");
    assert_eq!(
        p.iter().map(|x| x.cache).collect::<Vec<_>>(),
        plain,
        "held-back guesses change nothing"
    );
    assert!(gate.held_back > 0 && !gate.is_open());
    // The oracle: every candidate is wanted, so after 16 judgements its guesses are copied.
    let oracle: Vec<Vec<u32>> = steps.to_vec();
    let mut gate = PrefetchGate::new(2.0 / 3.0);
    let o = replay_prefetch(
        0,
        &steps,
        &oracle,
        8,
        1,
        4,
        1,
        &mut Lru::new(),
        Some(&mut gate),
    )
    .unwrap();
    let ungated = replay_prefetch(0, &steps, &oracle, 8, 1, 4, 1, &mut Lru::new(), None).unwrap();
    let issued = o.iter().map(|x| x.issued).sum::<u64>();
    assert!(gate.is_open());
    assert_eq!(gate.held_back, 16);
    assert!(issued > 0 && issued < ungated.iter().map(|x| x.issued).sum::<u64>());
    assert_eq!(o.iter().map(|x| x.wasted).sum::<u64>(), 0);
}

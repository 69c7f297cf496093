//! State-machine tests of [`ExpertCache`] with a hand-driven [`MockFence`].

use super::testutil::Rng;
use super::*;

fn cache(
    num_experts: usize,
    top_k: usize,
    capacity: usize,
    spares: usize,
) -> ExpertCache<MockFence> {
    ExpertCache::new(CacheConfig {
        layer: 0,
        num_experts,
        top_k,
        capacity,
        spares,
        prefetch: 0,
    })
    .unwrap()
}

/// Serves `wanted` completely: plan, copy, publish, then one submission reading the group.
/// Returns the plan and the read token (not completed).
fn serve(
    c: &mut ExpertCache<MockFence>,
    fence: &mut MockFence,
    policy: &mut dyn Policy,
    wanted: &[u32],
) -> (Plan, u64) {
    let plan = c.plan(wanted, policy, fence).unwrap();
    if !plan.is_all_hits() {
        let copy = fence.submit();
        c.complete_uploads(&plan, copy).unwrap();
    }
    c.publish(&plan, policy).unwrap();
    let read = fence.submit();
    c.mark_read(plan.wanted(), read).unwrap();
    c.check_invariants().unwrap();
    (plan, read)
}

#[test]
fn geometry_is_validated_with_the_valid_range() {
    let cfg = |top_k, capacity, spares| CacheConfig {
        layer: 3,
        num_experts: 64,
        top_k,
        capacity,
        spares,
        prefetch: 0,
    };
    let err = ExpertCache::<MockFence>::new(cfg(8, 4, 8)).unwrap_err();
    assert!(
        err.0.contains("8..=64") && err.0.contains("got 4") && err.0.contains("layer 3"),
        "{err}"
    );
    assert!(ExpertCache::<MockFence>::new(cfg(8, 65, 8)).is_err());
    assert!(ExpertCache::<MockFence>::new(cfg(0, 8, 8))
        .unwrap_err()
        .0
        .contains("top_k"));
    assert!(ExpertCache::<MockFence>::new(cfg(65, 64, 0)).is_err());
    let err = ExpertCache::<MockFence>::new(cfg(8, 30, 7)).unwrap_err();
    assert!(err.0.contains("spare"), "{err}");
    // Full residency needs no spares; partial with top_k spares is fine.
    assert!(ExpertCache::<MockFence>::new(cfg(8, 64, 0)).is_ok());
    assert!(ExpertCache::<MockFence>::new(cfg(8, 8, 8)).is_ok());
    let zero = CacheConfig {
        num_experts: 0,
        ..cfg(1, 1, 1)
    };
    assert!(ExpertCache::<MockFence>::new(zero).is_err());
    assert_eq!(CacheConfig::full(0, 64, 8).total_slots(), 64);
    assert_eq!(CacheConfig::partial(0, 64, 8, 30).total_slots(), 38);
    assert_eq!(CacheConfig::partial(0, 64, 8, 64).spares, 0);
    // Prefetch slots come on top of the spares, none at full residency.
    assert_eq!(
        CacheConfig::partial(0, 64, 8, 30)
            .with_prefetch(8)
            .total_slots(),
        46
    );
    assert_eq!(
        CacheConfig::full(0, 64, 8).with_prefetch(8).total_slots(),
        64
    );
    assert!(ExpertCache::<MockFence>::new(CacheConfig {
        prefetch: 65,
        ..cfg(8, 30, 8)
    })
    .unwrap_err()
    .0
    .contains("prefetch"));
}

#[test]
fn repeated_ids_count_once_and_all_hit_groups_keep_the_generation() {
    let mut c = cache(8, 2, 4, 2);
    let mut f = MockFence::new();
    let mut p = Lru::new();
    let (plan, _) = serve(&mut c, &mut f, &mut p, &[3, 3, 5]);
    assert_eq!(plan.wanted(), &[3, 5]);
    assert_eq!(plan.uploads().len(), 2);
    assert_eq!(c.generation(), 1);
    // All hits: no upload needed, publish without complete_uploads, generation unchanged.
    let plan = c.plan(&[5, 3, 5], &mut p, &f).unwrap();
    assert!(plan.is_all_hits());
    assert_eq!(plan.hits().len(), 2);
    assert_eq!(c.publish(&plan, &mut p).unwrap(), 1);
    let s = c.stats();
    assert_eq!(
        (s.hits, s.misses, s.uploads, s.evictions, s.publishes),
        (2, 2, 2, 0, 2)
    );
}

#[test]
fn publication_is_atomic() {
    let mut c = cache(8, 2, 2, 2);
    let mut f = MockFence::new();
    let mut p = Lru::new();
    serve(&mut c, &mut f, &mut p, &[0, 1]);
    f.complete_all();
    let before = c.table().clone();

    let plan = c.plan(&[2, 3], &mut p, &f).unwrap();
    assert_eq!(plan.base_generation(), before.generation());
    assert_eq!(plan.evictions().len(), 2);
    // Planned but not published: readers see exactly the previous generation, victims included.
    assert_eq!(c.table(), &before);
    assert!(c.table().slot_of(0).is_some() && c.table().slot_of(2).is_none());
    // Upload targets are not published slots of the current table.
    for u in plan.uploads() {
        assert!(before.resident().all(|(_, s)| s != u.slot));
        assert_eq!(c.slots()[u.slot as usize].state, SlotState::Uploading);
    }
    let copy = f.submit();
    c.complete_uploads(&plan, copy).unwrap();
    assert_eq!(c.table(), &before); // uploads done is still not published
    c.check_invariants().unwrap();

    let g = c.publish(&plan, &mut p).unwrap();
    assert_eq!(g, before.generation() + 1);
    // The whole new generation at once: every wanted expert mapped, victims gone.
    for u in plan.uploads() {
        assert_eq!(c.table().slot_of(u.expert), Some(u.slot));
        assert_eq!(c.slots()[u.slot as usize].last_write, Some(copy));
    }
    assert_eq!(c.table().slot_of(0), None);
    assert_eq!(c.table().slot_of(1), None);
    assert_eq!(c.table().resident_count(), 2);
    c.check_invariants().unwrap();
}

#[test]
fn abort_keeps_the_previous_generation_and_slots() {
    let mut c = cache(8, 2, 3, 2);
    let mut f = MockFence::new();
    let mut p = LfuDecay::new(0.9).unwrap();
    serve(&mut c, &mut f, &mut p, &[0, 1]);
    serve(&mut c, &mut f, &mut p, &[2]);
    let table = c.table().clone();
    let words = table.words().to_vec();
    let slots = c.slots().to_vec();
    let stats = c.stats();

    // Failure while staging (before any copy).
    let plan = c.plan(&[4, 5], &mut p, &f).unwrap();
    let report = c.abort(&plan).unwrap();
    assert_eq!(report.generation, table.generation());
    assert_eq!(report.released_slots.len(), 2);
    assert_eq!(c.table().words(), &words[..]);
    assert_eq!(c.slots(), &slots[..]);

    // Failure after the copy was submitted.
    let plan = c.plan(&[4, 5], &mut p, &f).unwrap();
    let copy = f.submit();
    c.complete_uploads(&plan, copy).unwrap();
    c.abort(&plan).unwrap();
    assert_eq!(c.table(), &table);
    assert_eq!(c.slots(), &slots[..]);
    assert_eq!(c.open_plan(), None);
    c.check_invariants().unwrap();
    // Reported, not hidden; the group is not counted until it is served.
    let s = c.stats();
    assert_eq!(s.aborts, stats.aborts + 2);
    assert_eq!(
        (s.hits, s.misses, s.evictions),
        (stats.hits, stats.misses, stats.evictions)
    );
    // The aborted plan cannot be published; a retry works.
    assert!(matches!(
        c.publish(&plan, &mut p),
        Err(CacheError::StalePlan { .. })
    ));
    serve(&mut c, &mut f, &mut p, &[4, 5]);
    assert_eq!(c.generation(), table.generation() + 1);
}

#[test]
fn no_slot_reuse_before_its_readers_complete() {
    // 4 experts, capacity 2, one spare: 3 slots.
    let mut c = cache(4, 1, 2, 1);
    let mut f = MockFence::new();
    let mut p = Lru::new();
    let (a, t_a) = serve(&mut c, &mut f, &mut p, &[0]);
    let (_, _t_b) = serve(&mut c, &mut f, &mut p, &[1]);
    // Full. Expert 2 lands in the never-read spare; LRU victim is expert 0.
    let (plan, _t_c) = serve(&mut c, &mut f, &mut p, &[2]);
    let slot0 = a.uploads()[0].slot;
    assert_eq!(
        plan.evictions(),
        &[Placement {
            expert: 0,
            slot: slot0
        }]
    );
    assert_ne!(plan.uploads()[0].slot, slot0);
    assert_eq!(c.slots()[slot0 as usize].state, SlotState::Free);

    // The only free slot is expert 0's old slot, still read by submission t_a: not now.
    let table = c.table().clone();
    let slots = c.slots().to_vec();
    let err = c.plan(&[3], &mut p, &f).unwrap_err();
    assert_eq!(
        err,
        CacheError::NotNow {
            layer: 0,
            wait_for: t_a
        }
    );
    assert!(err.is_not_now() && !err.is_never_fits());
    // A refusal changes nothing.
    assert_eq!(c.table(), &table);
    assert_eq!(c.slots(), &slots[..]);
    assert_eq!(c.open_plan(), None);
    assert_eq!(c.stats().not_now, 1);

    f.complete_through(t_a);
    let plan = c.plan(&[3], &mut p, &f).unwrap();
    assert_eq!(
        plan.uploads(),
        &[Placement {
            expert: 3,
            slot: slot0
        }]
    );
}

#[test]
fn a_victim_read_before_publication_is_protected_after_it() {
    let mut c = cache(4, 1, 1, 1);
    let mut f = MockFence::new();
    let mut p = Lru::new();
    serve(&mut c, &mut f, &mut p, &[0]);
    f.complete_all();
    let plan = c.plan(&[1], &mut p, &f).unwrap();
    let victim = plan.evictions()[0];
    // A submission reading the previous generation (expert 0) goes out before publication.
    let late = f.submit();
    c.mark_read(&[0], late).unwrap();
    let copy = f.submit();
    c.complete_uploads(&plan, copy).unwrap();
    c.publish(&plan, &mut p).unwrap();
    assert_eq!(c.slots()[victim.slot as usize].last_read, Some(late));
    // Expert 0 is gone from the table: marking it read now is an error.
    assert!(matches!(
        c.mark_read(&[0], late),
        Err(CacheError::NotResident { expert: 0, .. })
    ));
    // Its slot is the only free one and `late` has not completed.
    assert_eq!(
        c.plan(&[2], &mut p, &f).unwrap_err(),
        CacheError::NotNow {
            layer: 0,
            wait_for: late
        }
    );
    f.complete_through(late);
    assert_eq!(
        c.plan(&[2], &mut p, &f).unwrap().uploads()[0].slot,
        victim.slot
    );
}

#[test]
fn not_now_is_distinct_from_never_fits() {
    let mut c = cache(16, 2, 4, 2);
    let mut f = MockFence::new();
    let mut p = Lru::new();
    // More distinct experts than capacity: never.
    let err = c.plan(&[0, 1, 2, 3, 4], &mut p, &f).unwrap_err();
    assert_eq!(
        err,
        CacheError::NeverFits {
            layer: 0,
            distinct: 5,
            capacity: 4
        }
    );
    assert!(err.is_never_fits() && !err.is_not_now());
    // Fill the cache, then a 4-miss group: only 2 unpublished slots exist, never as one group.
    serve(&mut c, &mut f, &mut p, &[0, 1, 2, 3]);
    f.complete_all();
    let err = c.plan(&[4, 5, 6, 7], &mut p, &f).unwrap_err();
    assert_eq!(
        err,
        CacheError::GroupTooLarge {
            layer: 0,
            misses: 4,
            free: 2
        }
    );
    assert!(err.is_never_fits());
    // Split in two it works.
    serve(&mut c, &mut f, &mut p, &[4, 5]);
    f.complete_all();
    serve(&mut c, &mut f, &mut p, &[6, 7]);
    // Unknown experts are rejected with the range.
    let err = c.plan(&[16], &mut p, &f).unwrap_err();
    assert!(err.to_string().contains("16 experts"), "{err}");
    // And converted for the CLI.
    let e: crate::Error = CacheError::<u64>::NeverFits {
        layer: 0,
        distinct: 5,
        capacity: 4,
    }
    .into();
    assert!(matches!(e, crate::Error::DoesNotFit(_)));
}

#[test]
fn protocol_misuse_is_reported() {
    let mut c = cache(8, 2, 2, 2);
    let mut f = MockFence::new();
    let mut p = Lru::new();
    let plan = c.plan(&[0, 1], &mut p, &f).unwrap();
    assert_eq!(
        c.plan(&[2], &mut p, &f).unwrap_err(),
        CacheError::PlanInFlight {
            layer: 0,
            open: plan.id()
        }
    );
    assert_eq!(
        c.publish(&plan, &mut p).unwrap_err(),
        CacheError::UploadsIncomplete {
            layer: 0,
            plan: plan.id()
        }
    );
    let t = f.submit();
    c.complete_uploads(&plan, t).unwrap();
    c.publish(&plan, &mut p).unwrap();
    assert!(matches!(
        c.publish(&plan, &mut p),
        Err(CacheError::StalePlan { .. })
    ));
    assert!(matches!(c.abort(&plan), Err(CacheError::StalePlan { .. })));
    assert!(matches!(
        c.complete_uploads(&plan, t),
        Err(CacheError::StalePlan { .. })
    ));
    // mark_read is all-or-nothing.
    let before = c.slots().to_vec();
    assert!(c.mark_read(&[0, 5], 9).is_err());
    assert_eq!(c.slots(), &before[..]);
    c.mark_all_read(9);
    assert!(c
        .slots()
        .iter()
        .filter(|s| s.state == SlotState::Published)
        .all(|s| s.last_read == Some(9)));
}

#[test]
fn lru_and_profile_victims_through_the_cache() {
    let mut f = MockFence::new();
    // LRU, capacity 2: [0] [1] [0] [2] evicts 1.
    let mut c = cache(4, 1, 2, 1);
    let mut lru = Lru::new();
    for g in [[0], [1], [0]] {
        serve(&mut c, &mut f, &mut lru, &g);
        f.complete_all();
    }
    let plan = c.plan(&[2], &mut lru, &f).unwrap();
    assert_eq!(plan.evictions()[0].expert, 1);
    c.abort(&plan).unwrap();

    // Profile pinning expert 1: the same trace evicts 0 instead.
    let mut prof = Profile::new("m", 1, 4);
    prof.counts[0] = vec![1, 9, 0, 0];
    let mut pinned = StaticProfile::new(&prof, 1);
    let mut c = cache(4, 1, 2, 1);
    for g in [[0], [1], [0]] {
        serve(&mut c, &mut f, &mut pinned, &g);
        f.complete_all();
    }
    let plan = c.plan(&[2], &mut pinned, &f).unwrap();
    assert_eq!(plan.evictions()[0].expert, 0);
}

#[test]
fn full_residency_never_evicts() {
    let mut c = ExpertCache::<MockFence>::new(CacheConfig::full(0, 8, 2)).unwrap();
    let mut f = MockFence::new();
    let mut p = Lru::new();
    let mut rng = Rng::new(3);
    for _ in 0..500 {
        let g = [rng.below(8) as u32, rng.below(8) as u32];
        serve(&mut c, &mut f, &mut p, &g);
        // Readers never complete: full residency never needs to reuse a slot.
    }
    assert_eq!(c.stats().evictions, 0);
    assert_eq!(c.stats().uploads, 8);
}

/// Thousands of random groups with random fence lag, pre-publication readers and injected
/// aborts. Checks after every operation: capacity never exceeded, table consistent, no slot
/// written while a submission that read it is in flight (against an independent shadow of
/// the readers), readers see the old table until publication.
#[test]
fn random_thrashing_keeps_every_invariant() {
    let (e, k, capacity, spares) = (16usize, 4usize, 6usize, 5usize);
    let prof = {
        let mut p = Profile::new("m", 1, e);
        p.counts[0] = (0..e as u64).map(|i| i * 7 % 11).collect();
        p
    };
    let policies: Vec<Box<dyn Policy>> = vec![
        Box::new(Lru::new()),
        Box::new(LfuDecay::new(0.8).unwrap()),
        Box::new(StaticProfile::new(&prof, capacity)),
    ];
    for (seed, mut policy) in policies.into_iter().enumerate() {
        let mut rng = Rng::new(100 + seed as u64);
        let mut c = cache(e, k, capacity, spares);
        let mut f = MockFence::new();
        let mut shadow_reads: Vec<u64> = vec![0; capacity + spares]; // 0: never read
        let (mut not_now, mut aborts) = (0, 0);
        for _ in 0..5_000 {
            let n = 1 + rng.below(k);
            let group: Vec<u32> = (0..n).map(|_| rng.below(e) as u32).collect();
            let plan = loop {
                match c.plan(&group, policy.as_mut(), &f) {
                    Ok(plan) => break plan,
                    Err(CacheError::NotNow { wait_for, .. }) => {
                        assert!(!f.is_complete(wait_for));
                        not_now += 1;
                        f.complete_through(wait_for);
                    }
                    Err(err) => panic!("unexpected refusal: {err}"),
                }
            };
            c.check_invariants().unwrap();
            for u in plan.uploads() {
                let r = shadow_reads[u.slot as usize];
                assert!(
                    r == 0 || f.is_complete(r),
                    "slot {} written while read by {r}",
                    u.slot
                );
            }
            let before = c.table().clone();
            // Sometimes a submission reads the previous generation before publication.
            if rng.below(3) == 0 {
                let resident: Vec<(u32, u32)> = before.resident().collect();
                if !resident.is_empty() {
                    let (expert, slot) = resident[rng.below(resident.len())];
                    let t = f.submit();
                    c.mark_read(&[expert], t).unwrap();
                    shadow_reads[slot as usize] = t;
                }
            }
            if !plan.is_all_hits() && rng.below(10) == 0 {
                if rng.below(2) == 0 {
                    let t = f.submit();
                    c.complete_uploads(&plan, t).unwrap();
                }
                c.abort(&plan).unwrap();
                aborts += 1;
                assert_eq!(c.table(), &before);
                c.check_invariants().unwrap();
            } else {
                if !plan.is_all_hits() {
                    let t = f.submit();
                    c.complete_uploads(&plan, t).unwrap();
                }
                assert_eq!(c.table(), &before);
                c.publish(&plan, policy.as_mut()).unwrap();
                c.check_invariants().unwrap();
                assert!(c.published_count() <= capacity);
                for &x in plan.wanted() {
                    assert!(c.table().slot_of(x).is_some());
                }
                let t = f.submit();
                c.mark_read(plan.wanted(), t).unwrap();
                for &x in plan.wanted() {
                    if let Some(s) = c.table().slot_of(x) {
                        shadow_reads[s as usize] = t;
                    }
                }
            }
            // The GPU retires work at a random pace.
            let lag = rng.below(6) as u64;
            f.complete_through(f.last_submitted().saturating_sub(lag));
        }
        let s = c.stats();
        assert!(
            not_now > 0 && aborts > 0,
            "{}: the trace must exercise both",
            policy.name()
        );
        assert!(s.evictions > 1000, "{}: {s:?}", policy.name());
        assert_eq!(s.misses, s.uploads);
        assert_eq!(s.aborts, aborts);
    }
}

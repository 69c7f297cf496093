//! Prefetch slots of [`ExpertCache`] with a hand-driven [`MockFence`]: a guess is copied
//! ahead, published only by a plan that wants it, released otherwise; a prefetch never
//! takes a slot a submission in flight reads, nor one the spares need.

use super::testutil::Rng;
use super::*;

fn cache(e: usize, k: usize, capacity: usize, width: usize) -> ExpertCache<MockFence> {
    ExpertCache::new(CacheConfig::partial(0, e, k, capacity).with_prefetch(width)).unwrap()
}

/// Plan, copy, publish `wanted`, then a submission reading it; returns the plan.
fn serve(c: &mut ExpertCache<MockFence>, f: &mut MockFence, p: &mut Lru, wanted: &[u32]) -> Plan {
    let plan = c.plan(wanted, p, f).unwrap();
    if !plan.is_all_hits() {
        let t = f.submit();
        c.complete_uploads(&plan, t).unwrap();
    }
    c.publish(&plan, p).unwrap();
    let t = f.submit();
    c.mark_read(plan.wanted(), t).unwrap();
    c.check_invariants().unwrap();
    plan
}

#[test]
fn a_right_guess_is_published_without_a_copy_and_a_wrong_one_released() {
    // 8 experts, top-2, 3 resident, 2 spares, 2 prefetch slots: 7 slots.
    let mut c = cache(8, 2, 3, 2);
    let (mut f, mut p) = (MockFence::new(), Lru::new());
    serve(&mut c, &mut f, &mut p, &[0, 1]);
    serve(&mut c, &mut f, &mut p, &[2]);
    f.complete_all();
    // Guess [0, 4, 5]: 0 is resident (skipped), 4 and 5 take the two prefetch slots.
    let placed = c.prefetch(&[0, 4, 5, 6], &f).unwrap();
    assert_eq!(
        placed.iter().map(|p| p.expert).collect::<Vec<_>>(),
        vec![4, 5]
    );
    let table = c.table().clone();
    assert_eq!(c.table(), &table, "a prefetch publishes nothing");
    assert!(c.table().slot_of(4).is_none());
    c.check_invariants().unwrap();
    // A plan before the copy was submitted may not use them: settle reports it.
    assert!(matches!(
        c.settle_prefetch(&[4]),
        Err(CacheError::PrefetchNotCopied { expert: 4, .. })
    ));
    let copy = f.submit();
    c.complete_prefetch(&placed, copy).unwrap();
    assert_eq!(c.stats().prefetch_issued, 2);
    // The router chose 4 and 7: 5 was a wrong guess (released), 4 comes without a copy.
    let s = c.settle_prefetch(&[4, 7]).unwrap();
    assert_eq!(s.used.iter().map(|p| p.expert).collect::<Vec<_>>(), vec![4]);
    assert_eq!(
        s.wasted.iter().map(|p| p.expert).collect::<Vec<_>>(),
        vec![5]
    );
    let slot5 = s.wasted[0].slot as usize;
    assert_eq!(c.slots()[slot5].state, SlotState::Free);
    assert_eq!(c.slots()[slot5].expert, None);
    let plan = c.plan(&[4, 7], &mut p, &f).unwrap();
    assert_eq!(plan.prefetched(), &s.used[..]);
    assert_eq!(plan.uploads().len(), 1);
    assert_eq!(plan.uploads()[0].expert, 7);
    // 3 resident + 2 new over capacity 3: two victims.
    assert_eq!(plan.evictions().len(), 2);
    let t = f.submit();
    c.complete_uploads(&plan, t).unwrap();
    c.publish(&plan, &mut p).unwrap();
    assert_eq!(c.table().slot_of(4), Some(s.used[0].slot));
    assert!(c.table().slot_of(7).is_some());
    let st = c.stats();
    assert_eq!(
        (st.prefetch_used, st.prefetch_wasted, st.misses),
        (1, 1, 4),
        "{st:?}"
    );
    c.check_invariants().unwrap();
}

#[test]
fn an_aborted_plan_keeps_its_prefetched_experts_and_a_failed_copy_frees_its_slot() {
    let mut c = cache(8, 2, 2, 2);
    let (mut f, mut p) = (MockFence::new(), Lru::new());
    serve(&mut c, &mut f, &mut p, &[0, 1]);
    f.complete_all();
    let placed = c.prefetch(&[3, 4], &f).unwrap();
    // The copy of 4 failed before submission: its slot is free again.
    c.cancel_prefetch(&placed[1..]).unwrap();
    let copy = f.submit();
    c.complete_prefetch(&placed[..1], copy).unwrap();
    assert_eq!(c.prefetched().len(), 1);
    c.settle_prefetch(&[3, 5]).unwrap();
    let table = c.table().clone();
    let plan = c.plan(&[3, 5], &mut p, &f).unwrap();
    c.abort(&plan).unwrap();
    assert_eq!(c.table(), &table);
    assert_eq!(c.prefetched_slot(3), Some(placed[0].slot));
    c.check_invariants().unwrap();
    // Retried, it is still served from the prefetch.
    let plan = serve(&mut c, &mut f, &mut p, &[3, 5]);
    assert_eq!(plan.prefetched().len(), 1);
    // Misuse is reported, not hidden.
    assert!(c.complete_prefetch(&placed[..1], 99).is_err());
    assert!(c.prefetch(&[8], &f).is_err());
}

#[test]
fn prefetch_never_takes_a_slot_in_flight_nor_more_than_its_slots() {
    // 4 experts, top-1, 2 resident, 1 spare, 1 prefetch slot: 4 slots.
    let mut c = cache(4, 1, 2, 1);
    let (mut f, mut p) = (MockFence::new(), Lru::new());
    serve(&mut c, &mut f, &mut p, &[0]);
    serve(&mut c, &mut f, &mut p, &[1]);
    let reader = f.last_submitted();
    // Evict 0 (read by an earlier submission, completed) for 2.
    f.complete_through(reader - 1);
    serve(&mut c, &mut f, &mut p, &[2]);
    // Free now: expert 0's old slot (its reader completed) and the never-used one.
    let placed = c.prefetch(&[3, 0], &f).unwrap();
    assert_eq!(placed.len(), 1, "one prefetch slot");
    let in_flight: Vec<u32> = c
        .slots()
        .iter()
        .enumerate()
        .filter(|(_, s)| s.last_read.is_some_and(|t| !f.is_complete(t)))
        .map(|(i, _)| i as u32)
        .collect();
    assert!(!in_flight.contains(&placed[0].slot));
    let t = f.submit();
    c.complete_prefetch(&placed, t).unwrap();
    // The spare is still there for a miss while the prefetch slot is held.
    let plan = c.plan(&[0], &mut p, &f).unwrap();
    assert_eq!(plan.uploads()[0].slot, 3);
    c.abort(&plan).unwrap();
    assert!(
        c.prefetch(&[0], &f).unwrap().is_empty(),
        "no second prefetch slot"
    );
    c.settle_prefetch(&[0]).unwrap();
    assert_eq!(c.prefetched().len(), 0);
    c.check_invariants().unwrap();
}

/// Random guesses, routings and fence progress: no slot a submission in flight reads is
/// ever written (by an upload or a prefetch copy), prefetched experts never exceed their
/// slots, and the counters add up.
#[test]
fn random_prefetching_keeps_every_invariant() {
    let (e, k, capacity, width) = (12usize, 3usize, 5usize, 3usize);
    let mut rng = Rng::new(41);
    let mut c = cache(e, k, capacity, width);
    let mut f = MockFence::new();
    let mut p = Lru::new();
    let mut reads: Vec<u64> = vec![0; c.config().total_slots()];
    let (mut used, mut wasted, mut issued) = (0u64, 0u64, 0u64);
    for _ in 0..4_000 {
        let guess: Vec<u32> = (0..width).map(|_| rng.below(e) as u32).collect();
        let placed = c.prefetch(&guess, &f).unwrap();
        for q in &placed {
            let r = reads[q.slot as usize];
            assert!(
                r == 0 || f.is_complete(r),
                "prefetch into a slot read by {r}"
            );
        }
        if !placed.is_empty() {
            if rng.below(8) == 0 {
                c.cancel_prefetch(&placed).unwrap();
            } else {
                let t = f.submit();
                c.complete_prefetch(&placed, t).unwrap();
                issued += placed.len() as u64;
            }
        }
        c.check_invariants().unwrap();
        let n = 1 + rng.below(k);
        let wanted = distinct(&(0..n).map(|_| rng.below(e) as u32).collect::<Vec<_>>());
        let s = c.settle_prefetch(&wanted).unwrap();
        wasted += s.wasted.len() as u64;
        let plan = loop {
            match c.plan(&wanted, &mut p, &f) {
                Ok(plan) => break plan,
                Err(CacheError::NotNow { wait_for, .. }) => f.complete_through(wait_for),
                Err(err) => panic!("unexpected refusal: {err}"),
            }
        };
        used += plan.prefetched().len() as u64;
        for u in plan.uploads() {
            let r = reads[u.slot as usize];
            assert!(r == 0 || f.is_complete(r), "upload into a slot read by {r}");
        }
        if !plan.is_all_hits() {
            let t = f.submit();
            c.complete_uploads(&plan, t).unwrap();
        }
        c.publish(&plan, &mut p).unwrap();
        let t = f.submit();
        c.mark_read(plan.wanted(), t).unwrap();
        for &x in plan.wanted() {
            if let Some(s) = c.table().slot_of(x) {
                reads[s as usize] = t;
            }
        }
        c.check_invariants().unwrap();
        let lag = rng.below(5) as u64;
        f.complete_through(f.last_submitted().saturating_sub(lag));
    }
    let st = c.stats();
    assert_eq!(
        (st.prefetch_issued, st.prefetch_used, st.prefetch_wasted),
        (issued, used, wasted)
    );
    assert!(used > 100 && wasted > 100, "{st:?}");
    // Every issued prefetch was used, wasted, or is still held.
    assert_eq!(issued, used + wasted + c.prefetched().len() as u64);
}

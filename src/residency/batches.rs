//! Splitting one step's routed experts into groups the cache can serve one after another.
//!
//! A plan may hold at most `capacity` distinct experts, and its misses go into the `spares`
//! unpublished slots, so at most `spares` misses per plan. A one-token step always fits
//! (top_k <= capacity, spares = top_k); a multi-token (prefill) step may route to more
//! experts than that, and then runs its experts in batches.

/// Batches of `wanted` (distinct expert ids) for a layer whose cache holds `capacity`
/// published slots and `spares` unpublished ones: the experts already resident first
/// (hits, no upload, no wait), topped up with misses, then misses `min(spares, capacity)`
/// at a time. Every expert appears in exactly one batch; one batch when the step fits.
pub fn expert_batches(
    wanted: &[u32],
    resident: impl Fn(u32) -> bool,
    capacity: usize,
    spares: usize,
) -> Vec<Vec<u32>> {
    let per = spares.min(capacity).max(1);
    let (mut first, misses): (Vec<u32>, Vec<u32>) = wanted.iter().partition(|&&e| resident(e));
    first.truncate(capacity);
    let hits = first.len();
    // Resident experts past `capacity` cannot exist (at most `capacity` are published).
    let room = per.min(capacity.saturating_sub(hits));
    let (top_up, rest) = misses.split_at(room.min(misses.len()));
    first.extend_from_slice(top_up);
    let mut out = Vec::new();
    if !first.is_empty() {
        out.push(first);
    }
    out.extend(rest.chunks(per).map(|c| c.to_vec()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(wanted: &[u32], resident: &[u32], capacity: usize, spares: usize) -> Vec<Vec<u32>> {
        let b = expert_batches(wanted, |e| resident.contains(&e), capacity, spares);
        let mut all: Vec<u32> = b.iter().flatten().copied().collect();
        all.sort_unstable();
        let mut w = wanted.to_vec();
        w.sort_unstable();
        assert_eq!(all, w, "every expert exactly once");
        for g in &b {
            assert!(!g.is_empty() && g.len() <= capacity, "{b:?}");
            let misses = g.iter().filter(|e| !resident.contains(e)).count();
            assert!(misses <= spares, "{b:?}: {misses} misses > {spares} spares");
        }
        b
    }

    #[test]
    fn a_step_that_fits_is_one_batch() {
        assert_eq!(check(&[3, 1, 2], &[1], 4, 3), vec![vec![1, 3, 2]]);
        assert_eq!(check(&[5, 6], &[], 2, 2), vec![vec![5, 6]]);
    }

    #[test]
    fn hits_first_then_misses_a_spare_set_at_a_time() {
        // capacity 4, spares 2: hits 7, 8; then 2 misses top the first batch up.
        let b = check(&[1, 7, 2, 8, 3, 4, 5], &[7, 8], 4, 2);
        assert_eq!(b, vec![vec![7, 8, 1, 2], vec![3, 4], vec![5]]);
        // A full cache of hits: misses follow in their own batches.
        let b = check(&[1, 2, 3, 9], &[1, 2, 3], 3, 3);
        assert_eq!(b, vec![vec![1, 2, 3], vec![9]]);
        // Nothing resident, 64 experts, capacity 16, spares 8.
        let wanted: Vec<u32> = (0..64).collect();
        assert_eq!(check(&wanted, &[], 16, 8).len(), 8);
    }

    #[test]
    fn empty_wanted_is_no_batch() {
        assert!(check(&[], &[1], 4, 2).is_empty());
    }
}

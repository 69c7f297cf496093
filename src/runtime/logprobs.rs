//! Log-probabilities of a logits row: the log-softmax over the whole vocabulary in f64
//! (from the raw logits, before temperature or any filter, as OpenAI's `logprobs` report
//! them), one token's value and the N most likely tokens. The evaluation tools' numbers
//! (`wgmoe eval`'s KL divergence, the server's `logprobs`) come from here.

/// log-softmax in f64. A row holding NaN gives NaN everywhere.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let lse = log_sum_exp(logits);
    logits.iter().map(|&x| x as f64 - lse).collect()
}

/// log(sum(exp(x))) of the row, in f64, shifted by its maximum.
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    if !m.is_finite() {
        return m;
    }
    logits
        .iter()
        .map(|&x| (x as f64 - m).exp())
        .sum::<f64>()
        .ln()
        + m
}

/// One chosen token's log-probability and the row's most likely tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    /// The `n` most likely tokens, most likely first (lower id first on ties), with their
    /// log-probabilities.
    pub top: Vec<(u32, f32)>,
}

/// Token `id`'s log-probability in `row` and the row's `n` most likely tokens.
pub fn token_logprob(row: &[f32], id: u32, n: usize) -> TokenLogprob {
    let lse = log_sum_exp(row);
    let lp = |i: usize| (row[i] as f64 - lse) as f32;
    TokenLogprob {
        id,
        logprob: row
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |_| lp(id as usize)),
        top: top_n(row, n)
            .into_iter()
            .map(|i| (i as u32, lp(i)))
            .collect(),
    }
}

/// Indices of the `n` largest values, largest first, lower index first on ties; NaN
/// never ranks.
pub fn top_n(row: &[f32], n: usize) -> Vec<usize> {
    let n = n.min(row.len());
    if n == 0 {
        return Vec::new();
    }
    // A sorted list of at most n candidates, kept while one pass reads the row.
    let mut best: Vec<usize> = Vec::with_capacity(n + 1);
    for (i, &v) in row.iter().enumerate() {
        if v.is_nan() || (best.len() == n && v <= row[best[n - 1]]) {
            continue;
        }
        let at = best.partition_point(|&j| row[j] >= v);
        best.insert(at, i);
        best.truncate(n);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_the_log_softmax() {
        let row = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let ls = log_softmax(&row);
        let total: f64 = ls.iter().map(|x| x.exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
        let t = token_logprob(&row, 2, 3);
        assert!((t.logprob as f64 - ls[2]).abs() < 1e-6);
        // Ties: the lower index first.
        assert_eq!(t.top.iter().map(|x| x.0).collect::<Vec<_>>(), [1, 3, 2]);
        assert!(t.top.iter().all(|x| x.1 <= 0.0));
        assert_eq!(top_n(&row, 0), Vec::<usize>::new());
        assert_eq!(top_n(&row, 9), [1, 3, 2, 0, 4]);
        assert_eq!(top_n(&[f32::NAN, 1.0], 2), [1]);
    }

    #[test]
    fn top_n_matches_a_full_sort() {
        let mut s = 12345u64;
        let row: Vec<f32> = (0..5000)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) % 200) as f32 / 10.0
            })
            .collect();
        let mut all: Vec<usize> = (0..row.len()).collect();
        all.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        for n in [1, 5, 20] {
            assert_eq!(top_n(&row, n), all[..n]);
        }
    }
}

//! Fidelity of one expert precision against another on the same token sequence: KL
//! divergence and top-1 agreement of next-token distributions.

pub use crate::runtime::logprobs::log_softmax;

/// KL(p || q) for the distributions softmax(p_logits), softmax(q_logits), in nats. NaN
/// when either row holds a NaN (or an infinity that makes the softmax undefined): a broken
/// distribution is never reported as a perfect match.
pub fn kl_divergence(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let lp = log_softmax(p_logits);
    let lq = log_softmax(q_logits);
    let kl = lp
        .iter()
        .zip(&lq)
        .map(|(a, b)| a.exp() * (a - b))
        .sum::<f64>();
    // Rounding can make an exact match slightly negative; NaN stays NaN (NaN < 0 is false).
    if kl < 0.0 {
        0.0
    } else {
        kl
    }
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Fidelity {
    pub positions: usize,
    pub mean_kl: f64,
    pub max_kl: f64,
    pub top1_agreement: f64,
}

/// Compare reference rows with candidate rows position by position.
pub fn fidelity(reference: &[Vec<f32>], candidate: &[Vec<f32>]) -> Fidelity {
    let n = reference.len().min(candidate.len());
    if n == 0 {
        return Fidelity::default();
    }
    let mut sum = 0.0;
    let mut max = 0.0f64;
    let mut agree = 0;
    for (r, c) in reference.iter().zip(candidate).take(n) {
        let kl = kl_divergence(r, c);
        sum += kl;
        // f64::max would drop a NaN; a NaN position makes the maximum NaN.
        if kl.is_nan() || kl > max {
            max = kl;
        }
        if crate::runtime::sampling::argmax(r, &[]) == crate::runtime::sampling::argmax(c, &[]) {
            agree += 1;
        }
    }
    Fidelity {
        positions: n,
        mean_kl: sum / n as f64,
        max_kl: max,
        top1_agreement: agree as f64 / n as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_is_nan_not_a_perfect_match() {
        let a = [1.0, 2.0, 3.0];
        let nan = [1.0, f32::NAN, 3.0];
        assert!(kl_divergence(&a, &nan).is_nan());
        assert!(kl_divergence(&nan, &a).is_nan());
        assert!(kl_divergence(&a, &[1.0, f32::INFINITY, 3.0]).is_nan());
        let f = fidelity(&[a.to_vec(), a.to_vec()], &[a.to_vec(), nan.to_vec()]);
        assert!(f.mean_kl.is_nan() && f.max_kl.is_nan(), "{f:?}");
        let f = fidelity(&[a.to_vec(), a.to_vec()], &[nan.to_vec(), a.to_vec()]);
        assert!(
            f.max_kl.is_nan(),
            "a NaN first position stays the max: {f:?}"
        );
    }

    #[test]
    fn kl_is_zero_for_equal_and_positive_for_different() {
        let a = [1.0, 2.0, 3.0];
        assert!(kl_divergence(&a, &a).abs() < 1e-12);
        // shifting logits does not change the distribution
        assert!(kl_divergence(&a, &[11.0, 12.0, 13.0]).abs() < 1e-9);
        let k = kl_divergence(&a, &[3.0, 2.0, 1.0]);
        // p = softmax(1,2,3) = (0.090, 0.245, 0.665): KL = sum p (lp - lq) = 2*(0.665-0.090) = 1.1503
        assert!((k - 1.1503).abs() < 1e-3, "{k}");
    }
}

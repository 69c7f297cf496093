//! Fidelity of one expert precision against another on the same token sequence: KL
//! divergence and top-1 agreement of next-token distributions.

/// log-softmax in f64.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = logits
        .iter()
        .map(|&x| (x as f64 - m).exp())
        .sum::<f64>()
        .ln()
        + m;
    logits.iter().map(|&x| x as f64 - lse).collect()
}

/// KL(p || q) for the distributions softmax(p_logits), softmax(q_logits), in nats.
pub fn kl_divergence(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let lp = log_softmax(p_logits);
    let lq = log_softmax(q_logits);
    lp.iter()
        .zip(&lq)
        .map(|(a, b)| a.exp() * (a - b))
        .sum::<f64>()
        .max(0.0)
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
        max = max.max(kl);
        if crate::sampling::argmax(r, &[]) == crate::sampling::argmax(c, &[]) {
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

//! Comparing kernel outputs with their CPU references.
//!
//! A difference is measured as `|gpu - cpu| / max(1, rms(cpu), |cpu|)`: relative to the
//! output's magnitude, so that a dot product that cancels to near zero is judged by the
//! size of its terms, not by its small result. A failure prints the largest difference
//! and where it is.

/// Fails unless every `|got - want| / max(floor, rms(want), |want|) <= tol`; prints the
/// largest such difference, its index and both values, and returns it.
pub fn check_floor(what: &str, got: &[f32], want: &[f32], tol: f32, floor: f32) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let rms = (want.iter().map(|w| w * w).sum::<f32>() / want.len().max(1) as f32).sqrt();
    let scale = rms.max(floor);
    let mut worst = (0.0f32, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs() / w.abs().max(scale);
        if d > worst.0 || d.is_nan() {
            worst = (d, i);
            if d.is_nan() {
                break;
            }
        }
    }
    let (d, i) = worst;
    eprintln!("{what}: max diff {d:.2e} at [{i}] (tolerance {tol:.0e})");
    assert!(
        d <= tol,
        "{what}: |gpu - cpu| = {d:.3e} at index {i} (gpu {}, cpu {}) exceeds the tolerance {tol:.0e}",
        got[i],
        want[i]
    );
    d
}

/// The house measure: relative to max(1, rms, |want|).
pub fn check(what: &str, got: &[f32], want: &[f32], tol: f32) -> f32 {
    check_floor(what, got, want, tol, 1.0)
}

/// Bit-identical (NaN included).
pub fn check_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad = got
        .iter()
        .zip(want)
        .position(|(g, w)| g.to_bits() != w.to_bits());
    eprintln!(
        "{what}: {}",
        if bad.is_none() {
            "bit-identical"
        } else {
            "DIFFERS"
        }
    );
    if let Some(i) = bad {
        panic!(
            "{what}: index {i}: {} vs {} (must be bit-identical)",
            got[i], want[i]
        );
    }
}

/// `rows` ([T, width]) laid out with `stride` floats per row, the gaps set to `fill`.
pub fn strided(rows: &[f32], width: usize, stride: usize, fill: f32) -> Vec<f32> {
    let t = rows.len() / width;
    let mut v = vec![fill; t * stride];
    for r in 0..t {
        v[r * stride..r * stride + width].copy_from_slice(&rows[r * width..(r + 1) * width]);
    }
    v
}

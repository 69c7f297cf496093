//! `--profile-kernels`' report: the GPU time of each stage and kernel per token, its share,
//! and how busy the GPU was over the decode's wall time (the replays left out).

use serde::Serialize;

use crate::backend::kernel_profile::KernelProfile;
use crate::backend::{KernelTimes, ProfileClock};

#[derive(Clone, Debug, Serialize)]
pub struct ProfileRow {
    pub stage: String,
    pub kernel: String,
    pub dispatches_per_token: f64,
    pub gpu_s_per_token: f64,
    /// Of the phase's GPU time per token.
    pub share: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProfileReport {
    pub clock: ProfileClock,
    /// Decode steps profiled (each a token).
    pub decode_steps: usize,
    /// Decode, per decode token, the costliest first.
    pub profile: Vec<ProfileRow>,
    /// Prefill, per prompt token.
    pub prefill_profile: Vec<ProfileRow>,
    /// The decode rows' sum.
    pub gpu_s_per_token: f64,
    /// Decode wall seconds per token with the replays left out.
    pub wall_s_per_token: Option<f64>,
    /// `gpu_s_per_token / wall_s_per_token` (GPU timestamps only: a wall-clock table counts
    /// submissions and waits as GPU time).
    pub gpu_busy_fraction: Option<f64>,
    /// CPU seconds the host spent recording and submitting a decode step.
    pub host_s_per_token: Option<f64>,
}

fn rows(times: &KernelTimes, per: usize) -> (Vec<ProfileRow>, f64) {
    let per = per.max(1) as f64;
    let total: f64 = times.values().map(|v| v.0).sum::<f64>() / per;
    let mut rows: Vec<ProfileRow> = times
        .iter()
        .map(|((stage, kernel), (s, n))| ProfileRow {
            stage: stage.clone(),
            kernel: kernel.clone(),
            dispatches_per_token: *n as f64 / per,
            gpu_s_per_token: s / per,
            share: if total > 0.0 { s / per / total } else { 0.0 },
        })
        .collect();
    rows.sort_by(|a, b| b.gpu_s_per_token.total_cmp(&a.gpu_s_per_token));
    (rows, total)
}

/// The report of a run whose decode took `decode_s` of wall time (replays included) and
/// `encode_s` of recording; None when no step was profiled.
pub fn report(p: &KernelProfile, decode_s: f64, encode_s: Option<f64>) -> Option<ProfileReport> {
    let clock = p.clock?;
    let (profile, gpu) = rows(&p.decode, p.decode_steps);
    let (prefill_profile, _) = rows(&p.prefill, p.prefill_tokens);
    let steps = p.decode_steps;
    let wall = (steps > 0).then(|| (decode_s - p.decode_replay_s).max(0.0) / steps as f64);
    Some(ProfileReport {
        clock,
        decode_steps: steps,
        profile,
        prefill_profile,
        gpu_s_per_token: gpu,
        wall_s_per_token: wall,
        gpu_busy_fraction: wall
            .filter(|w| *w > 0.0 && clock == ProfileClock::GpuTimestamps)
            .map(|w| gpu / w),
        host_s_per_token: encode_s.filter(|_| steps > 0).map(|e| e / steps as f64),
    })
}

/// The table `run --profile-kernels` prints on stderr.
pub fn render(r: &ProfileReport) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let us = |s: f64| s * 1e6;
    let _ = writeln!(
        o,
        "kernel profile ({}): {} decode steps, GPU {:.1} us per token",
        r.clock.describe(),
        r.decode_steps,
        us(r.gpu_s_per_token)
    );
    let _ = writeln!(
        o,
        "  {:<20} {:<42} {:>9} {:>13} {:>6}",
        "stage", "kernel", "disp/tok", "GPU us/tok", "share"
    );
    for row in &r.profile {
        let _ = writeln!(
            o,
            "  {:<20} {:<42} {:>9.1} {:>13.1} {:>5.1}%",
            row.stage,
            row.kernel,
            row.dispatches_per_token,
            us(row.gpu_s_per_token),
            100.0 * row.share
        );
    }
    match (r.wall_s_per_token, r.gpu_busy_fraction) {
        (Some(w), Some(b)) => {
            let _ = writeln!(
                o,
                "  decode wall {:.1} us per token (replays left out): the GPU busy {:.0}% of it",
                us(w),
                100.0 * b
            );
        }
        (Some(w), None) => {
            let _ = writeln!(
                o,
                "  decode wall {:.1} us per token (replays left out); no busy fraction without GPU timestamps",
                us(w)
            );
        }
        _ => {}
    }
    if let Some(h) = r.host_s_per_token {
        let _ = writeln!(
            o,
            "  host: {:.1} us per token recording and submitting",
            us(h)
        );
    }
    if !r.prefill_profile.is_empty() {
        let g: f64 = r.prefill_profile.iter().map(|x| x.gpu_s_per_token).sum();
        let _ = writeln!(o, "  prefill: GPU {:.1} us per prompt token", us(g));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times(v: &[(&str, &str, f64, usize)]) -> KernelTimes {
        v.iter()
            .map(|(s, k, t, n)| ((s.to_string(), k.to_string()), (*t, *n)))
            .collect()
    }

    #[test]
    fn per_token_figures_shares_and_busy_fraction() {
        let mut p = KernelProfile::default();
        for _ in 0..4 {
            p.add(
                true,
                1,
                times(&[
                    ("attention", "attn", 3e-6, 1),
                    ("experts", "gate_up", 1e-6, 2),
                ]),
                ProfileClock::GpuTimestamps,
                1e-3,
            );
        }
        p.add(
            false,
            8,
            times(&[("attention", "attn", 8e-6, 1)]),
            ProfileClock::GpuTimestamps,
            1e-3,
        );
        // 4 steps in 4.008 ms of wall, 4 ms of it replays: 2 us a token.
        let r = report(&p, 4.008e-3, Some(4e-6)).unwrap();
        assert_eq!(r.decode_steps, 4);
        assert!((r.gpu_s_per_token - 4e-6).abs() < 1e-12);
        assert_eq!(r.profile[0].stage, "attention");
        assert!((r.profile[0].share - 0.75).abs() < 1e-9);
        assert!((r.profile[1].dispatches_per_token - 2.0).abs() < 1e-12);
        assert!((r.wall_s_per_token.unwrap() - 2e-6).abs() < 1e-12);
        assert!((r.gpu_busy_fraction.unwrap() - 2.0).abs() < 1e-6);
        assert!((r.host_s_per_token.unwrap() - 1e-6).abs() < 1e-12);
        assert!((r.prefill_profile[0].gpu_s_per_token - 1e-6).abs() < 1e-12);
        // A wall-clock profile gives no busy fraction.
        p.clock = Some(ProfileClock::WallClock);
        assert!(report(&p, 4.008e-3, None)
            .unwrap()
            .gpu_busy_fraction
            .is_none());
        assert!(report(&KernelProfile::default(), 1.0, None).is_none());
    }
}

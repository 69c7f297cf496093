//! The simulation as a table.

use std::fmt::Write;

use super::SimReport;
use crate::insight::inspect::human;

pub fn render(r: &SimReport) -> String {
    let mut o = String::new();
    let (e, k) = (r.num_experts, r.top_k);
    let _ = writeln!(o, "wgmoe simulate: {} ({})", r.trace, r.model);
    let _ = writeln!(
        o,
        "  {e} experts, top-{k}, MoE layers {:?}; {} ({} prefill, {} decode), {} counted; expert {} B",
        r.moe_layers,
        crate::units::count(r.steps, "step"),
        r.prefill_steps,
        r.decode_steps,
        crate::units::count(r.tokens, "token"),
        r.expert_bytes
    );
    let rec = &r.recorded;
    let _ = writeln!(
        o,
        "  recorded run: {} of {e} resident per layer, {}: {} hits, {} misses (distinct experts per step, from the trace's hit flags)",
        rec.resident_experts_per_layer,
        rec.cache_policy.as_deref().unwrap_or("every expert resident"),
        rec.hits,
        rec.misses
    );
    if let Some(m) = rec.miss_policy.as_deref().filter(|m| *m != "upload") {
        let _ = writeln!(
            o,
            "  note: the run's misses went by --miss-policy {m} (CPU misses admit experts only in prefill); the policies below upload every miss, so their counts differ from the run's"
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "Coverage: {:.1} of {e} experts touched per layer (mean); uniform routing expects E(1-(1-k/E)^n) = {e}(1-(1-{k}/{e})^{}) = {:.1}",
        r.mean_experts_touched, r.tokens, r.uniform_expected_touched
    );
    let caps: Vec<String> = r
        .capacities
        .iter()
        .map(|c| format!("top-{}", c.capacity))
        .collect();
    let _ = writeln!(
        o,
        "Skew:  {:>5} {:>8} {:>14}  share of accesses to the layer's {}",
        "layer",
        "touched",
        "entropy bits",
        caps.join(" / ")
    );
    for s in &r.skew {
        let shares: Vec<String> = s.top_share.iter().map(|x| format!("{:.3}", x)).collect();
        let _ = writeln!(
            o,
            "       {:>5} {:>8} {:>7.2} of {:<4.2}  {}",
            s.layer,
            s.experts_touched,
            s.entropy_bits,
            s.max_entropy_bits,
            shares.join(" / ")
        );
    }
    let _ = writeln!(
        o,
        "(the profile policy is fitted on the first {:.0}% of counted steps, {} steps; `held-out` is every policy on the rest)",
        100.0 * r.fit_fraction,
        r.fit_steps
    );
    for c in &r.capacities {
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "Capacity {} of {e} per layer (uniform routing: {:.3})",
            c.capacity,
            c.capacity as f64 / e as f64
        );
        let _ = writeln!(
            o,
            "  {:<16} {:>8} {:>8} {:>9} {:>9} {:>12}  per-layer hit rate",
            "policy", "hits", "misses", "hit rate", "held-out", "H2D"
        );
        for p in &c.policies {
            let mut name = match (p.policy.as_str(), p.decay) {
                (n, Some(d)) => format!("{n} {d}"),
                ("belady", None) => "belady (ceiling)".to_string(),
                (n, None) => n.to_string(),
            };
            if p.prefetch.is_some() {
                name.push_str(" +pf");
            }
            let layers: Vec<String> = p
                .per_layer_hit_rate
                .iter()
                .map(|x| format!("{x:.3}"))
                .collect();
            let _ = writeln!(
                o,
                "  {:<16} {:>8} {:>8} {:>9.3} {:>9.3} {:>12}  {}",
                name,
                p.hits,
                p.misses,
                p.hit_rate,
                p.heldout_hit_rate,
                human(p.h2d_bytes),
                layers.join(" ")
            );
        }
        let pf: Vec<&super::PolicyResult> =
            c.policies.iter().filter(|p| p.prefetch.is_some()).collect();
        if let Some(first) = pf.first() {
            let acc = |a: Option<f64>| a.map_or("-".to_string(), |a| format!("{a:.3}"));
            let layers: Vec<String> = first
                .prefetch_accuracy_per_layer
                .iter()
                .flatten()
                .map(|&a| acc(a))
                .collect();
            let _ = writeln!(
                o,
                "  +pf: --prefetch next-layer with the recorded guesses; guess accuracy {} (per layer {})",
                acc(first.prefetch_accuracy),
                layers.join(" ")
            );
            for p in pf {
                let _ = writeln!(
                    o,
                    "    {:<16} issued {:>7}, used {:>7}, wasted {:>10}",
                    match p.decay {
                        Some(d) => format!("{} {d}", p.policy),
                        None => p.policy.clone(),
                    },
                    p.prefetch_issued.unwrap_or(0),
                    p.prefetch_used.unwrap_or(0),
                    human(p.prefetch_wasted_bytes.unwrap_or(0))
                );
            }
        }
    }
    o
}

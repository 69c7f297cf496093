//! `wgmoe simulate`: a recorded routing trace replayed through the cache policies the
//! runtime uses (`residency::replay`: the same cache, the same batches), against Belady's
//! ceiling, with the measured coverage beside the uniform-routing expectation and the
//! skew of each layer's expert frequencies.

mod table;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::format::trace::{Phase, StepGroups, Trace};
use crate::residency::{
    belady_steps, build_policy, distinct, expected_experts_touched, frequency_ceiling, replay,
    replay_prefetch, PolicyKind, Prefetch, Profile, SimStats,
};

pub use table::render;

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimulateOptions {
    pub capacities: Vec<usize>,
    pub decays: Vec<f64>,
    /// The share of counted steps the static profile is fitted on (scored on the rest).
    pub fit_fraction: f64,
    /// `--prefetch next-layer`: each policy also replayed with the trace's recorded guesses
    /// copied ahead into prefetch slots, as the runtime does.
    pub prefetch: Prefetch,
}

/// One policy at one capacity.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyResult {
    /// `lru`, `lfu-decay`, `profile` or `belady`.
    pub policy: String,
    pub decay: Option<f64>,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub hit_rate: f64,
    /// Over the steps after the profile's fitting part (the same steps for every policy).
    pub heldout_hits: u64,
    pub heldout_misses: u64,
    pub heldout_hit_rate: f64,
    /// Misses x expert bytes: what the policy would upload.
    pub h2d_bytes: u64,
    pub per_layer_hit_rate: Vec<f64>,
    /// `next-layer` for a replay with the recorded guesses copied ahead (null: none). Its
    /// hits count the experts served from a prefetch copy (no wait); its H2D bytes count
    /// every copy, wrong guesses included.
    pub prefetch: Option<Prefetch>,
    pub prefetch_issued: Option<u64>,
    pub prefetch_used: Option<u64>,
    pub prefetch_wasted_bytes: Option<u64>,
    /// Of the routed experts in steps with a guess, the share the guess held.
    pub prefetch_accuracy: Option<f64>,
    pub prefetch_accuracy_per_layer: Option<Vec<Option<f64>>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CapacityResult {
    pub capacity: usize,
    pub policies: Vec<PolicyResult>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LayerSkew {
    pub layer: usize,
    /// Distinct experts the counted tokens touched.
    pub experts_touched: usize,
    /// Entropy of the expert frequencies, bits (log2 E for uniform routing).
    pub entropy_bits: f64,
    pub max_entropy_bits: f64,
    /// Per capacity: the share of accesses that went to the layer's top-`capacity` experts.
    pub top_share: Vec<f64>,
}

/// What the trace's own hit flags say the run counted (distinct experts per step).
#[derive(Clone, Debug, Serialize)]
pub struct Recorded {
    pub resident_experts_per_layer: usize,
    pub cache_policy: Option<String>,
    /// The run's `--miss-policy`; every simulated policy uploads its misses.
    pub miss_policy: Option<String>,
    pub hits: u64,
    pub misses: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SimReport {
    pub trace: String,
    pub model: String,
    pub num_experts: usize,
    pub top_k: usize,
    pub moe_layers: Vec<usize>,
    pub expert_bytes: u64,
    pub steps: usize,
    pub prefill_steps: usize,
    pub decode_steps: usize,
    /// Counted tokens (warm-up excluded).
    pub tokens: u64,
    pub fit_fraction: f64,
    /// Steps (of all) the profile is fitted on; the rest are held out.
    pub fit_steps: usize,
    pub recorded: Recorded,
    pub uniform_expected_touched: f64,
    pub mean_experts_touched: f64,
    pub skew: Vec<LayerSkew>,
    pub capacities: Vec<CapacityResult>,
}

fn rate(h: u64, m: u64) -> f64 {
    if h + m == 0 {
        0.0
    } else {
        h as f64 / (h + m) as f64
    }
}

fn add(t: &mut SimStats, s: &SimStats) {
    t.hits += s.hits;
    t.misses += s.misses;
    t.evictions += s.evictions;
}

/// Sums per-step counts over the counted steps, and over the counted held-out ones.
fn sum(per_step: &[SimStats], g: &StepGroups, from: usize) -> (SimStats, SimStats) {
    let mut all = SimStats::default();
    let mut held = SimStats::default();
    for (s, st) in per_step.iter().enumerate() {
        if !g.counted.get(s).copied().unwrap_or(true) {
            continue;
        }
        add(&mut all, st);
        if s >= from {
            add(&mut held, st);
        }
    }
    (all, held)
}

fn layer_counts(
    g: &StepGroups,
    layer: usize,
    k: usize,
    e: usize,
    steps: std::ops::Range<usize>,
) -> Vec<u64> {
    let mut c = vec![0u64; e];
    for s in steps {
        if !g.counted[s] {
            continue;
        }
        for tok in g.steps[layer][s].chunks(k.max(1)) {
            for x in distinct(tok) {
                if let Some(v) = c.get_mut(x as usize) {
                    *v += 1;
                }
            }
        }
    }
    c
}

/// Simulate every policy over `trace` at each capacity of `o`.
pub fn simulate(trace: &Trace, o: &SimulateOptions) -> Result<SimReport> {
    let h = &trace.header;
    let (e, k) = (h.num_experts, h.top_k);
    for &c in &o.capacities {
        if c < k || c > e {
            return Err(Error::option(
                "--capacity",
                format!("{c} is outside top_k..=num_experts = {k}..={e} of the trace"),
            ));
        }
    }
    if o.capacities.is_empty() {
        return Err(Error::option("--capacity", "give at least one capacity"));
    }
    if !(o.fit_fraction > 0.0 && o.fit_fraction < 1.0) {
        return Err(Error::option(
            "--fit",
            format!("{} is not in (0, 1)", o.fit_fraction),
        ));
    }
    for &d in &o.decays {
        crate::residency::LfuDecay::new(d).map_err(|er| Error::option("--decay", er.0))?;
    }
    let g = trace.step_groups();
    // The runtime's width: the longest recorded guess.
    let width = g.guesses.iter().flatten().map(Vec::len).max().unwrap_or(0);
    if o.prefetch.guesses() && width == 0 {
        return Err(Error::option(
            "--prefetch",
            format!(
                "{} records no guesses of the next layer's experts (a trace of decode steps from a wgmoe whose run guessed them: --prefetch next-layer or any trace of version 3)",
                trace.path.display()
            ),
        ));
    }
    let nsteps = g.counted.len();
    let counted_steps = g.counted.iter().filter(|&&c| c).count();
    // The fitting part: the first fit_fraction of the counted steps.
    let want = (o.fit_fraction * counted_steps as f64).ceil() as usize;
    let mut fit_steps = nsteps;
    let mut seen = 0;
    for s in 0..nsteps {
        if seen >= want {
            fit_steps = s;
            break;
        }
        seen += usize::from(g.counted[s]);
    }
    let tokens: u64 = (0..nsteps)
        .filter(|&s| g.counted[s])
        .map(|s| g.tokens[s] as u64)
        .sum();
    let mut profile = Profile::new(h.model.clone(), h.num_layers, e);
    let mut skew = Vec::new();
    let mut touched_sum = 0usize;
    for (i, &layer) in g.layers.iter().enumerate() {
        profile.counts[layer] = layer_counts(&g, i, k, e, 0..fit_steps);
        let counts = layer_counts(&g, i, k, e, 0..nsteps);
        let total: u64 = counts.iter().sum();
        let p: Vec<f64> = counts
            .iter()
            .map(|&c| {
                if total == 0 {
                    0.0
                } else {
                    c as f64 / total as f64
                }
            })
            .collect();
        let entropy = -p
            .iter()
            .filter(|&&x| x > 0.0)
            .map(|&x| x * x.log2())
            .sum::<f64>();
        let touched = counts.iter().filter(|&&c| c > 0).count();
        touched_sum += touched;
        skew.push(LayerSkew {
            layer,
            experts_touched: touched,
            entropy_bits: entropy,
            max_entropy_bits: (e as f64).log2(),
            top_share: o
                .capacities
                .iter()
                .map(|&c| frequency_ceiling(&p, c))
                .collect(),
        });
    }
    let mut recorded = Recorded {
        resident_experts_per_layer: h.resident_experts_per_layer,
        cache_policy: h.cache_policy.clone(),
        miss_policy: h.miss_policy.clone(),
        hits: 0,
        misses: 0,
    };
    recorded_counts(trace, &mut recorded);
    let mut capacities = Vec::new();
    for &c in &o.capacities {
        let spares = if c < e { k } else { 0 };
        let mut policies: Vec<(String, Option<f64>, PolicyKind)> =
            vec![("lru".into(), None, PolicyKind::Lru)];
        for &d in &o.decays {
            policies.push(("lfu-decay".into(), Some(d), PolicyKind::LfuDecay));
        }
        policies.push(("profile".into(), None, PolicyKind::Profile));
        let mut results = Vec::new();
        for (name, decay, kind) in policies {
            let mut per_layer: Vec<Vec<SimStats>> = Vec::new();
            // One policy object for every layer, as the runtime has.
            let mut p = build_policy(kind, decay.unwrap_or(1.0), Some(&profile), c)
                .map_err(|er| Error::option("--capacity", er.0))?;
            for (i, &layer) in g.layers.iter().enumerate() {
                per_layer.push(
                    replay(layer, &g.steps[i], e, k, c, p.as_mut())
                        .map_err(|er| Error::bad_file(&trace.path, er.0))?,
                );
            }
            results.push(result(
                name.clone(),
                decay,
                &per_layer,
                &g,
                fit_steps,
                h.expert_bytes,
            ));
            if o.prefetch.guesses() && c < e {
                let mut p = build_policy(kind, decay.unwrap_or(1.0), Some(&profile), c)
                    .map_err(|er| Error::option("--capacity", er.0))?;
                let mut per_layer = Vec::new();
                for (i, &layer) in g.layers.iter().enumerate() {
                    // The gated default judges as the runtime does with uploads (the
                    // break-even of a hidden copy).
                    let mut gate = o.prefetch.gated().then(|| {
                        crate::residency::PrefetchGate::new(
                            crate::residency::HIDDEN_COPY_BREAK_EVEN,
                        )
                    });
                    per_layer.push(
                        replay_prefetch(
                            layer,
                            &g.steps[i],
                            &g.guesses[i],
                            e,
                            k,
                            c,
                            width,
                            p.as_mut(),
                            gate.as_mut(),
                        )
                        .map_err(|er| Error::bad_file(&trace.path, er.0))?,
                    );
                }
                results.push(prefetch_result(
                    name,
                    decay,
                    &per_layer,
                    &g,
                    fit_steps,
                    h.expert_bytes,
                    o.prefetch,
                ));
            }
        }
        let per_layer: Vec<Vec<SimStats>> = g
            .steps
            .iter()
            .map(|steps| belady_steps(steps, c, spares))
            .collect();
        results.push(result(
            "belady".into(),
            None,
            &per_layer,
            &g,
            fit_steps,
            h.expert_bytes,
        ));
        capacities.push(CapacityResult {
            capacity: c,
            policies: results,
        });
    }
    let layers = g.layers.len().max(1);
    Ok(SimReport {
        trace: trace.path.display().to_string(),
        model: h.model.clone(),
        num_experts: e,
        top_k: k,
        moe_layers: g.layers.clone(),
        expert_bytes: h.expert_bytes,
        steps: nsteps,
        prefill_steps: g.phase.iter().filter(|&&p| p == Phase::Prefill).count(),
        decode_steps: g.phase.iter().filter(|&&p| p == Phase::Decode).count(),
        tokens,
        fit_fraction: o.fit_fraction,
        fit_steps,
        recorded,
        uniform_expected_touched: expected_experts_touched(e, k, tokens),
        mean_experts_touched: touched_sum as f64 / layers as f64,
        skew,
        capacities,
    })
}

fn result(
    policy: String,
    decay: Option<f64>,
    per_layer: &[Vec<SimStats>],
    g: &StepGroups,
    fit_steps: usize,
    expert_bytes: u64,
) -> PolicyResult {
    let mut all = SimStats::default();
    let mut held = SimStats::default();
    let mut rates = Vec::new();
    for steps in per_layer {
        let (a, h) = sum(steps, g, fit_steps);
        rates.push(rate(a.hits, a.misses));
        all.hits += a.hits;
        all.misses += a.misses;
        all.evictions += a.evictions;
        held.hits += h.hits;
        held.misses += h.misses;
    }
    PolicyResult {
        policy,
        decay,
        hits: all.hits,
        misses: all.misses,
        evictions: all.evictions,
        hit_rate: rate(all.hits, all.misses),
        heldout_hits: held.hits,
        heldout_misses: held.misses,
        heldout_hit_rate: rate(held.hits, held.misses),
        h2d_bytes: all.misses * expert_bytes,
        per_layer_hit_rate: rates,
        prefetch: None,
        prefetch_issued: None,
        prefetch_used: None,
        prefetch_wasted_bytes: None,
        prefetch_accuracy: None,
        prefetch_accuracy_per_layer: None,
    }
}

/// A replay with prefetch: experts served from a prefetch copy count as hits (the step
/// found them on the device), every copy (used or not) as H2D bytes.
fn prefetch_result(
    policy: String,
    decay: Option<f64>,
    per_layer: &[Vec<crate::residency::PrefetchSimStats>],
    g: &StepGroups,
    fit_steps: usize,
    expert_bytes: u64,
    prefetch: Prefetch,
) -> PolicyResult {
    let as_hits: Vec<Vec<SimStats>> = per_layer
        .iter()
        .map(|steps| {
            steps
                .iter()
                .map(|s| SimStats {
                    hits: s.cache.hits + s.used,
                    ..s.cache
                })
                .collect()
        })
        .collect();
    let mut r = result(policy, decay, &as_hits, g, fit_steps, expert_bytes);
    let (mut issued, mut used, mut wasted, mut held, mut guessed) = (0, 0, 0, 0, 0);
    let mut acc = Vec::new();
    for steps in per_layer {
        let (mut lh, mut lg) = (0u64, 0u64);
        for (s, st) in steps.iter().enumerate() {
            if !g.counted.get(s).copied().unwrap_or(true) {
                continue;
            }
            issued += st.issued;
            used += st.used;
            wasted += st.wasted;
            lh += st.predicted;
            lg += st.guessed;
        }
        held += lh;
        guessed += lg;
        acc.push((lg > 0).then(|| lh as f64 / lg as f64));
    }
    r.h2d_bytes += issued * expert_bytes;
    r.prefetch = Some(prefetch);
    r.prefetch_issued = Some(issued);
    r.prefetch_used = Some(used);
    r.prefetch_wasted_bytes = Some(wasted * expert_bytes);
    r.prefetch_accuracy = (guessed > 0).then(|| held as f64 / guessed as f64);
    r.prefetch_accuracy_per_layer = Some(acc);
    r
}

/// Hits and misses as the run counted them: per (step, layer), the distinct experts and
/// whether each was resident (the trace's hit flags).
fn recorded_counts(trace: &Trace, r: &mut Recorded) {
    let mut key: Option<(u64, usize)> = None;
    let mut seen: Vec<u32> = Vec::new();
    for line in &trace.lines {
        if key != Some((line.step, line.layer)) {
            key = Some((line.step, line.layer));
            seen.clear();
        }
        for (&e, &hit) in line.experts.iter().zip(&line.hit) {
            if seen.contains(&e) {
                continue;
            }
            seen.push(e);
            if line.warmup {
                continue;
            }
            if hit {
                r.hits += 1;
            } else {
                r.misses += 1;
            }
        }
    }
}

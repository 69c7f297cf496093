//! The plan as text: every figure with the arithmetic that gives it.

use std::fmt::Write;

use super::{grouped, PlanReport, TOO_BIG};
use crate::insight::inspect::human;
use crate::residency::MissPolicy;

fn describe(m: MissPolicy) -> &'static str {
    match m {
        MissPolicy::Upload => "uploaded from host RAM, computed on the GPU",
        MissPolicy::Cpu => "computed on the CPU from the host copy",
        MissPolicy::Auto => "each uploaded or computed on the CPU, whichever costs less",
    }
}

fn b(n: u64) -> String {
    format!("{} B ({})", grouped(n), human(n))
}

fn params(n: u64) -> String {
    let f = n as f64;
    if f >= 1e9 {
        format!("{:.2} B", f / 1e9)
    } else if f >= 1e6 {
        format!("{:.1} M", f / 1e6)
    } else {
        grouped(n)
    }
}

fn secs(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.2} ms", s * 1e3)
    }
}

pub fn render(r: &PlanReport) -> String {
    let mut o = String::new();
    let (l, e, k) = (r.moe_layers, r.num_experts, r.top_k);
    let _ = writeln!(o, "wgmoe plan: {} ({})", r.model, r.model_type);
    let _ = writeln!(
        o,
        "  {} layers ({l} MoE), {e} routed experts per MoE layer, top-{k}; {} parameters ({} in routed experts)",
        r.num_layers,
        params(r.parameters),
        params(r.routed_parameters)
    );
    let _ = writeln!(o);
    let dense = match (r.dense_precision.as_str(), r.gguf_dense_storage.as_str()) {
        ("q8_0", "") => "dense weights q8_0 (blocks of 32, an f16 scale each), router, norms and embeddings f16".to_string(),
        ("q8_0", own) => format!("dense weights as the GGUF file's blocks where the kernels compute them ({own}), the others q8_0; router, norms and embeddings f16"),
        _ => "f16, rows padded to 8 halves".to_string(),
    };
    let _ = writeln!(
        o,
        "Weights on the GPU ({dense}; routed experts {})",
        r.expert_storage
    );
    let _ = writeln!(
        o,
        "  {:<22} {:>8} {:>12} {:>30}",
        "component", "tensors", "parameters", "bytes"
    );
    for c in &r.components {
        let _ = writeln!(
            o,
            "  {:<22} {:>8} {:>12} {:>30}",
            c.name,
            c.tensors,
            params(c.parameters),
            b(c.bytes)
        );
    }
    let _ = writeln!(
        o,
        "  {:<22} {:>8} {:>12} {:>30}",
        "non-routed total",
        "",
        "",
        b(r.non_routed_bytes)
    );
    let _ = writeln!(
        o,
        "  routed experts, {}:  {l} layers x {e} experts x {} B = {}",
        if r.expert_storage.starts_with("INT4") {
            "INT4"
        } else {
            "GGUF"
        },
        grouped(r.expert_bytes),
        b(r.routed_expert_bytes)
    );
    let _ = writeln!(
        o,
        "  routed experts, FP16:  {l} layers x {e} experts x {} B = {}  (for comparison; partial residency needs INT4)",
        grouped(r.expert_bytes_f16),
        b(r.routed_expert_bytes_f16)
    );
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "Context {} positions, prefill chunk {}",
        r.context, r.prefill_chunk
    );
    let _ = writeln!(
        o,
        "  KV cache:  {} positions x {} B per position ({} keys and values, every layer) = {}",
        r.context,
        grouped(r.kv_cache_bytes_per_position),
        r.kv_precision,
        b(r.kv_cache_bytes)
    );
    let _ = writeln!(
        o,
        "  workspace: activations, RoPE table, readbacks, parameter uniforms (the table the loader allocates) = {}",
        b(r.workspace_bytes)
    );
    let _ = writeln!(o);
    let fixed = r.non_routed_bytes + r.kv_cache_bytes + r.workspace_bytes;
    let upload = r.miss_policy == MissPolicy::Upload;
    let _ = writeln!(
        o,
        "The hot part (on the card at any residency; misses: {})",
        describe(r.miss_policy)
    );
    let _ = writeln!(
        o,
        "  non-routed + KV cache + workspace                = {}",
        b(fixed)
    );
    if r.host_experts_bytes > 0 {
        let _ = writeln!(
            o,
            "  + CPU experts' sum buffer and routing readback    {}",
            b(r.host_experts_bytes)
        );
    }
    if upload && r.min_resident_experts > 0 {
        let _ = writeln!(
            o,
            "  + top_k = {k} expert slots per MoE layer:   {l} x {k} x {} = {}",
            grouped(r.expert_bytes),
            b(r.bytes_per_resident_expert * k as u64)
        );
        let _ = writeln!(
            o,
            "  + {k} spare slots per MoE layer (uploads land there): {}",
            b(r.bytes_per_resident_expert * k as u64)
        );
        if r.prefetch_slots_per_layer > 0 {
            let w = r.prefetch_slots_per_layer;
            let _ = writeln!(
                o,
                "  + {w} prefetch slots per MoE layer (next-layer guesses land there): {}",
                b(r.bytes_per_resident_expert * w as u64)
            );
        }
        let _ = writeln!(
            o,
            "  + {} staging buffers x {} B                = {}",
            r.staging_buffers,
            grouped(r.expert_bytes),
            b(r.staging_bytes)
        );
    }
    let _ = writeln!(
        o,
        "  = hot part                                        {}",
        b(r.hot_bytes)
    );
    let _ = writeln!(
        o,
        "  every expert resident (no spares, no staging):     {}",
        b(r.all_resident_bytes)
    );
    let _ = writeln!(o);
    let _ = writeln!(o, "Fit on {}", b(r.vram_bytes));
    match r.resident_experts_per_layer {
        Some(n) if n == e => {
            let _ = writeln!(
                o,
                "  every expert fits: {} <= {} -> {e} of {e} experts per layer resident",
                grouped(r.all_resident_bytes),
                grouped(r.vram_bytes)
            );
        }
        Some(n) => {
            let per = r.bytes_per_resident_expert.max(1);
            let _ = writeln!(
                o,
                "  each further resident expert per layer costs {l} x {} = {} B",
                grouped(r.expert_bytes),
                grouped(r.bytes_per_resident_expert)
            );
            if upload {
                let formula = k as u64 + r.vram_bytes.saturating_sub(r.hot_bytes) / per;
                let _ = writeln!(
                    o,
                    "  {k} + floor(({} - {}) / {}) = {formula}{} -> {n} of {e} experts per layer resident ({:.0}%)",
                    grouped(r.vram_bytes),
                    grouped(r.hot_bytes),
                    grouped(per),
                    if formula != n as u64 {
                        format!(" (every expert needs {}: at most {})", grouped(r.all_resident_bytes), e - 1)
                    } else {
                        String::new()
                    },
                    100.0 * n as f64 / e as f64
                );
            } else {
                // n resident plus min(top_k, n) spares, and the staging buffers once n > 0.
                let _ = writeln!(
                    o,
                    "  n resident + min({k}, n) spare slots{} per layer, + {} staging buffers once n > 0: the most within {} is n = {n} of {e} ({:.0}%), {} + {} slots x {} B{}",
                    if r.prefetch_width > 0 {
                        format!(" + {} prefetch slots", r.prefetch_width)
                    } else {
                        String::new()
                    },
                    r.staging_buffers,
                    grouped(r.vram_bytes),
                    100.0 * n as f64 / e as f64,
                    grouped(r.hot_bytes),
                    n + r.spare_slots_per_layer + r.prefetch_slots_per_layer,
                    grouped(per),
                    if n > 0 {
                        format!(" + {} B staging", grouped(r.staging_bytes))
                    } else {
                        String::new()
                    }
                );
                prefetch_blocks(&mut o, r, n);
            }
        }
        None => {
            let _ = writeln!(
                o,
                "  does not fit: the hot part needs {} more than the card has",
                b(r.hot_bytes.saturating_sub(r.vram_bytes))
            );
        }
    }
    if !upload {
        match r.resident_experts_per_layer_upload {
            Some(n) => {
                let _ = writeln!(
                    o,
                    "  with --miss-policy upload (top_k resident at least, top_k spares): {n} of {e} experts per layer"
                );
            }
            None => {
                let _ = writeln!(
                    o,
                    "  with --miss-policy upload (top_k resident at least, top_k spares): does not fit"
                );
            }
        }
    }
    if let Some(g) = r.gpu_bytes {
        let _ = writeln!(o, "  GPU bytes at that residency: {}", b(g));
    }
    let _ = writeln!(o);
    let ram = match (r.ram_bytes, &r.ram_source) {
        (Some(ram), Some(src)) => format!("{} ({src})", b(ram)),
        _ => "unknown (not checked; give --ram)".to_string(),
    };
    let _ = writeln!(
        o,
        "Host RAM holds what stays on the host while the model runs: below full residency the source of the experts, every one as INT4. Loading streams the weights from the memory-mapped files, so nothing else must fit in RAM."
    );
    if r.resident_experts_per_layer == Some(e) {
        let _ = writeln!(o, "  every expert resident: nothing stays; RAM {ram}");
    } else {
        let _ = writeln!(
            o,
            "  the source: {l} x {e} x {} = {}; RAM {ram}{}",
            grouped(r.expert_bytes),
            b(r.routed_expert_bytes),
            match r.ram_bytes {
                Some(ram) if ram < r.routed_expert_bytes => " (too small)",
                _ => "",
            }
        );
    }
    if r.verdict == TOO_BIG && r.cluster.is_none() {
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "Too big for this machine: the card holds {} and the host RAM cannot hold the source of the rest. Either of these runs it:",
            match r.resident_experts_per_layer {
                Some(n) => format!("{n} of {e} experts per layer"),
                None => "not even the hot part".to_string(),
            }
        );
        let _ = writeln!(
            o,
            "  a card with at least {}: every expert resident, nothing kept in RAM (`wgmoe plan --vram` with that size)",
            b(r.all_resident_bytes)
        );
        let _ = writeln!(
            o,
            "  host RAM of at least {} for partial residency on this card",
            b(r.routed_expert_bytes)
        );
    }
    if let Some(c) = &r.cluster {
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "Too big for one machine: no single GPU of {} holds its {} of INT4 weights, and the host RAM cannot hold the experts' source. Serving it takes several GPUs:",
            human(c.gpu_memory_bytes),
            b(r.non_routed_bytes.saturating_add(r.routed_expert_bytes)),
        );
        for n in &c.needs {
            let range = |(a, b): (u64, u64)| {
                if a == b {
                    a.to_string()
                } else {
                    format!("{a}-{b}")
                }
            };
            let servers = if n.servers_of_8 == (1, 1) {
                "1 server".to_string()
            } else {
                format!("{} servers", range(n.servers_of_8))
            };
            let _ = writeln!(
                o,
                "  {:<5} {:>32}  ({}): at least {}; {} with 20-30% headroom = {servers} of 8",
                n.precision,
                b(n.weight_bytes),
                n.rule,
                crate::units::count(n.min_gpus, "GPU"),
                range(n.gpus_with_headroom),
            );
        }
        let _ = writeln!(o, "  engines built for that:");
        for e in &c.engines {
            let _ = writeln!(o, "    - {e}");
        }
        let _ = writeln!(
            o,
            "  wgmoe runs one model on one machine; it does not split a model across GPUs."
        );
    }
    if r.verdict != TOO_BIG {
        let _ = writeln!(o);
        prediction(&mut o, r);
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "Verdict: {}", r.verdict);
    match &r.command {
        Some(c) => {
            let _ = writeln!(o, "Run it:\n  {c}");
        }
        None if r.resident_experts_per_layer.is_none() => {
            let _ = writeln!(
                o,
                "Nothing to run on this card: a card with at least {} (or a shorter --ctx-size) holds the hot part.",
                b(r.hot_bytes)
            );
        }
        None => {}
    }
    o
}

fn prediction(o: &mut String, r: &PlanReport) {
    let Some(bw) = &r.bandwidths else {
        let _ = writeln!(
            o,
            "Predicted decode: no bandwidths (run `wgmoe devices --measure` on the adapter, or give --device-gbps and --h2d-gbps)"
        );
        return;
    };
    let _ = writeln!(
        o,
        "Bandwidths: device read {:.1} GB/s, host->device {:.1} GB/s, CPU experts {}, round trip {} ({}){}",
        bw.device_read_gbps,
        bw.h2d_gbps,
        bw.cpu_expert_gbps
            .map_or("not measured (--cpu-gbps)".to_string(), |c| format!("{c:.1} GB/s")),
        bw.round_trip_s
            .map_or("not measured (--round-trip-us)".to_string(), |r| format!(
                "{:.1} us",
                r * 1e6
            )),
        bw.source,
        if bw.software_adapter {
            "; a software adapter: these are CPU numbers"
        } else {
            ""
        }
    );
    for p in &r.predictions {
        let (l, k) = (r.moe_layers, r.top_k);
        // Every expert resident: no miss to describe (issue 39, 8).
        let misses = if r.resident_experts_per_layer == Some(r.num_experts) {
            "none: every expert resident".to_string()
        } else {
            describe(p.miss_policy).to_string()
        };
        let _ = writeln!(
            o,
            "Predicted decode (misses {misses}; hit rate {:.3}, {}):",
            p.hit_rate, p.hit_rate_source
        );
        let cpu = p.miss_policy == MissPolicy::Cpu;
        let _ = writeln!(
            o,
            "  bytes read per token = non-routed weights (one embedding row) + {l} x {k} {} x {} B + KV cache = {}",
            if cpu { "x hit rate experts" } else { "experts" },
            grouped(r.expert_bytes),
            b(p.bytes_read_per_token)
        );
        let _ = writeln!(
            o,
            "  t_compute  = {} B / {:.1} GB/s = {}",
            grouped(p.bytes_read_per_token),
            bw.device_read_gbps,
            secs(p.t_compute_s)
        );
        let _ = writeln!(
            o,
            "  misses per token = {l} x {k} x (1 - {:.3}) = {:.2}; bytes not resident = {:.2} x {} B = {}",
            p.hit_rate,
            p.misses_per_token,
            p.misses_per_token,
            grouped(r.expert_bytes),
            b(p.bytes_not_resident_per_token.round() as u64)
        );
        if cpu {
            let _ = writeln!(
                o,
                "  t_cpu      = {} B / {:.1} GB/s = {}",
                grouped(p.bytes_not_resident_per_token.round() as u64),
                bw.cpu_expert_gbps.unwrap_or(0.0),
                secs(p.t_cpu_s)
            );
            sync_line(o, bw, p);
            let _ = writeln!(
                o,
                "  t_token = t_compute + t_cpu + t_sync = {} -> {:.2} tokens/s (CPU and device time added, no overlap counted)",
                secs(p.t_token_s),
                p.tokens_per_s
            );
        } else {
            let _ = writeln!(
                o,
                "  t_transfer = {} B / {:.1} GB/s = {}",
                grouped(p.bytes_not_resident_per_token.round() as u64),
                bw.h2d_gbps,
                secs(p.t_transfer_s)
            );
            sync_line(o, bw, p);
            if let (Some(acc), true) = (r.prefetch_accuracy, r.prefetch_slots_per_layer > 0) {
                let _ = writeln!(
                    o,
                    "  t_hidden   = min({acc:.3} x t_transfer, t_compute - wrong guesses' {} B / {:.1} GB/s) = {} (--prefetch next-layer, accuracy {})",
                    grouped(p.prefetch_wasted_bytes_per_token.round() as u64),
                    bw.h2d_gbps,
                    secs(p.t_prefetch_hidden_s),
                    r.prefetch_accuracy_source.as_deref().unwrap_or("given")
                );
                let _ = writeln!(
                    o,
                    "  t_token = t_compute + t_transfer - t_hidden + t_sync = {} -> {:.2} tokens/s",
                    secs(p.t_token_s),
                    p.tokens_per_s
                );
            } else {
                let _ = writeln!(
                    o,
                    "  t_token = t_compute + t_transfer + t_sync = {} -> {:.2} tokens/s",
                    secs(p.t_token_s),
                    p.tokens_per_s
                );
                if r.prefetch_slots_per_layer > 0 {
                    let _ = writeln!(
                        o,
                        "  (--prefetch next-layer hides part of t_transfer: give a trace's measured guess accuracy with --prefetch-trace t.jsonl to predict it)"
                    );
                }
            }
        }
    }
    if r.miss_policy == MissPolicy::Auto && r.predictions.len() > 1 {
        let _ = writeln!(
            o,
            "  auto serves each miss the cheaper way: predicted {:.2} tokens/s (the faster of the two)",
            r.predicted_decode_tokens_per_s.unwrap_or(0.0)
        );
    }
    if r.predictions
        .iter()
        .any(|p| p.hit_rate_source.starts_with("uniform"))
    {
        let _ = writeln!(
            o,
            "  (routing is rarely uniform: measure yours with `wgmoe run ... --trace t.jsonl`, `wgmoe simulate t.jsonl --capacity N`, and pass its hit rate as --hit-rate)"
        );
    }
}

fn sync_line(o: &mut String, bw: &super::Bandwidths, p: &super::Prediction) {
    let _ = match bw.round_trip_s {
        Some(r) => writeln!(
            o,
            "  t_sync     = {} x {:.1} us = {}",
            crate::units::count(p.sync_points_per_token, "sync point"),
            r * 1e6,
            secs(p.t_sync_s)
        ),
        None => writeln!(
            o,
            "  t_sync     = not counted ({} per token; no round trip measured, --round-trip-us)",
            crate::units::count(p.sync_points_per_token, "sync point")
        ),
    };
}

/// Below full residency with prefetch on: what one more resident expert per layer would
/// need with its prefetch slots, and the residency `--prefetch off` gives where those
/// slots are what stand in the way (issue 39, 7).
fn prefetch_blocks(o: &mut String, r: &PlanReport, n: usize) {
    if let (Some(next), Some(m)) = (r.next_resident_bytes, r.resident_experts_without_prefetch) {
        let _ = writeln!(
            o,
            "  n = {} needs {} with {} prefetch slots per layer (--prefetch-width {}); with --prefetch off, n = {m} fits",
            n + 1,
            b(next),
            r.prefetch_width,
            r.prefetch_width
        );
    }
}

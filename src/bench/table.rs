//! The readable table of a sweep's records.

use super::record::{config_label, BenchRecord};

pub(super) fn bytes_or_dash(b: Option<u64>) -> String {
    b.map(crate::inspect::human).unwrap_or_else(|| "-".into())
}

/// The records as a readable table, then the notes.
pub fn table(records: &[BenchRecord]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<30} {:>9} {:>7} {:>8} {:>8} {:>9} {:>10} {:>10} {:>8} {:>8} {:>9} {:>10} {:>9}",
        "configuration",
        "decode/s",
        "spread",
        "TTFT s",
        "resp s",
        "prefill/s",
        "peak GPU",
        "peak RSS",
        "disp/tok",
        "subm/tok",
        "miss/tok",
        "H2D",
        "ms/miss"
    );
    for r in records {
        let _ = writeln!(
            o,
            "{:<30} {:>9.2} {:>6.1}% {:>8.3} {:>8.3} {:>9.1} {:>10} {:>10} {:>8.1} {:>8.2} {:>9.2} {:>10} {:>9}",
            config_label(r),
            r.decode_tokens_per_s,
            100.0 * r.block_rate_spread,
            r.ttft_s_mean,
            r.response_s_mean,
            r.prefill_tokens_per_s,
            crate::inspect::human(r.peak_gpu_bytes),
            bytes_or_dash(r.peak_rss_bytes),
            r.dispatches_per_token,
            r.submissions_per_token,
            r.expert_misses_per_token,
            bytes_or_dash(r.h2d_bytes),
            r.upload_seconds_per_miss.map_or("-".to_string(), |s| format!("{:.3}", s * 1e3))
        );
    }
    if let Some(r) = records.first() {
        let _ = writeln!(
            o,
            "{} ({}); adapter {} ({}, {}); {} prompts x {} blocks, {} new tokens (greedy, EOS suppressed), {} warm-up; {} decode tokens per configuration; wgmoe {} {} {}",
            r.model_dir,
            r.model_type,
            r.adapter,
            r.backend,
            r.driver,
            r.prompts,
            r.blocks,
            r.new_tokens,
            r.warmup,
            r.decode_tokens,
            r.wgmoe_version,
            r.git_revision,
            r.date_utc
        );
        if let Some(n) = &r.note {
            let _ = writeln!(o, "note: {n}");
        }
    }
    o
}

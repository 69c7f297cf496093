//! The readable table of a sweep's records.

use super::record::{config_label, BenchRecord};
use crate::units::count;

pub(super) fn bytes_or_dash(b: Option<u64>) -> String {
    b.map(crate::insight::inspect::human)
        .unwrap_or_else(|| "-".into())
}

/// The records as a readable table, each column as wide as its widest cell, then the
/// notes.
pub fn table(records: &[BenchRecord]) -> String {
    use std::fmt::Write;
    let head = [
        "configuration",
        "decode/s",
        "GB/s",
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
        "ms/miss",
        "stall s",
        "pf acc",
    ];
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                config_label(r),
                format!("{:.2}", r.decode_tokens_per_s),
                format!("{:.2}", r.effective_gb_per_s),
                format!("{:.1}%", 100.0 * r.block_rate_spread),
                format!("{:.3}", r.ttft_s_mean),
                format!("{:.3}", r.response_s_mean),
                format!("{:.1}", r.prefill_tokens_per_s),
                crate::insight::inspect::human(r.peak_gpu_bytes),
                bytes_or_dash(r.peak_rss_bytes),
                format!("{:.1}", r.dispatches_per_token),
                format!("{:.2}", r.submissions_per_token),
                format!("{:.2}", r.expert_misses_per_token),
                bytes_or_dash(r.h2d_bytes),
                r.upload_seconds_per_miss
                    .map_or("-".to_string(), |s| format!("{:.3}", s * 1e3)),
                r.upload_stall_seconds
                    .map_or("-".to_string(), |s| format!("{s:.3}")),
                r.prefetch_accuracy
                    .map_or("-".to_string(), |a| format!("{a:.3}")),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..head.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .chain([head[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String]| -> String {
        let mut l = String::new();
        for (c, cell) in cells.iter().enumerate() {
            let w = widths[c];
            if c == 0 {
                let _ = write!(l, "{cell:<w$}");
            } else {
                let _ = write!(l, " {cell:>w$}");
            }
        }
        l.trim_end().to_string()
    };
    let mut o = String::new();
    let _ = writeln!(o, "{}", line(&head.map(String::from)));
    for r in &rows {
        let _ = writeln!(o, "{}", line(r));
    }
    if let Some(r) = records.first() {
        let _ = writeln!(
            o,
            "{} ({}); adapter {} ({}, {}); {} x {}, {} (greedy, EOS suppressed), {}; {} per configuration; wgmoe {} {} {}",
            r.model_dir,
            r.model_type,
            r.adapter,
            r.backend,
            r.driver,
            count(r.prompts, "prompt"),
            count(r.blocks, "block"),
            count(r.new_tokens, "new token"),
            count(r.warmup, "warm-up response"),
            count(r.decode_tokens, "decode token"),
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

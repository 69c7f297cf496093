//! The SVG plot of a sweep: decode rate and H2D bytes against resident experts per layer.

use super::record::{name_of, BenchRecord};
use crate::format::svg::{nice_ticks, tick_label, xml_escape};

/// One line of the plot: a (precision, executor, policy) combination.
#[derive(Clone, Debug)]
pub struct PlotSeries {
    pub label: String,
    /// (resident experts per layer, decode tok/s, H2D bytes), sorted by residency.
    pub points: Vec<(f64, f64, Option<u64>)>,
}

/// The records grouped into plot series, one per (precision, executor, cache policy).
/// A full-residency record has no policy: its point joins every policy series of the same
/// precision and executor (the end of each curve), or stands alone when there is none.
pub fn plot_series(records: &[BenchRecord]) -> Vec<PlotSeries> {
    let pe = |r: &BenchRecord| format!("{}/{}", name_of(&r.expert_precision), name_of(&r.executor));
    let point = |r: &BenchRecord| {
        (
            r.resident_experts_per_layer.unwrap_or(r.num_experts) as f64,
            r.decode_tokens_per_s,
            r.h2d_bytes,
        )
    };
    let mut series: Vec<PlotSeries> = Vec::new();
    let mut push = |label: String, pt: (f64, f64, Option<u64>)| match series
        .iter_mut()
        .find(|s| s.label == label)
    {
        Some(s) => s.points.push(pt),
        None => series.push(PlotSeries {
            label,
            points: vec![pt],
        }),
    };
    // Series in the order their first record appears.
    for r in records {
        let base = pe(r);
        match &r.cache_policy {
            Some(p) => push(format!("{base} {p}"), point(r)),
            None => {
                let policies: Vec<&String> = records
                    .iter()
                    .filter(|q| pe(q) == base)
                    .filter_map(|q| q.cache_policy.as_ref())
                    .collect();
                if policies.is_empty() {
                    push(base, point(r));
                } else {
                    let mut seen: Vec<&String> = Vec::new();
                    for p in policies {
                        if !seen.contains(&p) {
                            seen.push(p);
                            push(format!("{base} {p}"), point(r));
                        }
                    }
                }
            }
        }
    }
    for s in &mut series {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    series
}

/// Bytes unit for an axis whose values reach `max`: (divisor, name).
pub(super) fn byte_unit(max: f64) -> (f64, &'static str) {
    const UNITS: [(f64, &str); 4] = [
        (1024.0 * 1024.0 * 1024.0, "GiB"),
        (1024.0 * 1024.0, "MiB"),
        (1024.0, "KiB"),
        (1.0, "bytes"),
    ];
    UNITS
        .iter()
        .copied()
        .find(|(d, _)| max >= *d)
        .unwrap_or((1.0, "bytes"))
}

/// Round ticks of resident experts within the data's range `lo..=hi` (the axis is drawn a
/// little wider, but no tick names a residency nothing was measured near).
pub(super) fn x_ticks(lo: f64, hi: f64) -> Vec<f64> {
    if hi - lo < 1.0 {
        return vec![lo.round()];
    }
    nice_ticks(lo, hi, 8, true)
        .into_iter()
        .filter(|&t| t >= lo - 1e-9 && t <= hi + 1e-9)
        .collect()
}

pub(super) const PLOT_COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// `wgmoe bench --plot`: a self-contained SVG of decode rate (top panel) and H2D bytes
/// (bottom panel) against resident experts per layer, one polyline with markers per
/// (precision, executor, cache policy) series, axes with ticks and labels, a legend and a
/// title naming the model, adapter and date. One configuration is one marker.
pub fn plot_svg(records: &[BenchRecord]) -> String {
    use std::fmt::Write;
    let series = plot_series(records);
    let (w, h) = (880.0, 660.0);
    let (left, right) = (90.0, 640.0); // plot area x range; the legend is to the right
    let panels = [(85.0, 330.0), (400.0, 600.0)]; // (top, bottom) of each panel
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let (title, subtitle) = match records.first() {
        Some(r) => (
            format!(
                "wgmoe bench: {} ({}{})",
                r.model_dir,
                r.model_type,
                if r.synthetic { ", synthetic" } else { "" }
            ),
            format!(
                "adapter {} ({}, {})\n{} x {}, {}; {}; wgmoe {} {}",
                r.adapter,
                r.backend,
                r.driver,
                crate::units::count(r.prompts, "prompt"),
                crate::units::count(r.blocks, "block"),
                crate::units::count(r.new_tokens, "new token"),
                r.date_utc,
                r.wgmoe_version,
                r.git_revision
            ),
        ),
        None => ("wgmoe bench: no configurations".to_string(), String::new()),
    };
    let _ = writeln!(
        o,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="16" font-weight="bold">{}</text>"#,
        w / 2.0,
        xml_escape(&title)
    );
    for (i, line) in subtitle.lines().enumerate() {
        let _ = writeln!(
            o,
            r##"<text x="{}" y="{}" text-anchor="middle" font-size="11" fill="#444">{}</text>"##,
            w / 2.0,
            42 + 15 * i,
            xml_escape(line)
        );
    }
    // Shared x axis: resident experts per layer.
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    let (mut x0, mut x1) = xs
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        });
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    let xticks = x_ticks(x0, x1);
    if x1 - x0 < 1.0 {
        (x0, x1) = (x0 - 1.0, x1 + 1.0);
    }
    let pad = (x1 - x0) * 0.05;
    let (x0, x1) = ((x0 - pad).max(0.0), x1 + pad);
    let sx = |x: f64| left + (x - x0) / (x1 - x0) * (right - left);
    let h2d_max = series
        .iter()
        .flat_map(|s| s.points.iter().filter_map(|p| p.2))
        .max()
        .unwrap_or(0) as f64;
    let (unit_div, unit) = byte_unit(h2d_max);
    for (pi, &(top, bottom)) in panels.iter().enumerate() {
        let value = |p: &(f64, f64, Option<u64>)| -> Option<f64> {
            if pi == 0 {
                Some(p.1)
            } else {
                p.2.map(|b| b as f64 / unit_div)
            }
        };
        let ymax = series
            .iter()
            .flat_map(|s| s.points.iter().filter_map(value))
            .fold(0.0f64, f64::max);
        let ymax = if ymax > 0.0 { ymax * 1.1 } else { 1.0 };
        let sy = |y: f64| bottom - y / ymax * (bottom - top);
        let ylabel = if pi == 0 {
            "decode tok/s".to_string()
        } else {
            format!("H2D {unit}")
        };
        let _ = writeln!(
            o,
            r#"<g class="panel" data-panel="{}">"#,
            if pi == 0 { "decode" } else { "h2d" }
        );
        for t in nice_ticks(0.0, ymax, 5, false) {
            let y = sy(t);
            let _ = writeln!(
                o,
                r##"<line x1="{left}" y1="{y:.1}" x2="{right}" y2="{y:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                left - 6.0,
                y + 4.0,
                tick_label(t)
            );
        }
        for &t in &xticks {
            let x = sx(t);
            let _ = writeln!(
                o,
                r##"<line x1="{x:.1}" y1="{bottom}" x2="{x:.1}" y2="{:.1}" stroke="#333"/><text class="xtick" x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                bottom + 5.0,
                bottom + 18.0,
                tick_label(t)
            );
        }
        let _ = writeln!(
            o,
            r##"<rect x="{left}" y="{top}" width="{}" height="{}" fill="none" stroke="#333"/>"##,
            right - left,
            bottom - top
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" transform="rotate(-90 {:.1} {:.1})">{}</text>"#,
            left - 55.0,
            (top + bottom) / 2.0,
            left - 55.0,
            (top + bottom) / 2.0,
            xml_escape(&ylabel)
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">resident experts per layer</text>"#,
            (left + right) / 2.0,
            bottom + 36.0
        );
        for (si, s) in series.iter().enumerate() {
            let color = PLOT_COLORS[si % PLOT_COLORS.len()];
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .filter_map(|p| value(p).map(|v| (sx(p.0), sy(v))))
                .collect();
            let label = xml_escape(&s.label);
            if pts.len() >= 2 {
                let list: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
                let _ = writeln!(
                    o,
                    r#"<polyline data-series="{label}" fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
                    list.join(" ")
                );
            }
            for (x, y) in pts {
                let _ = writeln!(
                    o,
                    r#"<circle data-series="{label}" cx="{x:.1}" cy="{y:.1}" r="4" fill="{color}"/>"#
                );
            }
        }
        let _ = writeln!(o, "</g>");
    }
    // Legend.
    let lx = right + 20.0;
    let _ = writeln!(
        o,
        r#"<text x="{lx}" y="{}" font-weight="bold">precision/executor policy</text>"#,
        panels[0].0 + 10.0
    );
    for (si, s) in series.iter().enumerate() {
        let y = panels[0].0 + 30.0 + 20.0 * si as f64;
        let color = PLOT_COLORS[si % PLOT_COLORS.len()];
        let _ = writeln!(
            o,
            r#"<g class="legend"><line x1="{lx}" y1="{y}" x2="{}" y2="{y}" stroke="{color}" stroke-width="2"/><circle cx="{}" cy="{y}" r="4" fill="{color}"/><text x="{}" y="{}">{}</text></g>"#,
            lx + 24.0,
            lx + 12.0,
            lx + 30.0,
            y + 4.0,
            xml_escape(&s.label)
        );
    }
    if records.iter().any(|r| r.synthetic) {
        let _ = writeln!(
            o,
            r##"<text x="{lx}" y="{}" font-size="10" fill="#666">synthetic: uniform routing</text>"##,
            panels[0].0 + 40.0 + 20.0 * series.len() as f64
        );
    }
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::x_ticks;

    #[test]
    fn x_ticks_stay_within_the_data() {
        assert_eq!(x_ticks(7.0, 7.0), vec![7.0]);
        assert_eq!(x_ticks(4.0, 7.0), vec![4.0, 5.0, 6.0, 7.0]);
        let t = x_ticks(30.0, 64.0);
        assert!(
            t.iter().all(|&x| (30.0..=64.0).contains(&x)) && t.len() >= 3,
            "{t:?}"
        );
    }
}

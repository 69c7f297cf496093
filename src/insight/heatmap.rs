//! `wgmoe heatmap`: a trace's layer x expert grid as an SVG (PNG through `render`): the
//! colour of a cell is how many tokens chose that expert, an outline marks the experts on
//! the GPU when the trace ends, a corner triangle the experts the CPU computed, a red dot
//! the experts the cache evicted (its area grows with the count), with axis labels, a
//! colour bar and a legend.

use std::fmt::Write;

use crate::format::svg::{nice_ticks, tick_label, xml_escape};
use crate::format::trace::{Grid, Trace};

/// Viridis at five stops (dark blue -> yellow), interpolated.
const STOPS: [(f64, [f64; 3]); 5] = [
    (0.0, [68.0, 1.0, 84.0]),
    (0.25, [59.0, 82.0, 139.0]),
    (0.5, [33.0, 145.0, 140.0]),
    (0.75, [94.0, 201.0, 98.0]),
    (1.0, [253.0, 231.0, 37.0]),
];

/// The colour of a count relative to the largest one (0: never chosen, light grey).
pub fn color(count: u64, max: u64) -> String {
    if count == 0 || max == 0 {
        return "#eeeeee".to_string();
    }
    let t = (count as f64 / max as f64).clamp(0.0, 1.0);
    let i = STOPS.iter().position(|s| s.0 >= t).unwrap_or(4).max(1);
    let (a, b) = (STOPS[i - 1], STOPS[i]);
    let f = (t - a.0) / (b.0 - a.0);
    let c: Vec<u8> = (0..3)
        .map(|j| (a.1[j] + f * (b.1[j] - a.1[j])).round() as u8)
        .collect();
    format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2])
}

/// Where the grid's labels come from.
pub struct HeatmapLabels {
    pub title: String,
    pub subtitle: String,
    /// e.g. "outlined: on the GPU at the end (3 of 14; cache 4 of 7, lru)".
    pub resident: String,
    /// e.g. "corner: computed on the CPU (12 of 36 token-expert pairs)".
    pub cpu: String,
}

impl HeatmapLabels {
    pub fn of_trace(t: &Trace, g: &Grid) -> Self {
        let h = &t.header;
        let tokens = g.tokens.first().copied().unwrap_or(0);
        let steps = t.lines.last().map_or(0, |l| l.step + 1);
        HeatmapLabels {
            title: format!("Expert activations: {} ({})", h.model, h.model_type),
            subtitle: format!(
                "{} counted over {}; top-{} of {} experts; trace {}",
                crate::units::count(tokens, "token"),
                crate::units::count(steps, "step"),
                h.top_k,
                h.num_experts,
                t.path.display()
            ),
            resident: match &h.cache_policy {
                Some(p) => format!(
                    "outlined: on the GPU at the end ({} of {}; cache {} of {}, {p})",
                    g.resident_count(),
                    g.layers.len() * g.num_experts,
                    h.resident_experts_per_layer,
                    h.num_experts
                ),
                None if h.cpu_layers.is_empty() => {
                    "outlined: on the GPU (every expert)".to_string()
                }
                None => format!(
                    "outlined: on the GPU ({} of {})",
                    g.resident_count(),
                    g.layers.len() * g.num_experts
                ),
            },
            cpu: match g.max_cpu() {
                0 => "corner: computed on the CPU (none in this trace)".to_string(),
                _ => format!(
                    "corner: computed on the CPU ({} of {} token-expert pairs)",
                    g.cpu.iter().flatten().sum::<u64>(),
                    g.counts.iter().flatten().sum::<u64>()
                ),
            },
        }
    }
}

/// The heat map of `g`.
pub fn heatmap_svg(g: &Grid, labels: &HeatmapLabels) -> String {
    let (rows, e) = (g.layers.len().max(1), g.num_experts.max(1));
    let cw = (760.0 / e as f64).floor().clamp(6.0, 44.0);
    let ch = (480.0 / rows as f64).floor().clamp(6.0, 44.0);
    let (left, top) = (80.0, 80.0);
    let (gw, gh) = (cw * e as f64, ch * rows as f64);
    let legend_x = left + gw + 40.0;
    let w = (legend_x + 400.0).max(560.0);
    let h = (top + gh + 70.0).max(top + 290.0);
    let max = g.max_count();
    let max_ev = g.max_evictions();
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{left}" y="26" font-size="16" font-weight="bold">{}</text>"#,
        xml_escape(&labels.title)
    );
    let _ = writeln!(
        o,
        r##"<text x="{left}" y="46" font-size="11" fill="#444">{}</text>"##,
        xml_escape(&labels.subtitle)
    );
    for (r, layer) in g.layers.iter().enumerate() {
        let y = top + ch * r as f64;
        for x in 0..g.num_experts {
            let cx = left + cw * x as f64;
            let (count, ev, cpu) = (g.counts[r][x], g.evictions[r][x], g.cpu[r][x]);
            let resident = g.resident[r][x];
            let _ = writeln!(
                o,
                r##"<rect class="cell" data-layer="{layer}" data-expert="{x}" data-count="{count}" data-resident="{resident}" data-evictions="{ev}" data-cpu="{cpu}" x="{cx:.1}" y="{y:.1}" width="{cw:.1}" height="{ch:.1}" fill="{}" stroke="#ffffff" stroke-width="0.5"/>"##,
                color(count, max)
            );
            if cpu > 0 {
                // A triangle in the lower left corner, white edged so it shows on any colour.
                let t = cw.min(ch) * 0.4;
                let (x0, y0) = (cx + 1.0, y + ch - 1.0);
                let _ = writeln!(
                    o,
                    r##"<path class="cpu" d="M{x0:.1},{y0:.1} L{:.1},{y0:.1} L{x0:.1},{:.1} Z" fill="#222222" stroke="#ffffff" stroke-width="0.5"/>"##,
                    x0 + t,
                    y0 - t
                );
            }
            if resident {
                let _ = writeln!(
                    o,
                    r##"<rect class="resident" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#000000" stroke-width="1.5"/>"##,
                    cx + 1.0,
                    y + 1.0,
                    cw - 2.0,
                    ch - 2.0
                );
            }
            if ev > 0 && max_ev > 0 {
                let rmax = cw.min(ch) * 0.2;
                let rad = (rmax * (ev as f64 / max_ev as f64).sqrt()).max(1.5);
                let _ = writeln!(
                    o,
                    r##"<circle class="evicted" cx="{:.1}" cy="{:.1}" r="{rad:.1}" fill="#e8112d"/>"##,
                    cx + cw - rmax - 1.0,
                    y + rmax + 1.0
                );
            }
        }
    }
    // Axes: experts along x, MoE layers along y.
    let every = |n: usize, room: f64| -> usize {
        (1..=n.max(1))
            .find(|&s| room * s as f64 >= 22.0 && (s == 1 || s % 2 == 0))
            .unwrap_or(n.max(1))
    };
    let xs = every(e, cw);
    for x in (0..e).step_by(xs) {
        let cx = left + cw * (x as f64 + 0.5);
        let _ = writeln!(
            o,
            r##"<line x1="{cx:.1}" y1="{:.1}" x2="{cx:.1}" y2="{:.1}" stroke="#333"/><text x="{cx:.1}" y="{:.1}" text-anchor="middle" font-size="11">{x}</text>"##,
            top + gh,
            top + gh + 4.0,
            top + gh + 16.0
        );
    }
    let ys = every(rows, ch);
    for (r, layer) in g.layers.iter().enumerate().step_by(ys) {
        let cy = top + ch * (r as f64 + 0.5);
        let _ = writeln!(
            o,
            r##"<line x1="{:.1}" y1="{cy:.1}" x2="{left}" y2="{cy:.1}" stroke="#333"/><text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11">{layer}</text>"##,
            left - 4.0,
            left - 7.0,
            cy + 4.0
        );
    }
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">routed expert</text>"#,
        left + gw / 2.0,
        top + gh + 36.0
    );
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" transform="rotate(-90 {:.1} {:.1})">MoE layer</text>"#,
        left - 45.0,
        top + gh / 2.0,
        left - 45.0,
        top + gh / 2.0
    );
    // Legend: the colour bar, then the marks.
    let (bx, by, bh) = (legend_x, top + 18.0, 150.0);
    let _ = writeln!(
        o,
        r#"<text x="{bx}" y="{}" font-weight="bold">tokens routed to the expert</text>"#,
        top + 4.0
    );
    let steps = 30;
    for i in 0..steps {
        let v = max as f64 * (steps - i) as f64 / steps as f64;
        let _ = writeln!(
            o,
            r#"<rect x="{bx}" y="{:.1}" width="16" height="{:.2}" fill="{}"/>"#,
            by + bh * i as f64 / steps as f64,
            bh / steps as f64 + 0.3,
            color(v.ceil() as u64, max)
        );
    }
    for t in nice_ticks(0.0, max.max(1) as f64, 5, true) {
        let y = by + bh - bh * t / max.max(1) as f64;
        let _ = writeln!(
            o,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#333"/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"##,
            bx + 16.0,
            bx + 20.0,
            bx + 24.0,
            y + 4.0,
            tick_label(t)
        );
    }
    let ly = by + bh + 26.0;
    let _ = writeln!(
        o,
        r##"<rect x="{bx}" y="{ly}" width="16" height="12" fill="#eeeeee"/><text x="{}" y="{}" font-size="11">never chosen</text>"##,
        bx + 24.0,
        ly + 10.0
    );
    let _ = writeln!(
        o,
        r##"<rect x="{bx}" y="{}" width="16" height="12" fill="none" stroke="#000000" stroke-width="1.5"/><text x="{}" y="{}" font-size="11">{}</text>"##,
        ly + 20.0,
        bx + 24.0,
        ly + 30.0,
        xml_escape(&labels.resident)
    );
    let _ = writeln!(
        o,
        r##"<path d="M{bx},{} L{},{} L{bx},{} Z" fill="#222222"/><text x="{}" y="{}" font-size="11">{}</text>"##,
        ly + 72.0,
        bx + 12.0,
        ly + 72.0,
        ly + 60.0,
        bx + 24.0,
        ly + 70.0,
        xml_escape(&labels.cpu)
    );
    let ev_label = if max_ev > 0 {
        format!("red dot: evicted (area by count, most {max_ev})")
    } else {
        "red dot: evicted (none in this trace)".to_string()
    };
    let _ = writeln!(
        o,
        r##"<circle cx="{}" cy="{}" r="5" fill="#e8112d"/><text x="{}" y="{}" font-size="11">{ev_label}</text>"##,
        bx + 8.0,
        ly + 46.0,
        bx + 24.0,
        ly + 50.0
    );
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colors_run_from_grey_through_viridis() {
        assert_eq!(color(0, 10), "#eeeeee");
        assert_eq!(color(10, 10), "#fde725");
        assert_eq!(color(5, 10), "#21918c");
        assert_ne!(color(1, 10), color(2, 10));
    }

    #[test]
    fn every_cell_carries_its_numbers() {
        use crate::format::trace::Observed;
        let mut g = Grid::new(vec![0, 3], 3, true);
        let obs = |layer, ids, cpu, evicted, loaded| Observed {
            layer,
            ids,
            hit: &[false; 4],
            cpu,
            evicted,
            loaded,
            top_k: 2,
            counted: true,
        };
        g.observe(&obs(0, &[0, 1, 1, 2], &[], &[], &[0, 1, 2]));
        g.observe(&obs(3, &[2, 0], &[true, false], &[2], &[0, 2]));
        let labels = HeatmapLabels {
            title: "t <&>".into(),
            subtitle: "s".into(),
            resident: "r".into(),
            cpu: "c".into(),
        };
        let svg = heatmap_svg(&g, &labels);
        assert!(svg.contains("t &lt;&amp;&gt;"));
        assert!(svg.contains(r#"data-layer="0" data-expert="1" data-count="2" data-resident="true" data-evictions="0" data-cpu="0""#));
        assert!(svg.contains(r#"data-layer="3" data-expert="2" data-count="1" data-resident="false" data-evictions="1" data-cpu="1""#));
        assert_eq!(svg.matches(r#"class="cell""#).count(), 6);
        assert_eq!(svg.matches(r#"class="evicted""#).count(), 1);
        assert_eq!(svg.matches(r#"class="resident""#).count(), 4);
        assert_eq!(svg.matches(r#"class="cpu""#).count(), 1);
        for label in [
            "routed expert",
            "MoE layer",
            "tokens routed to the expert",
            "never chosen",
        ] {
            assert!(svg.contains(label), "{label}");
        }
    }
}

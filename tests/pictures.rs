//! Pictures: `wgmoe heatmap` (SVG cells carry the trace's counts; the PNG decodes and its
//! pixels are the cells' colours) and `bench --plot FILE.png` (a real PNG, not an SVG under
//! that name).

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::cli::*;
use common::fixture;
use resvg::tiny_skia::Pixmap;
use serde_json::Value;

fn traced_run(dir: &Path) -> std::path::PathBuf {
    let trace = dir.join("t.jsonl");
    let r = wgmoe([
        "run",
        &s(&fixture(QWEN3)),
        "--prompt-ids",
        "5,17,99,3,250,1000,42,7,77,123,9,64",
        "-n",
        "10",
        "--ignore-eos",
        "--resident-experts",
        "4",
        "--miss-policy",
        "upload",
        "--trace",
        &s(&trace),
    ]);
    assert_ok(&r);
    trace
}

/// `attr="value"` of an SVG element.
fn attr<'a>(el: &'a str, name: &str) -> &'a str {
    let key = format!(" {name}=\"");
    let i = el.find(&key).unwrap_or_else(|| panic!("no {name} in {el}")) + key.len();
    &el[i..i + el[i..].find('"').unwrap()]
}

#[test]
fn heatmap_cells_hold_the_traces_counts_and_the_png_shows_them() {
    let t = tempfile::tempdir().unwrap();
    let trace = traced_run(t.path());
    // Counts straight from the trace.
    let mut counts: HashMap<(u64, u64), u64> = HashMap::new();
    let text = std::fs::read_to_string(&trace).unwrap();
    for line in text.lines().skip(1) {
        let v: Value = serde_json::from_str(line).unwrap();
        for e in v["experts"].as_array().unwrap() {
            *counts
                .entry((v["layer"].as_u64().unwrap(), e.as_u64().unwrap()))
                .or_default() += 1;
        }
    }
    let svg_path = t.path().join("map.svg");
    assert_ok(&wgmoe(["heatmap", &s(&trace), "-o", &s(&svg_path)]));
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    for label in [
        "routed expert",
        "MoE layer",
        "tokens routed to the expert",
        "resident at the end (4 of 7 per layer, lru)",
        "evicted",
    ] {
        assert!(svg.contains(label), "the picture explains itself: {label}");
    }
    let cells: Vec<&str> = svg
        .lines()
        .filter(|l| l.contains(r#"class="cell""#))
        .collect();
    assert_eq!(
        cells.len(),
        2 * 7,
        "qwen3moe-tiny: MoE layers 0 and 2, 7 experts"
    );
    let mut resident = HashMap::new();
    for c in &cells {
        let (l, e): (u64, u64) = (
            attr(c, "data-layer").parse().unwrap(),
            attr(c, "data-expert").parse().unwrap(),
        );
        let n: u64 = attr(c, "data-count").parse().unwrap();
        assert_eq!(
            n,
            counts.get(&(l, e)).copied().unwrap_or(0),
            "layer {l} expert {e}"
        );
        *resident.entry(l).or_insert(0) += usize::from(attr(c, "data-resident") == "true");
    }
    assert_eq!(
        resident.values().copied().collect::<Vec<_>>(),
        vec![4, 4],
        "N = 4 resident per layer"
    );
    // The PNG: twice the SVG's size, and each cell's colour where the cell is.
    let png_path = t.path().join("map.png");
    assert_ok(&wgmoe(["heatmap", &s(&trace), "-o", &s(&png_path)]));
    let bytes = std::fs::read(&png_path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let png = Pixmap::decode_png(&bytes).unwrap();
    let head = svg.lines().next().unwrap();
    let (w, h): (f64, f64) = (
        attr(head, "width").parse().unwrap(),
        attr(head, "height").parse().unwrap(),
    );
    assert_eq!(
        (png.width(), png.height()),
        ((2.0 * w) as u32, (2.0 * h) as u32)
    );
    for c in &cells {
        let f = |k| attr(c, k).parse::<f64>().unwrap();
        let (x, y) = (
            2.0 * (f("x") + f("width") * 0.3),
            2.0 * (f("y") + f("height") * 0.7),
        );
        let p = png.pixel(x as u32, y as u32).unwrap();
        let want = attr(c, "fill");
        let got = format!("#{:02x}{:02x}{:02x}", p.red(), p.green(), p.blue());
        assert_eq!(got, want, "cell {c}");
    }
    // Bad input, named.
    assert_error(
        &wgmoe(["heatmap", &s(&trace), "-o", &s(&t.path().join("map.jpg"))]),
        &["--out", ".svg or .png"],
    );
    assert_error(
        &wgmoe(["heatmap", "/nonexistent/t.jsonl", "-o", &s(&svg_path)]),
        &["/nonexistent/t.jsonl"],
    );
}

#[test]
fn bench_plot_writes_a_png_when_asked_for_one() {
    let t = tempfile::tempdir().unwrap();
    let bad = t.path().join("p.gif");
    let r = quick_bench(&fixture(OLMOE), &["-n", "2", "--plot", &s(&bad)]);
    assert_error(&r, &["--plot", ".svg or .png"]);
    assert!(
        !r.stderr.contains("decode"),
        "refused before measuring:\n{r}"
    );
    let png = t.path().join("p.png");
    let r = quick_bench(
        &fixture(OLMOE),
        &["-n", "3", "--resident-experts", "3,7", "--plot", &s(&png)],
    );
    assert_ok(&r);
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(
        &bytes[..8],
        b"\x89PNG\r\n\x1a\n",
        "a PNG, not an SVG named .png"
    );
    let p = Pixmap::decode_png(&bytes).unwrap();
    assert_eq!(
        (p.width(), p.height()),
        (1760, 1320),
        "the plot's 880 x 660 at twice the size"
    );
    // Not blank: the series' colours are drawn.
    let blue = p
        .pixels()
        .iter()
        .filter(|c| c.blue() > 150 && c.red() < 80)
        .count();
    assert!(blue > 50, "{blue} pixels of the first series' colour");
}

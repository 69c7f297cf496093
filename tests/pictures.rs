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
        "on the GPU at the end (8 of 14; cache 4 of 7, lru)",
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

/// Issue 24, defect 3: with CPU experts the heat map outlines what was on the GPU, not
/// every expert chosen, and marks what the CPU computed; the trace's CPU flags are the
/// run's own count of pairs computed on the CPU.
#[test]
fn the_heatmap_shows_what_was_on_the_gpu_and_what_the_cpu_computed() {
    let t = tempfile::tempdir().unwrap();
    for (what, extra) in [
        ("auto", vec!["--resident-experts", "4"]),
        (
            "cpu",
            vec!["--resident-experts", "4", "--miss-policy", "cpu"],
        ),
        ("none resident", vec!["--resident-experts", "0"]),
    ] {
        let trace = t.path().join("t.jsonl");
        let mut args = vec![
            "run".to_string(),
            s(&fixture(QWEN3)),
            "--prompt-ids".into(),
            "5,17,99,3,250,1000,42,7,77,123,9,64".into(),
            "-n".into(),
            "10".into(),
            "--ignore-eos".into(),
            "--json".into(),
            "--trace".into(),
            s(&trace),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let m = json_of(&wgmoe(&args))["metrics"].clone();
        let text = std::fs::read_to_string(&trace).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .skip(1)
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // Every miss of a layer with CPU experts ran on the CPU, unless a copy made ahead
        // from the router's guess (prefetch) served it on the GPU.
        let mut cpu_pairs = 0;
        for v in &lines {
            let hit = v["hit"].as_array().unwrap();
            let cpu = v["cpu"].as_array().cloned().unwrap_or_default();
            let ahead = v["prefetched"].as_array().cloned().unwrap_or_default();
            for (i, h) in hit.iter().enumerate() {
                let on_cpu = cpu.get(i).is_some_and(|c| c == true);
                let prefetched = ahead.get(i).is_some_and(|c| c == true);
                assert_eq!(on_cpu, h == false && !prefetched, "{what}: {v}");
                cpu_pairs += u64::from(on_cpu);
            }
        }
        assert_eq!(cpu_pairs, m["cpu_expert_pairs"].as_u64().unwrap(), "{what}");
        let svg_path = t.path().join("map.svg");
        assert_ok(&wgmoe(["heatmap", &s(&trace), "-o", &s(&svg_path)]));
        let svg = std::fs::read_to_string(&svg_path).unwrap();
        let expected = on_gpu_at_the_end(&lines);
        let mut outlined = 0;
        let mut cpu_cells = 0;
        for c in svg.lines().filter(|l| l.contains(r#"class="cell""#)) {
            let key: (u64, u64) = (
                attr(c, "data-layer").parse().unwrap(),
                attr(c, "data-expert").parse().unwrap(),
            );
            let on = attr(c, "data-resident") == "true";
            assert_eq!(
                on,
                expected.get(&key).copied().unwrap_or(false),
                "{what}: {c}"
            );
            outlined += usize::from(on);
            cpu_cells += usize::from(attr(c, "data-cpu") != "0");
        }
        assert_eq!(
            svg.matches(r#"class="resident""#).count(),
            outlined,
            "{what}"
        );
        assert_eq!(svg.matches(r#"class="cpu""#).count(), cpu_cells, "{what}");
        assert!(cpu_cells > 0, "{what}: the CPU computed misses");
        assert!(
            svg.contains(&format!("on the GPU at the end ({outlined} of 14")),
            "{what}: the legend counts what is outlined"
        );
        assert!(svg.contains("corner: computed on the CPU ("), "{what}");
        if what == "none resident" {
            assert_eq!(outlined, 0, "no expert has a GPU slot");
            assert!(text
                .lines()
                .next()
                .unwrap()
                .contains(r#""cpu_layers":[0,2]"#));
        }
    }
}

/// Issue 24, defect 10: the x axis of a sweep on a 7-expert model names only residencies
/// within the data.
#[test]
fn bench_plot_ticks_stay_within_the_data() {
    let t = tempfile::tempdir().unwrap();
    for (extra, lo, hi) in [(vec![], 7, 7), (vec!["--resident-experts", "4,7"], 4, 7)] {
        let svg = t.path().join("p.svg");
        let mut a = vec!["-n", "2", "--plot"];
        let p = s(&svg);
        a.push(&p);
        a.extend(extra);
        assert_ok(&quick_bench(&fixture(QWEN3), &a));
        let text = std::fs::read_to_string(&svg).unwrap();
        let ticks: Vec<u64> = text
            .lines()
            .filter(|l| l.contains(r#"class="xtick""#))
            .map(|l| {
                let i = l.find(r#"class="xtick""#).unwrap();
                let rest = &l[i..];
                let a = rest.find('>').unwrap() + 1;
                rest[a..a + rest[a..].find('<').unwrap()].parse().unwrap()
            })
            .collect();
        assert!(!ticks.is_empty(), "{text}");
        assert!(
            ticks.iter().all(|&x| (lo..=hi).contains(&x)),
            "ticks {ticks:?} outside {lo}..={hi}"
        );
        assert!(ticks.contains(&lo) && ticks.contains(&hi), "{ticks:?}");
    }
}

//! `--prefetch next-layer` gated by its guesses' precision, and `synth --router-skew`.
//!
//! On a synthetic model whose guesses are poor (uniform random routing), the gated default
//! stops copying them once they are judged, so it moves at most 1.5x the host-to-device
//! bytes of `--prefetch off` where the ungated prefetch moves more; the tokens are those of
//! prefetch off either way. `--router-skew` concentrates each layer's routing on a few
//! experts, measured from the routing counts a run records.

mod common;

use std::path::Path;

use common::cli::{assert_error, assert_ok, json_of, wgmoe};
use serde_json::Value;

const EXPERTS: usize = 32;
const TOP_K: usize = 4;

/// A small OLMoE-shaped synthetic model (32 experts, top-4, 4 layers) with `skew`.
fn synth(out: &Path, skew: &str) {
    assert_ok(&wgmoe([
        "synth",
        "--arch",
        "olmoe-1b-7b",
        "--hidden",
        "64",
        "--layers",
        "4",
        "--heads",
        "4",
        "--experts",
        &EXPERTS.to_string(),
        "--top-k",
        &TOP_K.to_string(),
        "--expert-intermediate",
        "64",
        "--vocab",
        "512",
        "--router-skew",
        skew,
        "-o",
        out.to_str().unwrap(),
    ]));
}

/// `run` at half residency with `--prefetch prefetch`: (generated ids, metrics).
fn run(dir: &Path, prefetch: &str, extra: &[&str]) -> (Vec<u64>, Value) {
    let mut args = vec![
        "run",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "5,17,101,33,250",
        "-n",
        "48",
        "--ignore-eos",
        "--json",
        "--resident-experts",
        "16",
        "--miss-policy",
        "upload",
        "--prefetch",
        prefetch,
    ];
    args.extend_from_slice(extra);
    let v = json_of(&wgmoe(args));
    (common::cli::ids(&v, "generated_ids"), v["metrics"].clone())
}

fn u(m: &Value, k: &str) -> u64 {
    m[k].as_u64()
        .unwrap_or_else(|| panic!("`{k}` is not a count: {m}"))
}

#[test]
fn gated_prefetch_stops_copying_poor_guesses() {
    common::init_env();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    synth(&dir, "0");
    let (ids_off, off) = run(&dir, "off", &[]);
    let (ids_all, all) = run(&dir, "next-layer-ungated", &[]);
    let (ids_gated, gated) = run(&dir, "next-layer", &[]);
    // Prefetch changes where experts are, never what is computed.
    assert_eq!(ids_all, ids_off, "ungated prefetch changed the tokens");
    assert_eq!(ids_gated, ids_off, "gated prefetch changed the tokens");
    let (h_off, h_all, h_gated) = (
        u(&off, "h2d_bytes"),
        u(&all, "h2d_bytes"),
        u(&gated, "h2d_bytes"),
    );
    let issued_all = u(&all, "prefetch_issued");
    let used_all = u(&all, "prefetch_used");
    assert!(issued_all > 0, "{all}");
    let precision = used_all as f64 / issued_all as f64;
    eprintln!(
        "h2d off {h_off} ungated {h_all} gated {h_gated}; ungated precision {precision:.3} ({used_all}/{issued_all}); gated issued {} held back {} gated layers {}",
        u(&gated, "prefetch_issued"),
        u(&gated, "prefetch_held_back"),
        gated["prefetch_gated_layers"]
    );
    // Uniform routing: the guesses are below the break-even (2/3 here), so the gate stops
    // them after its first judgements.
    assert!(
        precision < 0.6,
        "guesses on uniform routing are poor: {precision}"
    );
    assert!(
        h_all > h_gated,
        "ungated moves more than gated: {h_all} vs {h_gated}"
    );
    assert!(
        (h_gated as f64) <= 1.5 * h_off as f64,
        "gated moves at most 1.5x the bytes of prefetch off: {h_gated} vs {h_off}"
    );
    assert!(u(&gated, "prefetch_issued") < issued_all);
    assert!(u(&gated, "prefetch_held_back") > 0, "{gated}");
    let closed = gated["prefetch_gated_layers"]
        .as_array()
        .expect("gated layers");
    assert!(!closed.is_empty(), "{gated}");
    // The first MoE layer makes no guess for itself: only later layers are gated.
    assert!(closed
        .iter()
        .all(|l| l.as_u64().is_some_and(|l| (1..4).contains(&l))));
    // Off and ungated have no gate to close.
    assert_eq!(off["prefetch_gated_layers"], serde_json::json!([]));
    assert_eq!(all["prefetch_gated_layers"], serde_json::json!([]));
    assert_eq!(u(&all, "prefetch_held_back"), 0);
}

/// The share of the routing that went to each layer's `EXPERTS / 8` top-ranked experts
/// (`synth::expert_ranks`, seed 0), from the counts `run --write-profile` records over a
/// prompt of 200 distinct tokens.
fn top_share(dir: &Path, out: &Path) -> f64 {
    let profile = out.join("p.json");
    let prompt: Vec<String> = (0..200)
        .map(|i| ((i * 37 + 11) % 500).to_string())
        .collect();
    let r = wgmoe([
        "run",
        dir.to_str().unwrap(),
        "--prompt-ids",
        &prompt.join(","),
        "-n",
        "1",
        "--write-profile",
        profile.to_str().unwrap(),
    ]);
    assert_ok(&r);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&profile).unwrap()).unwrap();
    let (mut top, mut all) = (0u64, 0u64);
    for (l, row) in v["counts"].as_array().unwrap().iter().enumerate() {
        let ranks = wgmoe::synth::expert_ranks(0, l, EXPERTS);
        for (e, c) in row.as_array().unwrap().iter().enumerate() {
            let c = c.as_u64().unwrap();
            all += c;
            if ranks[e] < EXPERTS / 8 {
                top += c;
            }
        }
    }
    top as f64 / all as f64
}

#[test]
fn router_skew_concentrates_the_routing() {
    common::init_env();
    let tmp = tempfile::tempdir().unwrap();
    let (flat, skewed) = (tmp.path().join("flat"), tmp.path().join("skewed"));
    synth(&flat, "0");
    synth(&skewed, "1");
    let (a, b) = (top_share(&flat, tmp.path()), top_share(&skewed, tmp.path()));
    eprintln!(
        "the top-ranked eighth of the experts: {a:.3} of the routing at skew 0, {b:.3} at skew 1"
    );
    // Unskewed, the ranks mean nothing: those experts get about an eighth of the picks.
    assert!((0.05..0.25).contains(&a), "{a}");
    assert!(
        b > 2.5 * a,
        "skew 1 concentrates the routing on the top ranks: {b} vs {a}"
    );
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(skewed.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg["wgmoe_synthetic_router_skew"], serde_json::json!(1.0));
    // Out of range or not a number: refused, naming the option.
    for bad in ["-1", "4.5", "NaN"] {
        let r = wgmoe([
            "synth",
            "--arch",
            "olmoe-1b-7b",
            "--layers",
            "1",
            &format!("--router-skew={bad}"),
            "-o",
            tmp.path().join("bad").to_str().unwrap(),
        ]);
        assert_error(&r, &["--router-skew"]);
    }
    assert!(!tmp.path().join("bad").exists(), "nothing written");
}

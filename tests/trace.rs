//! Routing traces (`run/bench --trace`) and `wgmoe simulate`: the trace holds one line per
//! (token, MoE layer) with the router's top-k and weights, tracing does not change the
//! tokens, and the simulator (the runtime's own cache and policy code) counts exactly the
//! hits, misses and evictions the run counted, per layer, for every policy.

mod common;

use std::path::Path;

use common::cli::*;
use common::fixture;
use serde_json::Value;

/// 20 prompt tokens: one prefill step that routes to more experts than a small cache holds.
const PROMPT: &str = "5,17,99,3,250,1000,42,7,77,123,9,64,300,11,500,8,901,13,2,400";

fn run_traced(name: &str, trace: &Path, extra: &[&str]) -> Value {
    let mut args = vec![
        "run".to_string(),
        s(&fixture(name)),
        "--json".into(),
        "--prompt-ids".into(),
        PROMPT.into(),
        "-n".into(),
        "12".into(),
        "--ignore-eos".into(),
        "--trace".into(),
        s(trace),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    json_of(&wgmoe(args))
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn simulate(trace: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["simulate".to_string(), s(trace), "--json".into()];
    args.extend(extra.iter().map(|a| a.to_string()));
    json_of(&wgmoe(args))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

#[test]
fn a_trace_holds_every_token_and_layer_and_does_not_change_the_tokens() {
    let t = tempfile::tempdir().unwrap();
    for name in [OLMOE, QWEN3, MIXTRAL] {
        let path = t.path().join(format!("{name}.jsonl"));
        let traced = run_traced(name, &path, &[]);
        let plain = json_of(&wgmoe([
            "run",
            &s(&fixture(name)),
            "--json",
            "--prompt-ids",
            PROMPT,
            "-n",
            "12",
            "--ignore-eos",
        ]));
        assert_eq!(
            ids(&traced, "generated_ids"),
            ids(&plain, "generated_ids"),
            "{name}"
        );
        let v = lines(&path);
        let h = &v[0];
        assert_eq!(h["wgmoe_trace"], 3);
        let cfg = wgmoe::config::ModelConfig::from_dir(&fixture(name)).unwrap();
        let moe: Vec<u64> = (0..cfg.num_layers as u64)
            .filter(|&l| cfg.sparse_layers[l as usize])
            .collect();
        assert_eq!(ids(h, "moe_layers"), moe);
        assert_eq!(u(&h["top_k"]), cfg.top_k as u64);
        assert!(h["cache_policy"].is_null(), "full residency has no policy");
        // Every forward step: 20 prompt tokens, then 11 decoded tokens (the 12th is never fed).
        let recs = &v[1..];
        assert_eq!(recs.len(), (20 + 11) * moe.len(), "{name}");
        let norm = cfg.norm_topk_prob;
        for (i, r) in recs.iter().enumerate() {
            let e = ids(r, "experts");
            assert_eq!(e.len(), cfg.top_k);
            let mut d = e.clone();
            d.dedup();
            d.sort_unstable();
            d.dedup();
            assert_eq!(d.len(), e.len(), "distinct experts per token: {r}");
            assert!(e.iter().all(|&x| x < cfg.num_experts as u64));
            let w: Vec<f64> = r["weights"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            assert!(w.windows(2).all(|p| p[0] >= p[1]), "router order: {r}");
            let sum: f64 = w.iter().sum();
            assert!(
                sum <= 1.0 + 1e-5 && (!norm || (sum - 1.0).abs() < 1e-4),
                "{name}: weights {w:?}"
            );
            assert!(r["hit"].as_array().unwrap().iter().all(|x| x == true));
            let phase = r["phase"].as_str().unwrap();
            let token = u(&r["token"]);
            assert_eq!(phase == "prefill", token < 20, "{r}");
            if i > 0 && u(&recs[i - 1]["step"]) != u(&r["step"]) {
                assert!(u(&r["step"]) == u(&recs[i - 1]["step"]) + 1);
            }
            // Decode steps carry the guess of every MoE layer after the first: top_k
            // distinct experts (the previous MoE layer's hidden state through its router).
            let guess = r
                .get("predicted")
                .map(|_| ids(r, "predicted"))
                .unwrap_or_default();
            if phase == "decode" && u(&r["layer"]) != moe[0] {
                let mut d = guess.clone();
                d.sort_unstable();
                d.dedup();
                assert_eq!(d.len(), cfg.top_k, "{name}: guess {r}");
                assert!(guess.iter().all(|&x| x < cfg.num_experts as u64));
            } else {
                assert!(guess.is_empty(), "{name}: no guess here: {r}");
            }
        }
    }
}

/// With `--prefetch next-layer-ungated` and the gated `next-layer` the run's guess
/// accuracy, copies ahead and copies used are what its trace records, and `simulate
/// --prefetch` of the same kind scores the same guesses (its accuracy is the run's) over
/// the same experts wanted, gating them as the run did.
#[test]
fn a_prefetch_runs_guesses_are_in_its_trace_and_simulate_scores_them() {
    let t = tempfile::tempdir().unwrap();
    for (name, n, kind) in [
        (OLMOE, 3, "next-layer-ungated"),
        (QWEN3, 4, "next-layer-ungated"),
        (MIXTRAL, 3, "next-layer-ungated"),
        (OLMOE, 3, "next-layer"),
        (QWEN3, 4, "next-layer"),
    ] {
        let path = t.path().join(format!("{name}-{n}-{kind}.jsonl"));
        let run = run_traced(
            name,
            &path,
            &[
                "--resident-experts",
                &n.to_string(),
                "--miss-policy",
                "upload",
                "--prefetch",
                kind,
            ],
        );
        let m = &run["metrics"];
        let what = format!("{name} N={n} {kind}");
        assert_eq!(m["prefetch"], kind, "{what}");
        let issued = u(&m["prefetch_issued"]);
        let used = u(&m["prefetch_used"]);
        assert!(used <= issued, "{what}: {m}");
        if kind == "next-layer-ungated" {
            assert!(issued > 0, "{what}: {m}");
        }
        assert!(m["upload_stall_seconds"].as_f64().unwrap() >= 0.0);
        let recs = &lines(&path)[1..];
        let in_trace: u64 = recs
            .iter()
            .map(|r| {
                r.get("prefetch_issued")
                    .map_or(0, |_| ids(r, "prefetch_issued").len() as u64)
            })
            .sum();
        assert_eq!(in_trace, issued, "{what}: copies ahead in the trace");
        let served: u64 = recs
            .iter()
            .map(|r| {
                r.get("prefetched").map_or(0, |p| {
                    p.as_array().unwrap().iter().filter(|x| **x == true).count() as u64
                })
            })
            .sum();
        assert_eq!(served, used, "{what}: experts served from copies ahead");
        let sim = simulate(&path, &["--capacity", &n.to_string(), "--prefetch", kind]);
        let rows = sim["capacities"][0]["policies"].as_array().unwrap();
        let row = rows
            .iter()
            .find(|r| r["policy"] == "lru" && r["prefetch"] == kind)
            .unwrap_or_else(|| panic!("{what}: no prefetch row in {sim}"));
        let acc = m["prefetch_accuracy"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&acc), "{what}");
        let sim_acc = row["prefetch_accuracy"].as_f64().unwrap();
        assert!((sim_acc - acc).abs() < 1e-12, "{what}: {sim_acc} vs {acc}");
        let per_layer = &m["prefetch_accuracy_per_layer"];
        for (i, &l) in ids(&sim, "moe_layers").iter().enumerate() {
            let (a, b) = (
                &row["prefetch_accuracy_per_layer"][i],
                &per_layer[l as usize],
            );
            match (a.as_f64(), b.as_f64()) {
                (Some(a), Some(b)) => assert!((a - b).abs() < 1e-12, "{what} layer {l}"),
                _ => assert_eq!(a, b, "{what} layer {l}"),
            }
        }
        // The same experts wanted; a copy made ahead and used counts as a hit there.
        assert_eq!(
            u(&row["hits"]) + u(&row["misses"]),
            u(&m["expert_hits"]) + u(&m["expert_misses"]) + used,
            "{what}"
        );
        assert_eq!(
            u(&row["h2d_bytes"]),
            (u(&row["misses"]) + u(&row["prefetch_issued"])) * u(&sim["expert_bytes"]),
            "{what}"
        );
        // The gate held back in the simulation what it held back in the run.
        assert_eq!(u(&row["prefetch_issued"]), issued, "{what}: copies ahead");
    }
}

/// The run's counters (its `--json` metrics) equal the simulator's for the same trace,
/// capacity and policy: the simulator is the runtime's cache, policy and expert batches.
#[test]
fn simulated_hits_equal_the_runs_counted_hits() {
    let t = tempfile::tempdir().unwrap();
    for (name, n) in [(OLMOE, 3), (OLMOE, 5), (QWEN3, 4), (MIXTRAL, 3)] {
        for (policy, decay) in [("lru", "0.95"), ("lfu-decay", "0.8")] {
            let path = t.path().join(format!("{name}-{n}-{policy}.jsonl"));
            let run = run_traced(
                name,
                &path,
                &[
                    "--resident-experts",
                    &n.to_string(),
                    "--cache-policy",
                    policy,
                    "--decay",
                    decay,
                    "--miss-policy",
                    "upload",
                    // Copies on demand only: what the rows without prefetch replay.
                    "--prefetch",
                    "off",
                ],
            );
            let m = &run["metrics"];
            assert!(u(&m["expert_misses"]) > 0);
            let sim = simulate(&path, &["--capacity", &n.to_string(), "--decay", decay]);
            let rows = sim["capacities"][0]["policies"].as_array().unwrap();
            let row = rows.iter().find(|r| r["policy"] == policy).unwrap();
            let what = format!("{name} N={n} {policy}");
            assert_eq!(u(&row["hits"]), u(&m["expert_hits"]), "{what}");
            assert_eq!(u(&row["misses"]), u(&m["expert_misses"]), "{what}");
            assert_eq!(u(&row["evictions"]), u(&m["expert_evictions"]), "{what}");
            assert_eq!(u(&row["h2d_bytes"]), u(&m["h2d_bytes"]), "{what}");
            // Per layer, and the trace's own hit flags.
            let hits = ids(m, "expert_hits_per_layer");
            let misses = ids(m, "expert_misses_per_layer");
            for (i, &l) in ids(&sim, "moe_layers").iter().enumerate() {
                let (h, mi) = (hits[l as usize], misses[l as usize]);
                let r = row["per_layer_hit_rate"][i].as_f64().unwrap();
                assert!(
                    (r - h as f64 / (h + mi) as f64).abs() < 1e-12,
                    "{what} layer {l}"
                );
            }
            assert_eq!(u(&sim["recorded"]["hits"]), u(&m["expert_hits"]), "{what}");
            assert_eq!(
                u(&sim["recorded"]["misses"]),
                u(&m["expert_misses"]),
                "{what}"
            );
            // Belady is the ceiling of every row.
            let belady = rows.iter().find(|r| r["policy"] == "belady").unwrap();
            for r in rows {
                assert!(u(&belady["hits"]) >= u(&r["hits"]), "{what}: {r}");
                assert_eq!(
                    u(&r["hits"]) + u(&r["misses"]),
                    u(&m["expert_hits"]) + u(&m["expert_misses"])
                );
            }
            // Evictions are on the lines and add up.
            let evicted: usize = lines(&path)[1..]
                .iter()
                .map(|r| r["evicted"].as_array().map_or(0, |a| a.len()))
                .sum();
            assert_eq!(evicted as u64, u(&m["expert_evictions"]), "{what}");
        }
    }
}

/// With CPU misses the trace's hit flags are the residency each layer was served with
/// (an admission of the previous step published first), so they count what the run
/// counted; the header names the miss policy and simulate says its rows upload instead.
#[test]
fn cpu_miss_traces_count_like_the_run() {
    let t = tempfile::tempdir().unwrap();
    for (name, n, policy) in [(OLMOE, 3, "cpu"), (QWEN3, 4, "cpu"), (MIXTRAL, 3, "auto")] {
        let path = t.path().join(format!("{name}-{policy}.jsonl"));
        // No copies ahead: whether auto copies a guess depends on the start-up figures
        // (timing), and a guess copied and used is counted by the run as neither hit nor
        // miss (tests/trace.rs's prefetch test checks those).
        let run = run_traced(
            name,
            &path,
            &[
                "--resident-experts",
                &n.to_string(),
                "--miss-policy",
                policy,
                "--prefetch",
                "off",
            ],
        );
        let m = &run["metrics"];
        let what = format!("{name} N={n} {policy}");
        assert!(u(&m["cpu_misses"]) > 0, "{what}: {m}");
        assert_eq!(lines(&path)[0]["miss_policy"], policy, "{what}");
        let sim = simulate(&path, &["--capacity", &n.to_string()]);
        assert_eq!(u(&sim["recorded"]["hits"]), u(&m["expert_hits"]), "{what}");
        assert_eq!(
            u(&sim["recorded"]["misses"]),
            u(&m["expert_misses"]),
            "{what}"
        );
        assert_eq!(sim["recorded"]["miss_policy"], policy, "{what}");
        let r = wgmoe(["simulate", &s(&path), "--capacity", &n.to_string()]);
        assert!(r.stdout.contains("upload every miss"), "{r}");
        // Evictions on the lines are the run's (an expert computed on the CPU was never
        // loaded, so it is not evicted).
        let evicted: usize = lines(&path)[1..]
            .iter()
            .map(|r| r["evicted"].as_array().map_or(0, |a| a.len()))
            .sum();
        assert_eq!(evicted as u64, u(&m["expert_evictions"]), "{what}");
    }
}

#[test]
fn bench_traces_mark_warm_up_and_count_like_the_record() {
    let t = tempfile::tempdir().unwrap();
    let trace = t.path().join("b.jsonl");
    let out = t.path().join("b.json");
    let r = quick_bench(
        &fixture(OLMOE),
        &[
            "--prompts",
            "2",
            "-n",
            "4",
            "--warmup",
            "1",
            "--resident-experts",
            "4",
            "--miss-policy",
            "upload",
            // Copies on demand only: what the lru row replays.
            "--prefetch",
            "off",
            "--trace",
            &s(&trace),
            "--json-out",
            &s(&out),
        ],
    );
    assert_ok(&r);
    let rec: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let rec = &rec[0];
    let v = lines(&trace);
    assert!(v[1..].iter().any(|l| l["warmup"] == true));
    assert!(v.last().unwrap().get("warmup").is_none());
    let sim = simulate(&trace, &["--capacity", "4"]);
    let lru = &sim["capacities"][0]["policies"][0];
    assert_eq!(lru["policy"], "lru");
    assert_eq!(u(&lru["hits"]), u(&rec["expert_hits"]));
    assert_eq!(u(&lru["misses"]), u(&rec["expert_misses"]));
    let note = rec["note"].as_str().unwrap_or_default();
    assert!(note.contains("--trace"), "{note}");
    // Two configurations: two files.
    let two = s(&t.path().join("two.jsonl"));
    let r = quick_bench(
        &fixture(OLMOE),
        &["-n", "2", "--resident-experts", "3,7", "--trace", &two],
    );
    assert_ok(&r);
    assert!(
        t.path().join("two.0.jsonl").is_file() && t.path().join("two.1.jsonl").is_file(),
        "{r}"
    );
}

#[test]
fn simulate_tables_and_bad_traces() {
    let t = tempfile::tempdir().unwrap();
    let path = t.path().join("t.jsonl");
    run_traced(QWEN3, &path, &["--resident-experts", "4"]);
    let r = wgmoe(["simulate", &s(&path), "--capacity", "3,4,7"]);
    assert_ok(&r);
    for want in [
        "Coverage:",
        "uniform routing expects",
        "Skew:",
        "belady (ceiling)",
        "lfu-decay 0.5",
        "profile",
        "held-out",
        "Capacity 4 of 7",
    ] {
        assert!(r.stdout.contains(want), "missing `{want}`:\n{r}");
    }
    let sim = simulate(&path, &["--capacity", "7"]);
    // Every expert resident: only cold misses, the same for every policy.
    let rows = sim["capacities"][0]["policies"].as_array().unwrap();
    assert!(rows
        .iter()
        .all(|r| r["misses"] == rows[0]["misses"] && u(&r["evictions"]) == 0));
    let cov = sim["uniform_expected_touched"].as_f64().unwrap();
    let n = u(&sim["tokens"]) as f64;
    assert!((cov - 7.0 * (1.0 - (1.0 - 3.0 / 7.0f64).powf(n))).abs() < 1e-9);
    // Bad input, each named.
    assert_error(
        &wgmoe(["simulate", &s(&path), "--capacity", "2"]),
        &["--capacity", "3..=7"],
    );
    assert_error(&wgmoe(["simulate", &s(&path), "--fit", "1.5"]), &["--fit"]);
    assert_error(
        &wgmoe(["simulate", "/nonexistent/t.jsonl"]),
        &["/nonexistent/t.jsonl"],
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let ls: Vec<String> = text.lines().map(String::from).collect();
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut v: Value = serde_json::from_str(&ls[1]).unwrap();
        f(&mut v);
        v.to_string()
    };
    let cases = [
        (2, "{not json".to_string(), "not a trace record"),
        (1, edit(&|v| v["layer"] = 1.into()), "not an MoE layer"),
        (
            1,
            edit(&|v| v["experts"][0] = 99.into()),
            "expert 99 is outside",
        ),
        (
            1,
            edit(&|v| v["weights"] = serde_json::json!([0.5])),
            "the header's top_k is 3",
        ),
        (1, edit(&|v| v["step"] = 5.into()), "steps must not go back"),
    ];
    for (i, (at, line, want)) in cases.into_iter().enumerate() {
        let mut bad_lines = ls.clone();
        bad_lines[at] = line;
        let bad = t.path().join(format!("bad{i}.jsonl"));
        std::fs::write(&bad, bad_lines.join("\n")).unwrap();
        // The line named is the one edited, or (a step going back) the next one.
        let r = wgmoe(["simulate", &s(&bad)]);
        assert_error(&r, &[&format!("bad{i}.jsonl:"), want]);
    }
    let empty = t.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    assert_error(&wgmoe(["simulate", &s(&empty)]), &["empty.jsonl", "header"]);
    std::fs::write(&empty, "{\"step\":0}\n").unwrap();
    assert_error(
        &wgmoe(["simulate", &s(&empty)]),
        &["empty.jsonl:1", "header"],
    );
    // --trace into a directory that does not exist fails before loading.
    let r = wgmoe([
        "run",
        &s(&fixture(QWEN3)),
        "--prompt-ids",
        "1,2",
        "-n",
        "2",
        "--trace",
        "/nonexistent/dir/t.jsonl",
    ]);
    assert_error(&r, &["--trace", "/nonexistent/dir"]);
}

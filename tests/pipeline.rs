//! The pipelined decode loop (`--pipeline-depth`): steps submitted ahead of the host give
//! the tokens of depth 1 on every family and kernel plan, keep several steps in flight,
//! and a stop in the middle of the steps in flight (EOS, `on_token`) leaves the tokens,
//! the counts and a session's cache as depth 1 does.

mod common;

use common::cli::{MIXTRAL, OLMOE, QWEN, QWEN3};
use common::engine::{load, load_on};
use wgmoe::backend::plan::{DecodeKernels, PrefillKernels};
use wgmoe::backend::KernelOverrides;
use wgmoe::model::Executor;
use wgmoe::runtime::generate::{generate, generate_from, Flow, GenerateOptions, Generation};
use wgmoe::runtime::sampling::SamplingOptions;
use wgmoe::session::Session;

const PROMPT: [u32; 5] = [3, 17, 101, 7, 42];
const NEW: usize = 12;

fn opts(depth: usize, sampling: SamplingOptions) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: NEW,
        sampling,
        eos_ids: vec![],
        ignore_eos: true,
        record_logits: false,
        pipeline_depth: depth,
    }
}

fn seeded() -> SamplingOptions {
    SamplingOptions {
        temperature: 0.9,
        top_k: 0,
        top_p: 0.95,
        seed: 11,
    }
}

fn gpu_plan() -> KernelOverrides {
    KernelOverrides {
        decode: Some(DecodeKernels::Coalesced),
        prefill: Some(PrefillKernels::Tiled),
        ..Default::default()
    }
}

fn run(e: &mut wgmoe::runtime::engine::Engine, o: &GenerateOptions) -> Generation {
    generate(&mut e.fwd, &PROMPT, o, &mut |_| Ok(()))
        .unwrap_or_else(|err| panic!("depth {}: {err}", o.pipeline_depth))
}

#[test]
fn every_depth_gives_the_tokens_of_depth_one_on_every_family_and_plan() {
    for name in [OLMOE, QWEN, QWEN3, MIXTRAL] {
        for (plan, kernels) in [("default", KernelOverrides::default()), ("gpu", gpu_plan())] {
            let mut e = load_on(name, 64, Default::default(), Executor::Grouped, kernels)
                .unwrap_or_else(|err| panic!("{name} {plan}: {err}"));
            let base = run(&mut e, &opts(1, SamplingOptions::greedy()));
            assert_eq!(base.generated_ids.len(), NEW, "{name} {plan}");
            assert_eq!(base.decode_steps_in_flight_max, 1, "{name} {plan}: depth 1");
            for depth in [2, 4] {
                let g = run(&mut e, &opts(depth, SamplingOptions::greedy()));
                assert_eq!(
                    g.generated_ids, base.generated_ids,
                    "{name} {plan}: greedy tokens at depth {depth} differ from depth 1"
                );
                assert_eq!(g.pipeline_depth, depth, "{name} {plan}");
                assert_eq!(
                    g.decode_steps_in_flight_max, depth,
                    "{name} {plan}: depth {depth} keeps that many steps in flight"
                );
                assert_eq!(
                    g.decode_steps_discarded, 0,
                    "{name} {plan}: max_new_tokens submits no step past the last"
                );
            }
            let s1 = run(&mut e, &opts(1, seeded()));
            for depth in [2, 4] {
                let g = run(&mut e, &opts(depth, seeded()));
                assert_eq!(
                    g.generated_ids, s1.generated_ids,
                    "{name} {plan}: seeded tokens at depth {depth} differ from depth 1"
                );
            }
        }
    }
}

#[test]
fn a_bad_depth_is_refused_naming_the_option() {
    let mut e = load(OLMOE, 64, Default::default(), Executor::Grouped).unwrap();
    for depth in [0, 9] {
        let err = generate(
            &mut e.fwd,
            &PROMPT,
            &opts(depth, SamplingOptions::greedy()),
            &mut |_| Ok(()),
        )
        .expect_err("depth out of range");
        assert!(err.to_string().contains("--pipeline-depth"), "{err}");
    }
}

/// The tokens of a depth-1 run, and the index of a token whose first occurrence is in the
/// middle (a stop there leaves steps in flight at a higher depth).
fn reference(s: &mut Session) -> (Vec<u32>, usize) {
    let (g, _) = s
        .generate(&PROMPT, &opts(1, SamplingOptions::greedy()), &mut |_| {
            Ok(Flow::Continue)
        })
        .unwrap();
    let ids = g.generated_ids;
    let i = (3..NEW - 4)
        .find(|&i| !ids[..i].contains(&ids[i]))
        .expect("a token first seen mid-generation");
    (ids, i)
}

#[test]
fn eos_in_the_middle_of_the_steps_in_flight_leaves_what_depth_one_leaves() {
    for name in [OLMOE, QWEN3] {
        let mut turns = Vec::new();
        for depth in [1, 4] {
            let mut s =
                Session::new(load(name, 64, Default::default(), Executor::Grouped).unwrap());
            let (ids, i) = reference(&mut s);
            s.clear_cache();
            let o = GenerateOptions {
                eos_ids: vec![ids[i]],
                ignore_eos: false,
                ..opts(depth, SamplingOptions::greedy())
            };
            let mut seen = Vec::new();
            let (g, st) = s
                .generate(&PROMPT, &o, &mut |id| {
                    seen.push(id);
                    Ok(Flow::Continue)
                })
                .unwrap();
            assert_eq!(
                g.generated_ids,
                ids[..=i],
                "{name} depth {depth}: stops at EOS"
            );
            assert_eq!(
                seen, g.generated_ids,
                "{name} depth {depth}: streamed tokens"
            );
            assert!(
                g.stopped_by_eos && st.generated_tokens == i + 1,
                "{name} depth {depth}"
            );
            if depth > 1 {
                assert!(
                    g.decode_steps_discarded > 0,
                    "{name}: EOS at token {i} of {NEW} leaves steps in flight at depth {depth}"
                );
            }
            let cached = s.cached().to_vec();
            // The next turn reuses the cache: its prefix and tokens must not see the
            // discarded steps' rows.
            let mut next = cached.clone();
            next.extend_from_slice(&[ids[i], 9, 23]);
            let (g2, st2) = s
                .generate(&next, &opts(depth, SamplingOptions::greedy()), &mut |_| {
                    Ok(Flow::Continue)
                })
                .unwrap();
            turns.push((
                cached,
                next,
                g2.generated_ids,
                st2.cached_tokens,
                st2.prefilled_tokens,
            ));
        }
        assert_eq!(
            turns[0], turns[1],
            "{name}: depth 4 leaves another cache or next turn than depth 1"
        );
        assert_eq!(
            turns[0].3,
            turns[0].0.len(),
            "{name}: the next turn reuses the whole cache"
        );
        // And the next turn equals a fresh run of its prompt.
        let mut e = load(name, 64, Default::default(), Executor::Grouped).unwrap();
        let fresh = generate(
            &mut e.fwd,
            &turns[0].1,
            &opts(1, SamplingOptions::greedy()),
            &mut |_| Ok(()),
        )
        .unwrap();
        assert_eq!(
            fresh.generated_ids, turns[0].2,
            "{name}: the reused cache gives a fresh run's tokens"
        );
    }
}

#[test]
fn a_stop_from_on_token_mid_flight_keeps_exactly_the_tokens_seen() {
    let mut e = load(QWEN3, 64, Default::default(), Executor::Grouped).unwrap();
    let base = run(&mut e, &opts(1, SamplingOptions::greedy()));
    for depth in [1, 2, 4, 8] {
        let mut seen = 0;
        let g = generate_from(
            &mut e.fwd,
            &PROMPT,
            0,
            &opts(depth, SamplingOptions::greedy()),
            &mut |_| {
                seen += 1;
                Ok(if seen == 5 {
                    Flow::Stop
                } else {
                    Flow::Continue
                })
            },
        )
        .unwrap();
        assert_eq!(g.generated_ids, base.generated_ids[..5], "depth {depth}");
        assert!(g.cancelled, "depth {depth}");
        assert_eq!(
            g.decode_steps_discarded,
            (depth - 1).min(NEW - 5),
            "depth {depth}: the steps ahead of token 5 are dropped"
        );
    }
}

mod cli {
    //! The command line: `run --json`'s pipeline metrics, `--profile-kernels` (the GPU time
    //! of each stage and kernel, the tokens unchanged) and `bench`'s depth sweep.
    use super::common::cli::{
        assert_error, assert_ok, ids, json_of, wgmoe, MIXTRAL, OLMOE, QWEN, QWEN3,
    };

    fn run_json(model: &str, extra: &[&str]) -> serde_json::Value {
        let dir = super::common::fixture(model);
        let mut args = vec![
            "run".to_string(),
            dir.display().to_string(),
            "--prompt-ids".into(),
            "3,17,101,7,42,9,5".into(),
            "-n".into(),
            "6".into(),
            "--json".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let r = wgmoe(&args);
        assert_ok(&r);
        json_of(&r)
    }

    #[test]
    fn run_json_reports_the_steps_in_flight() {
        let v = run_json(OLMOE, &[]);
        let m = &v["metrics"];
        assert_eq!(m["pipeline_depth"], 2, "{m}");
        assert_eq!(m["decode_steps_in_flight_max"], 2, "{m}");
        assert!(
            m["decode_host_wait_s"].as_f64().is_some_and(|s| s >= 0.0),
            "{m}"
        );
        assert_eq!(m["decode_steps_discarded"], 0, "{m}");
        assert!(m["profile"].is_null(), "{m}");
        let one = run_json(OLMOE, &["--pipeline-depth", "1"]);
        assert_eq!(one["metrics"]["decode_steps_in_flight_max"], 1);
        assert_eq!(ids(&one, "generated_ids"), ids(&v, "generated_ids"));
    }

    #[test]
    fn profile_kernels_times_every_stage_on_the_gpu_and_changes_no_token() {
        for model in [OLMOE, QWEN, QWEN3, MIXTRAL] {
            // Prefill chunks of 3 tokens: the replays of several chunks and of decode steps.
            let plain = run_json(model, &["--prefill-chunk", "3"]);
            let v = run_json(model, &["--prefill-chunk", "3", "--profile-kernels"]);
            assert_eq!(
                ids(&v, "generated_ids"),
                ids(&plain, "generated_ids"),
                "{model}: the replays changed the tokens"
            );
            let m = &v["metrics"];
            // lavapipe has timestamp queries (as NVIDIA's and AMD's drivers do).
            assert_eq!(m["profile_clock"], "gpu-timestamps", "{model}: {m}");
            assert_eq!(m["pipeline_depth"], 1, "{model}");
            let rows = m["profile"].as_array().expect("profile rows");
            let f = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap_or(f64::NAN);
            // Every dispatch of a decode step is in the table, once.
            let dispatches: f64 = rows.iter().map(|r| f(r, "dispatches_per_token")).sum();
            assert_eq!(
                dispatches,
                m["dispatches_per_decode_step"].as_f64().unwrap(),
                "{model}: {m}"
            );
            let share: f64 = rows.iter().map(|r| f(r, "share")).sum();
            assert!((share - 1.0).abs() < 1e-9, "{model}: shares sum to {share}");
            let gpu: f64 = rows.iter().map(|r| f(r, "gpu_s_per_token")).sum();
            assert!(
                rows.iter().all(|r| f(r, "gpu_s_per_token") >= 0.0),
                "{model}"
            );
            assert!(
                (gpu - f(m, "gpu_s_per_token")).abs() < 1e-12 && gpu > 0.0,
                "{model}: {m}"
            );
            for stage in ["attention", "lm_head", "argmax"] {
                assert!(
                    rows.iter().any(|r| r["stage"] == stage),
                    "{model}: no {stage} row in {m}"
                );
            }
            assert!(f(m, "gpu_busy_fraction") > 0.0, "{model}: {m}");
            assert!(f(m, "host_s_per_token") > 0.0, "{model}: {m}");
            assert!(
                !m["prefill_profile"].as_array().unwrap().is_empty(),
                "{model}"
            );
        }
        // The per-layer path of partial residency is not profiled: refused, not ignored.
        let dir = super::common::fixture(QWEN);
        let r = wgmoe([
            "run",
            &dir.display().to_string(),
            "--prompt-ids",
            "3,17",
            "-n",
            "2",
            "--resident-experts",
            "3",
            "--profile-kernels",
        ]);
        assert_error(&r, &["--profile-kernels", "every expert resident"]);
    }

    #[test]
    fn bench_sweeps_depths_side_by_side_and_profiles() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("b.json");
        let dir = super::common::fixture(QWEN3);
        let r = wgmoe([
            "bench",
            &dir.display().to_string(),
            "--prompts",
            "1",
            "--blocks",
            "1",
            "-n",
            "5",
            "--warmup",
            "1",
            "--pipeline-depths",
            "1,2",
            "--profile-kernels",
            "--json-out",
            &out.display().to_string(),
        ]);
        assert_ok(&r);
        let recs: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let recs = recs.as_array().unwrap();
        assert_eq!(recs.len(), 2, "{r}");
        // Profiling decodes at depth 1 whatever the sweep asks: said in the record.
        for rec in recs {
            assert_eq!(rec["pipeline_depth"], 1, "{rec}");
            assert_eq!(rec["profile_clock"], "gpu-timestamps", "{rec}");
            let rows = rec["profile"].as_array().unwrap();
            let d: f64 = rows
                .iter()
                .map(|r| r["dispatches_per_token"].as_f64().unwrap())
                .sum();
            assert_eq!(
                d,
                rec["dispatches_per_decode_step"].as_f64().unwrap(),
                "{rec}"
            );
            assert!(rec["gpu_busy_fraction"].as_f64().is_some_and(|b| b > 0.0));
        }
        // Without it, depth 2 keeps two steps in flight.
        let r = wgmoe([
            "bench",
            &dir.display().to_string(),
            "--prompts",
            "1",
            "--blocks",
            "1",
            "-n",
            "5",
            "--warmup",
            "0",
            "--pipeline-depths",
            "1,2",
            "--json-out",
            &out.display().to_string(),
        ]);
        assert_ok(&r);
        let recs: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let depths: Vec<_> = recs
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["pipeline_depth"].clone(),
                    r["decode_steps_in_flight_max"].clone(),
                )
            })
            .collect();
        assert_eq!(
            depths,
            vec![(1.into(), 1.into()), (2.into(), 2.into())],
            "{r}"
        );
        assert!(recs[0]["profile"].is_null());
    }
}

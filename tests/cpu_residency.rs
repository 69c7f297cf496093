//! Routed experts computed on the CPU (`--miss-policy cpu|auto`, `--resident-experts 0`,
//! `--n-cpu-moe`) on lavapipe: every family's fixture gives transformers' INT4 greedy
//! tokens with the device holding no expert, fewer than top_k, top_k and half of them;
//! the work splits as the policy says (uploads only where it allows them, h2d = uploads x
//! expert bytes, every other pair on the CPU), and the host source is never written.

mod common;

use common::engine::*;
use common::*;
use wgmoe::model::residency::ExpertPlacement;
use wgmoe::model::Executor;
use wgmoe::residency::MissPolicy;
use wgmoe::runtime::engine::{Engine, ResidencyOptions};

const FIXTURES: [&str; 4] = [
    "olmoe-tiny",
    "qwen2moe-tiny",
    "qwen3moe-tiny",
    "mixtral-tiny",
];

/// Greedy tokens of every golden prompt equal the INT4 golden (a divergence only at a
/// golden near tie, as tests/parity.rs allows).
fn check_golden(name: &str, what: &str, eng: &mut Engine) {
    let golden = load_golden(&format!("{name}.int4.safetensors"));
    for (pi, g) in golden.prompts.iter().enumerate() {
        let ids = greedy(eng, &g.prompt_ids, g.generated_ids.len()).unwrap();
        for (s, (a, b)) in ids.iter().zip(&g.generated_ids).enumerate() {
            if a != b {
                assert!(
                    g.step_gap[s] < 2e-3,
                    "{name} {what} p{pi} step {s}: {a} != golden {b}"
                );
                break;
            }
        }
    }
}

fn options(n: usize, miss: MissPolicy) -> ResidencyOptions {
    ResidencyOptions {
        resident_experts: Some(n),
        miss_policy: Some(miss),
        ..Default::default()
    }
}

#[test]
fn cpu_misses_give_the_int4_golden_at_every_capacity() {
    for name in FIXTURES {
        let cfg = wgmoe::config::ModelConfig::from_dir(&fixture(name)).unwrap();
        let (e, k) = (cfg.num_experts, cfg.top_k);
        let slot = wgmoe::blocks::quant::Q4SlotLayout::new(cfg.hidden_size, cfg.moe_intermediate)
            .bytes as u64;
        for miss in [MissPolicy::Cpu, MissPolicy::Auto] {
            for n in [0, 1, k, (k + e) / 2] {
                for executor in [Executor::Grouped, Executor::PerExpert] {
                    let what = format!("--miss-policy {} N={n} {executor:?}", miss.name());
                    let mut eng = load(name, 64, options(n, miss), executor).unwrap();
                    let before = eng
                        .fwd
                        .residency
                        .as_ref()
                        .map(|r| r.host.checksum().unwrap());
                    check_golden(name, &what, &mut eng);
                    let r = eng.fwd.residency.as_ref().expect("a residency runtime");
                    let st = r.stats();
                    // Copies: uploaded misses, and with auto the guesses the cost model
                    // copied ahead (next-layer prefetch, the default with uploads).
                    assert_eq!(
                        st.h2d_bytes,
                        (st.uploaded_misses + st.prefetch_issued) * slot,
                        "{name} {what}"
                    );
                    if miss == MissPolicy::Cpu {
                        assert_eq!(st.prefetch_issued, 0, "{name} {what}");
                    }
                    assert!(
                        st.cpu_expert_pairs > 0,
                        "{name} {what}: nothing ran on the CPU"
                    );
                    assert_eq!(
                        Some(r.host.checksum().unwrap()),
                        before,
                        "host source changed"
                    );
                    for c in r.caches.iter().flatten() {
                        c.check_invariants().unwrap();
                        assert!(c.published_count() <= n);
                    }
                    if n == 0 {
                        assert_eq!(st.uploaded_misses, 0);
                        assert!(r.caches.iter().all(|c| c.is_none()));
                        assert!(r
                            .placement
                            .iter()
                            .zip(&cfg.sparse_layers)
                            .all(|(p, &s)| !s || *p == ExpertPlacement::Host));
                    }
                    if miss == MissPolicy::Cpu && n > 0 {
                        // The prefill admitted experts; later steps found them resident.
                        assert!(
                            st.uploaded_misses > 0 && st.expert_hits > 0,
                            "{name} {what}: {st:?}"
                        );
                    }
                    if miss == MissPolicy::Auto && n > 0 {
                        assert!(
                            st.cost_figures.is_some(),
                            "{name} {what}: auto measured nothing"
                        );
                    }
                    eprintln!(
                        "{name} {what}: hits {} uploads {} cpu pairs {} ({:.4} s), figures {:?}",
                        st.expert_hits,
                        st.uploaded_misses,
                        st.cpu_expert_pairs,
                        st.cpu_expert_seconds,
                        st.cost_figures
                    );
                }
            }
        }
    }
}

/// `--miss-policy cpu` admits experts in multi-token steps only: one-token steps upload
/// nothing, and each of their pairs routed to a non-resident expert runs on the CPU.
#[test]
fn cpu_policy_uploads_only_in_prefill() {
    use wgmoe::model::Head;
    let name = "olmoe-tiny";
    let cfg = wgmoe::config::ModelConfig::from_dir(&fixture(name)).unwrap();
    let (k, sparse) = (cfg.top_k, cfg.num_sparse_layers() as u64);
    let mut eng = load(name, 64, options(k, MissPolicy::Cpu), Executor::Grouped).unwrap();
    let prompt = [464u32, 1711, 8886, 13, 2000, 40];
    eng.fwd
        .submit(0, prompt.len(), Some(&prompt), Head::LastArgmax)
        .unwrap();
    eng.fwd.read_token().unwrap();
    let prefill = eng.fwd.residency.as_ref().unwrap().stats();
    assert!(
        prefill.uploaded_misses > 0,
        "the prefill admits experts: {prefill:?}"
    );
    assert!(prefill.uploaded_misses <= sparse * k as u64);
    for step in 0..6 {
        let before = eng.fwd.residency.as_ref().unwrap().stats();
        eng.fwd
            .submit(prompt.len() + step, 1, None, Head::LastArgmax)
            .unwrap();
        eng.fwd.read_token().unwrap();
        let after = eng.fwd.residency.as_ref().unwrap().stats();
        assert_eq!(
            after.uploaded_misses, before.uploaded_misses,
            "decode step {step} uploaded"
        );
        assert_eq!(after.h2d_bytes, before.h2d_bytes);
        // Every pair of the step: on the device (a hit) or on the CPU.
        let hits = after.expert_hits - before.expert_hits;
        let cpu = after.cpu_expert_pairs - before.cpu_expert_pairs;
        assert_eq!(hits + cpu, sparse * k as u64, "decode step {step}");
    }
}

/// Issue 39, defect 5: the per-layer misses count what the total counts, uploads and
/// CPU-computed misses alike, under every miss policy.
#[test]
fn misses_per_layer_add_up_to_the_total() {
    let name = "olmoe-tiny";
    let cfg = wgmoe::config::ModelConfig::from_dir(&fixture(name)).unwrap();
    for miss in [MissPolicy::Cpu, MissPolicy::Auto, MissPolicy::Upload] {
        let mut eng = load(name, 64, options(cfg.top_k, miss), Executor::Grouped).unwrap();
        greedy(&mut eng, &[464, 1711, 8886, 13, 2000, 40], 8).unwrap();
        let s = eng.fwd.residency.as_ref().unwrap().stats();
        assert_eq!(s.misses_per_layer.len(), cfg.num_layers, "{miss:?}");
        assert!(s.expert_misses > 0, "{miss:?}: {s:?}");
        assert_eq!(
            s.misses_per_layer.iter().sum::<u64>(),
            s.expert_misses,
            "{miss:?}: {:?}",
            s.misses_per_layer
        );
        if miss == MissPolicy::Cpu {
            assert!(s.cpu_misses > 0 && s.cpu_misses <= s.expert_misses, "{s:?}");
        }
    }
}

/// `--n-cpu-moe N`: the first N layers' experts on the CPU, the others fully resident (or
/// cached); the same tokens.
#[test]
fn n_cpu_moe_gives_the_int4_golden() {
    for name in FIXTURES {
        let cfg = wgmoe::config::ModelConfig::from_dir(&fixture(name)).unwrap();
        for (n_cpu, resident) in [(1, None), (cfg.num_layers, None), (1, Some(cfg.top_k))] {
            let what = format!("--n-cpu-moe {n_cpu} --resident-experts {resident:?}");
            let opts = ResidencyOptions {
                n_cpu_moe: n_cpu,
                resident_experts: resident,
                ..Default::default()
            };
            let mut eng = load(name, 64, opts, Executor::Grouped).unwrap();
            check_golden(name, &what, &mut eng);
            let r = eng.fwd.residency.as_ref().unwrap();
            for l in 0..cfg.num_layers {
                let p = r.placement(l);
                if !cfg.sparse_layers[l] {
                    assert_eq!(p, ExpertPlacement::Device);
                } else if l < n_cpu {
                    assert_eq!(p, ExpertPlacement::Host, "{name} {what} layer {l}");
                } else {
                    assert_ne!(p, ExpertPlacement::Host, "{name} {what} layer {l}");
                }
            }
            assert!(r.stats().cpu_expert_pairs > 0);
        }
    }
}

/// A staging fill that fails while the CPU computes: the error is reported, no table
/// changes (the admission is aborted), and the next request runs with the same tokens as
/// a fresh engine.
#[test]
fn failed_admission_keeps_the_previous_generation() {
    let name = "olmoe-tiny";
    let k = wgmoe::config::ModelConfig::from_dir(&fixture(name))
        .unwrap()
        .top_k;
    let mut eng = load(name, 64, options(k, MissPolicy::Cpu), Executor::Grouped).unwrap();
    greedy(&mut eng, &[464u32, 1711, 8886], 4).unwrap();
    let tables = |eng: &Engine| -> Vec<(u64, Vec<u32>)> {
        let r = eng.fwd.residency.as_ref().unwrap();
        r.caches
            .iter()
            .flatten()
            .map(|c| (c.generation(), c.table().words().to_vec()))
            .collect()
    };
    // The prompt after this publishes the last admission, then admits anew: fail that.
    greedy(&mut eng, &[12u32, 50000, 7, 99, 1234, 5], 1).unwrap();
    let before = tables(&eng);
    {
        let r = eng.fwd.residency.as_mut().unwrap();
        r.inject.fail_upload = Some(r.uploads_attempted() + 1);
    }
    let prompt = [300u32, 4000, 77, 12345, 999, 31, 2];
    let err = greedy(&mut eng, &prompt, 3).expect_err("injected failure must be reported");
    assert!(err.to_string().contains("injected failure"), "{err}");
    let after = tables(&eng);
    // The failed step may have published the previous step's admission first; nothing of
    // the failed admission is published.
    assert!(
        after.iter().zip(&before).all(|(a, b)| a.0 >= b.0),
        "{before:?} {after:?}"
    );
    // Layers served before the failure keep their admissions (published at their next
    // step); the failed layer's plan was aborted, or the next request could not plan.
    for c in eng.fwd.residency.as_ref().unwrap().caches.iter().flatten() {
        c.check_invariants().unwrap();
    }
    eng.fwd.residency.as_mut().unwrap().inject.fail_upload = None;
    let again = greedy(&mut eng, &prompt, 6).unwrap();
    let mut fresh = load(name, 64, options(k, MissPolicy::Cpu), Executor::Grouped).unwrap();
    assert_eq!(again, greedy(&mut fresh, &prompt, 6).unwrap());
}

/// What cannot run is refused, naming the option.
#[test]
fn cpu_expert_options_are_checked() {
    let err = |o: ResidencyOptions| match load("olmoe-tiny", 64, o, Executor::Grouped) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    };
    // Below top_k every miss would have to be uploaded into too few slots.
    let e = err(options(1, MissPolicy::Upload));
    assert!(
        e.contains("--resident-experts") && e.contains("--miss-policy"),
        "{e}"
    );
    let e = err(ResidencyOptions {
        n_cpu_moe: 99,
        ..Default::default()
    });
    assert!(e.contains("--n-cpu-moe"), "{e}");
    let e = err(ResidencyOptions {
        resident_experts: Some(0),
        cpu_threads: Some(0),
        ..Default::default()
    });
    assert!(e.contains("--cpu-threads"), "{e}");
}

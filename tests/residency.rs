//! Partial expert residency on the GPU (lavapipe in CI): every policy at constant
//! thrashing (N = top_k), a middle N and N = all gives transformers' INT4 greedy tokens;
//! uploads are exactly misses x expert bytes; the host source is never written; a failed
//! upload leaves the published generation intact; admission refuses what cannot fit
//! (tests/soak.rs: a long run does not grow allocations).

mod common;

use std::path::PathBuf;

use common::engine::*;
use common::*;
use wgmoe::backend::plan::{DecodeKernels, PrefillKernels};
use wgmoe::backend::{DeviceRequest, KernelOverrides};
use wgmoe::model::Executor;
use wgmoe::residency::{MissPolicy, PolicyKind, Prefetch};
use wgmoe::runtime::engine::{Engine, EngineOptions, ExpertPrecision, ResidencyOptions};

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Writes a calibration profile for `name` (full residency, routing recorded).
fn calibrate(name: &str, prompt: &[u32], dir: &std::path::Path) -> PathBuf {
    let mut e = load(
        name,
        64,
        ResidencyOptions {
            record_profile: true,
            ..upload()
        },
        Executor::Grouped,
    )
    .unwrap();
    greedy(&mut e, prompt, 16).unwrap();
    let path = dir.join(format!("{name}.profile.json"));
    e.fwd.profile.as_ref().unwrap().save(&path).unwrap();
    path
}

fn check_policies(name: &str) {
    let golden = load_golden(&format!("{name}.int4.safetensors"));
    let tmp = tempfile::tempdir().unwrap();
    let profile = calibrate(name, &golden.prompts[1].prompt_ids, tmp.path());
    let cfg = wgmoe::config::ModelConfig::from_dir(&fixture(name)).unwrap();
    let (e, k) = (cfg.num_experts, cfg.top_k);
    let slot_bytes =
        wgmoe::blocks::quant::Q4SlotLayout::new(cfg.hidden_size, cfg.moe_intermediate).bytes as u64;
    // Copies staged on the submitting thread without prefetch (the path before overlapped
    // fills), fills off it alone, fill threads with every guess copied, and the default
    // (fill threads and the gated next-layer prefetch).
    let ways = [
        (Prefetch::Off, Some(0)),
        (Prefetch::Off, None),
        (Prefetch::NextLayerUngated, None),
        (Prefetch::NextLayer, None),
    ];
    for (pi, policy) in PolicyKind::ALL.into_iter().enumerate() {
        for n in [k, (k + e) / 2, e] {
            // Every expert resident has no cache: one engine per executor says so. The
            // per-expert executor shares the cache paths: its on-demand and default ways.
            if n == e && pi > 0 {
                continue;
            }
            for (executor, (prefetch, fills)) in [Executor::Grouped, Executor::PerExpert]
                .into_iter()
                .flat_map(|x| ways.map(|w| (x, w)))
                .filter(|&(x, w)| {
                    (n < e || w == ways[0])
                        && (x == Executor::Grouped || w == ways[0] || w == ways[3])
                })
            {
                let opts = ResidencyOptions {
                    resident_experts: Some(n),
                    policy,
                    profile: Some(profile.clone()),
                    prefetch: Some(prefetch),
                    fill_threads: fills,
                    ..upload()
                };
                let what = format!(
                    "{policy:?} N={n} {executor:?} prefetch {} fill threads {fills:?}",
                    prefetch.name()
                );
                let mut eng = load(name, 64, opts, executor).unwrap();
                let before = eng
                    .fwd
                    .residency
                    .as_ref()
                    .map(|r| r.host.checksum().unwrap());
                for (pi, g) in golden.prompts.iter().enumerate() {
                    let ids = greedy(&mut eng, &g.prompt_ids, g.generated_ids.len()).unwrap();
                    // A divergence is allowed only at a golden near tie (as tests/parity.rs).
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
                match eng.fwd.residency.as_ref() {
                    Some(r) => {
                        let st = r.stats();
                        assert!(n < e);
                        // Every copy is a miss copied on demand or a guess copied ahead.
                        assert_eq!(
                            st.h2d_bytes,
                            (st.expert_misses + st.prefetch_issued) * slot_bytes,
                            "{name} {what}: h2d = (misses + prefetched) x expert bytes"
                        );
                        assert!(st.expert_misses > 0);
                        assert_eq!(st.prefetch, prefetch, "{name} {what}");
                        if prefetch.guesses() {
                            // Guesses were made and (ungated) copied; each was used or wasted.
                            if !prefetch.gated() {
                                assert!(st.prefetch_issued > 0, "{name} {what}: {st:?}");
                            }
                            assert_eq!(
                                st.prefetch_issued * slot_bytes,
                                st.prefetch_used * slot_bytes + st.prefetch_wasted_bytes,
                                "{name} {what}"
                            );
                            let acc = st.prefetch_accuracy.expect("guesses were scored");
                            assert!((0.0..=1.0).contains(&acc), "{acc}");
                        } else {
                            assert_eq!(st.prefetch_issued + st.prefetch_used, 0);
                        }
                        assert_eq!(st.fill_threads, fills.unwrap_or(2).min(cores()));
                        if n == k {
                            assert!(st.expert_evictions > 0, "N = top_k must evict");
                        }
                        assert_eq!(
                            Some(r.host.checksum().unwrap()),
                            before,
                            "host source changed"
                        );
                        for c in r.caches.iter().flatten() {
                            c.check_invariants().unwrap();
                            assert!(c.published_count() <= n);
                        }
                        eprintln!(
                            "{name} {what}: hits {} misses {} evictions {} prefetched {} used {} accuracy {:?} stall {:.4}s",
                            st.expert_hits, st.expert_misses, st.expert_evictions, st.prefetch_issued, st.prefetch_used, st.prefetch_accuracy, st.upload_stall_seconds
                        );
                    }
                    None => assert_eq!(n, e, "full residency has no cache"),
                }
            }
        }
    }
}

#[test]
fn olmoe_every_policy_and_capacity_gives_the_int4_golden() {
    check_policies("olmoe-tiny");
}

#[test]
fn qwen2moe_every_policy_and_capacity_gives_the_int4_golden() {
    check_policies("qwen2moe-tiny");
}

/// A dense layer among the MoE ones (no cache there) and an odd expert count.
#[test]
fn qwen3moe_every_policy_and_capacity_gives_the_int4_golden() {
    check_policies("qwen3moe-tiny");
}

#[test]
fn mixtral_every_policy_and_capacity_gives_the_int4_golden() {
    check_policies("mixtral-tiny");
}

/// A prompt routes to more experts than N = top_k slots hold: its prefill runs each layer's
/// experts in batches (hits first, then a spare set of misses at a time), with the storage
/// kernels GPUs use (grouped executor, down projection not fused with the combine so a
/// batch's outputs can wait for the combine), and still gives transformers' tokens.
#[test]
fn batched_prefill_with_storage_kernels_gives_the_int4_golden() {
    for name in [
        "olmoe-tiny",
        "qwen2moe-tiny",
        "qwen3moe-tiny",
        "mixtral-tiny",
    ] {
        let golden = load_golden(&format!("{name}.int4.safetensors"));
        let k = wgmoe::config::ModelConfig::from_dir(&fixture(name))
            .unwrap()
            .top_k;
        let mut eng = load_on(
            name,
            64,
            ResidencyOptions {
                resident_experts: Some(k),
                ..upload()
            },
            Executor::Grouped,
            KernelOverrides {
                prefill: Some(PrefillKernels::Storage),
                decode: Some(DecodeKernels::Storage),
                ..Default::default()
            },
        )
        .unwrap();
        for (pi, g) in golden.prompts.iter().enumerate() {
            let subm0 = eng.fwd.counters.submissions;
            let ids = greedy(&mut eng, &g.prompt_ids, g.generated_ids.len()).unwrap();
            for (s, (a, b)) in ids.iter().zip(&g.generated_ids).enumerate() {
                if a != b {
                    assert!(
                        g.step_gap[s] < 2e-3,
                        "{name} p{pi} step {s}: {a} != golden {b}"
                    );
                    break;
                }
            }
            // More submissions than one per layer per step: the prefill ran batches.
            let steps = g.generated_ids.len() as u64;
            let layers = eng.cfg.num_layers as u64 + 1;
            assert!(
                eng.fwd.counters.submissions - subm0 > steps * layers,
                "{name} p{pi}: the prefill must have needed expert batches"
            );
        }
        let r = eng.fwd.residency.as_ref().unwrap();
        for c in r.caches.iter().flatten() {
            c.check_invariants().unwrap();
        }
    }
}

#[test]
fn failed_upload_keeps_the_previous_generation() {
    let mut eng = load(
        "olmoe-tiny",
        64,
        ResidencyOptions {
            resident_experts: Some(3),
            ..upload()
        },
        Executor::Grouped,
    )
    .unwrap();
    let prompt = [464u32, 1711, 8886];
    greedy(&mut eng, &prompt, 4).unwrap();
    let snapshot = |eng: &Engine| -> Vec<(u64, Vec<u32>, Vec<u32>)> {
        let r = eng.fwd.residency.as_ref().unwrap();
        r.caches
            .iter()
            .enumerate()
            .filter_map(|(l, c)| c.as_ref().map(|c| (l, c)))
            .map(|(l, c)| {
                let gpu = match &eng.fwd.weights.layers[l].mlp {
                    wgmoe::model::weights::Mlp::Moe { slot_of, .. } => eng
                        .dev
                        .read(slot_of, 0, (c.table().words().len() * 4) as u64)
                        .unwrap(),
                    _ => unreachable!(),
                };
                (
                    c.generation(),
                    c.table().words().to_vec(),
                    bytemuck::pod_collect_to_vec(&gpu),
                )
            })
            .collect()
    };
    let before = snapshot(&eng);
    for (_, words, gpu) in &before {
        assert_eq!(words, gpu, "GPU table = published generation");
    }
    {
        let r = eng.fwd.residency.as_mut().unwrap();
        let done = r.uploads_attempted();
        r.inject.fail_upload = Some(done + 1);
    }
    // A prompt whose routing must miss (N = top_k = 3 of 7): the first upload fails.
    let err = greedy(&mut eng, &[12u32, 50000, 7, 99, 1234], 8)
        .expect_err("injected failure must be reported");
    assert!(err.to_string().contains("injected failure"), "{err}");
    let after = snapshot(&eng);
    assert_eq!(
        before.iter().map(|b| &b.1).collect::<Vec<_>>(),
        after.iter().map(|a| &a.1).collect::<Vec<_>>(),
        "published tables unchanged"
    );
    for (_, words, gpu) in &after {
        assert_eq!(words, gpu, "GPU table unchanged");
    }
    for c in eng.fwd.residency.as_ref().unwrap().caches.iter().flatten() {
        c.check_invariants().unwrap();
    }
}

/// Failures in one-token steps with next-layer prefetch (the guesses' copies and the
/// misses' copies both staged off the submitting thread, or both on it): the n-th copy's
/// staging fails, for every n across several steps. After each failure every cache keeps
/// its invariants (no slot reused before its fence, prefetch slots returned), the device
/// table is the published generation, nothing is left staged, and the next request gives
/// the golden tokens.
#[test]
fn failed_copies_with_prefetch_keep_tables_and_tokens() {
    let golden = load_golden("olmoe-tiny.int4.safetensors");
    let g = &golden.prompts[0];
    for fills in [Some(0), None] {
        let mut eng = load(
            "olmoe-tiny",
            64,
            ResidencyOptions {
                resident_experts: Some(3),
                prefetch: Some(Prefetch::NextLayerUngated),
                fill_threads: fills,
                ..upload()
            },
            Executor::Grouped,
        )
        .unwrap();
        // `settled`: after a whole request (a failed one may leave copies ahead that the
        // layer's next step settles).
        let check = |eng: &Engine, what: &str, settled: bool| {
            let r = eng.fwd.residency.as_ref().unwrap();
            for (l, c) in r.caches.iter().enumerate() {
                let Some(c) = c else { continue };
                c.check_invariants()
                    .unwrap_or_else(|e| panic!("{what}: layer {l}: {e}"));
                if settled {
                    assert!(c.prefetched().is_empty(), "{what}: layer {l} holds guesses");
                }
                let gpu = match &eng.fwd.weights.layers[l].mlp {
                    wgmoe::model::weights::Mlp::Moe { slot_of, .. } => eng
                        .dev
                        .read(slot_of, 0, (c.table().words().len() * 4) as u64)
                        .unwrap(),
                    _ => unreachable!(),
                };
                let gpu: Vec<u32> = bytemuck::pod_collect_to_vec(&gpu);
                assert_eq!(c.table().words(), &gpu[..], "{what}: layer {l}: GPU table");
            }
        };
        let (mut misses, mut ahead) = (0, 0);
        for n in 1..=24u64 {
            let what = format!("fill threads {fills:?}, copy {n} fails");
            {
                let r = eng.fwd.residency.as_mut().unwrap();
                let done = r.uploads_attempted();
                r.inject.fail_upload = Some(done + n);
            }
            // One-token prompt: every step guesses the next layer's experts.
            if let Err(err) = greedy(&mut eng, &[g.prompt_ids[0]], 8) {
                let err = err.to_string();
                assert!(err.contains("injected failure"), "{what}: {err}");
                if err.contains("(a guess copied ahead)") {
                    ahead += 1;
                } else {
                    assert!(err.contains("(a miss)"), "{what}: {err}");
                    misses += 1;
                }
            }
            eng.fwd.residency.as_mut().unwrap().inject.fail_upload = None;
            check(&eng, &what, false);
            let ids = greedy(&mut eng, &g.prompt_ids, g.generated_ids.len()).unwrap();
            for (s, (a, b)) in ids.iter().zip(&g.generated_ids).enumerate() {
                if a != b {
                    assert!(g.step_gap[s] < 2e-3, "{what}: step {s}: {a} != golden {b}");
                    break;
                }
            }
            check(&eng, &what, true);
        }
        // Both kinds of copy failed somewhere (which copies a request makes depends on
        // what the failures before it left resident).
        assert!(
            misses > 0 && ahead > 0,
            "fill threads {fills:?}: {misses} misses and {ahead} copies ahead failed"
        );
        let st = eng.fwd.residency.as_ref().unwrap().stats();
        assert!(st.prefetch_issued > 0, "{st:?}");
    }
}

#[test]
fn admission_refuses_what_cannot_fit() {
    let err = |r: ResidencyOptions| {
        load("olmoe-tiny", 64, r, Executor::Grouped)
            .err()
            .expect("must be refused")
            .to_string()
    };
    let e = err(ResidencyOptions {
        resident_experts: Some(2),
        ..upload()
    });
    assert!(
        e.contains("--resident-experts") && e.contains("3..=7"),
        "{e}"
    );
    let e = err(ResidencyOptions {
        resident_experts: Some(8),
        ..upload()
    });
    assert!(e.contains("3..=7"), "{e}");
    let e = err(ResidencyOptions {
        vram_budget: Some(1 << 20),
        ..upload()
    });
    assert!(e.contains("--vram "), "{e}");
    let e = err(ResidencyOptions {
        resident_experts: Some(3),
        policy: PolicyKind::Profile,
        ..upload()
    });
    assert!(e.contains("--profile"), "{e}");
    // Below full residency each layer also holds top_k spare slots and the staging
    // buffers, so on this 7-expert fixture every N < 7 needs more than N = 7: a budget of
    // exactly what N = 5 needs derives the most experts that fit, all 7.
    init_env();
    let cfg = wgmoe::config::ModelConfig::from_dir(&fixture("olmoe-tiny")).unwrap();
    let opts = EngineOptions {
        residency: ResidencyOptions {
            vram_budget: Some(0),
            ..upload()
        },
        adapter: DeviceRequest::default(),
        kernels: KernelOverrides::default(),
        expert_precision: ExpertPrecision::Int4,
        dense_precision: wgmoe::runtime::engine::DensePrecision::F16,
        kv_precision: wgmoe::runtime::engine::KvPrecision::F32,
        executor: Executor::Grouped,
        max_context: 64,
        prefill_chunk: 64,
        all_logits: false,
        score_rows: 0,
        batch: 1,
    };
    let input = wgmoe::runtime::admission::AdmissionInput {
        dense: wgmoe::backend::kernel::WeightFormat::F16,
        kv: wgmoe::backend::kernel::KvFormat::F32,
        int4: true,
        max_context: opts.max_context,
        prefill_chunk: opts.prefill_chunk,
        all_logits: opts.all_logits,
        score_rows: opts.score_rows,
        batch: opts.batch,
        staging_buffers: opts.residency.staging_buffers(&cfg).unwrap(),
        miss: MissPolicy::Upload,
        cpu_layers: 0,
        prefetch_width: opts.residency.prefetch_width(&cfg).unwrap(),
    };
    let need = |n| wgmoe::runtime::admission::admission_bytes(&cfg, &input, n).unwrap();
    let need5 = need(5);
    assert!(need(7) < need5, "spares and staging cost more than 2 slots");
    let mut eng = load(
        "olmoe-tiny",
        64,
        ResidencyOptions {
            vram_budget: Some(need5),
            ..upload()
        },
        Executor::Grouped,
    )
    .unwrap();
    assert_eq!(eng.resident_experts, 7);
    greedy(&mut eng, &[464, 1711, 8886], 8).unwrap();
    assert!(eng.dev.tracker().peak() <= need5);
    drop(eng);
    // N = 5 (multi-token prefill in expert batches): the runtime stays within its estimate.
    let mut eng = load(
        "olmoe-tiny",
        64,
        ResidencyOptions {
            resident_experts: Some(5),
            ..upload()
        },
        Executor::Grouped,
    )
    .unwrap();
    greedy(&mut eng, &[464, 1711, 8886, 12, 50000, 7, 99, 1234], 8).unwrap();
    let peak = eng.dev.tracker().peak();
    eprintln!(
        "admission estimate for N=5: {need5} bytes; runtime peak {peak} bytes ({:.2}%)",
        100.0 * peak as f64 / need5 as f64
    );
    assert!(
        peak <= need5,
        "runtime peak {peak} exceeds the admitted {need5}"
    );
    drop(eng);
    let e = err(ResidencyOptions {
        resident_experts: Some(5),
        vram_budget: Some(need5 - 1),
        ..upload()
    });
    assert!(
        e.contains("5 experts per layer need") && e.contains("fits 7"),
        "{e}"
    );
}

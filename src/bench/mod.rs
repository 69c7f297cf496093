//! `wgmoe bench`: the measurement contract.
//!
//! A fixed prompt set shipped in the repository (`bench/prompts.json`, 12 prompts: prose,
//! code, math and chat, short, medium and long), repeated in blocks, a fixed number of new
//! tokens, greedy decoding with EOS suppressed (every response has exactly `n` tokens),
//! warm-up responses excluded, concurrency 1. Sweep options are lists: each combination is
//! one configuration, with its own engine (and GPU context, so its GPU peak is its own).
//!
//! Per configuration the pooled decode rate is sum(tokens - 1) / sum(decode time after the
//! first token), not a mean of rates. A benchmark measures; it never asserts a time.

mod host;
mod plot;
mod prompts;
mod record;
mod table;

use std::path::PathBuf;
use std::time::Instant;

use crate::backend::{DeviceRequest, KernelOverrides};
use crate::error::{Error, Result};
use crate::model::Executor;
use crate::runtime::engine::{DensePrecision, Engine, EngineOptions, ExpertPrecision, KvPrecision};
use crate::runtime::generate::{generate, GenerateOptions};
use crate::runtime::sampling::SamplingOptions;

pub use host::{git_revision, is_synthetic, peak_rss_bytes, reset_peak_rss, rfc3339_utc};
pub use plot::{plot_series, plot_svg, PlotSeries};
use prompts::tokenize_prompts;
pub use prompts::{prompt_set, BenchPrompt};
pub use record::{config_label, BenchRecord};
use record::{name_of, record, RecordContext};
pub use table::table;

#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub model: PathBuf,
    /// The first `prompts` prompts of the set.
    pub prompts: usize,
    pub blocks: usize,
    pub new_tokens: usize,
    /// Responses run before measuring, per configuration.
    pub warmup: usize,
    pub executors: Vec<Executor>,
    pub expert_precisions: Vec<ExpertPrecision>,
    /// Storage of the dense weights and of the KV cache, every configuration.
    /// Dense-weight and KV-cache storages to sweep (every pair, inside each expert
    /// precision).
    pub dense_precisions: Vec<DensePrecision>,
    pub kv_precisions: Vec<KvPrecision>,
    pub prefill_chunk: usize,
    /// `--tokenizer`: encodes the prompts and stands in for the model's own tokenizer.
    pub tokenizer: Option<PathBuf>,
    pub adapter: DeviceRequest,
    pub kernels: KernelOverrides,
    /// Expert slots per layer to sweep (None = all experts resident, or as many as
    /// `vram_budget` allows).
    pub resident_experts: Vec<Option<usize>>,
    /// `--vram`: the GPU memory every configuration may use; it derives the resident
    /// experts as `run --vram` does.
    pub vram_budget: Option<u64>,
    /// Cache policies to sweep (used below full residency).
    pub cache_policies: Vec<crate::residency::PolicyKind>,
    pub decay: f64,
    pub profile: Option<PathBuf>,
    pub staging_buffers: usize,
    /// Miss policies to sweep below full residency (empty: the default, auto).
    pub miss_policies: Vec<crate::residency::MissPolicy>,
    pub n_cpu_moe: usize,
    pub cpu_threads: Option<usize>,
    /// `--prefetch` values and `--fill-threads` counts to sweep below full residency
    /// (empty: the default), and `--prefetch-width`.
    pub prefetches: Vec<crate::residency::Prefetch>,
    pub fill_threads: Vec<usize>,
    pub prefetch_width: Option<usize>,
    /// Write each configuration's routing trace (see [`trace_path`]).
    pub trace: Option<PathBuf>,
    /// `--pipeline-depth` values to sweep (empty: the default).
    pub pipeline_depths: Vec<usize>,
    /// `--profile-kernels`: GPU time per stage and kernel in each record.
    pub profile_kernels: bool,
}

/// The trace file of configuration `index` of `count`: `base` itself for one
/// configuration, else `base` with `.index` before its extension (`t.jsonl` -> `t.2.jsonl`).
pub fn trace_path(base: &std::path::Path, index: usize, count: usize) -> PathBuf {
    if count <= 1 {
        return base.to_path_buf();
    }
    let stem = base
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let name = match base.extension() {
        Some(x) => format!("{stem}.{index}.{}", x.to_string_lossy()),
        None => format!("{stem}.{index}"),
    };
    base.with_file_name(name)
}

/// One point of the sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchConfig {
    pub expert_precision: ExpertPrecision,
    pub dense_precision: DensePrecision,
    pub kv_precision: KvPrecision,
    pub executor: Executor,
    pub resident_experts: Option<usize>,
    pub cache_policy: crate::residency::PolicyKind,
    /// None: the default (auto below full residency).
    pub miss_policy: Option<crate::residency::MissPolicy>,
    /// None: the defaults (next-layer below full residency with uploads; 2 fill threads).
    pub prefetch: Option<crate::residency::Prefetch>,
    pub fill_threads: Option<usize>,
    /// Decode steps in flight (`--pipeline-depth`).
    pub pipeline_depth: usize,
}

/// Every combination of the sweep lists, in the order given (precision outermost).
pub fn configurations(o: &BenchOptions) -> Vec<BenchConfig> {
    let mut v = Vec::new();
    let residents: Vec<Option<usize>> = if o.resident_experts.is_empty() {
        vec![None]
    } else {
        o.resident_experts.clone()
    };
    let policies = if o.cache_policies.is_empty() {
        vec![crate::residency::PolicyKind::Lru]
    } else {
        o.cache_policies.clone()
    };
    let misses: Vec<Option<crate::residency::MissPolicy>> = if o.miss_policies.is_empty() {
        vec![None]
    } else {
        o.miss_policies.iter().map(|&m| Some(m)).collect()
    };
    let prefetches: Vec<Option<crate::residency::Prefetch>> = if o.prefetches.is_empty() {
        vec![None]
    } else {
        o.prefetches.iter().map(|&p| Some(p)).collect()
    };
    let fills: Vec<Option<usize>> = if o.fill_threads.is_empty() {
        vec![None]
    } else {
        o.fill_threads.iter().map(|&n| Some(n)).collect()
    };
    let depths: Vec<usize> = if o.pipeline_depths.is_empty() {
        vec![crate::runtime::generate::DEFAULT_PIPELINE_DEPTH]
    } else {
        o.pipeline_depths.clone()
    };
    let pairs: Vec<(DensePrecision, KvPrecision)> = o
        .dense_precisions
        .iter()
        .flat_map(|&d| o.kv_precisions.iter().map(move |&k| (d, k)))
        .collect();
    for &expert_precision in &o.expert_precisions {
        for &(dense_precision, kv_precision) in &pairs {
            for &executor in &o.executors {
                for &resident_experts in &residents {
                    for &cache_policy in &policies {
                        for &miss_policy in &misses {
                            for &prefetch in &prefetches {
                                for &fill_threads in &fills {
                                    for &pipeline_depth in &depths {
                                        v.push(BenchConfig {
                                            expert_precision,
                                            dense_precision,
                                            kv_precision,
                                            executor,
                                            resident_experts,
                                            cache_policy,
                                            miss_policy,
                                            prefetch,
                                            fill_threads,
                                            pipeline_depth,
                                        });
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    v
}

pub(super) fn check_options(o: &BenchOptions, available: usize) -> Result<()> {
    if o.prompts == 0 || o.prompts > available {
        return Err(Error::option(
            "--prompts",
            format!(
                "{} is not in 1..={available} (the prompt set has {available})",
                o.prompts
            ),
        ));
    }
    if o.blocks == 0 {
        return Err(Error::option("--blocks", "must be at least 1"));
    }
    if o.new_tokens < 2 {
        return Err(Error::option(
            "--max-new-tokens",
            "must be at least 2 (the decode rate counts the tokens after the first)",
        ));
    }
    if o.executors.is_empty() {
        return Err(Error::option("--executor", "give at least one executor"));
    }
    if o.expert_precisions.is_empty() {
        return Err(Error::option(
            "--expert-precision",
            "give at least one precision",
        ));
    }
    if o.dense_precisions.is_empty() {
        return Err(Error::option(
            "--dense-precision",
            "give at least one precision",
        ));
    }
    if o.kv_precisions.is_empty() {
        return Err(Error::option(
            "--kv-precision",
            "give at least one precision",
        ));
    }
    if o.prefill_chunk == 0 {
        return Err(Error::option("--prefill-chunk", "must be at least 1"));
    }
    o.blocks
        .checked_mul(o.prompts)
        .and_then(|n| n.checked_add(o.warmup))
        .ok_or_else(|| {
            Error::option(
                "--blocks",
                format!(
                    "{} blocks x {} prompts + {} warm-up responses overflow",
                    o.blocks, o.prompts, o.warmup
                ),
            )
        })?;
    Ok(())
}

/// The engine options of one configuration.
pub(super) fn engine_options(
    o: &BenchOptions,
    c: &BenchConfig,
    max_context: usize,
) -> EngineOptions {
    EngineOptions {
        residency: crate::runtime::engine::ResidencyOptions {
            resident_experts: c.resident_experts,
            vram_budget: o.vram_budget,
            policy: c.cache_policy,
            decay: o.decay,
            profile: o.profile.clone(),
            staging_buffers: o.staging_buffers,
            record_profile: false,
            miss_policy: c.miss_policy,
            n_cpu_moe: o.n_cpu_moe,
            cpu_threads: o.cpu_threads,
            prefetch: c.prefetch,
            prefetch_width: o.prefetch_width,
            fill_threads: c.fill_threads,
        },
        adapter: o.adapter.clone(),
        kernels: o.kernels,
        expert_precision: c.expert_precision,
        dense_precision: c.dense_precision,
        kv_precision: c.kv_precision,
        executor: c.executor,
        max_context,
        prefill_chunk: o.prefill_chunk,
        all_logits: false,
        score_rows: 0,
        batch: 1,
    }
}

/// Every configuration of a sweep checked as far as it can be without the GPU
/// (the checkpoint against the config, admission, the cache policy and its profile), so
/// that a sweep never fails on an option after minutes of measuring.
pub(super) fn validate(
    o: &BenchOptions,
    cfg: &crate::config::ModelConfig,
    max_context: usize,
) -> Result<()> {
    let ckpt = crate::format::checkpoint::Checkpoint::open(&o.model)?;
    for c in sweep(o, cfg) {
        crate::runtime::engine::check_host(cfg, &ckpt, &engine_options(o, &c, max_context))
            .map_err(|e| {
                Error::Other(format!(
                    "configuration `{}` cannot run (nothing was measured): {e}",
                    describe(&c)
                ))
            })?;
    }
    Ok(())
}

/// "int4/grouped/resident 2/lru".
pub(super) fn describe(c: &BenchConfig) -> String {
    format!(
        "--expert-precision {} --executor {} --pipeline-depth {}{}",
        name_of(&c.expert_precision),
        name_of(&c.executor),
        c.pipeline_depth,
        c.resident_experts
            .map(|n| format!(
                " --resident-experts {n} --cache-policy {}{}",
                c.cache_policy.as_str(),
                c.miss_policy
                    .map(|m| format!(" --miss-policy {}", m.name()))
                    .unwrap_or_default()
                    + &c.prefetch
                        .map(|p| format!(" --prefetch {}", p.name()))
                        .unwrap_or_default()
                    + &c.fill_threads
                        .map(|n| format!(" --fill-threads {n}"))
                        .unwrap_or_default()
            ))
            .unwrap_or_default()
    )
}

/// The configurations to measure: a cache policy only matters below full residency, so
/// there is one full-residency configuration per (precision, executor).
pub(super) fn sweep(o: &BenchOptions, cfg: &crate::config::ModelConfig) -> Vec<BenchConfig> {
    let mut configs: Vec<BenchConfig> = Vec::new();
    for c in configurations(o) {
        // Under a --vram budget "all" may be partial residency: nothing collapses.
        let full =
            o.vram_budget.is_none() && c.resident_experts.is_none_or(|n| n >= cfg.num_experts);
        let dup = full
            && configs.iter().any(|d| {
                d.expert_precision == c.expert_precision
                    && d.dense_precision == c.dense_precision
                    && d.kv_precision == c.kv_precision
                    && d.executor == c.executor
                    && d.pipeline_depth == c.pipeline_depth
                    && d.resident_experts.is_none_or(|n| n >= cfg.num_experts)
            });
        if !dup {
            configs.push(c);
        }
    }
    configs
}

/// What one measured response contributes.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Response {
    pub(super) block: usize,
    pub(super) prompt_tokens: usize,
    pub(super) tokens: usize,
    pub(super) ttft_s: f64,
    pub(super) decode_s: f64,
    pub(super) response_s: f64,
    pub(super) dispatches: u64,
    pub(super) submissions: u64,
    pub(super) pipeline_depth: usize,
    pub(super) steps_in_flight_max: usize,
    pub(super) host_wait_s: f64,
    pub(super) encode_s: Option<f64>,
    pub(super) decode_misses: u64,
}

/// Run the whole sweep. `on_record` sees each configuration's record as soon as it is done
/// (to print progress); errors end the sweep.
pub fn run_bench(
    o: &BenchOptions,
    on_record: &mut dyn FnMut(&BenchRecord),
) -> Result<Vec<BenchRecord>> {
    let (set_name, all) = prompt_set()?;
    check_options(o, all.len())?;
    let prompts = &all[..o.prompts];
    let (cfg, _) = Engine::open_config(&o.model)?;
    if o.new_tokens >= cfg.max_position_embeddings {
        return Err(Error::option(
            "--max-new-tokens",
            format!(
                "{} new tokens leave no room for a prompt: max_position_embeddings = {}",
                o.new_tokens, cfg.max_position_embeddings
            ),
        ));
    }
    let limit = cfg.max_position_embeddings - o.new_tokens;
    let tp = tokenize_prompts(
        &o.model,
        o.tokenizer.as_deref(),
        prompts,
        cfg.vocab_size,
        limit,
    )?;
    let longest = tp.ids.iter().map(Vec::len).max().unwrap_or(1);
    let max_context = longest + o.new_tokens;
    validate(o, &cfg, max_context)?;
    let synthetic = is_synthetic(&o.model);
    let mut notes = tp.notes.clone();
    if synthetic {
        notes.insert(
            0,
            format!(
                "synthetic model (wgmoe synth): {}",
                crate::synth::routing_note(host::synthetic_router_skew(&o.model))
            ),
        );
    }
    if o.trace.is_some() {
        notes.push(
            "routing traced (--trace): every layer's routing is read back, so rates are lower than untraced".to_string(),
        );
    }
    let git = git_revision();
    let mut records = Vec::new();
    let configs = sweep(o, &cfg);
    for (ci, c) in configs.iter().enumerate() {
        let rss_reset = reset_peak_rss();
        let mut engine = Engine::load_with(
            &o.model,
            &engine_options(o, c, max_context),
            given_tokenizer(o)?,
        )
        .map_err(|e| Error::Other(format!("configuration {}: {e}", describe(c))))?;
        if let Some(base) = &o.trace {
            let path = trace_path(base, ci, configs.len());
            engine.start_trace(Some(&path), c.cache_policy.as_str(), o.decay, Vec::new())?;
            if let Some(t) = engine.fwd.trace.as_mut() {
                t.set_warmup(o.warmup > 0);
            }
        }
        if o.profile_kernels {
            if engine.fwd.residency.is_some() || engine.fwd.trace.is_some() {
                return Err(Error::option(
                    "--profile-kernels",
                    format!(
                        "configuration {}: profiles steps with every expert resident and no --trace",
                        describe(c)
                    ),
                ));
            }
            engine.fwd.kernel_profile = Some(Default::default());
        }
        let gen_opts = GenerateOptions {
            max_new_tokens: o.new_tokens,
            sampling: SamplingOptions::greedy(),
            eos_ids: engine.eos_ids(),
            ignore_eos: true,
            record_logits: false,
            pipeline_depth: c.pipeline_depth,
        };
        let total = o.warmup + o.blocks * prompts.len();
        let pb = indicatif::ProgressBar::with_draw_target(
            Some(total as u64),
            indicatif::ProgressDrawTarget::stderr(),
        );
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "bench {prefix} {bar:30} {pos}/{len} responses {elapsed} {msg}",
        ) {
            pb.set_style(style);
        }
        pb.set_prefix(format!(
            "{}/{}/{}",
            name_of(&c.expert_precision),
            name_of(&c.executor),
            match (c.resident_experts, o.vram_budget) {
                (Some(n), _) => n.to_string(),
                (None, Some(b)) => format!("vram {b} B"),
                (None, None) => "all".to_string(),
            }
        ));
        // Without a terminal the bar is hidden: plain lines say how far the sweep is.
        let plain = pb.is_hidden();
        if plain {
            eprintln!(
                "bench: configuration {} of {}: {} ({})",
                ci + 1,
                configs.len(),
                describe(c),
                crate::units::count(total, "response")
            );
        }
        let mut responses: Vec<Response> = Vec::new();
        for k in 0..total {
            let p = &tp.ids[k % prompts.len()];
            let t0 = Instant::now();
            let g = generate(&mut engine.fwd, p, &gen_opts, &mut |_| Ok(()))?;
            if g.interrupted {
                pb.finish_and_clear();
                return Err(Error::Interrupted);
            }
            let response_s = t0.elapsed().as_secs_f64();
            if g.generated_ids.len() != o.new_tokens {
                return Err(Error::Other(format!(
                    "internal: a bench response has {} tokens, expected {} (EOS is suppressed)",
                    g.generated_ids.len(),
                    o.new_tokens
                )));
            }
            if k >= o.warmup {
                let r = Response {
                    block: (k - o.warmup) / prompts.len(),
                    prompt_tokens: p.len(),
                    tokens: g.generated_ids.len(),
                    ttft_s: g.ttft_s,
                    decode_s: g.decode_s,
                    response_s,
                    dispatches: g.dispatches,
                    submissions: g.submissions,
                    pipeline_depth: g.pipeline_depth,
                    steps_in_flight_max: g.decode_steps_in_flight_max,
                    host_wait_s: g.decode_host_wait_s,
                    encode_s: g.decode_encode_s,
                    decode_misses: g.decode_expert_misses,
                };
                pb.set_message(format!("{:.2} tok/s", g.decode_tokens_per_s()));
                responses.push(r);
                let done = k + 1 - o.warmup;
                if plain && done.is_multiple_of(prompts.len()) {
                    let block: Vec<&Response> = responses[done - prompts.len()..].iter().collect();
                    let tokens: usize = block.iter().map(|r| r.tokens.saturating_sub(1)).sum();
                    let secs: f64 = block.iter().map(|r| r.decode_s).sum();
                    eprintln!(
                        "bench:   block {} of {}: decode {:.2} tok/s",
                        done / prompts.len(),
                        o.blocks,
                        tokens as f64 / secs.max(1e-9)
                    );
                }
            } else {
                pb.set_message("warm-up");
            }
            if k + 1 == o.warmup {
                // Residency counters cover the measured responses only.
                if let Some(r) = engine.fwd.residency.as_mut() {
                    r.reset_stats();
                }
                if let Some(t) = engine.fwd.trace.as_mut() {
                    t.set_warmup(false);
                }
                if let Some(p) = engine.fwd.kernel_profile.as_mut() {
                    *p = Default::default();
                }
            }
            pb.inc(1);
        }
        pb.finish_and_clear();
        engine.finish_trace()?;
        let rec = record(
            o,
            c,
            &engine,
            &responses,
            RecordContext {
                set_name: &set_name,
                prompts,
                prompt_tokens: tp.ids.iter().map(Vec::len).collect(),
                max_context,
                synthetic,
                notes: &notes,
                git: &git,
                rss_scope: if rss_reset {
                    "configuration"
                } else {
                    "process"
                },
            },
        );
        on_record(&rec);
        records.push(rec);
        drop(engine);
    }
    Ok(records)
}

/// `--tokenizer`'s tokenizer, built for each engine (the model's own is not built then).
fn given_tokenizer(o: &BenchOptions) -> Result<Option<crate::tokenizer::Tokenizer>> {
    o.tokenizer
        .as_deref()
        .map(|f| crate::gguf::tokenizer::override_for(&o.model, f))
        .transpose()
}

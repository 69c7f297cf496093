//! `wgmoe bench`: the measurement contract of DESIGN.md section 4.
//!
//! A fixed prompt set shipped in the repository (`bench/prompts.json`, 12 prompts: prose,
//! code, math and chat, short, medium and long), repeated in blocks, a fixed number of new
//! tokens, greedy decoding with EOS suppressed (every response has exactly `n` tokens),
//! warm-up responses excluded, concurrency 1. Sweep options are lists: each combination is
//! one configuration, with its own engine (and GPU context, so its GPU peak is its own).
//!
//! Per configuration the pooled decode rate is sum(tokens - 1) / sum(decode time after the
//! first token), not a mean of rates. A benchmark measures; it never asserts a time.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::engine::{Engine, EngineOptions, ExpertPrecision};
use crate::error::{Error, Result};
use crate::generate::{generate, GenerateOptions};
use crate::backend::{DeviceRequest, KernelOverrides};
use crate::model::Executor;
use crate::sampling::SamplingOptions;

const PROMPTS_JSON: &str = include_str!("../bench/prompts.json");

#[derive(Clone, Debug, serde::Deserialize, serde::Serialize)]
pub struct BenchPrompt {
    pub id: String,
    pub kind: String,
    pub length: String,
    pub text: String,
}

#[derive(serde::Deserialize)]
struct PromptFile {
    name: String,
    prompts: Vec<BenchPrompt>,
}

/// The shipped prompt set: (name, prompts).
pub fn prompt_set() -> Result<(String, Vec<BenchPrompt>)> {
    let f: PromptFile = serde_json::from_str(PROMPTS_JSON).map_err(|e| {
        Error::bad_file(
            "bench/prompts.json",
            format!("invalid (built into the binary): {e}"),
        )
    })?;
    Ok((f.name, f.prompts))
}

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
    pub prefill_chunk: usize,
    pub adapter: DeviceRequest,
    pub kernels: KernelOverrides,
    /// Expert slots per layer to sweep (None = all experts resident).
    pub resident_experts: Vec<Option<usize>>,
    /// Cache policies to sweep (used below full residency).
    pub cache_policies: Vec<crate::residency::PolicyKind>,
    pub decay: f64,
    pub profile: Option<PathBuf>,
    pub staging_buffers: usize,
}

/// One point of the sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchConfig {
    pub expert_precision: ExpertPrecision,
    pub executor: Executor,
    pub resident_experts: Option<usize>,
    pub cache_policy: crate::residency::PolicyKind,
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
    for &expert_precision in &o.expert_precisions {
        for &executor in &o.executors {
            for &resident_experts in &residents {
                for &cache_policy in &policies {
                    v.push(BenchConfig {
                        expert_precision,
                        executor,
                        resident_experts,
                        cache_policy,
                    });
                }
            }
        }
    }
    v
}

/// One configuration's measurements. Field names are stable (documented in README.md,
/// "## Benchmarks"); `None` serialises as null.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchRecord {
    // Identity of the run.
    pub wgmoe_version: String,
    pub git_revision: String,
    pub date_utc: String,
    pub model_dir: String,
    pub model_type: String,
    pub config_hash: String,
    pub synthetic: bool,
    pub note: Option<String>,
    pub adapter: String,
    /// The device type of the adapter: DiscreteGpu, IntegratedGpu, VirtualGpu, Cpu
    /// (software, e.g. lavapipe) or Other.
    pub adapter_type: String,
    pub backend: String,
    pub driver: String,
    // The configuration.
    pub expert_precision: ExpertPrecision,
    pub executor: Executor,
    pub resident_experts_per_layer: Option<usize>,
    pub cache_policy: Option<String>,
    pub num_experts: usize,
    pub top_k: usize,
    pub num_layers: usize,
    // The protocol.
    pub prompt_set: String,
    pub prompts: usize,
    pub prompt_names: Vec<String>,
    pub prompt_tokens: Vec<usize>,
    pub blocks: usize,
    pub new_tokens: usize,
    pub warmup: usize,
    pub responses: usize,
    pub concurrency: usize,
    pub greedy: bool,
    pub ignore_eos: bool,
    pub max_context: usize,
    pub prefill_chunk: usize,
    // Results.
    pub generated_tokens: u64,
    pub decode_tokens: u64,
    pub decode_s: f64,
    pub decode_tokens_per_s: f64,
    pub block_decode_tokens_per_s: Vec<f64>,
    pub block_rate_spread: f64,
    pub ttft_s_mean: f64,
    pub response_s_mean: f64,
    pub prefill_tokens: u64,
    pub prefill_tokens_per_s: f64,
    pub load_s: f64,
    pub peak_gpu_bytes: u64,
    pub peak_rss_bytes: Option<u64>,
    pub peak_rss_scope: Option<String>,
    pub dispatches_per_token: f64,
    pub submissions_per_token: f64,
    pub dispatches_per_decode_step: usize,
    // Residency counters (filled by the residency work; null until then).
    pub h2d_bytes: Option<u64>,
    pub expert_hits: Option<u64>,
    pub expert_misses: Option<u64>,
    pub expert_evictions: Option<u64>,
    pub upload_seconds_per_miss: Option<f64>,
    pub expert_misses_per_token: f64,
}

/// Peak resident set size of this process (Linux: VmHWM of /proc/self/status).
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Reset the peak RSS to the current RSS (Linux >= 4.0: "5" to /proc/self/clear_refs).
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The git revision of the source tree this binary was built from: `WGMOE_GIT_REVISION`
/// if set, else `git rev-parse HEAD` in the build's source directory (with `-dirty` when
/// tracked files differ), else "unknown". Never fails.
pub fn git_revision() -> String {
    if let Ok(v) = std::env::var("WGMOE_GIT_REVISION") {
        if !v.trim().is_empty() {
            return v.trim().to_string();
        }
    }
    let dir = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    match git(&["rev-parse", "HEAD"]) {
        Some(rev) if rev.len() >= 7 => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{rev}-dirty")
            } else {
                rev
            }
        }
        _ => "unknown".to_string(),
    }
}

/// `t` as RFC 3339 UTC, to the second (e.g. 2025-01-31T12:00:00Z).
pub fn rfc3339_utc(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Whether a model directory's config.json marks it synthetic (`wgmoe synth`).
pub fn is_synthetic(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| {
            v.get("wgmoe_synthetic")
                .and_then(serde_json::Value::as_bool)
        })
        .unwrap_or(false)
}

/// Prompt token ids for the bench, cut to `limit` tokens each.
struct Prompts {
    ids: Vec<Vec<u32>>,
    notes: Vec<String>,
}

fn tokenize_prompts(
    dir: &Path,
    prompts: &[BenchPrompt],
    vocab: usize,
    limit: usize,
) -> Result<Prompts> {
    let (_, _, tok) = Engine::open_host(dir)?;
    let mut notes = Vec::new();
    let mut ids = Vec::new();
    if tok.is_none() {
        notes.push("no tokenizer.json: prompts are their UTF-8 bytes as token ids".to_string());
    }
    let mut cut = Vec::new();
    for p in prompts {
        let mut v = match &tok {
            Some(t) => t.encode(&p.text, true)?,
            None => p.text.bytes().map(|b| b as u32 % vocab as u32).collect(),
        };
        if v.is_empty() {
            return Err(Error::Tokenizer(format!(
                "bench prompt `{}` encodes to no tokens",
                p.id
            )));
        }
        if let Some(&bad) = v.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Tokenizer(format!(
                "bench prompt `{}`: token id {bad} is outside the vocabulary ({vocab})",
                p.id
            )));
        }
        if v.len() > limit {
            cut.push(format!("{} ({} -> {})", p.id, v.len(), limit));
            v.truncate(limit);
        }
        ids.push(v);
    }
    if !cut.is_empty() {
        notes.push(format!(
            "prompts cut to max_position_embeddings - n = {limit} tokens: {}",
            cut.join(", ")
        ));
    }
    Ok(Prompts { ids, notes })
}

fn check_options(o: &BenchOptions, available: usize) -> Result<()> {
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
fn engine_options(o: &BenchOptions, c: &BenchConfig, max_context: usize) -> EngineOptions {
    EngineOptions {
        residency: crate::engine::ResidencyOptions {
            resident_experts: c.resident_experts,
            vram_budget: None,
            policy: c.cache_policy,
            decay: o.decay,
            profile: o.profile.clone(),
            staging_buffers: o.staging_buffers,
            record_profile: false,
        },
        adapter: o.adapter.clone(),
        kernels: o.kernels,
        expert_precision: c.expert_precision,
        executor: c.executor,
        max_context,
        prefill_chunk: o.prefill_chunk,
        all_logits: false,
    }
}

/// Every configuration of a sweep checked as far as it can be without the GPU
/// (the checkpoint against the config, admission, the cache policy and its profile), so
/// that a sweep never fails on an option after minutes of measuring.
fn validate(o: &BenchOptions, cfg: &crate::config::ModelConfig, max_context: usize) -> Result<()> {
    let ckpt = crate::checkpoint::Checkpoint::open(&o.model)?;
    for c in sweep(o, cfg) {
        crate::engine::check_host(cfg, &ckpt, &engine_options(o, &c, max_context)).map_err(
            |e| {
                Error::Other(format!(
                    "configuration `{}` cannot run (nothing was measured): {e}",
                    describe(&c)
                ))
            },
        )?;
    }
    Ok(())
}

/// "int4/grouped/resident 2/lru".
fn describe(c: &BenchConfig) -> String {
    format!(
        "--expert-precision {} --executor {}{}",
        name_of(&c.expert_precision),
        name_of(&c.executor),
        c.resident_experts
            .map(|n| format!(
                " --resident-experts {n} --cache-policy {}",
                c.cache_policy.as_str()
            ))
            .unwrap_or_default()
    )
}

/// The configurations to measure: a cache policy only matters below full residency, so
/// there is one full-residency configuration per (precision, executor).
fn sweep(o: &BenchOptions, cfg: &crate::config::ModelConfig) -> Vec<BenchConfig> {
    let mut configs: Vec<BenchConfig> = Vec::new();
    for c in configurations(o) {
        let full = c.resident_experts.is_none_or(|n| n >= cfg.num_experts);
        let dup = full
            && configs.iter().any(|d| {
                d.expert_precision == c.expert_precision
                    && d.executor == c.executor
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
struct Response {
    block: usize,
    prompt_tokens: usize,
    tokens: usize,
    ttft_s: f64,
    decode_s: f64,
    response_s: f64,
    dispatches: u64,
    submissions: u64,
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
    let (cfg, _, _) = Engine::open_host(&o.model)?;
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
    let tp = tokenize_prompts(&o.model, prompts, cfg.vocab_size, limit)?;
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
                crate::synth::NOTE_UNIFORM_ROUTING
            ),
        );
    }
    let git = git_revision();
    let mut records = Vec::new();
    for c in sweep(o, &cfg) {
        let rss_reset = reset_peak_rss();
        let mut engine = Engine::load(&o.model, &engine_options(o, &c, max_context))
            .map_err(|e| Error::Other(format!("configuration {}: {e}", describe(&c))))?;
        let gen_opts = GenerateOptions {
            max_new_tokens: o.new_tokens,
            sampling: SamplingOptions::greedy(),
            eos_ids: engine.eos_ids(),
            ignore_eos: true,
            record_logits: false,
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
            c.resident_experts
                .map_or("all".to_string(), |n| n.to_string())
        ));
        let mut responses = Vec::new();
        for k in 0..total {
            let p = &tp.ids[k % prompts.len()];
            let t0 = Instant::now();
            let g = generate(&mut engine.fwd, p, &gen_opts, &mut |_| Ok(()))?;
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
                };
                pb.set_message(format!("{:.2} tok/s", g.decode_tokens_per_s()));
                responses.push(r);
            } else {
                pb.set_message("warm-up");
            }
            if k + 1 == o.warmup {
                // Residency counters cover the measured responses only.
                if let Some(r) = engine.fwd.residency.as_mut() {
                    r.reset_stats();
                }
            }
            pb.inc(1);
        }
        pb.finish_and_clear();
        let rec = record(
            o,
            &c,
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

/// "int4/grouped": a configuration's label in tables and logs.
pub fn config_label(r: &BenchRecord) -> String {
    let res = match (r.resident_experts_per_layer, &r.cache_policy) {
        (Some(n), Some(p)) if n < r.num_experts => format!("/{n}of{} {p}", r.num_experts),
        _ => String::new(),
    };
    format!(
        "{}/{}{res}",
        name_of(&r.expert_precision),
        name_of(&r.executor)
    )
}

fn name_of<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

struct RecordContext<'a> {
    set_name: &'a str,
    prompts: &'a [BenchPrompt],
    prompt_tokens: Vec<usize>,
    max_context: usize,
    synthetic: bool,
    notes: &'a [String],
    git: &'a str,
    rss_scope: &'static str,
}

fn record(
    o: &BenchOptions,
    c: &BenchConfig,
    engine: &Engine,
    rs: &[Response],
    x: RecordContext,
) -> BenchRecord {
    let n = rs.len().max(1) as f64;
    let decode_tokens: u64 = rs.iter().map(|r| r.tokens.saturating_sub(1) as u64).sum();
    let decode_s: f64 = rs.iter().map(|r| r.decode_s).sum();
    let generated: u64 = rs.iter().map(|r| r.tokens as u64).sum();
    let prefill_tokens: u64 = rs.iter().map(|r| r.prompt_tokens as u64).sum();
    let ttft_sum: f64 = rs.iter().map(|r| r.ttft_s).sum();
    let rate = |t: u64, s: f64| if s > 0.0 { t as f64 / s } else { 0.0 };
    let blocks: Vec<f64> = (0..o.blocks)
        .map(|b| {
            let it = rs.iter().filter(|r| r.block == b);
            let t: u64 = it.clone().map(|r| r.tokens.saturating_sub(1) as u64).sum();
            rate(t, it.map(|r| r.decode_s).sum())
        })
        .collect();
    let mean = blocks.iter().sum::<f64>() / blocks.len().max(1) as f64;
    let (lo, hi) = blocks.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &r| {
        (lo.min(r), hi.max(r))
    });
    let spread = if mean > 0.0 { (hi - lo) / mean } else { 0.0 };
    let dispatches: u64 = rs.iter().map(|r| r.dispatches).sum();
    let submissions: u64 = rs.iter().map(|r| r.submissions).sum();
    let cfg = &engine.cfg;
    let res = engine
        .fwd
        .residency
        .as_ref()
        .map(|r| r.stats())
        .unwrap_or_default();
    let partial = engine.resident_experts < cfg.num_experts;
    BenchRecord {
        wgmoe_version: env!("CARGO_PKG_VERSION").to_string(),
        git_revision: x.git.to_string(),
        date_utc: rfc3339_utc(std::time::SystemTime::now()),
        model_dir: engine.dir.display().to_string(),
        model_type: cfg.arch.model_type().to_string(),
        config_hash: cfg.source_hash.clone(),
        synthetic: x.synthetic,
        note: (!x.notes.is_empty()).then(|| x.notes.join("; ")),
        adapter: engine.dev.info().name.clone(),
        adapter_type: format!("{:?}", engine.dev.info().device_type),
        backend: engine.dev.info().backend.clone(),
        driver: engine.dev.info().driver_string(),
        expert_precision: c.expert_precision,
        executor: c.executor,
        resident_experts_per_layer: Some(engine.resident_experts),
        cache_policy: partial.then(|| c.cache_policy.as_str().to_string()),
        num_experts: cfg.num_experts,
        top_k: cfg.top_k,
        num_layers: cfg.num_layers,
        prompt_set: x.set_name.to_string(),
        prompts: x.prompts.len(),
        prompt_names: x.prompts.iter().map(|p| p.id.clone()).collect(),
        prompt_tokens: x.prompt_tokens,
        blocks: o.blocks,
        new_tokens: o.new_tokens,
        warmup: o.warmup,
        responses: rs.len(),
        concurrency: 1,
        greedy: true,
        ignore_eos: true,
        max_context: x.max_context,
        prefill_chunk: o.prefill_chunk,
        generated_tokens: generated,
        decode_tokens,
        decode_s,
        decode_tokens_per_s: rate(decode_tokens, decode_s),
        block_decode_tokens_per_s: blocks,
        block_rate_spread: spread,
        ttft_s_mean: ttft_sum / n,
        response_s_mean: rs.iter().map(|r| r.response_s).sum::<f64>() / n,
        prefill_tokens,
        prefill_tokens_per_s: rate(prefill_tokens, ttft_sum),
        load_s: engine.load_s,
        peak_gpu_bytes: engine.dev.tracker().peak(),
        peak_rss_bytes: peak_rss_bytes(),
        peak_rss_scope: peak_rss_bytes().map(|_| x.rss_scope.to_string()),
        dispatches_per_token: dispatches as f64 / generated.max(1) as f64,
        submissions_per_token: submissions as f64 / generated.max(1) as f64,
        dispatches_per_decode_step: engine.fwd.dispatches_per_decode_step(),
        h2d_bytes: Some(res.h2d_bytes),
        expert_hits: Some(res.expert_hits),
        expert_misses: Some(res.expert_misses),
        expert_evictions: Some(res.expert_evictions),
        upload_seconds_per_miss: (res.expert_misses > 0)
            .then(|| res.upload_seconds / res.expert_misses as f64),
        expert_misses_per_token: res.expert_misses as f64 / generated.max(1) as f64,
    }
}

fn bytes_or_dash(b: Option<u64>) -> String {
    b.map(crate::inspect::human).unwrap_or_else(|| "-".into())
}

/// The records as a readable table, then the notes.
pub fn table(records: &[BenchRecord]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<30} {:>9} {:>7} {:>8} {:>8} {:>9} {:>10} {:>10} {:>8} {:>8} {:>9} {:>10} {:>9}",
        "configuration",
        "decode/s",
        "spread",
        "TTFT s",
        "resp s",
        "prefill/s",
        "peak GPU",
        "peak RSS",
        "disp/tok",
        "subm/tok",
        "miss/tok",
        "H2D",
        "ms/miss"
    );
    for r in records {
        let _ = writeln!(
            o,
            "{:<30} {:>9.2} {:>6.1}% {:>8.3} {:>8.3} {:>9.1} {:>10} {:>10} {:>8.1} {:>8.2} {:>9.2} {:>10} {:>9}",
            config_label(r),
            r.decode_tokens_per_s,
            100.0 * r.block_rate_spread,
            r.ttft_s_mean,
            r.response_s_mean,
            r.prefill_tokens_per_s,
            crate::inspect::human(r.peak_gpu_bytes),
            bytes_or_dash(r.peak_rss_bytes),
            r.dispatches_per_token,
            r.submissions_per_token,
            r.expert_misses_per_token,
            bytes_or_dash(r.h2d_bytes),
            r.upload_seconds_per_miss.map_or("-".to_string(), |s| format!("{:.3}", s * 1e3))
        );
    }
    if let Some(r) = records.first() {
        let _ = writeln!(
            o,
            "{} ({}); adapter {} ({}, {}); {} prompts x {} blocks, {} new tokens (greedy, EOS suppressed), {} warm-up; {} decode tokens per configuration; wgmoe {} {} {}",
            r.model_dir,
            r.model_type,
            r.adapter,
            r.backend,
            r.driver,
            r.prompts,
            r.blocks,
            r.new_tokens,
            r.warmup,
            r.decode_tokens,
            r.wgmoe_version,
            r.git_revision,
            r.date_utc
        );
        if let Some(n) = &r.note {
            let _ = writeln!(o, "note: {n}");
        }
    }
    o
}

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

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// About `n` round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten).
fn nice_ticks(lo: f64, hi: f64, n: usize, integer: bool) -> Vec<f64> {
    let span = (hi - lo).max(f64::MIN_POSITIVE);
    let raw = span / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let mut step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * mag);
    if integer {
        step = step.max(1.0).round();
    }
    let first = (lo / step).ceil() * step;
    let mut v = Vec::new();
    let mut t = first;
    while t <= hi + step * 1e-9 && v.len() < 50 {
        v.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    v
}

fn tick_label(v: f64) -> String {
    if v == v.round() && v.abs() < 1e15 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Bytes unit for an axis whose values reach `max`: (divisor, name).
fn byte_unit(max: f64) -> (f64, &'static str) {
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

const PLOT_COLORS: [&str; 8] = [
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
                "adapter {} ({}, {})\n{} prompts x {} blocks, {} new tokens; {}; wgmoe {} {}",
                r.adapter,
                r.backend,
                r.driver,
                r.prompts,
                r.blocks,
                r.new_tokens,
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
    if x1 - x0 < 1.0 {
        (x0, x1) = (x0 - 1.0, x1 + 1.0);
    }
    let pad = (x1 - x0) * 0.05;
    let (x0, x1) = ((x0 - pad).max(0.0), x1 + pad);
    let sx = |x: f64| left + (x - x0) / (x1 - x0) * (right - left);
    let xticks = nice_ticks(x0, x1, 8, true);
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
                r##"<line x1="{x:.1}" y1="{bottom}" x2="{x:.1}" y2="{:.1}" stroke="#333"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
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
    use super::*;

    #[test]
    fn the_prompt_set_has_twelve_distinct_prompts() {
        let (name, p) = prompt_set().unwrap();
        assert!(!name.is_empty());
        assert_eq!(p.len(), 12);
        let ids: std::collections::HashSet<_> = p.iter().map(|p| &p.id).collect();
        assert_eq!(ids.len(), 12);
        for kind in ["prose", "code", "math", "chat"] {
            assert!(p.iter().filter(|p| p.kind == kind).count() >= 3, "{kind}");
        }
        assert!(p.iter().any(|p| p.length == "short") && p.iter().any(|p| p.length == "long"));
    }

    #[test]
    fn rfc3339_known_dates() {
        use std::time::{Duration, UNIX_EPOCH};
        assert_eq!(rfc3339_utc(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339_utc(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(
            rfc3339_utc(UNIX_EPOCH + Duration::from_secs(1_735_689_599)),
            "2024-12-31T23:59:59Z"
        );
    }
}

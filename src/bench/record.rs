//! One configuration's record: what was measured, on what, with which settings.

use super::host::{peak_rss_bytes, rfc3339_utc};
use super::prompts::BenchPrompt;
use super::{BenchConfig, BenchOptions, Response};
use crate::model::Executor;
use crate::runtime::engine::{DensePrecision, Engine, ExpertPrecision};

/// One configuration's measurements. Field names are stable (documented in docs/benchmarks.md,
/// "`wgmoe bench`"); `None` serialises as null.
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
    pub dense_precision: DensePrecision,
    pub kv_precision: String,
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
    /// The depth decode ran at (`--pipeline-depth`, 1 where the host must see each step),
    /// the most steps in flight at once, and the host's seconds waiting for tokens per
    /// decoded token.
    pub pipeline_depth: usize,
    pub decode_steps_in_flight_max: usize,
    pub decode_host_wait_s_per_token: f64,
    /// Bytes a decode step reads at batch 1 at the mean context of the decode steps
    /// (mean prompt + half the new tokens), and bytes_per_token x decode_tokens_per_s.
    pub bytes_per_token: u64,
    pub effective_gb_per_s: f64,
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
    /// Decode misses per decode token (the prompt's misses are in `expert_misses` only).
    pub expert_misses_per_token: f64,
    // CPU experts (null without a residency runtime).
    pub miss_policy: Option<crate::residency::MissPolicy>,
    pub uploaded_misses: Option<u64>,
    pub cpu_expert_pairs: Option<u64>,
    pub cpu_expert_seconds: Option<f64>,
    pub n_cpu_moe: usize,
    pub cost_figures: Option<crate::residency::CostFigures>,
    // Hiding the copies (null without a residency runtime).
    pub prefetch: Option<crate::residency::Prefetch>,
    pub prefetch_width: Option<usize>,
    pub fill_threads: Option<usize>,
    pub upload_stall_seconds: Option<f64>,
    pub prefetch_issued: Option<u64>,
    pub prefetch_used: Option<u64>,
    pub prefetch_wasted_bytes: Option<u64>,
    pub prefetch_accuracy: Option<f64>,
    pub prefetch_accuracy_per_layer: Option<Vec<Option<f64>>>,
    /// `--prefetch next-layer`'s gate: the layers it holds back at the end, and the
    /// guesses it judged without copying.
    pub prefetch_gated_layers: Option<Vec<usize>>,
    pub prefetch_held_back: Option<u64>,
    /// Seconds compiling pipelines while this configuration loaded, and the pipeline cache
    /// (`loaded`, `created`, `replaced`, `off`, `unsupported`).
    pub pipeline_compile_s: f64,
    pub pipeline_cache: String,
    // `--profile-kernels` (null without it).
    pub profile_clock: Option<crate::backend::ProfileClock>,
    pub profile: Option<Vec<crate::insight::kernel_profile::ProfileRow>>,
    pub gpu_s_per_token: Option<f64>,
    pub gpu_busy_fraction: Option<f64>,
    pub host_s_per_token: Option<f64>,
}

/// "int4/grouped": a configuration's label in tables and logs.
pub fn config_label(r: &BenchRecord) -> String {
    let mut res = match (r.resident_experts_per_layer, &r.cache_policy) {
        (Some(n), Some(p)) if n < r.num_experts => format!("/{n}of{} {p}", r.num_experts),
        _ => String::new(),
    };
    if let Some(m) = r.miss_policy.filter(|_| !res.is_empty()) {
        res.push_str(&format!(" miss {}", m.name()));
    }
    if r.n_cpu_moe > 0 {
        res.push_str(&format!(" n-cpu-moe {}", r.n_cpu_moe));
    }
    if let (Some(p), Some(t), false) = (r.prefetch, r.fill_threads, res.is_empty()) {
        res.push_str(&format!(" prefetch {} fills {t}", p.name()));
    }
    // Storages other than the defaults (q8_0 dense weights, an f16 KV cache).
    let mut store = String::new();
    if r.dense_precision != DensePrecision::Q8_0 {
        store.push_str(&format!(" {}", r.dense_precision.name()));
    }
    if r.kv_precision != "f16" {
        store.push_str(&format!(" {}-kv", r.kv_precision));
    }
    if r.pipeline_depth != crate::runtime::generate::DEFAULT_PIPELINE_DEPTH {
        store.push_str(&format!(" depth {}", r.pipeline_depth));
    }
    format!(
        "{}/{}{res}{store}",
        name_of(&r.expert_precision),
        name_of(&r.executor)
    )
}

pub(super) fn name_of<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

pub(super) struct RecordContext<'a> {
    pub(super) set_name: &'a str,
    pub(super) prompts: &'a [BenchPrompt],
    pub(super) prompt_tokens: Vec<usize>,
    pub(super) max_context: usize,
    pub(super) synthetic: bool,
    pub(super) notes: &'a [String],
    pub(super) git: &'a str,
    pub(super) rss_scope: &'static str,
}

pub(super) fn record(
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
    let mean_prompt = x.prompt_tokens.iter().sum::<usize>() / x.prompt_tokens.len().max(1);
    let bpt = crate::planner::decode_bytes_per_token(
        cfg,
        c.dense_precision.format(),
        c.expert_precision.int4(),
        c.kv_precision.format(),
        mean_prompt + o.new_tokens / 2,
    )
    .unwrap_or(0);
    let profile = engine.fwd.kernel_profile.as_ref().and_then(|p| {
        let encode = rs.iter().map(|r| r.encode_s).sum::<Option<f64>>();
        crate::insight::kernel_profile::report(p, decode_s, encode)
    });
    let pipelines = engine.dev.pipeline_report();
    BenchRecord {
        pipeline_compile_s: pipelines.compile_s,
        pipeline_cache: pipelines.cache.to_string(),
        profile_clock: profile.as_ref().map(|p| p.clock),
        gpu_s_per_token: profile.as_ref().map(|p| p.gpu_s_per_token),
        gpu_busy_fraction: profile.as_ref().and_then(|p| p.gpu_busy_fraction),
        host_s_per_token: profile.as_ref().and_then(|p| p.host_s_per_token),
        profile: profile.map(|p| p.profile),
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
        dense_precision: c.dense_precision,
        kv_precision: c.kv_precision.name().to_string(),
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
        pipeline_depth: rs
            .iter()
            .map(|r| r.pipeline_depth)
            .max()
            .unwrap_or(c.pipeline_depth),
        decode_steps_in_flight_max: rs.iter().map(|r| r.steps_in_flight_max).max().unwrap_or(0),
        decode_host_wait_s_per_token: rs.iter().map(|r| r.host_wait_s).sum::<f64>()
            / decode_tokens.max(1) as f64,
        bytes_per_token: bpt,
        effective_gb_per_s: bpt as f64 * rate(decode_tokens, decode_s) / 1e9,
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
        dispatches_per_decode_step: engine
            .fwd
            .dispatches_per_decode_step(crate::backend::LONGEST),
        h2d_bytes: Some(res.h2d_bytes),
        expert_hits: Some(res.expert_hits),
        expert_misses: Some(res.expert_misses),
        expert_evictions: Some(res.expert_evictions),
        upload_seconds_per_miss: (res.expert_misses > 0)
            .then(|| res.upload_seconds / res.expert_misses as f64),
        // The decode steps' misses over the decode tokens: the prompt's chunks miss too, but
        // not per token (issue 39).
        expert_misses_per_token: rs.iter().map(|r| r.decode_misses).sum::<u64>() as f64
            / decode_tokens.max(1) as f64,
        miss_policy: engine.fwd.residency.as_ref().map(|r| r.miss),
        uploaded_misses: engine.fwd.residency.as_ref().map(|_| res.uploaded_misses),
        cpu_expert_pairs: engine.fwd.residency.as_ref().map(|_| res.cpu_expert_pairs),
        cpu_expert_seconds: engine
            .fwd
            .residency
            .as_ref()
            .map(|_| res.cpu_expert_seconds),
        n_cpu_moe: o.n_cpu_moe,
        cost_figures: res.cost_figures,
        prefetch: engine.fwd.residency.as_ref().map(|_| res.prefetch),
        prefetch_width: engine.fwd.residency.as_ref().map(|_| res.prefetch_width),
        fill_threads: engine.fwd.residency.as_ref().map(|_| res.fill_threads),
        upload_stall_seconds: engine
            .fwd
            .residency
            .as_ref()
            .map(|_| res.upload_stall_seconds),
        prefetch_issued: engine.fwd.residency.as_ref().map(|_| res.prefetch_issued),
        prefetch_used: engine.fwd.residency.as_ref().map(|_| res.prefetch_used),
        prefetch_wasted_bytes: engine
            .fwd
            .residency
            .as_ref()
            .map(|_| res.prefetch_wasted_bytes),
        prefetch_accuracy: res.prefetch_accuracy,
        prefetch_accuracy_per_layer: engine
            .fwd
            .residency
            .as_ref()
            .map(|_| res.prefetch_accuracy_per_layer.clone()),
        prefetch_gated_layers: engine
            .fwd
            .residency
            .as_ref()
            .map(|_| res.prefetch_gated_layers.clone()),
        prefetch_held_back: engine
            .fwd
            .residency
            .as_ref()
            .map(|_| res.prefetch_held_back),
    }
}

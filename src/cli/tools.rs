//! `wgmoe devices`, `quantize`, `inspect`, `eval` and `synth`.

use std::io::Write;

use serde_json::json;

use wgmoe::backend::{Device, DeviceType};
use wgmoe::error::{Error, Result};
use wgmoe::runtime::engine::{DensePrecision, Engine, EngineOptions, ExpertPrecision, KvPrecision};
use wgmoe::runtime::generate::{generate, GenerateOptions};
use wgmoe::runtime::sampling::SamplingOptions;

use super::{prompt_text, software_note, SOFTWARE_HINT};
use crate::{stdout_error, EvalArgs, GpuArgs, SynthArgs};

pub fn devices(gpu: &GpuArgs, as_json: bool) -> Result<()> {
    // Every adapter (of --backend), and the one `run` would pick with the same options.
    let all = wgmoe::backend::DeviceRequest {
        adapter: None,
        ..gpu.request_unresolved()
    };
    let (list, _) = Device::list(&all)?;
    let (_, chosen) = super::resolve_adapter(gpu.request_unresolved())?;
    if as_json {
        let mut v = serde_json::to_value(&list).map_err(|e| Error::Other(e.to_string()))?;
        if let Some(items) = v.as_array_mut() {
            for (i, a) in items.iter_mut().enumerate() {
                a["default"] = json!(chosen == Some(i));
            }
        }
        out!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| Error::Other(e.to_string()))?
        );
        return Ok(());
    }
    if list.is_empty() {
        // Reuse the device's message, which says how to get a driver.
        return Device::open(&gpu.request()?).map(|_| ());
    }
    for (i, a) in list.iter().enumerate() {
        let mark = if chosen == Some(i) {
            "  <- default: `wgmoe run` uses this one"
        } else {
            ""
        };
        out!(
            "[{i}] {} ({}, {:?}){mark}",
            a.name,
            a.backend,
            a.device_type
        );
        out!("    driver: {} {}", a.driver, a.driver_info);
        out!(
            "    features: shader_f16={} subgroup={} (sizes {}..{}) timestamp_query={}",
            a.shader_f16,
            a.subgroup,
            a.subgroup_min_size,
            a.subgroup_max_size,
            a.timestamp_query
        );
        out!(
            "    limits: max_buffer_size={} max_storage_buffer_binding_size={} storage_buffers_per_stage={} workgroup_storage={} invocations_per_workgroup={} storage_offset_alignment={}",
            a.limits.max_buffer_size,
            a.limits.max_storage_buffer_binding_size,
            a.limits.max_storage_buffers_per_shader_stage,
            a.limits.max_compute_workgroup_storage_size,
            a.limits.max_compute_invocations_per_workgroup,
            a.limits.min_storage_buffer_offset_alignment
        );
    }
    if let Some(a) = chosen.and_then(|i| list.get(i)) {
        if a.device_type == DeviceType::Cpu {
            out!("note: the default adapter is a software one (no GPU found); {SOFTWARE_HINT}");
        }
    }
    Ok(())
}

pub fn measure(gpu: &GpuArgs, as_json: bool) -> Result<()> {
    let req = gpu.request()?;
    let dev = Device::open(&req)?;
    let info = dev.info().clone();
    eprintln!(
        "measuring {} ({}, {}): device read of {} MiB by the f16 matmul, {} MiB host->device; median of {} runs",
        info.name,
        info.backend,
        info.driver_string(),
        wgmoe::insight::measure::READ_BYTES >> 20,
        wgmoe::insight::measure::H2D_BYTES >> 20,
        wgmoe::insight::measure::REPETITIONS
    );
    let date = wgmoe::bench::rfc3339_utc(std::time::SystemTime::now());
    let m = wgmoe::insight::measure::measure(&dev, &gpu.kernels(), date)?;
    let path = wgmoe::format::bandwidth::store_path().ok_or_else(|| {
        Error::Other("cannot store the measurements: neither XDG_CACHE_HOME nor HOME is set".into())
    })?;
    let mut store = wgmoe::format::bandwidth::Store::load(&path)?;
    store.put(m.clone());
    store.save(&path)?;
    if as_json {
        let v = serde_json::to_string_pretty(&m).map_err(|e| Error::Other(e.to_string()))?;
        out!("{v}");
    } else {
        out!("{} ({}, {}):", m.adapter, m.backend, m.driver);
        out!(
            "  device read:     {:8.2} GB/s  (f16 matmul of one token over {} MiB)",
            m.device_read_gbps,
            m.read_bytes >> 20
        );
        out!("  host -> device:  {:8.2} GB/s  (mapped staging buffer + copy of {} MiB: the expert upload path)", m.h2d_gbps, m.h2d_bytes >> 20);
        out!(
            "  queue write:     {:8.2} GB/s  (write_buffer of {} MiB)",
            m.write_buffer_gbps,
            m.h2d_bytes >> 20
        );
        if let (Some(g), Some(t), Some(isa)) = (m.cpu_expert_gbps, m.cpu_threads, &m.cpu_isa) {
            out!(
                "  CPU experts:     {g:8.2} GB/s  (INT4 expert kernel, one token x {} experts of 2048 x 1024 from a pool of {}, {t} threads, {isa})",
                wgmoe::insight::measure::CPU_EXPERTS,
                wgmoe::insight::measure::CPU_POOL
            );
        }
        if let Some(us) = m.round_trip_us {
            out!("  round trip:      {us:8.1} us    (submit a small copy, map its readback: one sync point of a MoE layer below full residency)");
        }
        if let Some(s) = m.dispatch_latency_s {
            out!(
                "  dispatch latency:{:8.1} us    (each of a chain of {} dependent tiny dispatches in one submission)",
                s * 1e6,
                wgmoe::insight::measure::CHAIN
            );
        }
        out!("stored in {} for `wgmoe plan`", path.display());
    }
    if info.device_type == DeviceType::Cpu {
        eprintln!(
            "note: {} is a software adapter: these are CPU numbers, not a GPU's",
            info.name
        );
    }
    Ok(())
}

pub fn quantize(
    model: &std::path::Path,
    out: &std::path::Path,
    force: bool,
    dense: DensePrecision,
) -> Result<()> {
    use wgmoe::format::identity::DenseStorage;
    let storage = match dense {
        DensePrecision::F16 => DenseStorage::F16,
        DensePrecision::Q8_0 => DenseStorage::Q8_0,
    };
    wgmoe::interrupt::install()?;
    let pb =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "quantizing {bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} {elapsed}",
    ) {
        pb.set_style(style);
    }
    let t0 = std::time::Instant::now();
    let summary = wgmoe::format::convert::write_converted_to(
        model,
        out,
        force,
        storage,
        &mut |done, total| {
            pb.set_length(total);
            pb.set_position(done);
        },
    )
    .map_err(|e| out_error(out, e))?;
    pb.finish_and_clear();
    if let Some(r) = &summary.replaced {
        eprintln!("replaced {r} in {}", out.display());
    }
    let human = wgmoe::insight::inspect::human;
    let q8 = if summary.dense_q8_bytes > 0 {
        format!(" + {} q8_0 dense", human(summary.dense_q8_bytes))
    } else {
        String::new()
    };
    eprintln!(
        "wrote {} ({}: {} f16 non-routed{q8} + {} int4 experts; dense weights {}) in {:.1}s",
        summary.out_file,
        human(summary.bytes),
        human(summary.dense_f16_bytes),
        human(summary.expert_int4_bytes),
        summary.dense_precision.name(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// An I/O error on a path under the output directory names `-o/--out`, as every other
/// error about it does.
fn out_error(out: &std::path::Path, e: Error) -> Error {
    match e {
        Error::Io { path, source } if path.starts_with(out) || out.starts_with(&path) => {
            Error::option("-o/--out", format!("{}: {source}", path.display()))
        }
        e => e,
    }
}

pub fn inspect(
    model: &std::path::Path,
    as_json: bool,
    max_context: Option<usize>,
    prefill_chunk: usize,
    dense: wgmoe::runtime::engine::DensePrecision,
    kv: wgmoe::runtime::engine::KvPrecision,
) -> Result<()> {
    if wgmoe::gguf::is_gguf_path(model) {
        return inspect_gguf(model, as_json, max_context);
    }
    let (cfg, _, _) = Engine::open_host(model)?;
    let ckpt = wgmoe::format::checkpoint::Checkpoint::open(model)?;
    // The config's counts against the real tensors before any arithmetic uses them.
    wgmoe::format::manifest::check_checkpoint(&cfg, &ckpt)?;
    if let Some(n) = max_context {
        if n == 0 || prefill_chunk == 0 {
            return Err(Error::option(
                "--ctx-size",
                "--ctx-size and --prefill-chunk must be at least 1",
            ));
        }
        if n > cfg.max_position_embeddings {
            return Err(Error::option(
                "--ctx-size",
                format!(
                    "{n} positions exceed max_position_embeddings = {} of {}",
                    cfg.max_position_embeddings,
                    model.join("config.json").display()
                ),
            ));
        }
        wgmoe::model::workspace::check_context(&cfg, n, prefill_chunk)
            .map_err(|e| Error::option("--ctx-size", e.to_string()))?;
    }
    let mut i = wgmoe::insight::inspect::inspect(&cfg, &ckpt, dense.format(), kv.format())?;
    if let Some(n) = max_context {
        i.add_workspace(&cfg, n, prefill_chunk)?;
    }
    if as_json {
        out!(
            "{}",
            serde_json::to_string_pretty(&i).map_err(|e| Error::Other(e.to_string()))?
        );
    } else {
        out!(
            "{}: {:?}, {} layers, hidden {}, {} experts top-{}, expert intermediate {}, vocab {}",
            model.display(),
            cfg.arch,
            cfg.num_layers,
            cfg.hidden_size,
            cfg.num_experts,
            cfg.top_k,
            cfg.moe_intermediate,
            cfg.vocab_size
        );
        let missing = wgmoe::format::manifest::check_tensors(&cfg, &ckpt).err();
        out!("{}", wgmoe::insight::inspect::table(&i));
        if let Some(e) = missing {
            out!("warning: this checkpoint cannot be loaded: {e}");
        }
    }
    Ok(())
}

/// `inspect MODEL.gguf`: tensor classes by block type, then the config (or why the model
/// cannot be loaded).
fn inspect_gguf(model: &std::path::Path, as_json: bool, max_context: Option<usize>) -> Result<()> {
    if max_context.is_some() {
        return Err(Error::option(
            "--max-context",
            "is not available for GGUF files yet (their experts are not in wgmoe's INT4 layout)",
        ));
    }
    // A file whose header reads but whose data does not (a header-only file, an
    // interrupted download) is still described, with why it cannot run.
    let (gguf, data_error) = match wgmoe::gguf::GgufModel::open(model) {
        Ok(g) => (g, None),
        Err(e) => match wgmoe::gguf::GgufModel::open_header(model) {
            Ok(g) => (g, Some(e)),
            Err(_) => return Err(e),
        },
    };
    let i = wgmoe::insight::inspect::inspect_gguf(&gguf);
    let cfg = wgmoe::gguf::model_config(&gguf);
    // Why it cannot be loaded: its config, else its data.
    let problem = match (&cfg, &data_error) {
        (Err(e), _) | (Ok(_), Some(e)) => Some(e.to_string()),
        _ => None,
    };
    if as_json {
        let mut v = serde_json::to_value(&i).map_err(|e| Error::Other(e.to_string()))?;
        v["loadable"] = serde_json::Value::Bool(problem.is_none());
        v["header_only"] = serde_json::Value::Bool(data_error.is_some());
        if let Some(e) = &problem {
            v["error"] = serde_json::Value::String(e.clone());
        }
        out!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| Error::Other(e.to_string()))?
        );
        return Ok(());
    }
    match &cfg {
        Ok(cfg) => out!(
            "{}: {:?}, {} layers, hidden {}, {} experts top-{}, expert intermediate {}, vocab {}",
            model.display(),
            cfg.arch,
            cfg.num_layers,
            cfg.hidden_size,
            cfg.num_experts,
            cfg.top_k,
            cfg.moe_intermediate,
            cfg.vocab_size
        ),
        Err(_) => out!(
            "{}: architecture {}",
            model.display(),
            i.architecture.as_deref().unwrap_or("(none)")
        ),
    }
    out!("{}", wgmoe::insight::inspect::gguf_table(&i));
    if let Some(e) = problem {
        out!("warning: this model cannot be loaded: {e}");
    }
    Ok(())
}

/// One precision `eval` compares with the reference.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Precisions {
    experts: ExpertPrecision,
    dense: DensePrecision,
    kv: KvPrecision,
}

impl Precisions {
    /// What the others are compared with: f16 experts, f16 dense weights, f32 KV cache.
    const REFERENCE: Precisions = Precisions {
        experts: ExpertPrecision::F16,
        dense: DensePrecision::F16,
        kv: KvPrecision::F32,
    };
    /// `run`'s defaults.
    const DEFAULTS: Precisions = Precisions {
        experts: ExpertPrecision::Int4,
        dense: DensePrecision::Q8_0,
        kv: KvPrecision::F16,
    };

    /// What differs from the reference, e.g. `int4 experts + q8_0 dense + f16 KV`.
    fn label(self) -> String {
        let r = Self::REFERENCE;
        let mut parts = Vec::new();
        if self.experts == ExpertPrecision::Int4Strict {
            parts.push("int4-strict experts".to_string());
        } else if self.experts != r.experts {
            parts.push("int4 experts".to_string());
        }
        if self.dense != r.dense {
            parts.push(format!("{} dense", self.dense.name()));
        }
        if self.kv != r.kv {
            parts.push(format!("{} KV", self.kv.name()));
        }
        match (parts.is_empty(), self == Self::DEFAULTS) {
            (true, _) => "the reference itself".to_string(),
            (false, true) => format!("{} (the defaults)", parts.join(" + ")),
            (false, false) => parts.join(" + "),
        }
    }
}

pub fn eval(a: EvalArgs) -> Result<()> {
    let (cfg, _, tok) = super::open_host(&a.model, a.tokenizer.as_deref())?;
    // --tokenizer stands in for the model's own in every engine (it may be one wgmoe
    // cannot build).
    let given = || -> Result<Option<wgmoe::tokenizer::Tokenizer>> {
        a.tokenizer
            .as_deref()
            .map(|f| super::tokenizer_override(&a.model, f))
            .transpose()
    };
    // The reference needs f16 experts and dense weights, which only the original weights give.
    if wgmoe::format::identity::is_converted(&wgmoe::format::checkpoint::Checkpoint::open(
        &a.model,
    )?) {
        return Err(Error::bad_file(
            &a.model,
            "holds a converted model (INT4 experts, from `wgmoe quantize`): `wgmoe eval` compares each precision with f16 experts and f16 dense weights, which need the original Hugging Face checkpoint",
        ));
    }
    if a.max_new_tokens == 0 {
        return Err(Error::option(
            "--max-new-tokens",
            "must be at least 1 (the positions compared)",
        ));
    }
    let text = prompt_text(a.prompt.as_deref(), a.file.as_deref())?;
    let prompt_ids: Vec<u32> = match (&text, &a.prompt_ids) {
        (_, Some(ids)) => ids.clone(),
        (Some(text), None) => tok
            .as_ref()
            .ok_or_else(|| {
                Error::bad_file(
                    a.model.join("tokenizer.json"),
                    "missing: needed to encode --prompt",
                )
            })?
            .encode(text, true)?,
        (None, None) => {
            return Err(Error::option(
                "--prompt",
                "give a prompt with -p TEXT, -p - (stdin), -f FILE or --prompt-ids 1,2,3",
            ))
        }
    };
    if prompt_ids.is_empty() {
        return Err(Error::option("--prompt", "the prompt encodes to no tokens"));
    }
    let max_context = prompt_ids.len().saturating_add(a.max_new_tokens);
    if max_context > cfg.max_position_embeddings {
        return Err(Error::option(
            "--max-new-tokens",
            format!(
                "{max_context} positions exceed max_position_embeddings = {}",
                cfg.max_position_embeddings
            ),
        ));
    }
    // The candidates: each precision alone, then the defaults combined; or the one the
    // options name (the reference's precision where one is not given).
    let reference = Precisions::REFERENCE;
    let candidates: Vec<Precisions> = if a.expert_precision.is_none()
        && a.dense_precision.is_none()
        && a.kv_precision.is_none()
    {
        vec![
            Precisions {
                experts: ExpertPrecision::Int4,
                ..reference
            },
            Precisions {
                dense: DensePrecision::Q8_0,
                ..reference
            },
            Precisions {
                kv: KvPrecision::F16,
                ..reference
            },
            Precisions::DEFAULTS,
        ]
    } else {
        vec![Precisions {
            experts: a.expert_precision.unwrap_or(reference.experts),
            dense: a.dense_precision.unwrap_or(reference.dense),
            kv: a.kv_precision.unwrap_or(reference.kv),
        }]
    };
    let adapter = a.gpu.request()?;
    let opts = |p: Precisions| EngineOptions {
        residency: Default::default(),
        adapter: adapter.clone(),
        kernels: a.gpu.kernels(),
        expert_precision: p.experts,
        dense_precision: p.dense,
        kv_precision: p.kv,
        executor: a.executor,
        max_context,
        prefill_chunk: 64,
        all_logits: true,
        score_rows: 0,
        batch: 1,
    };
    // Reference: a greedy decode gives the sequence; its logits over that sequence,
    // teacher-forced as every candidate's are (the same kernels, so the reference against
    // itself is exactly 0).
    let mut f16 = Engine::load_with(&a.model, &opts(reference), given()?)?;
    let g = generate(
        &mut f16.fwd,
        &prompt_ids,
        &GenerateOptions {
            max_new_tokens: a.max_new_tokens,
            sampling: SamplingOptions::greedy(),
            eos_ids: vec![],
            ignore_eos: true,
            record_logits: false,
            pipeline_depth: wgmoe::runtime::generate::DEFAULT_PIPELINE_DEPTH,
        },
        &mut |_| Ok(()),
    )
    .map_err(|e| Error::Other(format!("f16 reference: {e}")))?;
    let mut seq = prompt_ids.clone();
    seq.extend_from_slice(&g.generated_ids[..g.generated_ids.len().saturating_sub(1)]);
    let first = prompt_ids.len() - 1;
    let mut ref_rows = wgmoe::runtime::generate::prompt_logits(&mut f16.fwd, &seq)
        .map_err(|e| Error::Other(format!("f16 reference: {e}")))?;
    let ref_rows = ref_rows.split_off(first);
    software_note(&f16.dev, &adapter);
    let adapter = f16.dev.info().name.clone();
    drop(f16);
    // Each candidate on the same sequence, one engine at a time.
    let mut rows = Vec::with_capacity(candidates.len());
    for &p in &candidates {
        let mut e = Engine::load_with(&a.model, &opts(p), given()?)?;
        let cand = wgmoe::runtime::generate::prompt_logits(&mut e.fwd, &seq)
            .map_err(|e| Error::Other(format!("{} candidate: {e}", p.label())))?;
        drop(e);
        rows.push((p, wgmoe::insight::eval::fidelity(&ref_rows, &cand[first..])));
    }
    let int4_only = Precisions {
        experts: ExpertPrecision::Int4,
        ..reference
    };
    if a.json {
        let entry = |p: &Precisions, f: &wgmoe::insight::eval::Fidelity| {
            json!({
                "label": p.label(),
                "experts": p.experts,
                "dense_precision": p.dense,
                "kv_precision": p.kv,
                "mean_kl": f.mean_kl,
                "max_kl": f.max_kl,
                "top1_agreement": f.top1_agreement,
                "positions": f.positions,
            })
        };
        let mut v = json!({
            "model": a.model.display().to_string(),
            "adapter": adapter,
            "prompt_ids": prompt_ids,
            "reference_ids": g.generated_ids,
            "reference": {
                "experts": reference.experts,
                "dense_precision": reference.dense,
                "kv_precision": reference.kv,
            },
            "precisions": rows.iter().map(|(p, f)| entry(p, f)).collect::<Vec<_>>(),
        });
        if let Some((_, f)) = rows.iter().find(|(p, _)| *p == int4_only) {
            v["int4_vs_f16"] = json!(f);
        }
        out!("{v}");
    } else {
        out!(
            "{}: each precision against f16 experts, f16 dense weights and an f32 KV cache over {} positions (greedy reference decode, teacher-forced) [{}]",
            a.model.display(),
            ref_rows.len(),
            adapter
        );
        let width = rows.iter().map(|(p, _)| p.label().len()).max().unwrap_or(0);
        for (p, f) in &rows {
            out!(
                "  {:<width$}  mean KL {:.3e} nats, max KL {:.3e}, top-1 agreement {:.1}%",
                p.label(),
                f.mean_kl,
                f.max_kl,
                100.0 * f.top1_agreement,
            );
        }
    }
    if let Some((p, f)) = rows
        .iter()
        .find(|(_, f)| !(f.mean_kl.is_finite() && f.max_kl.is_finite()))
    {
        return Err(Error::Other(format!(
            "the KL divergence of {} is {} (a logits row is not a distribution): the comparison is meaningless",
            p.label(),
            f.max_kl
        )));
    }
    Ok(())
}

pub fn synth(a: SynthArgs) -> Result<()> {
    use wgmoe::insight::inspect::human;
    use wgmoe::synth::{ShapeOverrides, SynthOptions, SynthShape};
    let shape = SynthShape::resolve(
        a.arch,
        &ShapeOverrides {
            hidden: a.hidden,
            layers: a.layers,
            heads: a.heads,
            kv_heads: a.kv_heads,
            head_dim: a.head_dim,
            experts: a.experts,
            top_k: a.top_k,
            expert_intermediate: a.expert_intermediate,
            shared_expert_intermediate: a.shared_expert_intermediate,
            vocab: a.vocab,
            max_position_embeddings: a.max_position_embeddings,
        },
    )?;
    if a.max_shard_bytes == 0 {
        return Err(Error::option("--max-shard-bytes", "must be greater than 0"));
    }
    let opts = SynthOptions {
        arch: a.arch,
        shape,
        seed: a.seed,
        format: a.format,
        max_shard_bytes: a.max_shard_bytes,
        gguf_scheme: a.gguf_type,
        router_skew: a.router_skew,
    };
    let pb =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "synth {bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} {elapsed}",
    ) {
        pb.set_style(style);
    }
    let t0 = std::time::Instant::now();
    wgmoe::interrupt::install()?;
    let s = wgmoe::synth::write_synthetic_to(&opts, &a.out, a.force, &mut |done, total| {
        pb.set_length(total);
        pb.set_position(done);
    })
    .map_err(|e| out_error(&a.out, e))?;
    pb.finish_and_clear();
    if let Some(r) = &s.replaced {
        eprintln!("replaced {r} in {}", a.out.display());
    }
    let sh = &s.shape;
    eprintln!(
        "wrote {} ({}, {}): hidden {}, {} layers, {}/{} heads of {}, {} experts top-{}, expert intermediate {}{}, vocab {}, max positions {}, seed {}",
        s.dir,
        a.arch.name(),
        match a.format {
            wgmoe::synth::SynthFormat::Converted => "converted INT4".to_string(),
            wgmoe::synth::SynthFormat::Hf => "bf16 Hugging Face".to_string(),
            wgmoe::synth::SynthFormat::Gguf => format!("GGUF {}", a.gguf_type.name()),
        },
        sh.hidden,
        sh.layers,
        sh.heads,
        sh.kv_heads,
        sh.head_dim,
        sh.experts,
        sh.top_k,
        sh.expert_intermediate,
        sh.shared_expert_intermediate.map(|i| format!(", shared expert {i}")).unwrap_or_default(),
        sh.vocab,
        sh.max_position_embeddings,
        s.seed
    );
    let params = |n: u64| {
        if n >= 1_000_000_000 {
            format!("{:.3} B", n as f64 / 1e9)
        } else {
            format!("{:.3} M", n as f64 / 1e6)
        }
    };
    eprintln!(
        "parameters: {} total, {} routed experts, {} active per token",
        params(s.params_total),
        params(s.params_routed),
        params(s.params_active)
    );
    for f in &s.files {
        eprintln!("  {} {}", f.file, human(f.bytes));
    }
    eprintln!(
        "weights: {} ({} non-routed + {} routed experts) in {:.1}s",
        human(s.weight_bytes),
        human(s.dense_bytes),
        human(s.expert_bytes),
        t0.elapsed().as_secs_f64()
    );
    eprintln!("note: {}", wgmoe::synth::routing_note(a.router_skew));
    if a.json {
        out!(
            "{}",
            serde_json::to_string_pretty(&s).map_err(|e| Error::Other(e.to_string()))?
        );
    }
    Ok(())
}

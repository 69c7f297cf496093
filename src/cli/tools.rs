//! `wgmoe devices`, `quantize`, `inspect`, `eval` and `synth`.

use std::io::Write;

use serde_json::json;

use wgmoe::backend::{Device, DeviceType};
use wgmoe::error::{Error, Result};
use wgmoe::runtime::engine::{Engine, EngineOptions, ExpertPrecision};
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

pub fn quantize(model: &std::path::Path, out: &std::path::Path, force: bool) -> Result<()> {
    wgmoe::interrupt::install()?;
    let pb =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "quantizing {bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} {elapsed}",
    ) {
        pb.set_style(style);
    }
    let t0 = std::time::Instant::now();
    let summary =
        wgmoe::format::convert::write_converted_to(model, out, force, &mut |done, total| {
            pb.set_length(total);
            pb.set_position(done);
        })
        .map_err(|e| out_error(out, e))?;
    pb.finish_and_clear();
    if let Some(r) = &summary.replaced {
        eprintln!("replaced {r} in {}", out.display());
    }
    eprintln!(
        "wrote {} ({}: {} f16 non-routed + {} int4 experts) in {:.1}s",
        summary.out_file,
        wgmoe::insight::inspect::human(summary.bytes),
        wgmoe::insight::inspect::human(summary.dense_f16_bytes),
        wgmoe::insight::inspect::human(summary.expert_int4_bytes),
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
    let mut i = wgmoe::insight::inspect::inspect(&cfg, &ckpt)?;
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
    let gguf = wgmoe::gguf::GgufModel::open(model)?;
    let i = wgmoe::insight::inspect::inspect_gguf(&gguf);
    let cfg = wgmoe::gguf::model_config(&gguf);
    if as_json {
        let mut v = serde_json::to_value(&i).map_err(|e| Error::Other(e.to_string()))?;
        v["loadable"] = serde_json::Value::Bool(cfg.is_ok());
        if let Err(e) = &cfg {
            v["error"] = serde_json::Value::String(e.to_string());
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
    if let Err(e) = cfg {
        out!("warning: this model cannot be loaded: {e}");
    }
    Ok(())
}

pub fn eval(a: EvalArgs) -> Result<()> {
    let (cfg, _, tok) = Engine::open_host(&a.model)?;
    // The reference needs f16 experts, which only the original weights give.
    if wgmoe::format::identity::is_converted(&wgmoe::format::checkpoint::Checkpoint::open(
        &a.model,
    )?) {
        return Err(Error::bad_file(
            &a.model,
            "holds a converted model (INT4 experts, from `wgmoe quantize`): `wgmoe eval` compares INT4 with f16 experts, and f16 experts need the original Hugging Face checkpoint",
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
    let adapter = a.gpu.request()?;
    let opts = |precision| EngineOptions {
        residency: Default::default(),
        adapter: adapter.clone(),
        kernels: a.gpu.kernels(),
        expert_precision: precision,
        dense_precision: wgmoe::runtime::engine::DensePrecision::F16,
        kv_precision: wgmoe::runtime::engine::KvPrecision::F32,
        executor: a.executor,
        max_context,
        prefill_chunk: 64,
        all_logits: true,
    };
    // Reference: greedy decode with FP16 experts, keeping each step's logits.
    let mut f16 = Engine::load(&a.model, &opts(ExpertPrecision::F16))?;
    let g = generate(
        &mut f16.fwd,
        &prompt_ids,
        &GenerateOptions {
            max_new_tokens: a.max_new_tokens,
            sampling: SamplingOptions::greedy(),
            eos_ids: vec![],
            ignore_eos: true,
            record_logits: true,
        },
        &mut |_| Ok(()),
    )
    .map_err(|e| Error::Other(format!("FP16-expert reference: {e}")))?;
    software_note(&f16.dev, &adapter);
    let adapter = f16.dev.info().name.clone();
    drop(f16);
    // Candidate: INT4 experts on the same sequence, teacher-forced.
    let mut int4 = Engine::load(&a.model, &opts(ExpertPrecision::Int4))?;
    let mut seq = prompt_ids.clone();
    seq.extend_from_slice(&g.generated_ids[..g.generated_ids.len().saturating_sub(1)]);
    let rows = wgmoe::runtime::generate::prompt_logits(&mut int4.fwd, &seq)
        .map_err(|e| Error::Other(format!("INT4-expert candidate: {e}")))?;
    let cand = &rows[prompt_ids.len() - 1..];
    let f = wgmoe::insight::eval::fidelity(&g.step_logits, cand);
    if a.json {
        out!(
            "{}",
            json!({"model": a.model.display().to_string(), "adapter": adapter, "prompt_ids": prompt_ids, "reference_ids": g.generated_ids, "int4_vs_f16": f})
        );
    } else {
        out!(
            "{}: INT4 vs FP16 experts over {} positions (greedy FP16 decode, teacher-forced): mean KL {:.3e} nats, max KL {:.3e}, top-1 agreement {:.1}% [{}]",
            a.model.display(),
            f.positions,
            f.mean_kl,
            f.max_kl,
            100.0 * f.top1_agreement,
            adapter
        );
    }
    if !(f.mean_kl.is_finite() && f.max_kl.is_finite()) {
        return Err(Error::Other(format!(
            "the KL divergence is {} (a logits row is not a distribution): the comparison is meaningless",
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
            wgmoe::synth::SynthFormat::Converted => "converted INT4",
            wgmoe::synth::SynthFormat::Hf => "bf16 Hugging Face",
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
    eprintln!("note: {}", wgmoe::synth::NOTE_UNIFORM_ROUTING);
    if a.json {
        out!(
            "{}",
            serde_json::to_string_pretty(&s).map_err(|e| Error::Other(e.to_string()))?
        );
    }
    Ok(())
}

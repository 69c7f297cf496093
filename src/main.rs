//! The `wgmoe` command line.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use serde_json::json;

use wgmoe::engine::{Engine, EngineOptions, ExpertPrecision};
use wgmoe::error::{Error, Result};
use wgmoe::generate::{generate, GenerateOptions};
use wgmoe::gpu::{context::list_adapters, AdapterRequest, BackendChoice};
use wgmoe::model::forward::Executor;
use wgmoe::sampling::SamplingOptions;
use wgmoe::tokenizer::TextStream;

#[derive(Parser)]
#[command(
    name = "wgmoe",
    version,
    about = "Mixture-of-Experts inference on wgpu compute shaders"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// List GPU adapters with their backend, driver, features and limits.
    Devices {
        #[command(flatten)]
        gpu: GpuArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Generate text from a Hugging Face checkpoint directory (or a converted one).
    Run(RunArgs),
    /// Convert a Hugging Face checkpoint to wgmoe's INT4 format (FP16 non-routed tensors,
    /// packed INT4 routed experts), for a memory-mapped, conversion-free start.
    Quantize {
        /// Hugging Face checkpoint directory.
        model: PathBuf,
        /// Output directory: new, empty, or an earlier wgmoe output (never the input
        /// directory, or one inside or around it).
        #[arg(short, long)]
        out: PathBuf,
        /// Write into a non-empty output directory that holds no earlier wgmoe output,
        /// replacing the model files there (weights, config and tokenizer files; other
        /// files are kept).
        #[arg(long)]
        force: bool,
    },
    /// Print a checkpoint's tensors by class, with element counts, bytes per format and the
    /// weights resident on the GPU.
    Inspect {
        model: PathBuf,
        #[arg(long)]
        json: bool,
        /// Also print the KV cache and workspace for this many positions, and the total GPU
        /// bytes with every expert resident as INT4 (what `run`/`bench` track as peak).
        #[arg(long)]
        max_context: Option<usize>,
        /// Prefill chunk for the workspace arithmetic (as `run --prefill-chunk`).
        #[arg(long, default_value_t = 64)]
        prefill_chunk: usize,
    },
    /// Fidelity of INT4 experts against FP16 experts: KL divergence and top-1 agreement of
    /// next-token distributions over a greedy FP16 decode.
    Eval(EvalArgs),
    /// Write a random-weight model with the exact shapes of a real checkpoint (converted
    /// INT4 format, or a bf16 Hugging Face checkpoint), streaming.
    Synth(SynthArgs),
    /// The measurement contract: a fixed prompt set in blocks, fixed new tokens, greedy,
    /// EOS suppressed, warm-up excluded; comma-separated lists sweep configurations.
    Bench(BenchArgs),
}

#[derive(Args)]
struct EvalArgs {
    /// Hugging Face checkpoint directory (f16 experts need the original weights).
    model: PathBuf,
    #[arg(short, long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Tokens decoded (greedy, FP16 experts) and compared.
    #[arg(short = 'n', long, default_value_t = 24)]
    max_new_tokens: usize,
    #[arg(long, value_enum, default_value = "grouped")]
    executor: Executor,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    gpu: GpuArgs,
}

/// Expert residency options (partial residency needs INT4 experts).
#[derive(Args, Clone)]
struct ResidencyArgs {
    /// Expert slots per layer on the GPU (top_k..=num_experts; default all).
    #[arg(long)]
    resident_experts: Option<usize>,
    /// GPU memory the runtime may allocate (e.g. 6GiB, 512MiB); derives --resident-experts.
    #[arg(long, value_parser = parse_size)]
    vram_budget: Option<u64>,
    /// Which expert a full cache evicts.
    #[arg(long, value_parser = ["lru", "lfu-decay", "profile"], default_value = "lru")]
    cache_policy: String,
    /// Per-step decay of the LFU access counter (0, 1].
    #[arg(long, default_value_t = wgmoe::residency::LfuDecay::DEFAULT_DECAY)]
    decay: f64,
    /// Expert-frequency profile for --cache-policy profile (from --write-profile).
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Write the per-layer expert frequencies of this run to FILE (a calibration run).
    #[arg(long)]
    write_profile: Option<PathBuf>,
    /// Mapped staging buffers for expert uploads.
    #[arg(long, default_value_t = 4)]
    staging_buffers: usize,
}

impl ResidencyArgs {
    fn options(&self) -> Result<wgmoe::engine::ResidencyOptions> {
        let policy: wgmoe::residency::PolicyKind = self
            .cache_policy
            .parse()
            .map_err(|e: wgmoe::residency::ConfigError| Error::option("--cache-policy", e.0))?;
        Ok(wgmoe::engine::ResidencyOptions {
            resident_experts: self.resident_experts,
            vram_budget: self.vram_budget,
            policy,
            decay: self.decay,
            profile: self.profile.clone(),
            staging_buffers: self.staging_buffers,
            record_profile: self.write_profile.is_some(),
        })
    }
}

/// "6GiB", "512MiB", "1.5GB", "1000000" (bytes).
fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size like 6GiB or 512MiB"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" => 1e12,
        "tib" => 1024f64.powi(4),
        _ => {
            return Err(format!(
                "`{s}`: unknown unit `{unit}` (use B, KiB, MiB, GiB, KB, MB, GB)"
            ))
        }
    };
    Ok((v * mult) as u64)
}

#[derive(Args, Clone)]
struct GpuArgs {
    /// Graphics API to use (default: the best available).
    #[arg(long, value_enum)]
    backend: Option<BackendChoice>,
    /// Use the adapter whose name contains this text (case-insensitive).
    #[arg(long)]
    adapter: Option<String>,
    /// Cap the storage-binding size used to split large tensors (bytes), below the
    /// adapter's own limit; exercises the split paths.
    #[arg(long, hide = true)]
    max_binding: Option<u64>,
    /// Use the portable kernels even where subgroup operations exist.
    #[arg(long)]
    portable_kernels: bool,
    /// One-token steps: read activations from a uniform window (default on CPU adapters
    /// such as lavapipe) or use the storage/subgroup kernels (default on GPUs).
    #[arg(long, value_parser = ["uniform", "storage"])]
    decode_kernels: Option<String>,
    /// Multi-token (prefill) steps: window kernels (activations in 64 KiB uniform windows,
    /// routed experts grouped by expert; default on CPU adapters) or the storage/subgroup
    /// kernels (default on GPUs).
    #[arg(long, value_parser = ["window", "storage"])]
    prefill_kernels: Option<String>,
    /// f16 arithmetic in the W4A16 kernels (needs SHADER_F16 and subgroups; default on
    /// GPUs, off on CPU adapters).
    #[arg(long, value_parser = ["on", "off"])]
    f16_arithmetic: Option<String>,
}

impl GpuArgs {
    fn request(&self) -> AdapterRequest {
        AdapterRequest {
            backend: self.backend,
            adapter: self.adapter.clone(),
            max_binding: self.max_binding,
            portable_kernels: self.portable_kernels,
            uniform_decode: self.decode_kernels.as_deref().map(|k| k == "uniform"),
            window_prefill: self.prefill_kernels.as_deref().map(|k| k == "window"),
            f16_arithmetic: self.f16_arithmetic.as_deref().map(|k| k == "on"),
        }
    }
}

#[derive(Args)]
struct RunArgs {
    /// Model directory (config.json, tokenizer.json, *.safetensors).
    model: PathBuf,
    /// Prompt text.
    #[arg(short, long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids, bypassing the tokenizer.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt in the model's chat template as one user message.
    #[arg(long)]
    chat: bool,
    /// Most tokens to generate.
    #[arg(short = 'n', long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Greedy decoding (the default unless --temperature, --top-k or --top-p is given).
    #[arg(long)]
    greedy: bool,
    #[arg(long, allow_negative_numbers = true)]
    temperature: Option<f32>,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long, allow_negative_numbers = true)]
    top_p: Option<f32>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Do not stop at EOS, and never sample it.
    #[arg(long)]
    ignore_eos: bool,
    /// Storage of routed expert weights: int4 (W4A16, block 256) or f16.
    #[arg(long, value_enum, default_value = "int4")]
    expert_precision: ExpertPrecision,
    /// How routed experts are dispatched.
    #[arg(long, value_enum, default_value = "grouped")]
    executor: Executor,
    /// Most prompt tokens per prefill submission.
    #[arg(long, default_value_t = 64)]
    prefill_chunk: usize,
    #[command(flatten)]
    residency: ResidencyArgs,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    gpu: GpuArgs,
}

/// Print a line to stdout; a closed stdout (e.g. `| head`) ends the command quietly
/// instead of panicking like `println!`.
macro_rules! out {
    ($($t:tt)*) => {{
        let mut o = std::io::stdout().lock();
        writeln!(o, $($t)*).and_then(|_| o.flush()).map_err(stdout_error)?;
    }};
}

fn stdout_error(e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Error::StdoutClosed
    } else {
        Error::io("<stdout>", e)
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => {
            // --help, --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // One line, like every other error; the usage hint is on --help.
            let msg = e.to_string();
            let first = msg
                .lines()
                .next()
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ");
            eprintln!("error: {first} (see --help)");
            return ExitCode::from(2);
        }
    };
    let r = match cli.cmd {
        Cmd::Devices { gpu, json } => devices(&gpu, json),
        Cmd::Run(args) => run(args),
        Cmd::Quantize { model, out, force } => quantize(&model, &out, force),
        Cmd::Inspect {
            model,
            json,
            max_context,
            prefill_chunk,
        } => inspect(&model, json, max_context, prefill_chunk),
        Cmd::Eval(args) => eval(args),
        Cmd::Synth(args) => synth(args),
        Cmd::Bench(args) => bench(args),
    };
    match r {
        Ok(()) | Err(Error::StdoutClosed) => ExitCode::SUCCESS,
        Err(e @ Error::Interrupted) => {
            eprintln!("error: {e}");
            ExitCode::from(wgmoe::interrupt::EXIT_CODE)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Peak resident set size of this process (Linux: VmHWM), if the OS tells.
fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn devices(gpu: &GpuArgs, as_json: bool) -> Result<()> {
    let list = list_adapters(&gpu.request());
    if as_json {
        out!(
            "{}",
            serde_json::to_string_pretty(&list).map_err(|e| Error::Other(e.to_string()))?
        );
        return Ok(());
    }
    if list.is_empty() {
        // Reuse the context's message, which says how to get a driver.
        return wgmoe::gpu::GpuContext::new(&gpu.request()).map(|_| ());
    }
    for (i, a) in list.iter().enumerate() {
        out!("[{i}] {} ({}, {})", a.name, a.backend, a.device_type);
        out!("    driver: {} {}", a.driver, a.driver_info);
        out!(
            "    features: shader_f16={} subgroup={} timestamp_query={}",
            a.shader_f16,
            a.subgroup,
            a.timestamp_query
        );
        out!(
            "    limits: max_buffer_size={} max_storage_buffer_binding_size={} storage_buffers_per_stage={} workgroup_storage={} invocations_per_workgroup={} storage_offset_alignment={}",
            a.max_buffer_size,
            a.max_storage_buffer_binding_size,
            a.max_storage_buffers_per_shader_stage,
            a.max_compute_workgroup_storage_size,
            a.max_compute_invocations_per_workgroup,
            a.min_storage_buffer_offset_alignment
        );
    }
    Ok(())
}

fn sampling_options(
    a: &RunArgs,
    gen: Option<&wgmoe::config::GenerationConfig>,
) -> Result<SamplingOptions> {
    let sampled = a.temperature.is_some() || a.top_k.is_some() || a.top_p.is_some();
    if a.greedy && sampled {
        return Err(Error::option(
            "--greedy",
            "conflicts with --temperature/--top-k/--top-p",
        ));
    }
    if !sampled {
        return Ok(SamplingOptions {
            seed: a.seed,
            ..SamplingOptions::greedy()
        });
    }
    let temperature = a
        .temperature
        .or(gen.and_then(|g| g.temperature))
        .unwrap_or(1.0);
    if !(temperature >= 0.0 && temperature.is_finite()) {
        return Err(Error::option(
            "--temperature",
            format!("{temperature} is not a finite value >= 0"),
        ));
    }
    let top_p = a.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(Error::option(
            "--top-p",
            format!("{top_p} is not in (0, 1]"),
        ));
    }
    Ok(SamplingOptions {
        temperature,
        top_k: a.top_k.unwrap_or(0),
        top_p,
        seed: a.seed,
    })
}

fn run(a: RunArgs) -> Result<()> {
    let (cfg, gen, tok) = Engine::open_host(&a.model)?;
    let sampling = sampling_options(&a, gen.as_ref())?;
    let prompt_ids: Vec<u32> = match (&a.prompt, &a.prompt_ids) {
        (_, Some(ids)) => ids.clone(),
        (Some(text), None) => {
            let tok = tok.as_ref().ok_or_else(|| {
                Error::bad_file(
                    a.model.join("tokenizer.json"),
                    "missing: needed to encode --prompt (or pass --prompt-ids)",
                )
            })?;
            let text = if a.chat {
                tok.apply_chat_template(&[("user".to_string(), text.clone())], true)?
            } else {
                text.clone()
            };
            tok.encode(&text, true)?
        }
        (None, None) => {
            return Err(Error::option(
                "--prompt",
                "give a prompt with -p TEXT or --prompt-ids 1,2,3",
            ))
        }
    };
    if prompt_ids.is_empty() {
        return Err(Error::option("--prompt", "the prompt encodes to no tokens"));
    }
    if let Some(&bad) = prompt_ids.iter().find(|&&t| t as usize >= cfg.vocab_size) {
        return Err(Error::option(
            "--prompt-ids",
            format!(
                "token id {bad} is outside the vocabulary (vocab_size {})",
                cfg.vocab_size
            ),
        ));
    }
    if prompt_ids.len() > cfg.max_position_embeddings {
        return Err(Error::option(
            if a.prompt_ids.is_some() {
                "--prompt-ids"
            } else {
                "--prompt"
            },
            format!(
                "{} prompt tokens exceed max_position_embeddings = {} of {}",
                prompt_ids.len(),
                cfg.max_position_embeddings,
                a.model.join("config.json").display()
            ),
        ));
    }
    if a.prefill_chunk == 0 {
        return Err(Error::option("--prefill-chunk", "must be at least 1"));
    }
    let max_context = (prompt_ids.len() + a.max_new_tokens).min(cfg.max_position_embeddings);
    let max_new = max_context - prompt_ids.len();
    if max_new < a.max_new_tokens {
        eprintln!(
            "note: generating at most {max_new} tokens: max_position_embeddings is {}",
            cfg.max_position_embeddings
        );
    }
    let engine = Engine::load(
        &a.model,
        &EngineOptions {
            residency: a.residency.options()?,
            adapter: a.gpu.request(),
            expert_precision: a.expert_precision,
            executor: a.executor,
            max_context,
            prefill_chunk: a.prefill_chunk,
            all_logits: false,
        },
    )?;
    eprintln!(
        "loaded {} in {:.2}s on {} ({}, {})",
        a.model.display(),
        engine.load_s,
        engine.ctx.adapter_name(),
        engine.ctx.backend_name(),
        engine.ctx.driver()
    );
    let opts = GenerateOptions {
        max_new_tokens: max_new,
        sampling,
        eos_ids: engine.eos_ids(),
        ignore_eos: a.ignore_eos,
        record_logits: false,
    };
    let mut stream = TextStream::new();
    let stdout = std::io::stdout();
    let json_mode = a.json;
    let tokr = engine.tokenizer.as_ref();
    let mut on_token = |id: u32| -> Result<()> {
        if json_mode {
            return Ok(());
        }
        let mut out = stdout.lock();
        match tokr {
            Some(t) => {
                let s = stream.push(t, id)?;
                out.write_all(s.as_bytes())
                    .and_then(|_| out.flush())
                    .map_err(stdout_error)?;
            }
            None => writeln!(out, "{id}").map_err(stdout_error)?,
        }
        Ok(())
    };
    let g = generate(&engine.ctx, &engine.fwd, &prompt_ids, &opts, &mut on_token)?;
    let text = match tokr {
        Some(t) => t.decode(&g.generated_ids)?,
        None => String::new(),
    };
    let n = g.generated_ids.len().max(1) as f64;
    let (rs, host_sum) = match engine.fwd.residency.as_ref() {
        Some(r) => {
            let r = r.borrow();
            (r.stats(), Some(r.host.checksum()?))
        }
        None => (Default::default(), None),
    };
    if let (Some(path), Some(p)) = (&a.residency.write_profile, engine.fwd.profile.as_ref()) {
        p.borrow().save(path)?;
        eprintln!("wrote expert profile {}", path.display());
    }
    if json_mode {
        let obj = json!({
            "model": a.model.display().to_string(),
            "prompt_ids": prompt_ids,
            "generated_ids": g.generated_ids,
            "text": text,
            "stopped_by_eos": g.stopped_by_eos,
            "metrics": {
                "ttft_s": g.ttft_s,
                "decode_tokens_per_s": g.decode_tokens_per_s(),
                "decode_s": g.decode_s,
                "prompt_tokens": prompt_ids.len(),
                "generated_tokens": g.generated_ids.len(),
                "prefill_tokens_per_s": prompt_ids.len() as f64 / g.prefill_s.max(1e-9),
                "load_s": engine.load_s,
                "adapter": engine.ctx.adapter_name(),
                "backend": engine.ctx.backend_name(),
                "driver": engine.ctx.driver(),
                "expert_precision": a.expert_precision,
                "executor": a.executor,
                "dispatches_per_decode_step": engine.fwd.dispatches_per_decode_step(),
                "submissions_per_token": g.submissions as f64 / n,
                "dispatches_per_token": g.dispatches as f64 / n,
                "peak_gpu_bytes": engine.ctx.tracker.peak(),
                "peak_rss_bytes": peak_rss_bytes(),
                "resident_experts_per_layer": engine.resident_experts,
                "cache_policy": if engine.resident_experts < engine.cfg.num_experts { Some(a.residency.cache_policy.as_str()) } else { None },
                "expert_hits": rs.expert_hits,
                "expert_misses": rs.expert_misses,
                "expert_evictions": rs.expert_evictions,
                "h2d_bytes": rs.h2d_bytes,
                "upload_seconds": rs.upload_seconds,
                "expert_hits_per_layer": rs.hits_per_layer,
                "expert_misses_per_layer": rs.misses_per_layer,
                "expert_evictions_per_layer": rs.evictions_per_layer,
                "host_source_checksum": host_sum.map(|h| format!("{h:016x}")),
            }
        });
        out!("{obj}");
    } else {
        if let Some(t) = tokr {
            let tail = stream.finish(t)?;
            out!("{tail}");
        }
        eprintln!(
            "{} prompt tokens, {} generated; TTFT {:.3}s, decode {:.2} tok/s",
            prompt_ids.len(),
            g.generated_ids.len(),
            g.ttft_s,
            g.decode_tokens_per_s()
        );
    }
    Ok(())
}

fn quantize(model: &std::path::Path, out: &std::path::Path, force: bool) -> Result<()> {
    wgmoe::interrupt::install()?;
    let pb =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("quantizing {bar:30} {pos}/{len} tensors {elapsed}")
    {
        pb.set_style(style);
    }
    let t0 = std::time::Instant::now();
    let summary = wgmoe::convert::write_converted_to(model, out, force, &mut |done, total| {
        pb.set_length(total as u64);
        pb.set_position(done as u64);
    })?;
    pb.finish_and_clear();
    if let Some(r) = &summary.replaced {
        eprintln!("replaced {r} in {}", out.display());
    }
    eprintln!(
        "wrote {} ({}: {} f16 non-routed + {} int4 experts) in {:.1}s",
        summary.out_file,
        wgmoe::inspect::human(summary.bytes),
        wgmoe::inspect::human(summary.dense_f16_bytes),
        wgmoe::inspect::human(summary.expert_int4_bytes),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

fn inspect(
    model: &std::path::Path,
    as_json: bool,
    max_context: Option<usize>,
    prefill_chunk: usize,
) -> Result<()> {
    let (cfg, _, _) = Engine::open_host(model)?;
    let ckpt = wgmoe::checkpoint::Checkpoint::open(model)?;
    let mut i = wgmoe::inspect::inspect(&cfg, &ckpt)?;
    if let Some(n) = max_context {
        if n == 0 || prefill_chunk == 0 {
            return Err(Error::option(
                "--max-context",
                "--max-context and --prefill-chunk must be at least 1",
            ));
        }
        i.add_workspace(&cfg, n, prefill_chunk);
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
        let missing = wgmoe::model::weights::check_tensors(&cfg, &ckpt).err();
        out!("{}", wgmoe::inspect::table(&i));
        if let Some(e) = missing {
            out!("warning: this checkpoint cannot be loaded: {e}");
        }
    }
    Ok(())
}

fn eval(a: EvalArgs) -> Result<()> {
    let (cfg, _, tok) = Engine::open_host(&a.model)?;
    let prompt_ids: Vec<u32> = match (&a.prompt, &a.prompt_ids) {
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
                "give a prompt with -p TEXT or --prompt-ids 1,2,3",
            ))
        }
    };
    let max_context = prompt_ids.len() + a.max_new_tokens;
    if max_context > cfg.max_position_embeddings {
        return Err(Error::option(
            "--max-new-tokens",
            format!(
                "{max_context} positions exceed max_position_embeddings = {}",
                cfg.max_position_embeddings
            ),
        ));
    }
    let opts = |precision| EngineOptions {
        residency: Default::default(),
        adapter: a.gpu.request(),
        expert_precision: precision,
        executor: a.executor,
        max_context,
        prefill_chunk: 64,
        all_logits: true,
    };
    // Reference: greedy decode with FP16 experts, keeping each step's logits.
    let f16 = Engine::load(&a.model, &opts(ExpertPrecision::F16))?;
    let g = generate(
        &f16.ctx,
        &f16.fwd,
        &prompt_ids,
        &GenerateOptions {
            max_new_tokens: a.max_new_tokens,
            sampling: SamplingOptions::greedy(),
            eos_ids: vec![],
            ignore_eos: true,
            record_logits: true,
        },
        &mut |_| Ok(()),
    )?;
    let adapter = f16.ctx.adapter_name().to_string();
    drop(f16);
    // Candidate: INT4 experts on the same sequence, teacher-forced.
    let int4 = Engine::load(&a.model, &opts(ExpertPrecision::Int4))?;
    let mut seq = prompt_ids.clone();
    seq.extend_from_slice(&g.generated_ids[..g.generated_ids.len().saturating_sub(1)]);
    let rows = wgmoe::generate::prompt_logits(&int4.ctx, &int4.fwd, &seq)?;
    let cand = &rows[prompt_ids.len() - 1..];
    let f = wgmoe::eval::fidelity(&g.step_logits, cand);
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
    Ok(())
}

#[derive(Args)]
struct SynthArgs {
    /// Architecture whose real config.json gives the default shape.
    #[arg(long, value_enum)]
    arch: wgmoe::synth::SynthArch,
    /// Output directory: new, empty, or an earlier wgmoe output.
    #[arg(short, long)]
    out: PathBuf,
    /// Write into a non-empty output directory that holds no earlier wgmoe output,
    /// replacing the model files there (other files are kept).
    #[arg(long)]
    force: bool,
    /// Weights: converted INT4 (f16 non-routed, packed INT4 experts) or a bf16 HF checkpoint.
    #[arg(long, value_enum, default_value = "converted")]
    format: wgmoe::synth::SynthFormat,
    #[arg(long)]
    hidden: Option<usize>,
    #[arg(long)]
    layers: Option<usize>,
    #[arg(long)]
    heads: Option<usize>,
    /// Default: --heads (both presets have as many KV heads as heads).
    #[arg(long)]
    kv_heads: Option<usize>,
    #[arg(long)]
    experts: Option<usize>,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long)]
    expert_intermediate: Option<usize>,
    /// Qwen1.5-MoE only.
    #[arg(long)]
    shared_expert_intermediate: Option<usize>,
    #[arg(long)]
    vocab: Option<usize>,
    #[arg(long)]
    max_position_embeddings: Option<usize>,
    /// Seed of the random weights (same seed and shape, same bytes).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// --format hf: largest shard (bytes) before splitting into model-0000k-of-0000n files.
    #[arg(long, default_value_t = wgmoe::synth::DEFAULT_MAX_SHARD_BYTES)]
    max_shard_bytes: u64,
    /// Print a JSON summary on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct BenchArgs {
    /// Model directory.
    model: PathBuf,
    /// Use the first N prompts of the built-in set (1..=12).
    #[arg(long, default_value_t = 12)]
    prompts: usize,
    /// Times the prompt set is repeated.
    #[arg(long, default_value_t = 3)]
    blocks: usize,
    /// New tokens per response (EOS suppressed: always this many).
    #[arg(short = 'n', long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Responses run first and excluded, per configuration.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Executors to sweep (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "grouped")]
    executor: Vec<Executor>,
    /// Expert precisions to sweep (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "int4")]
    expert_precision: Vec<ExpertPrecision>,
    /// Most prompt tokens per prefill submission.
    #[arg(long, default_value_t = 64)]
    prefill_chunk: usize,
    /// Write the records (a JSON array, one object per configuration) to FILE.
    #[arg(long)]
    json_out: Option<PathBuf>,
    /// Draw decode rate and H2D bytes against resident experts per layer to FILE (SVG).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Expert slots per layer to sweep, e.g. 30,40,50,60,64 (default: all resident).
    #[arg(long, value_delimiter = ',')]
    resident_experts: Vec<usize>,
    /// Cache policies to sweep below full residency: lru,lfu-decay,profile.
    #[arg(long, value_delimiter = ',', default_value = "lru")]
    cache_policy: Vec<String>,
    #[arg(long, default_value_t = wgmoe::residency::LfuDecay::DEFAULT_DECAY)]
    decay: f64,
    /// Expert-frequency profile for the profile policy.
    #[arg(long)]
    profile: Option<PathBuf>,
    #[arg(long, default_value_t = 4)]
    staging_buffers: usize,
    #[command(flatten)]
    gpu: GpuArgs,
}

fn synth(a: SynthArgs) -> Result<()> {
    use wgmoe::inspect::human;
    use wgmoe::synth::{ShapeOverrides, SynthOptions, SynthShape};
    let shape = SynthShape::resolve(
        a.arch,
        &ShapeOverrides {
            hidden: a.hidden,
            layers: a.layers,
            heads: a.heads,
            kv_heads: a.kv_heads,
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
    })?;
    pb.finish_and_clear();
    if let Some(r) = &s.replaced {
        eprintln!("replaced {r} in {}", a.out.display());
    }
    let sh = &s.shape;
    eprintln!(
        "wrote {} ({}, {}): hidden {}, {} layers, {}/{} heads, {} experts top-{}, expert intermediate {}{}, vocab {}, max positions {}, seed {}",
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

fn bench(a: BenchArgs) -> Result<()> {
    let opts = wgmoe::bench::BenchOptions {
        model: a.model.clone(),
        prompts: a.prompts,
        blocks: a.blocks,
        new_tokens: a.max_new_tokens,
        warmup: a.warmup,
        executors: a.executor.clone(),
        expert_precisions: a.expert_precision.clone(),
        prefill_chunk: a.prefill_chunk,
        adapter: a.gpu.request(),
        resident_experts: a.resident_experts.iter().map(|&n| Some(n)).collect(),
        cache_policies: a
            .cache_policy
            .iter()
            .map(|p| {
                p.parse().map_err(|e: wgmoe::residency::ConfigError| {
                    Error::option("--cache-policy", e.0)
                })
            })
            .collect::<Result<Vec<_>>>()?,
        decay: a.decay,
        profile: a.profile.clone(),
        staging_buffers: a.staging_buffers,
    };
    let write = |records: &[wgmoe::bench::BenchRecord]| -> Result<()> {
        if let Some(path) = &a.json_out {
            let text =
                serde_json::to_string_pretty(records).map_err(|e| Error::Other(e.to_string()))?;
            std::fs::write(path, text + "\n").map_err(|e| Error::io(path, e))?;
        }
        if let Some(path) = &a.plot {
            std::fs::write(path, wgmoe::bench::plot_svg(records))
                .map_err(|e| Error::io(path, e))?;
        }
        Ok(())
    };
    let mut done: Vec<wgmoe::bench::BenchRecord> = Vec::new();
    let mut write_err = None;
    let records = wgmoe::bench::run_bench(&opts, &mut |r| {
        eprintln!(
            "{}: decode {:.2} tok/s, TTFT {:.3}s, prefill {:.1} tok/s",
            wgmoe::bench::config_label(r),
            r.decode_tokens_per_s,
            r.ttft_s_mean,
            r.prefill_tokens_per_s
        );
        done.push(r.clone());
        // Keep what is measured if a later configuration fails.
        if let Err(e) = write(&done) {
            write_err.get_or_insert(e);
        }
    })?;
    if let Some(e) = write_err {
        return Err(e);
    }
    write(&records)?;
    out!("{}", wgmoe::bench::table(&records).trim_end());
    if let Some(p) = &a.json_out {
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &a.plot {
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

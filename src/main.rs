//! The `wgmoe` command line.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use serde_json::json;

use wgmoe::engine::{Engine, EngineOptions, ExpertPrecision};
use wgmoe::error::{Error, Result};
use wgmoe::model::forward::Executor;
use wgmoe::generate::{generate, GenerateOptions};
use wgmoe::gpu::{context::list_adapters, AdapterRequest, BackendChoice};
use wgmoe::sampling::SamplingOptions;
use wgmoe::tokenizer::TextStream;

#[derive(Parser)]
#[command(name = "wgmoe", version, about = "Mixture-of-Experts inference on wgpu compute shaders")]
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
        /// Output directory.
        #[arg(short, long)]
        out: PathBuf,
    },
    /// Print a checkpoint's tensors by class, with element counts, bytes per format and the
    /// weights resident on the GPU.
    Inspect {
        model: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Fidelity of INT4 experts against FP16 experts: KL divergence and top-1 agreement of
    /// next-token distributions over a greedy FP16 decode.
    Eval(EvalArgs),
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
}

impl GpuArgs {
    fn request(&self) -> AdapterRequest {
        AdapterRequest {
            backend: self.backend,
            adapter: self.adapter.clone(),
            max_binding: self.max_binding,
            portable_kernels: self.portable_kernels,
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
            let first = msg.lines().next().unwrap_or("invalid arguments").trim_start_matches("error: ");
            eprintln!("error: {first} (see --help)");
            return ExitCode::from(2);
        }
    };
    let r = match cli.cmd {
        Cmd::Devices { gpu, json } => devices(&gpu, json),
        Cmd::Run(args) => run(args),
        Cmd::Quantize { model, out } => quantize(&model, &out),
        Cmd::Inspect { model, json } => inspect(&model, json),
        Cmd::Eval(args) => eval(args),
    };
    match r {
        Ok(()) | Err(Error::StdoutClosed) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn devices(gpu: &GpuArgs, as_json: bool) -> Result<()> {
    let list = list_adapters(&gpu.request());
    if as_json {
        out!("{}", serde_json::to_string_pretty(&list).map_err(|e| Error::Other(e.to_string()))?);
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
            a.shader_f16, a.subgroup, a.timestamp_query
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

fn sampling_options(a: &RunArgs, gen: Option<&wgmoe::config::GenerationConfig>) -> Result<SamplingOptions> {
    let sampled = a.temperature.is_some() || a.top_k.is_some() || a.top_p.is_some();
    if a.greedy && sampled {
        return Err(Error::option("--greedy", "conflicts with --temperature/--top-k/--top-p"));
    }
    if !sampled {
        return Ok(SamplingOptions { seed: a.seed, ..SamplingOptions::greedy() });
    }
    let temperature = a.temperature.or(gen.and_then(|g| g.temperature)).unwrap_or(1.0);
    if !(temperature >= 0.0 && temperature.is_finite()) {
        return Err(Error::option("--temperature", format!("{temperature} is not a finite value >= 0")));
    }
    let top_p = a.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(Error::option("--top-p", format!("{top_p} is not in (0, 1]")));
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
                Error::bad_file(a.model.join("tokenizer.json"), "missing: needed to encode --prompt (or pass --prompt-ids)")
            })?;
            let text = if a.chat {
                tok.apply_chat_template(&[("user".to_string(), text.clone())], true)?
            } else {
                text.clone()
            };
            tok.encode(&text, true)?
        }
        (None, None) => return Err(Error::option("--prompt", "give a prompt with -p TEXT or --prompt-ids 1,2,3")),
    };
    if prompt_ids.is_empty() {
        return Err(Error::option("--prompt", "the prompt encodes to no tokens"));
    }
    if let Some(&bad) = prompt_ids.iter().find(|&&t| t as usize >= cfg.vocab_size) {
        return Err(Error::option(
            "--prompt-ids",
            format!("token id {bad} is outside the vocabulary (vocab_size {})", cfg.vocab_size),
        ));
    }
    if prompt_ids.len() > cfg.max_position_embeddings {
        return Err(Error::option(
            if a.prompt_ids.is_some() { "--prompt-ids" } else { "--prompt" },
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
    let engine = Engine::load(&a.model, &EngineOptions {
        adapter: a.gpu.request(),
        expert_precision: a.expert_precision,
        executor: a.executor,
        max_context,
        prefill_chunk: a.prefill_chunk,
        all_logits: false,
    })?;
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
                out.write_all(s.as_bytes()).and_then(|_| out.flush()).map_err(stdout_error)?;
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

fn quantize(model: &std::path::Path, out: &std::path::Path) -> Result<()> {
    let pb = indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template("quantizing {bar:30} {pos}/{len} tensors {elapsed}") {
        pb.set_style(style);
    }
    let t0 = std::time::Instant::now();
    let summary = wgmoe::convert::write_converted(model, out, &mut |done, total| {
        pb.set_length(total as u64);
        pb.set_position(done as u64);
    })?;
    pb.finish_and_clear();
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

fn inspect(model: &std::path::Path, as_json: bool) -> Result<()> {
    let (cfg, _, _) = Engine::open_host(model)?;
    let ckpt = wgmoe::checkpoint::Checkpoint::open(model)?;
    let i = wgmoe::inspect::inspect(&cfg, &ckpt)?;
    if as_json {
        out!("{}", serde_json::to_string_pretty(&i).map_err(|e| Error::Other(e.to_string()))?);
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
            .ok_or_else(|| Error::bad_file(a.model.join("tokenizer.json"), "missing: needed to encode --prompt"))?
            .encode(text, true)?,
        (None, None) => return Err(Error::option("--prompt", "give a prompt with -p TEXT or --prompt-ids 1,2,3")),
    };
    let max_context = prompt_ids.len() + a.max_new_tokens;
    if max_context > cfg.max_position_embeddings {
        return Err(Error::option("--max-new-tokens", format!("{max_context} positions exceed max_position_embeddings = {}", cfg.max_position_embeddings)));
    }
    let opts = |precision| EngineOptions {
        adapter: a.gpu.request(),
        expert_precision: precision,
        executor: a.executor,
        max_context,
        prefill_chunk: 64,
        all_logits: true,
    };
    // Reference: greedy decode with FP16 experts, keeping each step's logits.
    let f16 = Engine::load(&a.model, &opts(ExpertPrecision::F16))?;
    let g = generate(&f16.ctx, &f16.fwd, &prompt_ids, &GenerateOptions {
        max_new_tokens: a.max_new_tokens,
        sampling: SamplingOptions::greedy(),
        eos_ids: vec![],
        ignore_eos: true,
        record_logits: true,
    }, &mut |_| Ok(()))?;
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
        out!("{}", json!({"model": a.model.display().to_string(), "adapter": adapter, "prompt_ids": prompt_ids, "reference_ids": g.generated_ids, "int4_vs_f16": f}));
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

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
    /// Generate text from a Hugging Face checkpoint directory.
    Run(RunArgs),
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
}

impl GpuArgs {
    fn request(&self) -> AdapterRequest {
        AdapterRequest {
            backend: self.backend,
            adapter: self.adapter.clone(),
            max_binding: self.max_binding,
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
    #[arg(long)]
    temperature: Option<f32>,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long)]
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Devices { gpu, json } => devices(&gpu, json),
        Cmd::Run(args) => run(args),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn devices(gpu: &GpuArgs, as_json: bool) -> Result<()> {
    let list = list_adapters(&gpu.request());
    if as_json {
        println!("{}", serde_json::to_string_pretty(&list).map_err(|e| Error::Other(e.to_string()))?);
        return Ok(());
    }
    if list.is_empty() {
        // Reuse the context's message, which says how to get a driver.
        return wgmoe::gpu::GpuContext::new(&gpu.request()).map(|_| ());
    }
    for (i, a) in list.iter().enumerate() {
        println!("[{i}] {} ({}, {})", a.name, a.backend, a.device_type);
        println!("    driver: {} {}", a.driver, a.driver_info);
        println!(
            "    features: shader_f16={} subgroup={} timestamp_query={}",
            a.shader_f16, a.subgroup, a.timestamp_query
        );
        println!(
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
            "--prompt",
            format!(
                "{} prompt tokens exceed max_position_embeddings = {}",
                prompt_ids.len(),
                cfg.max_position_embeddings
            ),
        ));
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
        if let Some(t) = tokr {
            let s = stream.push(t, id)?;
            let mut out = stdout.lock();
            let _ = out.write_all(s.as_bytes());
            let _ = out.flush();
        } else {
            println!("{id}");
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
        println!("{obj}");
    } else {
        let tail = stream.finish(tokr.ok_or_else(|| Error::Other("no tokenizer".into()))?).unwrap_or_default();
        println!("{tail}");
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

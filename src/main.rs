//! The `wgmoe` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use wgmoe::backend::plan::{DecodeKernels, PrefillKernels};
use wgmoe::error::Error;
use wgmoe::model::Executor;
use wgmoe::runtime::engine::{DensePrecision, ExpertPrecision, KvPrecision};

use cli::bench_args::{BenchArgs, SynthArgs};
use cli::gpu_args::{parse_pipeline_depth, GpuArgs};
use cli::loadtest::LoadtestArgs;
use cli::residency_args::ResidencyArgs;

#[derive(Parser)]
#[command(
    name = "wgmoe",
    version,
    about = "Mixture-of-Experts inference on wgpu compute shaders",
    arg_required_else_help = true
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
        /// Measure the default adapter's (or --adapter's) device read and host-to-device
        /// bandwidths and store them for `wgmoe plan`.
        #[arg(long)]
        measure: bool,
    },
    /// Generate text from a Hugging Face checkpoint directory (or a converted one) or a
    /// GGUF file.
    Run(RunArgs),
    /// Chat in the terminal with the model loaded once: the chat template, streaming
    /// answers, the KV cache reused across turns; /reset, /stats, /exit.
    Chat(ChatArgs),
    /// An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions,
    /// /v1/models, /health, /metrics): --parallel requests at once by continuous
    /// batching, more waiting in a bounded queue.
    Serve(ServeArgs),
    /// Load a running server with concurrent clients and check every answer: exact usage,
    /// one answer per request, malformed requests refused; tok/s, TTFT and latency.
    Loadtest(LoadtestArgs),
    /// Convert a Hugging Face checkpoint to wgmoe's INT4 format (dense weights q8_0 unless
    /// --dense-precision f16, router, norms and embeddings f16, packed INT4 routed experts),
    /// for a memory-mapped, conversion-free start.
    Quantize {
        /// Hugging Face checkpoint directory.
        model: PathBuf,
        /// Output directory: new, empty, or an earlier wgmoe output (never the input
        /// directory, or one inside or around it).
        #[arg(short, long)]
        out: PathBuf,
        /// Write into a non-empty output directory that holds no earlier wgmoe output,
        /// replacing the model files there (weights, config and tokenizer files; other
        /// files are kept). A directory holding a GGUF file wgmoe did not write is refused
        /// even so.
        #[arg(long)]
        force: bool,
        /// Storage of the dense weights (attention q/k/v/o, shared experts, dense MLP
        /// layers, lm_head): q8_0 (ggml's Q8_0 blocks, bit-exact with quantising on load;
        /// such a model runs with `--dense-precision q8_0` only), or f16 (runs with either).
        /// The router, norms and embeddings stay f16.
        #[arg(long, value_enum, default_value = "q8_0")]
        dense_precision: DensePrecision,
    },
    /// Print a checkpoint's (or a GGUF file's) tensors by class, with element counts, bytes
    /// per format and the weights resident on the GPU.
    Inspect {
        /// Model directory (a Hugging Face checkpoint or a converted one), or a GGUF file.
        model: PathBuf,
        /// Print the numbers as one JSON object instead of a table.
        #[arg(long)]
        json: bool,
        /// Also print the KV cache and workspace for this many positions, and the total GPU
        /// bytes with every expert resident as INT4 (what `run`/`bench` track as peak).
        #[arg(
            short = 'c',
            long = "ctx-size",
            value_name = "N",
            alias = "max-context"
        )]
        max_context: Option<usize>,
        /// Prefill chunk for the workspace arithmetic (as `run --prefill-chunk`).
        #[arg(long, default_value_t = 64)]
        prefill_chunk: usize,
        /// Storage of the dense weights the GPU bytes count (as `run --dense-precision`).
        #[arg(long, value_enum, default_value = "q8_0")]
        dense_precision: DensePrecision,
        /// Storage of the KV cache the bytes count (as `run --kv-precision`).
        #[arg(long, value_enum, default_value = "f16")]
        kv_precision: KvPrecision,
    },
    /// Fidelity of each precision (INT4 experts, q8_0 dense weights, an f16 KV cache, and
    /// the defaults combined) against f16 experts, f16 dense weights and an f32 KV cache:
    /// KL divergence and top-1 agreement of next-token distributions over a greedy decode.
    Eval(EvalArgs),
    /// Write a random-weight model with the exact shapes of a real checkpoint (converted
    /// INT4 format, a bf16 Hugging Face checkpoint, or a GGUF file), streaming.
    Synth(SynthArgs),
    /// The measurement contract: a fixed prompt set in blocks, fixed new tokens, greedy,
    /// EOS suppressed, warm-up excluded; comma-separated lists sweep configurations.
    Bench(BenchArgs),
    /// What must live on the card, from config.json alone: bytes per component, KV cache,
    /// workspace, the hot part, experts per layer that fit, host RAM, predicted decode
    /// speed, and the `wgmoe run` command line.
    Plan(PlanArgs),
    /// Which kernel the plan picks for each stage of a model on a device class, and how
    /// it touches memory, measured from the kernels (a probe build on lavapipe with
    /// 32-lane subgroups): grid, bytes read, weight-load sector efficiency, predicted time.
    Kernels(KernelsArgs),
    /// Replay a routing trace (`run/bench --trace`) through the cache policies at each
    /// capacity, against Belady's optimal ceiling, with coverage and skew per layer.
    Simulate(SimulateArgs),
    /// Draw a routing trace's layer x expert grid of activation counts, with the resident
    /// set and evictions marked, to an SVG or PNG file.
    Heatmap {
        /// A trace written by `wgmoe run/bench --trace FILE`.
        trace: PathBuf,
        /// Output picture: FILE.svg or FILE.png.
        #[arg(short, long, value_name = "FILE")]
        out: PathBuf,
    },
}

#[derive(Args)]
struct KernelsArgs {
    /// A model directory, its config.json (e.g. models/configs/qwen3-30b-a3b.json), or a
    /// GGUF file (its header is enough).
    model: PathBuf,
    /// The device class whose kernel plan is reported.
    #[arg(long, value_enum, default_value = "discrete")]
    device_class: wgmoe::insight::kernel_report::DeviceClass,
    /// The steps to measure: one-token decode, a prefill chunk, or both.
    #[arg(long, value_enum, default_value = "all")]
    stages: wgmoe::insight::kernel_report::Stages,
    /// KV cache positions (decode attends over all of them).
    #[arg(
        short = 'c',
        long = "ctx-size",
        value_name = "N",
        alias = "context",
        default_value_t = 4096
    )]
    context: usize,
    /// Tokens of the prefill chunk measured.
    #[arg(long, default_value_t = 64)]
    prefill_chunk: usize,
    /// Device memory bandwidth for the predicted times, GB/s (default: an RTX 5070's).
    #[arg(long, default_value_t = 672.0)]
    bandwidth: f64,
    /// What one dependent dispatch costs at least, microseconds (launch, barrier, ramp-up;
    /// `wgmoe devices --measure` reports an adapter's as dispatch_latency_s). The default
    /// is an assumption for a discrete GPU under Vulkan, not a measurement.
    #[arg(long, value_name = "US", default_value_t = 10.0)]
    dispatch_latency_us: f64,
    /// A submit-to-readback round trip, microseconds (`devices --measure`'s round_trip_s);
    /// counted per step at --pipeline-depth 1.
    #[arg(long, value_name = "US", default_value_t = 50.0)]
    round_trip_us: f64,
    /// Decode steps in flight the prediction assumes (as `run --pipeline-depth`).
    #[arg(long, value_name = "N", default_value_t = wgmoe::runtime::generate::DEFAULT_PIPELINE_DEPTH,
          value_parser = parse_pipeline_depth)]
    pipeline_depth: usize,
    /// Routed experts as INT4 (int4 and int4-strict count the same here) or f16 (as
    /// `run --expert-precision`).
    #[arg(long, value_enum, default_value = "int4")]
    expert_precision: ExpertPrecision,
    /// The old name of `--expert-precision f16`.
    #[arg(long, hide = true, conflicts_with = "expert_precision")]
    f16_experts: bool,
    /// Dense weights as f16 or q8_0 (as `run --dense-precision`).
    #[arg(long, value_enum, default_value = "q8_0")]
    dense_precision: DensePrecision,
    /// Storage of the KV cache the attention kernels read (as `run --kv-precision`).
    #[arg(long, value_enum, default_value = "f16")]
    kv_precision: KvPrecision,
    /// Use the portable kernels even where subgroup operations exist.
    #[arg(long)]
    portable_kernels: bool,
    /// Override the plan's one-token kernels.
    #[arg(long, value_enum)]
    decode_kernels: Option<DecodeKernels>,
    /// Override the plan's multi-token kernels.
    #[arg(long, value_enum)]
    prefill_kernels: Option<PrefillKernels>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct SimulateArgs {
    /// A trace written by `wgmoe run/bench --trace FILE`.
    trace: PathBuf,
    /// Resident experts per layer to simulate, comma-separated (default: the run's, and
    /// a quarter, half and three quarters of the experts).
    #[arg(long, value_delimiter = ',')]
    capacity: Vec<usize>,
    /// LFU decay factors to sweep, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.8,0.9,0.95,0.99")]
    decay: Vec<f64>,
    /// Share of the trace's steps the static profile is fitted on (scored on the rest).
    #[arg(long, default_value_t = 0.5)]
    fit: f64,
    /// Also replay each policy with the trace's recorded next-layer guesses copied ahead
    /// (what `run --prefetch next-layer` does): hit rate, H2D and wasted bytes.
    #[arg(long, value_enum, default_value = "off")]
    prefetch: wgmoe::residency::Prefetch,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct PlanArgs {
    /// Model directory, its config.json, or a GGUF file (no weights needed: a GGUF's
    /// header is enough).
    model: PathBuf,
    /// GPU memory wgmoe may use (e.g. 12GiB, 8G, 512MiB, bytes).
    #[arg(long, value_parser = parse_size, alias = "vram-budget")]
    vram: u64,
    /// KV-cache positions to plan for, prompt and generated tokens (default:
    /// max_position_embeddings, at most 4096, as `chat` and `serve`).
    #[arg(short = 'c', long = "ctx-size", value_name = "N", alias = "context")]
    context: Option<usize>,
    /// Host RAM (default: this machine's, from /proc/meminfo). It must hold what stays in
    /// RAM while the model runs: the INT4 copy of every routed expert below full
    /// residency. Loading streams the weights from the memory-mapped files, so at full
    /// residency the model need not fit in RAM.
    #[arg(long, value_parser = parse_size)]
    ram: Option<u64>,
    /// Prompt tokens per prefill submission (as `run --prefill-chunk`).
    #[arg(long, default_value_t = 64)]
    prefill_chunk: usize,
    /// Storage of the dense weights the plan counts (as `run --dense-precision`).
    #[arg(long, value_enum, default_value = "q8_0")]
    dense_precision: DensePrecision,
    /// Storage of the KV cache: f16 (attention reads it directly), f32, or q8_0 (int8 in
    /// blocks of 32 along head_dim, an f32 scale each: 0.28x f32's bytes).
    #[arg(long, value_enum, default_value = "f16")]
    kv_precision: KvPrecision,
    /// Staging buffers for expert uploads (as `run --staging-buffers`; default: top_k,
    /// plus the prefetch width with prefetch).
    #[arg(long)]
    staging_buffers: Option<usize>,
    /// Prefetch, as `run --prefetch` (default: next-layer unless --miss-policy cpu): its
    /// slots are counted and its saving predicted.
    #[arg(long, value_enum)]
    prefetch: Option<wgmoe::residency::Prefetch>,
    /// Experts guessed and prefetched per layer and step (default: top_k).
    #[arg(long, value_name = "N")]
    prefetch_width: Option<usize>,
    /// A routing trace whose recorded guesses give the prefetch accuracy to predict with
    /// (`wgmoe run/bench --trace`; default: no saving predicted without one).
    #[arg(long, value_name = "TRACE")]
    prefetch_trace: Option<PathBuf>,
    /// Memory of one GPU of a serving cluster, for a model too big for one machine.
    #[arg(long, value_parser = parse_size, default_value = "80GiB")]
    gpu_memory: u64,
    /// Device memory read bandwidth in GB/s (default: from `wgmoe devices --measure`).
    #[arg(long)]
    device_gbps: Option<f64>,
    /// Host-to-device bandwidth in GB/s (default: from `wgmoe devices --measure`).
    #[arg(long)]
    h2d_gbps: Option<f64>,
    /// The CPU expert kernel's read rate in GB/s (default: from `wgmoe devices --measure`).
    #[arg(long)]
    cpu_gbps: Option<f64>,
    /// One sync point (submission + readback) in microseconds (default: from
    /// `wgmoe devices --measure`; without it, sync time is not counted).
    #[arg(long)]
    round_trip_us: Option<f64>,
    /// Where misses run, as `run --miss-policy`: upload (needs top_k resident per layer),
    /// cpu, or auto (the default: either per miss; any count from 0 works).
    #[arg(long, value_enum, default_value = "auto")]
    miss_policy: wgmoe::residency::MissPolicy,
    /// Expert hit rate to predict with (e.g. from `wgmoe simulate`; default: uniform routing).
    #[arg(long)]
    hit_rate: Option<f64>,
    /// Use the stored measurements of this adapter: an index (as `wgmoe devices` numbers
    /// them and `run --adapter` takes it) or text its name contains.
    #[arg(long, value_name = "INDEX|NAME")]
    adapter: Option<String>,
    /// The experts' precision planned, as `run --expert-precision`: int4 (a GGUF file's
    /// types held as they are), or int4-strict (a GGUF file's wider expert types rounded
    /// into affine INT4). The plan counts INT4 experts; f16 is only shown for comparison.
    #[arg(long, value_enum, default_value = "int4")]
    expert_precision: ExpertPrecision,
    /// The old name of `--expert-precision int4-strict`.
    #[arg(long, hide = true, conflicts_with = "expert_precision")]
    int4_strict: bool,
    /// Print the plan as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct EvalArgs {
    /// Hugging Face checkpoint directory (f16 experts need the original weights), or a GGUF
    /// file (its weights decoded to f16 are the reference).
    model: PathBuf,
    /// Prompt text the comparison starts from (`-` reads it from stdin).
    #[arg(short, long, conflicts_with_all = ["prompt_ids", "file"])]
    prompt: Option<String>,
    /// Read the prompt text from FILE.
    #[arg(short = 'f', long, value_name = "FILE", conflicts_with = "prompt_ids")]
    file: Option<PathBuf>,
    /// Prompt as comma-separated token ids, bypassing the tokenizer.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Tokens decoded (greedy, by the reference: f16 experts, f16 dense weights, f32 KV
    /// cache) and compared.
    #[arg(short = 'n', long, default_value_t = 24, allow_negative_numbers = true)]
    max_new_tokens: usize,
    /// Compare one candidate only: these routed experts (the reference's f16 where not
    /// given, as for the other two precisions).
    #[arg(long, value_enum)]
    expert_precision: Option<ExpertPrecision>,
    /// Compare one candidate only: these dense weights (f16 where not given).
    #[arg(long, value_enum)]
    dense_precision: Option<DensePrecision>,
    /// Compare one candidate only: this KV cache (f32 where not given).
    #[arg(long, value_enum)]
    kv_precision: Option<KvPrecision>,
    /// How routed experts are dispatched.
    #[arg(long, value_enum, default_value = "grouped")]
    executor: Executor,
    /// A tokenizer.json (or a GGUF file) to encode --prompt with instead of the model's
    /// own, as `run --tokenizer`.
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// Print one JSON object instead of a line per precision.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    gpu: GpuArgs,
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

#[derive(Args)]
struct RunArgs {
    /// Model directory (config.json, tokenizer.json, *.safetensors), or a GGUF file.
    model: PathBuf,
    /// A tokenizer.json to use instead of the model's own (a GGUF's metadata, a
    /// checkpoint's tokenizer.json); a tokenizer_config.json beside it gives its specials
    /// and chat template. A GGUF file gives its own tokenizer (a vocab-only one will do).
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// Prompt text (`-` reads it from stdin).
    #[arg(short, long, conflicts_with_all = ["prompt_ids", "file"])]
    prompt: Option<String>,
    /// Read the prompt text from FILE (one trailing newline is dropped, as with stdin).
    #[arg(short = 'f', long, value_name = "FILE", conflicts_with = "prompt_ids")]
    file: Option<PathBuf>,
    /// Prompt as comma-separated token ids, bypassing the tokenizer.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt text in the chat template as one user message (not with
    /// --prompt-ids: ids are already tokens).
    #[arg(long, conflicts_with = "prompt_ids")]
    chat: bool,
    /// The chat template of --chat: a Jinja file, or chatml, llama-2 or plain
    /// (default: the model's; without one, plain User:/Assistant: lines).
    #[arg(long, value_name = "FILE|NAME", requires = "chat")]
    chat_template: Option<String>,
    /// Most tokens to generate; 0 runs the prompt only and reports the prefill rate.
    #[arg(
        short = 'n',
        long,
        default_value_t = 128,
        allow_negative_numbers = true
    )]
    max_new_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Do not stop at EOS, and never sample it.
    #[arg(long)]
    ignore_eos: bool,
    /// Storage of routed expert weights: int4 (W4A16: block-256 INT4 for a safetensors
    /// checkpoint; a GGUF file's blocks as they are, its float experts as Q8_0),
    /// int4-strict (every GGUF expert matrix 4-bit), or f16.
    #[arg(long, value_enum, default_value = "int4")]
    expert_precision: ExpertPrecision,
    /// Storage of the dense weights (attention q/k/v/o, shared experts, dense MLP layers,
    /// lm_head): q8_0 (ggml's Q8_0, quantised on load; 8.5 bits per weight; a GGUF file's
    /// 4- to 6-bit matrices in their own blocks), or f16. The router, norms and embeddings
    /// stay f16.
    #[arg(long, value_enum, default_value = "q8_0")]
    dense_precision: DensePrecision,
    /// Storage of the KV cache: f16 (attention reads it directly), f32, or q8_0 (int8 in
    /// blocks of 32 along head_dim, an f32 scale each: 0.28x f32's bytes).
    #[arg(long, value_enum, default_value = "f16")]
    kv_precision: KvPrecision,
    /// How routed experts are dispatched.
    #[arg(long, value_enum, default_value = "grouped")]
    executor: Executor,
    /// Most prompt tokens per prefill submission.
    #[arg(long, default_value_t = 64)]
    prefill_chunk: usize,
    /// Positions of the KV cache, prompt and generated tokens: generation stops when it is
    /// full (default: the prompt plus -n, at most max_position_embeddings).
    #[arg(short = 'c', long, value_name = "N")]
    ctx_size: Option<usize>,
    #[command(flatten)]
    residency: ResidencyArgs,
    /// Write the per-layer expert frequencies of this run to FILE (a calibration run for
    /// --cache-policy profile).
    #[arg(long, value_name = "FILE")]
    write_profile: Option<PathBuf>,
    /// Replay every step's dispatches timed by GPU timestamps (wall clock where the adapter
    /// has none; slows the run, decode at depth 1): GPU time per stage and kernel per token.
    #[arg(long)]
    profile_kernels: bool,
    /// Write the routing to FILE (JSONL: one line per token and MoE layer with the expert
    /// ids, router weights, hits and the experts computed on the CPU); reads each layer's
    /// routing back (slower).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Draw the layer x expert activation grid in the terminal while generating (off when
    /// stdout is not a terminal); reads each layer's routing back (slower).
    #[arg(long)]
    live: bool,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    gpu: GpuArgs,
}

/// Token selection (`run`, `chat`; `serve`'s defaults for requests that set none).
#[derive(Args, Clone)]
struct SamplingArgs {
    /// Greedy decoding (the default unless --temperature, --top-k or --top-p is given).
    #[arg(long)]
    greedy: bool,
    /// Sample with this temperature (> 0; 0 is greedy). Default: generation_config.json's,
    /// else 1 when --top-k or --top-p is given.
    #[arg(long, allow_negative_numbers = true)]
    temperature: Option<f32>,
    /// Sample only among the K most likely tokens (0: no limit; 1 is greedy).
    #[arg(long, value_name = "K")]
    top_k: Option<usize>,
    /// Sample only among the most likely tokens whose probabilities sum to P (0 < P <= 1).
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    top_p: Option<f32>,
    /// Seed of the sampling RNG (default: a random one, printed in the summary and the
    /// JSON so the run can be repeated).
    #[arg(long)]
    seed: Option<u64>,
}

/// How `chat` and `serve` load the model: the context they keep, and the engine options
/// of `run`.
#[derive(Args)]
struct LoadArgs {
    /// Positions of the KV cache: the longest conversation, prompt and answer (default:
    /// max_position_embeddings, at most 4096).
    #[arg(short = 'c', long, value_name = "N")]
    ctx_size: Option<usize>,
    /// When a conversation outgrows the context, drop its oldest turns (system messages
    /// and the newest message are kept) instead of refusing it.
    #[arg(long)]
    context_shift: bool,
    /// The chat template: a Jinja file, or chatml, llama-2 or plain (default: the
    /// model's; without one, plain User:/Assistant: lines).
    #[arg(long, value_name = "FILE|NAME")]
    chat_template: Option<String>,
    /// A tokenizer.json, or a GGUF file's tokenizer, to use instead of the model's own (as
    /// `run --tokenizer`).
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// Storage of routed expert weights: int4 (W4A16: block-256 INT4 for a safetensors
    /// checkpoint; a GGUF file's blocks as they are, its float experts as Q8_0),
    /// int4-strict (every GGUF expert matrix 4-bit), or f16.
    #[arg(long, value_enum, default_value = "int4")]
    expert_precision: ExpertPrecision,
    /// Storage of the dense weights (attention q/k/v/o, shared experts, dense MLP layers,
    /// lm_head): q8_0 (ggml's Q8_0, quantised on load; 8.5 bits per weight; a GGUF file's
    /// 4- to 6-bit matrices in their own blocks), or f16. The router, norms and embeddings
    /// stay f16.
    #[arg(long, value_enum, default_value = "q8_0")]
    dense_precision: DensePrecision,
    /// Storage of the KV cache: f16 (attention reads it directly), f32, or q8_0 (int8 in
    /// blocks of 32 along head_dim, an f32 scale each: 0.28x f32's bytes).
    #[arg(long, value_enum, default_value = "f16")]
    kv_precision: KvPrecision,
    /// How routed experts are dispatched.
    #[arg(long, value_enum, default_value = "grouped")]
    executor: Executor,
    /// Most prompt tokens per prefill submission.
    #[arg(long, default_value_t = 64)]
    prefill_chunk: usize,
    #[command(flatten)]
    residency: ResidencyArgs,
    #[command(flatten)]
    gpu: GpuArgs,
}

#[derive(Args)]
struct ChatArgs {
    /// Model directory (config.json, tokenizer.json, *.safetensors), or a GGUF file.
    model: PathBuf,
    /// A system message that starts the conversation (kept by /reset and context shift).
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// Most tokens per answer.
    #[arg(
        short = 'n',
        long,
        default_value_t = 512,
        allow_negative_numbers = true
    )]
    max_new_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Do not stop at EOS, and never sample it.
    #[arg(long)]
    ignore_eos: bool,
    #[command(flatten)]
    load: LoadArgs,
}

#[derive(Args)]
struct ServeArgs {
    /// Model directory (config.json, tokenizer.json, *.safetensors), or a GGUF file.
    model: PathBuf,
    /// Address to listen on (a non-loopback one exposes the model to the network).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every request (401 otherwise).
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Requests served at once (slots), by continuous batching: every decode step runs one
    /// token of each together. The KV cache (--ctx-size positions) is split evenly between
    /// the slots. Default 4 (1 with --backend cuda, whose kernels serve one sequence).
    #[arg(long, value_name = "N")]
    parallel: Option<usize>,
    /// When a decode step of several requests runs as one batched forward: auto (whichever
    /// is faster as measured on this adapter, per batch size), on, or off (one one-token
    /// step per request; each still has its own slot).
    #[arg(long, value_enum, default_value = "auto")]
    batching: wgmoe::runtime::batch::Batching,
    /// Requests that may wait while every slot is busy; beyond that, 503.
    #[arg(long, default_value_t = 8)]
    max_queue: usize,
    /// Largest request body (e.g. 4MiB, 65536); beyond that, 413.
    #[arg(long, value_parser = parse_size, default_value = "4MiB")]
    max_body: u64,
    /// Model name in /v1/models and responses (default: the directory's name, or a GGUF
    /// file's name, `.gguf` included).
    #[arg(long)]
    alias: Option<String>,
    /// Answer a request whose `model` is neither the loaded model's name nor its --alias
    /// with 404 model_not_found (by default any name is answered by the loaded model, as
    /// llama-server does: many clients send a fixed name).
    #[arg(long)]
    strict_model: bool,
    /// On SIGTERM or Ctrl-C: refuse new requests (503), let those admitted finish for up
    /// to this many seconds, then end them (finish_reason "abort"; queued ones get 503) and
    /// exit 0. A second signal exits at once (status 130).
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    drain_timeout: u64,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    load: LoadArgs,
}

/// Print a line to stdout; a closed stdout (e.g. `| head`) ends the command quietly
/// instead of panicking like `println!`.
macro_rules! out {
    ($($t:tt)*) => {{
        let mut o = std::io::stdout().lock();
        writeln!(o, $($t)*).and_then(|_| o.flush()).map_err(stdout_error)?;
    }};
}

mod cli;

fn stdout_error(e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Error::StdoutClosed
    } else {
        Error::io("<stdout>", e)
    }
}

fn main() -> ExitCode {
    // clap prints its own errors (with the usage, suggestions and valid values) and help,
    // and exits (2 for errors, 0 for --help/--version); bare `wgmoe` prints the help.
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Devices {
            gpu,
            json,
            measure: true,
        } => cli::tools::measure(&gpu, json),
        Cmd::Devices { gpu, json, .. } => cli::tools::devices(&gpu, json),
        Cmd::Run(args) => cli::run::run(args),
        Cmd::Chat(args) => cli::chat::chat(args),
        Cmd::Serve(args) => cli::serve::serve(args),
        Cmd::Loadtest(args) => cli::loadtest::loadtest(args),
        Cmd::Quantize {
            model,
            out,
            force,
            dense_precision,
        } => cli::tools::quantize(&model, &out, force, dense_precision),
        Cmd::Inspect {
            model,
            json,
            max_context,
            prefill_chunk,
            dense_precision,
            kv_precision,
        } => cli::tools::inspect(
            &model,
            json,
            max_context,
            prefill_chunk,
            dense_precision,
            kv_precision,
        ),
        Cmd::Eval(args) => cli::tools::eval(args),
        Cmd::Synth(args) => cli::tools::synth(args),
        Cmd::Bench(args) => cli::bench::bench(args),
        Cmd::Plan(args) => cli::plan::plan(args),
        Cmd::Kernels(args) => cli::plan::kernels(args),
        Cmd::Simulate(args) => cli::insight::simulate(args),
        Cmd::Heatmap { trace, out } => cli::insight::heatmap(&trace, &out),
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

//! The arguments of `wgmoe synth` and `wgmoe bench` (the benchmark commands).

use std::path::PathBuf;

use clap::Args;

use wgmoe::model::Executor;
use wgmoe::runtime::engine::{DensePrecision, ExpertPrecision, KvPrecision};

use crate::GpuArgs;

#[derive(Args)]
pub(crate) struct SynthArgs {
    /// Architecture whose real config.json gives the default shape.
    #[arg(long, value_enum)]
    pub(crate) arch: wgmoe::synth::SynthArch,
    /// Output directory: new, empty, or an earlier wgmoe output.
    #[arg(short, long)]
    pub(crate) out: PathBuf,
    /// Write into a non-empty output directory that holds no earlier wgmoe output,
    /// replacing the model files there (other files are kept). A directory holding a GGUF
    /// file wgmoe did not write is refused even so.
    #[arg(long)]
    pub(crate) force: bool,
    /// Weights: converted INT4 (f16 non-routed, packed INT4 experts), a bf16 HF checkpoint,
    /// or one GGUF file (model.gguf) in the block types of --gguf-type.
    #[arg(long, value_enum, default_value = "converted")]
    pub(crate) format: wgmoe::synth::SynthFormat,
    /// --format gguf: the block types, as llama-quantize's scheme of that name chooses them.
    #[arg(long, value_enum, default_value = "q4_k_m")]
    pub(crate) gguf_type: wgmoe::synth::GgufScheme,
    /// hidden_size (default: the architecture's).
    #[arg(long)]
    pub(crate) hidden: Option<usize>,
    /// num_hidden_layers.
    #[arg(long)]
    pub(crate) layers: Option<usize>,
    /// num_attention_heads.
    #[arg(long)]
    pub(crate) heads: Option<usize>,
    /// num_key_value_heads. Default: the preset's, or with --heads the preset's ratio of
    /// heads to KV heads where it divides --heads (1, 1, 8 and 4), else --heads.
    #[arg(long)]
    pub(crate) kv_heads: Option<usize>,
    /// head_dim (Qwen3-MoE only; the others' is hidden / heads).
    #[arg(long)]
    pub(crate) head_dim: Option<usize>,
    /// num_experts (routed experts per MoE layer).
    #[arg(long)]
    pub(crate) experts: Option<usize>,
    /// num_experts_per_tok.
    #[arg(long)]
    pub(crate) top_k: Option<usize>,
    /// Routed expert intermediate size.
    #[arg(long)]
    pub(crate) expert_intermediate: Option<usize>,
    /// Qwen1.5-MoE only.
    #[arg(long)]
    pub(crate) shared_expert_intermediate: Option<usize>,
    /// vocab_size.
    #[arg(long)]
    pub(crate) vocab: Option<usize>,
    /// max_position_embeddings.
    #[arg(long)]
    pub(crate) max_position_embeddings: Option<usize>,
    /// Seed of the random weights (same seed and shape, same bytes).
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Routers that prefer some experts, as trained ones do: each MoE layer ranks its
    /// experts (seeded, per layer) and scales the router row of rank r by (1 + r)^-S, a
    /// Zipf-like popularity (0..=4; 0: uniform routing, the worst case for a cache).
    #[arg(long, default_value_t = 0.0, value_name = "S")]
    pub(crate) router_skew: f64,
    /// --format hf: largest shard (bytes) before splitting into model-0000k-of-0000n files.
    #[arg(long, default_value_t = wgmoe::synth::DEFAULT_MAX_SHARD_BYTES)]
    pub(crate) max_shard_bytes: u64,
    /// Print a JSON summary on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// Model directory, or a GGUF file.
    pub(crate) model: PathBuf,
    /// A tokenizer.json (or a GGUF file) to encode the prompts with instead of the model's
    /// own, as `run --tokenizer`.
    #[arg(long, value_name = "FILE")]
    pub(crate) tokenizer: Option<PathBuf>,
    /// Use the first N prompts of the built-in set (1..=12).
    #[arg(long, default_value_t = 12)]
    pub(crate) prompts: usize,
    /// Times the prompt set is repeated.
    #[arg(long, default_value_t = 3)]
    pub(crate) blocks: usize,
    /// New tokens per response (EOS suppressed: always this many).
    #[arg(
        short = 'n',
        long,
        default_value_t = 128,
        allow_negative_numbers = true
    )]
    pub(crate) max_new_tokens: usize,
    /// Responses run first and excluded, per configuration.
    #[arg(long, default_value_t = 1)]
    pub(crate) warmup: usize,
    /// Executors to sweep (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "grouped")]
    pub(crate) executor: Vec<Executor>,
    /// Expert precisions to sweep (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "int4")]
    pub(crate) expert_precision: Vec<ExpertPrecision>,
    /// Storages of the dense weights to sweep (comma-separated; attention q/k/v/o, shared
    /// experts, dense MLP layers, lm_head): q8_0 (ggml's Q8_0, quantised on load; 8.5 bits
    /// per weight), or f16. The router, norms and embeddings stay f16.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "q8_0")]
    pub(crate) dense_precision: Vec<DensePrecision>,
    /// Storages of the KV cache to sweep (comma-separated): f16 (attention reads it
    /// directly), f32, or q8_0 (int8 in blocks of 32 along head_dim, an f32 scale each).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "f16")]
    pub(crate) kv_precision: Vec<KvPrecision>,
    /// Most prompt tokens per prefill submission.
    #[arg(long, default_value_t = 64)]
    pub(crate) prefill_chunk: usize,
    /// Write the records (a JSON array, one object per configuration) to FILE.
    #[arg(long)]
    pub(crate) json_out: Option<PathBuf>,
    /// Draw decode rate and H2D bytes against resident experts per layer to FILE (.svg,
    /// or .png rasterised).
    #[arg(long, value_name = "FILE.svg|FILE.png")]
    pub(crate) plot: Option<PathBuf>,
    /// Expert slots per layer to sweep, e.g. 30,40,50,60,64 (default: all resident).
    #[arg(long, value_delimiter = ',')]
    pub(crate) resident_experts: Vec<usize>,
    /// Every routed expert computed on the CPU, in every configuration (as
    /// --resident-experts 0).
    #[arg(long, conflicts_with_all = ["resident_experts", "vram_budget"])]
    pub(crate) cpu_experts: bool,
    /// GPU memory every configuration may use (e.g. 6GiB, 512MiB); derives the resident
    /// experts as `run --vram` does.
    #[arg(long = "vram", value_name = "SIZE", value_parser = crate::parse_size, alias = "vram-budget", conflicts_with = "resident_experts")]
    pub(crate) vram_budget: Option<u64>,
    /// Cache policies to sweep below full residency: lru,lfu-decay,profile.
    #[arg(long, value_delimiter = ',', default_value = "lru")]
    pub(crate) cache_policy: Vec<String>,
    /// Per-step decay of the LFU access counter (0, 1] (lfu-decay policy).
    #[arg(long, default_value_t = wgmoe::residency::LfuDecay::DEFAULT_DECAY)]
    pub(crate) decay: f64,
    /// Expert-frequency profile for the profile policy.
    #[arg(long)]
    pub(crate) profile: Option<PathBuf>,
    /// Mapped staging buffers for expert uploads (partial residency; default: top_k, plus
    /// the prefetch width with prefetch).
    #[arg(long)]
    pub(crate) staging_buffers: Option<usize>,
    /// Prefetch settings to sweep below full residency: off,next-layer (default:
    /// next-layer unless --miss-policy cpu).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub(crate) prefetch: Vec<wgmoe::residency::Prefetch>,
    /// Experts guessed and prefetched per layer and step (default: top_k).
    #[arg(long, value_name = "N")]
    pub(crate) prefetch_width: Option<usize>,
    /// Staging fill thread counts to sweep below full residency, e.g. 0,2 (default 2, at
    /// most one per core; 0: the submitting thread fills).
    #[arg(long, value_delimiter = ',', value_name = "N,...")]
    pub(crate) fill_threads: Vec<usize>,
    /// Miss policies to sweep below full residency: upload,cpu,auto (default: auto).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub(crate) miss_policy: Vec<wgmoe::residency::MissPolicy>,
    /// The first N layers' routed experts on the CPU, in every configuration.
    #[arg(long, default_value_t = 0)]
    pub(crate) n_cpu_moe: usize,
    /// Threads of the CPU expert kernel (default: one per core).
    #[arg(long)]
    pub(crate) cpu_threads: Option<usize>,
    /// Write each configuration's routing trace to FILE (JSONL; several configurations:
    /// FILE with .0, .1, ... before the extension); warm-up lines are marked. Reads each
    /// layer's routing back (slower).
    #[arg(long, value_name = "FILE")]
    pub(crate) trace: Option<PathBuf>,
    /// Pipeline depths to sweep, e.g. 1,2 (side by side in one run; default: the one
    /// --pipeline-depth gives).
    #[arg(long, value_delimiter = ',', value_name = "N,...", value_parser = crate::parse_pipeline_depth)]
    pub(crate) pipeline_depths: Vec<usize>,
    /// Replay every step's dispatches timed by GPU timestamps (wall clock where the adapter
    /// has none): GPU time per stage and kernel per token in each record (`profile`,
    /// `gpu_busy_fraction`, `host_s_per_token`). Slows the run; decode at depth 1; every
    /// expert resident only.
    #[arg(long)]
    pub(crate) profile_kernels: bool,
    #[command(flatten)]
    pub(crate) gpu: GpuArgs,
}

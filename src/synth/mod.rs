//! `wgmoe synth`: random-weight models with the exact shapes of the real checkpoints, so
//! real-scale decode can be measured without downloading weights.
//!
//! A synthetic model directory holds what a published checkpoint holds: `config.json` in the
//! real checkpoints' form (top-level `rope_theta`, `model_type`, `architectures`, every field
//! the loader requires, plus `"wgmoe_synthetic": true`), `generation_config.json`, a
//! `tokenizer.json` the `tokenizers` crate loads (a word-level vocabulary of `vocab` tokens
//! with a whitespace pre-tokenizer: the bench prompts' words, then filler words) and a
//! `tokenizer_config.json` with a chat template. Weights are written streaming, tensor by
//! tensor and in pieces, never the whole model in memory, in one of two formats:
//! - `converted` (default): wgmoe's converted INT4 format (`crate::format::convert`): non-routed
//!   tensors f16, routed experts generated directly as packed INT4 slots (random nibbles in
//!   1..=15, i.e. q in -7..=7, and f16 scales near 0.0046 so weights have a std near 0.02),
//!   with the format metadata and per-layer checksums `validate_converted` checks;
//! - `hf`: a bf16 Hugging Face checkpoint with the hub's per-expert tensor names, sharded
//!   with `model.safetensors.index.json` above `max_shard_bytes`, for other runtimes.
//!
//! Values are deterministic in the seed: every tensor (every expert) draws from its own
//! stream, keyed by seed, name and piece, whatever the number of threads. Non-routed weights
//! are approximately normal with std 0.02 (a sum of four uniforms), norm weights are 1.
//!
//! Random weights route almost uniformly across experts: the worst case for an expert
//! cache. Real routers are skewed: `--router-skew` (`skew`) gives the routers a Zipf-like
//! popularity; measure caching on real checkpoints too.

mod config;
mod gguf;
mod random;
mod shape;
mod skew;
mod vocab;
mod writer;

use std::path::Path;

use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use config::generation_config_json;
use vocab::{tokenizer_config_json, tokenizer_json, vocabulary};
use writer::{write_converted_weights, write_hf_weights};

pub use config::config_json;
pub use gguf::GgufScheme;
pub use random::random_q4_slot;
pub use shape::{preset, ShapeOverrides, SynthArch, SynthFormat, SynthShape};
pub use skew::expert_ranks;

/// Std of the random non-routed weights.
pub const WEIGHT_STD: f32 = 0.02;
/// Std of a weight whose nibble is uniform in 1..=15 (q uniform in -7..=7) is
/// scale * sqrt(E[q^2]) = scale * sqrt(56/3): the scale that gives WEIGHT_STD.
pub fn int4_scale_for_std(std: f32) -> f32 {
    std / (56.0f32 / 3.0).sqrt()
}

pub const NOTE_UNIFORM_ROUTING: &str = "random weights route almost uniformly across experts: the worst case for an expert cache (hit rate = capacity / experts); real routers are skewed, so measure caching on real checkpoints";

/// What the routing of a synthetic model written with `--router-skew skew` is like.
pub fn routing_note(skew: f64) -> String {
    if skew == 0.0 {
        NOTE_UNIFORM_ROUTING.to_string()
    } else {
        format!("routers skewed (--router-skew {skew}): each layer's experts have a Zipf-like popularity, and consecutive tokens share experts through it alone (a random model carries no topic from token to token); real routers differ, so measure caching on real checkpoints")
    }
}

/// Largest `--router-skew`: beyond it the lowest ranks' rows scale below f16's normal range.
pub const MAX_ROUTER_SKEW: f64 = 4.0;

/// Everything `write_synthetic` needs.
#[derive(Clone, Debug)]
pub struct SynthOptions {
    pub arch: SynthArch,
    pub shape: SynthShape,
    pub seed: u64,
    pub format: SynthFormat,
    /// `hf` only: largest shard before splitting (a tensor larger than this gets a shard of
    /// its own).
    pub max_shard_bytes: u64,
    /// `gguf` only: the block types.
    pub gguf_scheme: GgufScheme,
    /// `--router-skew`: 0 for uniform routing (see `skew`).
    pub router_skew: f64,
}

pub const DEFAULT_MAX_SHARD_BYTES: u64 = 2_000_000_000;

// ---------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug, serde::Serialize)]
pub struct SynthFile {
    pub file: String,
    pub bytes: u64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct SynthSummary {
    pub dir: String,
    pub arch: SynthArch,
    pub format: SynthFormat,
    pub shape: SynthShape,
    pub seed: u64,
    pub files: Vec<SynthFile>,
    /// Bytes of all weight files.
    pub weight_bytes: u64,
    /// Non-routed weights (f16 in `converted`, bf16 in `hf`).
    pub dense_bytes: u64,
    /// Routed experts (packed INT4 in `converted`, bf16 in `hf`).
    pub expert_bytes: u64,
    /// The earlier wgmoe output this one replaced, if any.
    pub replaced: Option<String>,
    pub params_total: u64,
    pub params_routed: u64,
    /// Parameters used per token: non-routed + top_k / experts of the routed ones.
    pub params_active: u64,
}

pub(super) fn json_bytes(v: &Value) -> Result<Vec<u8>> {
    let text = serde_json::to_string_pretty(v).map_err(|e| Error::Other(e.to_string()))?;
    Ok((text + "\n").into_bytes())
}

/// Write a synthetic model to `out_dir` (which must be new, empty, or an earlier wgmoe
/// output: see `write_synthetic_to`). `on_progress(bytes_done, bytes_total)` follows the
/// weight bytes.
pub fn write_synthetic(
    opts: &SynthOptions,
    out_dir: &Path,
    on_progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthSummary> {
    write_synthetic_to(opts, out_dir, false, on_progress)
}

/// `wgmoe synth [--force]`: the output directory is checked and written as
/// `crate::format::output_dir` describes (a non-empty directory only if it holds an earlier wgmoe
/// output, or with `force`; every file under a temporary name until all are complete; the
/// model files of an earlier output that this one does not replace removed at the end).
pub fn write_synthetic_to(
    opts: &SynthOptions,
    out_dir: &Path,
    force: bool,
    on_progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthSummary> {
    let (arch, shape) = (opts.arch, &opts.shape);
    if !(0.0..=MAX_ROUTER_SKEW).contains(&opts.router_skew) {
        return Err(Error::option(
            "--router-skew",
            format!(
                "{} is outside 0..={MAX_ROUTER_SKEW} (0: uniform routing)",
                opts.router_skew
            ),
        ));
    }
    let mut cfg_value = config_json(arch, shape, opts.seed);
    if let Value::Object(m) = &mut cfg_value {
        m.insert(
            "wgmoe_synthetic_note".into(),
            serde_json::json!(format!(
                "random weights written by `wgmoe synth`: {}",
                routing_note(opts.router_skew)
            )),
        );
        if opts.router_skew != 0.0 {
            m.insert(
                "wgmoe_synthetic_router_skew".into(),
                serde_json::json!(opts.router_skew),
            );
        }
    }
    let cfg_text = json_bytes(&cfg_value)?;
    // The loader's own parse: what it refuses is refused here, naming the field.
    let cfg = ModelConfig::from_json(
        std::str::from_utf8(&cfg_text).map_err(|e| Error::Other(e.to_string()))?,
        &out_dir.join("config.json"),
    )?;
    let mut out = crate::format::output_dir::OutputDir::prepare(out_dir, None, force)?;
    if opts.format == SynthFormat::Gguf {
        return write_gguf_dir(opts, &cfg, out, out_dir, on_progress);
    }
    out.write("config.json", &cfg_text)?;
    out.write(
        "generation_config.json",
        &json_bytes(&generation_config_json(arch, shape))?,
    )?;
    let (tokens, sp) = vocabulary(arch, shape.vocab);
    out.write(
        "tokenizer.json",
        &json_bytes(&tokenizer_json(&tokens, &sp))?,
    )?;
    out.write(
        "tokenizer_config.json",
        &json_bytes(&tokenizer_config_json(arch, shape, &tokens, &sp))?,
    )?;

    let dense = crate::format::manifest::expected_tensors(&cfg);
    let n_sparse = cfg.num_sparse_layers() as u64;
    let dense_params: u64 = dense
        .iter()
        .map(|(_, s)| s.iter().product::<usize>() as u64)
        .sum();
    let per_expert = 3 * (cfg.hidden_size * cfg.moe_intermediate) as u64;
    let params_routed = n_sparse * cfg.num_experts as u64 * per_expert;

    let (files, dense_bytes, expert_bytes) = match opts.format {
        SynthFormat::Converted => {
            write_converted_weights(opts, &cfg, dense, &mut out, on_progress)?
        }
        SynthFormat::Hf => write_hf_weights(opts, &cfg, dense, &mut out, on_progress)?,
        SynthFormat::Gguf => {
            return Err(Error::Other(
                "internal: a GGUF synthetic model is written by write_gguf_dir".into(),
            ))
        }
    };
    crate::interrupt::check()?;
    let replaced = out.replaces().map(|e| e.describe().to_string());
    out.commit()?;
    Ok(SynthSummary {
        dir: out_dir.display().to_string(),
        arch,
        format: opts.format,
        shape: shape.clone(),
        seed: opts.seed,
        weight_bytes: files.iter().map(|f| f.bytes).sum(),
        files,
        dense_bytes,
        expert_bytes,
        replaced,
        params_total: dense_params + params_routed,
        params_routed,
        params_active: dense_params + n_sparse * cfg.top_k as u64 * per_expert,
    })
}

/// `--format gguf`: the directory holds `model.gguf` alone (a directory holding one GGUF
/// file is a model wgmoe runs).
fn write_gguf_dir(
    opts: &SynthOptions,
    cfg: &ModelConfig,
    mut out: crate::format::output_dir::OutputDir,
    out_dir: &Path,
    on_progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthSummary> {
    let path = out.stage("model.gguf");
    let (bytes, dense_bytes, expert_bytes) = gguf::write_gguf_model(opts, cfg, &path, on_progress)?;
    crate::interrupt::check()?;
    let replaced = out.replaces().map(|e| e.describe().to_string());
    out.commit()?;
    let n_sparse = cfg.num_sparse_layers() as u64;
    let per_expert = 3 * (cfg.hidden_size * cfg.moe_intermediate) as u64;
    let params_routed = n_sparse * cfg.num_experts as u64 * per_expert;
    let dense_params: u64 = crate::format::manifest::expected_tensors(cfg)
        .iter()
        .map(|(_, s)| s.iter().product::<usize>() as u64)
        .sum();
    Ok(SynthSummary {
        dir: out_dir.display().to_string(),
        arch: opts.arch,
        format: opts.format,
        shape: opts.shape.clone(),
        seed: opts.seed,
        files: vec![SynthFile {
            file: "model.gguf".to_string(),
            bytes,
        }],
        weight_bytes: bytes,
        dense_bytes,
        expert_bytes,
        replaced,
        params_total: dense_params + params_routed,
        params_routed,
        params_active: dense_params + n_sparse * cfg.top_k as u64 * per_expert,
    })
}

#[cfg(test)]
mod tests {
    use super::random::normalish;
    use super::vocab::split_words;
    use super::*;
    use crate::blocks::quant::Q4SlotLayout;

    /// Each preset's config.json parses to the same model as the published config committed
    /// under models/configs (every parsed field but the file's hash; the token ids too, the
    /// presets keeping the real vocabulary size).
    #[test]
    fn presets_parse_as_the_real_configs() {
        let real = |f: &str| {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("models/configs")
                .join(f);
            let text = std::fs::read_to_string(&path).unwrap();
            ModelConfig::from_json(&text, &path).unwrap()
        };
        for (arch, file) in [
            (SynthArch::Olmoe1b7b, "olmoe-1b-7b-0924.json"),
            (SynthArch::Qwen15MoeA27b, "qwen1.5-moe-a2.7b.json"),
            (SynthArch::Qwen3Moe30bA3b, "qwen3-30b-a3b.json"),
            (SynthArch::Mixtral8x7b, "mixtral-8x7b-v0.1.json"),
        ] {
            let s = preset(arch);
            let text = config_json(arch, &s, 0).to_string();
            let mut cfg = ModelConfig::from_json(&text, Path::new("config.json")).unwrap();
            let want = real(file);
            cfg.source_hash = want.source_hash.clone();
            assert_eq!(cfg, want, "{}", arch.name());
            assert_eq!(s.head_dim(), cfg.head_dim);
        }
        let q3 = preset(SynthArch::Qwen3Moe30bA3b);
        assert_eq!((q3.heads * q3.head_dim(), q3.hidden), (4096, 2048));
    }

    #[test]
    fn small_vocab_moves_special_tokens_to_the_top() {
        let (tokens, sp) = vocabulary(SynthArch::Olmoe1b7b, 100);
        assert_eq!(tokens.len(), 100);
        assert!(sp.eos < 100 && tokens[sp.eos as usize] == "<|endoftext|>");
        let set: std::collections::HashSet<&String> = tokens.iter().collect();
        assert_eq!(set.len(), 100, "tokens must be distinct");
        let (tokens, sp) = vocabulary(SynthArch::Qwen15MoeA27b, 16);
        assert_eq!(tokens[sp.eos as usize], "<|endoftext|>");
        assert_eq!(
            tokens
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len(),
            16
        );
    }

    #[test]
    fn normalish_has_the_requested_std() {
        let mut st = 7u64;
        let n = 200_000;
        let v: Vec<f32> = (0..n).map(|_| normalish(&mut st, 0.02)).collect();
        let mean = v.iter().sum::<f32>() / n as f32;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n as f32;
        assert!(mean.abs() < 5e-4, "{mean}");
        assert!((var.sqrt() - 0.02).abs() < 5e-4, "{}", var.sqrt());
    }

    #[test]
    fn random_slots_have_zero_padding_and_plausible_weights() {
        let layout = Q4SlotLayout::new(64, 100);
        let mut slot = vec![0u8; layout.bytes];
        random_q4_slot(&layout, 3, 0, 1, &mut slot);
        let d = layout.down;
        let q = &slot[layout.down_q..layout.gate_s];
        for n in 0..d.out {
            for k in d.inp..d.vec4_per_row() * 32 {
                assert_eq!(d.nibble(q, n, k), 8, "padding nibble ({n},{k})");
            }
        }
        let g = layout.gate;
        let w = g.dequantize(&slot[..layout.up_q], &slot[layout.gate_s..layout.up_s]);
        let std = (w.iter().map(|x| x * x).sum::<f32>() / w.len() as f32).sqrt();
        assert!((std - WEIGHT_STD).abs() < 0.003, "{std}");
        let mut again = vec![0u8; layout.bytes];
        random_q4_slot(&layout, 3, 0, 1, &mut again);
        assert_eq!(slot, again, "deterministic in the seed");
    }

    #[test]
    fn split_words_matches_whitespace_pretokenizer() {
        assert_eq!(
            split_words("Hi! def f(n):\n  x_1 = 2.5"),
            ["Hi", "!", "def", "f", "(", "n", "):", "x_1", "=", "2", ".", "5"]
        );
    }
}

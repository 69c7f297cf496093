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
//! - `converted` (default): wgmoe's converted INT4 format (`crate::convert`): non-routed
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
//! cache. Real routers are skewed; measure caching on real checkpoints.

use std::collections::BTreeMap;
use std::path::Path;

use half::{bf16, f16};
use serde_json::{json, Value};

use crate::config::ModelConfig;
use crate::convert::{ConvertedModelWriter, PlannedTensor, SafetensorsStream};
use crate::error::{Error, Result};
use crate::quant::{Q4Matrix, Q4SlotLayout};

/// The bench prompts; their words go first in the synthetic vocabulary.
const BENCH_PROMPTS: &str = include_str!("../bench/prompts.json");

/// Std of the random non-routed weights.
pub const WEIGHT_STD: f32 = 0.02;
/// Std of a weight whose nibble is uniform in 1..=15 (q uniform in -7..=7) is
/// scale * sqrt(E[q^2]) = scale * sqrt(56/3): the scale that gives WEIGHT_STD.
pub fn int4_scale_for_std(std: f32) -> f32 {
    std / (56.0f32 / 3.0).sqrt()
}

pub const NOTE_UNIFORM_ROUTING: &str = "random weights route almost uniformly across experts: the worst case for an expert cache (hit rate = capacity / experts); real routers are skewed, so measure caching on real checkpoints";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum SynthArch {
    /// OLMoE-1B-7B (OlmoeForCausalLM): 16 layers, hidden 2048, 64 experts top-8.
    #[value(name = "olmoe-1b-7b")]
    #[serde(rename = "olmoe-1b-7b")]
    Olmoe1b7b,
    /// Qwen1.5-MoE-A2.7B (Qwen2MoeForCausalLM): 24 layers, hidden 2048, 60 experts top-4,
    /// shared expert 5632.
    #[value(name = "qwen1.5-moe-a2.7b")]
    #[serde(rename = "qwen1.5-moe-a2.7b")]
    Qwen15MoeA27b,
}

impl SynthArch {
    pub fn name(self) -> &'static str {
        match self {
            SynthArch::Olmoe1b7b => "olmoe-1b-7b",
            SynthArch::Qwen15MoeA27b => "qwen1.5-moe-a2.7b",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SynthFormat {
    /// wgmoe's converted INT4 format (f16 non-routed tensors, packed INT4 experts).
    Converted,
    /// A bf16 Hugging Face checkpoint with per-expert tensors.
    Hf,
}

/// Every dimension of a synthetic model.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SynthShape {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub experts: usize,
    pub top_k: usize,
    pub expert_intermediate: usize,
    /// Qwen2-MoE only.
    pub shared_expert_intermediate: Option<usize>,
    /// Qwen2-MoE `intermediate_size` (dense MLP layers; none with the presets' layer plan).
    pub dense_intermediate: usize,
    pub vocab: usize,
    pub max_position_embeddings: usize,
}

/// Per-dimension overrides of a preset (the CLI's `--hidden` etc.).
#[derive(Clone, Debug, Default)]
pub struct ShapeOverrides {
    pub hidden: Option<usize>,
    pub layers: Option<usize>,
    pub heads: Option<usize>,
    pub kv_heads: Option<usize>,
    pub experts: Option<usize>,
    pub top_k: Option<usize>,
    pub expert_intermediate: Option<usize>,
    pub shared_expert_intermediate: Option<usize>,
    pub vocab: Option<usize>,
    pub max_position_embeddings: Option<usize>,
}

/// The real checkpoints' config.json values (DESIGN.md section 2).
pub fn preset(arch: SynthArch) -> SynthShape {
    match arch {
        SynthArch::Olmoe1b7b => SynthShape {
            hidden: 2048,
            layers: 16,
            heads: 16,
            kv_heads: 16,
            experts: 64,
            top_k: 8,
            expert_intermediate: 1024,
            shared_expert_intermediate: None,
            dense_intermediate: 1024,
            vocab: 50304,
            max_position_embeddings: 4096,
        },
        SynthArch::Qwen15MoeA27b => SynthShape {
            hidden: 2048,
            layers: 24,
            heads: 16,
            kv_heads: 16,
            experts: 60,
            top_k: 4,
            expert_intermediate: 1408,
            shared_expert_intermediate: Some(5632),
            dense_intermediate: 5632,
            vocab: 151936,
            max_position_embeddings: 8192,
        },
    }
}

impl SynthShape {
    /// The preset with the given dimensions replaced; checked for consistency.
    pub fn resolve(arch: SynthArch, o: &ShapeOverrides) -> Result<Self> {
        let mut s = preset(arch);
        let pos = |flag: &str, v: Option<usize>, cur: usize| -> Result<usize> {
            match v {
                Some(0) => Err(Error::option(flag, "must be greater than 0")),
                Some(x) => Ok(x),
                None => Ok(cur),
            }
        };
        s.hidden = pos("--hidden", o.hidden, s.hidden)?;
        s.layers = pos("--layers", o.layers, s.layers)?;
        s.heads = pos("--heads", o.heads, s.heads)?;
        // Heads given without kv heads: keep the preset's ratio (1:1 in both presets).
        s.kv_heads = pos(
            "--kv-heads",
            o.kv_heads,
            if o.heads.is_some() {
                s.heads
            } else {
                s.kv_heads
            },
        )?;
        s.experts = pos("--experts", o.experts, s.experts)?;
        s.top_k = pos("--top-k", o.top_k, s.top_k)?;
        s.expert_intermediate = pos(
            "--expert-intermediate",
            o.expert_intermediate,
            s.expert_intermediate,
        )?;
        if arch == SynthArch::Olmoe1b7b {
            if o.shared_expert_intermediate.is_some() {
                return Err(Error::option(
                    "--shared-expert-intermediate",
                    "OLMoE has no shared expert",
                ));
            }
            s.dense_intermediate = s.expert_intermediate;
        } else {
            s.shared_expert_intermediate = Some(pos(
                "--shared-expert-intermediate",
                o.shared_expert_intermediate,
                s.shared_expert_intermediate.unwrap_or(5632),
            )?);
        }
        s.vocab = pos("--vocab", o.vocab, s.vocab)?;
        s.max_position_embeddings = pos(
            "--max-position-embeddings",
            o.max_position_embeddings,
            s.max_position_embeddings,
        )?;
        if s.hidden % s.heads != 0 {
            return Err(Error::option(
                "--heads",
                format!("{} does not divide --hidden {}", s.heads, s.hidden),
            ));
        }
        if (s.hidden / s.heads) % 2 != 0 {
            return Err(Error::option(
                "--heads",
                format!(
                    "head dim {} (hidden / heads) is odd; RoPE needs it even",
                    s.hidden / s.heads
                ),
            ));
        }
        if s.heads % s.kv_heads != 0 {
            return Err(Error::option(
                "--kv-heads",
                format!("{} does not divide --heads {}", s.kv_heads, s.heads),
            ));
        }
        if s.top_k > s.experts {
            return Err(Error::option(
                "--top-k",
                format!("{} is larger than --experts {}", s.top_k, s.experts),
            ));
        }
        if s.vocab < 16 {
            return Err(Error::option(
                "--vocab",
                format!(
                    "{} is too small (at least 16: special tokens and a few words)",
                    s.vocab
                ),
            ));
        }
        if s.vocab > u32::MAX as usize / 2 {
            return Err(Error::option(
                "--vocab",
                format!("{} is too large", s.vocab),
            ));
        }
        Ok(s)
    }

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}

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
}

pub const DEFAULT_MAX_SHARD_BYTES: u64 = 2_000_000_000;

/// The special tokens of a synthetic vocabulary, with the ids they have in the real one
/// (moved to the top of a smaller vocabulary).
struct Specials {
    /// (token, id).
    tokens: Vec<(String, u32)>,
    eos: u32,
    bos: Option<u32>,
    pad: u32,
}

fn specials(arch: SynthArch, vocab: usize) -> Specials {
    let wanted: Vec<(&str, u32)> = match arch {
        SynthArch::Olmoe1b7b => vec![
            ("<unk>", 0),
            ("<|padding|>", 1),
            ("<|endoftext|>", 50279),
            ("<|system|>", 50280),
            ("<|user|>", 50281),
            ("<|assistant|>", 50282),
        ],
        SynthArch::Qwen15MoeA27b => vec![
            ("<|endoftext|>", 151643),
            ("<|im_start|>", 151644),
            ("<|im_end|>", 151645),
            ("<unk>", 151646),
        ],
    };
    let v = vocab as u32;
    let mut used: Vec<u32> = wanted
        .iter()
        .map(|&(_, id)| id)
        .filter(|&id| id < v)
        .collect();
    let mut next_free = v;
    let mut tokens = Vec::new();
    for (t, id) in wanted {
        let id = if id < v {
            id
        } else {
            loop {
                next_free -= 1;
                if !used.contains(&next_free) {
                    break;
                }
            }
            used.push(next_free);
            next_free
        };
        tokens.push((t.to_string(), id));
    }
    let id_of = |name: &str| {
        tokens
            .iter()
            .find(|(t, _)| t == name)
            .map(|&(_, id)| id)
            .unwrap_or(0)
    };
    let eos = id_of("<|endoftext|>");
    let (bos, pad) = match arch {
        SynthArch::Olmoe1b7b => (None, id_of("<|padding|>")),
        SynthArch::Qwen15MoeA27b => (Some(eos), eos),
    };
    Specials {
        tokens,
        eos,
        bos,
        pad,
    }
}

/// The words of `text` as a `Whitespace` pre-tokenizer splits it (`\w+|[^\w\s]+`).
fn split_words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut cur_word = false;
    for c in text.chars() {
        if c.is_whitespace() {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            continue;
        }
        let w = c.is_alphanumeric() || c == '_';
        if !cur.is_empty() && w != cur_word {
            out.push(std::mem::take(&mut cur));
        }
        cur_word = w;
        cur.push(c);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// id -> token for a vocabulary of `vocab` tokens: the special tokens at their ids, then
/// the bench prompts' words in order of appearance, then filler words.
fn vocabulary(arch: SynthArch, vocab: usize) -> (Vec<String>, Specials) {
    let sp = specials(arch, vocab);
    let mut by_id: Vec<Option<String>> = vec![None; vocab];
    let mut seen = std::collections::HashSet::new();
    for (t, id) in &sp.tokens {
        by_id[*id as usize] = Some(t.clone());
        seen.insert(t.clone());
    }
    let mut words: Vec<String> = Vec::new();
    if let Ok(v) = serde_json::from_str::<Value>(BENCH_PROMPTS) {
        for p in v["prompts"].as_array().into_iter().flatten() {
            for w in split_words(p["text"].as_str().unwrap_or("")) {
                if seen.insert(w.clone()) {
                    words.push(w);
                }
            }
        }
    }
    let mut words = words.into_iter();
    for (id, slot) in by_id.iter_mut().enumerate() {
        if slot.is_none() {
            *slot = Some(match words.next() {
                Some(w) => w,
                None => {
                    let mut w = format!("w{id}");
                    while !seen.insert(w.clone()) {
                        w.push('_');
                    }
                    w
                }
            });
        }
    }
    (
        by_id.into_iter().map(Option::unwrap_or_default).collect(),
        sp,
    )
}

/// tokenizer.json: a WordLevel model with a Whitespace pre-tokenizer.
fn tokenizer_json(tokens: &[String], sp: &Specials) -> Value {
    let vocab: serde_json::Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    let mut added: Vec<(u32, &str)> = sp.tokens.iter().map(|(t, id)| (*id, t.as_str())).collect();
    added.sort();
    let added: Vec<Value> = added
        .into_iter()
        .map(|(id, t)| json!({"id": id, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    })
}

const OLMOE_CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\n' + message['content'] + eos_token + '\n' }}{% endif %}{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}{% endfor %}";
const CHATML_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn tokenizer_config_json(
    arch: SynthArch,
    shape: &SynthShape,
    tokens: &[String],
    sp: &Specials,
) -> Value {
    let tok = |id: u32| tokens[id as usize].clone();
    let decoder: serde_json::Map<String, Value> = sp
        .tokens
        .iter()
        .map(|(t, id)| (id.to_string(), json!({"content": t, "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": true})))
        .collect();
    json!({
        "add_bos_token": false,
        "add_eos_token": false,
        "added_tokens_decoder": decoder,
        "bos_token": sp.bos.map(tok),
        "eos_token": tok(sp.eos),
        "pad_token": tok(sp.pad),
        "unk_token": "<unk>",
        "chat_template": match arch {
            SynthArch::Olmoe1b7b => OLMOE_CHAT_TEMPLATE,
            SynthArch::Qwen15MoeA27b => CHATML_TEMPLATE,
        },
        "clean_up_tokenization_spaces": false,
        "model_max_length": shape.max_position_embeddings,
        "tokenizer_class": "PreTrainedTokenizerFast",
    })
}

/// config.json in the published checkpoints' form, marked synthetic.
pub fn config_json(arch: SynthArch, s: &SynthShape, seed: u64) -> Value {
    let sp = specials(arch, s.vocab);
    let mut v = match arch {
        SynthArch::Olmoe1b7b => json!({
            "architectures": ["OlmoeForCausalLM"],
            "attention_bias": false,
            "attention_dropout": 0.0,
            "bos_token_id": null,
            "clip_qkv": null,
            "eos_token_id": sp.eos,
            "hidden_act": "silu",
            "hidden_size": s.hidden,
            "initializer_range": 0.02,
            "intermediate_size": s.expert_intermediate,
            "max_position_embeddings": s.max_position_embeddings,
            "model_type": "olmoe",
            "norm_topk_prob": false,
            "num_attention_heads": s.heads,
            "num_experts": s.experts,
            "num_experts_per_tok": s.top_k,
            "num_hidden_layers": s.layers,
            "num_key_value_heads": s.kv_heads,
            "output_router_logits": false,
            "pad_token_id": sp.pad,
            "rms_norm_eps": 1e-05,
            "rope_scaling": null,
            "rope_theta": 10000.0,
            "router_aux_loss_coef": 0.01,
            "tie_word_embeddings": false,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.43.0.dev0",
            "use_cache": true,
            "vocab_size": s.vocab,
        }),
        SynthArch::Qwen15MoeA27b => json!({
            "architectures": ["Qwen2MoeForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": sp.bos,
            "decoder_sparse_step": 1,
            "eos_token_id": sp.eos,
            "hidden_act": "silu",
            "hidden_size": s.hidden,
            "initializer_range": 0.02,
            "intermediate_size": s.dense_intermediate,
            "max_position_embeddings": s.max_position_embeddings,
            "max_window_layers": s.layers.min(21),
            "model_type": "qwen2_moe",
            "moe_intermediate_size": s.expert_intermediate,
            "norm_topk_prob": false,
            "num_attention_heads": s.heads,
            "num_experts": s.experts,
            "num_experts_per_tok": s.top_k,
            "num_hidden_layers": s.layers,
            "num_key_value_heads": s.kv_heads,
            "output_router_logits": false,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.001,
            "shared_expert_intermediate_size": s.shared_expert_intermediate.unwrap_or(5632),
            "sliding_window": 32768,
            "tie_word_embeddings": false,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.40.0.dev0",
            "use_cache": true,
            "use_sliding_window": false,
            "vocab_size": s.vocab,
        }),
    };
    if let Value::Object(m) = &mut v {
        m.insert("wgmoe_synthetic".into(), json!(true));
        m.insert("wgmoe_synthetic_arch".into(), json!(arch.name()));
        m.insert("wgmoe_synthetic_seed".into(), json!(seed));
        m.insert(
            "wgmoe_synthetic_note".into(),
            json!(format!(
                "random weights written by `wgmoe synth`: {NOTE_UNIFORM_ROUTING}"
            )),
        );
    }
    v
}

fn generation_config_json(arch: SynthArch, s: &SynthShape) -> Value {
    let sp = specials(arch, s.vocab);
    let mut v = json!({"eos_token_id": sp.eos, "pad_token_id": sp.pad, "transformers_version": "4.43.0.dev0"});
    if let Some(b) = sp.bos {
        v["bos_token_id"] = json!(b);
    }
    v
}

// ---------------------------------------------------------------------------------------
// Deterministic random values
// ---------------------------------------------------------------------------------------

#[inline]
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of one stream: (model seed, tensor name, piece index).
fn stream_seed(seed: u64, name: &str, piece: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name.as_bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut s = seed ^ h.rotate_left(17) ^ piece.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    splitmix(&mut s)
}

/// Approximately normal (Irwin-Hall with four 16-bit uniforms from one draw), std `std`.
#[inline]
fn normalish(state: &mut u64, std: f32) -> f32 {
    let r = splitmix(state);
    let sum = (r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48);
    // Mean 4 * 65535 / 2; std of the sum 65536 * sqrt(4 / 12).
    (sum as f32 - 131_070.0) * (std / 37_837.9)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Init {
    Ones,
    Normal(f32),
}

fn init_for(name: &str) -> Init {
    if name.ends_with("norm.weight") {
        Init::Ones
    } else {
        Init::Normal(WEIGHT_STD)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Float {
    F16,
    BF16,
}

/// Elements per independently seeded piece of a tensor.
const PIECE: usize = 1 << 18;

fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 16)
}

/// Generate `n` values of tensor `name` piece by piece (several pieces in parallel) and
/// hand each group of pieces' little-endian bytes to `sink` in order.
fn generate_float(
    seed: u64,
    name: &str,
    n: usize,
    fmt: Float,
    sink: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let init = init_for(name);
    let pieces = n.div_ceil(PIECE);
    let t = threads();
    let mut buf = vec![0u8; t.min(pieces.max(1)) * PIECE * 2];
    let mut p = 0;
    while p < pieces {
        let group = t.min(pieces - p);
        let elems = ((p + group) * PIECE).min(n) - p * PIECE;
        let bytes = &mut buf[..elems * 2];
        std::thread::scope(|s| {
            for (k, part) in bytes.chunks_mut(PIECE * 2).enumerate() {
                let piece = (p + k) as u64;
                s.spawn(move || {
                    let mut st = stream_seed(seed, name, piece);
                    for b in part.chunks_exact_mut(2) {
                        let x = match init {
                            Init::Ones => 1.0,
                            Init::Normal(std) => normalish(&mut st, std),
                        };
                        let bits = match fmt {
                            Float::F16 => f16::from_f32(x).to_bits(),
                            Float::BF16 => bf16::from_f32(x).to_bits(),
                        };
                        b.copy_from_slice(&bits.to_le_bytes());
                    }
                });
            }
        });
        crate::interrupt::check()?;
        sink(bytes)?;
        p += group;
    }
    Ok(())
}

/// A packed INT4 matrix with random nibbles in 1..=15 (q in -7..=7, mean 0), padding
/// nibbles 8 (q = 0), and scales within ±10% of `scale`.
fn fill_q4_matrix(m: Q4Matrix, st: &mut u64, q: &mut [u8], s: &mut [u8], scale: f32) {
    for word in q.chunks_mut(4) {
        let r = splitmix(st);
        for (i, b) in word.iter_mut().enumerate() {
            let lo = 1 + ((((r >> (16 * i)) & 0xff) as u32 * 15) >> 8) as u8;
            let hi = 1 + ((((r >> (16 * i + 8)) & 0xff) as u32 * 15) >> 8) as u8;
            *b = lo | (hi << 4);
        }
    }
    let nv = m.vec4_per_row();
    if m.inp % 32 != 0 {
        for n in 0..m.out {
            for k in m.inp..nv * 32 {
                let (c, j, r) = (k / 32, (k % 32) / 8, k % 8);
                let at = (n * nv + c) * 16 + j * 4 + (r % 4);
                q[at] = if r < 4 {
                    (q[at] & 0xF0) | 8
                } else {
                    (q[at] & 0x0F) | 0x80
                };
            }
        }
    }
    s.fill(0);
    let nb = m.blocks();
    for i in 0..m.out * nb {
        let u = (splitmix(st) >> 40) as f32 / (1u64 << 24) as f32;
        let v = f16::from_f32(scale * (0.9 + 0.2 * u));
        s[i * 2..i * 2 + 2].copy_from_slice(&v.to_le_bytes());
    }
}

/// One random packed INT4 expert slot (gate, up, down), from its own stream.
pub fn random_q4_slot(
    layout: &Q4SlotLayout,
    seed: u64,
    layer: usize,
    expert: usize,
    slot: &mut [u8],
) {
    let mut st = stream_seed(
        seed,
        &format!("model.layers.{layer}.mlp.experts.int4"),
        expert as u64,
    );
    let scale = int4_scale_for_std(WEIGHT_STD);
    let (g, d) = (layout.gate, layout.down);
    let (q, rest) = slot.split_at_mut(layout.gate_s);
    let (qa, qrest) = q.split_at_mut(layout.up_q);
    let (qb, qc) = qrest.split_at_mut(layout.down_q - layout.up_q);
    let (sa, srest) = rest.split_at_mut(layout.up_s - layout.gate_s);
    let (sb, sc) = srest.split_at_mut(layout.down_s - layout.up_s);
    fill_q4_matrix(g, &mut st, qa, sa, scale);
    fill_q4_matrix(g, &mut st, qb, sb, scale);
    fill_q4_matrix(d, &mut st, qc, sc, scale);
}

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

fn json_bytes(v: &Value) -> Result<Vec<u8>> {
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
/// `crate::output_dir` describes (a non-empty directory only if it holds an earlier wgmoe
/// output, or with `force`; every file under a temporary name until all are complete; the
/// model files of an earlier output that this one does not replace removed at the end).
pub fn write_synthetic_to(
    opts: &SynthOptions,
    out_dir: &Path,
    force: bool,
    on_progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthSummary> {
    let (arch, shape) = (opts.arch, &opts.shape);
    let cfg_value = config_json(arch, shape, opts.seed);
    let cfg_text = json_bytes(&cfg_value)?;
    // The loader's own parse: what it refuses is refused here, naming the field.
    let cfg = ModelConfig::from_json(
        std::str::from_utf8(&cfg_text).map_err(|e| Error::Other(e.to_string()))?,
        &out_dir.join("config.json"),
    )?;
    let mut out = crate::output_dir::OutputDir::prepare(out_dir, None, force)?;
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

    let dense = crate::manifest::expected_tensors(&cfg);
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

fn write_converted_weights(
    opts: &SynthOptions,
    cfg: &ModelConfig,
    dense: Vec<(String, Vec<usize>)>,
    out: &mut crate::output_dir::OutputDir,
    on_progress: &mut dyn FnMut(u64, u64),
) -> Result<(Vec<SynthFile>, u64, u64)> {
    let mut extra = BTreeMap::new();
    extra.insert("wgmoe.source_files".to_string(), "[]".to_string());
    extra.insert(
        "wgmoe.synthetic".to_string(),
        json!({"arch": opts.arch.name(), "seed": opts.seed, "note": NOTE_UNIFORM_ROUTING})
            .to_string(),
    );
    let mut w =
        ConvertedModelWriter::create(&out.stage("model.safetensors"), cfg, dense.clone(), extra)?;
    let total = w.stream().data_bytes();
    let mut done = 0u64;
    on_progress(0, total);
    for (name, shape) in &dense {
        let n: usize = shape.iter().product();
        generate_float(opts.seed, name, n, Float::F16, &mut |bytes| {
            let v: &[f16] = bytemuck::cast_slice(bytes);
            w.write_dense(name, v)?;
            done += bytes.len() as u64;
            on_progress(done, total);
            Ok(())
        })?;
    }
    let layout = w.layout();
    let group = threads() * 2;
    let mut buf = vec![0u8; group.min(cfg.num_experts) * layout.bytes];
    for l in (0..cfg.num_layers).filter(|&l| cfg.sparse_layers[l]) {
        let mut e0 = 0;
        while e0 < cfg.num_experts {
            let n = group.min(cfg.num_experts - e0);
            let part = &mut buf[..n * layout.bytes];
            let t = threads();
            let per = n.div_ceil(t);
            std::thread::scope(|s| {
                for (ti, chunk) in part.chunks_mut(per * layout.bytes).enumerate() {
                    let layout = &layout;
                    s.spawn(move || {
                        for (k, slot) in chunk.chunks_mut(layout.bytes).enumerate() {
                            random_q4_slot(layout, opts.seed, l, e0 + ti * per + k, slot);
                        }
                    });
                }
            });
            crate::interrupt::check()?;
            w.write_experts(l, part)?;
            done += part.len() as u64;
            on_progress(done, total);
            e0 += n;
        }
    }
    let s = w.finish()?;
    Ok((
        vec![SynthFile {
            file: "model.safetensors".to_string(),
            bytes: s.bytes,
        }],
        s.dense_f16_bytes,
        s.expert_int4_bytes,
    ))
}

fn write_hf_weights(
    opts: &SynthOptions,
    cfg: &ModelConfig,
    dense: Vec<(String, Vec<usize>)>,
    out: &mut crate::output_dir::OutputDir,
    on_progress: &mut dyn FnMut(u64, u64),
) -> Result<(Vec<SynthFile>, u64, u64)> {
    let (h, i) = (cfg.hidden_size, cfg.moe_intermediate);
    // Model order, the per-expert tensors after each layer's router.
    let mut all: Vec<(PlannedTensor, bool)> = Vec::new();
    for (name, shape) in dense {
        let router_layer = name
            .strip_suffix(".mlp.gate.weight")
            .and_then(|p| p.strip_prefix("model.layers."))
            .and_then(|l| l.parse::<usize>().ok());
        all.push((PlannedTensor::new(name, "BF16", shape), false));
        if let Some(l) = router_layer {
            for e in 0..cfg.num_experts {
                let p = format!("model.layers.{l}.mlp.experts.{e}");
                all.push((
                    PlannedTensor::new(format!("{p}.gate_proj.weight"), "BF16", vec![i, h]),
                    true,
                ));
                all.push((
                    PlannedTensor::new(format!("{p}.up_proj.weight"), "BF16", vec![i, h]),
                    true,
                ));
                all.push((
                    PlannedTensor::new(format!("{p}.down_proj.weight"), "BF16", vec![h, i]),
                    true,
                ));
            }
        }
    }
    let total: u64 = all.iter().map(|(p, _)| p.bytes as u64).sum();
    // Greedy sequential sharding.
    let mut shards: Vec<Vec<(PlannedTensor, bool)>> = vec![Vec::new()];
    let mut cur = 0u64;
    for t in all {
        let b = t.0.bytes as u64;
        if cur > 0 && cur + b > opts.max_shard_bytes {
            shards.push(Vec::new());
            cur = 0;
        }
        cur += b;
        // `shards` starts with one shard and only grows.
        if let Some(shard) = shards.last_mut() {
            shard.push(t);
        }
    }
    let n_shards = shards.len();
    let name_of = |k: usize| {
        if n_shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", k + 1, n_shards)
        }
    };
    let mut files = Vec::new();
    let mut weight_map = serde_json::Map::new();
    let (mut done, mut dense_bytes, mut expert_bytes) = (0u64, 0u64, 0u64);
    on_progress(0, total);
    for (k, shard) in shards.into_iter().enumerate() {
        let fname = name_of(k);
        let mut meta = BTreeMap::new();
        meta.insert("format".to_string(), "pt".to_string());
        let plan: Vec<PlannedTensor> = shard.iter().map(|(p, _)| p.clone()).collect();
        let mut st = SafetensorsStream::create(&out.stage(&fname), plan, meta)?;
        for (p, is_expert) in &shard {
            weight_map.insert(p.name.clone(), json!(fname));
            let n: usize = p.shape.iter().product();
            generate_float(opts.seed, &p.name, n, Float::BF16, &mut |bytes| {
                st.write(&p.name, bytes)?;
                done += bytes.len() as u64;
                on_progress(done, total);
                Ok(())
            })?;
            if *is_expert {
                expert_bytes += p.bytes as u64;
            } else {
                dense_bytes += p.bytes as u64;
            }
        }
        let bytes = st.finish()?;
        files.push(SynthFile { file: fname, bytes });
    }
    if n_shards > 1 {
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        out.write("model.safetensors.index.json", &json_bytes(&index)?)?;
    }
    Ok((files, dense_bytes, expert_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_as_the_real_configs() {
        for arch in [SynthArch::Olmoe1b7b, SynthArch::Qwen15MoeA27b] {
            let s = preset(arch);
            let text = config_json(arch, &s, 0).to_string();
            let cfg = ModelConfig::from_json(&text, Path::new("config.json")).unwrap();
            assert_eq!(
                (cfg.hidden_size, cfg.num_layers, cfg.num_experts),
                (s.hidden, s.layers, s.experts)
            );
            assert_eq!(cfg.head_dim, 128);
            assert!(cfg.sparse_layers.iter().all(|&x| x));
            match arch {
                SynthArch::Olmoe1b7b => {
                    assert_eq!(
                        (
                            cfg.top_k,
                            cfg.moe_intermediate,
                            cfg.vocab_size,
                            cfg.max_position_embeddings
                        ),
                        (8, 1024, 50304, 4096)
                    );
                    assert_eq!(
                        (cfg.rope_theta, cfg.rms_norm_eps, cfg.qk_norm, cfg.qkv_bias),
                        (10000.0, 1e-5, true, false)
                    );
                    assert_eq!(cfg.eos_token_ids, vec![50279]);
                }
                SynthArch::Qwen15MoeA27b => {
                    assert_eq!(
                        (
                            cfg.top_k,
                            cfg.moe_intermediate,
                            cfg.vocab_size,
                            cfg.max_position_embeddings
                        ),
                        (4, 1408, 151936, 8192)
                    );
                    assert_eq!(cfg.shared_expert_intermediate, Some(5632));
                    assert_eq!(cfg.dense_intermediate, 5632);
                    assert_eq!(
                        (cfg.rope_theta, cfg.rms_norm_eps, cfg.qk_norm, cfg.qkv_bias),
                        (1e6, 1e-6, false, true)
                    );
                    assert_eq!(cfg.eos_token_ids, vec![151643]);
                }
            }
        }
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

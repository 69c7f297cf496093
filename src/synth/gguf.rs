//! `wgmoe synth --format gguf`: a synthetic model as one GGUF file (`model.gguf` in the
//! output directory), in the block types llama.cpp's `llama-quantize` gives a scheme
//! (`--gguf-type`; Q4_K_M by default, with its Q6_K `output`, and its Q6_K `attn_v` and
//! `ffn_down` on the layers it gives more bits), so a GGUF file of a real model's shape can
//! be run and measured without one. The metadata is what llama.cpp's converter writes for
//! the architecture; the tokenizer a byte-level BPE (`gpt2`, no merges: one token per
//! byte) over the 256 byte symbols, the synthetic vocabulary's words and its special tokens
//! at their ids. The blocks are random (scales and quants), deterministic in the seed,
//! with weights of a std near 0.02; norms are 1, the router f32.

use std::io::Write;

use super::random::{normalish, splitmix, stream_seed};
use super::shape::{SynthArch, SynthShape};
use super::vocab::{vocabulary, Specials};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::gguf::meta::{value_type, MetaArray, MetaValue};
use crate::gguf::writer::{write_gguf, TensorSpec};
use crate::gguf::GgmlType;

/// The block types of a GGUF file, as `llama-quantize`'s schemes of that name choose them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GgufScheme {
    /// Q4_K; Q6_K for `output` and for `attn_v`/`ffn_down` on the first and last eighth of
    /// the layers and every third between (8-expert models: Q8_0 attn_k/attn_v, Q5_K
    /// attn_output).
    #[value(name = "q4_k_m")]
    #[serde(rename = "q4_k_m")]
    Q4KM,
    /// Q5_K, with Q4_K_M's Q6_K choices.
    #[value(name = "q5_k_m")]
    #[serde(rename = "q5_k_m")]
    Q5KM,
    /// Q6_K everywhere.
    #[value(name = "q6_k")]
    #[serde(rename = "q6_k")]
    Q6K,
    /// Q8_0 everywhere.
    #[value(name = "q8_0")]
    #[serde(rename = "q8_0")]
    Q80,
    /// Q4_0, Q6_K output.
    #[value(name = "q4_0")]
    #[serde(rename = "q4_0")]
    Q40,
}

impl GgufScheme {
    pub fn name(self) -> &'static str {
        match self {
            GgufScheme::Q4KM => "Q4_K_M",
            GgufScheme::Q5KM => "Q5_K_M",
            GgufScheme::Q6K => "Q6_K",
            GgufScheme::Q80 => "Q8_0",
            GgufScheme::Q40 => "Q4_0",
        }
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`).
    fn file_type(self) -> u32 {
        match self {
            GgufScheme::Q40 => 2,
            GgufScheme::Q80 => 7,
            GgufScheme::Q4KM => 15,
            GgufScheme::Q5KM => 17,
            GgufScheme::Q6K => 18,
        }
    }
}

/// llama-quant.cpp's `use_more_bits`: the first and last eighth of `n`, every third between.
fn more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The block type of weight `name` (a GGUF name, `blk.L.` prefixed for layer L) whose rows
/// have `cols` columns; K-quant rows not of whole super-blocks fall back as llama-quantize's
/// do (Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0).
fn block_type(
    s: GgufScheme,
    name: &str,
    cols: u64,
    layer: usize,
    n: usize,
    experts: usize,
) -> GgmlType {
    let more = more_bits(layer, n);
    let base = match s {
        GgufScheme::Q4KM => GgmlType::Q4_K,
        GgufScheme::Q5KM => GgmlType::Q5_K,
        GgufScheme::Q6K => GgmlType::Q6_K,
        GgufScheme::Q80 => GgmlType::Q8_0,
        GgufScheme::Q40 => GgmlType::Q4_0,
    };
    let t = match s {
        _ if name == "output.weight" && s != GgufScheme::Q80 => GgmlType::Q6_K,
        GgufScheme::Q4KM | GgufScheme::Q5KM => {
            if experts == 8 && (name.ends_with("attn_k.weight") || name.ends_with("attn_v.weight"))
            {
                GgmlType::Q8_0
            } else if experts == 8 && name.ends_with("attn_output.weight") {
                GgmlType::Q5_K
            } else if (name.ends_with("attn_v.weight") || name.contains("ffn_down")) && more {
                GgmlType::Q6_K
            } else {
                base
            }
        }
        _ => base,
    };
    if cols.is_multiple_of(256) || !matches!(t, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K) {
        return t;
    }
    match t {
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        _ => GgmlType::Q8_0,
    }
}

/// GPT-2's byte-to-symbol map (`bytes_to_unicode`): printable bytes as themselves, the
/// others from U+0100 up, in byte order.
fn byte_symbols() -> Vec<String> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256u32;
    (0..256u32)
        .map(|b| {
            let c = if printable(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            char::from_u32(c).map(String::from).unwrap_or_default()
        })
        .collect()
}

/// The vocabulary of `vocab` tokens: the specials at their ids, the 256 byte symbols at
/// the lowest free ids, then the synthetic words that are not byte symbols, then fillers.
fn gguf_vocabulary(arch: SynthArch, vocab: usize) -> Result<(Vec<String>, Specials)> {
    let (words, sp) = vocabulary(arch, vocab);
    if vocab < 256 + sp.tokens.len() {
        return Err(Error::option(
            "--vocab",
            format!(
                "{vocab} tokens: a GGUF file's byte-level vocabulary needs the 256 byte symbols and the {} special tokens",
                sp.tokens.len()
            ),
        ));
    }
    let special: std::collections::HashSet<u32> = sp.tokens.iter().map(|t| t.1).collect();
    let symbols = byte_symbols();
    let mut seen: std::collections::HashSet<String> =
        sp.tokens.iter().map(|t| t.0.clone()).collect();
    seen.extend(symbols.iter().cloned());
    let is_symbol: std::collections::HashSet<String> = symbols.iter().cloned().collect();
    let mut rest = words
        .into_iter()
        .enumerate()
        .filter(|(id, w)| !special.contains(&(*id as u32)) && !is_symbol.contains(w))
        .map(|(_, w)| w);
    let mut symbols = symbols.into_iter();
    let mut tokens = Vec::with_capacity(vocab);
    for id in 0..vocab {
        if let Some((t, _)) = sp.tokens.iter().find(|t| t.1 as usize == id) {
            tokens.push(t.clone());
        } else if let Some(s) = symbols.next() {
            tokens.push(s);
        } else {
            let mut w = rest.next().unwrap_or_else(|| format!("w{id}"));
            while !seen.insert(w.clone()) {
                w.push('_');
            }
            tokens.push(w);
        }
    }
    Ok((tokens, sp))
}

fn strings(v: Vec<String>) -> MetaValue {
    MetaValue::Array(MetaArray {
        elem_type: value_type::STRING,
        items: v.into_iter().map(MetaValue::Str).collect(),
    })
}

/// The GGUF architecture name of a synthetic model (Mixtral is `llama` with experts).
fn gguf_arch(arch: SynthArch) -> &'static str {
    match arch {
        SynthArch::Olmoe1b7b => "olmoe",
        SynthArch::Qwen15MoeA27b => "qwen2moe",
        SynthArch::Qwen3Moe30bA3b => "qwen3moe",
        SynthArch::Mixtral8x7b => "llama",
    }
}

fn metadata(
    arch: SynthArch,
    shape: &SynthShape,
    cfg: &ModelConfig,
    scheme: GgufScheme,
    seed: u64,
) -> Result<Vec<(String, MetaValue)>> {
    let a = gguf_arch(arch);
    let k = |s: &str| format!("{a}.{s}");
    let u = |v: usize| MetaValue::U32(v as u32);
    let mut kv = vec![
        ("general.architecture".to_string(), MetaValue::Str(a.into())),
        (
            "general.name".to_string(),
            MetaValue::Str(format!("wgmoe synth {} seed {seed}", arch.name())),
        ),
        (
            "general.file_type".to_string(),
            MetaValue::U32(scheme.file_type()),
        ),
        // How `synth` recognises its own output when asked to write over it.
        (
            crate::format::output_dir::GGUF_SYNTHETIC_KEY.to_string(),
            MetaValue::U64(seed),
        ),
        (k("block_count"), u(cfg.num_layers)),
        (k("context_length"), u(cfg.max_position_embeddings)),
        (k("embedding_length"), u(cfg.hidden_size)),
        (k("attention.head_count"), u(cfg.num_heads)),
        (k("attention.head_count_kv"), u(cfg.num_kv_heads)),
        (k("attention.key_length"), u(cfg.head_dim)),
        (k("attention.value_length"), u(cfg.head_dim)),
        (
            k("attention.layer_norm_rms_epsilon"),
            MetaValue::F32(cfg.rms_norm_eps as f32),
        ),
        (k("rope.freq_base"), MetaValue::F32(cfg.rope_theta as f32)),
        (k("expert_count"), u(cfg.num_experts)),
        (k("expert_used_count"), u(cfg.top_k)),
    ];
    match arch {
        SynthArch::Olmoe1b7b | SynthArch::Mixtral8x7b => {
            kv.push((k("feed_forward_length"), u(cfg.moe_intermediate)));
        }
        _ => {
            kv.push((k("expert_feed_forward_length"), u(cfg.moe_intermediate)));
            kv.push((k("feed_forward_length"), u(cfg.dense_intermediate)));
        }
    }
    if let Some(si) = cfg.shared_expert_intermediate {
        kv.push((k("expert_shared_feed_forward_length"), u(si)));
    }
    let (tokens, sp) = gguf_vocabulary(arch, shape.vocab)?;
    let special: std::collections::HashSet<u32> = sp.tokens.iter().map(|t| t.1).collect();
    let types = (0..tokens.len())
        .map(|i| MetaValue::I32(if special.contains(&(i as u32)) { 3 } else { 1 }))
        .collect();
    kv.extend([
        (
            "tokenizer.ggml.model".to_string(),
            MetaValue::Str("gpt2".into()),
        ),
        (
            "tokenizer.ggml.pre".to_string(),
            MetaValue::Str("gpt-2".into()),
        ),
        ("tokenizer.ggml.tokens".to_string(), strings(tokens)),
        (
            "tokenizer.ggml.token_type".to_string(),
            MetaValue::Array(MetaArray {
                elem_type: value_type::I32,
                items: types,
            }),
        ),
        ("tokenizer.ggml.merges".to_string(), strings(Vec::new())),
        (
            "tokenizer.ggml.eos_token_id".to_string(),
            MetaValue::U32(sp.eos),
        ),
        (
            "tokenizer.ggml.add_bos_token".to_string(),
            MetaValue::Bool(false),
        ),
    ]);
    if let Some(b) = sp.bos {
        kv.push(("tokenizer.ggml.bos_token_id".to_string(), MetaValue::U32(b)));
    }
    Ok(kv)
}

/// The tensors, in the converter's order, with their block types.
fn tensors(arch: SynthArch, cfg: &ModelConfig, scheme: GgufScheme) -> Vec<TensorSpec> {
    let (h, v, l_n) = (
        cfg.hidden_size as u64,
        cfg.vocab_size as u64,
        cfg.num_layers,
    );
    let (q, kv) = (
        (cfg.num_heads * cfg.head_dim) as u64,
        (cfg.num_kv_heads * cfg.head_dim) as u64,
    );
    let (e, ff) = (cfg.num_experts as u64, cfg.moe_intermediate as u64);
    let f32t = |name: String, ne: Vec<u64>| TensorSpec {
        name,
        ne,
        ty: GgmlType::F32,
    };
    let w = |name: String, ne: Vec<u64>, layer: usize| {
        let ty = block_type(scheme, &name, ne[0], layer, l_n, cfg.num_experts);
        TensorSpec { name, ne, ty }
    };
    let mut t = vec![
        w("token_embd.weight".into(), vec![h, v], 0),
        f32t("output_norm.weight".into(), vec![h]),
        w("output.weight".into(), vec![h, v], 0),
    ];
    for l in 0..l_n {
        let n = |s: &str| format!("blk.{l}.{s}");
        t.push(f32t(n("attn_norm.weight"), vec![h]));
        t.push(w(n("attn_q.weight"), vec![h, q], l));
        t.push(w(n("attn_k.weight"), vec![h, kv], l));
        t.push(w(n("attn_v.weight"), vec![h, kv], l));
        t.push(w(n("attn_output.weight"), vec![q, h], l));
        match arch {
            SynthArch::Olmoe1b7b => {
                t.push(f32t(n("attn_q_norm.weight"), vec![q]));
                t.push(f32t(n("attn_k_norm.weight"), vec![kv]));
            }
            SynthArch::Qwen3Moe30bA3b => {
                t.push(f32t(n("attn_q_norm.weight"), vec![cfg.head_dim as u64]));
                t.push(f32t(n("attn_k_norm.weight"), vec![cfg.head_dim as u64]));
            }
            SynthArch::Qwen15MoeA27b => {
                t.push(f32t(n("attn_q.bias"), vec![q]));
                t.push(f32t(n("attn_k.bias"), vec![kv]));
                t.push(f32t(n("attn_v.bias"), vec![kv]));
            }
            SynthArch::Mixtral8x7b => {}
        }
        t.push(f32t(n("ffn_norm.weight"), vec![h]));
        t.push(f32t(n("ffn_gate_inp.weight"), vec![h, e]));
        t.push(w(n("ffn_gate_exps.weight"), vec![h, ff, e], l));
        t.push(w(n("ffn_up_exps.weight"), vec![h, ff, e], l));
        t.push(w(n("ffn_down_exps.weight"), vec![ff, h, e], l));
        if let Some(si) = cfg.shared_expert_intermediate {
            let si = si as u64;
            t.push(f32t(n("ffn_gate_inp_shexp.weight"), vec![h]));
            t.push(w(n("ffn_gate_shexp.weight"), vec![h, si], l));
            t.push(w(n("ffn_up_shexp.weight"), vec![h, si], l));
            t.push(w(n("ffn_down_shexp.weight"), vec![si, h], l));
        }
    }
    t
}

/// An f16 of `v`, little-endian.
fn h(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// One random block of `ty` into `o`, from stream `st`: quants uniform over their range,
/// scales chosen for a weight std near 0.02 (and, with a min, a mean near 0).
fn block(ty: GgmlType, st: &mut u64, o: &mut Vec<u8>) {
    // `n` random bytes.
    let bytes = |o: &mut Vec<u8>, n: usize, st: &mut u64| {
        for _ in 0..n.div_ceil(8) {
            o.extend_from_slice(&splitmix(st).to_le_bytes());
        }
        o.truncate(o.len() - (n.div_ceil(8) * 8 - n));
    };
    match ty {
        GgmlType::Q8_0 => {
            o.extend(h(0.02 / 73.6));
            let at = o.len();
            bytes(o, 32, st);
            // int8 in -127..=127.
            for b in &mut o[at..] {
                if *b == 0x80 {
                    *b = 0x81;
                }
            }
        }
        GgmlType::Q4_0 => {
            o.extend(h(0.02 / 4.61));
            bytes(o, 16, st);
        }
        GgmlType::Q5_0 => {
            o.extend(h(0.02 / 9.23));
            bytes(o, 20, st);
        }
        GgmlType::Q5_1 => {
            let d = 0.02 / 9.23;
            o.extend(h(d));
            o.extend(h(-15.5 * d));
            bytes(o, 20, st);
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            // Sub-block scales and mins in 32..=63; dmin d * mean(q) centres the values.
            let (std_q, mean_q) = if ty == GgmlType::Q4_K {
                (4.61, 7.5)
            } else {
                (9.23, 15.5)
            };
            let d = 0.02 / (std_q * 47.5);
            o.extend(h(d));
            o.extend(h(d * mean_q));
            let r = splitmix(st);
            let mut scm = [(0u8, 0u8); 8];
            for (j, s) in scm.iter_mut().enumerate() {
                *s = (
                    32 + ((r >> (6 * j)) & 31) as u8,
                    32 + ((r >> (6 * j + 3)) & 31) as u8,
                );
            }
            o.extend(crate::blocks::kquant::pack_scale_min(&scm));
            bytes(o, if ty == GgmlType::Q4_K { 128 } else { 160 }, st);
        }
        GgmlType::Q6_K => {
            bytes(o, 192, st);
            // Scales of either sign, magnitude 16..=63.
            let r = splitmix(st);
            for j in 0..16 {
                let m = 16 + ((r >> (3 * j)) & 47) as i8;
                let s = if (r >> (48 + j)) & 1 == 1 { -m } else { m };
                o.push(s as u8);
            }
            o.extend(h(0.02 / (18.5 * 40.0)));
        }
        _ => {}
    }
}

/// Blocks generated per seeded piece of a tensor.
const PIECE_BLOCKS: u64 = 4096;

/// `skew`: `--router-skew` (the router is f32, scaled by row; see `super::skew`).
fn write_tensor(seed: u64, skew: f64, t: &TensorSpec, out: &mut dyn Write) -> Result<()> {
    let io = |e: std::io::Error| Error::Other(format!("writing GGUF tensor {}: {e}", t.name));
    let n: u64 = t.ne.iter().product();
    if t.ty == GgmlType::F32 {
        let ones = t.name.ends_with("norm.weight");
        // GGUF's ne[0] is the row length: a router's rows are its experts.
        let row_len = t.ne.first().copied().unwrap_or(1).max(1);
        let rows = t.ne.get(1).copied().unwrap_or(1) as usize;
        let scales = super::skew::row_scales(seed, &t.name, rows, skew);
        let rs = scales.as_deref().map(|scales| super::random::RowScales {
            scales,
            row_len: row_len as usize,
        });
        let mut buf = Vec::with_capacity(1 << 20);
        let mut st = stream_seed(seed, &t.name, 0);
        for i in 0..n {
            let mut v = if ones { 1.0 } else { normalish(&mut st, 0.02) };
            if let Some(r) = rs {
                v *= r.at(i as usize);
            }
            buf.extend(v.to_le_bytes());
            if buf.len() >= 1 << 20 || i + 1 == n {
                out.write_all(&buf).map_err(io)?;
                buf.clear();
            }
        }
        return Ok(());
    }
    let blocks = n / t.ty.block_elems() as u64;
    let mut buf = Vec::with_capacity(PIECE_BLOCKS as usize * t.ty.block_bytes());
    let mut piece = 0;
    let mut b = 0;
    while b < blocks {
        let mut st = stream_seed(seed, &t.name, piece);
        buf.clear();
        for _ in 0..PIECE_BLOCKS.min(blocks - b) {
            block(t.ty, &mut st, &mut buf);
        }
        out.write_all(&buf).map_err(io)?;
        b += PIECE_BLOCKS.min(blocks - b);
        piece += 1;
        crate::interrupt::check()?;
    }
    Ok(())
}

/// Write the model's GGUF file to `path`; returns (file bytes, non-routed bytes, routed
/// expert bytes). `on_progress(done, total)` follows the tensor bytes.
pub(super) fn write_gguf_model(
    opts: &super::SynthOptions,
    cfg: &ModelConfig,
    path: &std::path::Path,
    on_progress: &mut dyn FnMut(u64, u64),
) -> Result<(u64, u64, u64)> {
    if cfg.sparse_layers.iter().any(|&s| !s) {
        return Err(Error::option(
            "--format",
            "gguf: llama.cpp's graphs for these architectures have an MoE block in every layer; this shape has dense layers",
        ));
    }
    let (arch, scheme, seed) = (opts.arch, opts.gguf_scheme, opts.seed);
    let kv = metadata(arch, &opts.shape, cfg, scheme, seed)?;
    let specs = tensors(arch, cfg, scheme);
    let size = |t: &TensorSpec| t.bytes().unwrap_or(0);
    let total: u64 = specs.iter().map(size).sum();
    let experts: u64 = specs
        .iter()
        .filter(|t| t.name.contains("_exps."))
        .map(size)
        .sum();
    let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 22, file);
    let mut done = 0;
    on_progress(0, total);
    let bytes = write_gguf(&mut out, &kv, &specs, &mut |i, w| {
        write_tensor(seed, opts.router_skew, &specs[i], w)?;
        done += size(&specs[i]);
        on_progress(done, total);
        Ok(())
    })?;
    let file = out
        .into_inner()
        .map_err(|e| Error::io(path, e.into_error()))?;
    file.sync_all().map_err(|e| Error::io(path, e))?;
    Ok((bytes, total - experts, experts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_k_m_gives_more_bits_where_llama_quantize_does() {
        // 48 layers: 0..6, 42..48 and every third between (8, 11, ...).
        let more: Vec<usize> = (0..48).filter(|&i| more_bits(i, 48)).collect();
        assert_eq!(more.len(), 24, "{more:?}");
        assert!(more.contains(&0) && more.contains(&8) && !more.contains(&9) && more.contains(&47));
        let t = |name: &str, cols, layer, experts| {
            block_type(GgufScheme::Q4KM, name, cols, layer, 48, experts)
        };
        assert_eq!(t("output.weight", 2048, 0, 128), GgmlType::Q6_K);
        assert_eq!(t("blk.8.attn_v.weight", 2048, 8, 128), GgmlType::Q6_K);
        assert_eq!(t("blk.9.attn_v.weight", 2048, 9, 128), GgmlType::Q4_K);
        assert_eq!(t("blk.9.ffn_down_exps.weight", 768, 9, 128), GgmlType::Q4_K);
        assert_eq!(t("blk.0.ffn_down_exps.weight", 768, 0, 128), GgmlType::Q6_K);
        assert_eq!(t("blk.9.attn_k.weight", 4096, 9, 8), GgmlType::Q8_0);
        assert_eq!(t("blk.9.attn_output.weight", 4096, 9, 8), GgmlType::Q5_K);
        // Rows not of whole super-blocks fall back.
        assert_eq!(t("blk.9.ffn_down_exps.weight", 1408, 9, 60), GgmlType::Q5_0);
        assert_eq!(t("blk.0.ffn_down_exps.weight", 1408, 0, 60), GgmlType::Q8_0);
    }

    #[test]
    fn the_byte_symbols_are_gpt2s() {
        let s = byte_symbols();
        assert_eq!(s.len(), 256);
        assert_eq!(s[b'A' as usize], "A");
        assert_eq!(s[b' ' as usize], "\u{120}");
        assert_eq!(s[0], "\u{100}");
        assert_eq!(
            s.iter().collect::<std::collections::HashSet<_>>().len(),
            256
        );
    }
}

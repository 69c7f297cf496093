//! The converted INT4 model format (`wgmoe quantize`) and quantisation on load.
//!
//! A converted model directory holds the original config, generation config and
//! tokenizer files, and one `model.safetensors` with
//! - every non-routed tensor as F16 under its Hugging Face name;
//! - per MoE layer, `model.layers.{l}.mlp.experts.int4` U8 [num_experts, slot_bytes]: the
//!   routed experts already packed as INT4 slots (layout in `crate::quant`), so loading
//!   is a memory map and a copy, no conversion work;
//! - metadata naming the format, block size, rounding rule and slot layout, the identity
//!   of the source (hash of its config.json, size and hash of each weight file) and a
//!   checksum per layer of packed experts. A file whose identity or layout does not match
//!   its config, or whose experts fail their checksum, is refused.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use crate::checkpoint::{Checkpoint, ExpertProj};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::quant::Q4SlotLayout;

pub const FORMAT: &str = "wgmoe-int4";
pub const FORMAT_VERSION: &str = "1";
pub const ROUNDING: &str = "half-to-even";
const FILES_TO_COPY: [&str; 6] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
];

pub fn experts_tensor(layer: usize) -> String {
    format!("model.layers.{layer}.mlp.experts.int4")
}

/// A 64-bit checksum fast enough to run over gigabytes at load (one multiply per 8 bytes).
pub fn fast_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        h = (h ^ w).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(29);
    }
    for &b in chunks.remainder() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^ (h >> 32)
}

pub fn is_converted(ckpt: &Checkpoint) -> bool {
    ckpt.metadata().get("wgmoe.format").map(String::as_str) == Some(FORMAT)
}

fn meta_json(cfg: &ModelConfig, layout: &Q4SlotLayout) -> BTreeMap<&'static str, String> {
    let mut m = BTreeMap::new();
    m.insert("wgmoe.format", FORMAT.to_string());
    m.insert("wgmoe.format_version", FORMAT_VERSION.to_string());
    m.insert("wgmoe.block_size", crate::quant::BLOCK.to_string());
    m.insert("wgmoe.rounding", ROUNDING.to_string());
    m.insert("wgmoe.expert_layout", layout.describe());
    m.insert("wgmoe.num_experts", cfg.num_experts.to_string());
    m.insert("wgmoe.source_config_hash", cfg.source_hash.clone());
    m
}

/// Check a converted checkpoint against the config next to it. Verifies every layer's
/// checksum (reads all packed experts once).
pub fn validate_converted(ckpt: &Checkpoint, cfg: &ModelConfig) -> Result<()> {
    let file = ckpt.dir().join("model.safetensors");
    let md = ckpt.metadata();
    let layout = Q4SlotLayout::new(cfg.hidden_size, cfg.moe_intermediate);
    for (key, want) in meta_json(cfg, &layout) {
        let got = md.get(key).map(String::as_str).unwrap_or("<missing>");
        if got != want {
            let hint = if key == "wgmoe.source_config_hash" {
                " (config.json differs from the one the file was converted from)"
            } else {
                ""
            };
            return Err(Error::bad_file(&file, format!("metadata `{key}` is `{got}`, expected `{want}`{hint}; re-run `wgmoe quantize`")));
        }
    }
    let sums: Vec<String> = md
        .get("wgmoe.expert_checksums")
        .and_then(|s| serde_json::from_str(s).ok())
        .ok_or_else(|| Error::bad_file(&file, "metadata `wgmoe.expert_checksums` is missing or malformed"))?;
    for l in 0..cfg.num_layers {
        if !cfg.sparse_layers[l] {
            continue;
        }
        let name = experts_tensor(l);
        let bytes = ckpt.raw_u8(&name, &[cfg.num_experts, layout.bytes])?;
        let want = sums.get(l).map(String::as_str).unwrap_or("");
        let got = format!("{:016x}", fast_hash(bytes));
        if got != want {
            return Err(Error::BadTensor {
                path: file.clone(),
                name,
                msg: format!("checksum {got} does not match the recorded {want}: the file is corrupt"),
            });
        }
    }
    Ok(())
}

/// Quantise one layer's routed experts into packed slots [E][slot_bytes], on all cores.
pub fn quantize_layer(ckpt: &Checkpoint, cfg: &ModelConfig, layer: usize) -> Result<Vec<u8>> {
    let (e, h, i) = (cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate);
    let layout = Q4SlotLayout::new(h, i);
    let mut out = vec![0u8; e * layout.bytes];
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(e.max(1));
    let per = e.div_ceil(threads);
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = out
            .chunks_mut(per * layout.bytes)
            .enumerate()
            .map(|(ti, part)| {
                s.spawn(move || -> Result<()> {
                    for (k, slot) in part.chunks_mut(layout.bytes).enumerate() {
                        let ex = ti * per + k;
                        let gate = ckpt.read_expert_f32(layer, ex, ExpertProj::Gate, e, h, i)?;
                        let up = ckpt.read_expert_f32(layer, ex, ExpertProj::Up, e, h, i)?;
                        let down = ckpt.read_expert_f32(layer, ex, ExpertProj::Down, e, h, i)?;
                        layout.pack_expert(&gate, &up, &down, slot);
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Error::Other("a quantiser thread panicked".into()))))
            .collect()
    });
    for r in results {
        r?;
    }
    Ok(out)
}

/// The packed experts of one layer: borrowed from a converted file, or quantised now.
pub fn packed_layer<'a>(ckpt: &'a Checkpoint, cfg: &ModelConfig, layer: usize) -> Result<Cow<'a, [u8]>> {
    if is_converted(ckpt) {
        let layout = Q4SlotLayout::new(cfg.hidden_size, cfg.moe_intermediate);
        Ok(Cow::Borrowed(ckpt.raw_u8(&experts_tensor(layer), &[cfg.num_experts, layout.bytes])?))
    } else {
        Ok(Cow::Owned(quantize_layer(ckpt, cfg, layer)?))
    }
}

/// Whether a checkpoint tensor is a routed expert weight (replaced by the packed slots).
fn is_routed_expert(name: &str) -> bool {
    name.contains(".mlp.experts.")
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ConvertSummary {
    pub out_file: String,
    pub bytes: u64,
    pub dense_f16_bytes: u64,
    pub expert_int4_bytes: u64,
}

struct Planned {
    name: String,
    dtype: &'static str,
    shape: Vec<usize>,
    bytes: usize,
}

/// `wgmoe quantize`: write a converted model to `out_dir`, streaming tensor by tensor.
pub fn write_converted(src: &Path, out_dir: &Path, on_progress: &mut dyn FnMut(usize, usize)) -> Result<ConvertSummary> {
    let cfg = ModelConfig::from_dir(src)?;
    let ckpt = Checkpoint::open(src)?;
    if is_converted(&ckpt) {
        return Err(Error::bad_file(ckpt.dir().join("model.safetensors"), "is already a converted INT4 model"));
    }
    // The same tensor and shape checks as loading, before anything is written.
    crate::model::weights::check_tensors(&cfg, &ckpt)?;
    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
    let layout = Q4SlotLayout::new(cfg.hidden_size, cfg.moe_intermediate);

    let mut plan = Vec::new();
    for name in ckpt.names().filter(|n| !is_routed_expert(n)) {
        let info = ckpt.info(name)?;
        let n: usize = info.shape.iter().product();
        plan.push(Planned { name: name.to_string(), dtype: "F16", shape: info.shape.clone(), bytes: n * 2 });
    }
    for l in (0..cfg.num_layers).filter(|&l| cfg.sparse_layers[l]) {
        plan.push(Planned {
            name: experts_tensor(l),
            dtype: "U8",
            shape: vec![cfg.num_experts, layout.bytes],
            bytes: cfg.num_experts * layout.bytes,
        });
    }

    let mut sources = Vec::new();
    for f in ckpt.files() {
        let data = std::fs::read(f).map_err(|e| Error::io(f, e))?;
        sources.push(serde_json::json!({
            "file": f.file_name().map(|s| s.to_string_lossy().to_string()).unwrap_or_default(),
            "bytes": data.len(),
            "hash": format!("{:016x}", fast_hash(&data)),
        }));
    }
    let mut meta: BTreeMap<String, String> = meta_json(&cfg, &layout).into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    meta.insert("wgmoe.source_files".into(), serde_json::Value::Array(sources).to_string());
    // Fixed-width placeholders, so the header keeps its length when the real sums go in.
    let placeholder: Vec<String> = (0..cfg.num_layers).map(|_| "0".repeat(16)).collect();
    meta.insert("wgmoe.expert_checksums".into(), serde_json::to_string(&placeholder).unwrap_or_default());

    let header = |meta: &BTreeMap<String, String>| -> Vec<u8> {
        let mut obj = serde_json::Map::new();
        obj.insert("__metadata__".into(), serde_json::to_value(meta).unwrap_or_default());
        let mut off = 0usize;
        for p in &plan {
            obj.insert(p.name.clone(), serde_json::json!({"dtype": p.dtype, "shape": p.shape, "data_offsets": [off, off + p.bytes]}));
            off += p.bytes;
        }
        let mut h = serde_json::Value::Object(obj).to_string().into_bytes();
        while h.len() % 8 != 0 {
            h.push(b' ');
        }
        h
    };
    let out_file = out_dir.join("model.safetensors");
    let tmp_file = out_dir.join("model.safetensors.partial");
    let mut f = std::io::BufWriter::new(File::create(&tmp_file).map_err(|e| Error::io(&tmp_file, e))?);
    let h0 = header(&meta);
    let io = |e| Error::io(&tmp_file, e);
    f.write_all(&(h0.len() as u64).to_le_bytes()).map_err(io)?;
    f.write_all(&h0).map_err(io)?;
    let mut sums = placeholder.clone();
    let (mut dense, mut experts) = (0u64, 0u64);
    let total = plan.len();
    for (k, p) in plan.iter().enumerate() {
        on_progress(k, total);
        if p.dtype == "F16" {
            let v = ckpt.read_f16(&p.name, &p.shape)?;
            f.write_all(bytemuck::cast_slice(&v)).map_err(io)?;
            dense += p.bytes as u64;
        } else {
            let l: usize = p.name.split('.').nth(2).and_then(|s| s.parse().ok()).unwrap_or(0);
            let packed = quantize_layer(&ckpt, &cfg, l)?;
            sums[l] = format!("{:016x}", fast_hash(&packed));
            f.write_all(&packed).map_err(io)?;
            experts += p.bytes as u64;
        }
    }
    on_progress(total, total);
    meta.insert("wgmoe.expert_checksums".into(), serde_json::to_string(&sums).unwrap_or_default());
    let h1 = header(&meta);
    if h1.len() != h0.len() {
        return Err(Error::Other("internal: converted header changed length".into()));
    }
    let mut file = f.into_inner().map_err(|e| Error::io(&tmp_file, e.into_error()))?;
    file.seek(SeekFrom::Start(8)).map_err(io)?;
    file.write_all(&h1).map_err(io)?;
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&tmp_file, &out_file).map_err(|e| Error::io(&out_file, e))?;
    for name in FILES_TO_COPY {
        let s = src.join(name);
        if s.is_file() {
            std::fs::copy(&s, out_dir.join(name)).map_err(|e| Error::io(&s, e))?;
        }
    }
    let bytes = std::fs::metadata(&out_file).map_err(|e| Error::io(&out_file, e))?.len();
    Ok(ConvertSummary {
        out_file: out_file.display().to_string(),
        bytes,
        dense_f16_bytes: dense,
        expert_int4_bytes: experts,
    })
}

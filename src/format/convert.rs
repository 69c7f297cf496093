//! The converted INT4 model format (`wgmoe quantize`) and quantisation on load.
//!
//! A converted model directory holds the original config, generation config and
//! tokenizer files, and one `model.safetensors` with
//! - every non-routed tensor as F16 under its Hugging Face name, except with
//!   `--dense-precision q8_0` the dense weights (`identity::is_dense_weight`: attention
//!   q/k/v/o, shared experts, dense MLP layers, lm_head; with tied embeddings a Q8_0 copy of
//!   them as `lm_head.weight`), stored as ggml's Q8_0 blocks in a U8 tensor
//!   [rows, ceil(cols/32)*34] under the same name (`identity::Q8_0_LAYOUT`);
//! - per MoE layer, `model.layers.{l}.mlp.experts.int4` U8 [num_experts, slot_bytes]: the
//!   routed experts already packed as INT4 slots (layout in `crate::blocks::quant`), so loading
//!   is a memory map and a copy, no conversion work;
//! - metadata naming the format, block size, rounding rule and slot layout, the dense
//!   weights' storage (`wgmoe.dense_precision`, `f16` when absent), the identity
//!   of the source (hash of its config.json, size and hash of each weight file) and a
//!   checksum per layer of packed experts. A file whose identity or layout does not match
//!   its config, or whose experts fail their checksum, is refused.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use crate::blocks::quant::{Q4Kind, Q4Matrix, Q4SlotLayout, Q4Source};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::format::checkpoint::{Checkpoint, ExpertProj};
pub use crate::format::identity::{
    dense_storage, experts_tensor, fast_hash, ggml_q8_row_bytes, is_converted, is_dense_weight,
    DenseStorage, FastHasher, DENSE_LAYOUT_KEY, DENSE_PRECISION_KEY, FORMAT, FORMAT_VERSION,
    Q8_0_LAYOUT, ROUNDING,
};
pub use crate::format::safetensors_stream::{PlannedTensor, SafetensorsStream};

const FILES_TO_COPY: [&str; 6] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
];

fn meta_json(cfg: &ModelConfig, layout: &Q4SlotLayout) -> BTreeMap<&'static str, String> {
    let mut m = BTreeMap::new();
    m.insert("wgmoe.format", FORMAT.to_string());
    m.insert("wgmoe.format_version", FORMAT_VERSION.to_string());
    m.insert("wgmoe.block_size", crate::blocks::quant::BLOCK.to_string());
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
    // The dense weights' storage is one this build reads.
    dense_storage(ckpt)?;
    let layout = Q4SlotLayout::new(cfg.hidden_size, cfg.moe_intermediate);
    for (key, want) in meta_json(cfg, &layout) {
        let got = md.get(key).map(String::as_str).unwrap_or("<missing>");
        if got != want {
            let hint = if key == "wgmoe.source_config_hash" {
                " (config.json differs from the one the file was converted from)"
            } else {
                ""
            };
            return Err(Error::bad_file(
                &file,
                format!(
                    "metadata `{key}` is `{got}`, expected `{want}`{hint}; re-run `wgmoe quantize`"
                ),
            ));
        }
    }
    let sums: Vec<String> = md
        .get("wgmoe.expert_checksums")
        .and_then(|s| serde_json::from_str(s).ok())
        .ok_or_else(|| {
            Error::bad_file(
                &file,
                "metadata `wgmoe.expert_checksums` is missing or malformed",
            )
        })?;
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
                msg: format!(
                    "checksum {got} does not match the recorded {want}: the file is corrupt"
                ),
            });
        }
        // The scales must be finite (a checksum says nothing about how the file was made).
        for (ex, slot) in bytes.chunks_exact(layout.bytes).enumerate() {
            let scales = &slot[layout.gate_s..];
            if let Some(c) = scales
                .chunks_exact(2)
                .find(|c| !half::f16::from_le_bytes([c[0], c[1]]).is_finite())
            {
                return Err(Error::BadTensor {
                    path: file.clone(),
                    name,
                    msg: format!(
                        "expert {ex} has an f16 scale of {}: wgmoe refuses non-finite weights",
                        half::f16::from_le_bytes([c[0], c[1]])
                    ),
                });
            }
        }
    }
    Ok(())
}

/// `w` (rows of `cols` values) as ggml's Q8_0 blocks, row by row: per block of 32 values
/// along the row, its f16 scale d (little-endian) then 32 int8, bit-exact with ggml's
/// `quantize_row_q8_0_ref` (`crate::blocks::q8_0::quantize_block`); a partial last block
/// is zero-padded. `Q8Matrix::from_ggml` splits them into the packed sections the kernels
/// read, giving the bytes `Q8Matrix::pack` gives from `w`.
pub fn q8_0_ggml_blocks(w: &[f32], cols: usize) -> Vec<u8> {
    use crate::blocks::q8_0::{quantize_block, BLOCK};
    if cols == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(w.len() / cols * ggml_q8_row_bytes(cols));
    for row in w.chunks(cols) {
        for block in row.chunks(BLOCK) {
            let (d, q) = quantize_block(block);
            out.extend_from_slice(&d.to_le_bytes());
            out.extend(q.iter().map(|&v| v as u8));
        }
    }
    out
}

/// The ggml Q8_0 blocks of the dense weight `name` ([rows, cols]) of a Q8_0 conversion or
/// of a GGUF Q8_0 tensor, borrowed from the mapping (a copy for a GGUF Q/K weight whose rows
/// are unpermuted), after checking the shape and that every block's scale is a finite f16
/// (a checksum says nothing about how a file was made).
pub fn stored_q8_blocks<'a>(
    ckpt: &'a Checkpoint,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<std::borrow::Cow<'a, [u8]>> {
    use crate::blocks::q8_0::{BLOCK, GGML_BLOCK_BYTES};
    let bytes = match ckpt.ggml_q8_blocks(name, rows, cols)? {
        Some(b) => b,
        None => std::borrow::Cow::Borrowed(ckpt.raw_u8(name, &[rows, ggml_q8_row_bytes(cols)])?),
    };
    let blocks = cols.div_ceil(BLOCK).max(1);
    let bad = bytes
        .chunks_exact(GGML_BLOCK_BYTES)
        .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
        .enumerate()
        .find(|(_, d)| !d.is_finite());
    if let Some((i, d)) = bad {
        return Err(Error::BadTensor {
            path: if ckpt.is_gguf() {
                ckpt.dir().to_path_buf()
            } else {
                ckpt.dir().join("model.safetensors")
            },
            name: name.to_string(),
            msg: format!(
                "Q8_0 block {} of row {} has an f16 scale of {d}: wgmoe refuses non-finite weights",
                i % blocks,
                i / blocks
            ),
        });
    }
    Ok(bytes)
}

/// Quantise one layer's routed experts into packed slots [E][slot_bytes], on all cores.
pub fn quantize_layer(ckpt: &Checkpoint, cfg: &ModelConfig, layer: usize) -> Result<Vec<u8>> {
    let (e, h, i) = (cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate);
    let layout = cfg.q4_slot(layer);
    let mut out = vec![0u8; e * layout.bytes];
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(e.max(1));
    let per = e.div_ceil(threads);
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = out
            .chunks_mut(per * layout.bytes)
            .enumerate()
            .map(|(ti, part)| {
                s.spawn(move || -> Result<()> {
                    for (k, slot) in part.chunks_mut(layout.bytes).enumerate() {
                        let ex = ti * per + k;
                        let read = |proj: ExpertProj, m: Q4Matrix| -> Result<Q4Source> {
                            // A GGUF file's blocks go into slots of their kind as they are
                            // (or, where the kind differs, as their values).
                            if m.kind != Q4Kind::Sym256 {
                                if let Some(src) = ckpt.read_expert_native(layer, ex, proj, e, h, i)? {
                                    let as_is = match &src {
                                        Q4Source::Planes(r) => r.widened(m.kind).is_some(),
                                        Q4Source::Affine(_) => m.kind == Q4Kind::Affine32,
                                        Q4Source::Values(_) => false,
                                    };
                                    if as_is {
                                        return Ok(src);
                                    }
                                }
                            }
                            let w = ckpt.read_expert_f32(layer, ex, proj, e, h, i)?;
                            if let Some((k, v)) = m.first_unscalable(&w) {
                                let (name, path, at) =
                                    ckpt.expert_source(layer, ex, proj, e, h, i)?;
                                return Err(Error::BadTensor {
                                    path,
                                    name,
                                    msg: format!(
                                        "element {} is {v}: its {} block's f16 scale would be infinite; routed experts hold at most {} in magnitude",
                                        at + k,
                                        match m.kind {
                                            Q4Kind::Q8 => "Q8_0",
                                            Q4Kind::Sym256 | Q4Kind::Affine32 => "INT4",
                                            k => k.name(),
                                        },
                                        m.kind.max_abs()
                                    ),
                                });
                            }
                            Ok(Q4Source::Values(w))
                        };
                        let gate = read(ExpertProj::Gate, layout.gate)?;
                        let up = read(ExpertProj::Up, layout.gate)?;
                        let down = read(ExpertProj::Down, layout.down)?;
                        layout.pack_expert_from(&gate, &up, &down, slot);
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Other("a quantiser thread panicked".into())))
            })
            .collect()
    });
    for r in results {
        r?;
    }
    Ok(out)
}

/// The packed experts of one layer: borrowed from a converted file, or quantised now.
pub fn packed_layer<'a>(
    ckpt: &'a Checkpoint,
    cfg: &ModelConfig,
    layer: usize,
) -> Result<Cow<'a, [u8]>> {
    if is_converted(ckpt) {
        let layout = Q4SlotLayout::new(cfg.hidden_size, cfg.moe_intermediate);
        Ok(Cow::Borrowed(ckpt.raw_u8(
            &experts_tensor(layer),
            &[cfg.num_experts, layout.bytes],
        )?))
    } else {
        Ok(Cow::Owned(quantize_layer(ckpt, cfg, layer)?))
    }
}

/// Whether a checkpoint tensor is a routed expert weight (replaced by the packed slots).
fn is_routed_expert(name: &str) -> bool {
    name.contains(".mlp.experts.") || name.contains(".block_sparse_moe.experts.")
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ConvertSummary {
    pub out_file: String,
    pub bytes: u64,
    /// The dense weights' storage (`--dense-precision`).
    pub dense_precision: DenseStorage,
    /// Non-routed tensors stored as f16 (with q8_0: the router, norms, embeddings...).
    pub dense_f16_bytes: u64,
    /// Dense weights stored as Q8_0 blocks (0 with f16).
    pub dense_q8_bytes: u64,
    pub expert_int4_bytes: u64,
    /// The earlier wgmoe output the new one replaced, if any.
    pub replaced: Option<String>,
}

/// The writer of a converted model's `model.safetensors` (the format `wgmoe quantize`
/// writes and `validate_converted` checks): the non-routed tensors as F16 in the order
/// given, then per MoE layer the packed INT4 expert slots, with the format metadata and a
/// checksum per layer computed as the bytes stream through. Used by `write_converted` and
/// by `wgmoe synth`.
pub struct ConvertedModelWriter {
    st: SafetensorsStream,
    layout: Q4SlotLayout,
    sums: Vec<String>,
    /// Layer whose experts are being written, and their running checksum.
    hashing: Option<(usize, FastHasher)>,
    storage: DenseStorage,
    dense: u64,
    dense_q8: u64,
    experts: u64,
    num_experts: usize,
}

impl ConvertedModelWriter {
    /// `out_file`: the file to write (a staged name of an `OutputDir`); `dense`: every
    /// non-routed tensor (name, shape), in write order. `extra_meta`: more metadata (e.g.
    /// `wgmoe.source_files`), added to the format's own.
    pub fn create(
        out_file: &Path,
        cfg: &ModelConfig,
        dense: Vec<(String, Vec<usize>)>,
        extra_meta: BTreeMap<String, String>,
    ) -> Result<Self> {
        Self::create_in(out_file, cfg, dense, DenseStorage::F16, extra_meta)
    }

    /// As `create`, with the dense weights (`is_dense_weight`, given by name and their
    /// [rows, cols]) stored in `storage`: with Q8_0 they are planned as U8 ggml blocks
    /// [rows, ceil(cols/32)*34] and written with `write_dense_q8`.
    pub fn create_in(
        out_file: &Path,
        cfg: &ModelConfig,
        dense: Vec<(String, Vec<usize>)>,
        storage: DenseStorage,
        extra_meta: BTreeMap<String, String>,
    ) -> Result<Self> {
        let layout = Q4SlotLayout::new(cfg.hidden_size, cfg.moe_intermediate);
        let mut plan: Vec<PlannedTensor> = dense
            .into_iter()
            .map(|(n, s)| match (storage, &s[..]) {
                (DenseStorage::Q8_0, &[rows, cols]) if is_dense_weight(&n) => {
                    PlannedTensor::new(n, "U8", vec![rows, ggml_q8_row_bytes(cols)])
                }
                _ => PlannedTensor::new(n, "F16", s),
            })
            .collect();
        for l in (0..cfg.num_layers).filter(|&l| cfg.sparse_layers[l]) {
            plan.push(PlannedTensor {
                name: experts_tensor(l),
                dtype: "U8",
                shape: vec![cfg.num_experts, layout.bytes],
                bytes: cfg.num_experts * layout.bytes,
            });
        }
        let mut meta: BTreeMap<String, String> = meta_json(cfg, &layout)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        meta.insert(DENSE_PRECISION_KEY.into(), storage.name().into());
        if storage == DenseStorage::Q8_0 {
            meta.insert(DENSE_LAYOUT_KEY.into(), Q8_0_LAYOUT.into());
        }
        meta.extend(extra_meta);
        // Fixed-width placeholders, so the header keeps its length when the real sums go in.
        let sums: Vec<String> = (0..cfg.num_layers).map(|_| "0".repeat(16)).collect();
        meta.insert(
            "wgmoe.expert_checksums".into(),
            serde_json::to_string(&sums).unwrap_or_default(),
        );
        let st = SafetensorsStream::create(out_file, plan, meta)?;
        Ok(ConvertedModelWriter {
            st,
            layout,
            sums,
            hashing: None,
            storage,
            dense: 0,
            dense_q8: 0,
            experts: 0,
            num_experts: cfg.num_experts,
        })
    }

    pub fn layout(&self) -> Q4SlotLayout {
        self.layout
    }

    pub fn stream(&self) -> &SafetensorsStream {
        &self.st
    }

    /// Append f16 values to the non-routed tensor `name` (whole or in pieces).
    pub fn write_dense(&mut self, name: &str, data: &[half::f16]) -> Result<()> {
        self.st.write(name, bytemuck::cast_slice(data))?;
        self.dense += (data.len() * 2) as u64;
        Ok(())
    }

    /// Append ggml Q8_0 blocks (`q8_0_ggml_blocks`, whole rows) to the dense weight `name`.
    pub fn write_dense_q8(&mut self, name: &str, blocks: &[u8]) -> Result<()> {
        self.st.write(name, blocks)?;
        self.dense_q8 += blocks.len() as u64;
        Ok(())
    }

    /// Append packed expert slots (whole slots or any pieces of them, in expert order) to
    /// layer `layer`'s expert tensor.
    pub fn write_experts(&mut self, layer: usize, data: &[u8]) -> Result<()> {
        let total = (self.num_experts * self.layout.bytes) as u64;
        match &mut self.hashing {
            Some((l, _)) if *l == layer => {}
            _ => {
                self.close_layer()?;
                self.hashing = Some((layer, FastHasher::new(total)));
            }
        }
        self.st.write(&experts_tensor(layer), data)?;
        if let Some((_, h)) = &mut self.hashing {
            h.update(data);
        }
        self.experts += data.len() as u64;
        if self
            .hashing
            .as_ref()
            .is_some_and(|(_, h)| h.seen() == total)
        {
            self.close_layer()?;
        }
        Ok(())
    }

    fn close_layer(&mut self) -> Result<()> {
        if let Some((l, h)) = self.hashing.take() {
            let sum = h.try_finish().ok_or_else(|| {
                Error::Other(format!("internal: experts of layer {l} incomplete"))
            })?;
            self.sums[l] = format!("{sum:016x}");
        }
        Ok(())
    }

    pub fn finish(mut self) -> Result<ConvertSummary> {
        self.close_layer()?;
        self.st.set_metadata(
            "wgmoe.expert_checksums",
            serde_json::to_string(&self.sums).unwrap_or_default(),
        );
        let out_file = self.st.out_file.clone();
        let bytes = self.st.finish()?;
        Ok(ConvertSummary {
            out_file: out_file.display().to_string(),
            bytes,
            dense_precision: self.storage,
            dense_f16_bytes: self.dense,
            dense_q8_bytes: self.dense_q8,
            expert_int4_bytes: self.experts,
            replaced: None,
        })
    }
}

/// `wgmoe quantize --dense-precision f16`: write a converted model to `out_dir`, streaming
/// tensor by tensor (an existing non-empty `out_dir` must hold an earlier wgmoe output; see
/// `write_converted_to`). `on_progress(done, total)` counts the output tensors' bytes.
pub fn write_converted(
    src: &Path,
    out_dir: &Path,
    on_progress: &mut dyn FnMut(u64, u64),
) -> Result<ConvertSummary> {
    write_converted_to(src, out_dir, false, DenseStorage::F16, on_progress)
}

/// Rows of a dense weight quantised to Q8_0 per piece written (bounds the f32 copy).
const Q8_ROWS_PER_PIECE: usize = 4096;

/// `wgmoe quantize [--force]`. The output directory is checked and written as
/// `crate::format::output_dir` describes: never the input (or inside it, or around it), a
/// non-empty directory only if it holds an earlier wgmoe output or with `force`, every file
/// under a temporary name until all are complete. `dense_storage`: how the dense weights are
/// stored (`--dense-precision`).
pub fn write_converted_to(
    src: &Path,
    out_dir: &Path,
    force: bool,
    dense_storage: DenseStorage,
    on_progress: &mut dyn FnMut(u64, u64),
) -> Result<ConvertSummary> {
    crate::format::checkpoint::check_model_dir(src)?;
    let cfg = ModelConfig::from_dir(src)?;
    let ckpt = Checkpoint::open(src)?;
    if is_converted(&ckpt) {
        return Err(Error::bad_file(
            ckpt.dir().join("model.safetensors"),
            "is already a converted INT4 model",
        ));
    }
    // The same size, tensor and shape checks as loading, before anything is written.
    crate::format::manifest::check_checkpoint(&cfg, &ckpt)?;
    crate::format::manifest::check_tensors(&cfg, &ckpt)?;
    let mut out = crate::format::output_dir::OutputDir::prepare(out_dir, Some(src), force)?;

    let mut dense = Vec::new();
    for name in ckpt.names().filter(|n| !is_routed_expert(n)) {
        dense.push((name.to_string(), ckpt.info(name)?.shape));
    }
    // Q8_0 with tied embeddings: the lm_head's Q8_0 copy (the loader's, when it quantises
    // on load), so a converted model reads it as stored.
    let tied_copy = dense_storage == DenseStorage::Q8_0
        && cfg.tie_word_embeddings
        && !ckpt.contains("lm_head.weight");
    if tied_copy {
        dense.push((
            "lm_head.weight".to_string(),
            vec![cfg.vocab_size, cfg.hidden_size],
        ));
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
    let mut extra = BTreeMap::new();
    extra.insert(
        "wgmoe.source_files".to_string(),
        serde_json::Value::Array(sources).to_string(),
    );
    let weights = out.stage("model.safetensors");
    let shapes: std::collections::HashMap<String, Vec<usize>> = dense.iter().cloned().collect();
    let mut w = ConvertedModelWriter::create_in(&weights, &cfg, dense, dense_storage, extra)?;
    let plan: Vec<PlannedTensor> = w.stream().plan().to_vec();
    // Bytes, not tensors: the expert tensors are most of the bytes and of the time.
    let total: u64 = plan.iter().map(|p| p.bytes as u64).sum();
    let mut done = 0u64;
    for p in &plan {
        on_progress(done, total);
        done += p.bytes as u64;
        crate::interrupt::check()?;
        if p.dtype == "F16" {
            let v = ckpt.read_f16(&p.name, &p.shape)?;
            w.write_dense(&p.name, &v)?;
        } else if is_dense_weight(&p.name) {
            let source = if tied_copy && p.name == "lm_head.weight" {
                "model.embed_tokens.weight"
            } else {
                p.name.as_str()
            };
            let shape = shapes.get(&p.name).cloned().unwrap_or_default();
            let &[rows, cols] = &shape[..] else {
                return Err(Error::Other(format!(
                    "internal: dense weight `{}` of shape {shape:?} planned as Q8_0",
                    p.name
                )));
            };
            let mut start = 0;
            while start < rows {
                crate::interrupt::check()?;
                let n = Q8_ROWS_PER_PIECE.min(rows - start);
                let v = ckpt.read_rows_f32(source, &shape, start, n)?;
                if let Some((i, x)) = crate::blocks::q8_0::first_unstorable(&v, cols) {
                    return Err(Error::BadTensor {
                        path: ckpt.info(source)?.file,
                        name: source.to_string(),
                        msg: format!(
                            "element [{}, {}] = {x} cannot be stored as Q8_0 (a block's scale max|w|/127 must be a finite f16; --dense-precision f16 keeps it as f16)",
                            start + i / cols,
                            i % cols
                        ),
                    });
                }
                w.write_dense_q8(&p.name, &q8_0_ggml_blocks(&v, cols))?;
                start += n;
            }
        } else {
            let l: usize = p
                .name
                .split('.')
                .nth(2)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let packed = quantize_layer(&ckpt, &cfg, l)?;
            w.write_experts(l, &packed)?;
        }
    }
    on_progress(total, total);
    let summary = w.finish()?;
    for name in FILES_TO_COPY {
        let s = src.join(name);
        if s.is_file() {
            out.copy(&s, name)?;
        }
    }
    crate::interrupt::check()?;
    let final_file = out.path().join("model.safetensors");
    let replaced = out.replaces().map(|e| e.describe().to_string());
    out.commit()?;
    let bytes = std::fs::metadata(&final_file)
        .map_err(|e| Error::io(&final_file, e))?
        .len();
    Ok(ConvertSummary {
        bytes,
        out_file: final_file.display().to_string(),
        replaced,
        ..summary
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::q8_0::Q8Matrix;

    #[test]
    fn stored_q8_0_blocks_split_into_what_quantising_on_load_packs() {
        // 45 columns: two blocks per row, the second partial (zero-padded).
        let (out, inp) = (5, 45);
        let w: Vec<f32> = (0..out * inp)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 13.0)
            .collect();
        let blocks = q8_0_ggml_blocks(&w, inp);
        assert_eq!(blocks.len(), out * ggml_q8_row_bytes(inp));
        assert_eq!(ggml_q8_row_bytes(inp), 2 * 34);
        let m = Q8Matrix { out, inp };
        let (mut q1, mut s1) = (vec![0u8; m.q_bytes()], vec![0u8; m.scale_bytes()]);
        let (mut q2, mut s2) = (vec![0u8; m.q_bytes()], vec![0u8; m.scale_bytes()]);
        m.pack(&w, &mut q1, &mut s1);
        m.from_ggml(&blocks, &mut q2, &mut s2);
        assert_eq!(q1, q2);
        assert_eq!(s1, s2);
        // The padding of a partial block holds zeros.
        assert!(blocks[34 + 2 + 13..68].iter().all(|&b| b == 0));
    }
}

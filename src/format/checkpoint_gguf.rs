//! A [`Checkpoint`] opened from a GGUF model: its tensors under the Hugging Face names
//! (`crate::gguf::source`), each decoded from its block type when read, so the one loader,
//! admission and residency code serves both formats.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use half::f16;
use safetensors::Dtype;

use super::{map_shard, Checkpoint, DType, Entry};
use crate::blocks::quant::Q4Source;
use crate::error::{Error, Result};
use crate::gguf::{permute, GgmlType, GgufModel};

/// Rows of a GGUF tensor: their bytes in Hugging Face row order, the block type, the
/// tensor's columns and the first row's index.
type GgufRows<'a> = (Cow<'a, [u8]>, GgmlType, usize, usize);

/// How a GGUF tensor is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgmlEntry {
    pub ty: GgmlType,
    /// The GGUF tensor the bytes are from (an expert's slice, or q/k/v of a fused qkv).
    pub gguf_name: String,
    /// `Some(head_dim)`: Q/K rows in the converter's RoPE order, undone on read.
    pub unpermute_head_dim: Option<usize>,
}

impl GgmlEntry {
    /// The type a read yields: the float types as themselves, block types as f32.
    pub fn decoded_dtype(&self) -> DType {
        match self.ty {
            GgmlType::F16 => DType::F16,
            GgmlType::BF16 => DType::BF16,
            _ => DType::F32,
        }
    }
}

/// Opens a GGUF model (a file, a split's first shard, or a directory holding one) as a
/// checkpoint. The metadata gives the config; every tensor the model needs is checked
/// present, shaped and of a supported type first.
pub(super) fn open(path: &Path) -> Result<Checkpoint> {
    let model = GgufModel::open(path)?;
    let cfg = crate::gguf::model_config(&model)?;
    let hf = crate::gguf::source::hf_tensors(&model, &cfg)?;
    let shards = model
        .shards()
        .iter()
        .map(|s| map_shard(s.path()))
        .collect::<Result<Vec<_>>>()?;
    let mut tensors = BTreeMap::new();
    for t in hf {
        let len = shards.get(t.shard).map_or(0, |s| s.mmap.len());
        if t.start > t.end || t.end > len {
            return Err(Error::BadTensor {
                path: model.shards()[t.shard].path().to_path_buf(),
                name: t.gguf_name,
                msg: "lies outside the file".into(),
            });
        }
        tensors.insert(
            t.name,
            Entry {
                shard: t.shard,
                dtype: Dtype::U8,
                shape: t.shape,
                start: t.start,
                end: t.end,
                ggml: Some(GgmlEntry {
                    ty: t.ty,
                    gguf_name: t.gguf_name,
                    unpermute_head_dim: t.unpermute_head_dim,
                }),
            },
        );
    }
    Ok(Checkpoint {
        dir: model.path().to_path_buf(),
        shards,
        tensors,
        metadata: HashMap::new(),
        gguf: true,
    })
}

impl Checkpoint {
    /// Whether this checkpoint is a GGUF model.
    pub fn is_gguf(&self) -> bool {
        self.gguf
    }

    /// The GGUF block type of a tensor (None for safetensors, or no such tensor).
    pub fn ggml_type(&self, name: &str) -> Option<GgmlType> {
        self.lookup(name)
            .and_then(|e| e.ggml.as_ref())
            .map(|g| g.ty)
    }

    /// A GGUF Q8_0 tensor's blocks, exactly `[rows, cols]`, rows in Hugging Face order
    /// (unpermuted where the converter permuted them): the layout the Q8_0 kernels' uploader
    /// takes. None when the tensor is not stored as Q8_0.
    pub fn ggml_q8_blocks(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Option<Cow<'_, [u8]>>> {
        let e = self.entry(name)?;
        let Some(g) = e.ggml.as_ref().filter(|g| g.ty == GgmlType::Q8_0) else {
            return Ok(None);
        };
        if e.shape != [rows, cols] {
            return Err(self.bad(
                e,
                name,
                format!("expected shape {:?}, found {:?}", [rows, cols], e.shape),
            ));
        }
        let bytes = self.bytes(e);
        Ok(Some(match g.unpermute_head_dim {
            None => Cow::Borrowed(bytes),
            Some(d) => Cow::Owned(
                permute::unpermute_rows(bytes, bytes.len() / rows.max(1), d)
                    .map_err(|m| self.bad(e, name, m))?,
            ),
        }))
    }

    /// Rows `(start, n)` of a GGUF tensor in the form wgmoe holds its block type in as it
    /// is, in Hugging Face row order: Q4_0 as affine 4-bit rows (`gguf::dequant::affine4`),
    /// Q4_K, Q5_K, Q6_K and Q5_0/Q5_1 as nibble planes (`gguf::dequant::planes`); None for
    /// any other type (the caller reads it as f32, or Q8_0 blocks as stored). The full
    /// shape must equal `expected_shape`. A block whose scales f16 cannot hold is an error
    /// naming the tensor.
    pub fn read_rows_native(
        &self,
        name: &str,
        expected_shape: &[usize],
        row_start: usize,
        rows: usize,
    ) -> Result<Option<Q4Source>> {
        let (e, _) = self.checked(name, expected_shape)?;
        let Some((bytes, ty, cols, _)) = self.gguf_rows(e, name, Some((row_start, rows)))? else {
            return Ok(None);
        };
        // Messages count elements from the tensor's first row.
        let at = |m: String| {
            self.bad(
                e,
                name,
                format!("{m} (rows from {row_start}, {cols} columns each)"),
            )
        };
        if ty != GgmlType::Q4_0 {
            let p = crate::gguf::dequant::planes(ty, &bytes, cols).map_err(at)?;
            return Ok(p.map(Q4Source::Planes));
        }
        let Some(a) = crate::gguf::dequant::affine4(ty, &bytes).map_err(at)? else {
            return Ok(None);
        };
        // The affine INT4 slot stores f16(A) and f16(B + 8A): both must be finite.
        let bad = a.blocks.iter().position(|&(am, bm)| {
            !(f16::from_f32(am).is_finite() && f16::from_f32(bm + 8.0 * am).is_finite())
        });
        if let Some(b) = bad {
            let at = row_start * cols + b * 32;
            return Err(self.bad(
                e,
                name,
                format!(
                    "the {ty} block holding element {at} has a scale {} or offset {} beyond f16's range: wgmoe refuses it",
                    a.blocks[b].0, a.blocks[b].1
                ),
            ));
        }
        Ok(Some(Q4Source::Affine(a)))
    }

    /// The bytes of rows `(start, n)` of a GGUF tensor (all rows with None) in Hugging Face
    /// row order, its type, its columns and the first row; None when it is not a GGUF
    /// tensor.
    fn gguf_rows(
        &self,
        e: &Entry,
        name: &str,
        rows: Option<(usize, usize)>,
    ) -> Result<Option<GgufRows<'_>>> {
        let Some(g) = e.ggml.as_ref() else {
            return Ok(None);
        };
        let all = self.bytes(e);
        let (n_rows, cols) = match e.shape[..] {
            [r, c] => (r, c),
            [n] => (1, n),
            _ => {
                return Err(self.bad(
                    e,
                    name,
                    format!("shape {:?} is not a matrix or a vector", e.shape),
                ))
            }
        };
        let row_bytes = all.len() / n_rows.max(1);
        let bytes: Cow<'_, [u8]> = match g.unpermute_head_dim {
            Some(d) => Cow::Owned(
                permute::unpermute_rows(all, row_bytes, d).map_err(|m| self.bad(e, name, m))?,
            ),
            None => Cow::Borrowed(all),
        };
        let (r0, n) = rows.unwrap_or((0, n_rows));
        if r0.checked_add(n).is_none_or(|end| end > n_rows) {
            return Err(self.bad(
                e,
                name,
                format!("rows {r0}..{r0}+{n} out of range ({n_rows} rows of {cols})"),
            ));
        }
        let part = match bytes {
            Cow::Borrowed(b) => Cow::Borrowed(&b[r0 * row_bytes..(r0 + n) * row_bytes]),
            Cow::Owned(b) => Cow::Owned(b[r0 * row_bytes..(r0 + n) * row_bytes].to_vec()),
        };
        Ok(Some((part, g.ty, cols, r0)))
    }

    /// A GGUF tensor (or rows `(start, n)` of it) decoded to f32 in Hugging Face row order;
    /// a NaN or infinite value is an error naming the tensor and the element.
    pub(super) fn gguf_f32(
        &self,
        e: &Entry,
        name: &str,
        rows: Option<(usize, usize)>,
    ) -> Result<Vec<f32>> {
        let (part, ty, cols, r0) = self
            .gguf_rows(e, name, rows)?
            .ok_or_else(|| self.bad(e, name, "is not a GGUF tensor"))?;
        let v = crate::gguf::dequant::dequantize(ty, &part).map_err(|m| self.bad(e, name, m))?;
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(self.bad(
                e,
                name,
                format!(
                    "element {} is {} (in its {} blocks): wgmoe refuses non-finite weights",
                    r0 * cols + i,
                    v[i],
                    ty
                ),
            ));
        }
        Ok(v)
    }
}

/// f32 values of a GGUF tensor as f16; a value beyond the f16 range is an error naming the
/// tensor and the element (`at`: the first value's index in the tensor).
pub(super) fn to_f16(
    ck: &Checkpoint,
    e: &Entry,
    name: &str,
    at: usize,
    v: Vec<f32>,
) -> Result<Vec<f16>> {
    let out: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
    if let Some(i) = out.iter().position(|h| !h.is_finite()) {
        let b = super::BadValue::OutOfF16Range {
            index: i,
            value: v[i],
        };
        return Err(ck.bad(e, name, b.describe(at)));
    }
    Ok(out)
}

//! Weights on the device: f16 matrices split by rows under the storage-binding limit, and
//! pools of expert slots (f16 SwiGLU experts, packed INT4 experts). Rows are padded to a
//! multiple of 8 halves (16 bytes) so kernels read them as vec4<u32>.

use half::f16;

use crate::backend::kernel::WeightFormat;
use crate::backend::{Buffer, Device, Usage};
use crate::blocks::kquant::KRows;
use crate::blocks::q8_0::{self, Q8Matrix};
use crate::blocks::quant::{Affine4, Q4Kind, Q4Matrix, Q4SlotLayout};
use crate::error::{Error, Result};

pub fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// Append `rows` rows of `cols` values to `out`, each padded with zeros to pad8(cols).
pub fn push_padded_rows(out: &mut Vec<f16>, data: &[f16], rows: usize, cols: usize) {
    let pc = pad8(cols);
    out.reserve(rows * pc);
    for r in 0..rows {
        out.extend_from_slice(&data[r * cols..(r + 1) * cols]);
        out.resize(out.len() + (pc - cols), f16::ZERO);
    }
}

pub struct MatrixChunk {
    pub row_start: usize,
    pub rows: usize,
    pub buffer: Buffer,
    /// How its rows are stored (chunks of one matrix may differ: a GGUF file's q, k and v
    /// projections, stacked, may be of three block types).
    pub format: WeightFormat,
}

/// A dense [rows, cols] matrix, row-major, split into chunks of whole rows, each in its
/// format: f16 (rows padded to 8 halves), Q8_0 (`blocks/q8_0.rs`: each chunk's quants,
/// then its scales), or a packed kind of `blocks/quant.rs` (a GGUF file's Q4_0 blocks as
/// affine INT4, its K-quant and 5-bit blocks as nibble planes and side records: each
/// chunk's nibbles, then its scale section).
pub struct F16Matrix {
    pub rows: usize,
    pub cols: usize,
    pub chunks: Vec<MatrixChunk>,
}

/// Rows of a dense matrix in the form they are uploaded from.
pub enum DenseRows {
    /// f16 values, row-major.
    F16(Vec<f16>),
    /// ggml's Q8_0 blocks (34 bytes per 32 columns), rows in order: as a file stores them,
    /// or quantised from values ([`DenseRows::q8_from_values`]).
    Q8(Vec<u8>),
    /// Affine 4-bit rows (a GGUF Q4_0 matrix's blocks).
    Affine(Affine4),
    /// Rows of a K-plane kind (a GGUF K-quant or 5-bit matrix's blocks).
    Planes(KRows),
}

impl DenseRows {
    /// Values (rows of `cols`, storable: `q8_0::first_unstorable` finds none) quantised
    /// to ggml's Q8_0 blocks by ggml's rule.
    pub fn q8_from_values(w: &[f32], cols: usize) -> DenseRows {
        let mut out = Vec::with_capacity(w.len().div_ceil(q8_0::BLOCK) * q8_0::GGML_BLOCK_BYTES);
        for row in w.chunks(cols.max(1)) {
            for blk in row.chunks(q8_0::BLOCK) {
                let (d, q) = q8_0::quantize_block(blk);
                out.extend_from_slice(&d.to_le_bytes());
                out.extend(q.iter().map(|&v| v as u8));
            }
        }
        DenseRows::Q8(out)
    }

    pub fn format(&self) -> WeightFormat {
        match self {
            DenseRows::F16(_) => WeightFormat::F16,
            DenseRows::Q8(_) => WeightFormat::Q8,
            DenseRows::Affine(_) => WeightFormat::Q4A,
            DenseRows::Planes(r) => WeightFormat::int4(r.kind),
        }
    }

    fn rows(&self, cols: usize) -> usize {
        let c = cols.max(1);
        match self {
            DenseRows::F16(v) => v.len() / c,
            DenseRows::Q8(b) => {
                b.len() / (cols.div_ceil(q8_0::BLOCK) * q8_0::GGML_BLOCK_BYTES).max(1)
            }
            DenseRows::Affine(a) => a.nibbles.len() / c,
            DenseRows::Planes(r) => r.nibbles.len() / c,
        }
    }

    /// Append `o`'s rows where both are of one form; `o` back otherwise.
    fn append(&mut self, o: DenseRows) -> Option<DenseRows> {
        match (self, o) {
            (DenseRows::F16(a), DenseRows::F16(b)) => a.extend(b),
            (DenseRows::Q8(a), DenseRows::Q8(b)) => a.extend(b),
            (DenseRows::Affine(a), DenseRows::Affine(b)) => {
                a.nibbles.extend(b.nibbles);
                a.blocks.extend(b.blocks);
            }
            (DenseRows::Planes(a), DenseRows::Planes(b)) if a.kind == b.kind => {
                a.nibbles.extend(b.nibbles);
                a.side.extend(b.side);
            }
            (_, o) => return Some(o),
        }
        None
    }

    /// The device bytes of rows `r0 .. r0 + n` (one chunk).
    fn chunk(&self, cols: usize, r0: usize, n: usize) -> Vec<u8> {
        let pack = |m: Q4Matrix, f: &dyn Fn(&mut [u8], &mut [u8])| {
            let mut bytes = vec![0u8; m.q_bytes() + m.scale_bytes()];
            let (q, s) = bytes.split_at_mut(m.q_bytes());
            f(q, s);
            bytes
        };
        let m = |kind| Q4Matrix {
            out: n,
            inp: cols,
            kind,
        };
        match self {
            DenseRows::F16(v) => {
                let mut padded = Vec::new();
                push_padded_rows(&mut padded, &v[r0 * cols..(r0 + n) * cols], n, cols);
                bytemuck::cast_slice(&padded).to_vec()
            }
            DenseRows::Q8(b) => {
                let rb = cols.div_ceil(q8_0::BLOCK) * q8_0::GGML_BLOCK_BYTES;
                pack(m(Q4Kind::Q8), &|q, s| {
                    Q8Matrix { out: n, inp: cols }.from_ggml(&b[r0 * rb..(r0 + n) * rb], q, s)
                })
            }
            DenseRows::Affine(a) => {
                let nb = cols.div_ceil(32);
                let part = Affine4 {
                    nibbles: a.nibbles[r0 * cols..(r0 + n) * cols].to_vec(),
                    blocks: a.blocks[r0 * nb..(r0 + n) * nb].to_vec(),
                };
                let mm = m(Q4Kind::Affine32);
                pack(mm, &|q, s| mm.pack_affine(&part, q, s))
            }
            DenseRows::Planes(r) => {
                let mm = m(r.kind);
                let part = r.rows_range(r0, n);
                pack(mm, &|q, s| mm.pack_planes(&part, q, s))
            }
        }
    }
}

/// The packed layout of `rows` rows of `cols` in a format with block scales.
fn packed(format: WeightFormat, rows: usize, cols: usize) -> Option<Q4Matrix> {
    format.q4_kind().map(|kind| Q4Matrix {
        out: rows,
        inp: cols,
        kind,
    })
}

impl F16Matrix {
    pub fn row_bytes(cols: usize) -> u64 {
        pad8(cols) as u64 * 2
    }

    /// The format every chunk shares (None where they differ).
    pub fn uniform_format(&self) -> Option<WeightFormat> {
        let f = self.chunks.first()?.format;
        self.chunks.iter().all(|c| c.format == f).then_some(f)
    }

    /// The matrix as runs of chunks of one format (views sharing the buffers), in order.
    pub fn runs_by_format(&self) -> Vec<F16Matrix> {
        let mut runs: Vec<F16Matrix> = Vec::new();
        for c in &self.chunks {
            let chunk = MatrixChunk {
                row_start: c.row_start,
                rows: c.rows,
                buffer: c.buffer.clone(),
                format: c.format,
            };
            match runs.last_mut() {
                Some(r) if r.chunks[0].format == c.format => r.chunks.push(chunk),
                _ => runs.push(F16Matrix {
                    rows: self.rows,
                    cols: self.cols,
                    chunks: vec![chunk],
                }),
            }
        }
        runs
    }

    /// 16-byte words per row of chunk `c`.
    pub fn words_per_row(&self, c: &MatrixChunk) -> u32 {
        match packed(c.format, 1, self.cols) {
            Some(m) => m.vec4_per_row() as u32,
            None => (pad8(self.cols) / 8) as u32,
        }
    }

    /// f16 scale-section values per row of chunk `c` (0 for f16).
    pub fn blocks_per_row(&self, c: &MatrixChunk) -> u32 {
        match packed(c.format, 1, self.cols) {
            Some(m) if c.format == WeightFormat::Q8 => m.blocks() as u32,
            Some(m) => m.halves_per_row() as u32,
            None => 0,
        }
    }

    /// The u32 offset of a chunk's scales inside its buffer (0 for f16).
    pub fn scale_word0(&self, c: &MatrixChunk) -> u32 {
        packed(c.format, c.rows, self.cols).map_or(0, |m| (m.q_bytes() / 4) as u32)
    }

    /// Bytes on the device of `rows` rows of `cols` in `format` (a chunk's buffer).
    pub fn chunk_bytes(format: WeightFormat, rows: usize, cols: usize) -> u64 {
        match format {
            WeightFormat::Q8 => Q8Matrix {
                out: rows,
                inp: cols,
            }
            .bytes() as u64,
            f => match packed(f, rows, cols) {
                Some(m) => (m.q_bytes() + m.scale_bytes()) as u64,
                None => rows as u64 * Self::row_bytes(cols),
            },
        }
    }

    /// Rows per chunk under the storage-binding limit: the most whose buffer fits.
    fn rows_per_chunk(
        dev: &Device,
        label: &str,
        format: WeightFormat,
        cols: usize,
    ) -> Result<usize> {
        let max = dev.max_binding();
        if Self::chunk_bytes(format, 1, cols) > max {
            return Err(Error::DoesNotFit(format!(
                "{label}: one row of {cols} {} values exceeds the adapter's storage binding limit of {max} bytes",
                format.name()
            )));
        }
        // Scale sections are padded to 16 bytes: start from the estimate and step back.
        let mut n = (max / Self::chunk_bytes(format, 1, cols)).max(1) as usize;
        while n > 1 && Self::chunk_bytes(format, n, cols) > max {
            n -= 1;
        }
        // Chunks of a multiple of the rows whose scale sections fill whole 16-byte words,
        // so a split matrix takes the bytes of an unsplit one (admission counts those).
        let step = match format {
            WeightFormat::Q8 => 8,
            f => packed(f, 1, cols).map_or(1, |m| {
                let row = m.halves_per_row() * 2;
                16 / gcd(16, row.max(1))
            }),
        };
        if n >= step {
            n = n / step * step;
        }
        Ok(n)
    }

    /// Upload a matrix of `cols` columns from its row parts, stacked in order: parts of one
    /// form are joined, and each run is split into chunks of whole rows under the binding
    /// limit.
    pub fn upload_rows(
        dev: &Device,
        label: &str,
        cols: usize,
        parts: Vec<DenseRows>,
    ) -> Result<Self> {
        let mut runs: Vec<DenseRows> = Vec::new();
        for p in parts {
            let rest = match runs.last_mut() {
                Some(r) => r.append(p),
                None => Some(p),
            };
            if let Some(p) = rest {
                runs.push(p);
            }
        }
        let mut chunks = Vec::new();
        let mut row0 = 0;
        for run in &runs {
            let (format, rows) = (run.format(), run.rows(cols));
            let per = Self::rows_per_chunk(dev, label, format, cols)?;
            let mut start = 0;
            while start < rows {
                let n = per.min(rows - start);
                chunks.push(MatrixChunk {
                    row_start: row0 + start,
                    rows: n,
                    buffer: dev.upload(label, &run.chunk(cols, start, n), Usage::Storage)?,
                    format,
                });
                start += n;
            }
            row0 += rows;
        }
        Ok(F16Matrix {
            rows: row0,
            cols,
            chunks,
        })
    }

    /// Quantise `data` ([rows, cols], row-major, finite) to Q8_0 and upload it. A block
    /// whose scale overflows f16, or a value that is not finite, is an error naming `label`.
    pub fn upload_q8(
        dev: &Device,
        label: &str,
        rows: usize,
        cols: usize,
        data: &[f32],
    ) -> Result<Self> {
        if data.len() != rows * cols {
            return Err(Error::Other(format!(
                "{label}: {} values for a [{rows}, {cols}] matrix",
                data.len()
            )));
        }
        if let Some((i, v)) = q8_0::first_unstorable(data, cols) {
            return Err(Error::Other(format!(
                "{label}: element [{}, {}] = {v} cannot be stored as Q8_0 (non-finite, or its block's scale max|w|/127 overflows f16)",
                i / cols.max(1),
                i % cols.max(1)
            )));
        }
        Self::upload_rows(
            dev,
            label,
            cols,
            vec![DenseRows::q8_from_values(data, cols)],
        )
    }

    /// Upload ggml's Q8_0 blocks of a [rows, cols] matrix (rows in order, each
    /// ceil(cols/32) blocks of 34 bytes: as a Q8_0 conversion or a GGUF Q8_0 tensor stores
    /// them), split into the packed sections unchanged: the bytes `upload_q8` makes from the
    /// values they were quantised from. The caller checks the scales.
    pub fn upload_q8_ggml(
        dev: &Device,
        label: &str,
        rows: usize,
        cols: usize,
        blocks: &[u8],
    ) -> Result<Self> {
        let row_bytes = cols.div_ceil(q8_0::BLOCK) * q8_0::GGML_BLOCK_BYTES;
        if blocks.len() != rows * row_bytes {
            return Err(Error::Other(format!(
                "{label}: {} bytes of Q8_0 blocks for a [{rows}, {cols}] matrix ({} expected)",
                blocks.len(),
                rows * row_bytes
            )));
        }
        Self::upload_rows(dev, label, cols, vec![DenseRows::Q8(blocks.to_vec())])
    }

    /// Upload affine 4-bit rows (a GGUF Q4_0 matrix's blocks, `Affine4` of [rows, cols])
    /// as affine INT4 (`WeightFormat::Q4A`), in chunks of whole rows: each chunk's
    /// nibbles, then its (scale, offset) pairs. The caller checks the values are finite.
    pub fn upload_q4a(
        dev: &Device,
        label: &str,
        rows: usize,
        cols: usize,
        a: &Affine4,
    ) -> Result<Self> {
        let nb = cols.div_ceil(32);
        if a.nibbles.len() != rows * cols || a.blocks.len() != rows * nb {
            return Err(Error::Other(format!(
                "{label}: {} values in {} blocks for a [{rows}, {cols}] matrix",
                a.nibbles.len(),
                a.blocks.len()
            )));
        }
        let a = Affine4 {
            nibbles: a.nibbles.clone(),
            blocks: a.blocks.clone(),
        };
        Self::upload_rows(dev, label, cols, vec![DenseRows::Affine(a)])
    }

    /// A [rows, cols] matrix of zeros in `format`, chunked as an upload would be (a shape
    /// model: the memory-access report runs the real kernels on it).
    pub fn zeros_in(
        dev: &Device,
        label: &str,
        format: WeightFormat,
        rows: usize,
        cols: usize,
    ) -> Result<Self> {
        Self::zeros_parts(dev, label, cols, &[(format, rows)])
    }

    /// Zeros of row parts `(format, rows)` stacked in order, chunked as `upload_rows` would
    /// (parts of one format joined).
    pub fn zeros_parts(
        dev: &Device,
        label: &str,
        cols: usize,
        parts: &[(WeightFormat, usize)],
    ) -> Result<Self> {
        let mut runs: Vec<(WeightFormat, usize)> = Vec::new();
        for &(f, n) in parts {
            match runs.last_mut() {
                Some(r) if r.0 == f => r.1 += n,
                _ => runs.push((f, n)),
            }
        }
        let mut chunks = Vec::new();
        let mut row0 = 0;
        for (format, rows) in runs {
            let per = Self::rows_per_chunk(dev, label, format, cols)?;
            let mut start = 0;
            while start < rows {
                let n = per.min(rows - start);
                chunks.push(MatrixChunk {
                    row_start: row0 + start,
                    rows: n,
                    buffer: dev.alloc(label, Self::chunk_bytes(format, n, cols), Usage::Storage)?,
                    format,
                });
                start += n;
            }
            row0 += rows;
        }
        Ok(F16Matrix {
            rows: row0,
            cols,
            chunks,
        })
    }

    /// A [rows, cols] matrix of zeros, chunked as an upload would be (a shape model: the
    /// memory-access report runs the real kernels on it).
    pub fn zeros(dev: &Device, label: &str, rows: usize, cols: usize) -> Result<Self> {
        Self::zeros_in(dev, label, WeightFormat::F16, rows, cols)
    }

    /// Upload `data` ([rows, cols], row-major).
    pub fn upload(
        dev: &Device,
        label: &str,
        rows: usize,
        cols: usize,
        data: &[f16],
    ) -> Result<Self> {
        if data.len() != rows * cols {
            return Err(Error::Other(format!(
                "{label}: {} values for a [{rows}, {cols}] matrix",
                data.len()
            )));
        }
        Self::upload_rows(dev, label, cols, vec![DenseRows::F16(data.to_vec())])
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// A vector of f16 values (norm weights), padded to 8.
pub fn upload_f16_vec(dev: &Device, label: &str, data: &[f16]) -> Result<Buffer> {
    let mut v = data.to_vec();
    v.resize(pad8(v.len().max(1)), f16::ZERO);
    dev.upload(label, bytemuck::cast_slice(&v), Usage::Storage)
}

pub fn upload_f32_vec(dev: &Device, label: &str, data: &[f32]) -> Result<Buffer> {
    dev.upload(label, bytemuck::cast_slice(data), Usage::Storage)
}

/// Storage buffers for `slots` slots of `slot_bytes` each, as many slots per buffer as
/// the storage-binding limit allows (one buffer per binding). Returns (slots per chunk,
/// chunks).
fn slot_chunks(
    dev: &Device,
    label: &str,
    what: &str,
    slots: usize,
    slot_bytes: u64,
) -> Result<(usize, Vec<Buffer>)> {
    let per_chunk = (dev.max_binding() / slot_bytes) as usize;
    if per_chunk == 0 {
        return Err(Error::DoesNotFit(format!(
            "{label}: {what} of {slot_bytes} bytes exceeds the adapter's storage binding limit of {} bytes",
            dev.max_binding()
        )));
    }
    let per_chunk = per_chunk.min(slots.max(1));
    let mut chunks = Vec::new();
    let mut left = slots;
    while left > 0 {
        let n = per_chunk.min(left);
        chunks.push(dev.alloc(label, n as u64 * slot_bytes, Usage::Storage)?);
        left -= n;
    }
    Ok((per_chunk, chunks))
}

/// Slots of SwiGLU experts with f16 weights. A slot holds gate [I][Hp], up [I][Hp] and
/// down [H][Ip] (Hp, Ip padded to 8); slots are grouped into chunks of one binding each.
pub struct ExpertPool {
    pub hidden: usize,
    pub inter: usize,
    pub slots: usize,
    pub slots_per_chunk: usize,
    pub chunks: Vec<Buffer>,
}

impl ExpertPool {
    pub fn slot_bytes(hidden: usize, inter: usize) -> u64 {
        (2 * inter * pad8(hidden) + hidden * pad8(inter)) as u64 * 2
    }

    pub fn new(
        dev: &Device,
        label: &str,
        slots: usize,
        hidden: usize,
        inter: usize,
    ) -> Result<Self> {
        let what = format!("one expert (hidden {hidden}, intermediate {inter})");
        let (slots_per_chunk, chunks) =
            slot_chunks(dev, label, &what, slots, Self::slot_bytes(hidden, inter))?;
        Ok(ExpertPool {
            hidden,
            inter,
            slots,
            slots_per_chunk,
            chunks,
        })
    }

    pub fn in_vec4(&self) -> u32 {
        (pad8(self.hidden) / 8) as u32
    }
    pub fn down_vec4(&self) -> u32 {
        (pad8(self.inter) / 8) as u32
    }
    pub fn slot_vec4(&self) -> u32 {
        (Self::slot_bytes(self.hidden, self.inter) / 16) as u32
    }

    /// (first slot, slot count) of chunk `ci`.
    pub fn chunk_slots(&self, ci: usize) -> (usize, usize) {
        let first = ci * self.slots_per_chunk;
        (first, self.slots_per_chunk.min(self.slots - first))
    }

    /// Write one expert: gate, up [inter, hidden] and down [hidden, inter], row-major.
    pub fn write_slot(
        &self,
        dev: &Device,
        slot: usize,
        gate: &[f16],
        up: &[f16],
        down: &[f16],
    ) -> Result<()> {
        let (h, i) = (self.hidden, self.inter);
        let mut v = Vec::with_capacity((Self::slot_bytes(h, i) / 2) as usize);
        push_padded_rows(&mut v, gate, i, h);
        push_padded_rows(&mut v, up, i, h);
        push_padded_rows(&mut v, down, h, i);
        let chunk = slot / self.slots_per_chunk;
        let off = (slot % self.slots_per_chunk) as u64 * Self::slot_bytes(h, i);
        dev.write(&self.chunks[chunk], off, bytemuck::cast_slice(&v))
    }
}

/// Slots of INT4 experts in the packed layout of [`Q4SlotLayout`], grouped into chunks of
/// one storage binding each. Bytes arrive already packed (from the host source or a
/// converted file) and are copied as they are: nothing is expanded.
pub struct Q4Pool {
    pub layout: Q4SlotLayout,
    pub slots: usize,
    pub slots_per_chunk: usize,
    pub chunks: Vec<Buffer>,
}

impl Q4Pool {
    pub fn new(dev: &Device, label: &str, slots: usize, layout: Q4SlotLayout) -> Result<Self> {
        let (slots_per_chunk, chunks) =
            slot_chunks(dev, label, "one INT4 expert", slots, layout.bytes as u64)?;
        Ok(Q4Pool {
            layout,
            slots,
            slots_per_chunk,
            chunks,
        })
    }

    pub fn slot_vec4(&self) -> u32 {
        (self.layout.bytes / 16) as u32
    }

    /// (first slot, slot count) of chunk `ci`.
    pub fn chunk_slots(&self, ci: usize) -> (usize, usize) {
        let first = ci * self.slots_per_chunk;
        (first, self.slots_per_chunk.min(self.slots - first))
    }

    /// (chunk, byte offset) of a slot.
    pub fn locate(&self, slot: usize) -> (usize, u64) {
        (
            slot / self.slots_per_chunk,
            (slot % self.slots_per_chunk) as u64 * self.layout.bytes as u64,
        )
    }

    pub fn write_slot(&self, dev: &Device, slot: usize, bytes: &[u8]) -> Result<()> {
        let (c, off) = self.locate(slot);
        dev.write(&self.chunks[c], off, bytes)
    }
}

/// Routed experts on the device, in the precision they are computed in.
pub enum ExpertStore {
    F16(ExpertPool),
    Int4(Q4Pool),
    /// No device slots: every routed expert is computed on the CPU from the host source.
    Host,
}

impl ExpertStore {
    pub fn chunks(&self) -> usize {
        match self {
            ExpertStore::F16(p) => p.chunks.len(),
            ExpertStore::Int4(p) => p.chunks.len(),
            ExpertStore::Host => 0,
        }
    }

    /// Device slots.
    pub fn slots(&self) -> usize {
        match self {
            ExpertStore::F16(p) => p.slots,
            ExpertStore::Int4(p) => p.slots,
            ExpertStore::Host => 0,
        }
    }
}

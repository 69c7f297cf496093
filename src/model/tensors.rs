//! Weights on the device: f16 matrices split by rows under the storage-binding limit, and
//! pools of expert slots (f16 SwiGLU experts, packed INT4 experts). Rows are padded to a
//! multiple of 8 halves (16 bytes) so kernels read them as vec4<u32>.

use half::f16;

use crate::backend::kernel::WeightFormat;
use crate::backend::{Buffer, Device, Usage};
use crate::error::{Error, Result};
use crate::format::q8_0::{self, Q8Matrix};
use crate::format::quant::{Affine4, Q4Kind, Q4Matrix, Q4SlotLayout};

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
}

/// A dense [rows, cols] matrix, row-major, split into chunks of whole rows: f16 (rows
/// padded to 8 halves), Q8_0 (`format/q8_0.rs`: each chunk's quants, then its scales), or
/// affine INT4 (a GGUF file's Q4_0/Q4_K blocks: each chunk's nibbles, then its pairs).
pub struct F16Matrix {
    pub rows: usize,
    pub cols: usize,
    pub chunks: Vec<MatrixChunk>,
    pub format: WeightFormat,
}

impl F16Matrix {
    pub fn row_bytes(cols: usize) -> u64 {
        pad8(cols) as u64 * 2
    }

    /// 16-byte words per row.
    pub fn vec4_per_row(&self) -> u32 {
        match self.format {
            WeightFormat::Q8 => self.q8(1).vec4_per_row() as u32,
            WeightFormat::Q4A => Self::q4a(1, self.cols).vec4_per_row() as u32,
            _ => (pad8(self.cols) / 8) as u32,
        }
    }

    /// f16 scale-section values per row (0 for f16).
    pub fn blocks_per_row(&self) -> u32 {
        match self.format {
            WeightFormat::Q8 => self.q8(1).blocks() as u32,
            WeightFormat::Q4A => Self::q4a(1, self.cols).halves_per_row() as u32,
            _ => 0,
        }
    }

    /// The u32 offset of a chunk's scales inside its buffer (0 for f16).
    pub fn scale_word0(&self, c: &MatrixChunk) -> u32 {
        match self.format {
            WeightFormat::Q8 => (self.q8(c.rows).q_bytes() / 4) as u32,
            WeightFormat::Q4A => (Self::q4a(c.rows, self.cols).q_bytes() / 4) as u32,
            _ => 0,
        }
    }

    /// The affine INT4 layout of `rows` rows (a chunk): nibbles, then (scale, offset) pairs.
    fn q4a(rows: usize, cols: usize) -> Q4Matrix {
        Q4Matrix {
            out: rows,
            inp: cols,
            kind: Q4Kind::Affine32,
        }
    }

    fn q8(&self, rows: usize) -> Q8Matrix {
        Q8Matrix {
            out: rows,
            inp: self.cols,
        }
    }

    /// Bytes on the device of `rows` rows of `cols` in `format` (a chunk's buffer).
    pub fn chunk_bytes(format: WeightFormat, rows: usize, cols: usize) -> u64 {
        match format {
            WeightFormat::Q8 => Q8Matrix {
                out: rows,
                inp: cols,
            }
            .bytes() as u64,
            WeightFormat::Q4A => {
                let m = Self::q4a(rows, cols);
                (m.q_bytes() + m.scale_bytes()) as u64
            }
            _ => rows as u64 * Self::row_bytes(cols),
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
        // Q8_0's scale section is padded to 16 bytes: start from the estimate and step back.
        let mut n = (max / Self::chunk_bytes(format, 1, cols)).max(1) as usize;
        while n > 1 && Self::chunk_bytes(format, n, cols) > max {
            n -= 1;
        }
        // Q8_0 chunks of a multiple of 8 rows: each full chunk's scales fill whole 16-byte
        // words, so a split matrix takes the bytes of an unsplit one (admission counts those).
        if format == WeightFormat::Q8 && n >= 8 {
            n = n / 8 * 8;
        }
        // Affine INT4 likewise: 4 rows of (scale, offset) pairs fill whole 16-byte words.
        if format == WeightFormat::Q4A && n >= 4 {
            n = n / 4 * 4;
        }
        Ok(n)
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
        Self::upload_q8_chunks(dev, label, rows, cols, |m, start, q, s| {
            m.pack(&data[start * cols..(start + m.out) * cols], q, s)
        })
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
        Self::upload_q8_chunks(dev, label, rows, cols, |m, start, q, s| {
            m.from_ggml(
                &blocks[start * row_bytes..(start + m.out) * row_bytes],
                q,
                s,
            )
        })
    }

    /// A Q8_0 matrix in chunks of whole rows under the binding limit, each chunk's packed
    /// sections (quants, then scales) filled by `fill(chunk layout, first row, q, s)`.
    fn upload_q8_chunks(
        dev: &Device,
        label: &str,
        rows: usize,
        cols: usize,
        fill: impl Fn(Q8Matrix, usize, &mut [u8], &mut [u8]),
    ) -> Result<Self> {
        Self::upload_chunks(dev, label, WeightFormat::Q8, rows, cols, |start, n| {
            let m = Q8Matrix { out: n, inp: cols };
            let mut bytes = vec![0u8; m.bytes()];
            let (q, s) = bytes.split_at_mut(m.q_bytes());
            fill(m, start, q, s);
            bytes
        })
    }

    /// A matrix of `format` in chunks of whole rows under the binding limit, each chunk's
    /// buffer the bytes `chunk(first row, rows)` makes.
    fn upload_chunks(
        dev: &Device,
        label: &str,
        format: WeightFormat,
        rows: usize,
        cols: usize,
        chunk: impl Fn(usize, usize) -> Vec<u8>,
    ) -> Result<Self> {
        let per = Self::rows_per_chunk(dev, label, format, cols)?;
        let mut chunks = Vec::new();
        let mut start = 0;
        while start < rows {
            let n = per.min(rows - start);
            chunks.push(MatrixChunk {
                row_start: start,
                rows: n,
                buffer: dev.upload(label, &chunk(start, n), Usage::Storage)?,
            });
            start += n;
        }
        Ok(F16Matrix {
            rows,
            cols,
            chunks,
            format,
        })
    }

    /// Upload affine 4-bit rows (a GGUF Q4_0/Q4_K matrix's blocks, `Affine4` of [rows,
    /// cols]) as affine INT4 (`WeightFormat::Q4A`), in chunks of whole rows: each chunk's
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
        Self::upload_chunks(dev, label, WeightFormat::Q4A, rows, cols, |start, n| {
            let m = Self::q4a(n, cols);
            let part = Affine4 {
                nibbles: a.nibbles[start * cols..(start + n) * cols].to_vec(),
                blocks: a.blocks[start * nb..(start + n) * nb].to_vec(),
            };
            let mut bytes = vec![0u8; m.q_bytes() + m.scale_bytes()];
            let (q, s) = bytes.split_at_mut(m.q_bytes());
            m.pack_affine(&part, q, s);
            bytes
        })
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
        let per = Self::rows_per_chunk(dev, label, format, cols)?;
        let mut chunks = Vec::new();
        let mut start = 0;
        while start < rows {
            let n = per.min(rows - start);
            chunks.push(MatrixChunk {
                row_start: start,
                rows: n,
                buffer: dev.alloc(label, Self::chunk_bytes(format, n, cols), Usage::Storage)?,
            });
            start += n;
        }
        Ok(F16Matrix {
            rows,
            cols,
            chunks,
            format,
        })
    }

    /// A [rows, cols] matrix of zeros, chunked as an upload would be (a shape model: the
    /// memory-access report runs the real kernels on it).
    pub fn zeros(dev: &Device, label: &str, rows: usize, cols: usize) -> Result<Self> {
        let row_bytes = Self::row_bytes(cols);
        let max_rows = (dev.max_binding() / row_bytes) as usize;
        if max_rows == 0 {
            return Err(Error::DoesNotFit(format!(
                "{label}: one row of {cols} f16 values exceeds the adapter's storage binding limit of {} bytes",
                dev.max_binding()
            )));
        }
        let mut chunks = Vec::new();
        let mut start = 0;
        while start < rows {
            let n = max_rows.min(rows - start);
            chunks.push(MatrixChunk {
                row_start: start,
                rows: n,
                buffer: dev.alloc(label, n as u64 * row_bytes, Usage::Storage)?,
            });
            start += n;
        }
        Ok(F16Matrix {
            rows,
            cols,
            chunks,
            format: WeightFormat::F16,
        })
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
        let row_bytes = Self::row_bytes(cols);
        let max_rows = (dev.max_binding() / row_bytes) as usize;
        if max_rows == 0 {
            return Err(Error::DoesNotFit(format!(
                "{label}: one row of {cols} f16 values exceeds the adapter's storage binding limit of {} bytes",
                dev.max_binding()
            )));
        }
        let mut chunks = Vec::new();
        let mut start = 0;
        while start < rows {
            let n = max_rows.min(rows - start);
            let mut padded = Vec::new();
            push_padded_rows(
                &mut padded,
                &data[start * cols..(start + n) * cols],
                n,
                cols,
            );
            let buffer = dev.upload(label, bytemuck::cast_slice(&padded), Usage::Storage)?;
            chunks.push(MatrixChunk {
                row_start: start,
                rows: n,
                buffer,
            });
            start += n;
        }
        Ok(F16Matrix {
            rows,
            cols,
            chunks,
            format: WeightFormat::F16,
        })
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

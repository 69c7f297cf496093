//! The SwiGLU blocks that are not routed: Qwen's shared expert and the dense MLP layers, one
//! slot each, f16 (a one-slot `ExpertPool`, served by the expert kernels as a fixed slot),
//! Q8_0 (one buffer of three Q8_0 matrices, served by the GPU-shaped expert kernels), or a
//! GGUF file's own blocks (a one-slot `Q4Pool` of its kinds, served by the same kernels).

use crate::backend::kernel::WeightFormat;
use crate::backend::{Buffer, Device, Usage};
use crate::blocks::q8_0::{self, Q8Matrix};
use crate::blocks::quant::{Q4SlotLayout, SlotKinds};
use crate::error::{Error, Result};
use crate::model::slot_mats::SlotMats;
use crate::model::tensors::{ExpertPool, Q4Pool};

/// A shared expert or dense MLP on the device.
pub enum DenseMlp {
    F16(ExpertPool),
    Q8(Q8Mlp),
    /// A GGUF file's blocks as they are (gate/up and down each in its kind).
    Blocks(Q4Pool),
}

impl DenseMlp {
    pub fn inter(&self) -> usize {
        match self {
            DenseMlp::F16(p) => p.inter,
            DenseMlp::Q8(q) => q.inter,
            DenseMlp::Blocks(p) => p.layout.inter,
        }
    }

    /// The block as one fixed slot for the GPU-shaped expert kernels (None: f16, served
    /// by the f16 expert pool's own path).
    pub fn mats(&self) -> Option<SlotMats> {
        match self {
            DenseMlp::F16(_) => None,
            DenseMlp::Q8(q) => Some(q.mats()),
            DenseMlp::Blocks(p) => Some(SlotMats::q4(p)),
        }
    }

    /// Bytes on the device of a block of `hidden` x `inter` in `format`.
    pub fn bytes(format: WeightFormat, hidden: usize, inter: usize) -> u64 {
        match format {
            WeightFormat::Q8 => Q8Layout::new(hidden, inter).bytes as u64,
            _ => ExpertPool::slot_bytes(hidden, inter),
        }
    }

    /// A block of zeros (a shape model for the memory-access report); `kinds`: a GGUF
    /// file's blocks, as the loader holds them with quantised dense weights.
    pub fn zeros(
        dev: &Device,
        label: &str,
        format: WeightFormat,
        (hidden, inter): (usize, usize),
        kinds: Option<SlotKinds>,
    ) -> Result<Self> {
        if let (WeightFormat::Q8, Some(k)) = (format, kinds) {
            let layout = Q4SlotLayout::mixed(hidden, inter, k.gate_up, k.down);
            return Ok(DenseMlp::Blocks(Q4Pool::new(dev, label, 1, layout)?));
        }
        Ok(match format {
            WeightFormat::Q8 => {
                let layout = Q8Layout::new(hidden, inter);
                DenseMlp::Q8(Q8Mlp {
                    hidden,
                    inter,
                    layout,
                    buffer: alloc_checked(dev, label, layout.bytes as u64, |d| {
                        d.alloc(label, layout.bytes as u64, Usage::Storage)
                    })?,
                })
            }
            _ => DenseMlp::F16(ExpertPool::new(dev, label, 1, hidden, inter)?),
        })
    }
}

fn alloc_checked(
    dev: &Device,
    label: &str,
    bytes: u64,
    f: impl FnOnce(&Device) -> Result<Buffer>,
) -> Result<Buffer> {
    if bytes > dev.max_binding() {
        return Err(Error::DoesNotFit(format!(
            "{label}: {bytes} bytes of Q8_0 weights exceed the adapter's storage binding limit of {} bytes",
            dev.max_binding()
        )));
    }
    f(dev)
}

/// Byte offsets of the sections of a Q8_0 SwiGLU block: the quants of gate [I, H], up
/// [I, H] and down [H, I], then their scales, each section on 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q8Layout {
    pub hidden: usize,
    pub inter: usize,
    pub gate_q: usize,
    pub up_q: usize,
    pub down_q: usize,
    pub gate_s: usize,
    pub up_s: usize,
    pub down_s: usize,
    pub bytes: usize,
}

impl Q8Layout {
    pub fn new(hidden: usize, inter: usize) -> Self {
        let gu = Q8Matrix {
            out: inter,
            inp: hidden,
        };
        let d = Q8Matrix {
            out: hidden,
            inp: inter,
        };
        let gate_q = 0;
        let up_q = gate_q + gu.q_bytes();
        let down_q = up_q + gu.q_bytes();
        let gate_s = down_q + d.q_bytes();
        let up_s = gate_s + gu.scale_bytes();
        let down_s = up_s + gu.scale_bytes();
        let bytes = down_s + d.scale_bytes();
        Q8Layout {
            hidden,
            inter,
            gate_q,
            up_q,
            down_q,
            gate_s,
            up_s,
            down_s,
            bytes,
        }
    }

    /// Quantise gate, up [I, H] and down [H, I] (row-major, f32) into one block.
    pub fn pack(&self, gate: &[f32], up: &[f32], down: &[f32]) -> Vec<u8> {
        let (h, i) = (self.hidden, self.inter);
        let gu = Q8Matrix { out: i, inp: h };
        let d = Q8Matrix { out: h, inp: i };
        let mut b = vec![0u8; self.bytes];
        for (m, w, q, s) in [
            (gu, gate, self.gate_q, self.gate_s),
            (gu, up, self.up_q, self.up_s),
            (d, down, self.down_q, self.down_s),
        ] {
            let (head, tail) = b.split_at_mut(s);
            m.pack(
                w,
                &mut head[q..q + m.q_bytes()],
                &mut tail[..m.scale_bytes()],
            );
        }
        b
    }

    /// The block from ggml's Q8_0 blocks of gate, up and down (rows in order): the bytes
    /// `pack` gives from the values they were quantised from.
    pub fn from_ggml(&self, [gate, up, down]: [&[u8]; 3]) -> Vec<u8> {
        let (h, i) = (self.hidden, self.inter);
        let gu = Q8Matrix { out: i, inp: h };
        let d = Q8Matrix { out: h, inp: i };
        let mut b = vec![0u8; self.bytes];
        for (m, blocks, q, s) in [
            (gu, gate, self.gate_q, self.gate_s),
            (gu, up, self.up_q, self.up_s),
            (d, down, self.down_q, self.down_s),
        ] {
            let (head, tail) = b.split_at_mut(s);
            m.from_ggml(
                blocks,
                &mut head[q..q + m.q_bytes()],
                &mut tail[..m.scale_bytes()],
            );
        }
        b
    }
}

/// A Q8_0 SwiGLU block on the device.
pub struct Q8Mlp {
    pub hidden: usize,
    pub inter: usize,
    pub layout: Q8Layout,
    pub buffer: Buffer,
}

impl Q8Mlp {
    /// Quantise and upload; `names` (gate, up, down) name the tensors in errors.
    pub fn upload(
        dev: &Device,
        label: &str,
        names: [&str; 3],
        (hidden, inter): (usize, usize),
        [gate, up, down]: [&[f32]; 3],
    ) -> Result<Self> {
        for (name, w, cols) in [
            (names[0], gate, hidden),
            (names[1], up, hidden),
            (names[2], down, inter),
        ] {
            if let Some((i, x)) = q8_0::first_unstorable(w, cols) {
                return Err(Error::Other(format!(
                    "{name}: element [{}, {}] = {x} cannot be stored as Q8_0 (a block's scale max|w|/127 must be a finite f16)",
                    i / cols.max(1),
                    i % cols.max(1)
                )));
            }
        }
        let layout = Q8Layout::new(hidden, inter);
        let bytes = layout.pack(gate, up, down);
        let buffer = alloc_checked(dev, label, bytes.len() as u64, |d| {
            d.upload(label, &bytes, Usage::Storage)
        })?;
        Ok(Q8Mlp {
            hidden,
            inter,
            layout,
            buffer,
        })
    }

    /// Upload gate, up [I, H] and down [H, I] from ggml's Q8_0 blocks (a Q8_0 conversion's
    /// stored bytes; the caller checks their shapes and scales), split into the block's
    /// sections unchanged.
    pub fn upload_ggml(
        dev: &Device,
        label: &str,
        (hidden, inter): (usize, usize),
        blocks: [&[u8]; 3],
    ) -> Result<Self> {
        let layout = Q8Layout::new(hidden, inter);
        let bytes = layout.from_ggml(blocks);
        let buffer = alloc_checked(dev, label, bytes.len() as u64, |d| {
            d.upload(label, &bytes, Usage::Storage)
        })?;
        Ok(Q8Mlp {
            hidden,
            inter,
            layout,
            buffer,
        })
    }

    /// The block as one fixed slot for the GPU-shaped expert kernels.
    pub fn mats(&self) -> SlotMats {
        let l = &self.layout;
        let gu = Q8Matrix {
            out: l.inter,
            inp: l.hidden,
        };
        let d = Q8Matrix {
            out: l.hidden,
            inp: l.inter,
        };
        SlotMats {
            format: WeightFormat::Q8,
            down_format: WeightFormat::Q8,
            inter: l.inter,
            slot_words: (l.bytes / 16) as u32,
            gate_w: (l.gate_q / 16) as u32,
            up_w: (l.up_q / 16) as u32,
            down_w: (l.down_q / 16) as u32,
            gate_s: (l.gate_s / 4) as u32,
            up_s: (l.up_s / 4) as u32,
            down_s: (l.down_s / 4) as u32,
            in_words: gu.vec4_per_row() as u32,
            down_words: d.vec4_per_row() as u32,
            in_blocks: gu.blocks() as u32,
            down_blocks: d.blocks() as u32,
            chunks: vec![(0, 1, self.buffer.clone())],
        }
    }
}

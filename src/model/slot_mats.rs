//! Where the matrices of an expert lie inside a pool slot, for the GPU-shaped row kernels.

use crate::backend::kernel::WeightFormat;
use crate::backend::Buffer;
use crate::model::tensors::{ExpertPool, ExpertStore, Q4Pool};

/// Where the three matrices of an expert lie inside a pool slot, in 16-byte words (and
/// u32 words for scales), for the GPU-shaped row kernels; and the pool's chunks.
pub struct SlotMats {
    /// The format of gate/up, and of down (a GGUF slot may hold a Q8_0 down beside affine
    /// INT4 gate/up).
    pub format: WeightFormat,
    pub down_format: WeightFormat,
    pub inter: usize,
    pub slot_words: u32,
    pub gate_w: u32,
    pub up_w: u32,
    pub down_w: u32,
    pub gate_s: u32,
    pub up_s: u32,
    pub down_s: u32,
    /// Words (and f16 scale-section values) per gate/up row and per down row.
    pub in_words: u32,
    pub down_words: u32,
    pub in_blocks: u32,
    pub down_blocks: u32,
    /// (first slot, slots, buffer) of each chunk.
    pub chunks: Vec<(usize, usize, Buffer)>,
}

impl SlotMats {
    /// The pool's matrices (None: no device pool, the CPU computes the experts).
    pub fn of(store: &ExpertStore) -> Option<SlotMats> {
        match store {
            ExpertStore::F16(p) => Some(SlotMats::f16(p)),
            ExpertStore::Int4(p) => Some(SlotMats::q4(p)),
            ExpertStore::Host => None,
        }
    }

    /// f16 slots: gate [I][Hp], up [I][Hp], down [H][Ip], rows padded to 8 halves.
    pub fn f16(p: &ExpertPool) -> SlotMats {
        let (iw, dw) = (p.in_vec4(), p.down_vec4());
        let inter = p.inter as u32;
        SlotMats {
            format: WeightFormat::F16,
            down_format: WeightFormat::F16,
            inter: p.inter,
            slot_words: p.slot_vec4(),
            gate_w: 0,
            up_w: inter * iw,
            down_w: 2 * inter * iw,
            gate_s: 0,
            up_s: 0,
            down_s: 0,
            in_words: iw,
            down_words: dw,
            in_blocks: 0,
            down_blocks: 0,
            chunks: p
                .chunks
                .iter()
                .enumerate()
                .map(|(ci, b)| {
                    let (first, n) = p.chunk_slots(ci);
                    (first, n, b.clone())
                })
                .collect(),
        }
    }

    /// INT4 slots (`Q4SlotLayout`): nibble sections, then scale sections.
    pub fn q4(p: &Q4Pool) -> SlotMats {
        let l = &p.layout;
        SlotMats {
            format: WeightFormat::int4(l.gate.kind),
            down_format: WeightFormat::int4(l.down.kind),
            inter: l.inter,
            slot_words: p.slot_vec4(),
            gate_w: (l.gate_q / 16) as u32,
            up_w: (l.up_q / 16) as u32,
            down_w: (l.down_q / 16) as u32,
            gate_s: (l.gate_s / 4) as u32,
            up_s: (l.up_s / 4) as u32,
            down_s: (l.down_s / 4) as u32,
            in_words: l.gate.vec4_per_row() as u32,
            down_words: l.down.vec4_per_row() as u32,
            in_blocks: l.gate.halves_per_row() as u32,
            down_blocks: l.down.halves_per_row() as u32,
            chunks: p
                .chunks
                .iter()
                .enumerate()
                .map(|(ci, b)| {
                    let (first, n) = p.chunk_slots(ci);
                    (first, n, b.clone())
                })
                .collect(),
        }
    }
}

//! Deterministic random weights: one stream per tensor (per expert) and piece, keyed by
//! seed and name, whatever the number of threads.

use half::{bf16, f16};

use super::{int4_scale_for_std, WEIGHT_STD};
use crate::blocks::quant::{Q4Matrix, Q4SlotLayout};
use crate::error::Result;

#[inline]
pub(super) fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of one stream: (model seed, tensor name, piece index).
pub(super) fn stream_seed(seed: u64, name: &str, piece: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name.as_bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut s = seed ^ h.rotate_left(17) ^ piece.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    splitmix(&mut s)
}

/// The scale of flat element `i` of a tensor with rows of `row_len` elements.
#[derive(Clone, Copy)]
pub(super) struct RowScales<'a> {
    pub scales: &'a [f32],
    pub row_len: usize,
}

impl RowScales<'_> {
    #[inline]
    pub fn at(&self, i: usize) -> f32 {
        self.scales
            .get(i / self.row_len.max(1))
            .copied()
            .unwrap_or(1.0)
    }
}

/// Approximately normal (Irwin-Hall with four 16-bit uniforms from one draw), std `std`.
#[inline]
pub(super) fn normalish(state: &mut u64, std: f32) -> f32 {
    let r = splitmix(state);
    let sum = (r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48);
    // Mean 4 * 65535 / 2; std of the sum 65536 * sqrt(4 / 12).
    (sum as f32 - 131_070.0) * (std / 37_837.9)
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Init {
    Ones,
    Normal(f32),
}

pub(super) fn init_for(name: &str) -> Init {
    if name.ends_with("norm.weight") {
        Init::Ones
    } else {
        Init::Normal(WEIGHT_STD)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Float {
    F16,
    BF16,
}

/// Elements per independently seeded piece of a tensor.
pub(super) const PIECE: usize = 1 << 18;

pub(super) fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 16)
}

/// Generate `n` values of tensor `name` piece by piece (several pieces in parallel) and
/// hand each group of pieces' little-endian bytes to `sink` in order. `rows`: a scale per
/// row (`--router-skew`), applied to the drawn values.
pub(super) fn generate_float(
    seed: u64,
    name: &str,
    n: usize,
    fmt: Float,
    rows: Option<RowScales>,
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
                    let first = piece as usize * PIECE;
                    for (j, b) in part.chunks_exact_mut(2).enumerate() {
                        let mut x = match init {
                            Init::Ones => 1.0,
                            Init::Normal(std) => normalish(&mut st, std),
                        };
                        if let Some(r) = rows {
                            x *= r.at(first + j);
                        }
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
pub(super) fn fill_q4_matrix(m: Q4Matrix, st: &mut u64, q: &mut [u8], s: &mut [u8], scale: f32) {
    for word in q.chunks_mut(4) {
        let r = splitmix(st);
        for (i, b) in word.iter_mut().enumerate() {
            let lo = 1 + ((((r >> (16 * i)) & 0xff) as u32 * 15) >> 8) as u8;
            let hi = 1 + ((((r >> (16 * i + 8)) & 0xff) as u32 * 15) >> 8) as u8;
            *b = lo | (hi << 4);
        }
    }
    let nv = m.vec4_per_row();
    if !m.inp.is_multiple_of(32) {
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

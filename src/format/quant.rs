//! INT4 routed experts: the block-256 quantiser and the packed layout the W4A16 kernels
//! read.
//!
//! Quantiser (the reference rule, mirrored by tools/make_fixtures.py with torch): for each
//! row of an [out, in] weight, blocks of 256 consecutive weights along `in` (the last block
//! of a row may be partial):
//!   scale = f16(max|w| / 7)                  (computed in f32 from the bf16 weight)
//!   q     = clamp(round(w / f32(scale)), -8, 7), round half to even (as torch.round)
//!   q     = 0 where scale == 0
//!   w'    = q * scale
//! stored as the nibble q + 8.
//!
//! Packed matrix (one [out, in] weight), row-major:
//! - nibbles: each row padded to a multiple of 32 columns (one vec4<u32>); vec4 `c` of row
//!   `n` is at index `n * ceil(in/32) + c`. The kernels give a row to 8 lanes, lane l taking
//!   vec4 l of every 256-column block, so the 8 lanes of a row read 128 contiguous bytes
//!   (coalesced on a GPU; on llvmpipe, whose lanes are SIMD, adjacent loads instead of
//!   gathers), and each lane's vec4 lies in exactly one block: one scale per vec4.
//!   Word j of vec4 c covers columns 32c + 8j .. 32c + 8j + 7: byte i holds column
//!   8j + i in its low nibble and column 8j + 4 + i in its high nibble, so one mask and one
//!   `unpack4xU8` give four consecutive columns. Padding nibbles are 8 (q = 0).
//! - scales: f16, row-major `[out][ceil(in/256)]`.
//!
//! Bits per weight: 4 + 16/256 = 4.0625, plus the padding to 32 columns and 16 bytes.
//!
//! An INT4 expert slot is gate [I, H], up [I, H], down [H, I]: the three nibble sections,
//! then the three scale sections, each starting on 16 bytes.

use half::f16;

pub const BLOCK: usize = 256;
/// Columns per vec4<u32> of nibbles.
pub const COLS_PER_VEC4: usize = 32;

/// Reference quantiser for one row: nibbles (q + 8, one per byte) and one scale per block.
pub fn quantize_row(w: &[f32]) -> (Vec<u8>, Vec<f16>) {
    let mut q = Vec::with_capacity(w.len());
    let mut scales = Vec::with_capacity(w.len().div_ceil(BLOCK));
    for block in w.chunks(BLOCK) {
        let amax = block.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
        let scale = f16::from_f32(amax / 7.0);
        let s = scale.to_f32();
        scales.push(scale);
        for &x in block {
            let v = if s == 0.0 {
                0.0
            } else {
                (x / s).round_ties_even().clamp(-8.0, 7.0)
            };
            q.push((v as i32 + 8) as u8);
        }
    }
    (q, scales)
}

/// The largest magnitude an INT4 block can hold: its f16 scale max|w| / 7 must be finite.
pub const MAX_ABS: f32 = 65504.0 * 7.0;

/// The first element of `w` (rows of `inp` values, finite) whose block's scale
/// `f16(max|w| / 7)` would overflow f16, and its value: such a block cannot be stored.
pub fn first_unscalable(w: &[f32], inp: usize) -> Option<(usize, f32)> {
    first_oversized_block(w, inp, BLOCK, 7.0)
}

/// The first element of `w` (rows of `inp` values, in blocks of `block` along each row)
/// whose block's scale `f16(max|w| / qmax)` would overflow f16, and its value: the
/// element of largest magnitude in the first such block. INT4 and Q8_0 share it.
pub fn first_oversized_block(
    w: &[f32],
    inp: usize,
    block: usize,
    qmax: f32,
) -> Option<(usize, f32)> {
    if inp == 0 {
        return None;
    }
    for (r, row) in w.chunks(inp).enumerate() {
        for (b, blk) in row.chunks(block).enumerate() {
            let amax = blk.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
            if !f16::from_f32(amax / qmax).is_finite() {
                let k = blk.iter().position(|x| x.abs() == amax).unwrap_or(0);
                return Some((r * inp + b * block + k, blk[k]));
            }
        }
    }
    None
}

/// Byte layout of one packed [out, in] matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q4Matrix {
    pub out: usize,
    pub inp: usize,
}

impl Q4Matrix {
    pub fn vec4_per_row(&self) -> usize {
        self.inp.div_ceil(COLS_PER_VEC4)
    }
    pub fn blocks(&self) -> usize {
        self.inp.div_ceil(BLOCK)
    }
    pub fn q_bytes(&self) -> usize {
        self.vec4_per_row() * self.out * 16
    }
    pub fn scale_bytes(&self) -> usize {
        (self.blocks() * self.out * 2).div_ceil(16) * 16
    }

    /// Quantise `w` ([out, in], row-major) into `q_out` (q_bytes) and `s_out` (scale_bytes).
    pub fn pack(&self, w: &[f32], q_out: &mut [u8], s_out: &mut [u8]) {
        let (out, inp) = (self.out, self.inp);
        let nv = self.vec4_per_row();
        let nb = self.blocks();
        q_out.fill(0x88);
        s_out.fill(0);
        for n in 0..out {
            let (q, scales) = quantize_row(&w[n * inp..(n + 1) * inp]);
            for (b, s) in scales.iter().enumerate() {
                let at = (n * nb + b) * 2;
                s_out[at..at + 2].copy_from_slice(&s.to_le_bytes());
            }
            for c in 0..nv {
                let base = (n * nv + c) * 16;
                for j in 0..4 {
                    for i in 0..4 {
                        let col = c * 32 + j * 8 + i;
                        let lo = q.get(col).copied().unwrap_or(8);
                        let hi = q.get(col + 4).copied().unwrap_or(8);
                        q_out[base + j * 4 + i] = lo | (hi << 4);
                    }
                }
            }
        }
    }

    /// Nibble (q + 8) of element (n, k) of a packed matrix.
    pub fn nibble(&self, q: &[u8], n: usize, k: usize) -> u8 {
        let c = k / 32;
        let j = (k % 32) / 8;
        let r = k % 8;
        let byte = q[(n * self.vec4_per_row() + c) * 16 + j * 4 + (r % 4)];
        if r < 4 {
            byte & 0xF
        } else {
            byte >> 4
        }
    }

    pub fn scale(&self, s: &[u8], n: usize, block: usize) -> f16 {
        let at = (n * self.blocks() + block) * 2;
        f16::from_le_bytes([s[at], s[at + 1]])
    }

    /// The dequantised matrix [out, in] (CPU reference and tests only: the runtime never
    /// expands an expert).
    pub fn dequantize(&self, q: &[u8], s: &[u8]) -> Vec<f32> {
        let mut w = Vec::with_capacity(self.out * self.inp);
        for n in 0..self.out {
            for k in 0..self.inp {
                let v = self.nibble(q, n, k) as i32 - 8;
                w.push(v as f32 * self.scale(s, n, k / BLOCK).to_f32());
            }
        }
        w
    }
}

/// Byte offsets of the six sections of an INT4 expert slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q4SlotLayout {
    pub hidden: usize,
    pub inter: usize,
    pub gate: Q4Matrix,
    pub down: Q4Matrix,
    pub gate_q: usize,
    pub up_q: usize,
    pub down_q: usize,
    pub gate_s: usize,
    pub up_s: usize,
    pub down_s: usize,
    pub bytes: usize,
}

impl Q4SlotLayout {
    pub fn new(hidden: usize, inter: usize) -> Self {
        let gate = Q4Matrix {
            out: inter,
            inp: hidden,
        };
        let down = Q4Matrix {
            out: hidden,
            inp: inter,
        };
        let gate_q = 0;
        let up_q = gate.q_bytes();
        let down_q = up_q + gate.q_bytes();
        let gate_s = down_q + down.q_bytes();
        let up_s = gate_s + gate.scale_bytes();
        let down_s = up_s + gate.scale_bytes();
        let bytes = down_s + down.scale_bytes();
        Q4SlotLayout {
            hidden,
            inter,
            gate,
            down,
            gate_q,
            up_q,
            down_q,
            gate_s,
            up_s,
            down_s,
            bytes,
        }
    }

    /// A one-line description stored in converted files and checked on load.
    pub fn describe(&self) -> String {
        format!(
            "int4-b256 slot v2: hidden {} inter {}; nibble vec4 row-major [out][in/32] gate@{} up@{} down@{}; f16 scales [out][blocks] gate@{} up@{} down@{}; {} bytes",
            self.hidden, self.inter, self.gate_q, self.up_q, self.down_q, self.gate_s, self.up_s, self.down_s, self.bytes
        )
    }

    /// Quantise one expert (gate, up [I, H]; down [H, I], row-major f32) into `slot`.
    pub fn pack_expert(&self, gate: &[f32], up: &[f32], down: &[f32], slot: &mut [u8]) {
        let g = self.gate;
        let d = self.down;
        let (a, rest) = slot.split_at_mut(self.up_q);
        let (b, rest) = rest.split_at_mut(self.down_q - self.up_q);
        let (c, rest) = rest.split_at_mut(self.gate_s - self.down_q);
        let (sa, rest) = rest.split_at_mut(self.up_s - self.gate_s);
        let (sb, sc) = rest.split_at_mut(self.down_s - self.up_s);
        g.pack(gate, a, sa);
        g.pack(up, b, sb);
        d.pack(down, c, &mut sc[..d.scale_bytes()]);
    }
}

/// Bits per weight of the packed format for a matrix (padding included).
pub fn bits_per_weight(m: Q4Matrix) -> f64 {
    ((m.q_bytes() + m.scale_bytes()) * 8) as f64 / (m.out * m.inp) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantizer_rounds_half_to_even_and_clamps() {
        // max 7 -> scale 1: 2.5 -> 2, 3.5 -> 4, -0.5 -> 0, 7 -> 7
        let (q, s) = quantize_row(&[2.5, 3.5, -0.5, 7.0, -7.0]);
        assert_eq!(s[0].to_f32(), 1.0);
        assert_eq!(q, vec![10, 12, 8, 15, 1]);
        let (q, s) = quantize_row(&[0.0; 3]);
        assert_eq!((q, s[0].to_f32()), (vec![8, 8, 8], 0.0));
    }

    #[test]
    fn pack_roundtrips_through_nibble_and_scale() {
        for &(out, inp) in &[(3usize, 7usize), (5, 300), (64, 96), (2, 1408), (1, 256)] {
            let m = Q4Matrix { out, inp };
            let w: Vec<f32> = (0..out * inp)
                .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
                .collect();
            let mut q = vec![0u8; m.q_bytes()];
            let mut s = vec![0u8; m.scale_bytes()];
            m.pack(&w, &mut q, &mut s);
            for n in 0..out {
                let (rq, rs) = quantize_row(&w[n * inp..(n + 1) * inp]);
                for (k, &want) in rq.iter().enumerate().take(inp) {
                    assert_eq!(m.nibble(&q, n, k), want, "({out},{inp}) n {n} k {k}");
                }
                for (b, sc) in rs.iter().enumerate() {
                    assert_eq!(m.scale(&s, n, b), *sc);
                }
            }
        }
    }

    #[test]
    fn blocks_whose_scale_overflows_f16_are_found() {
        let mut w = vec![0.5f32; 2 * 300];
        assert_eq!(first_unscalable(&w, 300), None);
        w[300 + 260] = -1e6;
        assert_eq!(first_unscalable(&w, 300), Some((560, -1e6)));
        // 7 * 65504 still has a finite scale.
        w[560] = MAX_ABS;
        assert_eq!(first_unscalable(&w, 300), None);
    }

    #[test]
    fn olmoe_shapes_cost_4_0625_bits() {
        let b = bits_per_weight(Q4Matrix {
            out: 1024,
            inp: 2048,
        });
        assert!((b - 4.0625).abs() < 1e-9, "{b}");
    }
}

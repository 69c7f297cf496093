//! Q8_0 dense weights: ggml's block of 32 values with one f16 scale, and the packed layout
//! the W8A16 kernels read.
//!
//! Quantiser, bit-exact with ggml's `quantize_row_q8_0_ref` (ggml/src/ggml-quants.c): for
//! each row of an [out, in] weight, blocks of 32 consecutive weights along `in` (a partial
//! last block is padded with zeros):
//!   d  = max|w| / 127                        (f32)
//!   q  = roundf(w * (1/d)), half away from zero; 0 where d == 0
//!   d is stored as f16 (round to nearest even), and w' = q * f32(f16(d))
//! so a GGUF Q8_0 tensor holds the same values and loads unchanged (its 34-byte blocks are
//! split into the two sections below).
//!
//! Packed matrix (one [out, in] weight), row-major:
//! - quants: each row padded to a multiple of 32 columns, one int8 per byte in column
//!   order: vec4<u32> `c` of row `n` (index `n * 2 * ceil(in/32) + c`) holds columns
//!   16c .. 16c + 15, two vec4s per block, so neighbouring lanes reading neighbouring vec4s
//!   read a row's bytes in order (coalesced). Padding quants are 0.
//! - scales: f16, row-major `[out][ceil(in/32)]`, the section padded to 16 bytes (the
//!   layout of the INT4 scales, at blocks of 32).
//!
//! Bits per weight: 8 + 16/32 = 8.5, as ggml's 34-byte block.

use half::f16;

/// Values per block (ggml's QK8_0).
pub const BLOCK: usize = 32;
/// Columns per vec4<u32> of quants.
pub const COLS_PER_VEC4: usize = 16;
/// ggml's block: f16 d, then 32 int8.
pub const GGML_BLOCK_BYTES: usize = 34;

/// ggml's rule for one block: its f32 scale d and the quants (`x.len() <= 32`; the missing
/// values of a partial block are 0).
pub fn quantize_block(x: &[f32]) -> (f16, [i8; BLOCK]) {
    let amax = x.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0i8; BLOCK];
    for (qi, &v) in q.iter_mut().zip(x) {
        // `f32::round` is C's roundf: half away from zero. |v * id| <= 127 (up to an ulp).
        *qi = (v * id).round().clamp(-127.0, 127.0) as i8;
    }
    (f16::from_f32(d), q)
}

/// The largest magnitude a Q8_0 block can hold: its f16 scale max|w| / 127 must be finite.
pub const MAX_ABS: f32 = 65504.0 * 127.0;

/// The first element of `w` (rows of `inp` values) that is not finite or whose block's
/// scale `f16(max|w| / 127)` would overflow f16, and its value: such a block cannot be
/// stored.
pub fn first_unstorable(w: &[f32], inp: usize) -> Option<(usize, f32)> {
    if let Some(i) = w.iter().position(|x| !x.is_finite()) {
        return Some((i, w[i]));
    }
    crate::blocks::block_scale::first_oversized_block(w, inp, BLOCK, 127.0)
}

/// Byte layout of one packed [out, in] Q8_0 matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q8Matrix {
    pub out: usize,
    pub inp: usize,
}

impl Q8Matrix {
    pub fn blocks(&self) -> usize {
        self.inp.div_ceil(BLOCK)
    }
    pub fn vec4_per_row(&self) -> usize {
        self.blocks() * (BLOCK / COLS_PER_VEC4)
    }
    pub fn q_bytes(&self) -> usize {
        self.vec4_per_row() * self.out * 16
    }
    pub fn scale_bytes(&self) -> usize {
        (self.blocks() * self.out * 2).div_ceil(16) * 16
    }
    /// Both sections, as stored.
    pub fn bytes(&self) -> usize {
        self.q_bytes() + self.scale_bytes()
    }

    /// Quantise `w` ([out, in], row-major) into `q_out` (q_bytes) and `s_out` (scale_bytes).
    pub fn pack(&self, w: &[f32], q_out: &mut [u8], s_out: &mut [u8]) {
        let (inp, nb) = (self.inp, self.blocks());
        q_out.fill(0);
        s_out.fill(0);
        for n in 0..self.out {
            let row = &w[n * inp..(n + 1) * inp];
            for (b, block) in row.chunks(BLOCK).enumerate() {
                let (d, q) = quantize_block(block);
                let at = (n * nb + b) * 2;
                s_out[at..at + 2].copy_from_slice(&d.to_le_bytes());
                let qb = (n * nb + b) * BLOCK;
                for (o, v) in q_out[qb..qb + BLOCK].iter_mut().zip(q) {
                    *o = v as u8;
                }
            }
        }
    }

    /// Split ggml's blocks (`out * ceil(in/32)` blocks of 34 bytes, rows in order, as a GGUF
    /// Q8_0 tensor stores them) into the two sections, unchanged.
    pub fn from_ggml(&self, blocks: &[u8], q_out: &mut [u8], s_out: &mut [u8]) {
        let nb = self.blocks();
        q_out.fill(0);
        s_out.fill(0);
        for (i, blk) in blocks
            .chunks_exact(GGML_BLOCK_BYTES)
            .take(self.out * nb)
            .enumerate()
        {
            s_out[i * 2..i * 2 + 2].copy_from_slice(&blk[..2]);
            q_out[i * BLOCK..(i + 1) * BLOCK].copy_from_slice(&blk[2..]);
        }
    }

    /// Quant of element (n, k).
    pub fn quant(&self, q: &[u8], n: usize, k: usize) -> i8 {
        q[n * self.blocks() * BLOCK + k] as i8
    }

    pub fn scale(&self, s: &[u8], n: usize, block: usize) -> f16 {
        let at = (n * self.blocks() + block) * 2;
        f16::from_le_bytes([s[at], s[at + 1]])
    }

    /// The dequantised matrix [out, in] (CPU reference and tests).
    pub fn dequantize(&self, q: &[u8], s: &[u8]) -> Vec<f32> {
        let mut w = Vec::with_capacity(self.out * self.inp);
        for n in 0..self.out {
            for k in 0..self.inp {
                let d = self.scale(s, n, k / BLOCK).to_f32();
                w.push(self.quant(q, n, k) as f32 * d);
            }
        }
        w
    }
}

/// `w` ([out, in]) after a Q8_0 round trip: what the kernels compute with.
pub fn round_trip(w: &[f32], out: usize, inp: usize) -> Vec<f32> {
    let m = Q8Matrix { out, inp };
    let mut q = vec![0u8; m.q_bytes()];
    let mut s = vec![0u8; m.scale_bytes()];
    m.pack(w, &mut q, &mut s);
    m.dequantize(&q, &s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_round_away_from_zero_and_the_scale_is_f32_until_stored() {
        // amax 127 -> d = 1, so x * (1/d) = x: 2.5 -> 3 and -2.5 -> -3 (roundf), where
        // round-half-even would give 2 and -2.
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = 0.5;
        let (d, q) = quantize_block(&x);
        assert_eq!(d.to_f32(), 1.0);
        assert_eq!(&q[..4], &[127, 3, -3, 1]);
        // d = 0.1 / 127 is not an f16: q uses the f32 d, the stored d is rounded.
        let mut y = [0.0f32; 32];
        y[0] = 0.1;
        y[5] = -0.05;
        let (d, q) = quantize_block(&y);
        assert_eq!(d, f16::from_f32(0.1f32 / 127.0));
        assert_eq!(q[0], 127);
        assert_eq!(q[5], ((-0.05f32) * (1.0 / (0.1f32 / 127.0))).round() as i8);
    }

    #[test]
    fn packed_rows_pad_a_partial_block_and_round_trip_within_half_a_step() {
        let (out, inp) = (3, 45);
        let w: Vec<f32> = (0..out * inp)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        let m = Q8Matrix { out, inp };
        assert_eq!(m.blocks(), 2);
        assert_eq!(m.vec4_per_row(), 4);
        let mut q = vec![0xAAu8; m.q_bytes()];
        let mut s = vec![0xAAu8; m.scale_bytes()];
        m.pack(&w, &mut q, &mut s);
        for n in 0..out {
            // Columns 45..64 of each row are padding: 0.
            assert!(q[n * 64 + 45..n * 64 + 64].iter().all(|&b| b == 0));
        }
        let back = m.dequantize(&q, &s);
        for n in 0..out {
            for k in 0..inp {
                let d = m.scale(&s, n, k / BLOCK).to_f32();
                assert!((back[n * inp + k] - w[n * inp + k]).abs() <= d * 0.5 + 1e-6);
            }
        }
    }

    #[test]
    fn ggml_blocks_split_into_the_same_sections_as_our_quantiser() {
        let (out, inp) = (2, 64);
        let w: Vec<f32> = (0..out * inp).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut blocks = Vec::new();
        for row in w.chunks(inp) {
            for b in row.chunks(BLOCK) {
                let (d, q) = quantize_block(b);
                blocks.extend_from_slice(&d.to_le_bytes());
                blocks.extend(q.iter().map(|&v| v as u8));
            }
        }
        let m = Q8Matrix { out, inp };
        let (mut q1, mut s1) = (vec![0u8; m.q_bytes()], vec![0u8; m.scale_bytes()]);
        let (mut q2, mut s2) = (vec![0u8; m.q_bytes()], vec![0u8; m.scale_bytes()]);
        m.pack(&w, &mut q1, &mut s1);
        m.from_ggml(&blocks, &mut q2, &mut s2);
        assert_eq!(q1, q2);
        assert_eq!(s1, s2);
    }

    #[test]
    fn a_block_that_cannot_be_stored_is_found() {
        let mut w = vec![1.0f32; 64];
        assert_eq!(first_unstorable(&w, 64), None);
        w[40] = 1.0e7; // 1e7 / 127 > 65504
        assert_eq!(first_unstorable(&w, 64), Some((40, 1.0e7)));
        w[40] = 1.0;
        w[3] = f32::NAN;
        assert_eq!(first_unstorable(&w, 64).map(|(i, _)| i), Some(3));
    }
}

/// The q8_0 KV cache (`--kv-precision q8_0`; `backend::kernel::KvFormat::Q8`, written by
/// shaders/common/kv_store_q8.wgsl, read by kv_q8.wgsl): per position, `kv_dim` int8 (4 per
/// u32, byte 0 first, the last word zero-padded), then one f32 scale per block of
/// [`kv_block`] values, rounded by ggml's rule with the scale kept in f32.
pub mod kv {
    /// Values per scale: ggml's 32 when it divides head_dim, else one head row.
    pub fn kv_block(head_dim: usize) -> usize {
        if head_dim.is_multiple_of(super::BLOCK) {
            super::BLOCK
        } else {
            head_dim
        }
    }

    /// u32 words of one position's row: its values, then its scales.
    pub fn row_words(kv_dim: usize, head_dim: usize) -> usize {
        kv_dim.div_ceil(4) + kv_dim / kv_block(head_dim).max(1)
    }

    /// One position's `kv_dim` values as the cache stores them.
    pub fn encode_row(x: &[f32], head_dim: usize) -> Vec<u32> {
        let bs = kv_block(head_dim).max(1);
        let vw = x.len().div_ceil(4);
        let mut out = vec![0u32; row_words(x.len(), head_dim)];
        for (b, block) in x.chunks(bs).enumerate() {
            // A NaN makes the block's scale NaN, so its values read back as NaN.
            let amax = block.iter().fold(0.0f32, |m, &v| {
                if v.is_nan() || m.is_nan() {
                    f32::NAN
                } else {
                    m.max(v.abs())
                }
            });
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            out[vw + b] = d.to_bits();
            for (i, &v) in block.iter().enumerate() {
                let j = b * bs + i;
                let q = (v * id).round().clamp(-127.0, 127.0) as i8;
                out[j / 4] |= (q as u8 as u32) << (8 * (j % 4));
            }
        }
        out
    }

    /// The values of `positions` rows of a cache.
    pub fn decode(words: &[u32], kv_dim: usize, head_dim: usize, positions: usize) -> Vec<f32> {
        let bs = kv_block(head_dim).max(1);
        let (rw, vw) = (row_words(kv_dim, head_dim), kv_dim.div_ceil(4));
        let mut out = Vec::with_capacity(positions * kv_dim);
        for row in words.chunks(rw).take(positions) {
            for j in 0..kv_dim {
                let q = (row[j / 4] >> (8 * (j % 4))) as u8 as i8;
                out.push(q as f32 * f32::from_bits(row[vw + j / bs]));
            }
        }
        out
    }

    /// The values a q8_0 cache holds of rows of `kv_dim` values.
    pub fn round_trip(x: &[f32], kv_dim: usize, head_dim: usize) -> Vec<f32> {
        x.chunks(kv_dim)
            .flat_map(|r| decode(&encode_row(r, head_dim), kv_dim, head_dim, 1))
            .collect()
    }
}

//! GGUF's K-quants (Q4_K, Q5_K, Q6_K) and 5-bit blocks (Q5_0, Q5_1; Q4_1 too) as the
//! kernels read them: a plane of nibbles in wgmoe's INT4 layout (`blocks::quant`: a 16-byte
//! word holds 32 consecutive columns of a row) and, per row, one side record per block of
//! the type (the matrix's scale section), holding the block's scales and the values' bits
//! above the nibble. Nothing is re-rounded: every value the file's blocks give, ggml's
//! dequantiser gives from these (the tests check it bit for bit), and the bytes are those
//! of the file's blocks rearranged (Q6_K takes 2 bytes more per 256 values: its f16 d
//! gets a u32 of its own).
//!
//! Side records, little-endian u32 words (bit c of a high-bit word is column c of its
//! 32-column group, so a lane holding one 16-byte word of nibbles finds its bits in one
//! u32, or two for Q6_K):
//! - Q4_K, 4 words per 256 columns: `d | dmin << 16` (f16 bits), then the block's 12 bytes
//!   of 6-bit scales and mins as ggml packs them (`get_scale_min_k4`). Value of column c
//!   in sub-block j = c / 32: `(d sc_j) q - (dmin m_j)`, q the nibble.
//! - Q5_K, 12 words: Q4_K's 4, then one word of 5th bits per 32 columns; q = nibble + 16 h.
//! - Q6_K, 21 words: the 16 int8 scales (one per 16 columns, 4 words), `d` (f16 bits, the
//!   high half 0), then per 32 columns two words of 2-bit high parts (columns 0..15, then
//!   16..31; bits 2c, 2c + 1); value `(d sc_i) (q - 32)`, q = nibble + 16 h, i = c / 16.
//! - Q5A (Q5_0, Q5_1, Q4_1), 2 words per 32 columns: `s | o << 16` (f16 bits) and the 5th
//!   bits; value `s q + o`. Q5_0 is s = d, o = -16 d; Q5_1 and Q4_1 are s = d, o = m.

use half::f16;

use super::kind::Q4Kind;

/// Rows of a matrix in a K-plane kind ([`Q4Kind::is_planes`]): each element's nibble and
/// each row's side records, as the GGUF blocks hold them.
#[derive(Clone, Debug, PartialEq)]
pub struct KRows {
    pub kind: Q4Kind,
    pub cols: usize,
    /// One per element (0..=15), rows of `cols`.
    pub nibbles: Vec<u8>,
    /// [`side_words`] per row.
    pub side: Vec<u32>,
}

/// Words of one side record of `kind` (per [`Q4Kind::block`] columns).
pub fn record_words(kind: Q4Kind) -> usize {
    kind.record_words()
}

/// Side words of one row of `cols` columns.
pub fn side_words(kind: Q4Kind, cols: usize) -> usize {
    cols.div_ceil(kind.block()) * record_words(kind)
}

fn half(w: u32, hi: bool) -> f32 {
    f16::from_bits(if hi { (w >> 16) as u16 } else { w as u16 }).to_f32()
}

fn byte(words: &[u32], i: usize) -> u8 {
    (words[i / 4] >> (8 * (i % 4))) as u8
}

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes of a Q4_K/Q5_K record
/// (words 1..4): ggml's `get_scale_min_k4`.
pub fn scale_min(rec: &[u32], j: usize) -> (u8, u8) {
    let q = |i: usize| byte(&rec[1..4], i);
    if j < 4 {
        (q(j) & 63, q(j + 4) & 63)
    } else {
        (
            (q(j + 4) & 0x0f) | ((q(j - 4) >> 6) << 4),
            (q(j + 4) >> 4) | ((q(j) >> 6) << 4),
        )
    }
}

/// The bits of column `c` (0..32) of word `j` above the nibble, from a record.
fn high(kind: Q4Kind, rec: &[u32], j: usize, c: usize) -> u8 {
    match kind {
        Q4Kind::Q5K => ((rec[4 + j] >> c) & 1) as u8,
        Q4Kind::Q6K => ((rec[5 + 2 * j + c / 16] >> (2 * (c % 16))) & 3) as u8,
        Q4Kind::Q5A => ((rec[1] >> c) & 1) as u8,
        _ => 0,
    }
}

/// Column `k` of a row with side words `side` and nibble `nib` as `a q + b`: the record's
/// (a, b) for the column's 16 (a, b are one per 16 columns) and q = nib + 16 high. The
/// kernels sum a (q . x) + b (sum x) per 16 columns.
pub fn terms(kind: Q4Kind, side: &[u32], k: usize, nib: u8) -> (f32, f32, u8) {
    let rw = record_words(kind);
    let rec = &side[k / kind.block() * rw..][..rw];
    let in_block = k % kind.block();
    let (j, c) = (in_block / 32, in_block % 32);
    let q = nib + 16 * high(kind, rec, j, c);
    let (a, b) = match kind {
        Q4Kind::Q4K | Q4Kind::Q5K => {
            let (sc, m) = scale_min(rec, j);
            (
                half(rec[0], false) * f32::from(sc),
                -(half(rec[0], true) * f32::from(m)),
            )
        }
        Q4Kind::Q6K => {
            let a = half(rec[4], false) * f32::from(byte(&rec[..4], in_block / 16) as i8);
            (a, -32.0 * a)
        }
        Q4Kind::Q5A => (half(rec[0], false), half(rec[0], true)),
        _ => (f32::NAN, f32::NAN),
    };
    (a, b, q)
}

/// The value of column `k` of a row with side words `side` and nibble `nib`, computed as
/// ggml's dequantiser computes it (f32, the same operations in the same order).
pub fn value(kind: Q4Kind, side: &[u32], k: usize, nib: u8) -> f32 {
    let rw = record_words(kind);
    let rec = &side[k / kind.block() * rw..][..rw];
    let in_block = k % kind.block();
    let (j, c) = (in_block / 32, in_block % 32);
    let q = f32::from(nib + 16 * high(kind, rec, j, c));
    match kind {
        Q4Kind::Q4K | Q4Kind::Q5K => {
            let (sc, m) = scale_min(rec, j);
            half(rec[0], false) * f32::from(sc) * q - half(rec[0], true) * f32::from(m)
        }
        Q4Kind::Q6K => {
            let sc = byte(&rec[..4], in_block / 16) as i8;
            half(rec[4], false) * f32::from(sc) * (q - 32.0)
        }
        Q4Kind::Q5A => half(rec[0], false) * q + half(rec[0], true),
        _ => f32::NAN,
    }
}

/// The terms of word `j` of a record (`rec`, its words): per half (16 columns) a and b,
/// and the word's high-bit words (`hi[1]`: Q6_K's columns 16..31).
pub fn word_terms(kind: Q4Kind, rec: &[u32], j: usize) -> ([f32; 2], [f32; 2], [u32; 2]) {
    match kind {
        Q4Kind::Q4K | Q4Kind::Q5K => {
            let (sc, m) = scale_min(rec, j);
            let a = half(rec[0], false) * f32::from(sc);
            let b = -(half(rec[0], true) * f32::from(m));
            let hi = if kind == Q4Kind::Q5K { rec[4 + j] } else { 0 };
            ([a; 2], [b; 2], [hi, 0])
        }
        Q4Kind::Q6K => {
            let d = half(rec[4], false);
            let a0 = d * f32::from(byte(&rec[..4], 2 * j) as i8);
            let a1 = d * f32::from(byte(&rec[..4], 2 * j + 1) as i8);
            (
                [a0, a1],
                [-32.0 * a0, -32.0 * a1],
                [rec[5 + 2 * j], rec[6 + 2 * j]],
            )
        }
        Q4Kind::Q5A => {
            let (a, b) = (half(rec[0], false), half(rec[0], true));
            ([a; 2], [b; 2], [rec[1], 0])
        }
        _ => ([f32::NAN; 2], [f32::NAN; 2], [0; 2]),
    }
}

/// The high part (times 1: 0..=3) of column `c` (0..32) of a word with high words `hi`.
#[inline(always)]
pub fn high_of(kind: Q4Kind, hi: [u32; 2], c: usize) -> u32 {
    match kind {
        Q4Kind::Q5K | Q4Kind::Q5A => (hi[0] >> c) & 1,
        Q4Kind::Q6K => (hi[c / 16] >> (2 * (c % 16))) & 3,
        _ => 0,
    }
}

/// The 12 bytes of 6-bit (scale, min) pairs of 8 sub-blocks as ggml packs them
/// (`quantize_row_q4_K_ref`; [`scale_min`] reads them back).
pub fn pack_scale_min(scm: &[(u8, u8); 8]) -> [u8; 12] {
    let mut bytes = [0u8; 12];
    for (j, &(sc, m)) in scm.iter().enumerate() {
        if j < 4 {
            bytes[j] |= sc & 63;
            bytes[j + 4] |= m & 63;
        } else {
            bytes[j + 4] = (sc & 0x0f) | ((m & 0x0f) << 4);
            bytes[j - 4] |= (sc >> 4) << 6;
            bytes[j] |= (m >> 4) << 6;
        }
    }
    bytes
}

impl KRows {
    pub fn rows(&self) -> usize {
        self.nibbles.len() / self.cols.max(1)
    }

    /// The values, row-major (reference and conversions: the kernels never expand them).
    pub fn values(&self) -> Vec<f32> {
        let sw = side_words(self.kind, self.cols);
        self.nibbles
            .iter()
            .enumerate()
            .map(|(i, &q)| {
                let (n, k) = (i / self.cols, i % self.cols);
                value(self.kind, &self.side[n * sw..(n + 1) * sw], k, q)
            })
            .collect()
    }

    /// Rows `r0 .. r0 + n`.
    pub fn rows_range(&self, r0: usize, n: usize) -> KRows {
        let sw = side_words(self.kind, self.cols);
        KRows {
            kind: self.kind,
            cols: self.cols,
            nibbles: self.nibbles[r0 * self.cols..(r0 + n) * self.cols].to_vec(),
            side: self.side[r0 * sw..(r0 + n) * sw].to_vec(),
        }
    }

    /// The same values in the wider kind `to`, where it holds them exactly (Q4_K in Q5_K:
    /// no 5th bits); None otherwise.
    pub fn widened(&self, to: Q4Kind) -> Option<KRows> {
        if to == self.kind {
            return Some(self.clone());
        }
        if !(self.kind == Q4Kind::Q4K && to == Q4Kind::Q5K) {
            return None;
        }
        let side = self
            .side
            .chunks_exact(4)
            .flat_map(|r| r.iter().copied().chain([0u32; 8]))
            .collect();
        Some(KRows {
            kind: to,
            cols: self.cols,
            nibbles: self.nibbles.clone(),
            side,
        })
    }

    /// Fit values (rows of `cols`, finite) into `kind`: a plain quantiser (not ggml's
    /// search), for a matrix that must be of a K-plane kind but has no blocks behind it.
    pub fn fit(kind: Q4Kind, w: &[f32], cols: usize) -> KRows {
        let mut nibbles = Vec::with_capacity(w.len());
        let mut side = Vec::new();
        for row in w.chunks(cols.max(1)) {
            for blk in row.chunks(kind.block()) {
                let (rec, q) = fit_block(kind, blk);
                side.extend(rec);
                nibbles.extend(q);
            }
        }
        KRows {
            kind,
            cols,
            nibbles,
            side,
        }
    }
}

fn f16_bits(v: f32) -> u32 {
    u32::from(f16::from_f32(v).to_bits())
}

/// Round `x / s` to the nearest level in 0..=top (0 where s is 0).
fn level(x: f32, s: f32, top: f32) -> u8 {
    if s == 0.0 {
        return 0;
    }
    (x / s).round_ties_even().clamp(0.0, top) as u8
}

/// One block of `kind` fitted to `blk` (up to `kind.block()` values; the rest read as 0):
/// its record and the values' nibbles, the high bits in the record.
fn fit_block(kind: Q4Kind, blk: &[f32]) -> (Vec<u32>, Vec<u8>) {
    let at = |i: usize| blk.get(i).copied().unwrap_or(0.0);
    let mut rec = vec![0u32; record_words(kind)];
    let mut q = vec![0u8; blk.len()];
    let mut put = |rec: &mut Vec<u32>, i: usize, v: u8| {
        if i < q.len() {
            q[i] = v & 15;
        }
        let (j, c) = (i / 32, i % 32);
        match kind {
            Q4Kind::Q5K => rec[4 + j] |= u32::from(v >> 4) << c,
            Q4Kind::Q6K => rec[5 + 2 * j + c / 16] |= u32::from(v >> 4) << (2 * (c % 16)),
            Q4Kind::Q5A => rec[1] |= u32::from(v >> 4) << c,
            _ => {}
        }
    };
    match kind {
        Q4Kind::Q4K | Q4Kind::Q5K => {
            let top = if kind == Q4Kind::Q4K { 15.0 } else { 31.0 };
            // Per sub-block: the offset dmin m covers min(0, min x), the scale the range.
            let subs: Vec<(f32, f32)> = (0..8)
                .map(|j| {
                    let v: Vec<f32> = (0..32).map(|i| at(32 * j + i)).collect();
                    let mn = v.iter().fold(0.0f32, |m, &x| m.min(x));
                    let mx = v.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                    ((mx - mn) / top, -mn)
                })
                .collect();
            let d = f16::from_f32(subs.iter().fold(0.0f32, |m, s| m.max(s.0)) / 63.0).to_f32();
            let dmin = f16::from_f32(subs.iter().fold(0.0f32, |m, s| m.max(s.1)) / 63.0).to_f32();
            rec[0] = f16_bits(d) | f16_bits(dmin) << 16;
            let mut bytes = [0u8; 12];
            let mut scm = [(0u8, 0u8); 8];
            for (j, &(s, mn)) in subs.iter().enumerate() {
                // The scale rounded up so the range still fits the levels.
                let sc = if d == 0.0 {
                    0
                } else {
                    (s / d).ceil().min(63.0) as u8
                };
                let m = level(mn, dmin, 63.0);
                scm[j] = (sc, m);
            }
            for (j, &(sc, m)) in scm.iter().enumerate() {
                if j < 4 {
                    bytes[j] |= sc & 63;
                    bytes[j + 4] |= m & 63;
                } else {
                    bytes[j + 4] = (sc & 0x0f) | ((m & 0x0f) << 4);
                    bytes[j - 4] |= (sc >> 4) << 6;
                    bytes[j] |= (m >> 4) << 6;
                }
            }
            for (k, b) in bytes.iter().enumerate() {
                rec[1 + k / 4] |= u32::from(*b) << (8 * (k % 4));
            }
            for i in 0..blk.len() {
                let (sc, m) = scm[i / 32];
                let v = level(at(i) + dmin * f32::from(m), d * f32::from(sc), top);
                put(&mut rec, i, v);
            }
        }
        Q4Kind::Q6K => {
            let scales: Vec<f32> = (0..16)
                .map(|i| {
                    let v: Vec<f32> = (0..16).map(|k| at(16 * i + k)).collect();
                    let amax = v.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
                    amax / 31.0
                })
                .collect();
            let d = f16::from_f32(scales.iter().fold(0.0f32, |m, &s| m.max(s)) / 127.0).to_f32();
            rec[4] = f16_bits(d);
            for (i, &s) in scales.iter().enumerate() {
                let sc = if d == 0.0 {
                    0
                } else {
                    (s / d).ceil().min(127.0) as i8
                };
                rec[i / 4] |= u32::from(sc as u8) << (8 * (i % 4));
            }
            for i in 0..blk.len() {
                let sc = (rec[i / 64] >> (8 * ((i / 16) % 4))) as u8 as i8;
                let s = d * f32::from(sc);
                let v = if s == 0.0 {
                    32
                } else {
                    ((at(i) / s).round_ties_even().clamp(-32.0, 31.0) + 32.0) as u8
                };
                put(&mut rec, i, v);
            }
        }
        Q4Kind::Q5A => {
            let lo = (0..32).map(at).fold(f32::INFINITY, f32::min);
            let hi = (0..32).map(at).fold(f32::NEG_INFINITY, f32::max);
            let s = f16::from_f32((hi - lo) / 31.0).to_f32();
            let o = f16::from_f32(lo).to_f32();
            rec[0] = f16_bits(s) | f16_bits(o) << 16;
            for i in 0..blk.len() {
                let v = level(at(i) - o, s, 31.0);
                put(&mut rec, i, v);
            }
        }
        _ => {}
    }
    (rec, q)
}

pub use super::kind::PLANES_MAX_ABS as MAX_ABS;

#[cfg(test)]
mod tests {
    use super::*;

    fn wave(n: usize, amp: f32) -> Vec<f32> {
        (0..n)
            .map(|i| amp * (((i * 7919) % 1013) as f32 / 506.0 - 1.0))
            .collect()
    }

    #[test]
    fn fits_hold_values_within_a_step() {
        for (kind, cols, steps) in [
            (Q4Kind::Q4K, 512, 15.0),
            (Q4Kind::Q5K, 256, 31.0),
            (Q4Kind::Q6K, 512, 63.0),
            (Q4Kind::Q5A, 96, 31.0),
        ] {
            let w = wave(3 * cols, 0.7);
            let r = KRows::fit(kind, &w, cols);
            assert_eq!(r.side.len(), 3 * side_words(kind, cols));
            let back = r.values();
            for (i, (&b, &x)) in back.iter().zip(&w).enumerate() {
                // Each level is at most (block range) / steps apart; 6-bit scales round up.
                let tol = 1.4 * 2.0 * 0.7 / steps * 1.1;
                assert!((b - x).abs() <= tol, "{kind:?} element {i}: {b} vs {x}");
            }
        }
    }

    #[test]
    fn q4_k_widens_into_q5_k_exactly() {
        let w = wave(2 * 256, 0.3);
        let r = KRows::fit(Q4Kind::Q4K, &w, 256);
        let wide = r.widened(Q4Kind::Q5K).unwrap();
        assert_eq!(wide.values(), r.values());
        assert!(r.widened(Q4Kind::Q6K).is_none());
    }
}

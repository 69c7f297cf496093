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
//!
//! A second kind, affine block-32 ([`Q4Kind::Affine32`]), holds GGUF's 4-bit experts
//! (Q4_0, Q4_K) without re-rounding: the same nibbles, and per 32-column block (one vec4)
//! an f16 scale s and an f16 offset o side by side (scales `[out][blocks][2]`), the value
//! being s (nibble - 8) + o. Q4_0 is s = d, o = 0; Q4_K's sub-block (d sc, dmin m) is
//! s = d sc, o = 8 s - dmin m. Other values are fitted per block ([`affine_fit`]).
//! 4 + 32/32 = 5 bits per weight.
//!
//! A GGUF expert matrix stored wider than 4 bits (Q5_K, Q6_K, Q5_0/Q5_1, Q8_0, F16...) is
//! held as ggml's Q8_0 ([`Q4Kind::Q8`], the layout of `blocks::q8_0`, 8.5 bits per weight)
//! rather than rounded to 16 levels: a slot's gate/up and its down each have their kind
//! ([`Q4SlotLayout::mixed`]), so a Q4_K_M file's Q6_K `ffn_down` keeps 8 bits.

use half::f16;

use crate::blocks::block_scale::first_oversized_block;

pub use super::kind::{BLOCK, COLS_PER_VEC4};

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

use super::kind::AFFINE_SPAN;
pub use super::kind::{Q4Kind, SlotKinds, MAX_ABS};

/// The first element of `w` (rows of `inp` values, finite) whose block's scale
/// `f16(max|w| / 7)` would overflow f16, and its value: such a block cannot be stored.
pub fn first_unscalable(w: &[f32], inp: usize) -> Option<(usize, f32)> {
    first_oversized_block(w, inp, BLOCK, 7.0)
}

/// Affine 4-bit rows as decoded from a block format: per element its nibble (0..=15), per
/// 32 columns (A, B) with value = A nibble + B, in f32 as ggml computes them.
pub struct Affine4 {
    pub nibbles: Vec<u8>,
    pub blocks: Vec<(f32, f32)>,
}

impl Affine4 {
    /// The values A nibble + B, rows of `inp`.
    pub fn values(&self, inp: usize) -> Vec<f32> {
        let nb = inp.div_ceil(COLS_PER_VEC4);
        self.nibbles
            .iter()
            .enumerate()
            .map(|(i, &q)| {
                let (a, b) = self.blocks[i / inp * nb + i % inp / COLS_PER_VEC4];
                a * f32::from(q) + b
            })
            .collect()
    }
}

/// What one expert matrix is packed from.
pub enum Q4Source {
    /// Values, row-major, quantised by the matrix's kind.
    Values(Vec<f32>),
    /// Affine 4-bit rows as a block format holds them (Affine32 matrices only).
    Affine(Affine4),
    /// Rows of a K-plane kind as GGUF blocks hold them: packed as they are into a matrix of
    /// their kind (or one that holds them exactly, Q4_K in Q5_K), else as their values.
    Planes(crate::blocks::kquant::KRows),
}

/// Byte layout of one packed [out, in] matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q4Matrix {
    pub out: usize,
    pub inp: usize,
    pub kind: Q4Kind,
}

impl Q4Matrix {
    pub fn sym(out: usize, inp: usize) -> Self {
        Q4Matrix {
            out,
            inp,
            kind: Q4Kind::Sym256,
        }
    }
    pub fn vec4_per_row(&self) -> usize {
        self.inp.div_ceil(COLS_PER_VEC4) * (COLS_PER_VEC4 / self.kind.cols_per_vec4())
    }

    /// The Q8_0 layout of a `Q4Kind::Q8` matrix.
    fn q8(&self) -> crate::blocks::q8_0::Q8Matrix {
        crate::blocks::q8_0::Q8Matrix {
            out: self.out,
            inp: self.inp,
        }
    }
    pub fn blocks(&self) -> usize {
        self.inp.div_ceil(self.kind.block())
    }
    /// f16 values of the scale section per row.
    pub fn halves_per_row(&self) -> usize {
        self.blocks() * self.kind.halves_per_block()
    }
    pub fn q_bytes(&self) -> usize {
        self.vec4_per_row() * self.out * 16
    }
    pub fn scale_bytes(&self) -> usize {
        (self.halves_per_row() * self.out * 2).div_ceil(16) * 16
    }

    /// Quantise `w` ([out, in], row-major) into `q_out` (q_bytes) and `s_out`
    /// (scale_bytes). Affine32 fits each 32-column block's range: s = (max - min) / 15.
    pub fn pack(&self, w: &[f32], q_out: &mut [u8], s_out: &mut [u8]) {
        match self.kind {
            Q4Kind::Affine32 => return self.pack_affine(&affine_fit(w, self.inp), q_out, s_out),
            Q4Kind::Q8 => return self.q8().pack(w, q_out, s_out),
            Q4Kind::Sym256 => {}
            k => {
                let rows = crate::blocks::kquant::KRows::fit(k, w, self.inp);
                return self.pack_planes(&rows, q_out, s_out);
            }
        }
        let (out, inp) = (self.out, self.inp);
        let nb = self.blocks();
        q_out.fill(0x88);
        s_out.fill(0);
        for n in 0..out {
            let (q, scales) = quantize_row(&w[n * inp..(n + 1) * inp]);
            for (b, s) in scales.iter().enumerate() {
                let at = (n * nb + b) * 2;
                s_out[at..at + 2].copy_from_slice(&s.to_le_bytes());
            }
            self.put_row_nibbles(n, &q, q_out);
        }
    }

    /// Pack from `src`; affine rows go into an Affine32 matrix as they are (a Sym256 matrix
    /// re-rounds their values).
    pub fn pack_from(&self, src: &Q4Source, q_out: &mut [u8], s_out: &mut [u8]) {
        match src {
            Q4Source::Values(w) => self.pack(w, q_out, s_out),
            Q4Source::Affine(a) if self.kind == Q4Kind::Affine32 => {
                self.pack_affine(a, q_out, s_out)
            }
            Q4Source::Affine(a) => self.pack(&a.values(self.inp), q_out, s_out),
            Q4Source::Planes(r) => match r.widened(self.kind) {
                Some(w) => self.pack_planes(&w, q_out, s_out),
                None => self.pack(&r.values(), q_out, s_out),
            },
        }
    }

    /// Pack rows of this matrix's K-plane kind: nibbles as they are, each row's side
    /// records into the scale section.
    pub fn pack_planes(
        &self,
        r: &crate::blocks::kquant::KRows,
        q_out: &mut [u8],
        s_out: &mut [u8],
    ) {
        debug_assert_eq!(r.kind, self.kind);
        q_out.fill(0x88);
        s_out.fill(0);
        let sw = self.halves_per_row() / 2;
        for n in 0..self.out {
            self.put_row_nibbles(n, &r.nibbles[n * self.inp..(n + 1) * self.inp], q_out);
            for (i, w) in r.side[n * sw..(n + 1) * sw].iter().enumerate() {
                let at = (n * sw + i) * 4;
                s_out[at..at + 4].copy_from_slice(&w.to_le_bytes());
            }
        }
    }

    /// Side word `i` of row `n` of a K-plane matrix's scale section `s`.
    pub fn side_word(&self, s: &[u8], n: usize, i: usize) -> u32 {
        let at = (n * self.halves_per_row() / 2 + i) * 4;
        u32::from_le_bytes([s[at], s[at + 1], s[at + 2], s[at + 3]])
    }

    /// Pack affine rows (an Affine32 matrix): nibbles as they are, s = f16(A) and
    /// o = f16(B + 8 A) per block.
    pub fn pack_affine(&self, a: &Affine4, q_out: &mut [u8], s_out: &mut [u8]) {
        debug_assert_eq!(self.kind, Q4Kind::Affine32);
        let (out, inp) = (self.out, self.inp);
        let nb = self.blocks();
        q_out.fill(0x88);
        s_out.fill(0);
        for n in 0..out {
            for b in 0..nb {
                let (am, bm) = a.blocks[n * nb + b];
                let s = f16::from_f32(am);
                let o = f16::from_f32(bm + 8.0 * am);
                let at = (n * nb + b) * 4;
                s_out[at..at + 2].copy_from_slice(&s.to_le_bytes());
                s_out[at + 2..at + 4].copy_from_slice(&o.to_le_bytes());
            }
            self.put_row_nibbles(n, &a.nibbles[n * inp..(n + 1) * inp], q_out);
        }
    }

    /// The nibbles `q` (one per column) of row `n` into their packed places.
    fn put_row_nibbles(&self, n: usize, q: &[u8], q_out: &mut [u8]) {
        let nv = self.vec4_per_row();
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
        let at = (n * self.blocks() + block) * self.kind.halves_per_block() * 2;
        f16::from_le_bytes([s[at], s[at + 1]])
    }

    /// The offset of block `block` of row `n` (0 for Sym256).
    pub fn offset(&self, s: &[u8], n: usize, block: usize) -> f16 {
        if self.kind != Q4Kind::Affine32 {
            return f16::ZERO;
        }
        let at = (n * self.blocks() + block) * 4 + 2;
        f16::from_le_bytes([s[at], s[at + 1]])
    }

    /// The first element of `w` ([out, in], finite) whose block's scale or offset would
    /// overflow f16, and its value: such a block cannot be stored.
    pub fn first_unscalable(&self, w: &[f32]) -> Option<(usize, f32)> {
        match self.kind {
            Q4Kind::Sym256 => first_unscalable(w, self.inp),
            Q4Kind::Affine32 => {
                first_oversized_block(w, self.inp, COLS_PER_VEC4, 1.0 / AFFINE_SPAN)
            }
            Q4Kind::Q8 => crate::blocks::q8_0::first_unstorable(w, self.inp),
            _ => w
                .iter()
                .position(|x| !x.is_finite() || x.abs() > crate::blocks::kquant::MAX_ABS)
                .map(|i| (i, w[i])),
        }
    }

    /// The dequantised matrix [out, in] (CPU reference and tests only: the runtime never
    /// expands an expert).
    pub fn dequantize(&self, q: &[u8], s: &[u8]) -> Vec<f32> {
        if self.kind == Q4Kind::Q8 {
            return self.q8().dequantize(q, s);
        }
        if self.kind.is_planes() {
            let sw = self.halves_per_row() / 2;
            let mut w = Vec::with_capacity(self.out * self.inp);
            for n in 0..self.out {
                let side: Vec<u32> = (0..sw).map(|i| self.side_word(s, n, i)).collect();
                for k in 0..self.inp {
                    let nib = self.nibble(q, n, k);
                    w.push(crate::blocks::kquant::value(self.kind, &side, k, nib));
                }
            }
            return w;
        }
        let mut w = Vec::with_capacity(self.out * self.inp);
        for n in 0..self.out {
            for k in 0..self.inp {
                let v = self.nibble(q, n, k) as i32 - 8;
                let b = k / self.kind.block();
                w.push(v as f32 * self.scale(s, n, b).to_f32() + self.offset(s, n, b).to_f32());
            }
        }
        w
    }
}

/// The affine fit of rows of `inp` values in blocks of 32: A = (max - min) / 15 (as f16),
/// B = min, nibble = clamp(round((w - B) / A), 0, 15).
pub fn affine_fit(w: &[f32], inp: usize) -> Affine4 {
    let mut nibbles = Vec::with_capacity(w.len());
    let mut blocks = Vec::new();
    for row in w.chunks(inp.max(1)) {
        for blk in row.chunks(COLS_PER_VEC4) {
            let lo = blk.iter().fold(f32::INFINITY, |m, &x| m.min(x));
            let hi = blk.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let a = f16::from_f32((hi - lo) / 15.0).to_f32();
            // The offset the packer stores, so the nibbles round against what is read back.
            let o = f16::from_f32(lo + 8.0 * a).to_f32();
            for &x in blk {
                let q = if a == 0.0 {
                    8.0
                } else {
                    ((x - o) / a + 8.0).round_ties_even().clamp(0.0, 15.0)
                };
                nibbles.push(q as u8);
            }
            blocks.push((a, o - 8.0 * a));
        }
    }
    Affine4 { nibbles, blocks }
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
    /// The slot's stride: its sections, and any padding up to the model's largest slot
    /// (a GGUF file's layers may hold their experts in different kinds).
    pub bytes: usize,
}

impl Q4SlotLayout {
    /// The block-256 slot of wgmoe's own quantiser.
    pub fn new(hidden: usize, inter: usize) -> Self {
        Self::with_kind(hidden, inter, Q4Kind::Sym256)
    }

    pub fn with_kind(hidden: usize, inter: usize, kind: Q4Kind) -> Self {
        Self::mixed(hidden, inter, kind, kind)
    }

    /// A slot whose gate/up matrices are of kind `gate_up` and whose down is of `down`
    /// (a GGUF file's 4-bit gate/up beside a wider down, held as Q8_0).
    pub fn mixed(hidden: usize, inter: usize, gate_up: Q4Kind, down: Q4Kind) -> Self {
        let gate = Q4Matrix {
            out: inter,
            inp: hidden,
            kind: gate_up,
        };
        let down = Q4Matrix {
            out: hidden,
            inp: inter,
            kind: down,
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

    /// This layout with its stride padded to `bytes` (at least its own).
    pub fn padded_to(mut self, bytes: usize) -> Self {
        self.bytes = self.bytes.max(bytes);
        self
    }

    /// The bytes of its sections, padding aside.
    pub fn used_bytes(&self) -> usize {
        self.down_s + self.down.scale_bytes()
    }

    pub fn kinds(&self) -> SlotKinds {
        SlotKinds {
            gate_up: self.gate.kind,
            down: self.down.kind,
        }
    }

    /// A one-line description stored in converted files and checked on load.
    pub fn kind(&self) -> Q4Kind {
        self.gate.kind
    }

    /// Whether every matrix is wgmoe's block-256 INT4 (what the lavapipe-tuned W4A16
    /// kernels read).
    pub fn is_sym256(&self) -> bool {
        self.gate.kind == Q4Kind::Sym256 && self.down.kind == Q4Kind::Sym256
    }

    pub fn describe(&self) -> String {
        if !self.is_sym256() {
            return format!(
                "gguf expert slot v3: hidden {} inter {}; gate/up {}, down {}; quants vec4 row-major gate@{} up@{} down@{}; f16 scales (int4-a32: scale, offset; K-plane kinds: side records) row-major gate@{} up@{} down@{}; {} bytes",
                self.hidden, self.inter, self.gate.kind.name(), self.down.kind.name(), self.gate_q, self.up_q, self.down_q, self.gate_s, self.up_s, self.down_s, self.bytes
            );
        }
        format!(
            "int4-b256 slot v2: hidden {} inter {}; nibble vec4 row-major [out][in/32] gate@{} up@{} down@{}; f16 scales [out][blocks] gate@{} up@{} down@{}; {} bytes",
            self.hidden, self.inter, self.gate_q, self.up_q, self.down_q, self.gate_s, self.up_s, self.down_s, self.bytes
        )
    }

    /// Pack one expert from its three sources (gate, up [I, H]; down [H, I]) into `slot`.
    pub fn pack_expert_from(
        &self,
        gate: &Q4Source,
        up: &Q4Source,
        down: &Q4Source,
        slot: &mut [u8],
    ) {
        let (a, rest) = slot.split_at_mut(self.up_q);
        let (b, rest) = rest.split_at_mut(self.down_q - self.up_q);
        let (c, rest) = rest.split_at_mut(self.gate_s - self.down_q);
        let (sa, rest) = rest.split_at_mut(self.up_s - self.gate_s);
        let (sb, sc) = rest.split_at_mut(self.down_s - self.up_s);
        let d = self.down;
        self.gate.pack_from(gate, a, sa);
        self.gate.pack_from(up, b, sb);
        d.pack_from(down, c, &mut sc[..d.scale_bytes()]);
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
            let m = Q4Matrix::sym(out, inp);
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
    fn affine_fit_holds_a_grid_exactly_and_rounds_within_half_a_step() {
        // Rows of 70 columns (two full blocks and a partial one).
        let (out, inp) = (3, 70);
        let m = Q4Matrix {
            out,
            inp,
            kind: Q4Kind::Affine32,
        };
        let mut q = vec![0u8; m.q_bytes()];
        let mut s = vec![0u8; m.scale_bytes()];
        // On a grid of 16 levels whose step and offset f16 holds exactly, each block (the
        // partial one too) spanning all of it: read back equal.
        let level = |k: usize| match k % 32 {
            0 => 0,
            1 => 15,
            j => (j * 7) % 16,
        };
        let grid: Vec<f32> = (0..out * inp)
            .map(|i| -1.5 + 0.25 * level(i % inp) as f32)
            .collect();
        m.pack(&grid, &mut q, &mut s);
        assert_eq!(m.dequantize(&q, &s), grid);
        // Arbitrary values: within half a step (plus the f16 rounding of the offset).
        let w: Vec<f32> = (0..out * inp)
            .map(|i| ((i * 7919 % 1000) as f32 / 300.0) - 1.7)
            .collect();
        m.pack(&w, &mut q, &mut s);
        let back = m.dequantize(&q, &s);
        for (i, (&b, &x)) in back.iter().zip(&w).enumerate() {
            let (n, blk) = (i / inp, i % inp / 32);
            let step = m.scale(&s, n, blk).to_f32();
            let o = m.offset(&s, n, blk).to_f32().abs();
            assert!(
                (b - x).abs() <= step / 2.0 + o * 1e-3,
                "element {i}: {b} vs {x}"
            );
        }
    }

    #[test]
    fn affine_rows_pack_as_their_values_into_block_256() {
        let (out, inp) = (2, 300);
        let a = affine_fit(
            &(0..out * inp)
                .map(|i| (i % 37) as f32 / 9.0 - 2.0)
                .collect::<Vec<_>>(),
            inp,
        );
        let m = Q4Matrix::sym(out, inp);
        let (mut q1, mut s1) = (vec![0u8; m.q_bytes()], vec![0u8; m.scale_bytes()]);
        let (mut q2, mut s2) = (q1.clone(), s1.clone());
        m.pack_from(&Q4Source::Affine(a), &mut q1, &mut s1);
        let a = affine_fit(
            &(0..out * inp)
                .map(|i| (i % 37) as f32 / 9.0 - 2.0)
                .collect::<Vec<_>>(),
            inp,
        );
        m.pack(&a.values(inp), &mut q2, &mut s2);
        assert_eq!((q1, s1), (q2, s2));
    }

    #[test]
    fn olmoe_shapes_cost_4_0625_bits() {
        let b = bits_per_weight(Q4Matrix::sym(1024, 2048));
        assert!((b - 4.0625).abs() < 1e-9, "{b}");
    }
}

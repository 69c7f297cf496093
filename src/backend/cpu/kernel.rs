//! The inner loops of the CPU expert kernel: rows of packed INT4 weights against f32
//! activations laid out in the nibbles' column order.
//!
//! Byte `i` of a packed row holds column `8 (i / 4) + i % 4` in its low nibble and column
//! `8 (i / 4) + 4 + i % 4` in its high nibble (`crate::blocks::quant`). [`Interleaved`] stores the
//! activations the same way (`lo[i]`, `hi[i]`), so a block of 256 columns is 128 bytes
//! against two contiguous arrays of 128 floats: loops the compiler vectorises. The stored
//! value is q + 8; `sum(q x) = sum(nibble x) - 8 sum(x)` takes the offset out of the loop,
//! with the block sums of x computed once per token. Affine slots (`Q4Kind::Affine32`) have
//! a block per 16 bytes and add the block's offset times the same sum. The K-plane kinds
//! (`blocks::kquant`: a GGUF file's Q4_K, Q5_K, Q6_K, Q5_0/Q5_1 experts) add each
//! column's high part to its nibble and scale per 16 columns. Q8_0 matrices (`Q4Kind::Q8`)
//! take the activations in column order.

use half::f16;

use super::row_bytes;
use crate::blocks::quant::{Q4Kind, Q4Matrix, Q4SlotLayout};

/// The instruction set the loops are compiled for, chosen once at start-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Isa {
    /// The target's baseline (SSE2 on x86-64, NEON on aarch64).
    Baseline,
    /// x86-64 with AVX2 and FMA (checked at run time).
    Avx2Fma,
    /// x86-64 with AVX-512F besides AVX2 and FMA (checked at run time): 16-wide nibble
    /// dots; the rest of the kernel as with AVX2.
    Avx512,
}

impl Isa {
    pub(super) fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                if std::is_x86_feature_detected!("avx512f") {
                    return Isa::Avx512;
                }
                return Isa::Avx2Fma;
            }
        }
        Isa::Baseline
    }

    /// This one, or `cap` where `cap` is the weaker (tests run every path the CPU has).
    pub(super) fn at_most(self, cap: Isa) -> Isa {
        let rank = |i: Isa| match i {
            Isa::Baseline => 0,
            Isa::Avx2Fma => 1,
            Isa::Avx512 => 2,
        };
        if rank(cap) < rank(self) {
            cap
        } else {
            self
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Isa::Avx2Fma => "avx2+fma",
            Isa::Avx512 => "avx512f+fma",
            Isa::Baseline if cfg!(target_arch = "aarch64") => "neon",
            Isa::Baseline if cfg!(target_arch = "x86_64") => "sse2",
            Isa::Baseline => "scalar",
        }
    }
}

/// One token's activations for one matrix, in the packed column order, 0 past the
/// matrix's input width (padding nibbles must contribute nothing).
pub(super) struct Interleaved {
    lo: Vec<f32>,
    hi: Vec<f32>,
    /// Per scale block (256 or 32 columns): sum of the block's activations (for the -8
    /// and the affine offsets).
    block_sums: Vec<f32>,
}

impl Interleaved {
    pub(super) fn new(x: &[f32], m: &Q4Matrix) -> Self {
        let n = m.vec4_per_row() * 16;
        let at = |col: usize| if col < m.inp { x[col] } else { 0.0 };
        if m.kind == Q4Kind::Q8 {
            // Q8_0 rows are one int8 per column in order: the activations as they are.
            return Interleaved {
                lo: (0..n).map(at).collect(),
                hi: Vec::new(),
                block_sums: Vec::new(),
            };
        }
        let lo: Vec<f32> = (0..n).map(|i| at(8 * (i / 4) + i % 4)).collect();
        let hi: Vec<f32> = (0..n).map(|i| at(8 * (i / 4) + 4 + i % 4)).collect();
        // K-plane kinds scale per 16 columns (8 bytes), the others per block.
        let bb = if m.kind.is_planes() {
            8
        } else {
            m.kind.block() / 2
        };
        let block_sums = lo
            .chunks(bb)
            .zip(hi.chunks(bb))
            .map(|(a, b)| a.iter().sum::<f32>() + b.iter().sum::<f32>())
            .collect();
        Interleaved { lo, hi, block_sums }
    }
}

#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// sum over the bytes of `q` of low nibble * lo + high nibble * hi, portable: fixed-size
/// lanes of 8 the compiler can keep in vector registers (NEON on aarch64).
#[inline(always)]
fn nibble_dot_portable(q: &[u8], lo: &[f32], hi: &[f32]) -> f32 {
    let mut al = [0.0f32; 8];
    let mut ah = [0.0f32; 8];
    for ((qc, lc), hc) in q
        .chunks_exact(8)
        .zip(lo.chunks_exact(8))
        .zip(hi.chunks_exact(8))
    {
        for i in 0..8 {
            al[i] = madd::<BASELINE_FMA>(f32::from(qc[i] & 15), lc[i], al[i]);
            ah[i] = madd::<BASELINE_FMA>(f32::from(qc[i] >> 4), hc[i], ah[i]);
        }
    }
    let mut s = [0.0f32; 8];
    for i in 0..8 {
        s[i] = al[i] + ah[i];
    }
    ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]))
}

/// The same sum with AVX2 and FMA: 16 bytes per step, widened to two vectors of 8
/// nibbles each side, four independent multiply-add chains.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn nibble_dot_avx2(q: &[u8], lo: &[f32], hi: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = q.len().min(lo.len()).min(hi.len()) & !15;
    let (q, lo, hi) = (&q[..n], &lo[..n], &hi[..n]);
    // SAFETY (the loads below): every pointer is within a slice of length n, 16 elements
    // from `i`, and `i + 16 <= n`; unaligned loads.
    let mask = _mm256_set1_epi32(15);
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let (mut b0, mut b1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i + 16 <= n {
        unsafe {
            let w0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(q.as_ptr().add(i).cast()));
            let w1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(q.as_ptr().add(i + 8).cast()));
            let l0 = _mm256_cvtepi32_ps(_mm256_and_si256(w0, mask));
            let l1 = _mm256_cvtepi32_ps(_mm256_and_si256(w1, mask));
            let h0 = _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(w0));
            let h1 = _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(w1));
            a0 = _mm256_fmadd_ps(l0, _mm256_loadu_ps(lo.as_ptr().add(i)), a0);
            a1 = _mm256_fmadd_ps(l1, _mm256_loadu_ps(lo.as_ptr().add(i + 8)), a1);
            b0 = _mm256_fmadd_ps(h0, _mm256_loadu_ps(hi.as_ptr().add(i)), b0);
            b1 = _mm256_fmadd_ps(h1, _mm256_loadu_ps(hi.as_ptr().add(i + 8)), b1);
        }
        i += 16;
    }
    let s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(b0, b1));
    let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// The same sum with AVX-512F: 16 bytes widened to 16 nibbles each side per step, two
/// steps per iteration, four independent multiply-add chains of 16 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn nibble_dot_avx512(q: &[u8], lo: &[f32], hi: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = q.len().min(lo.len()).min(hi.len()) & !15;
    let (q, lo, hi) = (&q[..n], &lo[..n], &hi[..n]);
    // SAFETY (the loads below): every pointer is within a slice of length n, 16 elements
    // from `i`, and `i + 16 <= n` (`i + 32 <= n` in the paired steps); unaligned loads.
    let mask = _mm512_set1_epi32(15);
    let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let (mut b0, mut b1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut i = 0;
    while i + 32 <= n {
        unsafe {
            let w0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(q.as_ptr().add(i).cast()));
            let w1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(q.as_ptr().add(i + 16).cast()));
            let l0 = _mm512_cvtepi32_ps(_mm512_and_si512(w0, mask));
            let l1 = _mm512_cvtepi32_ps(_mm512_and_si512(w1, mask));
            let h0 = _mm512_cvtepi32_ps(_mm512_srli_epi32::<4>(w0));
            let h1 = _mm512_cvtepi32_ps(_mm512_srli_epi32::<4>(w1));
            a0 = _mm512_fmadd_ps(l0, _mm512_loadu_ps(lo.as_ptr().add(i)), a0);
            a1 = _mm512_fmadd_ps(l1, _mm512_loadu_ps(lo.as_ptr().add(i + 16)), a1);
            b0 = _mm512_fmadd_ps(h0, _mm512_loadu_ps(hi.as_ptr().add(i)), b0);
            b1 = _mm512_fmadd_ps(h1, _mm512_loadu_ps(hi.as_ptr().add(i + 16)), b1);
        }
        i += 32;
    }
    if i + 16 <= n {
        unsafe {
            let w = _mm512_cvtepu8_epi32(_mm_loadu_si128(q.as_ptr().add(i).cast()));
            let l = _mm512_cvtepi32_ps(_mm512_and_si512(w, mask));
            let h = _mm512_cvtepi32_ps(_mm512_srli_epi32::<4>(w));
            a0 = _mm512_fmadd_ps(l, _mm512_loadu_ps(lo.as_ptr().add(i)), a0);
            b0 = _mm512_fmadd_ps(h, _mm512_loadu_ps(hi.as_ptr().add(i)), b0);
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(b0, b1)))
}

/// Which dot the loops use: 0 portable, 1 AVX2, 2 AVX-512.
#[inline(always)]
fn nibble_dot<const SIMD: u8>(q: &[u8], lo: &[f32], hi: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if SIMD == 2 {
            // SAFETY: instantiated with SIMD = 2 only inside functions compiled for
            // AVX-512F, AVX2 and FMA, which run only when the CPU has them (Isa::detect).
            return unsafe { nibble_dot_avx512(q, lo, hi) };
        }
        if SIMD == 1 {
            // SAFETY: instantiated with SIMD = 1 only inside functions compiled for AVX2 +
            // FMA, which run only when the CPU has them (Isa::detect).
            return unsafe { nibble_dot_avx2(q, lo, hi) };
        }
    }
    nibble_dot_portable(q, lo, hi)
}

/// One packed row (`q`, its f16 `scales`, and offsets when affine) dot one token's
/// activations.
#[inline(always)]
fn row_dot<const SIMD: u8>(q: &[u8], scales: &[u8], x: &Interleaved, kind: Q4Kind) -> f32 {
    if kind == Q4Kind::Q8 {
        return q8_row_dot(q, scales, &x.lo);
    }
    if kind.is_planes() {
        return planes_row_dot(q, scales, x, kind);
    }
    let bb = kind.block() / 2;
    let affine = kind == Q4Kind::Affine32;
    let mut acc = 0.0f32;
    for (b, (qb, sb)) in q
        .chunks(bb)
        .zip(scales.chunks_exact(2 * kind.halves_per_block()))
        .enumerate()
    {
        let o = b * bb;
        let d = nibble_dot::<SIMD>(qb, &x.lo[o..o + qb.len()], &x.hi[o..o + qb.len()]);
        let s = f16::from_le_bytes([sb[0], sb[1]]).to_f32();
        let bs = x.block_sums[b];
        acc += s * (d - 8.0 * bs);
        if affine {
            acc += f16::from_le_bytes([sb[2], sb[3]]).to_f32() * bs;
        }
    }
    acc
}

/// A row of a K-plane kind (`blocks::kquant`: nibbles, and side records of scales and
/// high bits) dot one token's activations: per 16 columns `a sum(q x) + b sum(x)`, q the
/// nibble plus 16 times its high part, fixed-size lanes the compiler vectorises.
#[inline(always)]
fn planes_row_dot(q: &[u8], side: &[u8], x: &Interleaved, kind: Q4Kind) -> f32 {
    use crate::blocks::kquant::{high_of, record_words, word_terms};
    let rw = record_words(kind);
    let per_rec = kind.block() / 32;
    let mut rec = [0u32; 21];
    let mut acc = 0.0f32;
    for (c, qw) in q.chunks_exact(16).enumerate() {
        if c % per_rec == 0 {
            let at = c / per_rec * rw * 4;
            for (w, b) in rec[..rw]
                .iter_mut()
                .zip(side[at..at + 4 * rw].chunks_exact(4))
            {
                *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        let (a, b, hi) = word_terms(kind, &rec[..rw], c % per_rec);
        for h in 0..2 {
            let o = 16 * c + 8 * h;
            let mut ql = [0.0f32; 8];
            let mut qh = [0.0f32; 8];
            for i in 0..8 {
                // Byte 8h + i holds column 8 (byte / 4) + byte % 4 low, + 4 high.
                let byte = 8 * h + i;
                let col = 8 * (byte / 4) + byte % 4;
                ql[i] = (u32::from(qw[byte] & 15) + 16 * high_of(kind, hi, col)) as f32;
                qh[i] = (u32::from(qw[byte] >> 4) + 16 * high_of(kind, hi, col + 4)) as f32;
            }
            let mut lanes = [0.0f32; 8];
            for i in 0..8 {
                lanes[i] = ql[i] * x.lo[o + i] + qh[i] * x.hi[o + i];
            }
            let s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
                + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
            acc += a[h] * s + b[h] * x.block_sums[2 * c + h];
        }
    }
    acc
}

/// A Q8_0 row (int8 quants, an f16 scale per 32) dot activations in column order:
/// portable lanes of 8 the compiler vectorises.
#[inline(always)]
fn q8_row_dot(q: &[u8], scales: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for ((qb, xb), sb) in q
        .chunks_exact(32)
        .zip(x.chunks_exact(32))
        .zip(scales.chunks_exact(2))
    {
        let mut lanes = [0.0f32; 8];
        for (qc, xc) in qb.chunks_exact(8).zip(xb.chunks_exact(8)) {
            for i in 0..8 {
                lanes[i] += f32::from(qc[i] as i8) * xc[i];
            }
        }
        acc += f16::from_le_bytes([sb[0], sb[1]]).to_f32() * lanes.iter().sum::<f32>();
    }
    acc
}

fn scale_row<'a>(m: &Q4Matrix, s: &'a [u8], n: usize) -> &'a [u8] {
    let nh = m.halves_per_row();
    &s[n * nh * 2..(n + 1) * nh * 2]
}

/// Rows `n0 ..` of gate and up for each token of `acts`: `out[(n - n0) * T + t] =
/// silu(gate_n . x_t) * (up_n . x_t)`, T = `acts.len()`.
#[inline(always)]
fn swiglu_impl<const SIMD: u8>(
    l: &Q4SlotLayout,
    slot: &[u8],
    n0: usize,
    acts: &[&Interleaved],
    out: &mut [f32],
) {
    let nt = acts.len().max(1);
    let (gq, uq) = (&slot[l.gate_q..l.up_q], &slot[l.up_q..l.down_q]);
    let (gs, us) = (&slot[l.gate_s..l.up_s], &slot[l.up_s..l.down_s]);
    for (r, row) in out.chunks_mut(nt).enumerate() {
        let n = n0 + r;
        let (g_row, u_row) = (row_bytes(&l.gate, gq, n), row_bytes(&l.gate, uq, n));
        let (g_sc, u_sc) = (scale_row(&l.gate, gs, n), scale_row(&l.gate, us, n));
        for (o, x) in row.iter_mut().zip(acts) {
            let g = row_dot::<SIMD>(g_row, g_sc, x, l.kind());
            let u = row_dot::<SIMD>(u_row, u_sc, x, l.kind());
            *o = g / (1.0 + (-g).exp()) * u;
        }
    }
}

/// Rows `m0 ..` of down for each pair: `out[(m - m0) * tokens + t] += w * (down_m . h)`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn down_impl<const SIMD: u8>(
    l: &Q4SlotLayout,
    slot: &[u8],
    m0: usize,
    toks: &[(usize, f32)],
    acts: &[Interleaved],
    tokens: usize,
    out: &mut [f32],
) {
    let dq = &slot[l.down_q..l.gate_s];
    let ds = &slot[l.down_s..l.bytes];
    for (r, row) in out.chunks_mut(tokens).enumerate() {
        let m = m0 + r;
        let (q, s) = (row_bytes(&l.down, dq, m), scale_row(&l.down, ds, m));
        for (&(t, w), x) in toks.iter().zip(acts) {
            row[t] += w * row_dot::<SIMD>(q, s, x, l.down.kind);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn swiglu_avx2(l: &Q4SlotLayout, slot: &[u8], n0: usize, acts: &[&Interleaved], out: &mut [f32]) {
    swiglu_impl::<1>(l, slot, n0, acts, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn swiglu_avx512(l: &Q4SlotLayout, slot: &[u8], n0: usize, acts: &[&Interleaved], out: &mut [f32]) {
    swiglu_impl::<2>(l, slot, n0, acts, out)
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
fn down_avx2(
    l: &Q4SlotLayout,
    slot: &[u8],
    m0: usize,
    toks: &[(usize, f32)],
    acts: &[Interleaved],
    tokens: usize,
    out: &mut [f32],
) {
    down_impl::<1>(l, slot, m0, toks, acts, tokens, out)
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx2,fma")]
fn down_avx512(
    l: &Q4SlotLayout,
    slot: &[u8],
    m0: usize,
    toks: &[(usize, f32)],
    acts: &[Interleaved],
    tokens: usize,
    out: &mut [f32],
) {
    down_impl::<2>(l, slot, m0, toks, acts, tokens, out)
}

/// FMA where the baseline has it (aarch64), separate multiply and add elsewhere.
const BASELINE_FMA: bool = cfg!(target_arch = "aarch64");

pub(super) fn swiglu_rows(
    isa: Isa,
    l: &Q4SlotLayout,
    slot: &[u8],
    n0: usize,
    acts: &[&Interleaved],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY: Isa::Avx512 is only chosen when the CPU reports AVX-512F, AVX2 and FMA.
        Isa::Avx512 => return unsafe { swiglu_avx512(l, slot, n0, acts, out) },
        // SAFETY: Isa::Avx2Fma is only chosen when the CPU reports AVX2 and FMA.
        Isa::Avx2Fma => return unsafe { swiglu_avx2(l, slot, n0, acts, out) },
        Isa::Baseline => {}
    }
    let _ = isa;
    swiglu_impl::<0>(l, slot, n0, acts, out)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn down_rows(
    isa: Isa,
    l: &Q4SlotLayout,
    slot: &[u8],
    m0: usize,
    toks: &[(usize, f32)],
    acts: &[Interleaved],
    tokens: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY: as above.
        Isa::Avx512 => return unsafe { down_avx512(l, slot, m0, toks, acts, tokens, out) },
        // SAFETY: as above.
        Isa::Avx2Fma => return unsafe { down_avx2(l, slot, m0, toks, acts, tokens, out) },
        Isa::Baseline => {}
    }
    let _ = isa;
    down_impl::<0>(l, slot, m0, toks, acts, tokens, out)
}

//! Plain CPU dequantisers of the block types wgmoe computes with: the references the GPU
//! kernels are tested against. Each follows ggml's `dequantize_row_*`
//! (ggml/src/ggml-quants.c) element for element; the tests compare them with the `gguf`
//! Python package's dequantisers on committed fixtures (models/gguf/dequant/).

use half::{bf16, f16};

use super::types::{GgmlType, QK_K};
use crate::blocks::kquant::{self, KRows};
use crate::blocks::quant::{Affine4, Q4Kind};

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// `data` (whole blocks of `t`) as f32 values. Err names what is wrong (an unsupported
/// type, or bytes that are not whole blocks).
pub fn dequantize(t: GgmlType, data: &[u8]) -> Result<Vec<f32>, String> {
    let bb = t.block_bytes();
    if !data.len().is_multiple_of(bb) {
        return Err(format!(
            "{} bytes are not a whole number of {t} blocks of {bb} bytes",
            data.len()
        ));
    }
    let n = data.len() / bb * t.block_elems();
    let mut out = vec![0f32; n];
    let blocks = data.chunks_exact(bb);
    let outs = out.chunks_exact_mut(t.block_elems());
    let f: fn(&[u8], &mut [f32]) = match t {
        GgmlType::F32 => |b, y| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => |b, y| y[0] = f16_at(b, 0),
        GgmlType::BF16 => |b, y| y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        GgmlType::Q8_0 => block_q8_0,
        GgmlType::Q4_0 => block_q4_0,
        GgmlType::Q5_0 => block_q5_0,
        GgmlType::Q5_1 => block_q5_1,
        GgmlType::Q4_K => block_q4_k,
        GgmlType::Q5_K => block_q5_k,
        GgmlType::Q6_K => block_q6_k,
        other => return Err(format!("no dequantiser for tensor type {other}")),
    };
    for (b, y) in blocks.zip(outs) {
        f(b, y);
    }
    Ok(out)
}

/// Q8_0: f16 d, 32 x i8; x = d * q.
pub fn block_q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..32 {
        y[j] = f32::from(b[2 + j] as i8) * d;
    }
}

/// Q4_0: f16 d, 16 bytes of nibbles; low nibbles are elements 0-15, high 16-31;
/// x = (q - 8) * d.
pub fn block_q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = ((qs[j] & 0x0f) as i32 - 8) as f32 * d;
        y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

/// The 5th bits of a Q5_0/Q5_1 block: bit j of the u32 belongs to element j.
fn q5_high(qh: &[u8], j: usize) -> (u8, u8) {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    (
        (((qh >> j) << 4) & 0x10) as u8,
        ((qh >> (j + 12)) & 0x10) as u8,
    )
}

/// Q5_0: f16 d, u32 of 5th bits, 16 bytes of nibbles; x = (q - 16) * d.
pub fn block_q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let (qh, qs) = (&b[2..6], &b[6..22]);
    for j in 0..16 {
        let (h0, h1) = q5_high(qh, j);
        y[j] = (((qs[j] & 0x0f) | h0) as i32 - 16) as f32 * d;
        y[j + 16] = (((qs[j] >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

/// Q5_1: f16 d, f16 m, u32 of 5th bits, 16 bytes of nibbles; x = q * d + m.
pub fn block_q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let (qh, qs) = (&b[4..8], &b[8..24]);
    for j in 0..16 {
        let (h0, h1) = q5_high(qh, j);
        y[j] = ((qs[j] & 0x0f) | h0) as f32 * d + m;
        y[j + 16] = ((qs[j] >> 4) | h1) as f32 * d + m;
    }
}

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes of a Q4_K/Q5_K block
/// (ggml's `get_scale_min_k4`): 6 bits each.
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K: f16 d, f16 dmin, 12 bytes of scales/mins, 128 bytes of nibbles. Each 64 elements
/// use 32 bytes: low nibbles first (sub-block 2i), then high nibbles (2i+1);
/// x = d * sc * q - dmin * m.
pub fn block_q4_k(b: &[u8], y: &mut [f32]) {
    let (d, min) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (i, chunk) in y.chunks_exact_mut(64).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * i, scales);
        let (sc2, m2) = scale_min_k4(2 * i + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let q = &qs[32 * i..32 * i + 32];
        for l in 0..32 {
            chunk[l] = d1 * (q[l] & 0x0f) as f32 - m1;
            chunk[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// Q5_K: Q4_K plus 32 bytes of 5th bits (before the nibbles): element l of the 64-element
/// chunk i takes bit 2i (low half) or 2i+1 (high half) of qh[l].
pub fn block_q5_k(b: &[u8], y: &mut [f32]) {
    let (d, min) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (i, chunk) in y.chunks_exact_mut(64).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * i, scales);
        let (sc2, m2) = scale_min_k4(2 * i + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let (u1, u2) = (1u8 << (2 * i), 2u8 << (2 * i));
        let q = &qs[32 * i..32 * i + 32];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            chunk[l] = d1 * ((q[l] & 0x0f) + h1) as f32 - m1;
            chunk[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
        }
    }
}

/// Q6_K: 128 bytes of low 4 bits, 64 bytes of high 2 bits, 16 i8 scales (one per 16
/// elements), f16 d; x = d * scale * (q - 32). Each 128-element half uses 64 low bytes,
/// 32 high bytes and 8 scales.
pub fn block_q6_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 208);
    for (n, half) in y.chunks_exact_mut(128).enumerate() {
        let ql = &b[64 * n..64 * n + 64];
        let qh = &b[128 + 32 * n..128 + 32 * n + 32];
        let sc = &b[192 + 8 * n..192 + 8 * n + 8];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            half[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            half[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            half[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            half[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

const _: () = assert!(QK_K == 256);

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// `data` (whole rows of `cols` elements of `t`) as the nibble planes and side records of
/// wgmoe's K-plane kinds (`crate::blocks::kquant`), for Q4_K, Q5_K, Q6_K, Q5_0 and Q5_1;
/// None for any other type. Every value `kquant::value` gives from them equals ggml's
/// dequantised value. Err names a block whose scales are not finite (or, for Q5_0, whose
/// offset -16 d is beyond f16), which wgmoe refuses.
pub fn planes(t: GgmlType, data: &[u8], cols: usize) -> Result<Option<KRows>, String> {
    let kind = match t {
        GgmlType::Q4_K => Q4Kind::Q4K,
        GgmlType::Q5_K => Q4Kind::Q5K,
        GgmlType::Q6_K => Q4Kind::Q6K,
        GgmlType::Q5_0 | GgmlType::Q5_1 => Q4Kind::Q5A,
        _ => return Ok(None),
    };
    let (bb, be) = (t.block_bytes(), t.block_elems());
    if !data.len().is_multiple_of(bb) || cols == 0 || !cols.is_multiple_of(be) {
        return Err(format!(
            "{} bytes are not whole rows of {cols} {t} elements ({bb}-byte blocks of {be})",
            data.len()
        ));
    }
    let n = data.len() / bb * be;
    let mut nibbles = vec![0u8; n];
    let mut side = Vec::with_capacity(n / be * kquant::record_words(kind));
    for (bi, (b, q)) in data
        .chunks_exact(bb)
        .zip(nibbles.chunks_exact_mut(be))
        .enumerate()
    {
        let bad = |what: &str| {
            format!(
                "the {t} block holding element {} has {what}: wgmoe refuses it",
                bi * be
            )
        };
        match t {
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                if !(d.is_finite() && dmin.is_finite()) {
                    return Err(bad(&format!(
                        "a scale {d} or min scale {dmin} that is not finite"
                    )));
                }
                side.extend((0..4).map(|w| u32_at(b, 4 * w)));
                let qs = if t == GgmlType::Q4_K {
                    &b[16..144]
                } else {
                    &b[48..176]
                };
                for (i, chunk) in q.chunks_exact_mut(64).enumerate() {
                    for l in 0..32 {
                        chunk[l] = qs[32 * i + l] & 0x0f;
                        chunk[l + 32] = qs[32 * i + l] >> 4;
                    }
                }
                if t == GgmlType::Q5_K {
                    // Word j's bit l is element 32 j + l's 5th bit: bit j of qh[l].
                    let qh = &b[16..48];
                    side.extend((0..8).map(|j| {
                        (0..32).fold(0u32, |w, l| w | (u32::from((qh[l] >> j) & 1) << l))
                    }));
                }
            }
            GgmlType::Q6_K => {
                let d = f16_at(b, 208);
                if !d.is_finite() {
                    return Err(bad(&format!("a scale {d} that is not finite")));
                }
                side.extend((0..4).map(|w| u32_at(b, 192 + 4 * w)));
                side.push(u32::from(u16::from_le_bytes([b[208], b[209]])));
                let mut high = [0u32; 16];
                for n in 0..2 {
                    let (ql, qh) = (&b[64 * n..64 * n + 64], &b[128 + 32 * n..160 + 32 * n]);
                    for l in 0..32 {
                        let parts = [
                            (l, ql[l] & 0x0f, qh[l] & 3),
                            (l + 32, ql[l + 32] & 0x0f, (qh[l] >> 2) & 3),
                            (l + 64, ql[l] >> 4, (qh[l] >> 4) & 3),
                            (l + 96, ql[l + 32] >> 4, (qh[l] >> 6) & 3),
                        ];
                        for (e, nib, h) in parts {
                            let e = 128 * n + e;
                            q[e] = nib;
                            high[e / 16] |= u32::from(h) << (2 * (e % 16));
                        }
                    }
                }
                side.extend(high);
            }
            GgmlType::Q5_0 => {
                let d = half::f16::from_le_bytes([b[0], b[1]]);
                // value (q - 16) d = d q + (-16 d): exact in f32, the offset an f16.
                let o = half::f16::from_f32(-16.0 * d.to_f32());
                if !(d.is_finite() && o.is_finite()) {
                    return Err(bad(&format!(
                        "a scale {d} whose offset -16 d is beyond f16"
                    )));
                }
                side.push(u32::from(d.to_bits()) | u32::from(o.to_bits()) << 16);
                side.push(u32_at(b, 2));
                for j in 0..16 {
                    q[j] = b[6 + j] & 0x0f;
                    q[j + 16] = b[6 + j] >> 4;
                }
            }
            _ => {
                // Q5_1: d, m, then the 5th bits (bit e of the u32 is element e's).
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                if !(d.is_finite() && m.is_finite()) {
                    return Err(bad(&format!("a scale {d} or min {m} that is not finite")));
                }
                side.push(u32_at(b, 0));
                side.push(u32_at(b, 4));
                for j in 0..16 {
                    q[j] = b[8 + j] & 0x0f;
                    q[j + 16] = b[8 + j] >> 4;
                }
            }
        }
    }
    Ok(Some(KRows {
        kind,
        cols,
        nibbles,
        side,
    }))
}

/// `data` (whole blocks of a 4-bit type with 32-element sub-blocks: Q4_0, Q4_K) as nibbles
/// and per-32 (A, B) with x = A q + B, computed as ggml computes them (so A q + B is the
/// value `dequantize` gives, bit for bit): the form wgmoe's affine INT4 experts hold
/// without re-rounding. None for any other type.
pub fn affine4(t: GgmlType, data: &[u8]) -> Result<Option<Affine4>, String> {
    if !matches!(t, GgmlType::Q4_0 | GgmlType::Q4_K) {
        return Ok(None);
    }
    let bb = t.block_bytes();
    if !data.len().is_multiple_of(bb) {
        return Err(format!(
            "{} bytes are not a whole number of {t} blocks of {bb} bytes",
            data.len()
        ));
    }
    let n = data.len() / bb * t.block_elems();
    let mut nibbles = vec![0u8; n];
    let mut blocks = Vec::with_capacity(n / 32);
    for (b, q) in data
        .chunks_exact(bb)
        .zip(nibbles.chunks_exact_mut(t.block_elems()))
    {
        if t == GgmlType::Q4_0 {
            let d = f16_at(b, 0);
            for j in 0..16 {
                q[j] = b[2 + j] & 0x0f;
                q[j + 16] = b[2 + j] >> 4;
            }
            // (q - 8) d = d q - 8 d: ggml multiplies (q - 8) by d, exact either way.
            blocks.push((d, -8.0 * d));
            continue;
        }
        let (d, min) = (f16_at(b, 0), f16_at(b, 2));
        let (scales, qs) = (&b[4..16], &b[16..144]);
        for (i, chunk) in q.chunks_exact_mut(64).enumerate() {
            let (sc1, m1) = scale_min_k4(2 * i, scales);
            let (sc2, m2) = scale_min_k4(2 * i + 1, scales);
            blocks.push((d * sc1 as f32, -(min * m1 as f32)));
            blocks.push((d * sc2 as f32, -(min * m2 as f32)));
            for l in 0..32 {
                chunk[l] = qs[32 * i + l] & 0x0f;
                chunk[l + 32] = qs[32 * i + l] >> 4;
            }
        }
    }
    Ok(Some(Affine4 { nibbles, blocks }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_by_hand() {
        // d = 0.5, byte j holds element j (low) and j+16 (high).
        let mut b = vec![0u8; 18];
        b[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b[2] = 0xf0; // element 0: 0 - 8, element 16: 15 - 8
        let y = dequantize(GgmlType::Q4_0, &b).unwrap();
        assert_eq!(y[0], -4.0);
        assert_eq!(y[16], 3.5);
        assert_eq!(y[1], -4.0);
    }

    #[test]
    fn scale_min_packing() {
        let mut q = [0u8; 12];
        q[0] = 0b1100_0101; // sc0 = 5, top bits feed sc4
        q[4] = 0b0100_0011; // m0 = 3, top bits feed m4
        q[8] = 0x9a; // sc4 low = 0xa, m4 low = 0x9
        assert_eq!(scale_min_k4(0, &q), (5, 3));
        assert_eq!(scale_min_k4(4, &q), (0xa | (3 << 4), 0x9 | (1 << 4)));
    }

    #[test]
    fn partial_blocks_and_unsupported_types_are_refused() {
        assert!(dequantize(GgmlType::Q8_0, &[0u8; 35]).is_err());
        let e = dequantize(GgmlType::IQ2_XXS, &[0u8; 66]).unwrap_err();
        assert!(e.contains("iq2_xxs"), "{e}");
    }
}

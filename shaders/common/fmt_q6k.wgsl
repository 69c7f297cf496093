// Q6_K (src/blocks/kquant.rs): 16 int8 scales (4 words), d, then two words of 2-bit high
// parts per 32 columns; value (d sc) (q - 32), one scale per 16 columns.
const KQ_REC: u32 = 21u;
const KQ_SB: u32 = 8u;
const KQ_HI_BITS: u32 = 2u;

fn kq_terms(m: u32, r: u32, j: u32) -> KTerms {
    // Scales 2j and 2j + 1: bytes 2 (j % 2) and 2 (j % 2) + 1 of word j / 2.
    let sw = w_side(m, r + j / 2u);
    let k = 16u * (j % 2u);
    let s0 = f32(bitcast<i32>(sw << (24u - k)) >> 24u);
    let s1 = f32(bitcast<i32>(sw << (16u - k)) >> 24u);
    let d = unpack2x16float(w_side(m, r + 4u)).x;
    let a = vec2<f32>(d * s0, d * s1);
    let hi = vec2<u32>(w_side(m, r + 5u + 2u * j), w_side(m, r + 6u + 2u * j));
    return KTerms(a, -32.0 * a, hi);
}

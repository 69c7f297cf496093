// Q5_0/Q5_1 (src/blocks/kquant.rs): per 32 columns a record of s | o << 16 and the 5th
// bits; value s q + o.
const KQ_REC: u32 = 2u;
const KQ_SB: u32 = 1u;
const KQ_HI_BITS: u32 = 1u;

fn kq_terms(m: u32, r: u32, j: u32) -> KTerms {
    let so = unpack2x16float(w_side(m, r));
    return KTerms(vec2<f32>(so.x), vec2<f32>(so.y), vec2<u32>(w_side(m, r + 1u), 0u));
}

// Q5_K (src/blocks/kquant.rs): Q4_K's 4 words, then a word of 5th bits per 32 columns.
const KQ_REC: u32 = 12u;
const KQ_SB: u32 = 8u;
const KQ_HI_BITS: u32 = 1u;

fn kq_terms(m: u32, r: u32, j: u32) -> KTerms {
    return kq_k4_terms(m, r, j, vec2<u32>(w_side(m, r + 4u + j), 0u));
}

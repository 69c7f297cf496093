// Q4_K (src/blocks/kquant.rs): a record of 4 words per 256 columns, no high bits.
const KQ_REC: u32 = 4u;
const KQ_SB: u32 = 8u;
const KQ_HI_BITS: u32 = 0u;

fn kq_terms(m: u32, r: u32, j: u32) -> KTerms {
    return kq_k4_terms(m, r, j, vec2<u32>(0u));
}

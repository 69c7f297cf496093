// Q4_K/Q5_K records (src/blocks/kquant.rs): word 0 is d | dmin << 16, words 1..3 the 12
// bytes of 6-bit scales and mins as ggml packs them.

// Byte `i` (0..12) of the packed scales of the record at word `r`.
fn kq_sbyte(m: u32, r: u32, i: u32) -> u32 {
    return (w_side(m, r + 1u + i / 4u) >> (8u * (i % 4u))) & 0xFFu;
}

// Scale and min of sub-block `j` (ggml's get_scale_min_k4), and the word's terms:
// a = d sc, b = -(dmin m) for both halves.
fn kq_k4_terms(m: u32, r: u32, j: u32, hi: vec2<u32>) -> KTerms {
    var sc = 0u;
    var mn = 0u;
    if (j < 4u) {
        sc = kq_sbyte(m, r, j) & 63u;
        mn = kq_sbyte(m, r, j + 4u) & 63u;
    } else {
        sc = (kq_sbyte(m, r, j + 4u) & 15u) | ((kq_sbyte(m, r, j - 4u) >> 6u) << 4u);
        mn = (kq_sbyte(m, r, j + 4u) >> 4u) | ((kq_sbyte(m, r, j) >> 6u) << 4u);
    }
    let dd = unpack2x16float(w_side(m, r));
    let a = dd.x * f32(sc);
    let b = -(dd.y * f32(mn));
    return KTerms(vec2<f32>(a), vec2<f32>(b), hi);
}

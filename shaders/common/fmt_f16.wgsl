// Weights as f16 (rows padded to a multiple of 8 halves): a 16-byte word holds 8
// consecutive columns of one row; no scales. Words at binding 10 (read by w_at of
// f16_halves.wgsl).
@group(0) @binding(10) var<storage, read> w: array<vec4<u32>>;

const WORD_COLS: u32 = 8u;

// No scales to stage (the interface of fmt_q4.wgsl's).
fn stage_scales(m: u32, h0: u32, h1: u32, li: u32) {}

// Word `c` of the row starting at word `row_word`, dotted with columns 8c .. 8c + 8 of the
// activation row at float `xb` (0 at and past `len`). The matrix slot `m` and `s_half`
// (where the row's scales start) are unused: f16 rows have no scales.
fn word_dot(m: u32, row_word: u32, c: u32, s_half: u32, xb: u32, len: u32) -> f32 {
    let h = halves(w_at(row_word + c));
    let k0 = c * 8u;
    return dot(h[0], x_quad(xb, k0, len)) + dot(h[1], x_quad(xb, k0 + 4u, len));
}

// Weights as Q8_0 (layout in src/blocks/q8_0.rs, ggml's blocks split in two sections): a
// 16-byte word holds 16 consecutive columns of one row as int8, one f16 scale per
// 32-column block (2 words). Words at binding 10; the scales at binding 11 and their
// staging come from scales_staged.wgsl, the int8 unpacking from q8_unpack.wgsl.
@group(0) @binding(10) var<storage, read> w: array<vec4<u32>>;

const WORD_COLS: u32 = 16u;
// Words per block of one scale.
const BLOCK_WORDS: u32 = 2u;

fn w_at(i: u32) -> vec4<u32> {
    probe(SITE_W, i * 16u, 16u);
    return w[i];
}

// Word `c` of the row starting at word `row_word` of matrix slot `m` (its block scales from
// half `s_half`), dotted with columns 16c .. 16c + 16 of the activation row at float `xb`
// (0 at and past `len`): the quants' dot product in f32, times the block's scale.
fn word_dot(m: u32, row_word: u32, c: u32, s_half: u32, xb: u32, len: u32) -> f32 {
    let q = w_at(row_word + c);
    let k0 = c * 16u;
    let d = dot(i8x4(q.x), x_quad(xb, k0, len)) + dot(i8x4(q.y), x_quad(xb, k0 + 4u, len))
          + dot(i8x4(q.z), x_quad(xb, k0 + 8u, len)) + dot(i8x4(q.w), x_quad(xb, k0 + 12u, len));
    return w_scale(m, s_half + c / BLOCK_WORDS) * d;
}

// Weights as INT4 (layout in src/blocks/quant.rs): a 16-byte word holds 32 consecutive columns
// of one row as nibbles, one f16 scale per 256-column block (8 words). Words at binding
// 10; the scales at binding 11 and their staging come from scales_staged.wgsl.
@group(0) @binding(10) var<storage, read> w: array<vec4<u32>>;

const WORD_COLS: u32 = 32u;

fn w_at(i: u32) -> vec4<u32> {
    probe(SITE_W, i * 16u, 16u);
    return w[i];
}

// Word `c` of the row starting at word `row_word` of matrix slot `m` (its block scales from
// half `s_half`), dotted with columns 32c .. 32c + 32 of the activation row at float `xb`
// (0 at and past `len`): the nibbles' dot product in f32, times the block's scale.
fn word_dot(m: u32, row_word: u32, c: u32, s_half: u32, xb: u32, len: u32) -> f32 {
    let q = w_at(row_word + c);
    let k0 = c * 32u;
    let d = dot8(q.x, x_quad(xb, k0, len), x_quad(xb, k0 + 4u, len))
          + dot8(q.y, x_quad(xb, k0 + 8u, len), x_quad(xb, k0 + 12u, len))
          + dot8(q.z, x_quad(xb, k0 + 16u, len), x_quad(xb, k0 + 20u, len))
          + dot8(q.w, x_quad(xb, k0 + 24u, len), x_quad(xb, k0 + 28u, len));
    return w_scale(m, s_half + c / 8u) * d;
}

// Weights as affine INT4 (layout in src/blocks/quant.rs, kind int4-a32: GGUF's 4-bit
// blocks as they are): a 16-byte word holds 32 consecutive columns of one row as nibbles,
// and each word is one block with an f16 scale s and an f16 offset o side by side (two
// halves per block), the value being s (nibble - 8) + o. Words at binding 10; the scales
// at binding 11 and their staging come from scales_staged.wgsl.
@group(0) @binding(10) var<storage, read> w: array<vec4<u32>>;

const WORD_COLS: u32 = 32u;

fn w_at(i: u32) -> vec4<u32> {
    probe(SITE_W, i * 16u, 16u);
    return w[i];
}

// Word `c` of the row starting at word `row_word` of matrix slot `m` (its blocks from half
// `s_half`), dotted with columns 32c .. 32c + 32 of the activation row at float `xb` (0 at
// and past `len`): s times the nibbles' dot product plus o times the activations' sum.
fn word_dot(m: u32, row_word: u32, c: u32, s_half: u32, xb: u32, len: u32) -> f32 {
    let q = w_at(row_word + c);
    let k0 = c * 32u;
    let a0 = x_quad(xb, k0, len);
    let a1 = x_quad(xb, k0 + 4u, len);
    let a2 = x_quad(xb, k0 + 8u, len);
    let a3 = x_quad(xb, k0 + 12u, len);
    let a4 = x_quad(xb, k0 + 16u, len);
    let a5 = x_quad(xb, k0 + 20u, len);
    let a6 = x_quad(xb, k0 + 24u, len);
    let a7 = x_quad(xb, k0 + 28u, len);
    let d = dot8(q.x, a0, a1) + dot8(q.y, a2, a3) + dot8(q.z, a4, a5) + dot8(q.w, a6, a7);
    let sum = dot(((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)), vec4<f32>(1.0));
    return w_scale(m, s_half + 2u * c) * d + w_scale(m, s_half + 2u * c + 1u) * sum;
}

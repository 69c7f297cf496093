// Weights in a K-plane format (layout in src/blocks/kquant.rs: GGUF's Q4_K, Q5_K, Q6_K and
// Q5_0/Q5_1 blocks as they are): a 16-byte word holds 32 consecutive columns of one row as
// nibbles (the INT4 layout), and each row's side records (scales, and the bits above the
// nibble) lie in the scale section at binding 11, staged by scales_staged.wgsl. A record
// serves KQ_SB words; the format piece (fmt_q4k, fmt_q5k, fmt_q6k, fmt_q5a) reads a word's
// terms from it: the value of a column in half h (16 columns) of the word is
// a[h] q + b[h], q = nibble + 16 high.
@group(0) @binding(10) var<storage, read> w: array<vec4<u32>>;

const WORD_COLS: u32 = 32u;

struct KTerms {
    a: vec2<f32>,
    b: vec2<f32>,
    // The word's high parts: KQ_HI_BITS per column, columns in bit order (hi.y: Q6_K's
    // columns 16..31).
    hi: vec2<u32>,
}

fn w_at(i: u32) -> vec4<u32> {
    probe(SITE_W, i * 16u, 16u);
    return w[i];
}

// The nibbles of one u32 of a word: its low nibbles (columns 0..3 of its 8) or, shifted
// by 4 first, its high ones (4..7).
fn nib4(v: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xU8(v & 0x0F0F0F0Fu));
}

// Columns 4g .. 4g + 4 of the word's high parts, times 16.
fn kq_hi4(hi: vec2<u32>, g: u32) -> vec4<f32> {
    if (KQ_HI_BITS == 1u) {
        let b = vec4<u32>(hi.x >> (4u * g));
        return vec4<f32>((b >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u)) * 16.0;
    }
    if (KQ_HI_BITS == 2u) {
        let b = vec4<u32>(hi[g / 4u] >> (8u * (g % 4u)));
        return vec4<f32>((b >> vec4<u32>(0u, 2u, 4u, 6u)) & vec4<u32>(3u)) * 16.0;
    }
    return vec4<f32>(0.0);
}

// The terms of word `c` of a row whose records start at half `s_half` (even).
fn kq_word_terms(m: u32, c: u32, s_half: u32) -> KTerms {
    return kq_terms(m, s_half / 2u + (c / KQ_SB) * KQ_REC, c % KQ_SB);
}

// Word `c` of the row starting at word `row_word` of matrix slot `m` (its records from
// half `s_half`), dotted with columns 32c .. 32c + 32 of the activation row at float `xb`
// (0 at and past `len`): per half, a times the q . x sum plus b times the x sum.
fn word_dot(m: u32, row_word: u32, c: u32, s_half: u32, xb: u32, len: u32) -> f32 {
    let q = w_at(row_word + c);
    let t = kq_word_terms(m, c, s_half);
    let k0 = c * 32u;
    let a0 = x_quad(xb, k0, len);
    let a1 = x_quad(xb, k0 + 4u, len);
    let a2 = x_quad(xb, k0 + 8u, len);
    let a3 = x_quad(xb, k0 + 12u, len);
    let a4 = x_quad(xb, k0 + 16u, len);
    let a5 = x_quad(xb, k0 + 20u, len);
    let a6 = x_quad(xb, k0 + 24u, len);
    let a7 = x_quad(xb, k0 + 28u, len);
    let d0 = dot(nib4(q.x) + kq_hi4(t.hi, 0u), a0) + dot(nib4(q.x >> 4u) + kq_hi4(t.hi, 1u), a1)
           + dot(nib4(q.y) + kq_hi4(t.hi, 2u), a2) + dot(nib4(q.y >> 4u) + kq_hi4(t.hi, 3u), a3);
    let d1 = dot(nib4(q.z) + kq_hi4(t.hi, 4u), a4) + dot(nib4(q.z >> 4u) + kq_hi4(t.hi, 5u), a5)
           + dot(nib4(q.w) + kq_hi4(t.hi, 6u), a6) + dot(nib4(q.w >> 4u) + kq_hi4(t.hi, 7u), a7);
    let s0 = dot((a0 + a1) + (a2 + a3), vec4<f32>(1.0));
    let s1 = dot((a4 + a5) + (a6 + a7), vec4<f32>(1.0));
    return (t.a.x * d0 + t.b.x * s0) + (t.a.y * d1 + t.b.y * s1);
}

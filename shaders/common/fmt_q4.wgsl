// Weights as INT4 (layout in src/format/quant.rs): a 16-byte word holds 32 consecutive columns
// of one row as nibbles, one f16 scale per 256-column block (8 words). Words at binding
// 10, scales (the same buffer, as u32 pairs of halves) at binding 11.
//
// A workgroup's rows keep their scales side by side, so it stages them in workgroup memory
// once (stage_scales: neighbouring lanes load neighbouring u32 words) and every word's dot
// product reads its block's scale from there: each scale byte leaves device memory once,
// in whole sectors, instead of once per word with 8 lanes sharing a word.
@group(0) @binding(10) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(11) var<storage, read> ws: array<u32>;

const WORD_COLS: u32 = 32u;
// u32 words of staged scales per matrix (two matrices: gate and up); rows past it read
// their scales from device memory.
const SCALE_CAP: u32 = 1024u;
var<workgroup> sc_s: array<u32, 2048>;
// Per matrix: the first staged u32 word of `ws`, and how many are staged.
var<private> sc_first: array<u32, 2>;
var<private> sc_n: array<u32, 2>;

fn w_at(i: u32) -> vec4<u32> {
    probe(SITE_W, i * 16u, 16u);
    return w[i];
}

// Stage the scales of matrix slot `m` (0 or 1) from half `h0` to half `h1` (exclusive).
// Every lane calls it with the same arguments; a workgroupBarrier must follow before
// word_dot reads them (and precede a new staging into the same slot).
fn stage_scales(m: u32, h0: u32, h1: u32, li: u32) {
    let first = h0 / 2u;
    let n = min((h1 + 1u) / 2u - first, SCALE_CAP);
    sc_first[m] = first;
    sc_n[m] = n;
    for (var i = li; i < n; i += 64u) {
        probe(SITE_WS, (first + i) * 4u, 4u);
        sc_s[m * SCALE_CAP + i] = ws[first + i];
    }
}

// Half `i` of the scales of matrix slot `m`: staged, or from device memory past the cap.
fn w_scale(m: u32, i: u32) -> f32 {
    let rel = i / 2u - sc_first[m];
    var word = 0u;
    if (rel < sc_n[m]) {
        word = sc_s[m * SCALE_CAP + rel];
    } else {
        probe(SITE_WS, (i / 2u) * 4u, 4u);
        word = ws[i / 2u];
    }
    return unpack2x16float(word)[i % 2u];
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

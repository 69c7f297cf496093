// Block scales of the formats that have them (fmt_q4.wgsl, fmt_q8.wgsl, ...): f16, as u32
// pairs of halves at binding 11 (the weights' buffer, past the words), one per block of a
// row, a matrix's rows side by side; the K-plane formats' side records (kq_common.wgsl)
// likewise, read as u32 words.
//
// A workgroup's rows keep their scales side by side, so it stages them in workgroup memory
// once (stage_scales: neighbouring lanes load neighbouring u32 words) and every word's dot
// product reads its block's scale from there: each scale byte leaves device memory once,
// in whole sectors, instead of once per word with 8 lanes sharing a word.
@group(0) @binding(11) var<storage, read> ws: array<u32>;

// u32 words of staged scales per matrix (two matrices: gate and up); rows past it read
// their scales from device memory.
const SCALE_CAP: u32 = 1024u;
var<workgroup> sc_s: array<u32, 2048>;
// Per matrix: the first staged u32 word of `ws`, and how many are staged.
var<private> sc_first: array<u32, 2>;
var<private> sc_n: array<u32, 2>;

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

// u32 word `i` of the scale section of matrix slot `m`: staged, or from device memory
// past the cap.
fn w_side(m: u32, i: u32) -> u32 {
    let rel = i - sc_first[m];
    if (rel < sc_n[m]) {
        return sc_s[m * SCALE_CAP + rel];
    }
    probe(SITE_WS, i * 4u, 4u);
    return ws[i];
}

// Half `i` of the scales of matrix slot `m`.
fn w_scale(m: u32, i: u32) -> f32 {
    return unpack2x16float(w_side(m, i / 2u))[i % 2u];
}


// Tiled matrix-matrix product for GPUs (prefill steps):
//   out[t, row_base + n] (+)= W[n] . x[t] (+ bias[row_base + n])
// A workgroup computes TM tokens x TN rows. Per step of KC columns its lanes stage the
// activation tile and the weight tile (dequantised by the tile piece of the weights'
// format) in workgroup memory, neighbouring lanes loading neighbouring 16-byte words of a
// row, then each lane accumulates one row for 8 tokens from workgroup memory. Each weight
// byte is read once per TM tokens (the storage matmul reads it once per 4).
// Grid: (row tiles, token tiles, 1). Parameters and bindings as matvec.wgsl.

// Params, p, bias (4) and out (5): the dense_params piece.

const TM: u32 = 16u;
const TN: u32 = 32u;
const KC: u32 = 64u;
// Weight tile rows padded by one float: the lanes of a subgroup read 32 rows at one
// column, which a stride of 65 spreads over the memory banks.
const WP: u32 = 65u;
var<workgroup> xt: array<f32, 1024>;
var<workgroup> wt: array<f32, 2080>;

// Tokens 8g .. 8g + 8 of column kk of the activation tile.
fn x8(g: u32, kk: u32) -> array<vec4<f32>, 2> {
    let b = g * 8u * KC + kk;
    return array<vec4<f32>, 2>(
        vec4<f32>(xt[b], xt[b + KC], xt[b + 2u * KC], xt[b + 3u * KC]),
        vec4<f32>(xt[b + 4u * KC], xt[b + 5u * KC], xt[b + 6u * KC], xt[b + 7u * KC]));
}

fn store_out(t: u32, row: u32, v: f32) {
    if (t >= step.n_tokens) { return; }
    var r = v;
    if ((p.flags & MATMUL_BIAS) != 0u) { r += bias[row]; }
    let o = t * p.out_stride + row;
    if ((p.flags & MATMUL_ACCUMULATE) != 0u) { r += out[o]; }
    out[o] = r;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n0 = wid.x * TN;
    let t0 = wid.y * TM;
    if (n0 >= p.n_rows || t0 >= step.n_tokens) { return; }
    let nr = min(TN, p.n_rows - n0);
    let nb = p.blocks_per_row;
    let s0 = p.s_word0 * 2u + (p.w_row0 + n0) * nb;
    stage_scales(0u, s0, s0 + nr * nb, li);
    let wpc = KC / WORD_COLS;
    let r = li % TN;
    let g = li / TN;
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < p.k; k0 += KC) {
        // The scales staged above, and the last step's tiles read, before they change.
        workgroupBarrier();
        for (var e = li; e < TM * KC / 4u; e += 64u) {
            let tt = e / (KC / 4u);
            let col = k0 + (e % (KC / 4u)) * 4u;
            var v = vec4<f32>(0.0);
            if (t0 + tt < step.n_tokens) { v = x_quad((t0 + tt) * p.x_stride, col, p.k); }
            let d = tt * KC + (e % (KC / 4u)) * 4u;
            xt[d] = v.x; xt[d + 1u] = v.y; xt[d + 2u] = v.z; xt[d + 3u] = v.w;
        }
        for (var e = li; e < TN * wpc; e += 64u) {
            let rr = e / wpc;
            let c = k0 / WORD_COLS + e % wpc;
            let n = p.w_row0 + n0 + rr;
            stage_word(0u, n * p.words_per_row, c, p.s_word0 * 2u + n * nb, rr * WP + (e % wpc) * WORD_COLS,
                       rr < nr && c < p.words_per_row);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < KC; kk++) {
            let w = wt[r * WP + kk];
            let x = x8(g, kk);
            a0 += x[0] * w;
            a1 += x[1] * w;
        }
    }
    if (r >= nr) { return; }
    let row = p.row_base + n0 + r;
    let tb = t0 + g * 8u;
    store_out(tb, row, a0.x);
    store_out(tb + 1u, row, a0.y);
    store_out(tb + 2u, row, a0.z);
    store_out(tb + 3u, row, a0.w);
    store_out(tb + 4u, row, a1.x);
    store_out(tb + 5u, row, a1.y);
    store_out(tb + 6u, row, a1.z);
    store_out(tb + 7u, row, a1.w);
}

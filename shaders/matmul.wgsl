// out[t, row_base + n] (+)= sum_k x[t, k] * W[n, k] (+ bias[row_base + n])
// W is f16, row-major, each row padded to a multiple of 8 halves so a row is read as
// vec4<u32> (8 halves per load): llvmpipe loads storage lane by lane with bounds checks,
// so fewer, wider loads win. Accumulation is f32. One invocation owns one weight row and
// TT tokens, so a prefill chunk reads each weight row once per TT tokens (matrix-matrix),
// while decode (one token) is a plain matvec. Matrices larger than one binding are split
// by rows; each chunk is one dispatch with its own row_base.

struct Params {
    k: u32,              // input features
    n_rows: u32,         // rows in this chunk
    row_base: u32,       // global row index of this chunk's first row
    vec4_per_row: u32,   // vec4<u32> per weight row
    x_stride: u32,
    out_stride: u32,
    flags: u32,          // MATMUL_BIAS, MATMUL_ACCUMULATE, LAST_TOKEN_ONLY
    _a: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

const TT: u32 = 4u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = gid.x;
    if (n >= p.n_rows) { return; }
    let tt = storage_tokens(gid.y);
    let t_begin = tt.x;
    let t_end = tt.y;
    let t_out0 = tt.z;
    if (t_begin >= t_end) { return; }
    // Tokens past t_end re-read the last valid row and are not stored.
    let xb0 = t_begin * p.x_stride;
    let xb1 = min(t_begin + 1u, t_end - 1u) * p.x_stride;
    let xb2 = min(t_begin + 2u, t_end - 1u) * p.x_stride;
    let xb3 = min(t_begin + 3u, t_end - 1u) * p.x_stride;
    var acc = vec4<f32>(0.0);
    let wrow = n * p.vec4_per_row;
    let full = p.k / 8u;
    for (var c = 0u; c < full; c++) {
        let wv = halves(w_at(wrow + c));
        let k0 = c * 8u;
        let a0 = act8_whole(xb0, k0);
        let a1 = act8_whole(xb1, k0);
        let a2 = act8_whole(xb2, k0);
        let a3 = act8_whole(xb3, k0);
        acc += vec4<f32>(dot(wv[0], a0[0]) + dot(wv[1], a0[1]),
                         dot(wv[0], a1[0]) + dot(wv[1], a1[1]),
                         dot(wv[0], a2[0]) + dot(wv[1], a2[1]),
                         dot(wv[0], a3[0]) + dot(wv[1], a3[1]));
    }
    if (full * 8u < p.k) {
        let wv = halves(w_at(wrow + full));
        let k0 = full * 8u;
        let a0 = act8_tail(xb0, k0, p.k);
        let a1 = act8_tail(xb1, k0, p.k);
        let a2 = act8_tail(xb2, k0, p.k);
        let a3 = act8_tail(xb3, k0, p.k);
        acc += vec4<f32>(dot(wv[0], a0[0]) + dot(wv[1], a0[1]),
                         dot(wv[0], a1[0]) + dot(wv[1], a1[1]),
                         dot(wv[0], a2[0]) + dot(wv[1], a2[1]),
                         dot(wv[0], a3[0]) + dot(wv[1], a3[1]));
    }
    store_rows(n, t_out0, t_end - t_begin, acc, vec4<f32>(0.0));
}

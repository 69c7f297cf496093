// Q8_0 matrix products for CPU adapters (llvmpipe; the storage plan): the twin of
// matmul.wgsl for Q8_0 weights (layout in src/blocks/q8_0.rs),
//   out[t, row_base + n] (+)= W[n] . x[t] (+ bias[row_base + n]).
// One invocation owns one weight row and TT tokens, so a prefill chunk reads each weight
// row once per TT tokens and decode is a plain matvec: on a CPU a lane streaming its own
// row beats the GPU-shaped matvec's 64-lane reduction per 4 rows. Each block of 32 columns
// (two 16-byte words of int8) is summed in f32, then scaled by its f16 scale. The Q8_0
// path of the GPU plan is matvec.wgsl / gemm.wgsl. Grid: (rows / 64, tokens / TT).

// Params, p, bias (4) and out (5): the dense_params piece.
// bindings 2 and 3: x, from the activation piece (act_x4.wgsl).
// bindings 10 and 11: W, from the row piece (q8_row.wgsl).

const TT: u32 = 4u;

// Word `q` (columns k0 .. k0 + 16) dotted with the four token rows at xb.
fn word_dots(q: vec4<u32>, k0: u32, xb: vec4<u32>) -> vec4<f32> {
    var d = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        let qv = i8x4(q[j]);
        let c = k0 + 4u * j;
        d += vec4<f32>(dot(qv, x_quad(xb.x, c, p.k)), dot(qv, x_quad(xb.y, c, p.k)),
                       dot(qv, x_quad(xb.z, c, p.k)), dot(qv, x_quad(xb.w, c, p.k)));
    }
    return d;
}

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
    let xb = vec4<u32>(t_begin, min(t_begin + 1u, t_end - 1u), min(t_begin + 2u, t_end - 1u),
                       min(t_begin + 3u, t_end - 1u)) * p.x_stride;
    let r = p.w_row0 + n;
    let wrow = r * p.words_per_row;
    let srow = p.s_word0 * 2u + r * p.blocks_per_row;
    var acc = vec4<f32>(0.0);
    for (var b = 0u; b < p.blocks_per_row; b++) {
        let c = 2u * b;
        let d = word_dots(w_at(wrow + c), c * 16u, xb) + word_dots(w_at(wrow + c + 1u), c * 16u + 16u, xb);
        acc += d * scale_at(srow + b);
    }
    store_rows(n, t_out0, t_end - t_begin, acc, vec4<f32>(0.0));
}

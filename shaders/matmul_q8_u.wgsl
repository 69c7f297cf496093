// Q8_0 matrix-vector product of ONE token with x in a uniform window, for CPU adapters
// (the twin of matmul_u.wgsl for Q8_0 weights; layout in src/blocks/q8_0.rs): every
// invocation reads the same activation address, which llvmpipe loads once for all lanes,
// while each lane streams its own weight row; the storage variant (matmul_q8.wgsl) serves
// multi-token steps. Each block of 32 columns is summed in f32, then scaled by its f16
// scale. Parameters as matmul_q8.wgsl (LAST_TOKEN_ONLY is implied); x_stride is unused.

// Params, p, bias (4) and out (5): the dense_params piece.
// binding 2: x, the uniform window (uniform_window.wgsl).
// bindings 10 and 11: W, from the row piece (q8_row.wgsl).

// Word `q` dotted with columns k0 .. k0 + 16 of x.
fn word_dot_u(q: vec4<u32>, k0: u32) -> f32 {
    return dot(i8x4(q.x), xa(0u, k0, p.k)) + dot(i8x4(q.y), xa(0u, k0 + 4u, p.k))
         + dot(i8x4(q.z), xa(0u, k0 + 8u, p.k)) + dot(i8x4(q.w), xa(0u, k0 + 12u, p.k));
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = gid.x;
    if (n >= p.n_rows || step.n_tokens == 0u) { return; }
    let r = p.w_row0 + n;
    let wrow = r * p.words_per_row;
    let srow = p.s_word0 * 2u + r * p.blocks_per_row;
    var acc = 0.0;
    for (var b = 0u; b < p.blocks_per_row; b++) {
        let c = 2u * b;
        acc += (word_dot_u(w_at(wrow + c), c * 16u) + word_dot_u(w_at(wrow + c + 1u), c * 16u + 16u)) * scale_at(srow + b);
    }
    let row = p.row_base + n;
    if ((p.flags & MATMUL_BIAS) != 0u) { acc += bias[row]; }
    if ((p.flags & MATMUL_ACCUMULATE) != 0u) { acc += out[row]; }
    out[row] = acc;
}

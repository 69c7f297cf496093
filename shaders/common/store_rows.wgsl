// The row-per-lane matmuls' results (matmul.wgsl, matmul_w.wgsl, matmul_q8.wgsl,
// matmul_q8_w.wgsl): weight row `n`'s products with `cnt` (<= 8) tokens, token j's in
// component j of (acc0, acc1), stored at output rows o0 .. o0 + cnt, with the bias, then
// the residual when accumulating.
fn store_rows(n: u32, o0: u32, cnt: u32, acc0: vec4<f32>, acc1: vec4<f32>) {
    let row = p.row_base + n;
    var b = 0.0;
    if ((p.flags & MATMUL_BIAS) != 0u) { b = bias[row]; }
    for (var j = 0u; j < cnt; j++) {
        var v = 0.0;
        if (j < 4u) { v = acc0[j]; } else { v = acc1[j - 4u]; }
        let o = (o0 + j) * p.out_stride + row;
        v += b;
        if ((p.flags & MATMUL_ACCUMULATE) != 0u) { v += out[o]; }
        out[o] = v;
    }
}

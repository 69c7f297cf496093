// Matrix-vector products for GPUs (decode, and the last-token lm_head of a prefill):
//   out[t, row_base + n] (+)= W[n] . x[t] (+ bias[row_base + n])
// W's rows are 16-byte words in a format piece (f16, ...). A workgroup of 64 lanes serves
// ROWS consecutive rows (fewer, p.group_rows, for a matrix of few rows); their words are taken as one flat run and lane l reads words
// l, l + 64, ...: neighbouring lanes read neighbouring 16-byte words (coalesced) and each
// weight byte is read once. The rows' partial sums are combined by the reduce piece
// (subgroups, or workgroup memory). Grid: (row groups, K splits, tokens). With
// S = num_workgroups.y splits, split s sums its share of the columns into row s of `out`
// (one-token steps of matrices with few rows, e.g. the router: the top-k kernel adds the
// S rows), so a small matrix still fills the GPU with workgroups.

// Params, p, bias (4) and out (5): the dense_params piece.
// binding 2 and 3: x, from the activation piece; 10 (and 11): W, from the format piece.
// matvec_norm (the same body with act_cols_norm.wgsl): x is the residual stream, normalised
// on load with the RMSNorm weight at binding 6; with MATVEC_NORM_WRITE the first workgroup
// also writes the normalised row to binding 7.

const ROWS: u32 = 4u;

@compute @workgroup_size(64)
fn main(inv: Inv, @builtin(num_workgroups) nwg: vec3<u32>) {
    // Fewer rows per workgroup for a matrix of few rows, so it still fills a GPU.
    let gr = select(ROWS, min(p.group_rows, ROWS), p.group_rows != 0u);
    let r0 = inv.wid.x * gr;
    let split = inv.wid.y;
    let splits = nwg.y;
    var t = inv.wid.z;
    var t_out = t;
    if ((p.flags & LAST_TOKEN_ONLY) != 0u) {
        t = step.n_tokens - 1u;
        t_out = 0u;
    }
    // Both conditions are the same for every lane: the reduction's barriers stay uniform.
    if (t >= step.n_tokens || r0 >= p.n_rows) { return; }
    let nr = min(gr, p.n_rows - r0);
    let per = (p.words_per_row + splits - 1u) / splits;
    let c0 = min(split * per, p.words_per_row);
    let span = min(per, p.words_per_row - c0);
    let xb = t * p.x_stride;
    // matvec_norm: the row's RMSNorm scale (and, for one workgroup, the normalised row).
    act_prepare(xb, p.k, inv.li, p.eps, (p.flags & MATVEC_NORM_WRITE) != 0u && inv.wid.x == 0u && split == 0u);
    let s0 = p.s_word0 * 2u + (p.w_row0 + r0) * p.blocks_per_row;
    stage_scales(0u, s0, s0 + nr * p.blocks_per_row, inv.li);
    workgroupBarrier();
    var acc = vec4<f32>(0.0);
    for (var f = inv.li; f < nr * span; f += 64u) {
        let r = f / span;
        let n = p.w_row0 + r0 + r;
        acc += word_dot(0u, n * p.words_per_row, c0 + f % span, p.s_word0 * 2u + n * p.blocks_per_row, xb, p.k) * onehot4(r);
    }
    let s = wg_sum4(acc, inv);
    if (inv.li == 0u) {
        for (var i = 0u; i < nr; i++) {
            let row = p.row_base + r0 + i;
            var v = s[i];
            if ((p.flags & MATMUL_BIAS) != 0u && split == 0u) { v += bias[row]; }
            let o = (t_out * splits + split) * p.out_stride + row;
            if ((p.flags & MATMUL_ACCUMULATE) != 0u) { v += out[o]; }
            out[o] = v;
        }
    }
}

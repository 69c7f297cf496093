// The weight-tile loader of the tiled kernels for K-plane weights (with kq_common.wgsl).

// Tiled kernels: word `c` of the row at `row_word` (matrix slot `m`, records from half
// `s_half`) as 32 f32 columns a q + b into the workgroup's weight tile `wt` (declared by
// the kernel) from index `dst`; zeros when !valid (columns past the row).
fn stage_word(m: u32, row_word: u32, c: u32, s_half: u32, dst: u32, valid: bool) {
    if (!valid) {
        for (var i = 0u; i < 32u; i++) { wt[dst + i] = 0.0; }
        return;
    }
    let q = w_at(row_word + c);
    let t = kq_word_terms(m, c, s_half);
    for (var j = 0u; j < 4u; j++) {
        // u32 j holds columns 8j .. 8j + 8: half j / 2 of the word.
        let a = t.a[j / 2u];
        let b = t.b[j / 2u];
        let lo = (nib4(q[j]) + kq_hi4(t.hi, 2u * j)) * a + b;
        let hi = (nib4(q[j] >> 4u) + kq_hi4(t.hi, 2u * j + 1u)) * a + b;
        let d = dst + j * 8u;
        wt[d] = lo.x; wt[d + 1u] = lo.y; wt[d + 2u] = lo.z; wt[d + 3u] = lo.w;
        wt[d + 4u] = hi.x; wt[d + 5u] = hi.y; wt[d + 6u] = hi.z; wt[d + 7u] = hi.w;
    }
}

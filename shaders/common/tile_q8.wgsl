// The weight-tile loader of the tiled kernels for Q8_0 weights (with fmt_q8.wgsl).

// Tiled kernels: word `c` of the row at `row_word` (matrix slot `m`, scales from half
// `s_half`) as 16 scaled f32 columns into the workgroup's weight tile `wt` (declared by
// the kernel) from index `dst`; zeros when !valid (columns past the row).
fn stage_word(m: u32, row_word: u32, c: u32, s_half: u32, dst: u32, valid: bool) {
    if (!valid) {
        for (var i = 0u; i < 16u; i++) { wt[dst + i] = 0.0; }
        return;
    }
    let q = w_at(row_word + c);
    let s = w_scale(m, s_half + c / BLOCK_WORDS);
    for (var j = 0u; j < 4u; j++) {
        let v = i8x4(q[j]) * s;
        let d = dst + j * 4u;
        wt[d] = v.x; wt[d + 1u] = v.y; wt[d + 2u] = v.z; wt[d + 3u] = v.w;
    }
}

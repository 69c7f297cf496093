// The weight-tile loader of the tiled kernels for affine INT4 weights (with fmt_q4a.wgsl).

// Tiled kernels: word `c` of the row at `row_word` (matrix slot `m`, blocks from half
// `s_half`) as 32 f32 columns s (nibble - 8) + o into the workgroup's weight tile `wt`
// (declared by the kernel) from index `dst`; zeros when !valid (columns past the row).
fn stage_word(m: u32, row_word: u32, c: u32, s_half: u32, dst: u32, valid: bool) {
    if (!valid) {
        for (var i = 0u; i < 32u; i++) { wt[dst + i] = 0.0; }
        return;
    }
    let q = w_at(row_word + c);
    let s = w_scale(m, s_half + 2u * c);
    let o = vec4<f32>(w_scale(m, s_half + 2u * c + 1u));
    for (var j = 0u; j < 4u; j++) {
        let word = q[j];
        let lo = (vec4<f32>(unpack4xU8(word & 0x0F0F0F0Fu)) - vec4<f32>(8.0)) * s + o;
        let hi = (vec4<f32>(unpack4xU8((word >> 4u) & 0x0F0F0F0Fu)) - vec4<f32>(8.0)) * s + o;
        let d = dst + j * 8u;
        wt[d] = lo.x; wt[d + 1u] = lo.y; wt[d + 2u] = lo.z; wt[d + 3u] = lo.w;
        wt[d + 4u] = hi.x; wt[d + 5u] = hi.y; wt[d + 6u] = hi.z; wt[d + 7u] = hi.w;
    }
}

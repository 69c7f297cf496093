// The weight-tile loader of the tiled kernels for f16 weights (with fmt_f16.wgsl).

// Tiled kernels: word `c` of the row at `row_word` as 8 f32 columns into the workgroup's
// weight tile `wt` (declared by the kernel) from index `dst`; zeros when !valid (columns
// past the row).
fn stage_word(m: u32, row_word: u32, c: u32, s_half: u32, dst: u32, valid: bool) {
    var h = array<vec4<f32>, 2>(vec4<f32>(0.0), vec4<f32>(0.0));
    if (valid) { h = halves(w_at(row_word + c)); }
    let a = h[0];
    let b = h[1];
    wt[dst] = a.x; wt[dst + 1u] = a.y; wt[dst + 2u] = a.z; wt[dst + 3u] = a.w;
    wt[dst + 4u] = b.x; wt[dst + 5u] = b.y; wt[dst + 6u] = b.z; wt[dst + 7u] = b.w;
}

// The tokens one invocation of the window kernels (matmul_w.wgsl, matmul_q8_w.wgsl) serves:
// of the window of `p.tw` token rows from `p.t0`, 8 per grid row `wy`, or the step's last
// token alone (LAST_TOKEN_ONLY). x = window-relative first token (lo), y = how many (cnt,
// 0: none), z = the output row of the first (o0).
fn window_tokens(wy: u32) -> vec3<u32> {
    let nt = step.n_tokens;
    if (p.t0 >= nt) { return vec3<u32>(0u); }
    let in_window = min(p.tw, nt - p.t0);
    if ((p.flags & LAST_TOKEN_ONLY) != 0u) {
        if (wy > 0u || nt - 1u >= p.t0 + in_window) { return vec3<u32>(0u); }
        return vec3<u32>(nt - 1u - p.t0, 1u, 0u);
    }
    let lo = wy * 8u;
    if (lo >= in_window) { return vec3<u32>(0u); }
    return vec3<u32>(lo, min(8u, in_window - lo), p.t0 + lo);
}

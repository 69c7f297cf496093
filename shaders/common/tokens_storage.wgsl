// The tokens one invocation of the storage matmuls (matmul.wgsl, matmul_q8.wgsl) serves:
// TT from grid row `gy` * TT, or the step's last token alone (LAST_TOKEN_ONLY). x = first
// token, y = one past the last (x >= y: none), z = the output row of the first.
fn storage_tokens(gy: u32) -> vec3<u32> {
    if ((p.flags & LAST_TOKEN_ONLY) != 0u) {
        if (gy > 0u) { return vec3<u32>(0u); }
        return vec3<u32>(step.n_tokens - 1u, step.n_tokens, 0u);
    }
    let t_begin = gy * TT;
    return vec3<u32>(t_begin, min(t_begin + TT, step.n_tokens), t_begin);
}

// Storing one token's keys and values into an f32 or f16 cache (rope_kv.wgsl, with
// kv_store_f32.wgsl or kv_store_f16.wgsl): two consecutive elements per lane, so a word of
// an f16 cache is written whole by one invocation.
fn kv_store_row(lane: u32, pos: u32, base: u32, q_dim: u32, kv_dim: u32, inv_k: f32, rrow: u32) {
    let cbase = pos * kv_dim;
    for (var w = lane; w < kv_dim / 2u; w += WG) {
        let j = 2u * w;
        kv_store2(true, cbase + j, k_roped(base, q_dim, j, inv_k, rrow), k_roped(base, q_dim, j + 1u, inv_k, rrow));
        kv_store2(false, cbase + j, v_in(base, q_dim, kv_dim, j), v_in(base, q_dim, kv_dim, j + 1u));
    }
}

// The q8_0 KV cache's elements through the probe (with kv_q8_read.wgsl), for the
// attention kernels: one byte per value (the block scales, 4 bytes per block, are not
// counted).
fn k_at(i: u32) -> f32 {
    probe(SITE_KV, i, 1u);
    return q8_kv_at(true, i);
}

fn v_at(i: u32) -> f32 {
    probe(SITE_KV, i, 1u);
    return q8_kv_at(false, i);
}

// The KV cache as f32 (`cache_k`, `cache_v`, declared by the kernel): element i of a
// layer's keys or values, through the probe.
fn k_at(i: u32) -> f32 {
    probe(SITE_KV, i * 4u, 4u);
    return cache_k[i];
}

fn v_at(i: u32) -> f32 {
    probe(SITE_KV, i * 4u, 4u);
    return cache_v[i];
}

// The KV cache as f32, a layer's keys and values at bindings 3 and 4 of the attention
// kernels: element i of them, through the probe.
@group(0) @binding(3) var<storage, read> cache_k: array<f32>;
@group(0) @binding(4) var<storage, read> cache_v: array<f32>;

fn k_at(i: u32) -> f32 {
    probe(SITE_KV, i * 4u, 4u);
    return cache_k[i];
}

fn v_at(i: u32) -> f32 {
    probe(SITE_KV, i * 4u, 4u);
    return cache_v[i];
}

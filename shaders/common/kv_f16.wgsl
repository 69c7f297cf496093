// The KV cache as f16, two values per u32 (pack2x16float: no SHADER_F16 needed), a layer's
// keys and values at bindings 3 and 4 of the attention kernels: element i of them, through
// the probe.
@group(0) @binding(3) var<storage, read> cache_k: array<u32>;
@group(0) @binding(4) var<storage, read> cache_v: array<u32>;

fn k_at(i: u32) -> f32 {
    probe(SITE_KV, i * 2u, 2u);
    return unpack2x16float(cache_k[i / 2u])[i % 2u];
}

fn v_at(i: u32) -> f32 {
    probe(SITE_KV, i * 2u, 2u);
    return unpack2x16float(cache_v[i / 2u])[i % 2u];
}

// The KV cache as f16 (two per u32) for the window attention kernel (attention_w.wgsl):
// keys four at a time (one 8-byte load), values one at a time; bindings 3 and 4.
@group(0) @binding(3) var<storage, read> cache_k: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> cache_v: array<u32>;

// Keys 4q .. 4q + 4 of the layer.
fn k4_at(q: u32) -> vec4<f32> {
    let w = cache_k[q];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

fn v_at(i: u32) -> f32 {
    return unpack2x16float(cache_v[i / 2u])[i % 2u];
}

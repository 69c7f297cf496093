// The KV cache as f32 for the window attention kernel (attention_w.wgsl, CPU adapters):
// keys four at a time (one 16-byte load), values one at a time; bindings 3 and 4.
@group(0) @binding(3) var<storage, read> cache_k: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> cache_v: array<f32>;

// Keys 4q .. 4q + 4 of the layer.
fn k4_at(q: u32) -> vec4<f32> {
    return cache_k[q];
}

fn v_at(i: u32) -> f32 {
    return cache_v[i];
}

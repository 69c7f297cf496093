// Writing the KV cache as f32 (rope_kv.wgsl): bindings 7 (keys) and 8 (values).
@group(0) @binding(7) var<storage, read_write> cache_k: array<f32>;
@group(0) @binding(8) var<storage, read_write> cache_v: array<f32>;

// Elements i and i + 1 (i even) of the keys (`key`) or the values.
fn kv_store2(key: bool, i: u32, a: f32, b: f32) {
    if (key) {
        cache_k[i] = a;
        cache_k[i + 1u] = b;
    } else {
        cache_v[i] = a;
        cache_v[i + 1u] = b;
    }
}

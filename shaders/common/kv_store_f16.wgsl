// Writing the KV cache as f16, two values per u32 (rope_kv.wgsl): bindings 7 (keys) and 8
// (values). One invocation writes both halves of a word, so no two race on it.
@group(0) @binding(7) var<storage, read_write> cache_k: array<u32>;
@group(0) @binding(8) var<storage, read_write> cache_v: array<u32>;

// Elements i and i + 1 (i even) of the keys (`key`) or the values, rounded to f16. Values
// beyond f16's range are held at its largest finite value (pack2x16float's result is
// indeterminate there).
fn kv_store2(key: bool, i: u32, a: f32, b: f32) {
    let w = pack2x16float(clamp(vec2<f32>(a, b), vec2<f32>(-65504.0), vec2<f32>(65504.0)));
    if (key) {
        cache_k[i / 2u] = w;
    } else {
        cache_v[i / 2u] = w;
    }
}

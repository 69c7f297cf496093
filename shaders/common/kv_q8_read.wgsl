// The KV cache as q8_0 (KvFormat::Q8, src/backend/kernel.rs): each position's row of
// kv_dim int8 values (4 per u32, byte 0 first; the last word zero-padded), then one f32
// scale per block of q8_kv_block() values along head_dim. A layer's keys and values at
// bindings 3 and 4 of the attention kernels; element i is at position i / kv_dim. The
// kernel's params `p` give n_kv and head_dim.
@group(0) @binding(3) var<storage, read> cache_k: array<u32>;
@group(0) @binding(4) var<storage, read> cache_v: array<u32>;

// Values per scale: ggml's 32 when it divides head_dim, else the whole head row.
fn q8_kv_block() -> u32 {
    return select(p.head_dim, 32u, p.head_dim % 32u == 0u);
}

// Element i's (word of its byte, the byte, word of its scale).
fn q8_kv_words(i: u32) -> vec3<u32> {
    let kv_dim = p.n_kv * p.head_dim;
    let vw = (kv_dim + 3u) / 4u;
    let row = (i / kv_dim) * (vw + kv_dim / q8_kv_block());
    let j = i % kv_dim;
    return vec3<u32>(row + j / 4u, j % 4u, row + vw + j / q8_kv_block());
}

// Byte `b` (< 4) of `w` as a signed int8, in f32.
fn q8_kv_byte(w: u32, b: u32) -> f32 {
    return f32(bitcast<i32>(w << (24u - 8u * b)) >> 24u);
}

// Element i of the keys (`key`) or the values.
fn q8_kv_at(key: bool, i: u32) -> f32 {
    let wi = q8_kv_words(i);
    if (key) { return q8_kv_byte(cache_k[wi.x], wi.y) * bitcast<f32>(cache_k[wi.z]); }
    return q8_kv_byte(cache_v[wi.x], wi.y) * bitcast<f32>(cache_v[wi.z]);
}

// Writing the KV cache as q8_0 (rope_kv.wgsl; layout in kv_q8.wgsl): bindings 7 (keys) and
// 8 (values). First each block's scale d = amax / 127 (f32), one lane per block, kept in
// workgroup memory; then each lane packs whole words of 4 values, q = round(x / d) half
// away from zero (ggml's quantize_row_q8_0_ref, with x * (1 / d) as it does), so every
// word has one writer. Values past f16's range are kept: the scale is f32.
@group(0) @binding(7) var<storage, read_write> cache_k: array<u32>;
@group(0) @binding(8) var<storage, read_write> cache_v: array<u32>;

// The inverse scales of one position's key blocks, then its value blocks: at most
// backend::params::KV_Q8_MAX_BLOCKS (512) each, which the engine checks.
var<workgroup> kv_q8_id: array<f32, 1024>;

fn kv_q8_block() -> u32 {
    return select(p.head_dim, 32u, p.head_dim % 32u == 0u);
}

// Element j of this token's keys (`key`) or values.
fn kv_q8_in(key: bool, base: u32, q_dim: u32, kv_dim: u32, j: u32, inv_k: f32, rrow: u32) -> f32 {
    if (key) { return k_roped(base, q_dim, j, inv_k, rrow); }
    return v_in(base, q_dim, kv_dim, j);
}

// Rounded half away from zero (C's roundf; WGSL's round() goes to even): v - trunc(v) is
// exact in f32.
fn kv_q8_round(v: f32) -> i32 {
    let t = trunc(v);
    return i32(t + select(0.0, sign(v), abs(v - t) >= 0.5));
}

fn kv_store_row(lane: u32, pos: u32, base: u32, q_dim: u32, kv_dim: u32, inv_k: f32, rrow: u32) {
    let bs = kv_q8_block();
    let nb = kv_dim / bs;
    let vw = (kv_dim + 3u) / 4u;
    let row = pos * (vw + nb);
    // Scales: lane per (key or value) block.
    for (var e = lane; e < 2u * nb; e += WG) {
        let key = e < nb;
        let b = e % nb;
        var amax = 0.0;
        for (var i = 0u; i < bs; i++) {
            amax = max(amax, abs(kv_q8_in(key, base, q_dim, kv_dim, b * bs + i, inv_k, rrow)));
        }
        let d = amax / 127.0;
        kv_q8_id[e] = select(0.0, 1.0 / d, d != 0.0);
        if (key) { cache_k[row + vw + b] = bitcast<u32>(d); } else { cache_v[row + vw + b] = bitcast<u32>(d); }
    }
    workgroupBarrier();
    // Values: lane per (key or value) word.
    for (var e = lane; e < 2u * vw; e += WG) {
        let key = e < vw;
        let w = e % vw;
        var packed = 0u;
        for (var i = 0u; i < 4u; i++) {
            let j = 4u * w + i;
            if (j < kv_dim) {
                let id = kv_q8_id[select(nb, 0u, key) + j / bs];
                let q = clamp(kv_q8_round(kv_q8_in(key, base, q_dim, kv_dim, j, inv_k, rrow) * id), -127, 127);
                packed |= (bitcast<u32>(q) & 0xffu) << (8u * i);
            }
        }
        if (key) { cache_k[row + w] = packed; } else { cache_v[row + w] = packed; }
    }
}

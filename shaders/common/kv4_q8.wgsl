// The KV cache as q8_0 for the window attention kernel (attention_w.wgsl; with
// kv_q8_read.wgsl): keys four at a time, values one at a time.

// Keys 4q .. 4q + 4 of the layer.
fn k4_at(q: u32) -> vec4<f32> {
    let i = 4u * q;
    return vec4<f32>(q8_kv_at(true, i), q8_kv_at(true, i + 1u), q8_kv_at(true, i + 2u), q8_kv_at(true, i + 3u));
}

fn v_at(i: u32) -> f32 {
    return q8_kv_at(false, i);
}

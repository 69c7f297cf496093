// A Q8_0 matrix read row by row by one invocation (matmul_q8.wgsl, matmul_q8_u.wgsl):
// the int8 words at binding 10 and the f16 scales at binding 11 (the same buffer), read
// straight from device memory (each lane reads only its own row's).
@group(0) @binding(10) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(11) var<storage, read> ws: array<u32>;

fn w_at(i: u32) -> vec4<u32> {
    probe(SITE_W, i * 16u, 16u);
    return w[i];
}

// Half `i` of the scales.
fn scale_at(i: u32) -> f32 {
    probe(SITE_WS, (i / 2u) * 4u, 4u);
    return unpack2x16float(ws[i / 2u])[i % 2u];
}

// Eight f16 weights of one vec4<u32> (two per word) as two vec4<f32>: weight rows are
// padded to 8 halves so a row is read with one 16-byte load per 8 columns.
// Word `i` of the f16 weights `w` (declared by the kernel), through the probe.
fn w_at(i: u32) -> vec4<u32> {
    probe(SITE_W, i * 16u, 16u);
    return w[i];
}

fn halves(v: vec4<u32>) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)),
                               vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w)));
}

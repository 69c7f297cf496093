// q . (a, b) over the 8 columns of one u32 word of nibbles, in f32.
fn dot8(w: u32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    let lo = vec4<f32>(unpack4xU8(w & 0x0F0F0F0Fu)) - vec4<f32>(8.0);
    let hi = vec4<f32>(unpack4xU8((w >> 4u) & 0x0F0F0F0Fu)) - vec4<f32>(8.0);
    return dot(lo, a) + dot(hi, b);
}

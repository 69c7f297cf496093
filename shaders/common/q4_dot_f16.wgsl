// q . (a, b) over the 8 columns of one u32 word of nibbles with f16 products (needs
// SHADER_F16; the assembler puts `enable f16;` first): on GPUs packed f16 math doubles
// throughput, llvmpipe emulates it. Nibbles are exact in f16, activations are rounded to
// f16; every sum across words and blocks stays f32.
fn dot8(w: u32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    let lo = vec4<f16>(unpack4xU8(w & 0x0F0F0F0Fu)) - vec4<f16>(8.0h);
    let hi = vec4<f16>(unpack4xU8((w >> 4u) & 0x0F0F0F0Fu)) - vec4<f16>(8.0h);
    return f32(dot(lo, vec4<f16>(a))) + f32(dot(hi, vec4<f16>(b)));
}

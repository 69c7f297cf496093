// Q8_0 quants: four int8 of a u32 (byte 0 first) as f32, for the Q8_0 kernels (fmt_q8.wgsl,
// matmul_q8.wgsl): each byte shifted to the top, then an arithmetic shift back
// sign-extends it.
fn i8x4(v: u32) -> vec4<f32> {
    let t = vec4<i32>(bitcast<i32>(v << 24u), bitcast<i32>(v << 16u), bitcast<i32>(v << 8u), bitcast<i32>(v));
    return vec4<f32>(t >> vec4<u32>(24u));
}

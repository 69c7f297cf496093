// 32 activations (the columns of one vec4<u32> of nibbles) as 8 vec4s, and their dot
// product with those nibbles. `act32(base, k0, len)` comes from the activation piece:
// columns k0 .. k0 + 32 of the row starting at float `base`, 0 at and past `len`.
struct Act32 { a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>, a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32> }

fn dot32(q: vec4<u32>, a: Act32) -> f32 {
    return dot8(q.x, a.a0, a.a1) + dot8(q.y, a.a2, a.a3) + dot8(q.z, a.a4, a.a5) + dot8(q.w, a.a6, a.a7);
}

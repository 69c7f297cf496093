// A 64 KiB uniform window of activations at binding 2, for one-token and window kernels:
// every lane of a workgroup reads the same address, which llvmpipe loads once for all
// lanes instead of lane by lane with bounds checks.
@group(0) @binding(2) var<uniform> xu: array<vec4<f32>, 4096>;

// Columns k0 .. k0 + 4 of the row at float `base` (both multiples of 4), 0 at and past
// `len`: padding and stale values must not contribute.
fn xa(base: u32, k0: u32, len: u32) -> vec4<f32> {
    let v = xu[(base + k0) / 4u];
    if (k0 + 4u <= len) { return v; }
    return select(vec4<f32>(0.0), v, vec4<u32>(k0, k0 + 1u, k0 + 2u, k0 + 3u) < vec4<u32>(len));
}

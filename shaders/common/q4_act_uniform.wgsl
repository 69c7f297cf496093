// Activations in a 64 KiB uniform window (binding 2), for one-token steps: every lane of
// a workgroup reads the same address, which llvmpipe loads once for all lanes instead of
// lane by lane with bounds checks (about 10x faster there). Rows must start at a multiple
// of 4 floats; columns at and past `len` read as 0.
@group(0) @binding(2) var<uniform> xu: array<vec4<f32>, 4096>;

// Columns k0 .. k0 + 4 of the row at float `base` (k0 a multiple of 4).
fn xa(base: u32, k0: u32, len: u32) -> vec4<f32> {
    let v = xu[(base + k0) / 4u];
    if (k0 + 4u <= len) { return v; }
    return select(vec4<f32>(0.0), v, vec4<u32>(k0, k0 + 1u, k0 + 2u, k0 + 3u) < vec4<u32>(len));
}

fn act32(base: u32, k0: u32, len: u32) -> Act32 {
    return Act32(xa(base, k0, len), xa(base, k0 + 4u, len), xa(base, k0 + 8u, len), xa(base, k0 + 12u, len),
                 xa(base, k0 + 16u, len), xa(base, k0 + 20u, len), xa(base, k0 + 24u, len), xa(base, k0 + 28u, len));
}

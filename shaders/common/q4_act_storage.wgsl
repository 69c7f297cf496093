// Activations in a storage buffer (binding 2, and the same buffer again as vec4s at
// binding 15): one vec4 load per 4 columns when the row is 16-byte aligned and whole
// (llvmpipe checks bounds per load, so fewer, wider loads win), element by element
// otherwise. Columns at and past `len` read as 0: neither padding nor the next row may
// contribute (0 * NaN would).
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(15) var<storage, read> x4: array<vec4<f32>>;

// The token a workgroup serves: grid z.
fn window_token(z: u32) -> u32 {
    return z;
}

fn act(base: u32, k: u32, len: u32) -> f32 {
    return select(0.0, x[base + min(k, len - 1u)], k < len);
}

fn act4(base: u32, k: u32, len: u32) -> vec4<f32> {
    return vec4<f32>(act(base, k, len), act(base, k + 1u, len), act(base, k + 2u, len), act(base, k + 3u, len));
}

fn act32(base: u32, k0: u32, len: u32) -> Act32 {
    if (k0 + 32u <= len && (base % 4u) == 0u) {
        let i = (base + k0) / 4u;
        return Act32(x4[i], x4[i + 1u], x4[i + 2u], x4[i + 3u], x4[i + 4u], x4[i + 5u], x4[i + 6u], x4[i + 7u]);
    }
    return Act32(act4(base, k0, len), act4(base, k0 + 4u, len), act4(base, k0 + 8u, len), act4(base, k0 + 12u, len),
                 act4(base, k0 + 16u, len), act4(base, k0 + 20u, len), act4(base, k0 + 24u, len), act4(base, k0 + 28u, len));
}

// Activations of the GPU-shaped kernels: f32 rows in a storage buffer at binding 2, and
// the same buffer as vec4s at binding 3, so a 16-byte-aligned run of columns is one
// 16-byte load per lane. Columns at and past `len` read as 0: neither padding nor the next
// row may contribute (0 * NaN would).
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> x4: array<vec4<f32>>;

fn xs(i: u32) -> f32 {
    probe_bytes(SITE_X, 4u);
    return x[i];
}

fn xv(i: u32) -> vec4<f32> {
    probe_bytes(SITE_X, 16u);
    return x4[i];
}

// Column k of the row at float `base`, 0 at and past `len`.
fn x_at(base: u32, k: u32, len: u32) -> f32 {
    return select(0.0, xs(base + min(k, len - 1u)), k < len);
}

fn x4_at(base: u32, k: u32, len: u32) -> vec4<f32> {
    return vec4<f32>(x_at(base, k, len), x_at(base, k + 1u, len), x_at(base, k + 2u, len), x_at(base, k + 3u, len));
}

// Columns k0 .. k0 + 4 of the row at `base`: one vec4 load when aligned and whole.
fn x_quad(base: u32, k0: u32, len: u32) -> vec4<f32> {
    if (k0 + 4u <= len && (base + k0) % 4u == 0u) { return xv((base + k0) / 4u); }
    return x4_at(base, k0, len);
}

// Columns of the activations as stored (act_x4.wgsl's buffer). Columns at and past `len`
// read as 0: neither padding nor the next row may contribute (0 * NaN would).

// Nothing to prepare: act_cols_norm.wgsl computes its row's scale here.
fn act_prepare(xb: u32, k: u32, li: u32, eps: f32, write_row: bool) {}

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

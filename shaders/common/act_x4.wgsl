// Activations of the GPU-shaped kernels: f32 rows in a storage buffer at binding 2, and
// the same buffer as vec4s at binding 3, so a 16-byte-aligned run of columns is one
// 16-byte load per lane. The kernels read columns through a column piece: act_cols.wgsl
// (as stored) or act_cols_norm.wgsl (RMSNorm applied on load).
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

// out[0, row_base + n] (+)= sum_k x[0, k] * W[n, k] (+ bias) for ONE token, with x in a
// uniform buffer: every invocation reads the same activation address, which llvmpipe
// loads once for all lanes instead of lane by lane with bounds checks (the storage
// variant, matmul.wgsl, serves prefill chunks). W is f16, rows padded to 8 halves, one
// invocation per weight row; parameters as matmul.wgsl (LAST_TOKEN_ONLY is implied).

struct Params {
    k: u32,
    n_rows: u32,
    row_base: u32,
    vec4_per_row: u32,
    x_stride: u32,
    out_stride: u32,
    flags: u32,          // MATMUL_BIAS, MATMUL_ACCUMULATE
    _a: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = gid.x;
    if (n >= p.n_rows || step.n_tokens == 0u) { return; }
    let wrow = n * p.vec4_per_row;
    let groups = (p.k + 7u) / 8u;
    var acc = 0.0;
    for (var c = 0u; c < groups; c++) {
        let v = w_at(wrow + c);
        let a = vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y));
        let b = vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w));
        acc += dot(a, xa(0u, 8u * c, p.k)) + dot(b, xa(0u, 8u * c + 4u, p.k));
    }
    let row = p.row_base + n;
    if ((p.flags & MATMUL_BIAS) != 0u) { acc += bias[row]; }
    if ((p.flags & MATMUL_ACCUMULATE) != 0u) { acc += out[row]; }
    out[row] = acc;
}

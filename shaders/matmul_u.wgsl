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
@group(0) @binding(2) var<uniform> xu: array<vec4<f32>, 4096>;
@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

// Activations 4i .. 4i + 4, 0 past k (padding and stale values must not contribute).
fn xa(i: u32) -> vec4<f32> {
    let v = xu[i];
    let k0 = i * 4u;
    if (k0 + 4u <= p.k) { return v; }
    return select(vec4<f32>(0.0), v, vec4<u32>(k0, k0 + 1u, k0 + 2u, k0 + 3u) < vec4<u32>(p.k));
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = gid.x;
    if (n >= p.n_rows || step.n_tokens == 0u) { return; }
    let wrow = n * p.vec4_per_row;
    let groups = (p.k + 7u) / 8u;
    var acc = 0.0;
    for (var c = 0u; c < groups; c++) {
        let v = w[wrow + c];
        let a = vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y));
        let b = vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w));
        acc += dot(a, xa(2u * c)) + dot(b, xa(2u * c + 1u));
    }
    let row = p.row_base + n;
    if ((p.flags & MATMUL_BIAS) != 0u) { acc += bias[row]; }
    if ((p.flags & MATMUL_ACCUMULATE) != 0u) { acc += out[row]; }
    out[row] = acc;
}

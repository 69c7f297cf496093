// RMSNorm, as transformers' OlmoeRMSNorm / Qwen2MoeRMSNorm in float32:
//   variance = mean(x^2); y = weight * (x * rsqrt(variance + eps))
// One workgroup per token row. With LAST_TOKEN_ONLY the single row is the step's last token
// (only its hidden state feeds lm_head while generating).

struct Params {
    n: u32,
    x_stride: u32,
    out_stride: u32,
    flags: u32,  // LAST_TOKEN_ONLY
    eps: f32,
    _a: u32,
    _b: u32,
    _c: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<u32>;  // f16 pairs
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const WG: u32 = 64u;
var<workgroup> partial: array<f32, 64>;

fn weight_at(i: u32) -> f32 {
    probe(SITE_OTHER, (i / 2u) * 4u, 4u);
    return unpack2x16float(weight[i / 2u])[i % 2u];
}

fn row_at(i: u32) -> f32 {
    probe_bytes(SITE_X, 4u);
    return x[i];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    var t = wid.x;
    var t_out = wid.x;
    if ((p.flags & LAST_TOKEN_ONLY) != 0u) {
        t = step.n_tokens - 1u;
        t_out = 0u;
    }
    // uniform control flow: every invocation of the workgroup takes the same branch
    if (t >= step.n_tokens) { return; }
    let base = t * p.x_stride;
    var ss = 0.0;
    for (var i = lid.x; i < p.n; i += WG) {
        let v = row_at(base + i);
        ss += v * v;
    }
    partial[lid.x] = ss;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid.x < s) { partial[lid.x] += partial[lid.x + s]; }
        workgroupBarrier();
    }
    let inv = inverseSqrt(partial[0] / f32(p.n) + p.eps);
    let obase = t_out * p.out_stride;
    for (var i = lid.x; i < p.n; i += WG) {
        out[obase + i] = weight_at(i) * (row_at(base + i) * inv);
    }
}

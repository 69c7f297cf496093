// xg[s, :hidden] = x[token of sorted pair s, :]: the expert-major (prefill) W4A16 kernels
// read each run of pairs of one expert as consecutive rows. Rows are `row_stride` floats
// (hidden rounded up to 32, the kernels' vec4 groups); the padding columns are never
// written and stay zero, so they add nothing.

struct Params {
    hidden: u32,
    top_k: u32,
    row_stride: u32,
    _a: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> pairs: array<u32>;
@group(0) @binding(4) var<storage, read_write> xg: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let s = gid.y * p.top_k + gid.z;   // grid: (hidden / 64, tokens, top_k)
    if (i >= p.hidden || s >= step.n_tokens * p.top_k) { return; }
    let t = pairs[s] / p.top_k;
    xg[s * p.row_stride + i] = x[t * p.hidden + i];
}

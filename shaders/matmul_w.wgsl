// out[t, row_base + n] (+)= sum_k x[t, k] * W[n, k] (+ bias) for the tokens of one window:
// the multi-token (prefill) kernel for CPU adapters. The window is up to `tw` consecutive
// token rows of x (k floats each, k % 4 == 0) bound as a 64 KiB uniform at byte offset
// t0 * k * 4, so every lane of a workgroup reads the same activation address (llvmpipe
// loads it once for all lanes; storage loads go lane by lane with bounds checks) while each
// lane streams its own f16 weight row, and every weight load serves 8 tokens. One
// invocation: one weight row, 8 tokens of the window (grid y). The dispatches of a matrix
// cover the chunk window by window; the host skips windows past the step's tokens.
// llvmpipe (Mesa 22.3) loads even lane-invariant addresses lane by lane, so lane l of each
// subgroup loads token l's activations and subgroupBroadcast hands them to the others: one
// useful load per lane instead of eight copies. Needs subgroups of at least 8 lanes; every
// lane stays active (lanes past the last row compute a copy of it and do not store).

struct Params {
    k: u32,              // input features (a multiple of 4)
    n_rows: u32,         // rows in this chunk of W
    row_base: u32,       // global row index of this chunk's first row
    vec4_per_row: u32,   // vec4<u32> (8 halves) per weight row
    t0: u32,             // first token of the window
    out_stride: u32,
    flags: u32,          // MATMUL_BIAS, MATMUL_ACCUMULATE, LAST_TOKEN_ONLY
    tw: u32,             // tokens the window holds
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wg: vec3<u32>,
        @builtin(subgroup_invocation_id) sl: u32) {
    let n = gid.x;
    // Window-relative tokens [lo, lo + cnt), stored from output row `o0`.
    let wt = window_tokens(wg.y);
    let lo = wt.x;
    let cnt = wt.y;
    let o0 = wt.z;
    if (cnt == 0u) { return; }
    // This lane loads token lo + (sl % 8) (past cnt: the last one again, not stored).
    let rb = min(lo + sl % 8u, lo + cnt - 1u) * (p.k / 4u);
    let wrow = min(n, p.n_rows - 1u) * p.vec4_per_row;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    let full = p.k / 8u;
    for (var c = 0u; c < full; c++) {
        let v = w[wrow + c];
        let a = vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y));
        let b = vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w));
        let xa = xu[rb + 2u * c];
        let xb = xu[rb + 2u * c + 1u];
        acc0 += vec4<f32>(
            dot(a, subgroupBroadcast(xa, 0u)) + dot(b, subgroupBroadcast(xb, 0u)),
            dot(a, subgroupBroadcast(xa, 1u)) + dot(b, subgroupBroadcast(xb, 1u)),
            dot(a, subgroupBroadcast(xa, 2u)) + dot(b, subgroupBroadcast(xb, 2u)),
            dot(a, subgroupBroadcast(xa, 3u)) + dot(b, subgroupBroadcast(xb, 3u)));
        acc1 += vec4<f32>(
            dot(a, subgroupBroadcast(xa, 4u)) + dot(b, subgroupBroadcast(xb, 4u)),
            dot(a, subgroupBroadcast(xa, 5u)) + dot(b, subgroupBroadcast(xb, 5u)),
            dot(a, subgroupBroadcast(xa, 6u)) + dot(b, subgroupBroadcast(xb, 6u)),
            dot(a, subgroupBroadcast(xa, 7u)) + dot(b, subgroupBroadcast(xb, 7u)));
    }
    if (full * 8u < p.k) {
        // k % 8 == 4: half a weight group; its other half is padding and is not read.
        let v = w[wrow + full];
        let a = vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y));
        let xa = xu[rb + 2u * full];
        acc0 += vec4<f32>(dot(a, subgroupBroadcast(xa, 0u)), dot(a, subgroupBroadcast(xa, 1u)),
                          dot(a, subgroupBroadcast(xa, 2u)), dot(a, subgroupBroadcast(xa, 3u)));
        acc1 += vec4<f32>(dot(a, subgroupBroadcast(xa, 4u)), dot(a, subgroupBroadcast(xa, 5u)),
                          dot(a, subgroupBroadcast(xa, 6u)), dot(a, subgroupBroadcast(xa, 7u)));
    }
    if (n >= p.n_rows) { return; }
    store_rows(n, o0, cnt, acc0, acc1);
}

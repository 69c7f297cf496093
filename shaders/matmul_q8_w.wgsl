// The multi-token (prefill) kernel for CPU adapters over Q8_0 weights: the twin of
// matmul_w.wgsl (which says why: a 64 KiB uniform window of up to `tw` token rows of x,
// lane l of each subgroup loading token l's activations and subgroupBroadcast handing
// them to the others, each lane streaming its own weight row, every weight load serving
// 8 tokens). Q8_0 layout in src/blocks/q8_0.rs: each block of 32 columns (two 16-byte
// words of int8) is summed in f32, then scaled by its f16 scale. Needs subgroups of at
// least 8 lanes; every lane stays active (lanes past the last row compute a copy of it and
// do not store). k % 4 == 0.

struct Params {
    k: u32,               // input features (a multiple of 4)
    n_rows: u32,          // rows served by this dispatch
    row_base: u32,        // output index of its first row
    words_per_row: u32,   // 16-byte words per weight row (2 per block)
    t0: u32,              // first token of the window
    out_stride: u32,
    flags: u32,           // MATMUL_BIAS, MATMUL_ACCUMULATE, LAST_TOKEN_ONLY
    tw: u32,              // tokens the window holds
    w_row0: u32,          // index of the first row inside the weight binding
    s_word0: u32,         // u32 offset of the scales in binding 11
    blocks_per_row: u32,  // scales per row
    _a: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// binding 2: the uniform window (uniform_window.wgsl); 10 and 11: W (q8_row.wgsl).
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
    let r = p.w_row0 + min(n, p.n_rows - 1u);
    let wrow = r * p.words_per_row;
    let srow = p.s_word0 * 2u + r * p.blocks_per_row;
    // vec4s of x per token row: a partial last block's columns past k are not read.
    let kq = p.k / 4u;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    for (var b = 0u; b < p.blocks_per_row; b++) {
        var s0 = vec4<f32>(0.0);
        var s1 = vec4<f32>(0.0);
        for (var h = 0u; h < 2u; h++) {
            let c = 2u * b + h;
            let q = w_at(wrow + c);
            for (var j = 0u; j < 4u; j++) {
                let qi = 4u * c + j;
                if (qi < kq) {
                    let qv = i8x4(q[j]);
                    let xv = xu[rb + qi];
                    s0 += vec4<f32>(dot(qv, subgroupBroadcast(xv, 0u)), dot(qv, subgroupBroadcast(xv, 1u)),
                                    dot(qv, subgroupBroadcast(xv, 2u)), dot(qv, subgroupBroadcast(xv, 3u)));
                    s1 += vec4<f32>(dot(qv, subgroupBroadcast(xv, 4u)), dot(qv, subgroupBroadcast(xv, 5u)),
                                    dot(qv, subgroupBroadcast(xv, 6u)), dot(qv, subgroupBroadcast(xv, 7u)));
                }
            }
        }
        let s = scale_at(srow + b);
        acc0 += s0 * s;
        acc1 += s1 * s;
    }
    if (n >= p.n_rows) { return; }
    store_rows(n, o0, cnt, acc0, acc1);
}

// W4A16 SwiGLU first half for routed experts held as INT4 (layout in src/blocks/quant.rs):
//   h[t, j, n] = silu(gate_e[n] . x_t) * (up_e[n] . x_t)
// Nibbles are converted inside the kernel and multiplied with the activations; every sum
// is f32. No expanded copy of an expert exists anywhere. Each lane sums its columns of a
// 256-input block unscaled and multiplies by the block's f16 scale once. Expert ids come
// from the router on the GPU, mapped to a pool slot by the slot table; one dispatch serves
// one chunk of slots (grid: row groups, top-k indices from j_base, tokens).
// Assembled with: step, q4_unpack, a dot8 piece (f32 or f16 products), q4_act32, an
// activation piece (storage, or a uniform window for one-token steps) and a lanes piece
// (one invocation per row, or 8 subgroup lanes per row): each combination is one variant.

struct Params {
    hidden: u32,       // input features (H)
    inter: u32,        // output rows (I)
    top_k: u32,
    j_base: u32,       // first top-k index served (per-expert executor: one per dispatch)
    x_stride: u32,     // floats per token row of x
    slot_vec4: u32,    // vec4<u32> per slot
    first_slot: u32,
    chunk_slots: u32,
    gate_q: u32,       // vec4 offset of the gate nibbles inside a slot
    up_q: u32,
    gate_s: u32,       // u32 offset of the gate scales inside a slot
    up_s: u32,
    _a: u32,
    _b: u32,
    _c: u32,
    _d: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// binding 2 (and 15): the activations x [T, x_stride], from the activation piece.
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read> slot_of: array<u32>;
@group(0) @binding(5) var<storage, read> wq: array<vec4<u32>>;  // the chunk, as nibbles
@group(0) @binding(6) var<storage, read> ws: array<u32>;        // the same chunk, as scales
@group(0) @binding(7) var<storage, read_write> out: array<f32>;  // h [T, top_k, inter]

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lane = row_lane(li);
    let n_raw = wid.x * (64u / LANES) + li / LANES;
    // With one lane per row, rows past the end return; with several, they compute a copy
    // of the last row and do not store it, so every lane of a row takes part in the
    // reduction.
    if (LANES == 1u && n_raw >= p.inter) { return; }
    let n = min(n_raw, p.inter - 1u);
    let j = wid.y + p.j_base;
    let t = window_token(wid.z);
    if (t >= step.n_tokens) { return; }
    let slot = slot_of[ids[t * p.top_k + j]];
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) { return; }
    let sv = (slot - p.first_slot) * p.slot_vec4;
    let nv = (p.hidden + 31u) / 32u;
    let nb = (p.hidden + 255u) / 256u;
    let g_row = sv + p.gate_q + n * nv;
    let u_row = sv + p.up_q + n * nv;
    let xb = t * p.x_stride;
    var g = 0.0;
    var u = 0.0;
    for (var b = 0u; b < nb; b++) {
        var bg = 0.0;
        var bu = 0.0;
        // The loop's shape follows LANES (a constant, so one branch remains): with 8 lanes
        // each lane has at most one column of the block, and a guarded single pass
        // compiled 1.5x faster on llvmpipe than the strided loop, which the one-lane
        // variant needs (and there is faster than a fixed 8-pass loop).
        if (LANES == 1u) {
            for (var c = b * 8u; c < min(b * 8u + 8u, nv); c++) {
                let a = act32(xb, c * 32u, p.hidden);
                bg += dot32(wq_at(g_row + c), a);
                bu += dot32(wq_at(u_row + c), a);
            }
        } else {
            let c = b * 8u + lane;
            if (c < nv) {
                let a = act32(xb, c * 32u, p.hidden);
                bg += dot32(wq_at(g_row + c), a);
                bu += dot32(wq_at(u_row + c), a);
            }
        }
        g += q4_scale(sv * 4u + p.gate_s, n * nb + b) * bg;
        u += q4_scale(sv * 4u + p.up_s, n * nb + b) * bu;
    }
    g = reduce_lanes(g);
    u = reduce_lanes(u);
    // silu(g) = g * sigmoid(g)
    store_row((t * p.top_k + j) * p.inter + n, g / (1.0 + exp(-g)) * u, lane, n_raw, p.inter);
}

// The down kernels' parameters and inputs (ffn_down_q4.wgsl, ffn_down_q4_combine.wgsl).
struct Params {
    hidden: u32,       // output rows (H)
    inter: u32,        // input features (I)
    top_k: u32,
    j_base: u32,       // first top-k index served (per slot; the fused kernel serves all)
    slot_vec4: u32,
    first_slot: u32,
    chunk_slots: u32,
    down_q: u32,       // vec4 offset of the down nibbles inside a slot
    down_s: u32,       // u32 offset of the down scales inside a slot
    _a: u32,
    _b: u32,
    _c: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// binding 2 (and 15): the intermediates h [T, top_k, inter], from the activation piece.
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read> slot_of: array<u32>;
@group(0) @binding(5) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> ws: array<u32>;

// One row of an INT4 expert's down projection against the intermediates at float `hb`:
// this lane's share of down_e[m] . h[hb ..] for the expert in chunk-relative slot `rel`
// (reduce_lanes over the row's lanes gives the whole dot product). Each lane sums its
// columns of a 256-input block unscaled and multiplies by the block's f16 scale once.
fn lane_dot(rel: u32, m: u32, hb: u32, lane: u32) -> f32 {
    let sv = rel * p.slot_vec4;
    let nv = (p.inter + 31u) / 32u;
    let nb = (p.inter + 255u) / 256u;
    let row = sv + p.down_q + m * nv;
    var acc = 0.0;
    for (var b = 0u; b < nb; b++) {
        var bs = 0.0;
        // As in ffn_gate_up_q4.wgsl: a strided loop for one lane, a guarded pass for 8.
        if (LANES == 1u) {
            for (var c = b * 8u; c < min(b * 8u + 8u, nv); c++) {
                bs += dot32(wq_at(row + c), act32(hb, c * 32u, p.inter));
            }
        } else {
            let c = b * 8u + lane;
            if (c < nv) { bs += dot32(wq_at(row + c), act32(hb, c * 32u, p.inter)); }
        }
        acc += q4_scale(sv * 4u + p.down_s, m * nb + b) * bs;
    }
    return acc;
}

// The output row of invocation `li` in workgroup `wid` (rows of 64 / LANES per workgroup,
// token window_token(wid.z)). With one lane per row, rows past the end have nothing to do;
// with several, they compute a copy of the last row and do not store it, so every lane of
// a row takes part in the reduction.
struct DownRow { lane: u32, m_raw: u32, m: u32, t: u32, live: bool }

fn down_row(wid: vec3<u32>, li: u32) -> DownRow {
    let m_raw = wid.x * (64u / LANES) + li / LANES;
    let t = window_token(wid.z);
    let live = !(LANES == 1u && m_raw >= p.hidden) && t < step.n_tokens;
    return DownRow(row_lane(li), m_raw, min(m_raw, p.hidden - 1u), t, live);
}

// W4A16 SwiGLU second half for INT4 experts (layout in src/quant.rs). Two modes:
// - per slot (Q4_FUSED_COMBINE clear): y[t, j, m] = down_e[m] . h[t, j, :] for the top-k
//   indices j_base .. j_base + grid y;
// - fused combine (Q4_FUSED_COMBINE set): x[t, m] += sum_j w[t, j] * (down_e[m] . h[t, j, :])
//   over the top-k experts whose slot is in this chunk, so the weighted combine needs no
//   separate dispatch and no y buffer. Chunks run as successive dispatches, so the
//   read-modify-write of x never races.
// Assembled from the same pieces as ffn_gate_up_q4.wgsl (the activations are h).

struct Params {
    hidden: u32,       // output rows (H)
    inter: u32,        // input features (I)
    top_k: u32,
    j_base: u32,
    slot_vec4: u32,
    first_slot: u32,
    chunk_slots: u32,
    down_q: u32,       // vec4 offset of the down nibbles inside a slot
    down_s: u32,       // u32 offset of the down scales inside a slot
    flags: u32,        // Q4_FUSED_COMBINE
    _a: u32,
    _b: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// binding 2 (and 15): the intermediates h [T, top_k, inter], from the activation piece.
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read> slot_of: array<u32>;
@group(0) @binding(5) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> ws: array<u32>;
@group(0) @binding(7) var<storage, read> weights: array<f32>;
@group(0) @binding(8) var<storage, read_write> out: array<f32>;

// This lane's share of down_e[m] . h[hb ..] for the expert in chunk-relative slot `rel`;
// reduce_lanes over the row's lanes gives the whole dot product.
fn lane_dot(rel: u32, m: u32, hb: u32, lane: u32) -> f32 {
    let sv = rel * p.slot_vec4;
    let nv = (p.inter + 31u) / 32u;
    let nb = (p.inter + 255u) / 256u;
    let row = sv + p.down_q + m * nv;
    var acc = 0.0;
    for (var b = 0u; b < nb; b++) {
        var bs = 0.0;
        for (var c = b * 8u + lane; c < min(b * 8u + 8u, nv); c += LANES) {
            bs += dot32(wq[row + c], act32(hb, c * 32u, p.inter));
        }
        acc += q4_scale(sv * 4u + p.down_s, m * nb + b) * bs;
    }
    return acc;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lane = li % LANES;
    let m_raw = wid.x * (64u / LANES) + li / LANES;
    // As in ffn_gate_up_q4.wgsl: rows past the end return (one lane per row) or compute
    // a copy of the last row without storing it (several lanes per row).
    if (LANES == 1u && m_raw >= p.hidden) { return; }
    let m = min(m_raw, p.hidden - 1u);
    let t = wid.z;
    if (t >= step.n_tokens) { return; }
    if ((p.flags & Q4_FUSED_COMBINE) != 0u) {
        var acc = 0.0;
        var hit = false;
        for (var j = 0u; j < p.top_k; j++) {
            let slot = slot_of[ids[t * p.top_k + j]];
            if (slot >= p.first_slot && slot < p.first_slot + p.chunk_slots) {
                let d = reduce_lanes(lane_dot(slot - p.first_slot, m, (t * p.top_k + j) * p.inter, lane));
                acc += weights[t * p.top_k + j] * d;
                hit = true;
            }
        }
        if (hit && lane == 0u && m_raw < p.hidden) { out[t * p.hidden + m] += acc; }
        return;
    }
    let j = wid.y + p.j_base;
    let slot = slot_of[ids[t * p.top_k + j]];
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) { return; }
    let d = reduce_lanes(lane_dot(slot - p.first_slot, m, (t * p.top_k + j) * p.inter, lane));
    if (lane == 0u && m_raw < p.hidden) { out[(t * p.top_k + j) * p.hidden + m] = d; }
}

// W4A16 SwiGLU second half for INT4 experts with the weighted combine fused:
//   x[t, m] += sum_j w[t, j] * (down_e[m] . h[t, j, :])
// over the top-k experts whose slot is in this chunk, so the combine needs no separate
// dispatch and no y buffer (the grouped executor at full residency). Chunks run as
// successive dispatches, so the read-modify-write of x never races. Assembled as
// ffn_down_q4.wgsl, the per-slot variant.

// Params, p, ids, slot_of, wq and ws come from q4_down_row.wgsl.
@group(0) @binding(7) var<storage, read> weights: array<f32>;
@group(0) @binding(8) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = down_row(wid, li);
    if (!r.live) { return; }
    let t = r.t;
    var acc = 0.0;
    var hit = false;
    for (var j = 0u; j < p.top_k; j++) {
        let tj = t * p.top_k + j;
        let slot = slot_of[ids[tj]];
        if (slot >= p.first_slot && slot < p.first_slot + p.chunk_slots) {
            acc += weights[tj] * reduce_lanes(lane_dot(slot - p.first_slot, r.m, tj * p.inter, r.lane));
            hit = true;
        }
    }
    if (hit) { add_row(t * p.hidden + r.m, acc, r.lane, r.m_raw, p.hidden); }
}

// W4A16 SwiGLU second half for INT4 experts (layout in src/blocks/quant.rs), per slot:
//   y[t, j, m] = down_e[m] . h[t, j, :]   for the top-k indices j_base .. j_base + grid y
// (the per-expert executor, and batches of experts under partial residency; the weighted
// combine follows in moe_combine.wgsl). ffn_down_q4_combine.wgsl is the fused variant.
// Assembled from the same pieces as ffn_gate_up_q4.wgsl (the activations are h) plus
// q4_down_row.wgsl.

// Params, p, ids, slot_of, wq and ws come from q4_down_row.wgsl.
@group(0) @binding(7) var<storage, read_write> out: array<f32>;  // y [T, top_k, H]

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = down_row(wid, li);
    if (!r.live) { return; }
    let tj = r.t * p.top_k + wid.y + p.j_base;
    let slot = slot_of[ids[tj]];
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) { return; }
    // One expression on purpose: binding the dot product to a `let` before the store made
    // llvmpipe's build of this kernel about 3.5x slower (measured with WGMOE_PROFILE_KERNELS).
    store_row(tj * p.hidden + r.m, reduce_lanes(lane_dot(slot - p.first_slot, r.m, tj * p.inter, r.lane)), r.lane, r.m_raw, p.hidden);
}

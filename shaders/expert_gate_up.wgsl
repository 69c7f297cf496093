// SwiGLU first half for GPUs, over the routed experts of a pool (or one fixed slot: a
// dense MLP, Qwen's shared expert):
//   h[t, j, n] = silu(gate_e[n] . x_t) * (up_e[n] . x_t)   with e the j-th expert of token t
// in the weight format of the pool (f16 or INT4: the format piece). A workgroup serves ROWS
// rows of gate and of up of one (token, expert); lane l reads words l, l + 64, ... of the
// rows' flat run, so neighbouring lanes read neighbouring 16-byte words, and each word's
// activations serve the gate and the up row. Expert ids are read on the GPU and mapped to
// a pool slot by the slot table; one dispatch serves the slots of one chunk of the pool.
// With FFN_ROUTE the ids come from the router's logits instead, computed in every
// workgroup (route_topk.wgsl). Grid: (row groups, top-k indices from j_base, tokens).

struct Params {
    hidden: u32,          // input features (H)
    inter: u32,           // output rows (I)
    top_k: u32,
    j_base: u32,          // first top-k index served
    x_stride: u32,        // floats per token row of x
    slot_words: u32,      // 16-byte words per slot
    first_slot: u32,      // first slot held by this chunk
    chunk_slots: u32,
    gate_w: u32,          // word offset of the gate rows inside a slot
    up_w: u32,
    gate_s: u32,          // u32 offset of the gate scales inside a slot
    up_s: u32,
    words_per_row: u32,
    blocks_per_row: u32,  // scales per row
    flags: u32,           // FFN_FIXED_SLOT: slot 0, not routed; FFN_ROUTE(_WRITE)
    route_experts: u32,   // FFN_ROUTE: the router's experts,
    route_stride: u32,    //   floats per logit row,
    route_splits: u32,    //   partial rows of a one-token step's logits,
    route_norm: u32,      //   renormalise the top-k (norm_topk_prob)
    _a: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// binding 2 and 3: x, from the activation piece; 10 (and 11): the pool chunk.
@group(0) @binding(4) var<storage, read> ids: array<u32>;
@group(0) @binding(5) var<storage, read> slot_of: array<u32>;
@group(0) @binding(6) var<storage, read_write> h_out: array<f32>;  // [T, top_k, inter]

const ROWS: u32 = 4u;

@compute @workgroup_size(64)
fn main(inv: Inv) {
    let n0 = inv.wid.x * ROWS;
    let j = inv.wid.y + p.j_base;
    let t = inv.wid.z;
    if (t >= step.n_tokens || n0 >= p.inter) { return; }
    var slot = 0u;
    if ((p.flags & FFN_ROUTE) != 0u) {
        let write = (p.flags & FFN_ROUTE_WRITE) != 0u && inv.wid.x == 0u && inv.wid.y == 0u;
        slot = slot_of[route_expert(t, j, inv.li, write)];
    } else if ((p.flags & FFN_FIXED_SLOT) == 0u) {
        probe(SITE_OTHER, (t * p.top_k + j) * 4u, 4u);
        let e = ids[t * p.top_k + j];
        probe(SITE_OTHER, e * 4u, 4u);
        slot = slot_of[e];
    }
    // The same slot for every lane: the reduction's barriers stay uniform.
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) { return; }
    let sw = (slot - p.first_slot) * p.slot_words;
    let nr = min(ROWS, p.inter - n0);
    let wpr = p.words_per_row;
    let xb = t * p.x_stride;
    let gs0 = (sw * 4u + p.gate_s) * 2u;
    let us0 = (sw * 4u + p.up_s) * 2u;
    let nb = p.blocks_per_row;
    stage_scales(0u, gs0 + n0 * nb, gs0 + (n0 + nr) * nb, inv.li);
    stage_scales(1u, us0 + n0 * nb, us0 + (n0 + nr) * nb, inv.li);
    workgroupBarrier();
    var g = vec4<f32>(0.0);
    var u = vec4<f32>(0.0);
    for (var f = inv.li; f < nr * wpr; f += 64u) {
        let r = f / wpr;
        let c = f % wpr;
        let n = n0 + r;
        let m = onehot4(r);
        g += word_dot(0u, sw + p.gate_w + n * wpr, c, gs0 + n * nb, xb, p.hidden) * m;
        u += word_dot(1u, sw + p.up_w + n * wpr, c, us0 + n * nb, xb, p.hidden) * m;
    }
    let gs = wg_sum4(g, inv);
    let us = wg_sum4(u, inv);
    if (inv.li == 0u) {
        // silu(g) = g * sigmoid(g)
        let h = gs / (vec4<f32>(1.0) + exp(-gs)) * us;
        for (var i = 0u; i < nr; i++) {
            h_out[(t * p.top_k + j) * p.inter + n0 + i] = h[i];
        }
    }
}

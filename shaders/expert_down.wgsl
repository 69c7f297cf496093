// SwiGLU second half for GPUs, over the routed experts of a pool (or one fixed slot):
//   y[t, j, m] = down_e[m] . h[t, j, :]                      (per (token, top-k index))
//   x[t, m] += sum_j w[t, j] * (down_e[m] . h[t, j, :])       (EXPERT_COMBINE: fused)
// in the pool's weight format. A workgroup serves ROWS rows of the down projection of one
// token; lane l reads words l, l + 64, ... of the rows' flat run (coalesced). Fused, the
// workgroup takes the token's top-k experts of this chunk in turn and weights each lane's
// partial sums before the one reduction (the sum is linear), so the combine needs no
// dispatch of its own; chunks run as successive dispatches, so the read-modify-write of x
// never races. Grid: (row groups, top-k indices from j_base (1 when fused), tokens).

struct Params {
    hidden: u32,          // output rows (H)
    inter: u32,           // input features (I)
    top_k: u32,
    j_base: u32,          // first top-k index served (per (token, top-k index) outputs)
    slot_words: u32,
    first_slot: u32,
    chunk_slots: u32,
    down_w: u32,          // word offset of the down rows inside a slot
    down_s: u32,          // u32 offset of the down scales inside a slot
    words_per_row: u32,
    blocks_per_row: u32,
    flags: u32,           // FFN_FIXED_SLOT, EXPERT_COMBINE
}

@group(0) @binding(0) var<uniform> p: Params;
// binding 2 and 3: h [T, top_k, inter], from the activation piece; 10 (and 11): the pool.
@group(0) @binding(4) var<storage, read> ids: array<u32>;
@group(0) @binding(5) var<storage, read> slot_of: array<u32>;
@group(0) @binding(6) var<storage, read> weights: array<f32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;

const ROWS: u32 = 4u;

@compute @workgroup_size(64)
fn main(inv: Inv) {
    let m0 = inv.wid.x * ROWS;
    let t = inv.wid.z;
    if (t >= step.n_tokens || m0 >= p.hidden) { return; }
    let combine = (p.flags & EXPERT_COMBINE) != 0u;
    var j0 = inv.wid.y + p.j_base;
    var j1 = j0 + 1u;
    if (combine) {
        j0 = 0u;
        j1 = p.top_k;
    }
    let nr = min(ROWS, p.hidden - m0);
    let wpr = p.words_per_row;
    var acc = vec4<f32>(0.0);
    var hit = false;
    for (var j = j0; j < j1; j++) {
        let tj = t * p.top_k + j;
        var slot = 0u;
        if ((p.flags & FFN_FIXED_SLOT) == 0u) {
            probe(SITE_OTHER, tj * 4u, 4u);
            let e = ids[tj];
            probe(SITE_OTHER, e * 4u, 4u);
            slot = slot_of[e];
        }
        if (slot >= p.first_slot && slot < p.first_slot + p.chunk_slots) {
            var wj = 1.0;
            if (combine) {
                probe(SITE_OTHER, tj * 4u, 4u);
                wj = weights[tj];
            }
            let sw = (slot - p.first_slot) * p.slot_words;
            let hb = tj * p.inter;
            let s0 = (sw * 4u + p.down_s) * 2u;
            let nb = p.blocks_per_row;
            // The previous expert's scales are read: stage over them only after.
            workgroupBarrier();
            stage_scales(0u, s0 + m0 * nb, s0 + (m0 + nr) * nb, inv.li);
            workgroupBarrier();
            for (var f = inv.li; f < nr * wpr; f += 64u) {
                let r = f / wpr;
                let m = m0 + r;
                acc += (wj * word_dot(0u, sw + p.down_w + m * wpr, f % wpr, s0 + m * nb, hb, p.inter)) * onehot4(r);
            }
            hit = true;
        }
    }
    // `hit` is the same for every lane (it depends on the token's slots only).
    if (!hit) { return; }
    let s = wg_sum4(acc, inv);
    if (inv.li == 0u) {
        for (var i = 0u; i < nr; i++) {
            if (combine) {
                out[t * p.hidden + m0 + i] += s[i];
            } else {
                out[(t * p.top_k + j0) * p.hidden + m0 + i] = s[i];
            }
        }
    }
}

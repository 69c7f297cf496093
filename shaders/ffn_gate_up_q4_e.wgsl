// W4A16 SwiGLU first half, expert-major, for multi-token (prefill) steps on CPU adapters:
//   h[s, n] = silu(gate_e[n] . x_s) * (up_e[n] . x_s)   for sorted pairs s of expert e
// The pairs are sorted by expert (moe_sort.wgsl) and their activations gathered in that
// order (moe_gather.wgsl); workgroup (row block, e) reads expert e's rows once per 8 of
// its pairs instead of once per pair. Lane l of each subgroup loads pair l's activations
// and subgroupBroadcast hands them to the other lanes: llvmpipe (Mesa 22.3) loads even
// lane-invariant addresses lane by lane, so this is one useful load per lane instead of
// eight copies. Needs subgroups of at least 8 lanes; every lane stays active (lanes past
// the last row compute a copy of it and do not store). One invocation per output row;
// INT4 layout and parameters as ffn_gate_up_q4.wgsl. The
// weights of each 256-input block are scaled once they are unpacked (the decode kernels
// scale the block sums instead: same products, other rounding order).

struct Params {
    hidden: u32,       // input features (H)
    inter: u32,        // output rows (I)
    top_k: u32,
    pmax: u32,         // pair capacity (offset of the experts in `pairs`)
    x_row4: u32,       // vec4s per gathered activation row
    h_row: u32,        // floats per output row
    n_experts: u32,
    _a: u32,
    slot_vec4: u32,
    first_slot: u32,
    chunk_slots: u32,
    gate_q: u32,       // vec4 offset of the gate nibbles inside a slot
    up_q: u32,
    gate_s: u32,       // u32 offset of the gate scales inside a slot
    up_s: u32,
    _b: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> xu: array<vec4<f32>>;   // gathered rows, by pair
@group(0) @binding(3) var<storage, read> pairs: array<u32>;
@group(0) @binding(4) var<storage, read> slot_of: array<u32>;
@group(0) @binding(5) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> ws: array<u32>;
@group(0) @binding(7) var<storage, read_write> h_out: array<f32>;

// Gate and up dots of one row with 8 pairs' activations (lane j of the subgroup holds pair
// j's columns i .. i + 8 as xa, xb), accumulated.
struct Acc { g0: vec4<f32>, g1: vec4<f32>, u0: vec4<f32>, u1: vec4<f32> }

fn word_gate_up(acc: Acc, gw: u32, uw: u32, sg: f32, su: f32, xa: vec4<f32>, xb: vec4<f32>) -> Acc {
    let ga = lo4(gw, sg);
    let gb = hi4(gw, sg);
    let ua = lo4(uw, su);
    let ub = hi4(uw, su);
    let a0 = subgroupBroadcast(xa, 0u); let b0 = subgroupBroadcast(xb, 0u);
    let a1 = subgroupBroadcast(xa, 1u); let b1 = subgroupBroadcast(xb, 1u);
    let a2 = subgroupBroadcast(xa, 2u); let b2 = subgroupBroadcast(xb, 2u);
    let a3 = subgroupBroadcast(xa, 3u); let b3 = subgroupBroadcast(xb, 3u);
    let a4 = subgroupBroadcast(xa, 4u); let b4 = subgroupBroadcast(xb, 4u);
    let a5 = subgroupBroadcast(xa, 5u); let b5 = subgroupBroadcast(xb, 5u);
    let a6 = subgroupBroadcast(xa, 6u); let b6 = subgroupBroadcast(xb, 6u);
    let a7 = subgroupBroadcast(xa, 7u); let b7 = subgroupBroadcast(xb, 7u);
    return Acc(
        acc.g0 + vec4<f32>(dot(ga, a0) + dot(gb, b0), dot(ga, a1) + dot(gb, b1),
                           dot(ga, a2) + dot(gb, b2), dot(ga, a3) + dot(gb, b3)),
        acc.g1 + vec4<f32>(dot(ga, a4) + dot(gb, b4), dot(ga, a5) + dot(gb, b5),
                           dot(ga, a6) + dot(gb, b6), dot(ga, a7) + dot(gb, b7)),
        acc.u0 + vec4<f32>(dot(ua, a0) + dot(ub, b0), dot(ua, a1) + dot(ub, b1),
                           dot(ua, a2) + dot(ub, b2), dot(ua, a3) + dot(ub, b3)),
        acc.u1 + vec4<f32>(dot(ua, a4) + dot(ub, b4), dot(ua, a5) + dot(ub, b5),
                           dot(ua, a6) + dot(ub, b6), dot(ua, a7) + dot(ub, b7)));
}

fn silu_mul(g: vec4<f32>, u: vec4<f32>) -> vec4<f32> {
    // silu(g) = g * sigmoid(g)
    return g / (vec4<f32>(1.0) + exp(-g)) * u;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wg: vec3<u32>,
        @builtin(subgroup_invocation_id) sl: u32) {
    let n = gid.x;
    let nr = min(n, p.inter - 1u);
    // Expert e's sorted pairs [s, q): moe_sort left each count slot at its run's end.
    let e = wg.y;
    if (e >= p.n_experts || step.n_tokens == 0u) { return; }
    let cnt = 2u * p.pmax;
    let q = pairs[cnt + e];
    var s = 0u;
    if (e > 0u) { s = pairs[cnt + e - 1u]; }
    if (s >= q) { return; }
    let nv = (p.hidden + 31u) / 32u;
    let nb = (p.hidden + 255u) / 256u;
    {
        let slot = slot_of[e];
        if (slot >= p.first_slot && slot < p.first_slot + p.chunk_slots) {
            let sv = (slot - p.first_slot) * p.slot_vec4;
            let g_row = sv + p.gate_q + nr * nv;
            let u_row = sv + p.up_q + nr * nv;
            for (var g0 = s; g0 < q; g0 += 8u) {
                // This lane's pair (past the run: its last pair again, not stored).
                let r = min(g0 + sl % 8u, q - 1u) * p.x_row4;
                var acc = Acc(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
                for (var b = 0u; b < nb; b++) {
                    let sg = q4_scale(sv * 4u + p.gate_s, nr * nb + b);
                    let su = q4_scale(sv * 4u + p.up_s, nr * nb + b);
                    for (var c = b * 8u; c < min(b * 8u + 8u, nv); c++) {
                        let gq = wq_at(g_row + c);
                        let uq = wq_at(u_row + c);
                        let i = r + c * 8u;
                        acc = word_gate_up(acc, gq.x, uq.x, sg, su, xu[i], xu[i + 1u]);
                        acc = word_gate_up(acc, gq.y, uq.y, sg, su, xu[i + 2u], xu[i + 3u]);
                        acc = word_gate_up(acc, gq.z, uq.z, sg, su, xu[i + 4u], xu[i + 5u]);
                        acc = word_gate_up(acc, gq.w, uq.w, sg, su, xu[i + 6u], xu[i + 7u]);
                    }
                }
                let h0 = silu_mul(acc.g0, acc.u0);
                let h1 = silu_mul(acc.g1, acc.u1);
                if (n < p.inter) {
                    for (var j = 0u; j < min(8u, q - g0); j++) {
                        var v = 0.0;
                        if (j < 4u) { v = h0[j]; } else { v = h1[j - 4u]; }
                        h_out[(g0 + j) * p.h_row + n] = v;
                    }
                }
            }
        }
    }
}

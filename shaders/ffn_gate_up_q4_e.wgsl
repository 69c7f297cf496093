// W4A16 SwiGLU first half, expert-major, for multi-token (prefill) steps on CPU adapters:
//   h[s, n] = silu(gate_e[n] . x_s) * (up_e[n] . x_s)   for sorted pairs s of expert e
// The pairs are sorted by expert (moe_sort.wgsl) and their activations gathered in that
// order (moe_gather.wgsl); workgroup (row block, e) reads expert e's rows once per 8 of
// its pairs instead of once per pair (common/q4_pairs8.wgsl: the pairs' activations shared
// by subgroupBroadcast). Every lane stays active (lanes past
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
@group(0) @binding(2) var<storage, read> xs: array<vec4<f32>>;   // gathered rows, by pair
@group(0) @binding(3) var<storage, read> pairs: array<u32>;
@group(0) @binding(4) var<storage, read> slot_of: array<u32>;
@group(0) @binding(5) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> ws: array<u32>;
@group(0) @binding(7) var<storage, read_write> h_out: array<f32>;

fn silu_mul(g: vec4<f32>, u: vec4<f32>) -> vec4<f32> {
    // silu(g) = g * sigmoid(g)
    return g / (vec4<f32>(1.0) + exp(-g)) * u;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wg: vec3<u32>,
        @builtin(subgroup_invocation_id) sl: u32) {
    let n = gid.x;
    let nr = min(n, p.inter - 1u);
    let run = expert_run(wg.y);
    let q = run.q;
    if (run.s >= q) { return; }
    let sv = run.sv;
    let nv = (p.hidden + 31u) / 32u;
    let nb = (p.hidden + 255u) / 256u;
    let g_row = sv + p.gate_q + nr * nv;
    let u_row = sv + p.up_q + nr * nv;
    for (var g0 = run.s; g0 < q; g0 += 8u) {
        // This lane's pair (past the run: its last pair again, not stored).
        let r = min(g0 + sl % 8u, q - 1u) * p.x_row4;
        var acc = acc8_zero();
        for (var b = 0u; b < nb; b++) {
            let sg = q4_scale(sv * 4u + p.gate_s, nr * nb + b);
            let su = q4_scale(sv * 4u + p.up_s, nr * nb + b);
            for (var c = b * 8u; c < min(b * 8u + 8u, nv); c++) {
                let gq = wq_at(g_row + c);
                let uq = wq_at(u_row + c);
                let i = r + c * 8u;
                acc = word_pairs8(acc, gq.x, uq.x, sg, su, xs[i], xs[i + 1u]);
                acc = word_pairs8(acc, gq.y, uq.y, sg, su, xs[i + 2u], xs[i + 3u]);
                acc = word_pairs8(acc, gq.z, uq.z, sg, su, xs[i + 4u], xs[i + 5u]);
                acc = word_pairs8(acc, gq.w, uq.w, sg, su, xs[i + 6u], xs[i + 7u]);
            }
        }
        let h0 = silu_mul(acc.a0, acc.b0);
        let h1 = silu_mul(acc.a1, acc.b1);
        if (n < p.inter) {
            for (var j = 0u; j < min(8u, q - g0); j++) {
                h_out[(g0 + j) * p.h_row + n] = pair8(h0, h1, j);
            }
        }
    }
}

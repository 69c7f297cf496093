// W4A16 SwiGLU second half, expert-major, for multi-token (prefill) steps on CPU adapters:
//   y[t, j, m] = down_e[m] . h[s, :]   for sorted pairs s = (t, j) of expert e
// over the sorted pairs' intermediates h (ffn_gate_up_q4_e.wgsl); workgroup (row block, e)
// reads expert e's rows once per 8 of its pairs, lane l of each subgroup loading pair l's
// intermediates for all (see ffn_gate_up_q4_e.wgsl; subgroups of at least 8 lanes). The
// weighted combine over j follows in moe_combine.wgsl. INT4 layout and parameters as ffn_down_q4.wgsl.

struct Params {
    hidden: u32,       // output rows (H)
    inter: u32,        // input features (I)
    top_k: u32,
    pmax: u32,         // pair capacity (offset of the experts in `pairs`)
    h_row4: u32,       // vec4s per intermediate row
    n_experts: u32,
    slot_vec4: u32,
    first_slot: u32,
    chunk_slots: u32,
    down_q: u32,       // vec4 offset of the down nibbles inside a slot
    down_s: u32,       // u32 offset of the down scales inside a slot
    _a: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> hu: array<vec4<f32>>;   // intermediate rows, by pair
@group(0) @binding(3) var<storage, read> pairs: array<u32>;
@group(0) @binding(4) var<storage, read> slot_of: array<u32>;
@group(0) @binding(5) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> ws: array<u32>;
@group(0) @binding(7) var<storage, read_write> y: array<f32>;

// Two rows (weights a0/b0 and a1/b1 of one word each) against 8 pairs' intermediates.
struct Acc { r0a: vec4<f32>, r0b: vec4<f32>, r1a: vec4<f32>, r1b: vec4<f32> }

fn word_rows(acc: Acc, w0: u32, w1: u32, s0: f32, s1: f32, xa: vec4<f32>, xb: vec4<f32>) -> Acc {
    let a0 = lo4(w0, s0);
    let b0 = hi4(w0, s0);
    let a1 = lo4(w1, s1);
    let b1 = hi4(w1, s1);
    let p0 = subgroupBroadcast(xa, 0u); let q0 = subgroupBroadcast(xb, 0u);
    let p1 = subgroupBroadcast(xa, 1u); let q1 = subgroupBroadcast(xb, 1u);
    let p2 = subgroupBroadcast(xa, 2u); let q2 = subgroupBroadcast(xb, 2u);
    let p3 = subgroupBroadcast(xa, 3u); let q3 = subgroupBroadcast(xb, 3u);
    let p4 = subgroupBroadcast(xa, 4u); let q4 = subgroupBroadcast(xb, 4u);
    let p5 = subgroupBroadcast(xa, 5u); let q5 = subgroupBroadcast(xb, 5u);
    let p6 = subgroupBroadcast(xa, 6u); let q6 = subgroupBroadcast(xb, 6u);
    let p7 = subgroupBroadcast(xa, 7u); let q7 = subgroupBroadcast(xb, 7u);
    return Acc(
        acc.r0a + vec4<f32>(dot(a0, p0) + dot(b0, q0), dot(a0, p1) + dot(b0, q1),
                            dot(a0, p2) + dot(b0, q2), dot(a0, p3) + dot(b0, q3)),
        acc.r0b + vec4<f32>(dot(a0, p4) + dot(b0, q4), dot(a0, p5) + dot(b0, q5),
                            dot(a0, p6) + dot(b0, q6), dot(a0, p7) + dot(b0, q7)),
        acc.r1a + vec4<f32>(dot(a1, p0) + dot(b1, q0), dot(a1, p1) + dot(b1, q1),
                            dot(a1, p2) + dot(b1, q2), dot(a1, p3) + dot(b1, q3)),
        acc.r1b + vec4<f32>(dot(a1, p4) + dot(b1, q4), dot(a1, p5) + dot(b1, q5),
                            dot(a1, p6) + dot(b1, q6), dot(a1, p7) + dot(b1, q7)));
}

fn store(m: u32, g0: u32, q: u32, lo: vec4<f32>, hi: vec4<f32>) {
    if (m >= p.hidden) { return; }
    for (var j = 0u; j < min(8u, q - g0); j++) {
        var v = 0.0;
        if (j < 4u) { v = lo[j]; } else { v = hi[j - 4u]; }
        y[pairs[g0 + j] * p.hidden + m] = v;
    }
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
        @builtin(subgroup_invocation_id) sl: u32) {
    // Rows m0 and m0 + 64 of this workgroup's 128.
    let m0 = wg.x * 128u + li;
    let m1 = m0 + 64u;
    let mr0 = min(m0, p.hidden - 1u);
    let mr1 = min(m1, p.hidden - 1u);
    // Expert e's sorted pairs [s, q): moe_sort left each count slot at its run's end.
    let e = wg.y;
    if (e >= p.n_experts || step.n_tokens == 0u) { return; }
    let cnt = 2u * p.pmax;
    let q = pairs[cnt + e];
    var s = 0u;
    if (e > 0u) { s = pairs[cnt + e - 1u]; }
    if (s >= q) { return; }
    let nv = (p.inter + 31u) / 32u;
    let nb = (p.inter + 255u) / 256u;
    let slot = slot_of[e];
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) { return; }
    let sv = (slot - p.first_slot) * p.slot_vec4;
    let row0 = sv + p.down_q + mr0 * nv;
    let row1 = sv + p.down_q + mr1 * nv;
    let sb = sv * 4u + p.down_s;
    for (var g0 = s; g0 < q; g0 += 8u) {
        // This lane's pair (past the run: its last pair again, not stored).
        let r = min(g0 + sl % 8u, q - 1u) * p.h_row4;
        var acc = Acc(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
        for (var b = 0u; b < nb; b++) {
            let i0 = mr0 * nb + b;
            let i1 = mr1 * nb + b;
            let s0 = q4_scale(sb, i0);
            let s1 = q4_scale(sb, i1);
            for (var c = b * 8u; c < min(b * 8u + 8u, nv); c++) {
                let w0 = wq_at(row0 + c);
                let w1 = wq_at(row1 + c);
                let i = r + c * 8u;
                acc = word_rows(acc, w0.x, w1.x, s0, s1, hu[i], hu[i + 1u]);
                acc = word_rows(acc, w0.y, w1.y, s0, s1, hu[i + 2u], hu[i + 3u]);
                acc = word_rows(acc, w0.z, w1.z, s0, s1, hu[i + 4u], hu[i + 5u]);
                acc = word_rows(acc, w0.w, w1.w, s0, s1, hu[i + 6u], hu[i + 7u]);
            }
        }
        store(m0, g0, q, acc.r0a, acc.r0b);
        store(m1, g0, q, acc.r1a, acc.r1b);
    }
}

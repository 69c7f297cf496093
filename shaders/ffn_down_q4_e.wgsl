// W4A16 SwiGLU second half, expert-major, for multi-token (prefill) steps on CPU adapters:
//   y[t, j, m] = down_e[m] . h[s, :]   for sorted pairs s = (t, j) of expert e
// over the sorted pairs' intermediates h (ffn_gate_up_q4_e.wgsl); workgroup (row block, e)
// reads expert e's rows once per 8 of its pairs (common/q4_pairs8.wgsl). The
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
@group(0) @binding(2) var<storage, read> xs: array<vec4<f32>>;   // intermediate rows, by pair
@group(0) @binding(3) var<storage, read> pairs: array<u32>;
@group(0) @binding(4) var<storage, read> slot_of: array<u32>;
@group(0) @binding(5) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> ws: array<u32>;
@group(0) @binding(7) var<storage, read_write> y: array<f32>;

fn store(m: u32, g0: u32, q: u32, lo: vec4<f32>, hi: vec4<f32>) {
    if (m >= p.hidden) { return; }
    for (var j = 0u; j < min(8u, q - g0); j++) { y[pairs[g0 + j] * p.hidden + m] = pair8(lo, hi, j); }
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
        @builtin(subgroup_invocation_id) sl: u32) {
    // Rows m0 and m0 + 64 of this workgroup's 128.
    let m0 = wg.x * 128u + li;
    let m1 = m0 + 64u;
    let mr0 = min(m0, p.hidden - 1u);
    let mr1 = min(m1, p.hidden - 1u);
    let run = expert_run(wg.y);
    let q = run.q;
    if (run.s >= q) { return; }
    let sv = run.sv;
    let nv = (p.inter + 31u) / 32u;
    let nb = (p.inter + 255u) / 256u;
    let row0 = sv + p.down_q + mr0 * nv;
    let row1 = sv + p.down_q + mr1 * nv;
    let sb = sv * 4u + p.down_s;
    for (var g0 = run.s; g0 < q; g0 += 8u) {
        // This lane's pair (past the run: its last pair again, not stored).
        let r = min(g0 + sl % 8u, q - 1u) * p.h_row4;
        var acc = acc8_zero();
        for (var b = 0u; b < nb; b++) {
            let i0 = mr0 * nb + b;
            let i1 = mr1 * nb + b;
            let s0 = q4_scale(sb, i0);
            let s1 = q4_scale(sb, i1);
            for (var c = b * 8u; c < min(b * 8u + 8u, nv); c++) {
                let w0 = wq_at(row0 + c);
                let w1 = wq_at(row1 + c);
                let i = r + c * 8u;
                acc = word_pairs8(acc, w0.x, w1.x, s0, s1, xs[i], xs[i + 1u]);
                acc = word_pairs8(acc, w0.y, w1.y, s0, s1, xs[i + 2u], xs[i + 3u]);
                acc = word_pairs8(acc, w0.z, w1.z, s0, s1, xs[i + 4u], xs[i + 5u]);
                acc = word_pairs8(acc, w0.w, w1.w, s0, s1, xs[i + 6u], xs[i + 7u]);
            }
        }
        store(m0, g0, q, acc.a0, acc.a1);
        store(m1, g0, q, acc.b0, acc.b1);
    }
}

// W4A16 SwiGLU second half, expert-major, for multi-token (prefill) steps on CPU adapters:
//   y[t, j, m] = down_e[m] . h[s, :]   for sorted pairs s = (t, j) of expert e
// over the sorted pairs' intermediates h (ffn_gate_up_q4_e.wgsl); workgroup (row block, e)
// reads expert e's rows once per 8 of its pairs, lane l of each subgroup loading pair l's
// intermediates for all (see ffn_gate_up_q4_e.wgsl; subgroups of at least 8 lanes). The
// weighted combine over j follows in moe_combine.wgsl. One invocation per output row;
// INT4 layout and parameters as ffn_down_q4.wgsl.

struct Params {
    hidden: u32,       // output rows (H)
    inter: u32,        // input features (I)
    top_k: u32,
    pmax: u32,
    h_row4: u32,       // vec4s per intermediate row
    _a: u32,
    n_experts: u32,
    _t: u32,
    slot_vec4: u32,
    first_slot: u32,
    chunk_slots: u32,
    down_q: u32,       // vec4 offset of the down nibbles inside a slot
    _q: u32,
    down_s: u32,       // u32 offset of the down scales inside a slot
    _s: u32,
    _b: u32,
}
struct Step { pos0: u32, n_tokens: u32, _a: u32, _b: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> hu: array<vec4<f32>>;   // intermediate rows, by pair
@group(0) @binding(3) var<storage, read> pairs: array<u32>;
@group(0) @binding(4) var<storage, read> slot_of: array<u32>;
@group(0) @binding(5) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> ws: array<u32>;
@group(0) @binding(7) var<storage, read_write> y: array<f32>;

fn lo4(w: u32, s: f32) -> vec4<f32> {
    return (vec4<f32>(unpack4xU8(w & 0x0F0F0F0Fu)) - vec4<f32>(8.0)) * s;
}

fn hi4(w: u32, s: f32) -> vec4<f32> {
    return (vec4<f32>(unpack4xU8((w >> 4u) & 0x0F0F0F0Fu)) - vec4<f32>(8.0)) * s;
}

fn word(acc0: vec4<f32>, acc1: vec4<f32>, w: u32, s: f32, xa: vec4<f32>, xb: vec4<f32>) -> array<vec4<f32>, 2> {
    let a = lo4(w, s);
    let b = hi4(w, s);
    return array<vec4<f32>, 2>(
        acc0 + vec4<f32>(dot(a, subgroupBroadcast(xa, 0u)) + dot(b, subgroupBroadcast(xb, 0u)),
                         dot(a, subgroupBroadcast(xa, 1u)) + dot(b, subgroupBroadcast(xb, 1u)),
                         dot(a, subgroupBroadcast(xa, 2u)) + dot(b, subgroupBroadcast(xb, 2u)),
                         dot(a, subgroupBroadcast(xa, 3u)) + dot(b, subgroupBroadcast(xb, 3u))),
        acc1 + vec4<f32>(dot(a, subgroupBroadcast(xa, 4u)) + dot(b, subgroupBroadcast(xb, 4u)),
                         dot(a, subgroupBroadcast(xa, 5u)) + dot(b, subgroupBroadcast(xb, 5u)),
                         dot(a, subgroupBroadcast(xa, 6u)) + dot(b, subgroupBroadcast(xb, 6u)),
                         dot(a, subgroupBroadcast(xa, 7u)) + dot(b, subgroupBroadcast(xb, 7u))));
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wg: vec3<u32>,
        @builtin(subgroup_invocation_id) sl: u32) {
    let m = gid.x;
    let mr = min(m, p.hidden - 1u);
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
    {
        let slot = slot_of[e];
        if (slot >= p.first_slot && slot < p.first_slot + p.chunk_slots) {
            let sv = (slot - p.first_slot) * p.slot_vec4;
            let row = sv + p.down_q + mr * nv;
            for (var g0 = s; g0 < q; g0 += 8u) {
                let r = min(g0 + sl % 8u, q - 1u) * p.h_row4;
                var acc = array<vec4<f32>, 2>(vec4<f32>(0.0), vec4<f32>(0.0));
                for (var b = 0u; b < nb; b++) {
                    let idx = mr * nb + b;
                    let sc = unpack2x16float(ws[sv * 4u + p.down_s + idx / 2u])[idx % 2u];
                    for (var c = b * 8u; c < min(b * 8u + 8u, nv); c++) {
                        let wv = wq[row + c];
                        let i = r + c * 8u;
                        acc = word(acc[0], acc[1], wv.x, sc, hu[i], hu[i + 1u]);
                        acc = word(acc[0], acc[1], wv.y, sc, hu[i + 2u], hu[i + 3u]);
                        acc = word(acc[0], acc[1], wv.z, sc, hu[i + 4u], hu[i + 5u]);
                        acc = word(acc[0], acc[1], wv.w, sc, hu[i + 6u], hu[i + 7u]);
                    }
                }
                if (m < p.hidden) {
                    for (var j = 0u; j < min(8u, q - g0); j++) {
                        var v = 0.0;
                        if (j < 4u) { v = acc[0][j]; } else { v = acc[1][j - 4u]; }
                        y[pairs[g0 + j] * p.hidden + m] = v;
                    }
                }
            }
        }
    }
}

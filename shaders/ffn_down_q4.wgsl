// W4A16 SwiGLU second half for INT4 experts (layout in src/quant.rs). Two modes:
// - per slot (flags bit 0 clear): y[t, j, m] = down_e[m] . h[t, j, :] for one top-k index
//   per invocation row (grid y = top-k indices served);
// - fused combine (flags bit 0 set): x[t, m] += sum_j w[t, j] * (down_e[m] . h[t, j, :])
//   over the top-k experts whose slot is in this chunk, so the weighted combine needs no
//   separate dispatch and no y buffer. Chunks run as successive dispatches, so the
//   read-modify-write of x never races.

struct Params {
    hidden: u32,       // output rows (H)
    inter: u32,        // input features (I)
    top_k: u32,
    j_base: u32,
    x_stride: u32,     // unused
    slot_vec4: u32,
    first_slot: u32,
    chunk_slots: u32,
    down_q: u32,       // vec4 offset of the down nibbles inside a slot
    _q: u32,
    down_s: u32,       // u32 offset of the down scales inside a slot
    _s: u32,
    flags: u32,        // bit 0: fused weighted combine into out
    _a: u32,
    _b: u32,
    _c: u32,
}
struct Step { pos0: u32, n_tokens: u32, _a: u32, _b: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> h: array<f32>;
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read> slot_of: array<u32>;
@group(0) @binding(5) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> ws: array<u32>;
@group(0) @binding(7) var<storage, read> weights: array<f32>;
@group(0) @binding(8) var<storage, read_write> out: array<f32>;

fn dot8(w: u32, i: u32) -> f32 {
    let lo = vec4<f32>(unpack4xU8(w & 0x0F0F0F0Fu)) - vec4<f32>(8.0);
    let hi = vec4<f32>(unpack4xU8((w >> 4u) & 0x0F0F0F0Fu)) - vec4<f32>(8.0);
    return dot(lo, vec4<f32>(h[i], h[i + 1u], h[i + 2u], h[i + 3u]))
         + dot(hi, vec4<f32>(h[i + 4u], h[i + 5u], h[i + 6u], h[i + 7u]));
}

fn dot32(q: vec4<u32>, i: u32) -> f32 {
    return dot8(q.x, i) + dot8(q.y, i + 8u) + dot8(q.z, i + 16u) + dot8(q.w, i + 24u);
}

// down_e[m] . h[t, j, :] for the expert in `slot` (relative to this chunk).
fn row_dot(rel_slot: u32, m: u32, hb: u32) -> f32 {
    let sv = rel_slot * p.slot_vec4;
    let sw = sv * 4u + p.down_s;
    let nv = (p.inter + 31u) / 32u;
    let nb = (p.inter + 255u) / 256u;
    let op2 = (p.hidden + 1u) / 2u * 2u;
    var acc = 0.0;
    for (var b = 0u; b < nb; b++) {
        var bs = 0.0;
        let c_end = min(b * 8u + 8u, nv);
        for (var c = b * 8u; c < c_end; c++) {
            bs += dot32(wq[sv + p.down_q + c * p.hidden + m], hb + c * 32u);
        }
        let idx = b * op2 + m;
        acc += unpack2x16float(ws[sw + idx / 2u])[idx % 2u] * bs;
    }
    return acc;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let m = gid.x;
    let t = gid.z;
    if (m >= p.hidden || t >= step.n_tokens) { return; }
    if ((p.flags & 1u) != 0u) {
        var acc = 0.0;
        var hit = false;
        for (var j = 0u; j < p.top_k; j++) {
            let slot = slot_of[ids[t * p.top_k + j]];
            if (slot >= p.first_slot && slot < p.first_slot + p.chunk_slots) {
                acc += weights[t * p.top_k + j] * row_dot(slot - p.first_slot, m, (t * p.top_k + j) * p.inter);
                hit = true;
            }
        }
        if (hit) { out[t * p.hidden + m] += acc; }
        return;
    }
    let j = gid.y + p.j_base;
    let slot = slot_of[ids[t * p.top_k + j]];
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) { return; }
    out[(t * p.top_k + j) * p.hidden + m] = row_dot(slot - p.first_slot, m, (t * p.top_k + j) * p.inter);
}

// W4A16 SwiGLU second half for INT4 experts, decode variant (one token): the SwiGLU
// intermediates h[j, :] of the token's top-k experts sit in a uniform buffer, so the
// lanes of a workgroup share each load (see ffn_gate_up_q4_u.wgsl). One invocation per
// output row. Modes, layout and parameters as ffn_down_q4.wgsl: per slot into y[0, j, :],
// or fused weighted combine into x[0, :]. Used when k * inter floats fit 64 KiB and
// `inter` is a multiple of 4.

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
@group(0) @binding(2) var<uniform> hu: array<vec4<f32>, 4096>;  // h[j, :] of the token
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read> slot_of: array<u32>;
@group(0) @binding(5) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> ws: array<u32>;
@group(0) @binding(7) var<storage, read> weights: array<f32>;
@group(0) @binding(8) var<storage, read_write> out: array<f32>;

fn dot8(w: u32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    let lo = vec4<f32>(unpack4xU8(w & 0x0F0F0F0Fu)) - vec4<f32>(8.0);
    let hi = vec4<f32>(unpack4xU8((w >> 4u) & 0x0F0F0F0Fu)) - vec4<f32>(8.0);
    return dot(lo, a) + dot(hi, b);
}

// h[j, k0 .. k0 + 4] with k0 = 4 * i (row base hb4 in vec4s), 0 past `inter`.
fn ha(hb4: u32, i: u32) -> vec4<f32> {
    let v = hu[hb4 + i];
    let k0 = i * 4u;
    if (k0 + 4u <= p.inter) { return v; }
    return select(vec4<f32>(0.0), v, vec4<u32>(k0, k0 + 1u, k0 + 2u, k0 + 3u) < vec4<u32>(p.inter));
}

fn dot32(q: vec4<u32>, hb4: u32, c: u32) -> f32 {
    let i = c * 8u;
    return dot8(q.x, ha(hb4, i), ha(hb4, i + 1u)) + dot8(q.y, ha(hb4, i + 2u), ha(hb4, i + 3u))
         + dot8(q.z, ha(hb4, i + 4u), ha(hb4, i + 5u)) + dot8(q.w, ha(hb4, i + 6u), ha(hb4, i + 7u));
}

// down_e[m] . h[j, :] for the expert in chunk-relative slot `rel`.
fn row_dot(rel: u32, m: u32, j: u32) -> f32 {
    let sv = rel * p.slot_vec4;
    let nv = (p.inter + 31u) / 32u;
    let nb = (p.inter + 255u) / 256u;
    let row = sv + p.down_q + m * nv;
    let hb4 = j * p.inter / 4u;
    var acc = 0.0;
    for (var b = 0u; b < nb; b++) {
        var bs = 0.0;
        for (var c = b * 8u; c < min(b * 8u + 8u, nv); c++) {
            bs += dot32(wq[row + c], hb4, c);
        }
        let idx = m * nb + b;
        acc += unpack2x16float(ws[sv * 4u + p.down_s + idx / 2u])[idx % 2u] * bs;
    }
    return acc;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let m = gid.x;
    if (m >= p.hidden || step.n_tokens == 0u) { return; }
    if ((p.flags & 1u) != 0u) {
        var acc = 0.0;
        var hit = false;
        for (var j = 0u; j < p.top_k; j++) {
            let slot = slot_of[ids[j]];
            if (slot >= p.first_slot && slot < p.first_slot + p.chunk_slots) {
                acc += weights[j] * row_dot(slot - p.first_slot, m, j);
                hit = true;
            }
        }
        if (hit) { out[m] += acc; }
        return;
    }
    let j = gid.y + p.j_base;
    let slot = slot_of[ids[j]];
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) { return; }
    out[j * p.hidden + m] = row_dot(slot - p.first_slot, m, j);
}

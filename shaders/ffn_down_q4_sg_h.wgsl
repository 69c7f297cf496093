enable f16;

// f16-arithmetic variant of ffn_down_q4_sg.wgsl, for adapters with SHADER_F16 (by default GPUs,
// where packed f16 math doubles throughput; llvmpipe emulates it). Only the products inside
// one u32 word of nibbles are f16; all accumulation stays f32.
// W4A16 SwiGLU second half for INT4 experts (layout in src/quant.rs). Two modes:
// - per slot (flags bit 0 clear): y[t, j, m] = down_e[m] . h[t, j, :] for the top-k
//   indices j_base .. j_base + grid y;
// - fused combine (flags bit 0 set): x[t, m] += sum_j w[t, j] * (down_e[m] . h[t, j, :])
//   over the top-k experts whose slot is in this chunk, so the weighted combine needs no
//   separate dispatch and no y buffer. Chunks run as successive dispatches, so the
//   read-modify-write of x never races.
// Subgroup variant: a workgroup serves 8 rows, each given to 8 consecutive lanes (lane l
// takes vec4 l of every 256-input block), partial sums combined with subgroup shuffles.
// Needs SUBGROUP with subgroups of at least 8 lanes; ffn_down_q4.wgsl is the portable
// variant.

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
@group(0) @binding(9) var<storage, read> h4: array<vec4<f32>>;  // h again, as vec4s

// q . a over the 8 columns of one u32 word: its bytes' low nibbles are columns 0..3 (a),
// high nibbles columns 4..7 (b).
fn dot8(w: u32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    // f16 arithmetic for the 8 products of a word (nibbles are exact in f16; activations
    // are rounded to f16), then f32 for every sum across words and blocks.
    let lo = vec4<f16>(unpack4xU8(w & 0x0F0F0F0Fu)) - vec4<f16>(8.0h);
    let hi = vec4<f16>(unpack4xU8((w >> 4u) & 0x0F0F0F0Fu)) - vec4<f16>(8.0h);
    return f32(dot(lo, vec4<f16>(a))) + f32(dot(hi, vec4<f16>(b)));
}

// Activation i (< inter) of the row starting at `base`, 0 past the end: neither padding
// nor the next row may contribute (0 * NaN would).
fn act(base: u32, k: u32) -> f32 {
    return select(0.0, h[base + min(k, p.inter - 1u)], k < p.inter);
}

fn act4(base: u32, k: u32) -> vec4<f32> {
    return vec4<f32>(act(base, k), act(base, k + 1u), act(base, k + 2u), act(base, k + 3u));
}

// 32 activations from column k0 of the row at `base`, as 8 vec4s: one vec4 load each
// when the row is 16-byte aligned and whole (llvmpipe checks bounds per load, so fewer,
// wider loads win), element by element otherwise.
struct Act32 { a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>, a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32> }

fn act32(base: u32, k0: u32) -> Act32 {
    if (k0 + 32u <= p.inter && (base % 4u) == 0u) {
        let i = (base + k0) / 4u;
        return Act32(h4[i], h4[i + 1u], h4[i + 2u], h4[i + 3u], h4[i + 4u], h4[i + 5u], h4[i + 6u], h4[i + 7u]);
    }
    return Act32(act4(base, k0), act4(base, k0 + 4u), act4(base, k0 + 8u), act4(base, k0 + 12u),
                 act4(base, k0 + 16u), act4(base, k0 + 20u), act4(base, k0 + 24u), act4(base, k0 + 28u));
}

fn dot32(q: vec4<u32>, a: Act32) -> f32 {
    return dot8(q.x, a.a0, a.a1) + dot8(q.y, a.a2, a.a3) + dot8(q.z, a.a4, a.a5) + dot8(q.w, a.a6, a.a7);
}

fn scale(word_base: u32, half_index: u32) -> f32 {
    return unpack2x16float(ws[word_base + half_index / 2u])[half_index % 2u];
}

fn reduce8(v: f32) -> f32 {
    var s = v;
    s += subgroupShuffleXor(s, 4u);
    s += subgroupShuffleXor(s, 2u);
    s += subgroupShuffleXor(s, 1u);
    return s;
}

// This lane's share of down_e[m] . h[hb ..] for the expert in chunk-relative slot `rel`;
// reduce8 over the row's 8 lanes gives the full dot product.
fn lane_dot(rel: u32, m: u32, hb: u32, lane: u32) -> f32 {
    let sv = rel * p.slot_vec4;
    let nv = (p.inter + 31u) / 32u;
    let nb = (p.inter + 255u) / 256u;
    let row = sv + p.down_q + m * nv;
    var acc = 0.0;
    for (var b = 0u; b < nb; b++) {
        let c = b * 8u + lane;
        if (c < nv) {
            acc += scale(sv * 4u + p.down_s, m * nb + b) * dot32(wq[row + c], act32(hb, c * 32u));
        }
    }
    return acc;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lane = li % 8u;
    // Rows past the end are computed on the last row and not stored, so every lane of a
    // row group takes part in the shuffles.
    let m_raw = wid.x * 8u + li / 8u;
    let m = min(m_raw, p.hidden - 1u);
    let t = wid.z;
    if (t >= step.n_tokens) { return; }
    if ((p.flags & 1u) != 0u) {
        var acc = 0.0;
        var hit = false;
        for (var j = 0u; j < p.top_k; j++) {
            let slot = slot_of[ids[t * p.top_k + j]];
            if (slot >= p.first_slot && slot < p.first_slot + p.chunk_slots) {
                let d = reduce8(lane_dot(slot - p.first_slot, m, (t * p.top_k + j) * p.inter, lane));
                acc += weights[t * p.top_k + j] * d;
                hit = true;
            }
        }
        if (hit && lane == 0u && m_raw < p.hidden) { out[t * p.hidden + m] += acc; }
        return;
    }
    let j = wid.y + p.j_base;
    let slot = slot_of[ids[t * p.top_k + j]];
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) { return; }
    let d = reduce8(lane_dot(slot - p.first_slot, m, (t * p.top_k + j) * p.inter, lane));
    if (lane == 0u && m_raw < p.hidden) { out[(t * p.top_k + j) * p.hidden + m] = d; }
}

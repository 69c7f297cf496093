enable f16;

// f16-arithmetic variant of ffn_gate_up_q4_sg.wgsl, for adapters with SHADER_F16 (by default GPUs,
// where packed f16 math doubles throughput; llvmpipe emulates it). Only the products inside
// one u32 word of nibbles are f16; all accumulation stays f32.
// W4A16 SwiGLU first half for routed experts held as INT4 (layout in src/quant.rs):
//   h[t, j, n] = silu(gate_e[n] . x_t) * (up_e[n] . x_t)
// Nibbles are converted inside the kernel and multiplied in f32 with the activations; no
// expanded copy of an expert exists anywhere. Each 256-input block is summed unscaled and
// multiplied by its f16 scale once. Expert ids come from the router on the GPU, mapped to
// a pool slot by the slot table; one dispatch serves one chunk of slots.
// Subgroup variant: a workgroup serves 8 rows; each row is given to 8 consecutive lanes,
// lane l taking vec4 l of every 256-input block (so the 8 lanes of a row read 128
// contiguous bytes and one scale each), and the lanes' partial sums are combined with
// subgroup shuffles. Needs SUBGROUP with subgroups of at least 8 lanes;
// ffn_gate_up_q4.wgsl is the portable variant.

struct Params {
    hidden: u32,       // input features (H)
    inter: u32,        // output rows (I)
    top_k: u32,
    j_base: u32,       // first top-k index served (per-expert executor: one per dispatch)
    x_stride: u32,
    slot_vec4: u32,    // vec4<u32> per slot
    first_slot: u32,
    chunk_slots: u32,
    gate_q: u32,       // vec4 offset of the gate nibbles inside a slot
    up_q: u32,
    gate_s: u32,       // u32 offset of the gate scales inside a slot
    up_s: u32,
    flags: u32,        // unused (kept for layout symmetry with ffn_down_q4)
    _a: u32,
    _b: u32,
    _c: u32,
}
struct Step { pos0: u32, n_tokens: u32, _a: u32, _b: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read> slot_of: array<u32>;
@group(0) @binding(5) var<storage, read> wq: array<vec4<u32>>;  // the chunk, as nibbles
@group(0) @binding(6) var<storage, read> ws: array<u32>;        // the same chunk, as scales
@group(0) @binding(7) var<storage, read_write> h_out: array<f32>;
@group(0) @binding(8) var<storage, read> x4: array<vec4<f32>>;  // x again, as vec4s

// q . a over the 8 columns of one u32 word: its bytes' low nibbles are columns 0..3 (a),
// high nibbles columns 4..7 (b).
fn dot8(w: u32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    // f16 arithmetic for the 8 products of a word (nibbles are exact in f16; activations
    // are rounded to f16), then f32 for every sum across words and blocks.
    let lo = vec4<f16>(unpack4xU8(w & 0x0F0F0F0Fu)) - vec4<f16>(8.0h);
    let hi = vec4<f16>(unpack4xU8((w >> 4u) & 0x0F0F0F0Fu)) - vec4<f16>(8.0h);
    return f32(dot(lo, vec4<f16>(a))) + f32(dot(hi, vec4<f16>(b)));
}

// Activation i (< hidden) of the row starting at `base`, 0 past the end: neither padding
// nor the next row may contribute (0 * NaN would).
fn act(base: u32, k: u32) -> f32 {
    return select(0.0, x[base + min(k, p.hidden - 1u)], k < p.hidden);
}

fn act4(base: u32, k: u32) -> vec4<f32> {
    return vec4<f32>(act(base, k), act(base, k + 1u), act(base, k + 2u), act(base, k + 3u));
}

// 32 activations from column k0 of the row at `base`, as 8 vec4s: one vec4 load each
// when the row is 16-byte aligned and whole (llvmpipe checks bounds per load, so fewer,
// wider loads win), element by element otherwise.
struct Act32 { a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>, a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32> }

fn act32(base: u32, k0: u32) -> Act32 {
    if (k0 + 32u <= p.hidden && (base % 4u) == 0u) {
        let i = (base + k0) / 4u;
        return Act32(x4[i], x4[i + 1u], x4[i + 2u], x4[i + 3u], x4[i + 4u], x4[i + 5u], x4[i + 6u], x4[i + 7u]);
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

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lane = li % 8u;
    // Rows past the end are computed on the last row and not stored, so every lane of a
    // row group takes part in the shuffles.
    let n_raw = wid.x * 8u + li / 8u;
    let n = min(n_raw, p.inter - 1u);
    let j = wid.y + p.j_base;
    let t = wid.z;
    if (t >= step.n_tokens) { return; }
    let slot = slot_of[ids[t * p.top_k + j]];
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) { return; }
    let sv = (slot - p.first_slot) * p.slot_vec4;
    let nv = (p.hidden + 31u) / 32u;
    let nb = (p.hidden + 255u) / 256u;
    let g_row = sv + p.gate_q + n * nv;
    let u_row = sv + p.up_q + n * nv;
    let xb = t * p.x_stride;
    var g = 0.0;
    var u = 0.0;
    for (var b = 0u; b < nb; b++) {
        let c = b * 8u + lane;
        if (c < nv) {
            let a = act32(xb, c * 32u);
            g += scale(sv * 4u + p.gate_s, n * nb + b) * dot32(wq[g_row + c], a);
            u += scale(sv * 4u + p.up_s, n * nb + b) * dot32(wq[u_row + c], a);
        }
    }
    g = reduce8(g);
    u = reduce8(u);
    if (lane == 0u && n_raw < p.inter) {
        // silu(g) = g * sigmoid(g)
        h_out[(t * p.top_k + j) * p.inter + n] = g / (1.0 + exp(-g)) * u;
    }
}

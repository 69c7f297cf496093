// W4A16 SwiGLU first half for routed experts held as INT4 (layout in src/quant.rs):
//   h[t, j, n] = silu(gate_e[n] . x_t) * (up_e[n] . x_t)
// Nibbles are converted inside the kernel and multiplied in f32 with the activations; no
// expanded copy of an expert exists anywhere. Each block of 256 inputs is summed
// unscaled and multiplied by its f16 scale once. Expert ids come from the router on the
// GPU, mapped to a pool slot by the slot table; one dispatch serves one chunk of slots.

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

// 8 columns of one u32 word (byte i: column i low nibble, column 4 + i high nibble).
fn dot8(w: u32, i: u32) -> f32 {
    let lo = vec4<f32>(unpack4xU8(w & 0x0F0F0F0Fu)) - vec4<f32>(8.0);
    let hi = vec4<f32>(unpack4xU8((w >> 4u) & 0x0F0F0F0Fu)) - vec4<f32>(8.0);
    return dot(lo, vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]))
         + dot(hi, vec4<f32>(x[i + 4u], x[i + 5u], x[i + 6u], x[i + 7u]));
}

fn dot32(q: vec4<u32>, i: u32) -> f32 {
    return dot8(q.x, i) + dot8(q.y, i + 8u) + dot8(q.z, i + 16u) + dot8(q.w, i + 24u);
}

fn scale(word_base: u32, block: u32, n: u32, out_pad2: u32) -> f32 {
    let idx = block * out_pad2 + n;
    return unpack2x16float(ws[word_base + idx / 2u])[idx % 2u];
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = gid.x;
    let j = gid.y + p.j_base;
    let t = gid.z;
    if (n >= p.inter || t >= step.n_tokens) { return; }
    let slot = slot_of[ids[t * p.top_k + j]];
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) { return; }
    let sv = (slot - p.first_slot) * p.slot_vec4;
    let sw = sv * 4u;
    let nv = (p.hidden + 31u) / 32u;
    let nb = (p.hidden + 255u) / 256u;
    let op2 = (p.inter + 1u) / 2u * 2u;
    let xb = t * p.x_stride;
    var g = 0.0;
    var u = 0.0;
    for (var b = 0u; b < nb; b++) {
        var bg = 0.0;
        var bu = 0.0;
        let c_end = min(b * 8u + 8u, nv);
        for (var c = b * 8u; c < c_end; c++) {
            let i = xb + c * 32u;
            bg += dot32(wq[sv + p.gate_q + c * p.inter + n], i);
            bu += dot32(wq[sv + p.up_q + c * p.inter + n], i);
        }
        g += scale(sw + p.gate_s, b, n, op2) * bg;
        u += scale(sw + p.up_s, b, n, op2) * bu;
    }
    // silu(g) = g * sigmoid(g)
    h_out[(t * p.top_k + j) * p.inter + n] = g / (1.0 + exp(-g)) * u;
}

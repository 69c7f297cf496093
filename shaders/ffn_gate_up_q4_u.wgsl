// W4A16 SwiGLU first half for INT4 experts, decode variant (one token): the activations
// sit in a uniform buffer, so every invocation of a workgroup reads the same address and
// llvmpipe loads them once for all lanes instead of lane by lane with bounds checks
// (about 10x faster there than ffn_gate_up_q4.wgsl). One invocation per output row.
//   h[0, j, n] = silu(gate_e[n] . x) * (up_e[n] . x)
// Used when the token's activations fit 64 KiB and the rows are 16-byte aligned; layout
// and parameters as ffn_gate_up_q4.wgsl.

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
@group(0) @binding(2) var<uniform> xu: array<vec4<f32>, 4096>;  // x of the token
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read> slot_of: array<u32>;
@group(0) @binding(5) var<storage, read> wq: array<vec4<u32>>;  // the chunk, as nibbles
@group(0) @binding(6) var<storage, read> ws: array<u32>;        // the same chunk, as scales
@group(0) @binding(7) var<storage, read_write> h_out: array<f32>;

// q . a over the 8 columns of one u32 word: its bytes' low nibbles are columns 0..3 (a),
// high nibbles columns 4..7 (b).
fn dot8(w: u32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    let lo = vec4<f32>(unpack4xU8(w & 0x0F0F0F0Fu)) - vec4<f32>(8.0);
    let hi = vec4<f32>(unpack4xU8((w >> 4u) & 0x0F0F0F0Fu)) - vec4<f32>(8.0);
    return dot(lo, a) + dot(hi, b);
}

// Activations k0 .. k0 + 4 (vec4 index i = k0 / 4), 0 past `hidden`.
fn xa(i: u32) -> vec4<f32> {
    let v = xu[i];
    let k0 = i * 4u;
    if (k0 + 4u <= p.hidden) { return v; }
    return select(vec4<f32>(0.0), v, vec4<u32>(k0, k0 + 1u, k0 + 2u, k0 + 3u) < vec4<u32>(p.hidden));
}

fn dot32(q: vec4<u32>, c: u32) -> f32 {
    let i = c * 8u;
    return dot8(q.x, xa(i), xa(i + 1u)) + dot8(q.y, xa(i + 2u), xa(i + 3u))
         + dot8(q.z, xa(i + 4u), xa(i + 5u)) + dot8(q.w, xa(i + 6u), xa(i + 7u));
}

fn scale(word_base: u32, half_index: u32) -> f32 {
    return unpack2x16float(ws[word_base + half_index / 2u])[half_index % 2u];
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = gid.x;
    let j = gid.y + p.j_base;
    if (n >= p.inter || step.n_tokens == 0u) { return; }
    let slot = slot_of[ids[j]];
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) { return; }
    let sv = (slot - p.first_slot) * p.slot_vec4;
    let nv = (p.hidden + 31u) / 32u;
    let nb = (p.hidden + 255u) / 256u;
    let g_row = sv + p.gate_q + n * nv;
    let u_row = sv + p.up_q + n * nv;
    var g = 0.0;
    var u = 0.0;
    for (var b = 0u; b < nb; b++) {
        var bg = 0.0;
        var bu = 0.0;
        for (var c = b * 8u; c < min(b * 8u + 8u, nv); c++) {
            bg += dot32(wq[g_row + c], c);
            bu += dot32(wq[u_row + c], c);
        }
        g += scale(sv * 4u + p.gate_s, n * nb + b) * bg;
        u += scale(sv * 4u + p.up_s, n * nb + b) * bu;
    }
    // silu(g) = g * sigmoid(g)
    h_out[j * p.inter + n] = g / (1.0 + exp(-g)) * u;
}

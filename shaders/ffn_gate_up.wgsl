// SwiGLU first half for routed experts (and, with a fixed slot, a dense MLP or Qwen's
// shared expert): h[t, j, n] = silu(gate_e[n] . x_t) * (up_e[n] . x_t) with e the j-th
// expert picked for token t. Expert ids are read on the GPU and mapped to a slot of the
// expert pool through the slot table, so no CPU round trip is needed. The pool is split
// into chunks (one storage binding each); this dispatch serves the slots of one chunk.
// Slot layout (f16, rows padded to 8 halves): gate [I][Hp], up [I][Hp], down [H][Ip].

struct Params {
    hidden: u32,
    inter: u32,
    top_k: u32,
    x_stride: u32,
    in_vec4: u32,       // vec4<u32> per gate/up row (Hp / 8)
    slot_vec4: u32,     // vec4<u32> per slot
    first_slot: u32,    // first slot held by this chunk
    chunk_slots: u32,
    flags: u32,         // FFN_FIXED_SLOT: slot 0, not routed
    j_base: u32,        // first top-k index served (per-expert executor: one per dispatch)
    _a: u32,
    _b: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> x: array<f32>;
// ids (3), slot_of (4) and the weights w (5) come from ffn_slot.wgsl.
@group(0) @binding(6) var<storage, read_write> h_out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = gid.x;
    let j = gid.y + p.j_base;
    let t = gid.z;
    let sbase = ffn_slot_base(gid, p.inter);
    if (sbase == NO_SLOT) { return; }
    let g_row = sbase + n * p.in_vec4;
    let u_row = sbase + (p.inter + n) * p.in_vec4;
    let xb = t * p.x_stride;
    var g = 0.0;
    var u = 0.0;
    for (var c = 0u; c < p.in_vec4; c++) {
        let xv = act8(xb, c * 8u, p.hidden);
        let gv = halves(w_at(g_row + c));
        let uv = halves(w_at(u_row + c));
        g += dot(gv[0], xv[0]) + dot(gv[1], xv[1]);
        u += dot(uv[0], xv[0]) + dot(uv[1], xv[1]);
    }
    // silu(g) = g * sigmoid(g)
    h_out[(t * p.top_k + j) * p.inter + n] = g / (1.0 + exp(-g)) * u;
}

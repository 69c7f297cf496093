// SwiGLU second half: y[t, j, m] = down_e[m] . h[t, j, :] for the j-th expert of token t
// (or a fixed slot), reading the expert's down rows from its pool slot. Same slot layout
// as ffn_gate_up.wgsl; the down block starts after the 2*I gate/up rows.

struct Params {
    hidden: u32,
    inter: u32,
    top_k: u32,
    in_vec4: u32,       // vec4<u32> per gate/up row (Hp / 8), to find the down block
    down_vec4: u32,     // vec4<u32> per down row (Ip / 8)
    slot_vec4: u32,
    first_slot: u32,
    chunk_slots: u32,
    flags: u32,         // FFN_FIXED_SLOT: slot 0, not routed
    j_base: u32,        // first top-k index served (per-expert executor: one per dispatch)
    _a: u32,
    _b: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> x: array<f32>;  // h [T, top_k, inter]
// ids (3), slot_of (4) and the weights w (5) come from ffn_slot.wgsl.
@group(0) @binding(6) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let m = gid.x;
    let j = gid.y + p.j_base;
    let t = gid.z;
    let sbase = ffn_slot_base(gid, p.hidden);
    if (sbase == NO_SLOT) { return; }
    let row = sbase + 2u * p.inter * p.in_vec4 + m * p.down_vec4;
    let hb = (t * p.top_k + j) * p.inter;
    var acc = 0.0;
    for (var c = 0u; c < p.down_vec4; c++) {
        let hv = act8(hb, c * 8u, p.inter);
        let wv = halves(w_at(row + c));
        acc += dot(wv[0], hv[0]) + dot(wv[1], hv[1]);
    }
    y[(t * p.top_k + j) * p.hidden + m] = acc;
}

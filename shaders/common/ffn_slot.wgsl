// The inputs of the f16 expert kernels (ffn_gate_up.wgsl, ffn_down.wgsl) besides their
// activations: the router's expert ids, the slot table and the chunk of the expert pool,
// and the pool slot serving top-k index j of token t in this dispatch's chunk of slots.
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read> slot_of: array<u32>;
@group(0) @binding(5) var<storage, read> w: array<vec4<u32>>;

// Another chunk holds the slot.
const NO_SLOT: u32 = 0xffffffffu;

// The vec4 offset, inside this chunk, of the slot serving invocation `gid` (row gid.x of
// `rows`, top-k index gid.y + j_base, token gid.z; slot 0 with FFN_FIXED_SLOT), or
// NO_SLOT when it has nothing to compute.
fn ffn_slot_base(gid: vec3<u32>, rows: u32) -> u32 {
    let j = gid.y + p.j_base;
    let t = gid.z;
    if (gid.x >= rows || t >= step.n_tokens) { return NO_SLOT; }
    var slot = 0u;
    if ((p.flags & FFN_FIXED_SLOT) == 0u) { slot = slot_of[ids[t * p.top_k + j]]; }
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) { return NO_SLOT; }
    return (slot - p.first_slot) * p.slot_vec4;
}

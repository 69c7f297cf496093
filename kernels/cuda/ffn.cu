// f16 SwiGLU halves for pool slots (shaders/ffn_gate_up.wgsl, ffn_down.wgsl): routed
// experts, or with FFN_FIXED_SLOT a dense MLP / shared expert. Slot layout (f16, rows
// padded to 8 halves): gate [I][Hp], up [I][Hp], down [H][Ip]. One thread per output row;
// grid (rows / 64, top-k indices from j_base, tokens).

struct FfnGateUpParams { u32 hidden; u32 inter; u32 top_k; u32 x_stride; u32 in_vec4; u32 slot_vec4; u32 first_slot; u32 chunk_slots; u32 flags; u32 j_base; u32 _a; u32 _b; };
struct FfnDownParams { u32 hidden; u32 inter; u32 top_k; u32 in_vec4; u32 down_vec4; u32 slot_vec4; u32 first_slot; u32 chunk_slots; u32 flags; u32 j_base; u32 _a; u32 _b; };
CHECK_PARAMS(FfnGateUpParams);
CHECK_PARAMS(FfnDownParams);

extern "C" __global__ void ffn_gate_up(FfnGateUpParams p, const Step* step, const float* x,
                                       const u32* ids, const u32* slot_of, const uint4* w,
                                       float* h_out) {
    u32 n = blockIdx.x * blockDim.x + threadIdx.x;
    u32 j = blockIdx.y + p.j_base;
    u32 t = blockIdx.z;
    if (n >= p.inter || t >= step->n_tokens) return;
    u32 slot = (p.flags & FFN_FIXED_SLOT) ? 0u : slot_of[ids[t * p.top_k + j]];
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) return;
    u32 sbase = (slot - p.first_slot) * p.slot_vec4;
    u32 g_row = sbase + n * p.in_vec4;
    u32 u_row = sbase + (p.inter + n) * p.in_vec4;
    u32 xb = t * p.x_stride;
    float g = 0.0f, u = 0.0f;
    for (u32 c = 0; c < p.in_vec4; c++) {
        F8 xv = act8(x, xb, c * 8u, p.hidden);
        g += dot8f(halves(w[g_row + c]), xv);
        u += dot8f(halves(w[u_row + c]), xv);
    }
    // silu(g) = g * sigmoid(g)
    h_out[(t * p.top_k + j) * p.inter + n] = g / (1.0f + expf(-g)) * u;
}

extern "C" __global__ void ffn_down(FfnDownParams p, const Step* step, const float* x,
                                    const u32* ids, const u32* slot_of, const uint4* w,
                                    float* y) {
    u32 m = blockIdx.x * blockDim.x + threadIdx.x;
    u32 j = blockIdx.y + p.j_base;
    u32 t = blockIdx.z;
    if (m >= p.hidden || t >= step->n_tokens) return;
    u32 slot = (p.flags & FFN_FIXED_SLOT) ? 0u : slot_of[ids[t * p.top_k + j]];
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) return;
    u32 row = (slot - p.first_slot) * p.slot_vec4 + 2u * p.inter * p.in_vec4 + m * p.down_vec4;
    u32 hb = (t * p.top_k + j) * p.inter;
    float acc = 0.0f;
    for (u32 c = 0; c < p.down_vec4; c++) acc += dot8f(halves(w[row + c]), act8(x, hb, c * 8u, p.inter));
    y[(t * p.top_k + j) * p.hidden + m] = acc;
}

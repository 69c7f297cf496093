// Adds the MoE block's output to the residual stream (shaders/moe_combine.wgsl):
//   x[t] += sum_j w[t, j] y[t, j] + g_t shared[t] + host[t]
// Grid (hidden / 64, tokens).

struct MoeCombineParams { u32 hidden; u32 top_k; u32 flags; u32 gate_stride; u32 gate_col; u32 slots; u32 gate_splits; u32 _c; };
CHECK_PARAMS(MoeCombineParams);

extern "C" __global__ void moe_combine(MoeCombineParams p, const Step* step, const float* y,
                                       const float* weights, const float* shared_y,
                                       const float* router_logits, float* x, const u32* ids,
                                       const u32* slot_of, const float* host_y) {
    u32 m = blockIdx.x * blockDim.x + threadIdx.x;
    u32 t = blockIdx.y;
    if (m >= p.hidden || t >= step->n_tokens) return;
    float acc = 0.0f;
    if (p.flags & COMBINE_ROUTED) {
        bool resident_only = (p.flags & COMBINE_RESIDENT) != 0u;
        for (u32 j = 0; j < p.top_k; j++) {
            u32 tj = t * p.top_k + j;
            if (!resident_only || slot_of[ids[tj]] < p.slots) acc += weights[tj] * y[tj * p.hidden + m];
        }
    }
    if (p.flags & COMBINE_SHARED) {
        float g = 1.0f;
        if (p.flags & COMBINE_SHARED_GATED) {
            // Fused routing leaves a one-token step's logits as partial rows (gate_splits).
            float l = router_logits[t * p.gate_stride + p.gate_col];
            if (p.gate_splits > 1u) {
                l = 0.0f;
                for (u32 s = 0; s < p.gate_splits; s++) l += router_logits[s * p.gate_stride + p.gate_col];
            }
            g = 1.0f / (1.0f + expf(-l));
        }
        acc += g * shared_y[t * p.hidden + m];
    }
    if (p.flags & COMBINE_HOST) acc += host_y[t * p.hidden + m];
    x[t * p.hidden + m] += acc;
}

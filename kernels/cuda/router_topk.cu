// Router (shaders/router_topk.wgsl): softmax over all experts in f32, top-k on the
// probabilities (ties to the lower index), optionally renormalised. One block of 64 per
// token; each pick is the best expert ranked after the previous pick, probabilities
// recomputed from the logits (the same f32 operations, so the same values).

struct RouterTopkParams { u32 n_experts; u32 top_k; u32 logits_stride; u32 norm_topk; u32 splits; u32 _a; u32 _b; u32 _c; };
CHECK_PARAMS(RouterTopkParams);

#define WG 64u
#define MAX_EXPERTS 1024u
#define NONE 0xffffffffu

extern "C" __global__ void router_topk(RouterTopkParams p, const Step* step,
                                       float* logits, u32* ids, float* weights) {
    __shared__ float red[64];
    __shared__ u32 redi[64];
    u32 lid = threadIdx.x;
    u32 t = blockIdx.x;
    if (t >= step->n_tokens) return;
    u32 lb = t * p.logits_stride;
    // One-token steps: add the router matvec's partial rows (its K splits) into row 0.
    if (step->n_tokens == 1u && p.splits > 1u) {
        for (u32 c = lid; c < p.logits_stride; c += WG) {
            float v = 0.0f;
            for (u32 s = 0; s < p.splits; s++) v += logits[s * p.logits_stride + c];
            logits[c] = v;
        }
        __syncthreads();
    }
    u32 n = min(p.n_experts, MAX_EXPERTS);
    float m = -3.4e38f;
    for (u32 e = lid; e < n; e += WG) m = fmaxf(m, logits[lb + e]);
    red[lid] = m;
    __syncthreads();
    for (u32 s = WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) red[lid] = fmaxf(red[lid], red[lid + s]);
        __syncthreads();
    }
    float mx = red[0];
    __syncthreads();
    float sum = 0.0f;
    for (u32 e0 = 0; e0 < n; e0 += WG) {
        u32 e = e0 + lid;
        float v = expf(logits[lb + min(e, n - 1u)] - mx);
        sum += e < n ? v : 0.0f;
    }
    red[lid] = sum;
    __syncthreads();
    for (u32 s = WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) red[lid] += red[lid + s];
        __syncthreads();
    }
    float total = red[0];
    __syncthreads();
    bool lead = lid == 0u;
    u32 ob = t * p.top_k;
    float picked_sum = 0.0f;
    float prev_v = 3.4e38f;
    u32 prev_e = NONE;
    for (u32 j = 0; j < p.top_k; j++) {
        u32 best = NONE;
        float best_v = -1.0f;
        for (u32 e0 = 0; e0 < n; e0 += WG) {
            u32 e = e0 + lid;
            float v = expf(logits[lb + min(e, n - 1u)] - mx);
            bool after_prev = v < prev_v || (v == prev_v && (prev_e == NONE || e > prev_e));
            if (e < n && after_prev && (best == NONE || v > best_v)) { best = e; best_v = v; }
        }
        red[lid] = best_v;
        redi[lid] = best;
        __syncthreads();
        for (u32 s = WG / 2u; s > 0u; s >>= 1) {
            if (lid < s) {
                float ov = red[lid + s];
                u32 oi = redi[lid + s];
                u32 ci = redi[lid];
                if (oi != NONE && (ci == NONE || ov > red[lid] || (ov == red[lid] && oi < ci))) {
                    red[lid] = ov;
                    redi[lid] = oi;
                }
            }
            __syncthreads();
        }
        float bv = red[0];
        u32 bi = redi[0];
        __syncthreads();
        float w = bv / total;
        if (lead) { ids[ob + j] = bi; weights[ob + j] = w; }
        picked_sum += w;
        prev_v = bv;
        prev_e = bi;
    }
    if (lead && p.norm_topk != 0u) {
        for (u32 j = 0; j < p.top_k; j++) weights[ob + j] = weights[ob + j] / picked_sum;
    }
}

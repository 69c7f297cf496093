// SwiGLU halves for GPUs over the routed experts of a pool, or one fixed slot (a dense MLP,
// Qwen's shared expert), in the pool's weight format (shaders/expert_gate_up.wgsl,
// expert_down.wgsl):
//   h[t, j, n] = silu(gate_e[n] . x_t) * (up_e[n] . x_t)      e the j-th expert of token t
//   y[t, j, m] = down_e[m] . h[t, j, :]                         (per (token, top-k index))
//   x[t, m] += sum_j w[t, j] * (down_e[m] . h[t, j, :])         (EXPERT_COMBINE: fused)
// A block of 64 serves ROWS rows (of gate and of up, or of down) of one token, thread l
// reading words l, l + 64, ... of their flat run (rows.cuh). Expert ids are read on the
// device and mapped to a pool slot by the slot table; one launch serves the slots of one
// chunk of the pool, and chunks are successive launches on one stream, so the fused
// read-modify-write of x never races. Grid (row groups, top-k indices from j_base (1 when
// fused), tokens).

struct ExpertGateUpParams { u32 hidden; u32 inter; u32 top_k; u32 j_base; u32 x_stride; u32 slot_words; u32 first_slot; u32 chunk_slots; u32 gate_w; u32 up_w; u32 gate_s; u32 up_s; u32 words_per_row; u32 blocks_per_row; u32 flags; u32 route_experts; u32 route_stride; u32 route_splits; u32 route_norm; u32 _a; };
struct ExpertDownParams { u32 hidden; u32 inter; u32 top_k; u32 j_base; u32 slot_words; u32 first_slot; u32 chunk_slots; u32 down_w; u32 down_s; u32 words_per_row; u32 blocks_per_row; u32 flags; };
CHECK_PARAMS(ExpertGateUpParams);
CHECK_PARAMS(ExpertDownParams);

// Fused routing (FFN_ROUTE; shaders/common/route_topk.wgsl): every block of a one-token
// gate/up launch computes the token's top-k from the router matvec's partial rows itself,
// with router_topk.cu's arithmetic (the same values); with FFN_ROUTE_WRITE thread 0 of
// block (0, 0) writes the ids and weights for the launches after it.
struct Route {
    const float* logits;
    float* weights;
    u32* ids;
};

__device__ __forceinline__ float route_logit(const ExpertGateUpParams& p, const float* l, u32 lb, u32 e) {
    if (p.route_splits <= 1u) return l[lb + e];
    float v = 0.0f;
    for (u32 s = 0; s < p.route_splits; s++) v += l[s * p.route_stride + e];
    return v;
}

#define ROUTE_NONE 0xffffffffu

// Every thread calls it, in block-uniform control flow (it holds barriers).
__device__ u32 route_expert(const ExpertGateUpParams& p, const Route& r, u32 t, u32 j, bool write) {
    __shared__ float red[ROWS_BLOCK];
    __shared__ u32 redi[ROWS_BLOCK];
    u32 lid = threadIdx.x;
    u32 n = p.route_experts > 0u ? p.route_experts : 1u;
    u32 lb = t * p.route_stride;
    float m = -3.4e38f;
    for (u32 e = lid; e < n; e += ROWS_BLOCK) m = fmaxf(m, route_logit(p, r.logits, lb, e));
    red[lid] = m;
    __syncthreads();
    for (u32 s = ROWS_BLOCK / 2u; s > 0u; s >>= 1) {
        if (lid < s) red[lid] = fmaxf(red[lid], red[lid + s]);
        __syncthreads();
    }
    float mx = red[0];
    __syncthreads();
    float sum = 0.0f;
    for (u32 e0 = 0; e0 < n; e0 += ROWS_BLOCK) {
        u32 e = e0 + lid;
        float v = expf(route_logit(p, r.logits, lb, min(e, n - 1u)) - mx);
        sum += e < n ? v : 0.0f;
    }
    red[lid] = sum;
    __syncthreads();
    for (u32 s = ROWS_BLOCK / 2u; s > 0u; s >>= 1) {
        if (lid < s) red[lid] += red[lid + s];
        __syncthreads();
    }
    float total = red[0];
    __syncthreads();
    bool lead = write && lid == 0u;
    u32 ob = t * p.top_k;
    float picked_sum = 0.0f;
    float prev_v = 3.4e38f;
    u32 prev_e = ROUTE_NONE;
    u32 mine = 0u;
    for (u32 jj = 0; jj < p.top_k; jj++) {
        u32 best = ROUTE_NONE;
        float best_v = -1.0f;
        for (u32 e0 = 0; e0 < n; e0 += ROWS_BLOCK) {
            u32 e = e0 + lid;
            float v = expf(route_logit(p, r.logits, lb, min(e, n - 1u)) - mx);
            bool after_prev = v < prev_v || (v == prev_v && (prev_e == ROUTE_NONE || e > prev_e));
            if (e < n && after_prev && (best == ROUTE_NONE || v > best_v)) { best = e; best_v = v; }
        }
        red[lid] = best_v;
        redi[lid] = best;
        __syncthreads();
        for (u32 s = ROWS_BLOCK / 2u; s > 0u; s >>= 1) {
            if (lid < s) {
                float ov = red[lid + s];
                u32 oi = redi[lid + s];
                u32 ci = redi[lid];
                if (oi != ROUTE_NONE && (ci == ROUTE_NONE || ov > red[lid] || (ov == red[lid] && oi < ci))) {
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
        if (lead) { r.ids[ob + jj] = bi; r.weights[ob + jj] = w; }
        if (jj == j) mine = bi == ROUTE_NONE ? 0u : bi;
        picked_sum += w;
        prev_v = bv;
        prev_e = bi;
    }
    if (lead && p.route_norm != 0u) {
        for (u32 jj = 0; jj < p.top_k; jj++) r.weights[ob + jj] = r.weights[ob + jj] / picked_sum;
    }
    return mine;
}

template <class Fmt, class Sum>
__device__ void gate_up(const ExpertGateUpParams& p, const Step* step, const Act& a,
                        const u32* ids, const u32* slot_of, float* h_out, const Route& r,
                        const Mat& m) {
    u32 li = threadIdx.x;
    u32 n0 = blockIdx.x * ROWS;
    u32 j = blockIdx.y + p.j_base;
    u32 t = blockIdx.z;
    if (t >= step->n_tokens || n0 >= p.inter) return;
    u32 slot = 0u;
    if (p.flags & FFN_ROUTE) {
        bool write = (p.flags & FFN_ROUTE_WRITE) && blockIdx.x == 0u && blockIdx.y == 0u;
        slot = slot_of[route_expert(p, r, t, j, write)];
    } else if (!(p.flags & FFN_FIXED_SLOT)) {
        slot = slot_of[ids[t * p.top_k + j]];
    }
    // The same slot for every thread: the reduction's barriers stay uniform.
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) return;
    u32 sw = (slot - p.first_slot) * p.slot_words;
    u32 nr = min(ROWS, p.inter - n0);
    u32 wpr = p.words_per_row;
    u32 xb = t * p.x_stride;
    float4 g = zero4(), u = zero4();
    for (u32 f = li; f < nr * wpr; f += ROWS_BLOCK) {
        u32 r = f / wpr;
        u32 c = f % wpr;
        u32 n = n0 + r;
        float4 mask = onehot4(r);
        // Each word's activations serve the gate and the up row.
        g = madd4(g, mask, Fmt::word_dot(m, sw + p.gate_w + n * wpr, c,
                                         (sw * 4u + p.gate_s) * 2u + n * p.blocks_per_row, a, xb, p.hidden));
        u = madd4(u, mask, Fmt::word_dot(m, sw + p.up_w + n * wpr, c,
                                         (sw * 4u + p.up_s) * 2u + n * p.blocks_per_row, a, xb, p.hidden));
    }
    float4 gs = Sum::sum4(g);
    float4 us = Sum::sum4(u);
    if (li == 0u) {
        for (u32 i = 0; i < nr; i++) {
            float gi = comp4(gs, i);
            // silu(g) = g * sigmoid(g)
            h_out[(t * p.top_k + j) * p.inter + n0 + i] = gi / (1.0f + expf(-gi)) * comp4(us, i);
        }
    }
}

template <class Fmt, class Sum>
__device__ void down(const ExpertDownParams& p, const Step* step, const Act& a, const u32* ids,
                     const u32* slot_of, const float* weights, float* out, const Mat& m) {
    u32 li = threadIdx.x;
    u32 m0 = blockIdx.x * ROWS;
    u32 t = blockIdx.z;
    if (t >= step->n_tokens || m0 >= p.hidden) return;
    bool combine = (p.flags & EXPERT_COMBINE) != 0u;
    u32 j0 = blockIdx.y + p.j_base;
    u32 j1 = j0 + 1u;
    if (combine) {
        j0 = 0u;
        j1 = p.top_k;
    }
    u32 nr = min(ROWS, p.hidden - m0);
    u32 wpr = p.words_per_row;
    float4 acc = zero4();
    bool hit = false;
    for (u32 j = j0; j < j1; j++) {
        u32 tj = t * p.top_k + j;
        u32 slot = 0u;
        if (!(p.flags & FFN_FIXED_SLOT)) slot = slot_of[ids[tj]];
        if (slot >= p.first_slot && slot < p.first_slot + p.chunk_slots) {
            // The weight scales each thread's partial sums before the one reduction (the
            // sum is linear), so the combine needs no launch of its own.
            float wj = combine ? weights[tj] : 1.0f;
            u32 sw = (slot - p.first_slot) * p.slot_words;
            u32 hb = tj * p.inter;
            for (u32 f = li; f < nr * wpr; f += ROWS_BLOCK) {
                u32 r = f / wpr;
                u32 mm = m0 + r;
                float d = Fmt::word_dot(m, sw + p.down_w + mm * wpr, f % wpr,
                                        (sw * 4u + p.down_s) * 2u + mm * p.blocks_per_row, a, hb, p.inter);
                acc = madd4(acc, onehot4(r), wj * d);
            }
            hit = true;
        }
    }
    // `hit` is the same for every thread (it depends on the token's slots only).
    if (!hit) return;
    float4 s = Sum::sum4(acc);
    if (li == 0u) {
        for (u32 i = 0; i < nr; i++) {
            if (combine) {
                out[t * p.hidden + m0 + i] += comp4(s, i);
            } else {
                out[(t * p.top_k + j0) * p.hidden + m0 + i] = comp4(s, i);
            }
        }
    }
}

// The entry points: one per variant (RowsVariant { format, reduce }). Bindings: x (2), x as
// float4 (3), ids (4), slot_of (5), then h (6) and the route's logits (8), weights (9) and
// ids (12) for gate/up, or weights (6) and out (7) for down, then the weights (10) and,
// INT4 and Q8_0, their scales (11).
extern "C" __global__ void expert_gate_up_f16_sg(ExpertGateUpParams p, const Step* step,
                                                 const float* x, const float4* x4, const u32* ids,
                                                 const u32* slot_of, float* h, const float* rl, float* rw, u32* ri,
                                                 const uint4* w) {
    gate_up<FmtF16, SubgroupSum>(p, step, Act{x, x4}, ids, slot_of, h, Route{rl, rw, ri}, Mat{w, nullptr});
}
extern "C" __global__ void expert_gate_up_f16_wg(ExpertGateUpParams p, const Step* step,
                                                 const float* x, const float4* x4, const u32* ids,
                                                 const u32* slot_of, float* h, const float* rl, float* rw, u32* ri,
                                                 const uint4* w) {
    gate_up<FmtF16, WorkgroupSum>(p, step, Act{x, x4}, ids, slot_of, h, Route{rl, rw, ri}, Mat{w, nullptr});
}
extern "C" __global__ void expert_gate_up_q4_sg(ExpertGateUpParams p, const Step* step,
                                                const float* x, const float4* x4, const u32* ids,
                                                const u32* slot_of, float* h, const float* rl, float* rw, u32* ri,
                                                 const uint4* w,
                                                const u32* ws) {
    gate_up<FmtQ4, SubgroupSum>(p, step, Act{x, x4}, ids, slot_of, h, Route{rl, rw, ri}, Mat{w, ws});
}
extern "C" __global__ void expert_gate_up_q4_wg(ExpertGateUpParams p, const Step* step,
                                                const float* x, const float4* x4, const u32* ids,
                                                const u32* slot_of, float* h, const float* rl, float* rw, u32* ri,
                                                 const uint4* w,
                                                const u32* ws) {
    gate_up<FmtQ4, WorkgroupSum>(p, step, Act{x, x4}, ids, slot_of, h, Route{rl, rw, ri}, Mat{w, ws});
}
extern "C" __global__ void expert_gate_up_q8_sg(ExpertGateUpParams p, const Step* step,
                                                const float* x, const float4* x4, const u32* ids,
                                                const u32* slot_of, float* h, const float* rl, float* rw, u32* ri,
                                                 const uint4* w,
                                                const u32* ws) {
    gate_up<FmtQ8, SubgroupSum>(p, step, Act{x, x4}, ids, slot_of, h, Route{rl, rw, ri}, Mat{w, ws});
}
extern "C" __global__ void expert_gate_up_q8_wg(ExpertGateUpParams p, const Step* step,
                                                const float* x, const float4* x4, const u32* ids,
                                                const u32* slot_of, float* h, const float* rl, float* rw, u32* ri,
                                                 const uint4* w,
                                                const u32* ws) {
    gate_up<FmtQ8, WorkgroupSum>(p, step, Act{x, x4}, ids, slot_of, h, Route{rl, rw, ri}, Mat{w, ws});
}
extern "C" __global__ void expert_down_f16_sg(ExpertDownParams p, const Step* step, const float* h,
                                              const float4* h4, const u32* ids, const u32* slot_of,
                                              const float* weights, float* out, const uint4* w) {
    down<FmtF16, SubgroupSum>(p, step, Act{h, h4}, ids, slot_of, weights, out, Mat{w, nullptr});
}
extern "C" __global__ void expert_down_f16_wg(ExpertDownParams p, const Step* step, const float* h,
                                              const float4* h4, const u32* ids, const u32* slot_of,
                                              const float* weights, float* out, const uint4* w) {
    down<FmtF16, WorkgroupSum>(p, step, Act{h, h4}, ids, slot_of, weights, out, Mat{w, nullptr});
}
extern "C" __global__ void expert_down_q4_sg(ExpertDownParams p, const Step* step, const float* h,
                                             const float4* h4, const u32* ids, const u32* slot_of,
                                             const float* weights, float* out, const uint4* w,
                                             const u32* ws) {
    down<FmtQ4, SubgroupSum>(p, step, Act{h, h4}, ids, slot_of, weights, out, Mat{w, ws});
}
extern "C" __global__ void expert_down_q4_wg(ExpertDownParams p, const Step* step, const float* h,
                                             const float4* h4, const u32* ids, const u32* slot_of,
                                             const float* weights, float* out, const uint4* w,
                                             const u32* ws) {
    down<FmtQ4, WorkgroupSum>(p, step, Act{h, h4}, ids, slot_of, weights, out, Mat{w, ws});
}
extern "C" __global__ void expert_down_q8_sg(ExpertDownParams p, const Step* step, const float* h,
                                             const float4* h4, const u32* ids, const u32* slot_of,
                                             const float* weights, float* out, const uint4* w,
                                             const u32* ws) {
    down<FmtQ8, SubgroupSum>(p, step, Act{h, h4}, ids, slot_of, weights, out, Mat{w, ws});
}
extern "C" __global__ void expert_down_q8_wg(ExpertDownParams p, const Step* step, const float* h,
                                             const float4* h4, const u32* ids, const u32* slot_of,
                                             const float* weights, float* out, const uint4* w,
                                             const u32* ws) {
    down<FmtQ8, WorkgroupSum>(p, step, Act{h, h4}, ids, slot_of, weights, out, Mat{w, ws});
}
extern "C" __global__ void expert_gate_up_q4a_sg(ExpertGateUpParams p, const Step* step,
                                                 const float* x, const float4* x4, const u32* ids,
                                                 const u32* slot_of, float* h, const float* rl, float* rw, u32* ri,
                                                 const uint4* w,
                                                 const u32* ws) {
    gate_up<FmtQ4A, SubgroupSum>(p, step, Act{x, x4}, ids, slot_of, h, Route{rl, rw, ri}, Mat{w, ws});
}
extern "C" __global__ void expert_gate_up_q4a_wg(ExpertGateUpParams p, const Step* step,
                                                 const float* x, const float4* x4, const u32* ids,
                                                 const u32* slot_of, float* h, const float* rl, float* rw, u32* ri,
                                                 const uint4* w,
                                                 const u32* ws) {
    gate_up<FmtQ4A, WorkgroupSum>(p, step, Act{x, x4}, ids, slot_of, h, Route{rl, rw, ri}, Mat{w, ws});
}
extern "C" __global__ void expert_down_q4a_sg(ExpertDownParams p, const Step* step, const float* h,
                                              const float4* h4, const u32* ids, const u32* slot_of,
                                              const float* weights, float* out, const uint4* w,
                                              const u32* ws) {
    down<FmtQ4A, SubgroupSum>(p, step, Act{h, h4}, ids, slot_of, weights, out, Mat{w, ws});
}
extern "C" __global__ void expert_down_q4a_wg(ExpertDownParams p, const Step* step, const float* h,
                                              const float4* h4, const u32* ids, const u32* slot_of,
                                              const float* weights, float* out, const uint4* w,
                                              const u32* ws) {
    down<FmtQ4A, WorkgroupSum>(p, step, Act{h, h4}, ids, slot_of, weights, out, Mat{w, ws});
}
// The K-plane formats (GGUF's Q4_K, Q5_K, Q6_K, Q5_0/Q5_1 blocks as they are).
extern "C" __global__ void expert_gate_up_q4k_sg(ExpertGateUpParams p, const Step* step,
                                                 const float* x, const float4* x4, const u32* ids,
                                                 const u32* slot_of, float* h, const float* rl, float* rw, u32* ri,
                                                 const uint4* w,
                                                 const u32* ws) {
    gate_up<FmtQ4K, SubgroupSum>(p, step, Act{x, x4}, ids, slot_of, h, Route{rl, rw, ri}, Mat{w, ws});
}
extern "C" __global__ void expert_down_q4k_sg(ExpertDownParams p, const Step* step, const float* h,
                                              const float4* h4, const u32* ids, const u32* slot_of,
                                              const float* weights, float* out, const uint4* w,
                                              const u32* ws) {
    down<FmtQ4K, SubgroupSum>(p, step, Act{h, h4}, ids, slot_of, weights, out, Mat{w, ws});
}
extern "C" __global__ void expert_gate_up_q4k_wg(ExpertGateUpParams p, const Step* step,
                                                 const float* x, const float4* x4, const u32* ids,
                                                 const u32* slot_of, float* h, const float* rl, float* rw, u32* ri,
                                                 const uint4* w,
                                                 const u32* ws) {
    gate_up<FmtQ4K, WorkgroupSum>(p, step, Act{x, x4}, ids, slot_of, h, Route{rl, rw, ri}, Mat{w, ws});
}
extern "C" __global__ void expert_down_q4k_wg(ExpertDownParams p, const Step* step, const float* h,
                                              const float4* h4, const u32* ids, const u32* slot_of,
                                              const float* weights, float* out, const uint4* w,
                                              const u32* ws) {
    down<FmtQ4K, WorkgroupSum>(p, step, Act{h, h4}, ids, slot_of, weights, out, Mat{w, ws});
}
extern "C" __global__ void expert_gate_up_q5k_sg(ExpertGateUpParams p, const Step* step,
                                                 const float* x, const float4* x4, const u32* ids,
                                                 const u32* slot_of, float* h, const float* rl, float* rw, u32* ri,
                                                 const uint4* w,
                                                 const u32* ws) {
    gate_up<FmtQ5K, SubgroupSum>(p, step, Act{x, x4}, ids, slot_of, h, Route{rl, rw, ri}, Mat{w, ws});
}
extern "C" __global__ void expert_down_q5k_sg(ExpertDownParams p, const Step* step, const float* h,
                                              const float4* h4, const u32* ids, const u32* slot_of,
                                              const float* weights, float* out, const uint4* w,
                                              const u32* ws) {
    down<FmtQ5K, SubgroupSum>(p, step, Act{h, h4}, ids, slot_of, weights, out, Mat{w, ws});
}
extern "C" __global__ void expert_gate_up_q5k_wg(ExpertGateUpParams p, const Step* step,
                                                 const float* x, const float4* x4, const u32* ids,
                                                 const u32* slot_of, float* h, const float* rl, float* rw, u32* ri,
                                                 const uint4* w,
                                                 const u32* ws) {
    gate_up<FmtQ5K, WorkgroupSum>(p, step, Act{x, x4}, ids, slot_of, h, Route{rl, rw, ri}, Mat{w, ws});
}
extern "C" __global__ void expert_down_q5k_wg(ExpertDownParams p, const Step* step, const float* h,
                                              const float4* h4, const u32* ids, const u32* slot_of,
                                              const float* weights, float* out, const uint4* w,
                                              const u32* ws) {
    down<FmtQ5K, WorkgroupSum>(p, step, Act{h, h4}, ids, slot_of, weights, out, Mat{w, ws});
}
extern "C" __global__ void expert_gate_up_q6k_sg(ExpertGateUpParams p, const Step* step,
                                                 const float* x, const float4* x4, const u32* ids,
                                                 const u32* slot_of, float* h, const float* rl, float* rw, u32* ri,
                                                 const uint4* w,
                                                 const u32* ws) {
    gate_up<FmtQ6K, SubgroupSum>(p, step, Act{x, x4}, ids, slot_of, h, Route{rl, rw, ri}, Mat{w, ws});
}
extern "C" __global__ void expert_down_q6k_sg(ExpertDownParams p, const Step* step, const float* h,
                                              const float4* h4, const u32* ids, const u32* slot_of,
                                              const float* weights, float* out, const uint4* w,
                                              const u32* ws) {
    down<FmtQ6K, SubgroupSum>(p, step, Act{h, h4}, ids, slot_of, weights, out, Mat{w, ws});
}
extern "C" __global__ void expert_gate_up_q6k_wg(ExpertGateUpParams p, const Step* step,
                                                 const float* x, const float4* x4, const u32* ids,
                                                 const u32* slot_of, float* h, const float* rl, float* rw, u32* ri,
                                                 const uint4* w,
                                                 const u32* ws) {
    gate_up<FmtQ6K, WorkgroupSum>(p, step, Act{x, x4}, ids, slot_of, h, Route{rl, rw, ri}, Mat{w, ws});
}
extern "C" __global__ void expert_down_q6k_wg(ExpertDownParams p, const Step* step, const float* h,
                                              const float4* h4, const u32* ids, const u32* slot_of,
                                              const float* weights, float* out, const uint4* w,
                                              const u32* ws) {
    down<FmtQ6K, WorkgroupSum>(p, step, Act{h, h4}, ids, slot_of, weights, out, Mat{w, ws});
}
extern "C" __global__ void expert_gate_up_q5a_sg(ExpertGateUpParams p, const Step* step,
                                                 const float* x, const float4* x4, const u32* ids,
                                                 const u32* slot_of, float* h, const float* rl, float* rw, u32* ri,
                                                 const uint4* w,
                                                 const u32* ws) {
    gate_up<FmtQ5A, SubgroupSum>(p, step, Act{x, x4}, ids, slot_of, h, Route{rl, rw, ri}, Mat{w, ws});
}
extern "C" __global__ void expert_down_q5a_sg(ExpertDownParams p, const Step* step, const float* h,
                                              const float4* h4, const u32* ids, const u32* slot_of,
                                              const float* weights, float* out, const uint4* w,
                                              const u32* ws) {
    down<FmtQ5A, SubgroupSum>(p, step, Act{h, h4}, ids, slot_of, weights, out, Mat{w, ws});
}
extern "C" __global__ void expert_gate_up_q5a_wg(ExpertGateUpParams p, const Step* step,
                                                 const float* x, const float4* x4, const u32* ids,
                                                 const u32* slot_of, float* h, const float* rl, float* rw, u32* ri,
                                                 const uint4* w,
                                                 const u32* ws) {
    gate_up<FmtQ5A, WorkgroupSum>(p, step, Act{x, x4}, ids, slot_of, h, Route{rl, rw, ri}, Mat{w, ws});
}
extern "C" __global__ void expert_down_q5a_wg(ExpertDownParams p, const Step* step, const float* h,
                                              const float4* h4, const u32* ids, const u32* slot_of,
                                              const float* weights, float* out, const uint4* w,
                                              const u32* ws) {
    down<FmtQ5A, WorkgroupSum>(p, step, Act{h, h4}, ids, slot_of, weights, out, Mat{w, ws});
}

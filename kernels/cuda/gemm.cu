// Tiled matrix-matrix products for GPUs (prefill steps; shaders/gemm.wgsl and
// expert_gemm.wgsl). Both stage, per step of KC columns, an activation tile and the
// (dequantised, by the format's stage_word) weight tile in shared memory, neighbouring
// threads loading neighbouring 16-byte words of a row, then each thread accumulates one row
// for several tokens from shared memory, so each weight byte is read once per TM tokens.
// Weight tile rows are padded by one float (WP): a warp reads its rows at one column, which
// a stride of 65 spreads over the memory banks. The format's block scales of the block's
// rows are staged in shared memory once (stage_scales) before the first step.
//
// gemm: out[t, row_base + n] (+)= W[n] . x[t] (+ bias[row_base + n]); a block serves
// TM tokens x GEMM_TN rows, thread l row l % 32 for tokens 8 (l / 32) .. + 8. Grid (row
// tiles, token tiles, 1).
//
// expert_gemm, over the step's (token, top-k index) pairs sorted by expert (moe_sort.cu):
//   gate/up (EXPERT_GEMM_DOWN off): h[t, j, n] = silu(gate_e[n] . x_t) * (up_e[n] . x_t)
//   down    (EXPERT_GEMM_DOWN):     y[t, j, m] = down_e[m] . h[t, j, :]
// for the pairs (t, j) routed to expert e, read and written at their (t, j) rows (nothing is
// gathered). A block serves TM pairs of one expert's run and EXPERT_GEMM_TN of its rows,
// thread l row l % 16 for pairs 4 (l / 16) .. + 4. Experts whose slot is not in this chunk
// of the pool are left to another launch. With FFN_FIXED_SLOT (a dense MLP, Qwen's shared
// expert) slot 0 serves every token, top_k is 1 and the pairs are the tokens. Grid (row
// tiles, experts (1 fixed), pair tiles of a run).

struct ExpertGemmParams { u32 in_dim; u32 out_dim; u32 top_k; u32 pmax; u32 n_experts; u32 slot_words; u32 first_slot; u32 chunk_slots; u32 a_w; u32 b_w; u32 a_s; u32 b_s; u32 words_per_row; u32 blocks_per_row; u32 flags; u32 _a; };
CHECK_PARAMS(ExpertGemmParams);

#define TM 16u
#define KC 64u
#define WP 65u
#define GEMM_TN 32u
#define EXPERT_GEMM_TN 16u

// One token's result of gemm (WGSL store_out): bias, then the residual when accumulating.
__device__ __forceinline__ void store_out(const DenseParams& p, u32 n_tokens, const float* bias,
                                          float* out, u32 t, u32 row, float v) {
    if (t >= n_tokens) return;
    float r = v;
    if (p.flags & MATMUL_BIAS) r += bias[row];
    u32 o = t * p.out_stride + row;
    if (p.flags & MATMUL_ACCUMULATE) r += out[o];
    out[o] = r;
}

template <class Fmt>
__device__ void gemm(const DenseParams& p, const Step* step, const Act& a, const float* bias,
                     float* out, const Mat& m) {
    __shared__ float xt[TM * KC];
    __shared__ float wt[GEMM_TN * WP];
    __shared__ u32 sc_s[Fmt::SCALE_WORDS];
    u32 li = threadIdx.x;
    u32 n_tokens = step->n_tokens;
    u32 n0 = blockIdx.x * GEMM_TN;
    u32 t0 = blockIdx.y * TM;
    // The same for every thread of the block: the barriers stay uniform.
    if (n0 >= p.n_rows || t0 >= n_tokens) return;
    u32 nr = min(GEMM_TN, p.n_rows - n0);
    u32 nb = p.blocks_per_row;
    Scales sc{sc_s, {0u, 0u}, {0u, 0u}};
    u32 s0 = p.s_word0 * 2u + (p.w_row0 + n0) * nb;
    Fmt::stage_scales(m, sc, 0u, s0, s0 + nr * nb);
    u32 wpc = KC / Fmt::WORD_COLS;
    u32 r = li % GEMM_TN;
    u32 g = li / GEMM_TN;
    float acc[8];
    for (int i = 0; i < 8; i++) acc[i] = 0.0f;
    for (u32 k0 = 0; k0 < p.k; k0 += KC) {
        // The scales staged above, and the last step's tiles read, before they change.
        __syncthreads();
        for (u32 e = li; e < TM * KC / 4u; e += ROWS_BLOCK) {
            u32 tt = e / (KC / 4u);
            u32 col = k0 + (e % (KC / 4u)) * 4u;
            float4 v = zero4();
            if (t0 + tt < n_tokens) v = x_quad(a, (t0 + tt) * p.x_stride, col, p.k);
            u32 d = tt * KC + (e % (KC / 4u)) * 4u;
            xt[d] = v.x;
            xt[d + 1u] = v.y;
            xt[d + 2u] = v.z;
            xt[d + 3u] = v.w;
        }
        for (u32 e = li; e < GEMM_TN * wpc; e += ROWS_BLOCK) {
            u32 rr = e / wpc;
            u32 c = k0 / Fmt::WORD_COLS + e % wpc;
            u32 n = p.w_row0 + n0 + rr;
            Fmt::stage_word(m, sc, 0u, n * p.words_per_row, c, p.s_word0 * 2u + n * nb, wt,
                            rr * WP + (e % wpc) * Fmt::WORD_COLS, rr < nr && c < p.words_per_row);
        }
        __syncthreads();
        for (u32 kk = 0; kk < KC; kk++) {
            float w = wt[r * WP + kk];
            u32 b = g * 8u * KC + kk;
#pragma unroll
            for (u32 i = 0; i < 8u; i++) acc[i] += xt[b + i * KC] * w;
        }
    }
    if (r >= nr) return;
    u32 row = p.row_base + n0 + r;
    u32 tb = t0 + g * 8u;
    for (u32 i = 0; i < 8u; i++) store_out(p, n_tokens, bias, out, tb + i, row, acc[i]);
}

// Sorted pair `i`: its (token, top-k index) row t * top_k + j, or, fixed, the token.
__device__ __forceinline__ u32 pair_at(const u32* pairs, u32 i, bool fixed) {
    return fixed ? i : pairs[i];
}

template <class Fmt>
__device__ void expert_gemm(const ExpertGemmParams& p, const Step* step, const Act& a,
                            const u32* pairs, const u32* slot_of, float* out, const Mat& m) {
    __shared__ float xt[TM * KC];
    // Two weight tiles of EXPERT_GEMM_TN rows: gate and up (down uses the first).
    __shared__ float wt[2u * EXPERT_GEMM_TN * WP];
    __shared__ u32 sc_s[Fmt::SCALE_WORDS];
    u32 li = threadIdx.x;
    bool down = (p.flags & EXPERT_GEMM_DOWN) != 0u;
    bool fixed = (p.flags & FFN_FIXED_SLOT) != 0u;
    u32 e = blockIdx.y;
    u32 n_tokens = step->n_tokens;
    // Every early return below depends on the block only: the barriers stay uniform.
    if (e >= p.n_experts || n_tokens == 0u) return;
    // Expert e's sorted pairs [s, q): moe_sort left each count slot at its run's end.
    u32 q = n_tokens;
    u32 s = 0u;
    u32 slot = 0u;
    if (!fixed) {
        u32 cnt = 2u * p.pmax;
        q = pairs[cnt + e];
        if (e > 0u) s = pairs[cnt + e - 1u];
        slot = slot_of[e];
    }
    u32 p0 = s + blockIdx.z * TM;
    u32 n0 = blockIdx.x * EXPERT_GEMM_TN;
    if (p0 >= q || n0 >= p.out_dim) return;
    u32 np = min(TM, q - p0);
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) return;
    u32 sw = (slot - p.first_slot) * p.slot_words;
    u32 nr = min(EXPERT_GEMM_TN, p.out_dim - n0);
    u32 nb = p.blocks_per_row;
    u32 as0 = (sw * 4u + p.a_s) * 2u;
    u32 bs0 = (sw * 4u + p.b_s) * 2u;
    Scales sc{sc_s, {0u, 0u}, {0u, 0u}};
    Fmt::stage_scales(m, sc, 0u, as0 + n0 * nb, as0 + (n0 + nr) * nb);
    if (!down) Fmt::stage_scales(m, sc, 1u, bs0 + n0 * nb, bs0 + (n0 + nr) * nb);
    u32 wpc = KC / Fmt::WORD_COLS;
    u32 wpr = p.words_per_row;
    u32 r = li % EXPERT_GEMM_TN;
    u32 g = li / EXPERT_GEMM_TN;
    float4 ga = zero4(), ua = zero4();
    for (u32 k0 = 0; k0 < p.in_dim; k0 += KC) {
        __syncthreads();
        for (u32 i = li; i < TM * KC / 4u; i += ROWS_BLOCK) {
            u32 pp = i / (KC / 4u);
            u32 col = k0 + (i % (KC / 4u)) * 4u;
            float4 v = zero4();
            if (pp < np) {
                u32 pair = pair_at(pairs, p0 + pp, fixed);
                // gate/up read the pair's token row, down the pair's own intermediate row.
                u32 base = down ? pair * p.in_dim : (pair / p.top_k) * p.in_dim;
                v = x_quad(a, base, col, p.in_dim);
            }
            u32 d = pp * KC + (i % (KC / 4u)) * 4u;
            xt[d] = v.x;
            xt[d + 1u] = v.y;
            xt[d + 2u] = v.z;
            xt[d + 3u] = v.w;
        }
        u32 mats = down ? 1u : 2u;
        for (u32 i = li; i < mats * EXPERT_GEMM_TN * wpc; i += ROWS_BLOCK) {
            u32 mi = i / (EXPERT_GEMM_TN * wpc);
            u32 rr = (i / wpc) % EXPERT_GEMM_TN;
            u32 c = k0 / Fmt::WORD_COLS + i % wpc;
            u32 n = n0 + rr;
            u32 w0 = mi == 1u ? p.b_w : p.a_w;
            u32 s0 = mi == 1u ? bs0 : as0;
            Fmt::stage_word(m, sc, mi, sw + w0 + n * wpr, c, s0 + n * nb, wt,
                            mi * EXPERT_GEMM_TN * WP + rr * WP + (i % wpc) * Fmt::WORD_COLS,
                            rr < nr && c < wpr);
        }
        __syncthreads();
        for (u32 kk = 0; kk < KC; kk++) {
            u32 b = g * 4u * KC + kk;
            float4 x = make_float4(xt[b], xt[b + KC], xt[b + 2u * KC], xt[b + 3u * KC]);
            ga = madd4(ga, x, wt[r * WP + kk]);
            if (!down) ua = madd4(ua, x, wt[EXPERT_GEMM_TN * WP + r * WP + kk]);
        }
    }
    if (r >= nr) return;
    for (u32 i = 0; i < 4u; i++) {
        u32 pp = g * 4u + i;
        if (pp >= np) continue;
        float v = comp4(ga, i);
        // silu(g) = g * sigmoid(g)
        if (!down) v = v / (1.0f + expf(-v)) * comp4(ua, i);
        out[pair_at(pairs, p0 + pp, fixed) * p.out_dim + n0 + r] = v;
    }
}

// The entry points: one per weight format the plan can pick. Bindings: gemm x (2), x as
// float4 (3), bias (4), out (5), the weights (10); expert_gemm x or h (2, 3), pairs (4),
// slot_of (5), out (6), the pool chunk (10 and, INT4 and Q8_0, its scales 11); Q8_0's
// gemm its scales (11) too.
extern "C" __global__ void gemm_f16(DenseParams p, const Step* step, const float* x,
                                    const float4* x4, const float* bias, float* out,
                                    const uint4* w) {
    gemm<FmtF16>(p, step, Act{x, x4}, bias, out, Mat{w, nullptr});
}
extern "C" __global__ void gemm_q8(DenseParams p, const Step* step, const float* x,
                                   const float4* x4, const float* bias, float* out,
                                   const uint4* w, const u32* ws) {
    gemm<FmtQ8>(p, step, Act{x, x4}, bias, out, Mat{w, ws});
}
extern "C" __global__ void expert_gemm_f16(ExpertGemmParams p, const Step* step, const float* x,
                                           const float4* x4, const u32* pairs, const u32* slot_of,
                                           float* out, const uint4* w) {
    expert_gemm<FmtF16>(p, step, Act{x, x4}, pairs, slot_of, out, Mat{w, nullptr});
}
extern "C" __global__ void expert_gemm_q4(ExpertGemmParams p, const Step* step, const float* x,
                                          const float4* x4, const u32* pairs, const u32* slot_of,
                                          float* out, const uint4* w, const u32* ws) {
    expert_gemm<FmtQ4>(p, step, Act{x, x4}, pairs, slot_of, out, Mat{w, ws});
}
extern "C" __global__ void expert_gemm_q8(ExpertGemmParams p, const Step* step, const float* x,
                                          const float4* x4, const u32* pairs, const u32* slot_of,
                                          float* out, const uint4* w, const u32* ws) {
    expert_gemm<FmtQ8>(p, step, Act{x, x4}, pairs, slot_of, out, Mat{w, ws});
}
extern "C" __global__ void expert_gemm_q4a(ExpertGemmParams p, const Step* step, const float* x,
                                           const float4* x4, const u32* pairs, const u32* slot_of,
                                           float* out, const uint4* w, const u32* ws) {
    expert_gemm<FmtQ4A>(p, step, Act{x, x4}, pairs, slot_of, out, Mat{w, ws});
}
extern "C" __global__ void gemm_q4a(DenseParams p, const Step* step, const float* x,
                                    const float4* x4, const float* bias, float* out,
                                    const uint4* w, const u32* ws) {
    gemm<FmtQ4A>(p, step, Act{x, x4}, bias, out, Mat{w, ws});
}
// The K-plane formats (GGUF's Q4_K, Q5_K, Q6_K, Q5_0/Q5_1 blocks as they are).
extern "C" __global__ void gemm_q4k(DenseParams p, const Step* step, const float* x,
                                    const float4* x4, const float* bias, float* out,
                                    const uint4* w, const u32* ws) {
    gemm<FmtQ4K>(p, step, Act{x, x4}, bias, out, Mat{w, ws});
}
extern "C" __global__ void expert_gemm_q4k(ExpertGemmParams p, const Step* step, const float* x,
                                           const float4* x4, const u32* pairs, const u32* slot_of,
                                           float* out, const uint4* w, const u32* ws) {
    expert_gemm<FmtQ4K>(p, step, Act{x, x4}, pairs, slot_of, out, Mat{w, ws});
}
extern "C" __global__ void gemm_q5k(DenseParams p, const Step* step, const float* x,
                                    const float4* x4, const float* bias, float* out,
                                    const uint4* w, const u32* ws) {
    gemm<FmtQ5K>(p, step, Act{x, x4}, bias, out, Mat{w, ws});
}
extern "C" __global__ void expert_gemm_q5k(ExpertGemmParams p, const Step* step, const float* x,
                                           const float4* x4, const u32* pairs, const u32* slot_of,
                                           float* out, const uint4* w, const u32* ws) {
    expert_gemm<FmtQ5K>(p, step, Act{x, x4}, pairs, slot_of, out, Mat{w, ws});
}
extern "C" __global__ void gemm_q6k(DenseParams p, const Step* step, const float* x,
                                    const float4* x4, const float* bias, float* out,
                                    const uint4* w, const u32* ws) {
    gemm<FmtQ6K>(p, step, Act{x, x4}, bias, out, Mat{w, ws});
}
extern "C" __global__ void expert_gemm_q6k(ExpertGemmParams p, const Step* step, const float* x,
                                           const float4* x4, const u32* pairs, const u32* slot_of,
                                           float* out, const uint4* w, const u32* ws) {
    expert_gemm<FmtQ6K>(p, step, Act{x, x4}, pairs, slot_of, out, Mat{w, ws});
}
extern "C" __global__ void gemm_q5a(DenseParams p, const Step* step, const float* x,
                                    const float4* x4, const float* bias, float* out,
                                    const uint4* w, const u32* ws) {
    gemm<FmtQ5A>(p, step, Act{x, x4}, bias, out, Mat{w, ws});
}
extern "C" __global__ void expert_gemm_q5a(ExpertGemmParams p, const Step* step, const float* x,
                                           const float4* x4, const u32* pairs, const u32* slot_of,
                                           float* out, const uint4* w, const u32* ws) {
    expert_gemm<FmtQ5A>(p, step, Act{x, x4}, pairs, slot_of, out, Mat{w, ws});
}

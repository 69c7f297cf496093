// Matrix-vector products for GPUs (shaders/matvec.wgsl; decode, and the last-token
// lm_head of a prefill): out[t, row_base + n] (+)= W[n] . x[t] (+ bias[row_base + n]).
// A block of 64 serves ROWS consecutive rows (fewer, p.group_rows, for few rows), thread l reading words l, l + 64, ... of their
// flat run (rows.cuh). Grid (row groups, K splits, tokens): with S = gridDim.y splits,
// split s sums its share of each row's words into row s of `out` (one-token steps of
// matrices with few rows, e.g. the router: router_topk adds the S rows).

// Params: DenseParams (rows.cuh, shared with gemm.cu).

// With `nw` (matvec_norm: the RMSNorm folded in, shaders/common/act_cols_norm.wgsl), x is
// the residual stream: every block computes the row's scale as rmsnorm.cu does (the same
// sums and tree, so the product equals the unfused pair's) and reads x normalised; with
// MATVEC_NORM_WRITE block (0, 0) also writes the normalised row to `xn`.
template <class Fmt, class Sum>
__device__ void matvec(const DenseParams& p, const Step* step, const Act& a0, const float* bias,
                       float* out, const Mat& m, const u32* nw = nullptr, float* xn = nullptr) {
    u32 li = threadIdx.x;
    // Fewer rows per block for a matrix of few rows, so it still fills a GPU.
    u32 gr = p.group_rows != 0u ? min(p.group_rows, ROWS) : ROWS;
    u32 r0 = blockIdx.x * gr;
    u32 split = blockIdx.y;
    u32 splits = gridDim.y;
    u32 n_tokens = step->n_tokens;
    u32 t = blockIdx.z;
    u32 t_out = t;
    if (p.flags & LAST_TOKEN_ONLY) {
        t = n_tokens - 1u;
        t_out = 0u;
    }
    // Both the same for every thread of the block: the reduction's barriers stay uniform.
    if (t >= n_tokens || r0 >= p.n_rows) return;
    u32 nr = min(gr, p.n_rows - r0);
    u32 per = (p.words_per_row + splits - 1u) / splits;
    u32 c0 = min(split * per, p.words_per_row);
    u32 span = min(per, p.words_per_row - c0);
    u32 xb = t * p.x_stride;
    Act a = a0;
    if (nw) {
        __shared__ float partial[64];
        float ss = 0.0f;
        for (u32 i = li; i < p.k; i += 64u) { float v = a.x[xb + i]; ss += v * v; }
        partial[li] = ss;
        __syncthreads();
        for (u32 s = 32u; s > 0u; s >>= 1) {
            if (li < s) partial[li] += partial[li + s];
            __syncthreads();
        }
        a.nw = nw;
        a.s = rsqrtf(partial[0] / (float)p.k + p.eps);
        if ((p.flags & MATVEC_NORM_WRITE) && blockIdx.x == 0u && split == 0u) {
            for (u32 i = li; i < p.k; i += 64u) xn[xb + i] = half_at(nw, i) * (a.x[xb + i] * a.s);
        }
    }
    float4 acc = zero4();
    for (u32 f = li; f < nr * span; f += ROWS_BLOCK) {
        u32 r = f / span;
        u32 n = p.w_row0 + r0 + r;
        float d = Fmt::word_dot(m, n * p.words_per_row, c0 + f % span,
                                p.s_word0 * 2u + n * p.blocks_per_row, a, xb, p.k);
        acc = madd4(acc, onehot4(r), d);
    }
    float4 s = Sum::sum4(acc);
    if (li == 0u) {
        for (u32 i = 0; i < nr; i++) {
            u32 row = p.row_base + r0 + i;
            float v = comp4(s, i);
            if ((p.flags & MATMUL_BIAS) && split == 0u) v += bias[row];
            u32 o = (t_out * splits + split) * p.out_stride + row;
            if (p.flags & MATMUL_ACCUMULATE) v += out[o];
            out[o] = v;
        }
    }
}

// The entry points: one per variant (RowsVariant { format, reduce }) the plan can pick.
extern "C" __global__ void matvec_f16_sg(DenseParams p, const Step* step, const float* x,
                                         const float4* x4, const float* bias, float* out,
                                         const uint4* w) {
    matvec<FmtF16, SubgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, nullptr});
}
extern "C" __global__ void matvec_f16_wg(DenseParams p, const Step* step, const float* x,
                                         const float4* x4, const float* bias, float* out,
                                         const uint4* w) {
    matvec<FmtF16, WorkgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, nullptr});
}
extern "C" __global__ void matvec_q8_sg(DenseParams p, const Step* step, const float* x,
                                        const float4* x4, const float* bias, float* out,
                                        const uint4* w, const u32* ws) {
    matvec<FmtQ8, SubgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws});
}
extern "C" __global__ void matvec_q8_wg(DenseParams p, const Step* step, const float* x,
                                        const float4* x4, const float* bias, float* out,
                                        const uint4* w, const u32* ws) {
    matvec<FmtQ8, WorkgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws});
}
extern "C" __global__ void matvec_q4a_sg(DenseParams p, const Step* step, const float* x,
                                         const float4* x4, const float* bias, float* out,
                                         const uint4* w, const u32* ws) {
    matvec<FmtQ4A, SubgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws});
}
extern "C" __global__ void matvec_q4a_wg(DenseParams p, const Step* step, const float* x,
                                         const float4* x4, const float* bias, float* out,
                                         const uint4* w, const u32* ws) {
    matvec<FmtQ4A, WorkgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws});
}
// The K-plane formats (GGUF's Q4_K, Q5_K, Q6_K, Q5_0/Q5_1 blocks as they are).
extern "C" __global__ void matvec_q4k_sg(DenseParams p, const Step* step, const float* x,
                                         const float4* x4, const float* bias, float* out,
                                         const uint4* w, const u32* ws) {
    matvec<FmtQ4K, SubgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws});
}
extern "C" __global__ void matvec_q4k_wg(DenseParams p, const Step* step, const float* x,
                                         const float4* x4, const float* bias, float* out,
                                         const uint4* w, const u32* ws) {
    matvec<FmtQ4K, WorkgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws});
}
extern "C" __global__ void matvec_q5k_sg(DenseParams p, const Step* step, const float* x,
                                         const float4* x4, const float* bias, float* out,
                                         const uint4* w, const u32* ws) {
    matvec<FmtQ5K, SubgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws});
}
extern "C" __global__ void matvec_q5k_wg(DenseParams p, const Step* step, const float* x,
                                         const float4* x4, const float* bias, float* out,
                                         const uint4* w, const u32* ws) {
    matvec<FmtQ5K, WorkgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws});
}
extern "C" __global__ void matvec_q6k_sg(DenseParams p, const Step* step, const float* x,
                                         const float4* x4, const float* bias, float* out,
                                         const uint4* w, const u32* ws) {
    matvec<FmtQ6K, SubgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws});
}
extern "C" __global__ void matvec_q6k_wg(DenseParams p, const Step* step, const float* x,
                                         const float4* x4, const float* bias, float* out,
                                         const uint4* w, const u32* ws) {
    matvec<FmtQ6K, WorkgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws});
}
extern "C" __global__ void matvec_q5a_sg(DenseParams p, const Step* step, const float* x,
                                         const float4* x4, const float* bias, float* out,
                                         const uint4* w, const u32* ws) {
    matvec<FmtQ5A, SubgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws});
}
extern "C" __global__ void matvec_q5a_wg(DenseParams p, const Step* step, const float* x,
                                         const float4* x4, const float* bias, float* out,
                                         const uint4* w, const u32* ws) {
    matvec<FmtQ5A, WorkgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws});
}

// matvec_norm: the same products of the residual stream normalised on load (bindings 2, 3,
// 4, 5, then the norm's weight at 6 and its output at 7, then the weights).
extern "C" __global__ void matvec_norm_f16_sg(DenseParams p, const Step* step, const float* x,
                                              const float4* x4, const float* bias, float* out,
                                              const u32* nw, float* xn, const uint4* w) {
    matvec<FmtF16, SubgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, nullptr}, nw, xn);
}
extern "C" __global__ void matvec_norm_f16_wg(DenseParams p, const Step* step, const float* x,
                                              const float4* x4, const float* bias, float* out,
                                              const u32* nw, float* xn, const uint4* w) {
    matvec<FmtF16, WorkgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, nullptr}, nw, xn);
}
extern "C" __global__ void matvec_norm_q8_sg(DenseParams p, const Step* step, const float* x,
                                             const float4* x4, const float* bias, float* out,
                                             const u32* nw, float* xn, const uint4* w, const u32* ws) {
    matvec<FmtQ8, SubgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws}, nw, xn);
}
extern "C" __global__ void matvec_norm_q8_wg(DenseParams p, const Step* step, const float* x,
                                             const float4* x4, const float* bias, float* out,
                                             const u32* nw, float* xn, const uint4* w, const u32* ws) {
    matvec<FmtQ8, WorkgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws}, nw, xn);
}
extern "C" __global__ void matvec_norm_q4a_sg(DenseParams p, const Step* step, const float* x,
                                              const float4* x4, const float* bias, float* out,
                                              const u32* nw, float* xn, const uint4* w, const u32* ws) {
    matvec<FmtQ4A, SubgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws}, nw, xn);
}
extern "C" __global__ void matvec_norm_q4a_wg(DenseParams p, const Step* step, const float* x,
                                              const float4* x4, const float* bias, float* out,
                                              const u32* nw, float* xn, const uint4* w, const u32* ws) {
    matvec<FmtQ4A, WorkgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws}, nw, xn);
}
extern "C" __global__ void matvec_norm_q4k_sg(DenseParams p, const Step* step, const float* x,
                                              const float4* x4, const float* bias, float* out,
                                              const u32* nw, float* xn, const uint4* w, const u32* ws) {
    matvec<FmtQ4K, SubgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws}, nw, xn);
}
extern "C" __global__ void matvec_norm_q4k_wg(DenseParams p, const Step* step, const float* x,
                                              const float4* x4, const float* bias, float* out,
                                              const u32* nw, float* xn, const uint4* w, const u32* ws) {
    matvec<FmtQ4K, WorkgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws}, nw, xn);
}
extern "C" __global__ void matvec_norm_q5k_sg(DenseParams p, const Step* step, const float* x,
                                              const float4* x4, const float* bias, float* out,
                                              const u32* nw, float* xn, const uint4* w, const u32* ws) {
    matvec<FmtQ5K, SubgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws}, nw, xn);
}
extern "C" __global__ void matvec_norm_q5k_wg(DenseParams p, const Step* step, const float* x,
                                              const float4* x4, const float* bias, float* out,
                                              const u32* nw, float* xn, const uint4* w, const u32* ws) {
    matvec<FmtQ5K, WorkgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws}, nw, xn);
}
extern "C" __global__ void matvec_norm_q6k_sg(DenseParams p, const Step* step, const float* x,
                                              const float4* x4, const float* bias, float* out,
                                              const u32* nw, float* xn, const uint4* w, const u32* ws) {
    matvec<FmtQ6K, SubgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws}, nw, xn);
}
extern "C" __global__ void matvec_norm_q6k_wg(DenseParams p, const Step* step, const float* x,
                                              const float4* x4, const float* bias, float* out,
                                              const u32* nw, float* xn, const uint4* w, const u32* ws) {
    matvec<FmtQ6K, WorkgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws}, nw, xn);
}
extern "C" __global__ void matvec_norm_q5a_sg(DenseParams p, const Step* step, const float* x,
                                              const float4* x4, const float* bias, float* out,
                                              const u32* nw, float* xn, const uint4* w, const u32* ws) {
    matvec<FmtQ5A, SubgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws}, nw, xn);
}
extern "C" __global__ void matvec_norm_q5a_wg(DenseParams p, const Step* step, const float* x,
                                              const float4* x4, const float* bias, float* out,
                                              const u32* nw, float* xn, const uint4* w, const u32* ws) {
    matvec<FmtQ5A, WorkgroupSum>(p, step, Act{x, x4}, bias, out, Mat{w, ws}, nw, xn);
}

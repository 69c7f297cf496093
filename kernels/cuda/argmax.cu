// Greedy sampling (shaders/argmax.wgsl): the index of the largest logit of a row, lowest
// index on ties, up to four ids suppressed; 0xffffffff when the row holds NaN or +-inf.
// One block of 256; with ARGMAX_PARTS, block g of G writes the best of its share of the
// row to part[g] (value bits, index, non-finite, 0), and with ARGMAX_FROM_PARTS one block
// reduces the p.n parts into the id (the GPU plan's two dispatches).

struct ArgmaxParams { u32 n; u32 n_suppress; u32 row_stride; u32 flags; u32 suppress[4]; };
CHECK_PARAMS(ArgmaxParams);

#define WG 256u
#define NONE 0xffffffffu

// Whether candidate (ov, oi) replaces (mv, mi): larger, or equal at a lower index.
__device__ __forceinline__ bool argmax_better(float ov, u32 oi, float mv, u32 mi) {
    return oi != NONE && (mi == NONE || ov > mv || (ov == mv && oi < mi));
}

extern "C" __global__ void argmax(ArgmaxParams p, const Step* step, const float* logits,
                                  u32* token, u32* part) {
    __shared__ float best_v[256];
    __shared__ u32 best_i[256];
    __shared__ u32 non_finite;
    u32 lid = threadIdx.x;
    // CUDA shared memory starts undefined (WGSL's is zeroed).
    if (lid == 0u) non_finite = 0u;
    __syncthreads();
    float bv = -3.4e38f;
    u32 bi = NONE;
    if (p.flags & ARGMAX_FROM_PARTS) {
        for (u32 j = lid; j < p.n; j += WG) {
            const u32* q = part + 4u * j;
            if (q[2] != 0u) atomicOr(&non_finite, 1u);
            float v = __uint_as_float(q[0]);
            if (argmax_better(v, q[1], bv, bi)) { bv = v; bi = q[1]; }
        }
    } else {
        u32 row = (p.flags & ARGMAX_LAST_ROW) ? (step->n_tokens - 1u) * p.row_stride : 0u;
        u32 lo = 0u, hi = p.n;
        if (p.flags & ARGMAX_PARTS) {
            u32 per = (p.n + gridDim.x - 1u) / gridDim.x;
            lo = min(blockIdx.x * per, p.n);
            hi = min(lo + per, p.n);
        }
        for (u32 i = lo + lid; i < hi; i += WG) {
            float v = logits[row + i];
            // Exponent bits all ones: inf or NaN (a bit test, which no fast-math can drop).
            if ((__float_as_uint(v) & 0x7f800000u) == 0x7f800000u) atomicOr(&non_finite, 1u);
            bool suppressed = false;
            for (u32 s = 0; s < p.n_suppress && s < 4u; s++) suppressed = suppressed || p.suppress[s] == i;
            if ((bi == NONE || v > bv) && !suppressed) { bv = v; bi = i; }
        }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    __syncthreads();
    for (u32 s = WG / 2u; s > 0u; s >>= 1) {
        if (lid < s && argmax_better(best_v[lid + s], best_i[lid + s], best_v[lid], best_i[lid])) {
            best_v[lid] = best_v[lid + s];
            best_i[lid] = best_i[lid + s];
        }
        __syncthreads();
    }
    if (lid == 0u) {
        if (p.flags & ARGMAX_PARTS) {
            u32* q = part + 4u * blockIdx.x;
            q[0] = __float_as_uint(best_v[0]);
            q[1] = best_i[0];
            q[2] = non_finite;
            q[3] = 0u;
        } else {
            token[0] = non_finite != 0u ? NONE : best_i[0];
        }
    }
}

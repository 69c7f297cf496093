// Greedy sampling (shaders/argmax.wgsl): the index of the largest logit of a row, lowest
// index on ties, up to four ids suppressed; 0xffffffff when the row holds NaN or +-inf.
// One block of 256.

struct ArgmaxParams { u32 n; u32 n_suppress; u32 row_stride; u32 flags; u32 suppress[4]; };
CHECK_PARAMS(ArgmaxParams);

#define WG 256u
#define NONE 0xffffffffu

extern "C" __global__ void argmax(ArgmaxParams p, const Step* step, const float* logits,
                                  u32* token) {
    __shared__ float best_v[256];
    __shared__ u32 best_i[256];
    __shared__ u32 non_finite;
    u32 lid = threadIdx.x;
    // CUDA shared memory starts undefined (WGSL's is zeroed).
    if (lid == 0u) non_finite = 0u;
    __syncthreads();
    u32 row = (p.flags & ARGMAX_LAST_ROW) ? (step->n_tokens - 1u) * p.row_stride : 0u;
    float bv = -3.4e38f;
    u32 bi = NONE;
    for (u32 i = lid; i < p.n; i += WG) {
        float v = logits[row + i];
        // Exponent bits all ones: inf or NaN (a bit test, which no fast-math can drop).
        if ((__float_as_uint(v) & 0x7f800000u) == 0x7f800000u) atomicOr(&non_finite, 1u);
        bool suppressed = false;
        for (u32 s = 0; s < p.n_suppress && s < 4u; s++) suppressed = suppressed || p.suppress[s] == i;
        if ((bi == NONE || v > bv) && !suppressed) { bv = v; bi = i; }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    __syncthreads();
    for (u32 s = WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) {
            float ov = best_v[lid + s];
            u32 oi = best_i[lid + s];
            u32 mine = best_i[lid];
            bool better = ov > best_v[lid] || (ov == best_v[lid] && oi < mine);
            if (oi != NONE && (mine == NONE || better)) { best_v[lid] = ov; best_i[lid] = oi; }
        }
        __syncthreads();
    }
    if (lid == 0u) token[0] = non_finite != 0u ? NONE : best_i[0];
}

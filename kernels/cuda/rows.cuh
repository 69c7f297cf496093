// The pieces of the GPU-shaped row kernels (matvec.cu, expert.cu), joined after common.cuh
// for those files by src/backend/cuda/kernels.rs: the CUDA twins of
// shaders/common/act_x4.wgsl, fmt_f16.wgsl, fmt_q4.wgsl, onehot.wgsl, reduce_sg.wgsl and
// reduce_wg.wgsl.
//
// Thread -> data mapping (as the WGSL): a block of 64 threads serves ROWS consecutive weight
// rows; their 16-byte words are taken as one flat run and thread l reads words l, l + 64,
// ..., so the 32 threads of a warp read 512 contiguous bytes (coalesced) and each weight
// byte is read once. The rows' partial sums are combined by the reduction.
//
// The variant axes are template parameters, not copies: the weight format (a struct with
// `word_dot`; another format is one more struct) and the reduction (SubgroupSum,
// WorkgroupSum; Reduce::Subgroup / Reduce::Workgroup on the host).

#define ROWS 4u
#define ROWS_BLOCK 64u

__device__ __forceinline__ float4 zero4() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// acc + m * d, one component at a time.
__device__ __forceinline__ float4 madd4(float4 acc, float4 m, float d) {
    return make_float4(acc.x + d * m.x, acc.y + d * m.y, acc.z + d * m.z, acc.w + d * m.w);
}

__device__ __forceinline__ float dot4(float4 a, float4 b) {
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// Component i (< 4) of v.
__device__ __forceinline__ float comp4(float4 v, u32 i) {
    return i == 0u ? v.x : i == 1u ? v.y : i == 2u ? v.z : v.w;
}

// Row r of a block's ROWS as a mask (WGSL onehot4): a thread adds a word's dot product into
// its row's accumulator by multiplying with it, as the WGSL does (so a non-finite product
// spreads the same way on both backends).
__device__ __forceinline__ float4 onehot4(u32 r) {
    return make_float4(r == 0u ? 1.0f : 0.0f, r == 1u ? 1.0f : 0.0f, r == 2u ? 1.0f : 0.0f,
                       r == 3u ? 1.0f : 0.0f);
}

// Activations: f32 rows at binding 2, the same buffer as float4s at binding 3.
struct Act {
    const float* x;
    const float4* x4;
};

// Column k of the row at float `base`, 0 at and past `len` (neither padding nor the next
// row may contribute: 0 * NaN would).
__device__ __forceinline__ float x_at(const Act& a, u32 base, u32 k, u32 len) {
    return k < len ? a.x[base + k] : 0.0f;
}

// Columns k0 .. k0 + 4 of the row at `base`: one 16-byte load when aligned and whole.
__device__ __forceinline__ float4 x_quad(const Act& a, u32 base, u32 k0, u32 len) {
    if (k0 + 4u <= len && (base + k0) % 4u == 0u) return a.x4[(base + k0) / 4u];
    return make_float4(x_at(a, base, k0, len), x_at(a, base, k0 + 1u, len),
                       x_at(a, base, k0 + 2u, len), x_at(a, base, k0 + 3u, len));
}

// A weight matrix: 16-byte words at binding 10, and (formats with scales) the same buffer
// as u32 pairs of f16 scales at binding 11 (null otherwise).
struct Mat {
    const uint4* w;
    const u32* ws;
};

// f16 (rows padded to 8 halves): a word holds 8 consecutive columns of one row; no scales.
struct FmtF16 {
    // Word `c` of the row starting at word `row_word`, dotted with columns 8c .. 8c + 8 of
    // the activation row at float `xb` (0 at and past `len`); `s_half` is unused.
    static __device__ __forceinline__ float word_dot(const Mat& m, u32 row_word, u32 c, u32 s_half,
                                                     const Act& a, u32 xb, u32 len) {
        (void)s_half;
        uint4 q = m.w[row_word + c];
        float2 h0 = unpack2x16(q.x), h1 = unpack2x16(q.y), h2 = unpack2x16(q.z), h3 = unpack2x16(q.w);
        u32 k0 = c * 8u;
        return dot4(make_float4(h0.x, h0.y, h1.x, h1.y), x_quad(a, xb, k0, len)) +
               dot4(make_float4(h2.x, h2.y, h3.x, h3.y), x_quad(a, xb, k0 + 4u, len));
    }
};

// q . (a, b) over the 8 columns of one u32 of nibbles (WGSL dot8 of q4_dot_f32): the low
// nibbles of its bytes are columns 0..3, the high ones 4..7, each stored as q + 8.
__device__ __forceinline__ float nib_dot8(u32 w, float4 a, float4 b) {
    float4 lo = make_float4((float)(w & 0xfu) - 8.0f, (float)((w >> 8) & 0xfu) - 8.0f,
                            (float)((w >> 16) & 0xfu) - 8.0f, (float)((w >> 24) & 0xfu) - 8.0f);
    float4 hi = make_float4((float)((w >> 4) & 0xfu) - 8.0f, (float)((w >> 12) & 0xfu) - 8.0f,
                            (float)((w >> 20) & 0xfu) - 8.0f, (float)((w >> 28) & 0xfu) - 8.0f);
    return dot4(lo, a) + dot4(hi, b);
}

// INT4 (src/quant.rs): a word holds 32 consecutive columns of one row as nibbles, one f16
// scale per 256-column block (8 words).
struct FmtQ4 {
    // Word `c` of the row at word `row_word` (its block scales from half `s_half`), dotted
    // with columns 32c .. 32c + 32 of the activation row at `xb`: the nibbles' dot product
    // in f32, times the block's scale.
    static __device__ __forceinline__ float word_dot(const Mat& m, u32 row_word, u32 c, u32 s_half,
                                                     const Act& a, u32 xb, u32 len) {
        uint4 q = m.w[row_word + c];
        u32 k0 = c * 32u;
        float d = nib_dot8(q.x, x_quad(a, xb, k0, len), x_quad(a, xb, k0 + 4u, len)) +
                  nib_dot8(q.y, x_quad(a, xb, k0 + 8u, len), x_quad(a, xb, k0 + 12u, len)) +
                  nib_dot8(q.z, x_quad(a, xb, k0 + 16u, len), x_quad(a, xb, k0 + 20u, len)) +
                  nib_dot8(q.w, x_quad(a, xb, k0 + 24u, len), x_quad(a, xb, k0 + 28u, len));
        return half_at(m.ws, s_half + c / 8u) * d;
    }
};

// Block sums of a float4 over the 64 threads, in thread 0 (the others' value is
// unspecified). Every thread calls them, in block-uniform control flow: they hold barriers.
// Each has its own shared array, released by the closing barrier for the next call.

// Reduce::Subgroup: warp shuffles, then shared memory across the block's two warps. The
// four sums share the shuffles: the xor-16 step trades half of the components (lanes
// 0..15 keep x, y, lanes 16..31 keep z, w), the xor-8 step half of the rest, so after 6
// shuffles (not 20) lane l holds component c = (l / 8) % 4 summed over the warp; lanes 0, 8,
// 16 and 24 of each warp leave theirs in shared memory and thread 0 adds the warps.
struct SubgroupSum {
    static __device__ __forceinline__ float4 sum4(float4 v) {
        __shared__ float red[ROWS_BLOCK / 32u][4];
        u32 li = threadIdx.x;
        bool hi16 = (li & 16u) != 0u;
        float s0 = __shfl_xor_sync(0xffffffffu, hi16 ? v.x : v.z, 16, 32);
        float s1 = __shfl_xor_sync(0xffffffffu, hi16 ? v.y : v.w, 16, 32);
        float k0 = (hi16 ? v.z : v.x) + s0;
        float k1 = (hi16 ? v.w : v.y) + s1;
        bool hi8 = (li & 8u) != 0u;
        float q = (hi8 ? k1 : k0) + __shfl_xor_sync(0xffffffffu, hi8 ? k0 : k1, 8, 32);
#pragma unroll
        for (int o = 4; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o, 32);
        if (li % 8u == 0u) red[li / 32u][(li / 8u) % 4u] = q;
        __syncthreads();
        float4 t = zero4();
        if (li == 0u) {
            for (u32 i = 0; i < ROWS_BLOCK / 32u; i++) {
                t = add4(t, make_float4(red[i][0], red[i][1], red[i][2], red[i][3]));
            }
        }
        __syncthreads();
        return t;
    }
};

// Reduce::Workgroup (portable, `--portable-kernels`): a tree in shared memory, six steps.
struct WorkgroupSum {
    static __device__ __forceinline__ float4 sum4(float4 v) {
        __shared__ float4 red[ROWS_BLOCK];
        u32 li = threadIdx.x;
        red[li] = v;
        __syncthreads();
        for (u32 s = ROWS_BLOCK / 2u; s > 0u; s >>= 1) {
            if (li < s) red[li] = add4(red[li], red[li + s]);
            __syncthreads();
        }
        float4 t = red[0];
        __syncthreads();
        return t;
    }
};

// Shared by every CUDA kernel (joined before each file by src/backend/cuda/kernels.rs, after
// the params sizes and f16.cuh; NVRTC compiles each file as one source, no #include, so no
// CUDA header is needed at run time).
// The CUDA twins of shaders/common/step.wgsl, flags.wgsl, f16_halves.wgsl and the KV
// cache's read pieces (kv_f32.wgsl, kv_f16.wgsl, kv_q8_read.wgsl with kv_q8.wgsl).
//
// Calling convention (src/backend/cuda/launch.rs): the op's params struct by value, then a
// pointer to the step uniform, then one pointer per binding in binding order (2, 3, ...).
// blockIdx is the WGSL workgroup id, blockDim the workgroup size, threadIdx the local id.

typedef unsigned int u32;

// Per-submission state (backend::params::Step), read from device memory: the host writes
// it between submissions.
struct Step { u32 pos0; u32 n_tokens; u32 _a; u32 _b; };

// Flag bits (backend::params::flags).
#define LAST_TOKEN_ONLY 4u
#define MATMUL_BIAS 1u
#define MATMUL_ACCUMULATE 2u
#define FFN_FIXED_SLOT 1u
#define COMBINE_ROUTED 1u
#define COMBINE_SHARED 2u
#define COMBINE_SHARED_GATED 4u
#define COMBINE_RESIDENT 8u
#define COMBINE_HOST 16u
#define EXPERT_COMBINE 2u
#define FFN_ROUTE 4u
#define FFN_ROUTE_WRITE 8u
#define EXPERT_GEMM_DOWN 4u
#define ROPE_QK_NORM 1u
#define ROPE_CLIP 2u
#define ROPE_QK_NORM_PER_HEAD 4u
#define ARGMAX_LAST_ROW 1u
#define ARGMAX_PARTS 2u
#define ARGMAX_FROM_PARTS 4u
#define MATVEC_NORM_WRITE 8u
#define ATTN_LIVE_SPLITS 1u

// A params struct must be exactly its Rust twin's size (the host defines WGMOE_SIZE_<name>
// from Kernel::params_layout): a drifted layout fails to compile.
#define CHECK_PARAMS(T) static_assert(sizeof(T) == WGMOE_SIZE_##T, #T " does not match its Rust twin")

// Half `i` of an array of f16 pairs (WGSL: unpack2x16float(w[i / 2])[i % 2]).
__device__ __forceinline__ float half_at(const u32* w, u32 i) {
    u32 word = w[i / 2u];
    return f16_to_f32((i % 2u) ? (word >> 16) : word);
}

// The two halves of one word.
__device__ __forceinline__ float2 unpack2x16(u32 word) {
    return make_float2(f16_to_f32(word), f16_to_f32(word >> 16));
}

// Two f32 as the halves of one word (WGSL pack2x16float of kv_store_f16.wgsl), each rounded
// to nearest even; values beyond f16's range are held at its largest finite value, NaN
// stays NaN.
__device__ __forceinline__ u32 f16_clamped(float v) {
    return f32_to_f16(v != v ? v : fminf(fmaxf(v, -65504.0f), 65504.0f));
}
__device__ __forceinline__ u32 pack2x16(float a, float b) {
    return f16_clamped(a) | (f16_clamped(b) << 16);
}

// The attention kernels' readers of a layer's KV cache (attention.cu, attn_flash.cu: the
// CUDA twins of shaders/common/kv_f32.wgsl, kv_f16.wgsl and kv_q8.wgsl), template parameters of one
// kernel body: element i of the keys or the values, as f32.
struct KvF32 {
    const float* k;
    const float* v;
    __device__ __forceinline__ float key(u32 i) const { return k[i]; }
    __device__ __forceinline__ float val(u32 i) const { return v[i]; }
};
// f16, two per u32 (element i in half i % 2 of word i / 2).
struct KvF16 {
    const u32* k;
    const u32* v;
    __device__ __forceinline__ float key(u32 i) const { return half_at(k, i); }
    __device__ __forceinline__ float val(u32 i) const { return half_at(v, i); }
};
// q8_0 (KvFormat::Q8, kv_q8_read.wgsl): per position, kv_dim int8 values (4 per u32, byte
// 0 first, the last word zero-padded), then one f32 scale per block of q8_kv_block()
// values (32 where it divides head_dim, else head_dim); element i is at position
// i / kv_dim.
__device__ __forceinline__ u32 q8_kv_block(u32 head_dim) {
    return head_dim % 32u == 0u ? 32u : head_dim;
}
struct KvQ8 {
    const u32* k;
    const u32* v;
    u32 kv_dim;
    u32 head_dim;
    __device__ __forceinline__ float at(const u32* c, u32 i) const {
        u32 bs = q8_kv_block(head_dim);
        u32 vw = (kv_dim + 3u) / 4u;
        u32 row = (i / kv_dim) * (vw + kv_dim / bs);
        u32 j = i % kv_dim;
        u32 w = c[row + j / 4u];
        float q = (float)((int)(w << (24u - 8u * (j % 4u))) >> 24);
        return q * __uint_as_float(c[row + vw + j / bs]);
    }
    __device__ __forceinline__ float key(u32 i) const { return at(k, i); }
    __device__ __forceinline__ float val(u32 i) const { return at(v, i); }
};

// Eight f16 weights of one uint4 (WGSL halves()).
struct F8 { float v[8]; };
__device__ __forceinline__ F8 halves(uint4 q) {
    F8 r;
    float2 a = unpack2x16(q.x), b = unpack2x16(q.y), c = unpack2x16(q.z), d = unpack2x16(q.w);
    r.v[0] = a.x; r.v[1] = a.y; r.v[2] = b.x; r.v[3] = b.y;
    r.v[4] = c.x; r.v[5] = c.y; r.v[6] = d.x; r.v[7] = d.y;
    return r;
}

// Columns k0 .. k0 + 8 of the row of `len` floats starting at `base` of x, 0 at and past
// len (WGSL act8): neither padding nor the next row may contribute (0 * NaN would).
__device__ __forceinline__ F8 act8(const float* x, u32 base, u32 k0, u32 len) {
    F8 r;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        u32 k = k0 + (u32)i;
        r.v[i] = k < len ? x[base + k] : 0.0f;
    }
    return r;
}

// The dot product of two groups of 8, summed as WGSL's dot(a0,b0) + dot(a1,b1).
__device__ __forceinline__ float dot8f(const F8& a, const F8& b) {
    float lo = a.v[0] * b.v[0] + a.v[1] * b.v[1] + a.v[2] * b.v[2] + a.v[3] * b.v[3];
    float hi = a.v[4] * b.v[4] + a.v[5] * b.v[5] + a.v[6] * b.v[6] + a.v[7] * b.v[7];
    return lo + hi;
}

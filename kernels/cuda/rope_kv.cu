// Per token (shaders/rope_kv.wgsl): optional RMSNorm of q and k over the whole projection
// (ROPE_QK_NORM) or per head (ROPE_QK_NORM_PER_HEAD), optional clip, rotary embedding
// (rotate_half, cos/sin table from the host), q to q_out, k and v into the KV cache at
// position pos0 + t. One block of 64 per token. The cache is written through a KV store
// (KvStoreF32, KvStoreF16, KvStoreQ8: the CUDA twins of shaders/common/kv_store_f32.wgsl,
// kv_store_f16.wgsl and kv_store_q8.wgsl), one entry point per format.

struct RopeKvParams { u32 n_heads; u32 n_kv; u32 head_dim; u32 qkv_stride; u32 flags; float eps; float clip; u32 rope_rows; };
CHECK_PARAMS(RopeKvParams);

#define WG 64u
#define MAX_NORM_HEADS 512u
// Blocks of one position's keys, or of its values (backend::params::KV_Q8_MAX_BLOCKS).
#define KV_Q8_MAX_BLOCKS 512u

__device__ __forceinline__ float clipped(const RopeKvParams& p, float v) {
    return (p.flags & ROPE_CLIP) ? fminf(fmaxf(v, -p.clip), p.clip) : v;
}

// One token's keys and values as they enter the cache: k normed (ROPE_QK_NORM over the
// whole projection, ROPE_QK_NORM_PER_HEAD per head), clipped and rotated, v clipped.
struct KvRow {
    const RopeKvParams* p;
    const float* qkv;
    const u32* k_norm_w;
    const float2* rope;
    // 1 / rms of each query head, then of each KV head (per-head norm).
    const float* inv_head;
    u32 base, q_dim, kv_dim, rrow;
    float inv_k;

    // Key element j, normed and clipped, before rotation (WGSL k_in).
    __device__ __forceinline__ float k_in(u32 j) const {
        float a = qkv[base + q_dim + j];
        if (p->flags & ROPE_QK_NORM) {
            a = half_at(k_norm_w, j) * (a * inv_k);
        } else if (p->flags & ROPE_QK_NORM_PER_HEAD) {
            a = half_at(k_norm_w, j % p->head_dim) * (a * inv_head[p->n_heads + j / p->head_dim]);
        }
        return clipped(*p, a);
    }
    // Key element j after rotate_half (WGSL k_roped): with i = j mod head_dim and h =
    // head_dim / 2, k[j] cos - k[j + h] sin for i < h, k[j] cos + k[j - h] sin otherwise.
    __device__ __forceinline__ float k_roped(u32 j) const {
        u32 half = p->head_dim / 2u;
        u32 i = j % p->head_dim;
        if (i < half) {
            float2 cs = rope[rrow + i];
            return k_in(j) * cs.x - k_in(j + half) * cs.y;
        }
        float2 cs = rope[rrow + i - half];
        return k_in(j) * cs.x + k_in(j - half) * cs.y;
    }
    // Value element j, clipped.
    __device__ __forceinline__ float v_in(u32 j) const {
        return clipped(*p, qkv[base + q_dim + kv_dim + j]);
    }
};

// An f32 cache: thread per rotated pair of keys (each input read once), per value.
struct KvStoreF32 {
    float* k;
    float* v;
    __device__ __forceinline__ void row(const KvRow& r, u32 lid, u32 pos) const {
        u32 cbase = pos * r.kv_dim;
        u32 d = r.p->head_dim, half = d / 2u;
        for (u32 idx = lid; idx < r.p->n_kv * half; idx += WG) {
            u32 h = idx / half, i = idx % half;
            u32 ia = h * d + i, ib = ia + half;
            float a = r.k_in(ia), b = r.k_in(ib);
            float2 cs = r.rope[r.rrow + i];
            k[cbase + ia] = a * cs.x - b * cs.y;
            k[cbase + ib] = b * cs.x + a * cs.y;
        }
        for (u32 i = lid; i < r.kv_dim; i += WG) v[cbase + i] = r.v_in(i);
    }
};

// An f16 cache, two per u32 (kv_store_pairs.wgsl with kv_store_f16.wgsl): elements j and
// j + 1 (j even) per thread, so one thread writes a word whole; rounded to nearest even,
// held at f16's largest finite value beyond its range.
struct KvStoreF16 {
    u32* k;
    u32* v;
    __device__ __forceinline__ void row(const KvRow& r, u32 lid, u32 pos) const {
        u32 cbase = pos * r.kv_dim;
        for (u32 w = lid; w < r.kv_dim / 2u; w += WG) {
            u32 j = 2u * w;
            k[(cbase + j) / 2u] = pack2x16(r.k_roped(j), r.k_roped(j + 1u));
            v[(cbase + j) / 2u] = pack2x16(r.v_in(j), r.v_in(j + 1u));
        }
    }
};

// A q8_0 cache (kv_store_q8.wgsl; layout in common.cuh's KvQ8): first each block's scale
// d = amax / 127 (f32), one thread per (key or value) block, its inverse (0 where d is 0)
// kept in shared memory; then each thread packs whole words of 4 values, q = x * (1 / d)
// rounded half away from zero and held to [-127, 127] (ggml's quantize_row_q8_0_ref), so
// every word has one writer.
struct KvStoreQ8 {
    u32* k;
    u32* v;
    __device__ __forceinline__ float in(const KvRow& r, bool key, u32 j) const {
        return key ? r.k_roped(j) : r.v_in(j);
    }
    // Rounded half away from zero as the WGSL (kv_q8_round): v - trunc(v) is exact.
    __device__ __forceinline__ static int round_away(float x) {
        float t = truncf(x);
        float sg = x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
        return (int)(t + (fabsf(x - t) >= 0.5f ? sg : 0.0f));
    }
    __device__ __forceinline__ void row(const KvRow& r, u32 lid, u32 pos) const {
        __shared__ float id_s[2u * KV_Q8_MAX_BLOCKS];
        u32 bs = q8_kv_block(r.p->head_dim);
        u32 nb = r.kv_dim / bs;
        u32 vw = (r.kv_dim + 3u) / 4u;
        u32 row = pos * (vw + nb);
        for (u32 e = lid; e < 2u * nb; e += WG) {
            bool key = e < nb;
            u32 b = e % nb;
            float amax = 0.0f;
            for (u32 i = 0; i < bs; i++) amax = fmaxf(amax, fabsf(in(r, key, b * bs + i)));
            float d = amax / 127.0f;
            id_s[e] = d != 0.0f ? 1.0f / d : 0.0f;
            (key ? k : v)[row + vw + b] = __float_as_uint(d);
        }
        __syncthreads();
        for (u32 e = lid; e < 2u * vw; e += WG) {
            bool key = e < vw;
            u32 w = e % vw;
            u32 packed = 0u;
            for (u32 i = 0; i < 4u; i++) {
                u32 j = 4u * w + i;
                if (j < r.kv_dim) {
                    float id = id_s[(key ? 0u : nb) + j / bs];
                    int q = round_away(in(r, key, j) * id);
                    q = q < -127 ? -127 : (q > 127 ? 127 : q);
                    packed |= ((u32)q & 0xffu) << (8u * i);
                }
            }
            (key ? k : v)[row + w] = packed;
        }
    }
};

template <class Store>
__device__ void rope_kv_body(const RopeKvParams& p, const Step* step, const float* qkv,
                             const u32* q_norm_w, const u32* k_norm_w, const float2* rope,
                             float* q_out, const Store& cache) {
    __shared__ float red_q[64];
    __shared__ float red_k[64];
    __shared__ float inv_head[MAX_NORM_HEADS];
    u32 lid = threadIdx.x;
    u32 t = blockIdx.x;
    if (t >= step->n_tokens) return;
    u32 pos = step->pos0 + t;
    u32 q_dim = p.n_heads * p.head_dim;
    u32 kv_dim = p.n_kv * p.head_dim;
    u32 base = t * p.qkv_stride;
    u32 half = p.head_dim / 2u;
    bool norm = (p.flags & ROPE_QK_NORM) != 0u;
    bool per_head = (p.flags & ROPE_QK_NORM_PER_HEAD) != 0u;
    if (per_head) {
        // One thread per head: a head's squares summed in order.
        for (u32 hh = lid; hh < min(p.n_heads + p.n_kv, MAX_NORM_HEADS); hh += WG) {
            u32 off = hh < p.n_heads ? hh * p.head_dim : q_dim + (hh - p.n_heads) * p.head_dim;
            float s = 0.0f;
            for (u32 i = 0; i < p.head_dim; i++) { float v = qkv[base + off + i]; s += v * v; }
            inv_head[hh] = rsqrtf(s / (float)p.head_dim + p.eps);
        }
    }
    float inv_q = 1.0f, inv_k = 1.0f;
    if (norm) {
        float sq = 0.0f, sk = 0.0f;
        for (u32 i = lid; i < q_dim; i += WG) { float v = qkv[base + i]; sq += v * v; }
        for (u32 i = lid; i < kv_dim; i += WG) { float v = qkv[base + q_dim + i]; sk += v * v; }
        red_q[lid] = sq;
        red_k[lid] = sk;
    }
    __syncthreads();
    if (norm) {
        for (u32 s = WG / 2u; s > 0u; s >>= 1) {
            if (lid < s) { red_q[lid] += red_q[lid + s]; red_k[lid] += red_k[lid + s]; }
            __syncthreads();
        }
        inv_q = rsqrtf(red_q[0] / (float)q_dim + p.eps);
        inv_k = rsqrtf(red_k[0] / (float)kv_dim + p.eps);
    }
    u32 rrow = min(pos, p.rope_rows - 1u) * half;
    for (u32 idx = lid; idx < p.n_heads * half; idx += WG) {
        u32 h = idx / half, i = idx % half;
        u32 ia = h * p.head_dim + i, ib = ia + half;
        float a = qkv[base + ia], b = qkv[base + ib];
        if (norm) {
            a = half_at(q_norm_w, ia) * (a * inv_q);
            b = half_at(q_norm_w, ib) * (b * inv_q);
        } else if (per_head) {
            a = half_at(q_norm_w, i) * (a * inv_head[h]);
            b = half_at(q_norm_w, i + half) * (b * inv_head[h]);
        }
        a = clipped(p, a);
        b = clipped(p, b);
        float2 cs = rope[rrow + i];
        q_out[t * q_dim + ia] = a * cs.x - b * cs.y;
        q_out[t * q_dim + ib] = b * cs.x + a * cs.y;
    }
    cache.row(KvRow{&p, qkv, k_norm_w, rope, inv_head, base, q_dim, kv_dim, rrow, inv_k}, lid, pos);
}

// The entry points, one per KV format. Bindings: qkv (2), q_norm_w (3), k_norm_w (4), rope
// (5), q_out (6), the cache's keys (7) and values (8).
extern "C" __global__ void rope_kv(RopeKvParams p, const Step* step, const float* qkv,
                                   const u32* q_norm_w, const u32* k_norm_w,
                                   const float2* rope, float* q_out, float* cache_k,
                                   float* cache_v) {
    rope_kv_body(p, step, qkv, q_norm_w, k_norm_w, rope, q_out, KvStoreF32{cache_k, cache_v});
}
extern "C" __global__ void rope_kv_kv16(RopeKvParams p, const Step* step, const float* qkv,
                                        const u32* q_norm_w, const u32* k_norm_w,
                                        const float2* rope, float* q_out, u32* cache_k,
                                        u32* cache_v) {
    rope_kv_body(p, step, qkv, q_norm_w, k_norm_w, rope, q_out, KvStoreF16{cache_k, cache_v});
}
extern "C" __global__ void rope_kv_kvq8(RopeKvParams p, const Step* step, const float* qkv,
                                        const u32* q_norm_w, const u32* k_norm_w,
                                        const float2* rope, float* q_out, u32* cache_k,
                                        u32* cache_v) {
    rope_kv_body(p, step, qkv, q_norm_w, k_norm_w, rope, q_out, KvStoreQ8{cache_k, cache_v});
}

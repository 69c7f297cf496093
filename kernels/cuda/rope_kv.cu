// Per token (shaders/rope_kv.wgsl): optional RMSNorm of q and k over the whole projection
// (ROPE_QK_NORM) or per head (ROPE_QK_NORM_PER_HEAD), optional clip, rotary embedding
// (rotate_half, cos/sin table from the host), q to q_out, k and v into the KV cache at
// position pos0 + t. One block of 64 per token.

struct RopeKvParams { u32 n_heads; u32 n_kv; u32 head_dim; u32 qkv_stride; u32 flags; float eps; float clip; u32 rope_rows; };
CHECK_PARAMS(RopeKvParams);

#define WG 64u
#define MAX_NORM_HEADS 512u

__device__ __forceinline__ float clipped(const RopeKvParams& p, float v) {
    return (p.flags & ROPE_CLIP) ? fminf(fmaxf(v, -p.clip), p.clip) : v;
}

extern "C" __global__ void rope_kv(RopeKvParams p, const Step* step, const float* qkv,
                                   const u32* q_norm_w, const u32* k_norm_w,
                                   const float2* rope, float* q_out, float* cache_k,
                                   float* cache_v) {
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
    u32 cbase = pos * kv_dim;
    for (u32 idx = lid; idx < p.n_kv * half; idx += WG) {
        u32 h = idx / half, i = idx % half;
        u32 ia = h * p.head_dim + i, ib = ia + half;
        float a = qkv[base + q_dim + ia], b = qkv[base + q_dim + ib];
        if (norm) {
            a = half_at(k_norm_w, ia) * (a * inv_k);
            b = half_at(k_norm_w, ib) * (b * inv_k);
        } else if (per_head) {
            a = half_at(k_norm_w, i) * (a * inv_head[p.n_heads + h]);
            b = half_at(k_norm_w, i + half) * (b * inv_head[p.n_heads + h]);
        }
        a = clipped(p, a);
        b = clipped(p, b);
        float2 cs = rope[rrow + i];
        cache_k[cbase + ia] = a * cs.x - b * cs.y;
        cache_k[cbase + ib] = b * cs.x + a * cs.y;
    }
    for (u32 i = lid; i < kv_dim; i += WG) cache_v[cbase + i] = clipped(p, qkv[base + q_dim + kv_dim + i]);
}

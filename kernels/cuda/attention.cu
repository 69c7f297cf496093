// Causal attention of one query head over the KV cache (shaders/attention.wgsl), one block
// of 64 per (head, token): scores = q.k * scale, softmax in f32, out = p @ V; keys
// 0 ..= pos0 + t visible; scores in a global scratch row; GQA head h reads kv head
// h / (n_heads / n_kv). The cache is read through a KV reader (common.cuh: KvF32, KvF16, KvQ8),
// one entry point per format.

struct AttentionParams { u32 n_heads; u32 n_kv; u32 head_dim; u32 scratch_stride; float scale; u32 _a; u32 _b; u32 _c; };
CHECK_PARAMS(AttentionParams);

#define WG 64u
#define MAX_HEAD_DIM 512u

template <class Kv>
__device__ void attention_body(const AttentionParams& p, const Step* step, const float* q,
                               const Kv& kv, float* scratch, float* out) {
    __shared__ float qs[MAX_HEAD_DIM];
    __shared__ float red[64];
    u32 lid = threadIdx.x;
    u32 h = blockIdx.x, t = blockIdx.y;
    if (t >= step->n_tokens) return;
    u32 d = p.head_dim;
    u32 q_dim = p.n_heads * d;
    u32 kv_dim = p.n_kv * d;
    u32 kvh = h / (p.n_heads / p.n_kv);
    u32 n_keys = step->pos0 + t + 1u;
    u32 srow = (t * p.n_heads + h) * p.scratch_stride;
    for (u32 i = lid; i < d; i += WG) qs[i] = q[t * q_dim + h * d + i];
    __syncthreads();
    float m = -3.0e38f;
    for (u32 j = lid; j < n_keys; j += WG) {
        u32 kb = j * kv_dim + kvh * d;
        float s = 0.0f;
        for (u32 i = 0; i < d; i++) s += qs[i] * kv.key(kb + i);
        s *= p.scale;
        scratch[srow + j] = s;
        m = fmaxf(m, s);
    }
    red[lid] = m;
    __syncthreads();
    for (u32 s = WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) red[lid] = fmaxf(red[lid], red[lid + s]);
        __syncthreads();
    }
    float mx = red[0];
    __syncthreads();
    float sum = 0.0f;
    for (u32 j = lid; j < n_keys; j += WG) {
        float e = expf(scratch[srow + j] - mx);
        scratch[srow + j] = e;
        sum += e;
    }
    red[lid] = sum;
    __syncthreads();
    for (u32 s = WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) red[lid] += red[lid + s];
        __syncthreads();
    }
    float inv = 1.0f / red[0];
    // The scratch row was written by other threads of this block: __syncthreads above
    // also orders their global writes for the block.
    for (u32 i = lid; i < d; i += WG) {
        float acc = 0.0f;
        for (u32 j = 0; j < n_keys; j++) acc += scratch[srow + j] * kv.val(j * kv_dim + kvh * d + i);
        out[t * q_dim + h * d + i] = acc * inv;
    }
}

// The entry points, one per KV format. Bindings: q (2), the cache's keys (3) and values (4),
// scratch (5), out (6).
extern "C" __global__ void attention(AttentionParams p, const Step* step, const float* q,
                                     const float* cache_k, const float* cache_v,
                                     float* scratch, float* out) {
    attention_body(p, step, q, KvF32{cache_k, cache_v}, scratch, out);
}
extern "C" __global__ void attention_kv16(AttentionParams p, const Step* step, const float* q,
                                          const u32* cache_k, const u32* cache_v,
                                          float* scratch, float* out) {
    attention_body(p, step, q, KvF16{cache_k, cache_v}, scratch, out);
}
extern "C" __global__ void attention_kvq8(AttentionParams p, const Step* step, const float* q,
                                          const u32* cache_k, const u32* cache_v,
                                          float* scratch, float* out) {
    attention_body(p, step, q, KvQ8{cache_k, cache_v, p.n_kv * p.head_dim, p.head_dim}, scratch,
                   out);
}

// Causal attention for GPUs, flash style, over the KV cache (shaders/attn_flash.wgsl and
// attn_combine.wgsl):
//   out[t, h] = softmax_j(q[t, h] . k[j, kvh] * scale) @ v[:, kvh],  j <= pos0 + t
// A block of 64 serves up to MAX_QR query rows of one KV head kvh: g_tile of its query
// heads (GQA: query head h reads KV head h / (n_heads / n_kv)) for q_tokens tokens, so each
// K/V row is read once for all of them. Keys are staged in shared memory a tile of tk rows
// at a time (neighbouring threads load neighbouring floats of a row); scores, the online
// softmax (running max and sum, the output rescaled when the max grows) and the output stay
// in shared memory. Grid (KV heads x head tiles, S key splits, token groups). With S = 1 a
// block covers every key of its tokens and writes the normalised output; one-token steps
// split the keys into S chunks (flash-decoding): chunk s writes its unnormalised output,
// max and sum to `part`, and attn_combine merges the chunks. The cache is read through a
// KV reader (common.cuh: KvF32, KvF16, KvQ8), one entry point per format.

struct FlashParams { u32 n_heads; u32 n_kv; u32 head_dim; u32 g_tile; u32 q_tokens; u32 tk; u32 min_chunk; u32 splits; float scale; u32 flags; u32 _b; u32 _c; };
CHECK_PARAMS(FlashParams);

#define WG 64u
// Capacities (floats; backend::params::ATTN_FLASH_*, which the host sizes g_tile, q_tokens
// and tk to fit): query rows and outputs (QR x head_dim each), one tile of keys or values
// (tk x head_dim), a tile's scores (QR x tk), query rows.
#define FLASH_QD 1024u
#define FLASH_KVD 1024u
#define FLASH_PD 512u
#define FLASH_MAX_QR 32u
#define NEG (-3.0e38f)

template <class Kv>
__device__ void attn_flash_body(const FlashParams& p, const Step* step, const float* q,
                                const Kv& kv, float* out, float* part) {
    __shared__ float q_s[FLASH_QD];
    __shared__ float o_s[FLASH_QD];
    __shared__ float kv_s[FLASH_KVD];
    __shared__ float p_s[FLASH_PD];
    __shared__ float m_s[FLASH_MAX_QR];
    __shared__ float l_s[FLASH_MAX_QR];
    __shared__ float a_s[FLASH_MAX_QR];
    u32 li = threadIdx.x;
    u32 d = p.head_dim;
    u32 group = p.n_heads / p.n_kv;
    u32 tiles = (group + p.g_tile - 1u) / p.g_tile;
    u32 kvh = blockIdx.x / tiles;
    u32 g0 = (blockIdx.x % tiles) * p.g_tile;
    u32 gn = min(p.g_tile, group - g0);
    u32 pos0 = step->pos0;
    u32 n_tokens = step->n_tokens;
    u32 t0 = blockIdx.z * p.q_tokens;
    if (t0 >= n_tokens) return;
    u32 tn = min(p.q_tokens, n_tokens - t0);
    u32 rows = gn * tn;
    u32 q_dim = p.n_heads * d;
    u32 kv_dim = p.n_kv * d;
    u32 tk = p.tk;
    // This split's keys: the group's last token sees the most.
    u32 n_keys = pos0 + t0 + tn;
    u32 s = blockIdx.y;
    // The splits launched: p.splits, or fewer for a one-token step sized by its position
    // (ATTN_LIVE_SPLITS); `part` keeps p.splits records a head either way.
    u32 live = gridDim.y;
    u32 chunk = max(p.min_chunk, (n_keys + live - 1u) / live);
    chunk = (chunk + tk - 1u) / tk * tk;
    u32 k0 = min(s * chunk, n_keys);
    u32 k1 = min(k0 + chunk, n_keys);

    // Row r is token t0 + r / gn, query head kvh * group + g0 + r % gn.
    for (u32 e = li; e < rows * d; e += WG) {
        u32 r = e / d;
        u32 h = kvh * group + g0 + r % gn;
        q_s[e] = q[(t0 + r / gn) * q_dim + h * d + e % d] * p.scale;
        o_s[e] = 0.0f;
    }
    if (li < rows) {
        m_s[li] = NEG;
        l_s[li] = 0.0f;
    }
    __syncthreads();

    for (u32 kt = k0; kt < k1; kt += tk) {
        u32 nk = min(tk, k1 - kt);
        for (u32 e = li; e < nk * d; e += WG) kv_s[e] = kv.key((kt + e / d) * kv_dim + kvh * d + e % d);
        __syncthreads();
        for (u32 e = li; e < rows * nk; e += WG) {
            u32 r = e / nk;
            u32 j = e % nk;
            float sc = 0.0f;
            for (u32 i = 0; i < d; i++) sc += q_s[r * d + i] * kv_s[j * d + i];
            // Causal: token t sees keys 0 ..= pos0 + t.
            bool visible = kt + j <= pos0 + t0 + r / gn;
            p_s[r * tk + j] = visible ? sc : NEG;
        }
        __syncthreads();
        // The values replace the keys while the first threads update the softmax.
        for (u32 e = li; e < nk * d; e += WG) kv_s[e] = kv.val((kt + e / d) * kv_dim + kvh * d + e % d);
        if (li < rows) {
            u32 r = li;
            float mx = m_s[r];
            for (u32 j = 0; j < nk; j++) mx = fmaxf(mx, p_s[r * tk + j]);
            float sum = 0.0f;
            for (u32 j = 0; j < nk; j++) {
                float sc = p_s[r * tk + j];
                float pv = sc > NEG ? expf(sc - mx) : 0.0f;
                p_s[r * tk + j] = pv;
                sum += pv;
            }
            float alpha = expf(m_s[r] - mx);
            a_s[r] = alpha;
            l_s[r] = l_s[r] * alpha + sum;
            m_s[r] = mx;
        }
        __syncthreads();
        for (u32 e = li; e < rows * d; e += WG) {
            u32 r = e / d;
            u32 c = e % d;
            float acc = o_s[e] * a_s[r];
            for (u32 j = 0; j < nk; j++) acc += p_s[r * tk + j] * kv_s[j * d + c];
            o_s[e] = acc;
        }
        __syncthreads();
    }

    for (u32 e = li; e < rows * d; e += WG) {
        u32 r = e / d;
        u32 t = t0 + r / gn;
        u32 h = kvh * group + g0 + r % gn;
        if (live == 1u) {
            out[t * q_dim + h * d + e % d] = o_s[e] / l_s[r];
        } else {
            part[((t * p.n_heads + h) * p.splits + s) * (d + 2u) + e % d] = o_s[e];
        }
    }
    if (live > 1u && li < rows) {
        u32 t = t0 + li / gn;
        u32 h = kvh * group + g0 + li % gn;
        u32 b = ((t * p.n_heads + h) * p.splits + s) * (d + 2u) + d;
        part[b] = m_s[li];
        part[b + 1u] = l_s[li];
    }
    // The combine merges as many splits as were launched (it does not know the grid).
    if ((p.flags & ATTN_LIVE_SPLITS) && blockIdx.x == 0u && blockIdx.y == 0u && li == 0u) {
        part[p.n_heads * p.splits * (d + 2u)] = (float)live;
    }
}

// The entry points, one per KV format. Bindings: q (2), the cache's keys (3) and values (4),
// out (5), part (6).
extern "C" __global__ void attn_flash(FlashParams p, const Step* step, const float* q,
                                      const float* cache_k, const float* cache_v, float* out,
                                      float* part) {
    attn_flash_body(p, step, q, KvF32{cache_k, cache_v}, out, part);
}
extern "C" __global__ void attn_flash_kv16(FlashParams p, const Step* step, const float* q,
                                           const u32* cache_k, const u32* cache_v, float* out,
                                           float* part) {
    attn_flash_body(p, step, q, KvF16{cache_k, cache_v}, out, part);
}
extern "C" __global__ void attn_flash_kvq8(FlashParams p, const Step* step, const float* q,
                                           const u32* cache_k, const u32* cache_v, float* out,
                                           float* part) {
    attn_flash_body(p, step, q, KvQ8{cache_k, cache_v, p.n_kv * p.head_dim, p.head_dim}, out,
                    part);
}

// Merges the key splits of attn_flash (one-token steps): for each query head,
//   out = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s,   M = max_s m_s
// where split s left its unnormalised output o_s, max m_s and sum l_s; a split without keys
// has m_s = -3e38 and l_s = 0 and weighs nothing. One block per (head, token); every thread
// computes the maximum and the sum itself (no shared memory).
extern "C" __global__ void attn_combine(FlashParams p, const Step* step, const float* part,
                                        float* out) {
    u32 li = threadIdx.x;
    u32 h = blockIdx.x;
    u32 t = blockIdx.y;
    if (t >= step->n_tokens) return;
    u32 d = p.head_dim;
    u32 rec = d + 2u;
    u32 base = (t * p.n_heads + h) * p.splits * rec;
    // A one-token step sized by its position launched `live` splits (attn_flash wrote it).
    u32 live = (p.flags & ATTN_LIVE_SPLITS) ? min(p.splits, (u32)part[p.n_heads * p.splits * rec]) : p.splits;
    float mx = NEG;
    for (u32 s = 0; s < live; s++) mx = fmaxf(mx, part[base + s * rec + d]);
    float l = 0.0f;
    for (u32 s = 0; s < live; s++) l += expf(part[base + s * rec + d] - mx) * part[base + s * rec + d + 1u];
    for (u32 c = li; c < d; c += WG) {
        float acc = 0.0f;
        for (u32 s = 0; s < live; s++) acc += expf(part[base + s * rec + d] - mx) * part[base + s * rec + c];
        out[(t * p.n_heads + h) * d + c] = acc / l;
    }
}

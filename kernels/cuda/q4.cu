// W4A16 expert kernels (shaders/ffn_gate_up_q4.wgsl, ffn_down_q4.wgsl,
// ffn_down_q4_combine.wgsl assembled with q4_dot_f32 and q4_act_storage, and lanes_1 or
// lanes_8): f32 products and sums, activations from storage, 1 or 8 lanes per output row.
// INT4 layout (src/blocks/quant.rs): 8 columns per u32 word (low nibbles of its bytes are columns
// 0..3, high nibbles 4..7), stored value q + 8; one f16 scale per 256-input block, two per
// u32 word. Each thread sums a block's columns unscaled and multiplies by its scale once.
// Grid (rows / rows per block: 64 with one lane, 8 with eight; top-k indices from j_base;
// tokens); binding 15 is binding 2 as float4.

struct Q4GateUpParams { u32 hidden; u32 inter; u32 top_k; u32 j_base; u32 x_stride; u32 slot_vec4; u32 first_slot; u32 chunk_slots; u32 gate_q; u32 up_q; u32 gate_s; u32 up_s; u32 _a; u32 _b; u32 _c; u32 _d; };
struct Q4DownParams { u32 hidden; u32 inter; u32 top_k; u32 j_base; u32 slot_vec4; u32 first_slot; u32 chunk_slots; u32 down_q; u32 down_s; u32 _a; u32 _b; u32 _c; };
CHECK_PARAMS(Q4GateUpParams);
CHECK_PARAMS(Q4DownParams);

// q . (a, b) over the 8 columns of one word of nibbles (WGSL dot8 of q4_dot_f32).
__device__ __forceinline__ float q4_dot8(u32 w, const float* a) {
    float lo = 0.0f, hi = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) lo += ((float)((w >> (8 * i)) & 0xfu) - 8.0f) * a[i];
#pragma unroll
    for (int i = 0; i < 4; i++) hi += ((float)((w >> (8 * i + 4)) & 0xfu) - 8.0f) * a[4 + i];
    return lo + hi;
}

// Columns k0 .. k0 + 32 of the row at `base` (0 at and past len), dotted with one uint4 of
// nibbles (WGSL dot32(q, act32(base, k0, len))).
__device__ __forceinline__ float q4_dot32(uint4 q, const float* x, const float4* x4, u32 base,
                                          u32 k0, u32 len) {
    float a[32];
    if (k0 + 32u <= len && (base % 4u) == 0u) {
        u32 i = (base + k0) / 4u;
#pragma unroll
        for (int v = 0; v < 8; v++) {
            float4 f = x4[i + v];
            a[4 * v] = f.x; a[4 * v + 1] = f.y; a[4 * v + 2] = f.z; a[4 * v + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int v = 0; v < 32; v++) {
            u32 k = k0 + (u32)v;
            a[v] = k < len ? x[base + k] : 0.0f;
        }
    }
    return q4_dot8(q.x, a) + q4_dot8(q.y, a + 8) + q4_dot8(q.z, a + 16) + q4_dot8(q.w, a + 24);
}

// Scale `half_index` of the scales starting at u32 word `word_base` of ws.
__device__ __forceinline__ float q4_scale(const u32* ws, u32 word_base, u32 half_index) {
    return half_at(ws + word_base, half_index);
}

// Lanes per output row: 1 (one thread per row, portable; rows past the end return) or 8
// (8 consecutive lanes of a warp per row: lane l takes 32-column group l of every 256-input
// block, so a row's 8 lanes read 128 contiguous bytes and one scale each, and their sums are
// combined with shuffles; rows past the end compute a copy of the last row and store
// nothing, so every lane takes part). WGSL: shaders/common/lanes_1.wgsl, lanes_8.wgsl.
template <u32 LANES>
__device__ __forceinline__ float reduce_lanes(float v) {
    if (LANES == 8u) {
        v += __shfl_xor_sync(0xffffffffu, v, 4, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 2, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 1, 8);
    }
    return v;
}

// This lane's share of the 32-column groups [b * 8, b * 8 + 8) of a row: all of them with
// one lane, group b * 8 + lane with 8.
template <u32 LANES>
__device__ __forceinline__ u32 group_begin(u32 b, u32 lane) { return LANES == 1u ? b * 8u : b * 8u + lane; }
template <u32 LANES>
__device__ __forceinline__ u32 group_end(u32 b, u32 lane, u32 nv) {
    return LANES == 1u ? min(b * 8u + 8u, nv) : min(b * 8u + lane + 1u, nv);
}

template <u32 LANES>
__device__ void gate_up(const Q4GateUpParams& p, const Step* step, const float* x, const u32* ids,
                        const u32* slot_of, const uint4* wq, const u32* ws, float* out,
                        const float4* x4) {
    u32 li = threadIdx.x;
    u32 lane = LANES == 1u ? 0u : li % 8u;
    u32 n_raw = blockIdx.x * (64u / LANES) + li / LANES;
    if (LANES == 1u && n_raw >= p.inter) return;
    u32 n = min(n_raw, p.inter - 1u);
    u32 j = blockIdx.y + p.j_base;
    u32 t = blockIdx.z;
    // Block-uniform returns: every lane of a row stays for the shuffles.
    if (t >= step->n_tokens) return;
    u32 slot = slot_of[ids[t * p.top_k + j]];
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) return;
    u32 sv = (slot - p.first_slot) * p.slot_vec4;
    u32 nv = (p.hidden + 31u) / 32u;
    u32 nb = (p.hidden + 255u) / 256u;
    u32 g_row = sv + p.gate_q + n * nv;
    u32 u_row = sv + p.up_q + n * nv;
    u32 xb = t * p.x_stride;
    float g = 0.0f, u = 0.0f;
    for (u32 b = 0; b < nb; b++) {
        float bg = 0.0f, bu = 0.0f;
        for (u32 c = group_begin<LANES>(b, lane); c < group_end<LANES>(b, lane, nv); c++) {
            bg += q4_dot32(wq[g_row + c], x, x4, xb, c * 32u, p.hidden);
            bu += q4_dot32(wq[u_row + c], x, x4, xb, c * 32u, p.hidden);
        }
        g += q4_scale(ws, sv * 4u + p.gate_s, n * nb + b) * bg;
        u += q4_scale(ws, sv * 4u + p.up_s, n * nb + b) * bu;
    }
    g = reduce_lanes<LANES>(g);
    u = reduce_lanes<LANES>(u);
    // silu(g) = g * sigmoid(g)
    if (lane == 0u && n_raw < p.inter) out[(t * p.top_k + j) * p.inter + n] = g / (1.0f + expf(-g)) * u;
}

// This lane's share of down_e[m] . h[hb ..] for the expert in chunk-relative slot `rel`
// (WGSL lane_dot); reduce_lanes gives the whole dot product.
template <u32 LANES>
__device__ float lane_dot(const Q4DownParams& p, const float* x, const float4* x4,
                          const uint4* wq, const u32* ws, u32 rel, u32 m, u32 hb, u32 lane) {
    u32 sv = rel * p.slot_vec4;
    u32 nv = (p.inter + 31u) / 32u;
    u32 nb = (p.inter + 255u) / 256u;
    u32 row = sv + p.down_q + m * nv;
    float acc = 0.0f;
    for (u32 b = 0; b < nb; b++) {
        float bs = 0.0f;
        for (u32 c = group_begin<LANES>(b, lane); c < group_end<LANES>(b, lane, nv); c++)
            bs += q4_dot32(wq[row + c], x, x4, hb, c * 32u, p.inter);
        acc += q4_scale(ws, sv * 4u + p.down_s, m * nb + b) * bs;
    }
    return acc;
}

// x[t, m] += sum_j w[t, j] * (down_e[m] . h[t, j, :]) over the picks whose slot is in
// this chunk (chunks are successive launches on one stream: no race on x).
template <u32 LANES>
__device__ void down_combine(const Q4DownParams& p, const Step* step, const float* x,
                             const u32* ids, const u32* slot_of, const uint4* wq, const u32* ws,
                             const float* weights, float* out, const float4* x4) {
    u32 li = threadIdx.x;
    u32 lane = LANES == 1u ? 0u : li % 8u;
    u32 m_raw = blockIdx.x * (64u / LANES) + li / LANES;
    if (LANES == 1u && m_raw >= p.hidden) return;
    u32 m = min(m_raw, p.hidden - 1u);
    u32 t = blockIdx.z;
    if (t >= step->n_tokens) return;
    float acc = 0.0f;
    bool hit = false;
    for (u32 j = 0; j < p.top_k; j++) {
        u32 tj = t * p.top_k + j;
        u32 slot = slot_of[ids[tj]];
        // The same for every lane of the block (t and j are).
        if (slot >= p.first_slot && slot < p.first_slot + p.chunk_slots) {
            acc += weights[tj] * reduce_lanes<LANES>(lane_dot<LANES>(p, x, x4, wq, ws, slot - p.first_slot, m, tj * p.inter, lane));
            hit = true;
        }
    }
    if (hit && lane == 0u && m_raw < p.hidden) out[t * p.hidden + m] += acc;
}

// y[t, j, m] = down_e[m] . h[t, j, :] for the top-k indices j_base .. j_base + grid y.
template <u32 LANES>
__device__ void down(const Q4DownParams& p, const Step* step, const float* x, const u32* ids,
                     const u32* slot_of, const uint4* wq, const u32* ws, float* out,
                     const float4* x4) {
    u32 li = threadIdx.x;
    u32 lane = LANES == 1u ? 0u : li % 8u;
    u32 m_raw = blockIdx.x * (64u / LANES) + li / LANES;
    if (LANES == 1u && m_raw >= p.hidden) return;
    u32 m = min(m_raw, p.hidden - 1u);
    u32 t = blockIdx.z;
    if (t >= step->n_tokens) return;
    u32 tj = t * p.top_k + blockIdx.y + p.j_base;
    u32 slot = slot_of[ids[tj]];
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) return;
    float v = reduce_lanes<LANES>(lane_dot<LANES>(p, x, x4, wq, ws, slot - p.first_slot, m, tj * p.inter, lane));
    if (lane == 0u && m_raw < p.hidden) out[tj * p.hidden + m] = v;
}

// The entry points: one per variant (Q4Variant { Storage, One | Eight, F32 }).
extern "C" __global__ void ffn_gate_up_q4(Q4GateUpParams p, const Step* step, const float* x,
                                          const u32* ids, const u32* slot_of, const uint4* wq,
                                          const u32* ws, float* out, const float4* x4) {
    gate_up<1u>(p, step, x, ids, slot_of, wq, ws, out, x4);
}
extern "C" __global__ void ffn_gate_up_q4_l8(Q4GateUpParams p, const Step* step, const float* x,
                                             const u32* ids, const u32* slot_of, const uint4* wq,
                                             const u32* ws, float* out, const float4* x4) {
    gate_up<8u>(p, step, x, ids, slot_of, wq, ws, out, x4);
}
extern "C" __global__ void ffn_down_q4(Q4DownParams p, const Step* step, const float* x,
                                       const u32* ids, const u32* slot_of, const uint4* wq,
                                       const u32* ws, float* out, const float4* x4) {
    down<1u>(p, step, x, ids, slot_of, wq, ws, out, x4);
}
extern "C" __global__ void ffn_down_q4_l8(Q4DownParams p, const Step* step, const float* x,
                                          const u32* ids, const u32* slot_of, const uint4* wq,
                                          const u32* ws, float* out, const float4* x4) {
    down<8u>(p, step, x, ids, slot_of, wq, ws, out, x4);
}
extern "C" __global__ void ffn_down_q4_combine(Q4DownParams p, const Step* step, const float* x,
                                               const u32* ids, const u32* slot_of,
                                               const uint4* wq, const u32* ws,
                                               const float* weights, float* out,
                                               const float4* x4) {
    down_combine<1u>(p, step, x, ids, slot_of, wq, ws, weights, out, x4);
}
extern "C" __global__ void ffn_down_q4_combine_l8(Q4DownParams p, const Step* step, const float* x,
                                                  const u32* ids, const u32* slot_of,
                                                  const uint4* wq, const u32* ws,
                                                  const float* weights, float* out,
                                                  const float4* x4) {
    down_combine<8u>(p, step, x, ids, slot_of, wq, ws, weights, out, x4);
}

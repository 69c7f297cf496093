// f16 matmul (shaders/matmul.wgsl): out[t, row_base + n] (+)= sum_k x[t, k] W[n, k]
// (+ bias), W f16 row-major, rows padded to 8 halves (one uint4 per 8 columns), f32
// accumulation. One thread per weight row and TT = 4 tokens. Grid (rows / 64, tokens / 4).

struct MatmulParams { u32 k; u32 n_rows; u32 row_base; u32 vec4_per_row; u32 x_stride; u32 out_stride; u32 flags; u32 _a; };
CHECK_PARAMS(MatmulParams);

#define TT 4u

extern "C" __global__ void matmul(MatmulParams p, const Step* step, const float* x,
                                  const uint4* w, const float* bias, float* out) {
    u32 n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= p.n_rows) return;
    u32 n_tokens = step->n_tokens;
    u32 t_begin = blockIdx.y * TT;
    u32 t_end = min(t_begin + TT, n_tokens);
    u32 t_out0 = t_begin;
    if (p.flags & LAST_TOKEN_ONLY) {
        if (blockIdx.y > 0u) return;
        t_begin = n_tokens - 1u;
        t_end = n_tokens;
        t_out0 = 0u;
    }
    if (t_begin >= t_end) return;
    // Tokens past t_end re-read the last valid row and are not stored.
    u32 xb[TT];
#pragma unroll
    for (u32 i = 0; i < TT; i++) xb[i] = min(t_begin + i, t_end - 1u) * p.x_stride;
    float acc[TT] = {0.0f, 0.0f, 0.0f, 0.0f};
    u32 wrow = n * p.vec4_per_row;
    u32 chunks = (p.k + 7u) / 8u;
    for (u32 c = 0; c < chunks; c++) {
        F8 wv = halves(w[wrow + c]);
#pragma unroll
        for (u32 i = 0; i < TT; i++) acc[i] += dot8f(wv, act8(x, xb[i], c * 8u, p.k));
    }
    u32 row = p.row_base + n;
    float b = (p.flags & MATMUL_BIAS) ? bias[row] : 0.0f;
    for (u32 i = 0; i < TT; i++) {
        u32 t = t_begin + i;
        if (t >= t_end) break;
        u32 o = (t_out0 + i) * p.out_stride + row;
        float v = acc[i] + b;
        if (p.flags & MATMUL_ACCUMULATE) v += out[o];
        out[o] = v;
    }
}

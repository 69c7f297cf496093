// RMSNorm (shaders/rmsnorm.wgsl): y = weight * (x * rsqrt(mean(x^2) + eps)) in f32, one
// block of 64 per token row; LAST_TOKEN_ONLY: the single row is the step's last token.

struct RmsNormParams { u32 n; u32 x_stride; u32 out_stride; u32 flags; float eps; u32 _a; u32 _b; u32 _c; };
CHECK_PARAMS(RmsNormParams);

#define WG 64u

extern "C" __global__ void rmsnorm(RmsNormParams p, const Step* step, const float* x,
                                   const u32* weight, float* out) {
    __shared__ float partial[64];
    u32 lid = threadIdx.x;
    u32 t = blockIdx.x, t_out = blockIdx.x;
    u32 n_tokens = step->n_tokens;
    if (p.flags & LAST_TOKEN_ONLY) { t = n_tokens - 1u; t_out = 0u; }
    if (t >= n_tokens) return;  // the whole block takes the same branch
    u32 base = t * p.x_stride;
    float ss = 0.0f;
    for (u32 i = lid; i < p.n; i += WG) { float v = x[base + i]; ss += v * v; }
    partial[lid] = ss;
    __syncthreads();
    for (u32 s = WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) partial[lid] += partial[lid + s];
        __syncthreads();
    }
    float inv = rsqrtf(partial[0] / (float)p.n + p.eps);
    u32 obase = t_out * p.out_stride;
    for (u32 i = lid; i < p.n; i += WG) out[obase + i] = half_at(weight, i) * (x[base + i] * inv);
}

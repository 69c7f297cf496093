// The pieces of the GPU-shaped kernels (matvec.cu, expert.cu, gemm.cu), joined after
// common.cuh for those files by src/backend/cuda/kernels.rs: the CUDA twins of
// shaders/common/act_x4.wgsl, fmt_f16.wgsl, fmt_q4.wgsl, fmt_q4a.wgsl, fmt_q8.wgsl,
// q8_unpack.wgsl, scales_staged.wgsl, tile_f16.wgsl, tile_q4.wgsl, tile_q4a.wgsl,
// tile_q8.wgsl, kq_common.wgsl, kq_k4.wgsl, fmt_q4k/q5k/q6k/q5a.wgsl, tile_kq.wgsl,
// onehot.wgsl, reduce_sg.wgsl and reduce_wg.wgsl.
//
// Thread -> data mapping of the row kernels (as the WGSL): a block of 64 threads serves ROWS
// consecutive weight rows; their 16-byte words are taken as one flat run and thread l reads
// words l, l + 64, ..., so the 32 threads of a warp read 512 contiguous bytes (coalesced) and
// each weight byte is read once. The rows' partial sums are combined by the reduction. The
// tiled kernels (gemm.cu) stage tiles through the formats' `stage_word` instead.
//
// The variant axes are template parameters, not copies: the weight format (a struct with
// `word_dot`, `stage_scales` and `stage_word`; another format is one more struct) and the
// reduction (SubgroupSum, WorkgroupSum; Reduce::Subgroup / Reduce::Workgroup on the host).

#define ROWS 4u
// Threads per block of every GPU-shaped kernel (row and tiled).
#define ROWS_BLOCK 64u

// The dense products' params (matvec.cu, gemm.cu; backend::params::DenseParams).
struct DenseParams { u32 k; u32 n_rows; u32 row_base; u32 words_per_row; u32 x_stride; u32 out_stride; u32 flags; u32 w_row0; u32 s_word0; u32 blocks_per_row; u32 group_rows; float eps; };
CHECK_PARAMS(DenseParams);

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
    // matvec_norm (shaders/common/act_cols_norm.wgsl): the RMSNorm's weight (f16 pairs)
    // and the row's scale, applied on load as w[k] * (x[k] * s); null: x as stored.
    const u32* nw = nullptr;
    float s = 0.0f;
};

// Column k of the row at float `base` (normalised when the Act says so), 0 at and past
// `len` (neither padding nor the next row may contribute: 0 * NaN would).
__device__ __forceinline__ float x_at(const Act& a, u32 base, u32 k, u32 len) {
    if (k >= len) return 0.0f;
    return a.nw ? half_at(a.nw, k) * (a.x[base + k] * a.s) : a.x[base + k];
}

// Columns k0 .. k0 + 4 of the row at `base`: one 16-byte load when aligned and whole.
__device__ __forceinline__ float4 x_quad(const Act& a, u32 base, u32 k0, u32 len) {
    if (k0 + 4u <= len && (base + k0) % 4u == 0u) {
        float4 v = a.x4[(base + k0) / 4u];
        if (!a.nw) return v;
        return make_float4(half_at(a.nw, k0) * (v.x * a.s), half_at(a.nw, k0 + 1u) * (v.y * a.s),
                           half_at(a.nw, k0 + 2u) * (v.z * a.s), half_at(a.nw, k0 + 3u) * (v.w * a.s));
    }
    return make_float4(x_at(a, base, k0, len), x_at(a, base, k0 + 1u, len),
                       x_at(a, base, k0 + 2u, len), x_at(a, base, k0 + 3u, len));
}

// A weight matrix: 16-byte words at binding 10, and (formats with scales) the same buffer
// as u32 pairs of f16 scales at binding 11 (null otherwise).
struct Mat {
    const uint4* w;
    const u32* ws;
};

// Tiled kernels: a block's staged block scales (BlockScales::stage_scales) of up to two
// matrices (gate and up): the shared words (Fmt::SCALE_WORDS of them) and, per matrix, the
// first staged u32 word of the scales and how many are staged.
struct Scales {
    u32* s;
    u32 first[2];
    u32 n[2];
};

// f16 (rows padded to 8 halves): a word holds 8 consecutive columns of one row; no scales.
struct FmtF16 {
    static constexpr u32 WORD_COLS = 8u;
    // No scales (a shared array has at least one element).
    static constexpr u32 SCALE_WORDS = 1u;

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
    // No scales to stage.
    static __device__ __forceinline__ void stage_scales(const Mat& m, Scales& sc, u32 mi, u32 h0,
                                                        u32 h1) {
        (void)m; (void)sc; (void)mi; (void)h0; (void)h1;
    }
    // Tiled kernels (tile_f16.wgsl): word `c` of the row at `row_word` as 8 f32 columns into
    // the shared weight tile `wt` from index `dst`; zeros when !valid (columns past the row).
    static __device__ __forceinline__ void stage_word(const Mat& m, const Scales& sc, u32 mi,
                                                      u32 row_word, u32 c, u32 s_half, float* wt,
                                                      u32 dst, bool valid) {
        (void)sc; (void)mi; (void)s_half;
        F8 h;
        if (valid) {
            h = halves(m.w[row_word + c]);
        } else {
            for (int i = 0; i < 8; i++) h.v[i] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 8; i++) wt[dst + (u32)i] = h.v[i];
    }
};

// The block scales of the formats that have them (FmtQ4, FmtQ8; the CUDA twin of
// shaders/common/scales_staged.wgsl): f16, as u32 pairs of halves at binding 11 (the
// weights' buffer, past the words), one per block of a row. The row kernels read each
// word's scale from device memory (`scale`; the WGSL stages a workgroup's scales in
// workgroup memory first: the same values, so the same results; here the L1 cache serves
// the threads sharing a scale word); the tiled kernels stage them as the WGSL does
// (`stage_scales`, `w_scale`). A format with scales derives from this struct.
struct BlockScales {
    // u32 words of staged scales per matrix (two matrices: gate and up); rows past it read
    // their scales from device memory.
    static constexpr u32 SCALE_CAP = 1024u;
    static constexpr u32 SCALE_WORDS = 2u * SCALE_CAP;

    // Row kernels: half `i` of the scales, from device memory.
    static __device__ __forceinline__ float scale(const Mat& m, u32 i) { return half_at(m.ws, i); }
    // Tiled kernels: stage the scales of matrix `mi` (0 or 1) from half `h0` to half `h1`
    // (exclusive) into shared memory, neighbouring threads loading neighbouring u32 words.
    // Every thread calls it with the same arguments; a __syncthreads must follow before
    // w_scale reads them (and precede a new staging into the same matrix).
    static __device__ __forceinline__ void stage_scales(const Mat& m, Scales& sc, u32 mi, u32 h0,
                                                        u32 h1) {
        u32 first = h0 / 2u;
        u32 n = min((h1 + 1u) / 2u - first, SCALE_CAP);
        sc.first[mi] = first;
        sc.n[mi] = n;
        for (u32 i = threadIdx.x; i < n; i += ROWS_BLOCK) sc.s[mi * SCALE_CAP + i] = m.ws[first + i];
    }
    // u32 word `i` of the scales of matrix `mi`: staged, or from device memory past the cap.
    static __device__ __forceinline__ u32 w_word(const Mat& m, const Scales& sc, u32 mi, u32 i) {
        // Selected, not indexed by `mi`: the block's registers, not a stack frame.
        u32 rel = i - (mi ? sc.first[1] : sc.first[0]);
        return rel < (mi ? sc.n[1] : sc.n[0]) ? sc.s[mi * SCALE_CAP + rel] : m.ws[i];
    }
    // Half `i` of the scales of matrix `mi`.
    static __device__ __forceinline__ float w_scale(const Mat& m, const Scales& sc, u32 mi, u32 i) {
        u32 word = w_word(m, sc, mi, i / 2u);
        return f16_to_f32((i % 2u) ? (word >> 16) : word);
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

// INT4 (src/blocks/quant.rs): a word holds 32 consecutive columns of one row as nibbles, one f16
// scale per 256-column block (8 words); scales from BlockScales.
struct FmtQ4 : BlockScales {
    static constexpr u32 WORD_COLS = 32u;
    // Words per block of one scale.
    static constexpr u32 BLOCK_WORDS = 8u;

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
        return scale(m, s_half + c / BLOCK_WORDS) * d;
    }
    // Tiled kernels (tile_q4.wgsl): word `c` of the row at `row_word` of matrix `mi` (its
    // block scales from half `s_half`) as 32 scaled f32 columns into the shared weight tile
    // `wt` from index `dst`: byte b of u32 j holds columns 8j + b (low nibble) and 8j + 4 + b
    // (high), each stored as q + 8. Zeros when !valid (columns past the row).
    static __device__ __forceinline__ void stage_word(const Mat& m, const Scales& sc, u32 mi,
                                                      u32 row_word, u32 c, u32 s_half, float* wt,
                                                      u32 dst, bool valid) {
        if (!valid) {
            for (u32 i = 0; i < 32u; i++) wt[dst + i] = 0.0f;
            return;
        }
        uint4 q = m.w[row_word + c];
        float s = w_scale(m, sc, mi, s_half + c / BLOCK_WORDS);
        u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (u32 j = 0; j < 4u; j++) {
            u32 d = dst + j * 8u;
#pragma unroll
            for (u32 b = 0; b < 4u; b++) {
                wt[d + b] = ((float)((words[j] >> (8u * b)) & 0xfu) - 8.0f) * s;
                wt[d + 4u + b] = ((float)((words[j] >> (8u * b + 4u)) & 0xfu) - 8.0f) * s;
            }
        }
    }
};

// Affine INT4 (src/blocks/quant.rs, kind int4-a32: GGUF's 4-bit experts as they are;
// fmt_q4a.wgsl, tile_q4a.wgsl): the nibbles of FmtQ4, and each word one block with an f16
// scale s and offset o side by side (halves 2c and 2c + 1 of its row), value s (q - 8) + o.
struct FmtQ4A : BlockScales {
    static constexpr u32 WORD_COLS = 32u;

    // Word `c` of the row at word `row_word` (its blocks from half `s_half`), dotted with
    // columns 32c .. 32c + 32 of the activation row at `xb`: s times the nibbles' dot
    // product plus o times the activations' sum, summed as the WGSL does.
    static __device__ __forceinline__ float word_dot(const Mat& m, u32 row_word, u32 c, u32 s_half,
                                                     const Act& a, u32 xb, u32 len) {
        uint4 q = m.w[row_word + c];
        u32 k0 = c * 32u;
        float4 a0 = x_quad(a, xb, k0, len), a1 = x_quad(a, xb, k0 + 4u, len);
        float4 a2 = x_quad(a, xb, k0 + 8u, len), a3 = x_quad(a, xb, k0 + 12u, len);
        float4 a4 = x_quad(a, xb, k0 + 16u, len), a5 = x_quad(a, xb, k0 + 20u, len);
        float4 a6 = x_quad(a, xb, k0 + 24u, len), a7 = x_quad(a, xb, k0 + 28u, len);
        float d = nib_dot8(q.x, a0, a1) + nib_dot8(q.y, a2, a3) + nib_dot8(q.z, a4, a5) +
                  nib_dot8(q.w, a6, a7);
        float4 t = add4(add4(add4(a0, a1), add4(a2, a3)), add4(add4(a4, a5), add4(a6, a7)));
        float sum = dot4(t, make_float4(1.0f, 1.0f, 1.0f, 1.0f));
        return scale(m, s_half + 2u * c) * d + scale(m, s_half + 2u * c + 1u) * sum;
    }
    // Tiled kernels: word `c` of the row at `row_word` of matrix `mi` as 32 f32 columns
    // s (q - 8) + o into the shared weight tile `wt` from index `dst`. Zeros when !valid.
    static __device__ __forceinline__ void stage_word(const Mat& m, const Scales& sc, u32 mi,
                                                      u32 row_word, u32 c, u32 s_half, float* wt,
                                                      u32 dst, bool valid) {
        if (!valid) {
            for (u32 i = 0; i < 32u; i++) wt[dst + i] = 0.0f;
            return;
        }
        uint4 q = m.w[row_word + c];
        float s = w_scale(m, sc, mi, s_half + 2u * c);
        float o = w_scale(m, sc, mi, s_half + 2u * c + 1u);
        u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (u32 j = 0; j < 4u; j++) {
            u32 d = dst + j * 8u;
#pragma unroll
            for (u32 b = 0; b < 4u; b++) {
                wt[d + b] = ((float)((words[j] >> (8u * b)) & 0xfu) - 8.0f) * s + o;
                wt[d + 4u + b] = ((float)((words[j] >> (8u * b + 4u)) & 0xfu) - 8.0f) * s + o;
            }
        }
    }
};

// The K-plane formats (src/blocks/kquant.rs: GGUF's Q4_K, Q5_K, Q6_K and Q5_0/Q5_1 blocks
// as they are; kq_common.wgsl and the record readers fmt_q4k/q5k/q6k/q5a.wgsl): the
// nibbles of FmtQ4, unsigned, and per row side records in the scale section holding a
// block's scales and the bits above the nibble. A word's 32 columns have per half (16
// columns) a and b, the value a q + b with q = nibble + 16 high.
#define KQ_Q4K 0u
#define KQ_Q5K 1u
#define KQ_Q6K 2u
#define KQ_Q5A 3u

struct KTerms {
    float a0, a1, b0, b1;
    // The word's high parts (h1: Q6_K's columns 16..31).
    u32 h0, h1;
};

// A record reader: the row kernels read words from device memory, the tiled kernels from
// the staged scales (BlockScales::w_word).
struct SideMem {
    const u32* ws;
    __device__ __forceinline__ u32 operator()(u32 i) const { return ws[i]; }
};
struct SideStaged {
    const Mat* m;
    const Scales* sc;
    u32 mi;
    __device__ __forceinline__ u32 operator()(u32 i) const {
        return BlockScales::w_word(*m, *sc, mi, i);
    }
};

// The nibbles of a u32 (its low ones, columns 0..3 of its 8; shift by 4 for 4..7), unsigned.
__device__ __forceinline__ float4 nib4(u32 v) {
    return make_float4((float)(v & 0xfu), (float)((v >> 8) & 0xfu), (float)((v >> 16) & 0xfu),
                       (float)((v >> 24) & 0xfu));
}

template <u32 KIND>
struct FmtKQ : BlockScales {
    static constexpr u32 WORD_COLS = 32u;
    // Words of one record, and the words (of 32 columns) it serves.
    static constexpr u32 REC = KIND == KQ_Q4K ? 4u : KIND == KQ_Q5K ? 12u : KIND == KQ_Q6K ? 21u : 2u;
    static constexpr u32 SB = KIND == KQ_Q5A ? 1u : 8u;

    // Byte `i` (0..12) of a Q4_K/Q5_K record's packed scales.
    template <class R>
    static __device__ __forceinline__ u32 sbyte(const R& side, u32 r, u32 i) {
        return (side(r + 1u + i / 4u) >> (8u * (i % 4u))) & 0xffu;
    }

    // The terms of word `j` of the record at word `r`.
    template <class R>
    static __device__ __forceinline__ KTerms terms(const R& side, u32 r, u32 j) {
        KTerms t;
        if (KIND == KQ_Q4K || KIND == KQ_Q5K) {
            u32 sc, mn;
            if (j < 4u) {
                sc = sbyte(side, r, j) & 63u;
                mn = sbyte(side, r, j + 4u) & 63u;
            } else {
                sc = (sbyte(side, r, j + 4u) & 15u) | ((sbyte(side, r, j - 4u) >> 6) << 4);
                mn = (sbyte(side, r, j + 4u) >> 4) | ((sbyte(side, r, j) >> 6) << 4);
            }
            float2 dd = unpack2x16(side(r));
            t.a0 = t.a1 = dd.x * (float)sc;
            t.b0 = t.b1 = -(dd.y * (float)mn);
            t.h0 = KIND == KQ_Q5K ? side(r + 4u + j) : 0u;
            t.h1 = 0u;
        } else if (KIND == KQ_Q6K) {
            // Scales 2j and 2j + 1: bytes 2 (j % 2) and 2 (j % 2) + 1 of word j / 2.
            u32 sw = side(r + j / 2u);
            u32 k = 16u * (j % 2u);
            float s0 = (float)((int)(sw << (24u - k)) >> 24);
            float s1 = (float)((int)(sw << (16u - k)) >> 24);
            float d = unpack2x16(side(r + 4u)).x;
            t.a0 = d * s0;
            t.a1 = d * s1;
            t.b0 = -32.0f * t.a0;
            t.b1 = -32.0f * t.a1;
            t.h0 = side(r + 5u + 2u * j);
            t.h1 = side(r + 6u + 2u * j);
        } else {
            float2 so = unpack2x16(side(r));
            t.a0 = t.a1 = so.x;
            t.b0 = t.b1 = so.y;
            t.h0 = side(r + 1u);
            t.h1 = 0u;
        }
        return t;
    }

    // Columns 4g .. 4g + 4 of the word's high parts, times 16.
    static __device__ __forceinline__ float4 hi4(const KTerms& t, u32 g) {
        if (KIND == KQ_Q5K || KIND == KQ_Q5A) {
            u32 b = t.h0 >> (4u * g);
            return make_float4((float)(b & 1u) * 16.0f, (float)((b >> 1) & 1u) * 16.0f,
                               (float)((b >> 2) & 1u) * 16.0f, (float)((b >> 3) & 1u) * 16.0f);
        }
        if (KIND == KQ_Q6K) {
            u32 b = (g < 4u ? t.h0 : t.h1) >> (8u * (g % 4u));
            return make_float4((float)(b & 3u) * 16.0f, (float)((b >> 2) & 3u) * 16.0f,
                               (float)((b >> 4) & 3u) * 16.0f, (float)((b >> 6) & 3u) * 16.0f);
        }
        return zero4();
    }

    // Word `c` of the row at word `row_word` (its records from half `s_half`), dotted with
    // columns 32c .. 32c + 32 of the activation row at `xb`: per half, a times the q . x
    // sum plus b times the x sum, summed as the WGSL does.
    static __device__ __forceinline__ float word_dot(const Mat& m, u32 row_word, u32 c, u32 s_half,
                                                     const Act& a, u32 xb, u32 len) {
        uint4 q = m.w[row_word + c];
        KTerms t = terms(SideMem{m.ws}, s_half / 2u + (c / SB) * REC, c % SB);
        u32 k0 = c * 32u;
        float4 a0 = x_quad(a, xb, k0, len), a1 = x_quad(a, xb, k0 + 4u, len);
        float4 a2 = x_quad(a, xb, k0 + 8u, len), a3 = x_quad(a, xb, k0 + 12u, len);
        float4 a4 = x_quad(a, xb, k0 + 16u, len), a5 = x_quad(a, xb, k0 + 20u, len);
        float4 a6 = x_quad(a, xb, k0 + 24u, len), a7 = x_quad(a, xb, k0 + 28u, len);
        float d0 = dot4(add4(nib4(q.x), hi4(t, 0u)), a0) + dot4(add4(nib4(q.x >> 4), hi4(t, 1u)), a1) +
                   dot4(add4(nib4(q.y), hi4(t, 2u)), a2) + dot4(add4(nib4(q.y >> 4), hi4(t, 3u)), a3);
        float d1 = dot4(add4(nib4(q.z), hi4(t, 4u)), a4) + dot4(add4(nib4(q.z >> 4), hi4(t, 5u)), a5) +
                   dot4(add4(nib4(q.w), hi4(t, 6u)), a6) + dot4(add4(nib4(q.w >> 4), hi4(t, 7u)), a7);
        float4 one = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
        float s0 = dot4(add4(add4(a0, a1), add4(a2, a3)), one);
        float s1 = dot4(add4(add4(a4, a5), add4(a6, a7)), one);
        return (t.a0 * d0 + t.b0 * s0) + (t.a1 * d1 + t.b1 * s1);
    }
    // Tiled kernels (tile_kq.wgsl): word `c` of the row at `row_word` of matrix `mi` as 32
    // f32 columns a q + b into the shared weight tile `wt` from index `dst`. Zeros when
    // !valid (columns past the row).
    static __device__ __forceinline__ void stage_word(const Mat& m, const Scales& sc, u32 mi,
                                                      u32 row_word, u32 c, u32 s_half, float* wt,
                                                      u32 dst, bool valid) {
        if (!valid) {
            for (u32 i = 0; i < 32u; i++) wt[dst + i] = 0.0f;
            return;
        }
        uint4 q = m.w[row_word + c];
        KTerms t = terms(SideStaged{&m, &sc, mi}, s_half / 2u + (c / SB) * REC, c % SB);
        u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (u32 j = 0; j < 4u; j++) {
            // u32 j holds columns 8j .. 8j + 8: half j / 2 of the word.
            float a = j < 2u ? t.a0 : t.a1;
            float b = j < 2u ? t.b0 : t.b1;
            float4 lo = add4(nib4(words[j]), hi4(t, 2u * j));
            float4 hi = add4(nib4(words[j] >> 4), hi4(t, 2u * j + 1u));
            u32 d = dst + j * 8u;
            wt[d] = lo.x * a + b;
            wt[d + 1u] = lo.y * a + b;
            wt[d + 2u] = lo.z * a + b;
            wt[d + 3u] = lo.w * a + b;
            wt[d + 4u] = hi.x * a + b;
            wt[d + 5u] = hi.y * a + b;
            wt[d + 6u] = hi.z * a + b;
            wt[d + 7u] = hi.w * a + b;
        }
    }
};
typedef FmtKQ<KQ_Q4K> FmtQ4K;
typedef FmtKQ<KQ_Q5K> FmtQ5K;
typedef FmtKQ<KQ_Q6K> FmtQ6K;
typedef FmtKQ<KQ_Q5A> FmtQ5A;

// The four int8 of a u32 (byte 0 first) as f32 (WGSL i8x4 of q8_unpack.wgsl): each byte
// shifted to the top, then an arithmetic shift back sign-extends it.
__device__ __forceinline__ float4 i8x4(u32 v) {
    return make_float4((float)((int)(v << 24) >> 24), (float)((int)(v << 16) >> 24),
                       (float)((int)(v << 8) >> 24), (float)((int)v >> 24));
}

// Q8_0 (src/blocks/q8_0.rs, ggml's blocks split in two sections): a word holds 16
// consecutive columns of one row as int8, one f16 scale per 32-column block (2 words);
// scales from BlockScales.
struct FmtQ8 : BlockScales {
    static constexpr u32 WORD_COLS = 16u;
    // Words per block of one scale.
    static constexpr u32 BLOCK_WORDS = 2u;

    // Word `c` of the row at word `row_word` (its block scales from half `s_half`), dotted
    // with columns 16c .. 16c + 16 of the activation row at `xb` (fmt_q8.wgsl): the quants'
    // dot product in f32, four quads summed in order, times the block's scale.
    static __device__ __forceinline__ float word_dot(const Mat& m, u32 row_word, u32 c, u32 s_half,
                                                     const Act& a, u32 xb, u32 len) {
        uint4 q = m.w[row_word + c];
        u32 k0 = c * 16u;
        float d = dot4(i8x4(q.x), x_quad(a, xb, k0, len)) +
                  dot4(i8x4(q.y), x_quad(a, xb, k0 + 4u, len)) +
                  dot4(i8x4(q.z), x_quad(a, xb, k0 + 8u, len)) +
                  dot4(i8x4(q.w), x_quad(a, xb, k0 + 12u, len));
        return scale(m, s_half + c / BLOCK_WORDS) * d;
    }
    // Tiled kernels (tile_q8.wgsl): word `c` of the row at `row_word` of matrix `mi` (its
    // block scales from half `s_half`) as 16 scaled f32 columns into the shared weight tile
    // `wt` from index `dst`: byte b of u32 j is column 4j + b. Zeros when !valid (columns
    // past the row).
    static __device__ __forceinline__ void stage_word(const Mat& m, const Scales& sc, u32 mi,
                                                      u32 row_word, u32 c, u32 s_half, float* wt,
                                                      u32 dst, bool valid) {
        if (!valid) {
            for (u32 i = 0; i < 16u; i++) wt[dst + i] = 0.0f;
            return;
        }
        uint4 q = m.w[row_word + c];
        float s = w_scale(m, sc, mi, s_half + c / BLOCK_WORDS);
        u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (u32 j = 0; j < 4u; j++) {
            float4 v = i8x4(words[j]);
            u32 d = dst + j * 4u;
            wt[d] = v.x * s;
            wt[d + 1u] = v.y * s;
            wt[d + 2u] = v.z * s;
            wt[d + 3u] = v.w * s;
        }
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

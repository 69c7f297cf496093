//! The kernels' parameter structs, each the byte-for-byte twin of the WGSL `Params` struct
//! of its kernel: same member names in the same order, same offsets (a test compares every
//! member with naga's layout of the WGSL struct), and the flag bits of `common/flags.wgsl`.
//! Backend-neutral: a CUDA kernel receives the same bytes.

use bytemuck::{Pod, Zeroable};

/// Member names and byte offsets of a params struct (checked against the WGSL twin).
pub trait ParamsLayout: Pod {
    const FIELDS: &'static [(&'static str, usize)];
}

macro_rules! params {
    ($( $(#[$m:meta])* pub struct $name:ident { $( $(#[$fm:meta])* pub $f:ident : $t:ty, )* } )*) => {
        $(
            $(#[$m])*
            #[repr(C)]
            #[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
            pub struct $name { $( $(#[$fm])* pub $f: $t, )* }

            impl ParamsLayout for $name {
                const FIELDS: &'static [(&'static str, usize)] =
                    &[$( (stringify!($f), core::mem::offset_of!($name, $f)), )*];
            }
        )*
    };
}

/// Most sequences one batched step holds (`StepUniform::tok`).
pub const MAX_BATCH: usize = 64;

/// The whole step uniform: `Step`, then per token of a batched step (position, first KV
/// row of its sequence, 0, 0); the WGSL twin is `shaders/common/step.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct StepUniform {
    pub step: Step,
    pub tok: [[u32; 4]; MAX_BATCH],
}

/// Bytes of a step uniform buffer.
pub const STEP_BYTES: u64 = std::mem::size_of::<StepUniform>() as u64;

/// Flag bits, one definition each (WGSL twins in `shaders/common/flags.wgsl`).
pub mod flags {
    /// rmsnorm, matmul: compute only the step's last token (into output row 0).
    pub const LAST_TOKEN_ONLY: u32 = 4;
    pub const MATMUL_BIAS: u32 = 1;
    pub const MATMUL_ACCUMULATE: u32 = 2;
    /// ffn_gate_up / ffn_down (f16 SwiGLU): slot 0, not routed (dense MLP, shared expert).
    pub const FFN_FIXED_SLOT: u32 = 1;
    pub const COMBINE_ROUTED: u32 = 1;
    pub const COMBINE_SHARED: u32 = 2;
    pub const COMBINE_SHARED_GATED: u32 = 4;
    /// moe_combine: sum from y only the pairs whose expert has a device slot.
    pub const COMBINE_RESIDENT: u32 = 8;
    /// moe_combine: add the CPU-computed experts' weighted sum (host_y).
    pub const COMBINE_HOST: u32 = 16;
    /// expert_down: add the top-k experts' weighted sum into x (fused combine).
    pub const EXPERT_COMBINE: u32 = 2;
    /// expert_gate_up: compute the token's top-k from the router logits (binding 8) in
    /// every workgroup, router_topk's arithmetic, instead of reading ids (fused routing).
    pub const FFN_ROUTE: u32 = 4;
    /// expert_gate_up with FFN_ROUTE: workgroup (0, 0) of each token writes the ids
    /// (binding 12) and weights (binding 9) for the dispatches after it.
    pub const FFN_ROUTE_WRITE: u32 = 8;
    /// expert_gemm: the down projection (else gate/up + SiLU).
    pub const EXPERT_GEMM_DOWN: u32 = 4;
    pub const ROPE_QK_NORM: u32 = 1;
    pub const ROPE_CLIP: u32 = 2;
    /// rope_kv: RMSNorm of each q and k head over head_dim (one weight vector per side).
    pub const ROPE_QK_NORM_PER_HEAD: u32 = 4;
    pub const ARGMAX_LAST_ROW: u32 = 1;
    /// argmax: each workgroup writes its share's best (value bits, index, non-finite) to
    /// binding 4 (the first of two dispatches on GPUs).
    pub const ARGMAX_PARTS: u32 = 2;
    /// argmax: reduce the `n` parts at binding 4 into the id (the second dispatch).
    pub const ARGMAX_FROM_PARTS: u32 = 4;
    /// matvec_norm: its first workgroup also writes the normalised row (binding 7), for
    /// the step's later consumers of the norm.
    pub const MATVEC_NORM_WRITE: u32 = 8;
    /// attn_flash / attn_combine: a one-token step's key splits follow its position (the
    /// grid's y, at most `splits`); the flash kernel writes how many it launched after the
    /// partial outputs, where the combine reads it.
    pub const ATTN_LIVE_SPLITS: u32 = 1;

    /// Every flag with its WGSL name, for the cross-check.
    pub const ALL: &[(&str, u32)] = &[
        ("LAST_TOKEN_ONLY", LAST_TOKEN_ONLY),
        ("MATMUL_BIAS", MATMUL_BIAS),
        ("MATMUL_ACCUMULATE", MATMUL_ACCUMULATE),
        ("FFN_FIXED_SLOT", FFN_FIXED_SLOT),
        ("COMBINE_ROUTED", COMBINE_ROUTED),
        ("COMBINE_SHARED", COMBINE_SHARED),
        ("COMBINE_SHARED_GATED", COMBINE_SHARED_GATED),
        ("COMBINE_RESIDENT", COMBINE_RESIDENT),
        ("COMBINE_HOST", COMBINE_HOST),
        ("EXPERT_COMBINE", EXPERT_COMBINE),
        ("FFN_ROUTE", FFN_ROUTE),
        ("FFN_ROUTE_WRITE", FFN_ROUTE_WRITE),
        ("EXPERT_GEMM_DOWN", EXPERT_GEMM_DOWN),
        ("ROPE_QK_NORM", ROPE_QK_NORM),
        ("ROPE_CLIP", ROPE_CLIP),
        ("ROPE_QK_NORM_PER_HEAD", ROPE_QK_NORM_PER_HEAD),
        ("ARGMAX_LAST_ROW", ARGMAX_LAST_ROW),
        ("ARGMAX_PARTS", ARGMAX_PARTS),
        ("ARGMAX_FROM_PARTS", ARGMAX_FROM_PARTS),
        ("MATVEC_NORM_WRITE", MATVEC_NORM_WRITE),
        ("ATTN_LIVE_SPLITS", ATTN_LIVE_SPLITS),
    ];
}

/// Size of the uniform window the one-token and window kernels read activations from
/// (the WGSL declares `array<vec4<f32>, 4096>`).
pub const UNIFORM_WINDOW_BYTES: usize = 65536;
/// Tokens per invocation in matmul.wgsl (`TT`).
pub const MATMUL_TOKENS_PER_THREAD: u32 = 4;
/// Tokens one matmul_w.wgsl invocation computes (grid y = ceil(window / this)).
pub const MATMUL_W_TOKENS_PER_THREAD: u32 = 8;
/// Tokens one attention_w.wgsl workgroup serves (grid y = ceil(tokens / this)).
pub const ATTENTION_W_TOKENS: u32 = 8;
/// attention.wgsl keeps one query head in workgroup memory (`MAX_HEAD_DIM`).
pub const ATTENTION_MAX_HEAD_DIM: usize = 512;
/// rope_kv.wgsl's per-head q/k norm keeps one inverse norm per head (`MAX_NORM_HEADS`):
/// query heads + KV heads.
pub const ROPE_MAX_NORM_HEADS: usize = 512;
/// Blocks of one position's keys a q8_0 KV cache may have (shaders/common/kv_store_q8.wgsl
/// keeps their scales, and the values', in workgroup memory).
pub const KV_Q8_MAX_BLOCKS: usize = 512;
/// router_topk.wgsl handles at most this many experts (`MAX_EXPERTS`).
pub const ROUTER_MAX_EXPERTS: usize = 1024;
/// Output rows per workgroup of the expert-major down kernel (ffn_down_q4_e.wgsl).
pub const Q4_DOWN_SORTED_ROWS: usize = 128;
/// attn_flash.wgsl's workgroup memory: floats for the query rows (and for the outputs),
/// for one tile of keys or values, and for a tile's scores; at most this many query rows.
pub const ATTN_FLASH_QD: usize = 1024;
pub const ATTN_FLASH_KVD: usize = 1024;
pub const ATTN_FLASH_PD: usize = 512;
pub const ATTN_FLASH_MAX_QR: usize = 32;
/// Workgroups a GPU-shaped dispatch should have at least to fill a large GPU (a 100-SM
/// part with several resident workgroups each): the K splits and key splits aim at it.
pub const GPU_MIN_WORKGROUPS: usize = 256;
/// Tokens (pairs) per workgroup of the tiled GEMMs (gemm.wgsl, expert_gemm.wgsl) and rows
/// per workgroup: `TM`, `TN`.
pub const GEMM_TOKENS: usize = 16;
pub const GEMM_ROWS: usize = 32;
pub const EXPERT_GEMM_ROWS: usize = 16;
/// Fewest keys per split of one-token attention.
pub const ATTN_MIN_CHUNK: usize = 32;
/// Loop iterations one invocation of a multi-token flash workgroup may spend walking its
/// keys (about head_dim + 64 per key tile): a prefill over a long context splits its keys
/// into chunks of that many tiles, which spreads it over more workgroups on a GPU and keeps
/// each invocation far below llvmpipe's silent cap of 65535 loop iterations.
pub const ATTN_PREFILL_TILE_BUDGET: usize = 16384;
/// Most key splits of a multi-token step (their partial rows are per token).
pub const ATTN_PREFILL_MAX_SPLITS: usize = 64;

params! {
    /// Per-submission state shared by all kernels (binding 1): where the tokens of this
    /// step start in the sequence, how many there are, and the KV cache row where the
    /// sequence starts (a `serve --parallel` slot's region). With `batched` set, the step
    /// holds one token of each of several sequences, each placed by `StepUniform::tok`.
    pub struct Step {
        pub pos0: u32,
        pub n_tokens: u32,
        pub kv0: u32,
        pub batched: u32,
    }

    pub struct EmbedParams {
        pub hidden: u32,
        pub row_start: u32,
        pub rows: u32,
        pub words_per_row: u32,
    }

    pub struct RmsNormParams {
        pub n: u32,
        pub x_stride: u32,
        pub out_stride: u32,
        pub flags: u32,
        pub eps: f32,
        pub _a: u32,
        pub _b: u32,
        pub _c: u32,
    }

    /// matmul.wgsl and matmul_u.wgsl.
    pub struct MatmulParams {
        pub k: u32,
        pub n_rows: u32,
        pub row_base: u32,
        pub vec4_per_row: u32,
        pub x_stride: u32,
        pub out_stride: u32,
        pub flags: u32,
        pub _a: u32,
    }

    /// matmul_w.wgsl: one window of token rows of x, bound as a uniform at `t0 * k * 4`.
    pub struct MatmulWindowParams {
        pub k: u32,
        pub n_rows: u32,
        pub row_base: u32,
        pub vec4_per_row: u32,
        pub t0: u32,
        pub out_stride: u32,
        pub flags: u32,
        pub tw: u32,
    }

    /// matmul_q8_w.wgsl: matmul_w's window of token rows, over a Q8_0 matrix.
    pub struct MatmulQ8WindowParams {
        pub k: u32,
        pub n_rows: u32,
        pub row_base: u32,
        pub words_per_row: u32,
        pub t0: u32,
        pub out_stride: u32,
        pub flags: u32,
        pub tw: u32,
        pub w_row0: u32,
        pub s_word0: u32,
        pub blocks_per_row: u32,
        pub _a: u32,
    }

    pub struct RopeKvParams {
        pub n_heads: u32,
        pub n_kv: u32,
        pub head_dim: u32,
        pub qkv_stride: u32,
        pub flags: u32,
        pub eps: f32,
        pub clip: f32,
        pub rope_rows: u32,
    }

    /// attention.wgsl and attention_w.wgsl.
    pub struct AttentionParams {
        pub n_heads: u32,
        pub n_kv: u32,
        pub head_dim: u32,
        pub scratch_stride: u32,
        pub scale: f32,
        pub _a: u32,
        pub _b: u32,
        pub _c: u32,
    }

    pub struct RouterTopkParams {
        pub n_experts: u32,
        pub top_k: u32,
        pub logits_stride: u32,
        pub norm_topk: u32,
        /// One-token steps: the router's logits arrive as this many partial rows (the
        /// matvec's K splits), added into row 0 first.
        pub splits: u32,
        pub _a: u32,
        pub _b: u32,
        pub _c: u32,
    }

    /// ffn_gate_up.wgsl (f16 SwiGLU, first half).
    pub struct FfnGateUpParams {
        pub hidden: u32,
        pub inter: u32,
        pub top_k: u32,
        pub x_stride: u32,
        pub in_vec4: u32,
        pub slot_vec4: u32,
        pub first_slot: u32,
        pub chunk_slots: u32,
        pub flags: u32,
        /// First top-k index served: the per-expert executor serves one index per dispatch.
        pub j_base: u32,
        pub _a: u32,
        pub _b: u32,
    }

    /// ffn_down.wgsl (f16 SwiGLU, second half).
    pub struct FfnDownParams {
        pub hidden: u32,
        pub inter: u32,
        pub top_k: u32,
        pub in_vec4: u32,
        pub down_vec4: u32,
        pub slot_vec4: u32,
        pub first_slot: u32,
        pub chunk_slots: u32,
        pub flags: u32,
        pub j_base: u32,
        pub _a: u32,
        pub _b: u32,
    }

    /// ffn_gate_up_q4.wgsl (every variant). Offsets are inside one slot: nibbles in
    /// vec4<u32>, scales in u32 words.
    pub struct Q4GateUpParams {
        pub hidden: u32,
        pub inter: u32,
        pub top_k: u32,
        pub j_base: u32,
        pub x_stride: u32,
        pub slot_vec4: u32,
        pub first_slot: u32,
        pub chunk_slots: u32,
        pub gate_q: u32,
        pub up_q: u32,
        pub gate_s: u32,
        pub up_s: u32,
        pub _a: u32,
        pub _b: u32,
        pub _c: u32,
        pub _d: u32,
    }

    /// ffn_down_q4.wgsl and ffn_down_q4_combine.wgsl (every variant).
    pub struct Q4DownParams {
        pub hidden: u32,
        pub inter: u32,
        pub top_k: u32,
        pub j_base: u32,
        pub slot_vec4: u32,
        pub first_slot: u32,
        pub chunk_slots: u32,
        pub down_q: u32,
        pub down_s: u32,
        pub _a: u32,
        pub _b: u32,
        pub _c: u32,
    }

    /// ffn_gate_up_q4_e.wgsl (expert-major, grid y: one workgroup row per expert).
    pub struct Q4GateUpSortedParams {
        pub hidden: u32,
        pub inter: u32,
        pub top_k: u32,
        pub pmax: u32,
        pub x_row4: u32,
        pub h_row: u32,
        pub n_experts: u32,
        pub _a: u32,
        pub slot_vec4: u32,
        pub first_slot: u32,
        pub chunk_slots: u32,
        pub gate_q: u32,
        pub up_q: u32,
        pub gate_s: u32,
        pub up_s: u32,
        pub _b: u32,
    }

    /// ffn_down_q4_e.wgsl (expert-major), writing y [T, k, H].
    pub struct Q4DownSortedParams {
        pub hidden: u32,
        pub inter: u32,
        pub top_k: u32,
        pub pmax: u32,
        pub h_row4: u32,
        pub n_experts: u32,
        pub slot_vec4: u32,
        pub first_slot: u32,
        pub chunk_slots: u32,
        pub down_q: u32,
        pub down_s: u32,
        pub _a: u32,
    }

    pub struct MoeSortParams {
        pub n_experts: u32,
        pub top_k: u32,
        pub pmax: u32,
        pub _a: u32,
    }

    pub struct MoeGatherParams {
        pub hidden: u32,
        pub top_k: u32,
        pub row_stride: u32,
        pub _a: u32,
    }

    pub struct MoeCombineParams {
        pub hidden: u32,
        pub top_k: u32,
        pub flags: u32,
        pub gate_stride: u32,
        pub gate_col: u32,
        pub slots: u32,
        /// One-token steps whose router logits were never summed (fused routing): the gate
        /// logit is the sum of this many partial rows, in order (0 or 1: row t's own).
        pub gate_splits: u32,
        pub _c: u32,
    }

    pub struct ArgmaxParams {
        pub n: u32,
        pub n_suppress: u32,
        pub row_stride: u32,
        pub flags: u32,
        pub suppress: [u32; 4],
    }

    /// matvec.wgsl: a dense weight matrix in 16-byte words (any format) against token rows.
    pub struct DenseParams {
        pub k: u32,
        pub n_rows: u32,
        pub row_base: u32,
        pub words_per_row: u32,
        pub x_stride: u32,
        pub out_stride: u32,
        pub flags: u32,
        /// First row of this dispatch inside the weight binding.
        pub w_row0: u32,
        /// u32 offset of the block scales in their binding (formats with scales).
        pub s_word0: u32,
        pub blocks_per_row: u32,
        /// Rows per workgroup of the matvec (1 to 4; 0 reads as 4): fewer for a matrix
        /// whose rows would leave a dispatch short of GPU_MIN_WORKGROUPS.
        pub group_rows: u32,
        /// matvec_norm: the RMSNorm's epsilon.
        pub eps: f32,
    }

    /// expert_gate_up.wgsl: offsets inside one slot, weights in 16-byte words, scales in
    /// u32 words.
    pub struct ExpertGateUpParams {
        pub hidden: u32,
        pub inter: u32,
        pub top_k: u32,
        pub j_base: u32,
        pub x_stride: u32,
        pub slot_words: u32,
        pub first_slot: u32,
        pub chunk_slots: u32,
        pub gate_w: u32,
        pub up_w: u32,
        pub gate_s: u32,
        pub up_s: u32,
        pub words_per_row: u32,
        pub blocks_per_row: u32,
        pub flags: u32,
        /// FFN_ROUTE: the router's experts, floats per logit row, the matvec's column
        /// splits (partial rows added in order), and whether the top-k is renormalised.
        pub route_experts: u32,
        pub route_stride: u32,
        pub route_splits: u32,
        pub route_norm: u32,
        pub _a: u32,
    }

    /// expert_down.wgsl (per (token, top-k index) into y, or fused into x).
    pub struct ExpertDownParams {
        pub hidden: u32,
        pub inter: u32,
        pub top_k: u32,
        pub j_base: u32,
        pub slot_words: u32,
        pub first_slot: u32,
        pub chunk_slots: u32,
        pub down_w: u32,
        pub down_s: u32,
        pub words_per_row: u32,
        pub blocks_per_row: u32,
        pub flags: u32,
    }

    /// expert_gemm.wgsl: one of an expert slot's matrices (two for gate/up) against the
    /// step's sorted pairs.
    pub struct ExpertGemmParams {
        pub in_dim: u32,
        pub out_dim: u32,
        pub top_k: u32,
        pub pmax: u32,
        pub n_experts: u32,
        pub slot_words: u32,
        pub first_slot: u32,
        pub chunk_slots: u32,
        pub a_w: u32,
        pub b_w: u32,
        pub a_s: u32,
        pub b_s: u32,
        pub words_per_row: u32,
        pub blocks_per_row: u32,
        pub flags: u32,
        pub _a: u32,
    }

    /// attn_flash.wgsl and attn_combine.wgsl.
    pub struct FlashParams {
        pub n_heads: u32,
        pub n_kv: u32,
        pub head_dim: u32,
        pub g_tile: u32,
        pub q_tokens: u32,
        pub tk: u32,
        pub min_chunk: u32,
        pub splits: u32,
        pub scale: f32,
        /// ATTN_LIVE_SPLITS
        pub flags: u32,
        pub _b: u32,
        pub _c: u32,
    }
}

//! Typed keys of the compute kernels: one key per kernel and variant, the key of every
//! backend's pipeline cache. A variant is a combination of axes (where activations come
//! from, how many lanes compute a row, the arithmetic of the products), not a copy of a
//! kernel. Backend-neutral: the wgpu backend assembles WGSL for a key, a CUDA backend
//! would compile its own source for the same key.

use super::params::*;

/// Where a kernel reads its activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Activations {
    /// A storage buffer: any token count.
    Storage,
    /// A 64 KiB uniform window (one-token steps): every lane reads the same address, which
    /// CPU adapters load once for all lanes.
    Uniform,
}

/// Invocations that compute one output row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lanes {
    /// One invocation per row: portable, no subgroup operations.
    One,
    /// Eight lanes of a subgroup per row, combined with shuffles (subgroups of >= 8).
    Eight,
}

/// Arithmetic of the products inside the W4A16 kernels (sums are always f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arith {
    F32,
    /// f16 products within one word of nibbles (SHADER_F16).
    F16,
}

/// One variant of the W4A16 expert kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Q4Variant {
    pub act: Activations,
    pub lanes: Lanes,
    pub arith: Arith,
}

impl Q4Variant {
    pub const PORTABLE: Q4Variant = Q4Variant {
        act: Activations::Storage,
        lanes: Lanes::One,
        arith: Arith::F32,
    };

    /// Every variant (2 x 2 x 2).
    pub fn all() -> Vec<Q4Variant> {
        let mut v = Vec::new();
        for act in [Activations::Storage, Activations::Uniform] {
            for lanes in [Lanes::One, Lanes::Eight] {
                for arith in [Arith::F32, Arith::F16] {
                    v.push(Q4Variant { act, lanes, arith });
                }
            }
        }
        v
    }

    /// Output rows one 64-invocation workgroup computes.
    pub fn rows_per_workgroup(self) -> usize {
        match self.lanes {
            Lanes::One => 64,
            Lanes::Eight => 8,
        }
    }
}

/// How the lanes of a GPU-shaped kernel's workgroup combine their partial sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Reduce {
    /// subgroupAdd, then one value per subgroup through workgroup memory (SUBGROUP).
    Subgroup,
    /// A tree in workgroup memory: portable (`--portable-kernels`).
    Workgroup,
}

/// How a weight matrix's rows are stored: 16-byte words of columns, with or without
/// block scales (the format pieces under `shaders/common/fmt_*.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WeightFormat {
    /// f16, rows padded to 8 halves: 8 columns per word.
    F16,
    /// INT4, block 256, one f16 scale per block (`quant.rs`): 32 columns per word.
    Q4,
    /// Q8_0, ggml's block of 32 int8 with one f16 scale (`blocks/q8_0.rs`): 16 columns per word.
    Q8,
    /// Affine INT4, block 32, an f16 scale and offset per block (`quant.rs`, GGUF's Q4_0):
    /// 32 columns per word.
    Q4A,
    /// GGUF's Q4_K, Q5_K, Q6_K and Q5_0/Q5_1 (Q4_1) blocks as they are (`blocks/kquant.rs`):
    /// nibbles, 32 columns per word, and side records (scales, high bits) per row.
    Q4K,
    Q5K,
    Q6K,
    Q5A,
}

impl WeightFormat {
    pub const ALL: [WeightFormat; 8] = [
        WeightFormat::F16,
        WeightFormat::Q4,
        WeightFormat::Q8,
        WeightFormat::Q4A,
        WeightFormat::Q4K,
        WeightFormat::Q5K,
        WeightFormat::Q6K,
        WeightFormat::Q5A,
    ];

    /// The formats of dense (non-routed) weights: f16, Q8_0, and a GGUF file's 4- to 6-bit
    /// blocks as they are.
    pub fn dense(self) -> bool {
        self != WeightFormat::Q4
    }

    /// The format of an INT4 expert pool of `kind`.
    pub fn int4(kind: crate::blocks::quant::Q4Kind) -> Self {
        use crate::blocks::quant::Q4Kind;
        match kind {
            Q4Kind::Sym256 => WeightFormat::Q4,
            Q4Kind::Affine32 => WeightFormat::Q4A,
            Q4Kind::Q8 => WeightFormat::Q8,
            Q4Kind::Q4K => WeightFormat::Q4K,
            Q4Kind::Q5K => WeightFormat::Q5K,
            Q4Kind::Q6K => WeightFormat::Q6K,
            Q4Kind::Q5A => WeightFormat::Q5A,
        }
    }

    /// The packed kind of a format with block scales (None for f16).
    pub fn q4_kind(self) -> Option<crate::blocks::quant::Q4Kind> {
        use crate::blocks::quant::Q4Kind;
        Some(match self {
            WeightFormat::F16 => return None,
            WeightFormat::Q4 => Q4Kind::Sym256,
            WeightFormat::Q4A => Q4Kind::Affine32,
            WeightFormat::Q8 => Q4Kind::Q8,
            WeightFormat::Q4K => Q4Kind::Q4K,
            WeightFormat::Q5K => Q4Kind::Q5K,
            WeightFormat::Q6K => Q4Kind::Q6K,
            WeightFormat::Q5A => Q4Kind::Q5A,
        })
    }

    /// Columns of one 16-byte word.
    pub fn word_cols(self) -> usize {
        match self {
            WeightFormat::F16 => 8,
            WeightFormat::Q8 => 16,
            _ => 32,
        }
    }

    /// Whether the format has block scales (bound at binding 11).
    pub fn has_scales(self) -> bool {
        self != WeightFormat::F16
    }

    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::F16 => "f16",
            WeightFormat::Q4 => "int4",
            WeightFormat::Q8 => "q8_0",
            WeightFormat::Q4A => "int4-a32",
            WeightFormat::Q4K => "q4_K",
            WeightFormat::Q5K => "q5_K",
            WeightFormat::Q6K => "q6_K",
            WeightFormat::Q5A => "q5-a32",
        }
    }
}

/// How the KV cache holds keys and values (the KV pieces under `shaders/common/`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvFormat {
    F32,
    /// f16, two per u32 (pack2x16float/unpack2x16float: no SHADER_F16 needed).
    F16,
    /// int8 in blocks of 32 along head_dim (one block per head row when head_dim is not a
    /// multiple of 32), one f32 scale per block, rounded as ggml's Q8_0: each position's
    /// row holds its values (4 per u32, the last word zero-padded) then its scales, so a
    /// word has one writer (ggml's f16 scales would put two blocks' scales in one word).
    Q8,
}

impl KvFormat {
    pub const ALL: [KvFormat; 3] = [KvFormat::F32, KvFormat::F16, KvFormat::Q8];

    /// Bytes of one position's keys (or values) of one layer: `kv_dim` values of heads of
    /// `head_dim` (rounded up to whole u32 words).
    pub fn row_bytes(self, kv_dim: usize, head_dim: usize) -> usize {
        match self {
            KvFormat::F32 => 4 * kv_dim,
            KvFormat::F16 => 4 * kv_dim.div_ceil(2),
            KvFormat::Q8 => 4 * crate::blocks::q8_0::kv::row_words(kv_dim, head_dim),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvFormat::F32 => "f32",
            KvFormat::F16 => "f16",
            KvFormat::Q8 => "q8_0",
        }
    }
}

/// One variant of the GPU-shaped row kernels (matvec, expert gate/up and down): the
/// weights' format and how partial sums are reduced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RowsVariant {
    pub format: WeightFormat,
    pub reduce: Reduce,
}

impl RowsVariant {
    /// Every variant (4 formats x 2 reductions; a kernel family takes the formats of its
    /// weights).
    pub fn all() -> Vec<RowsVariant> {
        let mut v = Vec::new();
        for format in WeightFormat::ALL {
            for reduce in [Reduce::Subgroup, Reduce::Workgroup] {
                v.push(RowsVariant { format, reduce });
            }
        }
        v
    }
}

/// Rows of a weight matrix one workgroup of the row kernels serves (`ROWS` in the WGSL).
pub const ROWS_PER_WORKGROUP: usize = 4;

/// A compute kernel (and variant): the typed pipeline key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kernel {
    Embed,
    RmsNorm,
    /// f16 matmul, activations in storage, 4 tokens per invocation.
    Matmul,
    /// Q8_0 matmul of the storage plan (CPU adapters): a row and 4 tokens per invocation.
    MatmulQ8,
    /// Q8_0 matmul of one token, activations in a uniform window (CPU adapters).
    MatmulQ8Uniform,
    /// Q8_0 matmul of a window of up to 8 tokens per invocation (subgroups >= 8).
    MatmulQ8Window,
    /// f16 matmul of one token, activations in a uniform window.
    MatmulUniform,
    /// f16 matmul of a window of up to 8 tokens per invocation (subgroups >= 8).
    MatmulWindow,
    RopeKv(KvFormat),
    /// Attention, one workgroup per (head, token).
    Attention(KvFormat),
    /// Attention, one workgroup per (head, 8 tokens) sharing K/V loads (subgroups >= 8).
    AttentionWindow(KvFormat),
    RouterTopk,
    /// f16 SwiGLU first / second half (routed f16 experts, shared expert, dense MLP).
    FfnGateUp,
    FfnDown,
    /// W4A16 SwiGLU first / second half.
    Q4GateUp(Q4Variant),
    Q4Down(Q4Variant),
    /// W4A16 second half with the weighted combine fused: adds into the residual stream.
    Q4DownCombine(Q4Variant),
    /// Expert-major W4A16 halves over pairs sorted by expert (prefill; subgroups >= 8).
    Q4GateUpSorted,
    Q4DownSorted,
    MoeSort,
    MoeGather,
    MoeCombine,
    Argmax,
    /// GPU-shaped matrix-vector product: a workgroup per 4 rows, lanes along K.
    Matvec(RowsVariant),
    /// The matvec with the RMSNorm of its input applied on load (one-token steps: the
    /// norm folded into its consumer, no norm dispatch).
    MatvecNorm(RowsVariant),
    /// GPU-shaped SwiGLU halves over an expert pool (or one fixed slot).
    ExpertGateUp(RowsVariant),
    ExpertDown(RowsVariant),
    /// Flash attention: a workgroup per (KV head, key split, tokens), keys tiled in
    /// workgroup memory; `AttnCombine` merges the splits of one-token steps.
    AttnFlash(KvFormat),
    AttnCombine,
    /// Tiled GEMM (prefill): a workgroup per 16 tokens x 32 rows, tiles in workgroup
    /// memory.
    Gemm(WeightFormat),
    /// Tiled GEMM over an expert's sorted (token, top-k) pairs: gate/up + SiLU, or down.
    ExpertGemm(WeightFormat),
}

impl Kernel {
    /// Every kernel and variant a backend may be asked for.
    pub fn all() -> Vec<Kernel> {
        let mut v = vec![
            Kernel::Embed,
            Kernel::RmsNorm,
            Kernel::Matmul,
            Kernel::MatmulQ8,
            Kernel::MatmulQ8Uniform,
            Kernel::MatmulQ8Window,
            Kernel::MatmulUniform,
            Kernel::MatmulWindow,
        ];
        for kv in KvFormat::ALL {
            v.extend([
                Kernel::RopeKv(kv),
                Kernel::Attention(kv),
                Kernel::AttentionWindow(kv),
                Kernel::AttnFlash(kv),
            ]);
        }
        v.extend([Kernel::RouterTopk, Kernel::FfnGateUp, Kernel::FfnDown]);
        for q in Q4Variant::all() {
            v.push(Kernel::Q4GateUp(q));
            v.push(Kernel::Q4Down(q));
            v.push(Kernel::Q4DownCombine(q));
        }
        v.extend([
            Kernel::Q4GateUpSorted,
            Kernel::Q4DownSorted,
            Kernel::MoeSort,
            Kernel::MoeGather,
            Kernel::MoeCombine,
            Kernel::Argmax,
        ]);
        for r in RowsVariant::all() {
            if r.format.dense() {
                v.push(Kernel::Matvec(r));
                v.push(Kernel::MatvecNorm(r));
            }
            // Every format: Q8_0 for shared experts and dense MLPs.
            v.push(Kernel::ExpertGateUp(r));
            v.push(Kernel::ExpertDown(r));
        }
        v.push(Kernel::AttnCombine);
        for f in WeightFormat::ALL {
            if f.dense() {
                v.push(Kernel::Gemm(f));
            }
            v.push(Kernel::ExpertGemm(f));
        }
        v
    }

    /// The kernel's source file (its body) under `shaders/`, without `.wgsl`.
    pub fn family(self) -> &'static str {
        match self {
            Kernel::Embed => "embed",
            Kernel::RmsNorm => "rmsnorm",
            Kernel::Matmul => "matmul",
            Kernel::MatmulQ8 => "matmul_q8",
            Kernel::MatmulQ8Uniform => "matmul_q8_u",
            Kernel::MatmulQ8Window => "matmul_q8_w",
            Kernel::MatmulUniform => "matmul_u",
            Kernel::MatmulWindow => "matmul_w",
            Kernel::RopeKv(_) => "rope_kv",
            Kernel::Attention(_) => "attention",
            Kernel::AttentionWindow(_) => "attention_w",
            Kernel::RouterTopk => "router_topk",
            Kernel::FfnGateUp => "ffn_gate_up",
            Kernel::FfnDown => "ffn_down",
            Kernel::Q4GateUp(_) => "ffn_gate_up_q4",
            Kernel::Q4Down(_) => "ffn_down_q4",
            Kernel::Q4DownCombine(_) => "ffn_down_q4_combine",
            Kernel::Q4GateUpSorted => "ffn_gate_up_q4_e",
            Kernel::Q4DownSorted => "ffn_down_q4_e",
            Kernel::MoeSort => "moe_sort",
            Kernel::MoeGather => "moe_gather",
            Kernel::MoeCombine => "moe_combine",
            Kernel::Argmax => "argmax",
            Kernel::Matvec(_) | Kernel::MatvecNorm(_) => "matvec",
            Kernel::ExpertGateUp(_) => "expert_gate_up",
            Kernel::ExpertDown(_) => "expert_down",
            Kernel::AttnFlash(_) => "attn_flash",
            Kernel::AttnCombine => "attn_combine",
            Kernel::Gemm(_) => "gemm",
            Kernel::ExpertGemm(_) => "expert_gemm",
        }
    }

    /// A readable name with the variant's axes (labels, profiles, errors).
    pub fn name(self) -> String {
        match self {
            Kernel::Q4GateUp(q) | Kernel::Q4Down(q) | Kernel::Q4DownCombine(q) => format!(
                "{}[{},{},{}]",
                self.family(),
                match q.act {
                    Activations::Storage => "storage",
                    Activations::Uniform => "uniform",
                },
                match q.lanes {
                    Lanes::One => "1 lane",
                    Lanes::Eight => "8 lanes",
                },
                match q.arith {
                    Arith::F32 => "f32",
                    Arith::F16 => "f16",
                }
            ),
            Kernel::Matvec(r)
            | Kernel::MatvecNorm(r)
            | Kernel::ExpertGateUp(r)
            | Kernel::ExpertDown(r) => format!(
                "{}[{},{}]",
                if matches!(self, Kernel::MatvecNorm(_)) {
                    "matvec_norm"
                } else {
                    self.family()
                },
                r.format.name(),
                match r.reduce {
                    Reduce::Subgroup => "subgroup",
                    Reduce::Workgroup => "workgroup",
                }
            ),
            Kernel::Gemm(f) | Kernel::ExpertGemm(f) => format!("{}[{}]", self.family(), f.name()),
            Kernel::RopeKv(kv)
            | Kernel::Attention(kv)
            | Kernel::AttentionWindow(kv)
            | Kernel::AttnFlash(kv) => match kv {
                KvFormat::F32 => self.family().to_string(),
                KvFormat::F16 | KvFormat::Q8 => format!("{}[{} kv]", self.family(), kv.name()),
            },
            _ => self.family().to_string(),
        }
    }

    /// The weight format of a kernel that reads weights through a format piece.
    pub fn weight_format(self) -> Option<WeightFormat> {
        match self {
            Kernel::Matvec(r)
            | Kernel::MatvecNorm(r)
            | Kernel::ExpertGateUp(r)
            | Kernel::ExpertDown(r) => Some(r.format),
            Kernel::Gemm(f) | Kernel::ExpertGemm(f) => Some(f),
            _ => None,
        }
    }

    pub fn rows_variant(self) -> Option<RowsVariant> {
        match self {
            Kernel::Matvec(r)
            | Kernel::MatvecNorm(r)
            | Kernel::ExpertGateUp(r)
            | Kernel::ExpertDown(r) => Some(r),
            _ => None,
        }
    }

    pub fn q4_variant(self) -> Option<Q4Variant> {
        match self {
            Kernel::Q4GateUp(q) | Kernel::Q4Down(q) | Kernel::Q4DownCombine(q) => Some(q),
            _ => None,
        }
    }

    /// Whether the kernel uses subgroup operations (subgroups of at least 8 lanes).
    pub fn needs_subgroups(self) -> bool {
        match self {
            Kernel::MatmulWindow
            | Kernel::MatmulQ8Window
            | Kernel::AttentionWindow(_)
            | Kernel::Q4GateUpSorted
            | Kernel::Q4DownSorted => true,
            Kernel::Q4GateUp(q) | Kernel::Q4Down(q) | Kernel::Q4DownCombine(q) => {
                q.lanes == Lanes::Eight
            }
            Kernel::Matvec(r)
            | Kernel::MatvecNorm(r)
            | Kernel::ExpertGateUp(r)
            | Kernel::ExpertDown(r) => r.reduce == Reduce::Subgroup,
            _ => false,
        }
    }

    /// Invocations per workgroup (the WGSL `@workgroup_size`; tests/shaders.rs checks it).
    pub fn workgroup_size(self) -> u32 {
        match self {
            Kernel::Argmax => 256,
            Kernel::MoeSort => 1,
            _ => 64,
        }
    }

    /// Whether the kernel calls the memory-access probe at its global loads (a probe
    /// build binds the counters at binding 14).
    pub fn probed(self) -> bool {
        matches!(
            self,
            Kernel::Embed
                | Kernel::RmsNorm
                | Kernel::RopeKv(_)
                | Kernel::RouterTopk
                | Kernel::MoeCombine
                | Kernel::Argmax
                | Kernel::Matmul
                | Kernel::MatmulQ8
                | Kernel::MatmulQ8Uniform
                | Kernel::MatmulQ8Window
                | Kernel::MatmulUniform
                | Kernel::Attention(_)
                | Kernel::FfnGateUp
                | Kernel::FfnDown
                | Kernel::Q4GateUp(_)
                | Kernel::Q4Down(_)
                | Kernel::Q4DownCombine(_)
                | Kernel::Q4GateUpSorted
                | Kernel::Q4DownSorted
                | Kernel::Matvec(_)
                | Kernel::MatvecNorm(_)
                | Kernel::ExpertGateUp(_)
                | Kernel::ExpertDown(_)
                | Kernel::AttnFlash(_)
                | Kernel::AttnCombine
                | Kernel::Gemm(_)
                | Kernel::ExpertGemm(_)
        )
    }

    /// The fewest subgroup lanes a subgroup kernel is written for: 8 for the kernels that
    /// give a row to 8 lanes (and the window / expert-major ones), 1 for the GPU-shaped
    /// kernels, whose reduction works at any subgroup size.
    pub fn min_subgroup_size(self) -> u32 {
        match self {
            Kernel::Matvec(_)
            | Kernel::MatvecNorm(_)
            | Kernel::ExpertGateUp(_)
            | Kernel::ExpertDown(_) => 1,
            _ => 8,
        }
    }

    /// Whether the kernel uses f16 arithmetic (SHADER_F16).
    pub fn needs_f16(self) -> bool {
        self.q4_variant().is_some_and(|q| q.arith == Arith::F16)
    }

    /// Whether binding 2 is a 64 KiB uniform window rather than a storage buffer.
    pub fn uniform_activations(self) -> bool {
        match self {
            Kernel::MatmulUniform
            | Kernel::MatmulWindow
            | Kernel::MatmulQ8Uniform
            | Kernel::MatmulQ8Window => true,
            Kernel::Q4GateUp(q) | Kernel::Q4Down(q) | Kernel::Q4DownCombine(q) => {
                q.act == Activations::Uniform
            }
            _ => false,
        }
    }

    /// Member names/offsets and size of the kernel's params struct.
    pub fn params_layout(self) -> (&'static [(&'static str, usize)], usize) {
        fn of<P: ParamsLayout>() -> (&'static [(&'static str, usize)], usize) {
            (P::FIELDS, std::mem::size_of::<P>())
        }
        match self {
            Kernel::Embed => of::<EmbedParams>(),
            Kernel::RmsNorm => of::<RmsNormParams>(),
            Kernel::Matmul | Kernel::MatmulUniform => of::<MatmulParams>(),
            Kernel::MatmulWindow => of::<MatmulWindowParams>(),
            Kernel::MatmulQ8Window => of::<MatmulQ8WindowParams>(),
            Kernel::RopeKv(_) => of::<RopeKvParams>(),
            Kernel::Attention(_) | Kernel::AttentionWindow(_) => of::<AttentionParams>(),
            Kernel::RouterTopk => of::<RouterTopkParams>(),
            Kernel::FfnGateUp => of::<FfnGateUpParams>(),
            Kernel::FfnDown => of::<FfnDownParams>(),
            Kernel::Q4GateUp(_) => of::<Q4GateUpParams>(),
            Kernel::Q4Down(_) | Kernel::Q4DownCombine(_) => of::<Q4DownParams>(),
            Kernel::Q4GateUpSorted => of::<Q4GateUpSortedParams>(),
            Kernel::Q4DownSorted => of::<Q4DownSortedParams>(),
            Kernel::MoeSort => of::<MoeSortParams>(),
            Kernel::MoeGather => of::<MoeGatherParams>(),
            Kernel::MoeCombine => of::<MoeCombineParams>(),
            Kernel::Argmax => of::<ArgmaxParams>(),
            Kernel::Matvec(_)
            | Kernel::MatvecNorm(_)
            | Kernel::MatmulQ8
            | Kernel::MatmulQ8Uniform => of::<DenseParams>(),
            Kernel::ExpertGateUp(_) => of::<ExpertGateUpParams>(),
            Kernel::ExpertDown(_) => of::<ExpertDownParams>(),
            Kernel::AttnFlash(_) | Kernel::AttnCombine => of::<FlashParams>(),
            Kernel::Gemm(_) => of::<DenseParams>(),
            Kernel::ExpertGemm(_) => of::<ExpertGemmParams>(),
        }
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

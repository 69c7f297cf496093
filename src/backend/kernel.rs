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

/// A compute kernel (and variant): the typed pipeline key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kernel {
    Embed,
    RmsNorm,
    /// f16 matmul, activations in storage, 4 tokens per invocation.
    Matmul,
    /// f16 matmul of one token, activations in a uniform window.
    MatmulUniform,
    /// f16 matmul of a window of up to 8 tokens per invocation (subgroups >= 8).
    MatmulWindow,
    RopeKv,
    /// Attention, one workgroup per (head, token).
    Attention,
    /// Attention, one workgroup per (head, 8 tokens) sharing K/V loads (subgroups >= 8).
    AttentionWindow,
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
}

impl Kernel {
    /// Every kernel and variant a backend may be asked for.
    pub fn all() -> Vec<Kernel> {
        let mut v = vec![
            Kernel::Embed,
            Kernel::RmsNorm,
            Kernel::Matmul,
            Kernel::MatmulUniform,
            Kernel::MatmulWindow,
            Kernel::RopeKv,
            Kernel::Attention,
            Kernel::AttentionWindow,
            Kernel::RouterTopk,
            Kernel::FfnGateUp,
            Kernel::FfnDown,
        ];
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
        v
    }

    /// The kernel's source file (its body) under `shaders/`, without `.wgsl`.
    pub fn family(self) -> &'static str {
        match self {
            Kernel::Embed => "embed",
            Kernel::RmsNorm => "rmsnorm",
            Kernel::Matmul => "matmul",
            Kernel::MatmulUniform => "matmul_u",
            Kernel::MatmulWindow => "matmul_w",
            Kernel::RopeKv => "rope_kv",
            Kernel::Attention => "attention",
            Kernel::AttentionWindow => "attention_w",
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
            _ => self.family().to_string(),
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
            | Kernel::AttentionWindow
            | Kernel::Q4GateUpSorted
            | Kernel::Q4DownSorted => true,
            Kernel::Q4GateUp(q) | Kernel::Q4Down(q) | Kernel::Q4DownCombine(q) => {
                q.lanes == Lanes::Eight
            }
            _ => false,
        }
    }

    /// Whether the kernel uses f16 arithmetic (SHADER_F16).
    pub fn needs_f16(self) -> bool {
        self.q4_variant().is_some_and(|q| q.arith == Arith::F16)
    }

    /// Whether binding 2 is a 64 KiB uniform window rather than a storage buffer.
    pub fn uniform_activations(self) -> bool {
        match self {
            Kernel::MatmulUniform | Kernel::MatmulWindow => true,
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
            Kernel::RopeKv => of::<RopeKvParams>(),
            Kernel::Attention | Kernel::AttentionWindow => of::<AttentionParams>(),
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
        }
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

//! The WGSL kernels, their parameter structs (each the byte-for-byte twin of the WGSL
//! `Params` struct; a test checks the sizes against naga's layout) and their pipelines.

use bytemuck::{Pod, Zeroable};

/// One variant per shader file; the typed key of the pipeline cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    Embed,
    RmsNorm,
    Matmul,
    RopeKv,
    Attention,
    RouterTopk,
    FfnGateUp,
    FfnDown,
    MoeCombine,
    Argmax,
    FfnGateUpQ4,
    FfnDownQ4,
    FfnGateUpQ4Sg,
    FfnDownQ4Sg,
    FfnGateUpQ4U,
    FfnDownQ4U,
    MatmulU,
    FfnGateUpQ4SgH,
    FfnDownQ4SgH,
    MatmulW,
    MoeSort,
    MoeGather,
    FfnGateUpQ4E,
    FfnDownQ4E,
    AttentionW,
}

impl Kernel {
    pub const ALL: [Kernel; 25] = [
        Kernel::Embed,
        Kernel::RmsNorm,
        Kernel::Matmul,
        Kernel::RopeKv,
        Kernel::Attention,
        Kernel::RouterTopk,
        Kernel::FfnGateUp,
        Kernel::FfnDown,
        Kernel::MoeCombine,
        Kernel::Argmax,
        Kernel::FfnGateUpQ4,
        Kernel::FfnDownQ4,
        Kernel::FfnGateUpQ4Sg,
        Kernel::FfnDownQ4Sg,
        Kernel::FfnGateUpQ4U,
        Kernel::FfnDownQ4U,
        Kernel::MatmulU,
        Kernel::FfnGateUpQ4SgH,
        Kernel::FfnDownQ4SgH,
        Kernel::MatmulW,
        Kernel::MoeSort,
        Kernel::MoeGather,
        Kernel::FfnGateUpQ4E,
        Kernel::FfnDownQ4E,
        Kernel::AttentionW,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Embed => "embed",
            Kernel::RmsNorm => "rmsnorm",
            Kernel::Matmul => "matmul",
            Kernel::RopeKv => "rope_kv",
            Kernel::Attention => "attention",
            Kernel::RouterTopk => "router_topk",
            Kernel::FfnGateUp => "ffn_gate_up",
            Kernel::FfnDown => "ffn_down",
            Kernel::MoeCombine => "moe_combine",
            Kernel::Argmax => "argmax",
            Kernel::FfnGateUpQ4 => "ffn_gate_up_q4",
            Kernel::FfnDownQ4 => "ffn_down_q4",
            Kernel::FfnGateUpQ4Sg => "ffn_gate_up_q4_sg",
            Kernel::FfnDownQ4Sg => "ffn_down_q4_sg",
            Kernel::FfnGateUpQ4U => "ffn_gate_up_q4_u",
            Kernel::FfnDownQ4U => "ffn_down_q4_u",
            Kernel::MatmulU => "matmul_u",
            Kernel::FfnGateUpQ4SgH => "ffn_gate_up_q4_sg_h",
            Kernel::FfnDownQ4SgH => "ffn_down_q4_sg_h",
            Kernel::MatmulW => "matmul_w",
            Kernel::MoeSort => "moe_sort",
            Kernel::MoeGather => "moe_gather",
            Kernel::FfnGateUpQ4E => "ffn_gate_up_q4_e",
            Kernel::FfnDownQ4E => "ffn_down_q4_e",
            Kernel::AttentionW => "attention_w",
        }
    }

    pub fn source(self) -> &'static str {
        match self {
            Kernel::Embed => include_str!("../../shaders/embed.wgsl"),
            Kernel::RmsNorm => include_str!("../../shaders/rmsnorm.wgsl"),
            Kernel::Matmul => include_str!("../../shaders/matmul.wgsl"),
            Kernel::RopeKv => include_str!("../../shaders/rope_kv.wgsl"),
            Kernel::Attention => include_str!("../../shaders/attention.wgsl"),
            Kernel::RouterTopk => include_str!("../../shaders/router_topk.wgsl"),
            Kernel::FfnGateUp => include_str!("../../shaders/ffn_gate_up.wgsl"),
            Kernel::FfnDown => include_str!("../../shaders/ffn_down.wgsl"),
            Kernel::MoeCombine => include_str!("../../shaders/moe_combine.wgsl"),
            Kernel::Argmax => include_str!("../../shaders/argmax.wgsl"),
            Kernel::FfnGateUpQ4 => include_str!("../../shaders/ffn_gate_up_q4.wgsl"),
            Kernel::FfnDownQ4 => include_str!("../../shaders/ffn_down_q4.wgsl"),
            Kernel::FfnGateUpQ4Sg => include_str!("../../shaders/ffn_gate_up_q4_sg.wgsl"),
            Kernel::FfnDownQ4Sg => include_str!("../../shaders/ffn_down_q4_sg.wgsl"),
            Kernel::FfnGateUpQ4U => include_str!("../../shaders/ffn_gate_up_q4_u.wgsl"),
            Kernel::FfnDownQ4U => include_str!("../../shaders/ffn_down_q4_u.wgsl"),
            Kernel::MatmulU => include_str!("../../shaders/matmul_u.wgsl"),
            Kernel::FfnGateUpQ4SgH => include_str!("../../shaders/ffn_gate_up_q4_sg_h.wgsl"),
            Kernel::FfnDownQ4SgH => include_str!("../../shaders/ffn_down_q4_sg_h.wgsl"),
            Kernel::MatmulW => include_str!("../../shaders/matmul_w.wgsl"),
            Kernel::MoeSort => include_str!("../../shaders/moe_sort.wgsl"),
            Kernel::MoeGather => include_str!("../../shaders/moe_gather.wgsl"),
            Kernel::FfnGateUpQ4E => include_str!("../../shaders/ffn_gate_up_q4_e.wgsl"),
            Kernel::FfnDownQ4E => include_str!("../../shaders/ffn_down_q4_e.wgsl"),
            Kernel::AttentionW => include_str!("../../shaders/attention_w.wgsl"),
        }
    }

    /// Size in bytes of the kernel's `Params` struct on the Rust side.
    /// Whether the kernel uses subgroup operations (built only where SUBGROUP exists with
    /// subgroups of at least 8 lanes).
    pub fn needs_subgroups(self) -> bool {
        matches!(
            self,
            Kernel::MatmulW
                | Kernel::AttentionW
                | Kernel::FfnGateUpQ4E
                | Kernel::FfnDownQ4E
                | Kernel::FfnGateUpQ4Sg
                | Kernel::FfnDownQ4Sg
                | Kernel::FfnGateUpQ4SgH
                | Kernel::FfnDownQ4SgH
        )
    }

    /// Whether the kernel uses f16 arithmetic (built only where SHADER_F16 exists).
    pub fn needs_f16(self) -> bool {
        matches!(self, Kernel::FfnGateUpQ4SgH | Kernel::FfnDownQ4SgH)
    }

    /// Whether binding 2 (the activations) is a 64 KiB uniform window rather than storage.
    pub fn uniform_activation(self) -> bool {
        matches!(
            self,
            Kernel::FfnGateUpQ4U | Kernel::FfnDownQ4U | Kernel::MatmulU | Kernel::MatmulW
        )
    }

    /// Output rows one workgroup computes (the grid's x dimension is ceil(rows / this)).
    pub fn rows_per_workgroup(self) -> usize {
        if matches!(
            self,
            Kernel::FfnGateUpQ4Sg
                | Kernel::FfnDownQ4Sg
                | Kernel::FfnGateUpQ4SgH
                | Kernel::FfnDownQ4SgH
        ) {
            8
        } else {
            64
        }
    }

    pub fn params_size(self) -> usize {
        use std::mem::size_of;
        match self {
            Kernel::Embed => size_of::<EmbedParams>(),
            Kernel::RmsNorm => size_of::<RmsNormParams>(),
            Kernel::Matmul | Kernel::MatmulU => size_of::<MatmulParams>(),
            Kernel::RopeKv => size_of::<RopeKvParams>(),
            Kernel::Attention | Kernel::AttentionW => size_of::<AttentionParams>(),
            Kernel::RouterTopk => size_of::<RouterTopkParams>(),
            Kernel::FfnGateUp => size_of::<FfnGateUpParams>(),
            Kernel::FfnDown => size_of::<FfnDownParams>(),
            Kernel::MoeCombine => size_of::<MoeCombineParams>(),
            Kernel::Argmax => size_of::<ArgmaxParams>(),
            Kernel::FfnGateUpQ4
            | Kernel::FfnDownQ4
            | Kernel::FfnGateUpQ4Sg
            | Kernel::FfnDownQ4Sg
            | Kernel::FfnGateUpQ4U
            | Kernel::FfnDownQ4U
            | Kernel::FfnGateUpQ4SgH
            | Kernel::FfnDownQ4SgH => size_of::<FfnQ4Params>(),
            Kernel::MatmulW => size_of::<MatmulWParams>(),
            Kernel::MoeSort => size_of::<MoeSortParams>(),
            Kernel::MoeGather => size_of::<MoeGatherParams>(),
            Kernel::FfnGateUpQ4E | Kernel::FfnDownQ4E => size_of::<FfnQ4EParams>(),
        }
    }
}

/// Per-submission state shared by all kernels: where the tokens of this step start in the
/// sequence and how many there are.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Step {
    pub pos0: u32,
    pub n_tokens: u32,
    pub _pad: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct EmbedParams {
    pub hidden: u32,
    pub row_start: u32,
    pub rows: u32,
    pub words_per_row: u32,
}

pub const LAST_TOKEN_ONLY: u32 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct RmsNormParams {
    pub n: u32,
    pub x_stride: u32,
    pub out_stride: u32,
    pub flags: u32,
    pub eps: f32,
    pub _pad: [u32; 3],
}

pub mod matmul_flags {
    pub const BIAS: u32 = 1;
    pub const ACCUMULATE: u32 = 2;
    pub const LAST_TOKEN_ONLY: u32 = 4;
}
/// Tokens per invocation in matmul.wgsl (`TT`).
pub const MATMUL_TOKENS_PER_THREAD: u32 = 4;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct MatmulParams {
    pub k: u32,
    pub n_rows: u32,
    pub row_base: u32,
    pub vec4_per_row: u32,
    pub x_stride: u32,
    pub out_stride: u32,
    pub flags: u32,
    pub _pad: u32,
}

pub mod rope_flags {
    pub const QK_NORM: u32 = 1;
    pub const CLIP: u32 = 2;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
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

/// Tokens one attention_w.wgsl workgroup serves (grid y = ceil(tokens / this)).
pub const ATTENTION_W_TOKENS: u32 = 8;

/// attention.wgsl keeps one query head in workgroup memory.
pub const ATTENTION_MAX_HEAD_DIM: usize = 512;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct AttentionParams {
    pub n_heads: u32,
    pub n_kv: u32,
    pub head_dim: u32,
    pub scratch_stride: u32,
    pub scale: f32,
    pub _pad: [u32; 3],
}

/// router_topk.wgsl keeps one token's probabilities in workgroup memory.
pub const ROUTER_MAX_EXPERTS: usize = 1024;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct RouterTopkParams {
    pub n_experts: u32,
    pub top_k: u32,
    pub logits_stride: u32,
    pub norm_topk: u32,
}

pub const FFN_FIXED_SLOT: u32 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
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
    pub _pad: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
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
    /// First top-k index served: the per-expert executor serves one index per dispatch.
    pub j_base: u32,
    pub _pad: [u32; 2],
}

/// Parameters of the W4A16 expert kernels (ffn_gate_up_q4 reads `a` = gate and `b` = up;
/// ffn_down_q4 reads `a` = down). Offsets are inside one slot: nibbles in vec4<u32>,
/// scales in u32 words.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct FfnQ4Params {
    pub hidden: u32,
    pub inter: u32,
    pub top_k: u32,
    pub j_base: u32,
    pub x_stride: u32,
    pub slot_vec4: u32,
    pub first_slot: u32,
    pub chunk_slots: u32,
    pub a_q: u32,
    pub b_q: u32,
    pub a_s: u32,
    pub b_s: u32,
    pub flags: u32,
    pub _pad: [u32; 3],
}

/// matmul_w.wgsl: one window of token rows of x, bound as a uniform at `t0 * k * 4`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct MatmulWParams {
    pub k: u32,
    pub n_rows: u32,
    pub row_base: u32,
    pub vec4_per_row: u32,
    pub t0: u32,
    pub out_stride: u32,
    pub flags: u32,
    pub tw: u32,
}

/// Tokens one matmul_w.wgsl invocation computes (grid y = ceil(window / this)).
pub const MATMUL_W_TOKENS_PER_THREAD: u32 = 8;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct MoeSortParams {
    pub n_experts: u32,
    pub top_k: u32,
    pub pmax: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct MoeGatherParams {
    pub hidden: u32,
    pub top_k: u32,
    pub row_stride: u32,
    pub _pad: u32,
}

/// Parameters of the expert-major W4A16 kernels (grid y: one workgroup row per expert).
/// ffn_gate_up_q4_e reads `a` = gate and `b` = up; ffn_down_q4_e reads `a` = down.
/// `in_row4`: vec4s per sorted input row; `out_row`: floats per output row (gate/up; down
/// writes [T, k, H]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct FfnQ4EParams {
    pub hidden: u32,
    pub inter: u32,
    pub top_k: u32,
    pub pmax: u32,
    pub in_row4: u32,
    pub out_row: u32,
    pub n_experts: u32,
    pub _t: u32,
    pub slot_vec4: u32,
    pub first_slot: u32,
    pub chunk_slots: u32,
    pub a_q: u32,
    pub b_q: u32,
    pub a_s: u32,
    pub b_s: u32,
    pub _pad: u32,
}

/// Size of the uniform window the decode W4A16 kernels read activations from.
pub const UNIFORM_ACTIVATION_BYTES: usize = 65536;

/// ffn_down_q4: add the weighted sum over the top-k experts into the residual stream.
pub const Q4_DOWN_FUSED_COMBINE: u32 = 1;

pub mod combine_flags {
    pub const ROUTED: u32 = 1;
    pub const SHARED: u32 = 2;
    pub const SHARED_GATED: u32 = 4;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct MoeCombineParams {
    pub hidden: u32,
    pub top_k: u32,
    pub flags: u32,
    pub gate_stride: u32,
    pub gate_col: u32,
    pub _pad: [u32; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct ArgmaxParams {
    pub n: u32,
    pub n_suppress: u32,
    pub row_stride: u32,
    pub flags: u32,
    pub suppress: [u32; 4],
}

/// Compiled pipelines, one per kernel, built once per device.
pub struct Kernels {
    pipelines: Vec<(Kernel, wgpu::ComputePipeline)>,
    subgroups: bool,
    f16: bool,
}

impl Kernels {
    /// `subgroups`: build the subgroup variants and prefer them; `f16`: also the
    /// f16-arithmetic variants (with subgroups), and prefer those.
    pub fn new(device: &wgpu::Device, subgroups: bool, f16: bool) -> Self {
        let f16 = f16 && subgroups;
        let pipelines = Kernel::ALL
            .iter()
            .filter(|k| subgroups || !k.needs_subgroups())
            .filter(|k| f16 || !k.needs_f16())
            .map(|&k| {
                let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(k.name()),
                    source: wgpu::ShaderSource::Wgsl(k.source().into()),
                });
                let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(k.name()),
                    layout: None,
                    module: &module,
                    entry_point: Some("main"),
                    compilation_options: Default::default(),
                    cache: None,
                });
                (k, pipeline)
            })
            .collect();
        Kernels {
            pipelines,
            subgroups,
            f16,
        }
    }

    pub fn pipeline(&self, k: Kernel) -> &wgpu::ComputePipeline {
        // Every kernel the device can run is built in `new`, and `q4_gate_up`/`q4_down`
        // only hand out subgroup kernels when they were built.
        let i = self
            .pipelines
            .iter()
            .position(|(x, _)| *x == k)
            .unwrap_or(0);
        &self.pipelines[i].1
    }

    pub fn uses_subgroups(&self) -> bool {
        self.subgroups
    }

    pub fn uses_f16_arithmetic(&self) -> bool {
        self.f16
    }

    /// The W4A16 gate/up kernel for this device.
    pub fn q4_gate_up(&self) -> Kernel {
        if self.f16 {
            Kernel::FfnGateUpQ4SgH
        } else if self.subgroups {
            Kernel::FfnGateUpQ4Sg
        } else {
            Kernel::FfnGateUpQ4
        }
    }

    /// The W4A16 down kernel for this device.
    pub fn q4_down(&self) -> Kernel {
        if self.f16 {
            Kernel::FfnDownQ4SgH
        } else if self.subgroups {
            Kernel::FfnDownQ4Sg
        } else {
            Kernel::FfnDownQ4
        }
    }
}

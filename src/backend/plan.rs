//! The kernel plan: which kernel serves each stage, decided once from the device's
//! capabilities, the user's overrides and the shapes. A pure function of its inputs,
//! tested without a device; the model keeps the plan and asks it stage by stage.
//!
//! The rules, and why:
//! - Subgroup kernels (8 lanes per row, window and expert-major prefill kernels) need
//!   subgroups of at least 8 lanes; `--portable-kernels` turns them off.
//! - One-token steps read activations from 64 KiB uniform windows on CPU adapters, where
//!   lane-uniform loads are the win (llvmpipe loads storage lane by lane); GPUs use the
//!   coalesced storage/subgroup kernels.
//! - Multi-token steps use the window kernels (uniform windows of token rows, experts
//!   grouped by expert) on CPU adapters, the storage kernels on GPUs.
//! - GPUs get the GPU-shaped kernels (`coalesced` decode, `tiled` prefill): a workgroup
//!   per few weight rows with its lanes reading consecutive 16-byte words along K, K split
//!   where rows are few, flash attention with one workgroup per KV head and key split.
//!   They reduce with subgroups where the device has them (any size), through workgroup
//!   memory otherwise. CPU adapters keep the kernels measured fastest there (uniform
//!   windows and the window/expert-major prefill).
//! - f16 products in the older storage W4A16 kernels where SHADER_F16 exists (f16 ALUs are
//!   faster; llvmpipe emulates f16); they are subgroup kernels. The GPU-shaped kernels are
//!   bound by memory and compute in f32.
//!
//! An override the device cannot honour is refused with the reason, never ignored.

use super::kernel::{
    Activations, Arith, Kernel, KvFormat, Lanes, Q4Variant, Reduce, RowsVariant, WeightFormat,
};
use super::params::UNIFORM_WINDOW_BYTES;
use super::{DeviceInfo, DeviceType};
use crate::error::{Error, Result};

/// `--decode-kernels`: one-token steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DecodeKernels {
    /// Activations in a 64 KiB uniform window (default on CPU adapters such as lavapipe).
    Uniform,
    /// The storage kernels of one invocation (or 8 lanes) per weight row.
    Storage,
    /// GPU-shaped kernels (default on GPUs): a workgroup per 4 weight rows whose lanes read
    /// consecutive 16-byte words, K split where rows are few, flash-decoding attention with
    /// one workgroup per KV head and key split.
    Coalesced,
}

/// `--prefill-kernels`: multi-token steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PrefillKernels {
    /// Activations in 64 KiB uniform windows of token rows, routed experts grouped by
    /// expert (needs subgroups of at least 8 lanes; default on CPU adapters).
    Window,
    /// The storage kernels (4 tokens per invocation).
    Storage,
    /// GPU-shaped kernels (default on GPUs): flash attention tiled over keys, several
    /// tokens' query rows sharing each key tile.
    Tiled,
}

/// An on/off option.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    On,
    Off,
}

/// The user's kernel choices (`None`: the plan decides).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOverrides {
    /// `--portable-kernels`: no subgroup operations anywhere.
    pub portable: bool,
    pub decode: Option<DecodeKernels>,
    pub prefill: Option<PrefillKernels>,
    /// `--f16-arithmetic`: f16 products in the W4A16 kernels.
    pub f16_arithmetic: Option<Switch>,
}

/// Which kernels serve which stage on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KernelPlan {
    /// Subgroup kernels are used (8 lanes per row for the W4A16 kernels).
    pub subgroups: bool,
    /// f16 products in the storage W4A16 kernels.
    pub f16_arithmetic: bool,
    /// One-token steps read activations from uniform windows where the shapes allow.
    pub uniform_decode: bool,
    /// Multi-token steps use the window and expert-major kernels where the shapes allow.
    pub window_prefill: bool,
    /// The device's uniform offset alignment (window starts are multiples of it).
    pub uniform_align: usize,
    /// One-token steps run the GPU-shaped kernels.
    pub coalesced_decode: bool,
    /// Multi-token steps run the GPU-shaped (tiled) kernels.
    pub tiled_prefill: bool,
    /// How the GPU-shaped kernels reduce partial sums.
    pub reduce: Reduce,
    /// How the KV cache holds keys and values (`--kv-precision`; f32 unless the engine
    /// sets it).
    pub kv: KvFormat,
}

impl KernelPlan {
    pub fn decide(dev: &DeviceInfo, o: &KernelOverrides) -> Result<Self> {
        let cpu = dev.device_type == DeviceType::Cpu;
        let name = &dev.name;
        let subgroups_capable = dev.subgroup && dev.subgroup_min_size >= 8;
        let subgroups = subgroups_capable && !o.portable;
        let windows_fit = dev.limits.max_uniform_buffer_binding_size >= UNIFORM_WINDOW_BYTES as u64;
        let no_subgroups = |option: &str, what: &str| -> Error {
            if o.portable {
                Error::option(
                    option,
                    format!("{what} uses subgroup operations, which --portable-kernels turns off"),
                )
            } else if !dev.subgroup {
                Error::option(
                    option,
                    format!("{what} needs subgroup operations, which `{name}` does not offer"),
                )
            } else {
                Error::option(
                    option,
                    format!(
                        "{what} needs subgroups of at least 8 lanes; `{name}` reports {}",
                        dev.subgroup_min_size
                    ),
                )
            }
        };
        let coalesced_decode = match o.decode {
            Some(d) => d == DecodeKernels::Coalesced,
            None => !cpu,
        };
        let tiled_prefill = match o.prefill {
            Some(p) => p == PrefillKernels::Tiled,
            None => !cpu,
        };
        let f16_arithmetic = match o.f16_arithmetic {
            Some(Switch::On) => {
                if !dev.shader_f16 {
                    return Err(Error::option(
                        "--f16-arithmetic",
                        format!(
                            "on: `{name}` has no SHADER_F16 (on DX12 this needs the DXC compiler)"
                        ),
                    ));
                }
                if !subgroups {
                    return Err(no_subgroups("--f16-arithmetic", "f16 arithmetic"));
                }
                if coalesced_decode && tiled_prefill {
                    return Err(Error::option(
                        "--f16-arithmetic",
                        "on: the coalesced decode and tiled prefill kernels compute in f32 (they are bound by memory); f16 products exist in the storage kernels (--decode-kernels storage or --prefill-kernels storage)",
                    ));
                }
                true
            }
            Some(Switch::Off) => false,
            None => dev.shader_f16 && subgroups && !cpu && !(coalesced_decode && tiled_prefill),
        };
        let uniform_decode = match o.decode {
            Some(DecodeKernels::Uniform) if !windows_fit => {
                return Err(Error::option(
                    "--decode-kernels",
                    format!(
                        "uniform: `{name}` binds at most {} bytes of uniform data, the kernels need {UNIFORM_WINDOW_BYTES}",
                        dev.limits.max_uniform_buffer_binding_size
                    ),
                ))
            }
            Some(d) => d == DecodeKernels::Uniform,
            None => cpu && windows_fit && !coalesced_decode,
        };
        let window_prefill = match o.prefill {
            Some(PrefillKernels::Window) => {
                if !subgroups {
                    return Err(no_subgroups("--prefill-kernels", "window"));
                }
                if !windows_fit {
                    return Err(Error::option(
                        "--prefill-kernels",
                        format!("window: `{name}` cannot bind a 64 KiB uniform window"),
                    ));
                }
                true
            }
            Some(PrefillKernels::Storage | PrefillKernels::Tiled) => false,
            None => cpu && subgroups && windows_fit && !tiled_prefill,
        };
        Ok(KernelPlan {
            subgroups,
            f16_arithmetic,
            uniform_decode,
            window_prefill,
            uniform_align: dev.limits.min_uniform_buffer_offset_alignment.max(4) as usize,
            coalesced_decode,
            tiled_prefill,
            reduce: if dev.subgroup && !o.portable {
                Reduce::Subgroup
            } else {
                Reduce::Workgroup
            },
            kv: KvFormat::F32,
        })
    }

    /// The variant of the GPU-shaped row kernels for weights in `format`.
    pub fn rows(&self, format: WeightFormat) -> RowsVariant {
        RowsVariant {
            format,
            reduce: self.reduce,
        }
    }

    /// Whether one-token attention runs the flash kernel (split over the keys).
    pub fn flash_decode(&self) -> bool {
        self.coalesced_decode
    }

    /// Whether multi-token attention runs the flash kernel (tiled over keys).
    pub fn flash_prefill(&self) -> bool {
        self.tiled_prefill
    }

    /// The W4A16 variant of multi-token (and, without uniform decode, one-token) steps.
    pub fn q4_storage(&self) -> Q4Variant {
        Q4Variant {
            act: Activations::Storage,
            lanes: if self.subgroups {
                Lanes::Eight
            } else {
                Lanes::One
            },
            arith: if self.f16_arithmetic {
                Arith::F16
            } else {
                Arith::F32
            },
        }
    }

    /// The W4A16 variant of one-token steps when the activations fit a uniform window.
    pub fn q4_uniform(&self) -> Q4Variant {
        Q4Variant {
            act: Activations::Uniform,
            lanes: Lanes::One,
            arith: Arith::F32,
        }
    }

    /// Whether one-token steps of the routed experts read uniform windows: the token's
    /// activations (hidden) and its k intermediates must fit 64 KiB, rows 16-byte aligned.
    pub fn q4_decode_uniform(&self, hidden: usize, inter: usize, top_k: usize) -> bool {
        self.uniform_decode
            && hidden.is_multiple_of(4)
            && inter.is_multiple_of(4)
            && hidden * 4 <= UNIFORM_WINDOW_BYTES
            && top_k * inter * 4 <= UNIFORM_WINDOW_BYTES
    }

    /// Whether a one-token matmul over rows of `cols` inputs reads a uniform window. Short
    /// rows gain nothing and pay for binding the window (measured: olmoe-tiny, K = 64,
    /// decoded 40 tok/s without, 24 with).
    pub fn matmul_decode_uniform(&self, cols: usize) -> bool {
        self.uniform_decode && cols * 4 <= UNIFORM_WINDOW_BYTES && cols >= 256
    }

    /// Tokens per uniform window of a multi-token matmul over `cols` inputs in chunks of
    /// `chunk` tokens; 0 means the storage matmul serves it.
    pub fn matmul_window_tokens(&self, cols: usize, chunk: usize) -> usize {
        if !self.window_prefill || chunk < 2 || !cols.is_multiple_of(4) {
            return 0;
        }
        window_tokens(cols * 4, chunk, self.uniform_align)
    }

    /// The attention kernel of a model with `head_dim`, prefilled `chunk` tokens at a time.
    /// The window kernel serves one-token steps too (about 30% faster on lavapipe).
    pub fn attention(&self, head_dim: usize, chunk: usize) -> Kernel {
        if self.window_prefill && chunk > 1 && head_dim.is_multiple_of(4) {
            Kernel::AttentionWindow(self.kv)
        } else {
            Kernel::Attention(self.kv)
        }
    }

    /// Whether multi-token steps of INT4 experts with the grouped executor run the
    /// expert-major kernels (sorted by expert, each expert's rows read once per 8 pairs).
    pub fn expert_major(&self, int4: bool, grouped: bool, chunk: usize) -> bool {
        self.window_prefill && int4 && grouped && chunk > 1
    }
}

/// Tokens per uniform window of rows of `row_bytes` bytes for a chunk of `chunk` tokens:
/// one window when the chunk fits 64 KiB, else the most rows that fit and keep every
/// window's start a multiple of the uniform offset alignment; 0 when no window can be bound.
pub fn window_tokens(row_bytes: usize, chunk: usize, align: usize) -> usize {
    if row_bytes == 0 || row_bytes > UNIFORM_WINDOW_BYTES {
        return 0;
    }
    let fit = UNIFORM_WINDOW_BYTES / row_bytes;
    if chunk <= fit {
        return chunk;
    }
    let align = align.max(4);
    let step = align / gcd(row_bytes, align);
    fit / step * step
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Limits;

    fn device(ty: DeviceType, subgroup: Option<u32>, f16: bool) -> DeviceInfo {
        DeviceInfo {
            name: "test adapter".into(),
            backend: "vulkan".into(),
            device_type: ty,
            driver: String::new(),
            driver_info: String::new(),
            shader_f16: f16,
            subgroup: subgroup.is_some(),
            subgroup_min_size: subgroup.unwrap_or(0),
            subgroup_max_size: subgroup.unwrap_or(0),
            timestamp_query: false,
            limits: Limits {
                max_uniform_buffer_binding_size: 65536,
                min_uniform_buffer_offset_alignment: 256,
                ..Default::default()
            },
        }
    }

    #[test]
    fn cpu_adapters_get_uniform_decode_and_window_prefill() {
        let p = KernelPlan::decide(&device(DeviceType::Cpu, Some(8), true), &Default::default())
            .unwrap();
        assert!(p.subgroups && p.uniform_decode && p.window_prefill && !p.f16_arithmetic);
        assert_eq!(p.attention(128, 64), Kernel::AttentionWindow(KvFormat::F32));
        assert_eq!(p.attention(128, 1), Kernel::Attention(KvFormat::F32));
        assert!(p.expert_major(true, true, 64) && !p.expert_major(false, true, 64));
    }

    #[test]
    fn gpus_get_coalesced_decode_and_tiled_prefill_in_f32() {
        let gpu = device(DeviceType::DiscreteGpu, Some(32), true);
        let p = KernelPlan::decide(&gpu, &Default::default()).unwrap();
        assert!(p.subgroups && p.coalesced_decode && p.tiled_prefill);
        assert!(!p.f16_arithmetic && !p.uniform_decode && !p.window_prefill);
        assert_eq!(p.reduce, Reduce::Subgroup);
        let on = KernelOverrides {
            f16_arithmetic: Some(Switch::On),
            ..Default::default()
        };
        let e = KernelPlan::decide(&gpu, &on).unwrap_err().to_string();
        assert!(
            e.contains("--f16-arithmetic") && e.contains("storage"),
            "{e}"
        );
    }

    #[test]
    fn gpus_asked_for_storage_kernels_get_subgroups_with_f16() {
        let o = KernelOverrides {
            decode: Some(DecodeKernels::Storage),
            prefill: Some(PrefillKernels::Storage),
            ..Default::default()
        };
        let p = KernelPlan::decide(&device(DeviceType::DiscreteGpu, Some(32), true), &o).unwrap();
        assert!(p.subgroups && p.f16_arithmetic && !p.uniform_decode && !p.window_prefill);
        assert!(!p.coalesced_decode && !p.tiled_prefill);
        assert_eq!(
            p.q4_storage(),
            Q4Variant {
                act: Activations::Storage,
                lanes: Lanes::Eight,
                arith: Arith::F16
            }
        );
        assert_eq!(p.attention(128, 64), Kernel::Attention(KvFormat::F32));
        assert_eq!(p.matmul_window_tokens(2048, 64), 0);
    }

    #[test]
    fn small_or_missing_subgroups_give_portable_kernels() {
        for sg in [None, Some(4)] {
            let p = KernelPlan::decide(&device(DeviceType::Cpu, sg, true), &Default::default())
                .unwrap();
            assert!(!p.subgroups && !p.window_prefill && p.uniform_decode);
            assert_eq!(p.q4_storage(), Q4Variant::PORTABLE);
        }
        // DX12 with FXC: neither f16 nor subgroups.
        let p = KernelPlan::decide(
            &device(DeviceType::DiscreteGpu, None, false),
            &Default::default(),
        )
        .unwrap();
        assert_eq!(p.q4_storage(), Q4Variant::PORTABLE);
        assert!(!p.f16_arithmetic);
    }

    #[test]
    fn overrides_the_device_cannot_honour_are_refused() {
        let four = device(DeviceType::Cpu, Some(4), true);
        let o = KernelOverrides {
            prefill: Some(PrefillKernels::Window),
            ..Default::default()
        };
        let e = KernelPlan::decide(&four, &o).unwrap_err().to_string();
        assert!(
            e.contains("--prefill-kernels") && e.contains("8 lanes") && e.contains("4"),
            "{e}"
        );
        let o = KernelOverrides {
            f16_arithmetic: Some(Switch::On),
            ..Default::default()
        };
        let e = KernelPlan::decide(&device(DeviceType::DiscreteGpu, Some(32), false), &o)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--f16-arithmetic") && e.contains("SHADER_F16"),
            "{e}"
        );
        let o = KernelOverrides {
            portable: true,
            prefill: Some(PrefillKernels::Window),
            ..Default::default()
        };
        let e = KernelPlan::decide(&device(DeviceType::Cpu, Some(8), true), &o)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--portable-kernels"), "{e}");
        let mut small = device(DeviceType::Cpu, Some(8), true);
        small.limits.max_uniform_buffer_binding_size = 16384;
        let o = KernelOverrides {
            decode: Some(DecodeKernels::Uniform),
            ..Default::default()
        };
        assert!(KernelPlan::decide(&small, &o)
            .unwrap_err()
            .to_string()
            .contains("--decode-kernels"));
        // Without the override the plan quietly uses storage kernels there.
        let p = KernelPlan::decide(&small, &Default::default()).unwrap();
        assert!(!p.uniform_decode && !p.window_prefill);
    }

    #[test]
    fn overrides_that_fit_are_followed() {
        let o = KernelOverrides {
            decode: Some(DecodeKernels::Storage),
            prefill: Some(PrefillKernels::Storage),
            f16_arithmetic: Some(Switch::On),
            ..Default::default()
        };
        let p = KernelPlan::decide(&device(DeviceType::Cpu, Some(16), true), &o).unwrap();
        assert!(!p.uniform_decode && !p.window_prefill && p.f16_arithmetic);
        let o = KernelOverrides {
            portable: true,
            ..Default::default()
        };
        let p = KernelPlan::decide(&device(DeviceType::DiscreteGpu, Some(32), true), &o).unwrap();
        assert!(!p.subgroups && !p.f16_arithmetic);
    }

    #[test]
    fn shape_rules() {
        let p = KernelPlan::decide(
            &device(DeviceType::Cpu, Some(8), false),
            &Default::default(),
        )
        .unwrap();
        assert!(p.q4_decode_uniform(2048, 1024, 8));
        assert!(!p.q4_decode_uniform(2048, 1408, 16)); // 16 x 1408 floats exceed 64 KiB
        assert!(!p.q4_decode_uniform(64, 94, 2)); // rows not 16-byte aligned
        assert!(p.matmul_decode_uniform(2048) && !p.matmul_decode_uniform(64));
        assert_eq!(p.matmul_window_tokens(2048, 64), 8);
        assert_eq!(p.matmul_window_tokens(2048, 1), 0);
        assert_eq!(p.matmul_window_tokens(66, 64), 0);
    }

    #[test]
    fn windows_respect_size_and_alignment() {
        assert_eq!(window_tokens(8192, 64, 256), 8);
        assert_eq!(window_tokens(256, 64, 256), 64);
        assert_eq!(window_tokens(70000, 4, 256), 0);
        // 4 KiB + 4 bytes rows: 15 fit, but starts must stay 256-aligned: multiples of 64.
        assert_eq!(window_tokens(4100, 64, 256), 0);
        for (row, chunk, align) in [(4096, 64, 256), (400, 300, 64), (12, 9000, 32)] {
            let tw = window_tokens(row, chunk, align);
            assert!(tw * row <= UNIFORM_WINDOW_BYTES);
            assert!(tw == chunk || (tw * row).is_multiple_of(align));
        }
    }
}

//! The CUDA C kernels (`kernels/cuda/`, ports of the WGSL kernels under `shaders/`) and
//! their compilation with NVRTC. The CUDA backend offers the kernels the kernel plan picks
//! on it: the device is a GPU whose warps are subgroups of 32, with no SHADER_F16 and no
//! uniform windows, so the plan picks the GPU-shaped kernels (coalesced matvecs and expert
//! halves in f16, INT4 and Q8_0, reduced with warp shuffles or, with `--portable-kernels`, a
//! shared-memory tree; flash attention and its split combine; for multi-token steps the
//! tiled GEMMs, dense and over experts, in f16, INT4 and Q8_0, and the pairs' sort) and,
//! with `--decode-kernels storage` / `--prefill-kernels storage`, the storage kernels
//! with f32 arithmetic (8-lane W4A16 kernels, or one-lane ones when portable); never
//! f16-arithmetic, window or expert-major kernels. The KV kernels (rope_kv, the attention
//! kernels) read and write an f32, f16 or q8_0 cache (`--kv-precision`), one entry point
//! per format; the Q8_0 storage matmul has no CUDA port (the engine refuses it on CUDA).
//! Every kernel that plan can pick has a CUDA version here; any other is refused by name.
//! The device loads a CUBIN for its own architecture
//! (no PTX JIT: a CUBIN from any CUDA 12 NVRTC loads on any CUDA 12 driver, while PTX from
//! a newer NVRTC than the driver does not), PTX where NVRTC does not know the architecture.
//! Compiled code is cached per process and architecture.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Mutex, OnceLock};

use cudarc::nvrtc::sys as nv;

use super::load;
use crate::backend::kernel::{
    Kernel, KvFormat, Lanes, Q4Variant, Reduce, RowsVariant, WeightFormat,
};
use crate::backend::Op;
use crate::error::{Error, Result};

const COMMON: &str = include_str!("../../../kernels/cuda/common.cuh");
/// The GPU-shaped row kernels' formats, activations and reductions (joined after COMMON for
/// the files in [`ROWS_FILES`]).
const ROWS: &str = include_str!("../../../kernels/cuda/rows.cuh");
const ROWS_FILES: &[&str] = &["matvec.cu", "expert.cu", "gemm.cu"];
/// The f16 conversion with PTX (the CPU emulation of the tests brings its own).
pub const F16_PTX: &str = include_str!("../../../kernels/cuda/f16.cuh");

/// The CUDA sources, by file name under `kernels/cuda/`.
pub const SOURCES: &[(&str, &str)] = &[
    ("embed.cu", include_str!("../../../kernels/cuda/embed.cu")),
    (
        "rmsnorm.cu",
        include_str!("../../../kernels/cuda/rmsnorm.cu"),
    ),
    ("matmul.cu", include_str!("../../../kernels/cuda/matmul.cu")),
    (
        "rope_kv.cu",
        include_str!("../../../kernels/cuda/rope_kv.cu"),
    ),
    (
        "attention.cu",
        include_str!("../../../kernels/cuda/attention.cu"),
    ),
    (
        "router_topk.cu",
        include_str!("../../../kernels/cuda/router_topk.cu"),
    ),
    ("ffn.cu", include_str!("../../../kernels/cuda/ffn.cu")),
    ("q4.cu", include_str!("../../../kernels/cuda/q4.cu")),
    (
        "moe_combine.cu",
        include_str!("../../../kernels/cuda/moe_combine.cu"),
    ),
    ("argmax.cu", include_str!("../../../kernels/cuda/argmax.cu")),
    ("matvec.cu", include_str!("../../../kernels/cuda/matvec.cu")),
    ("expert.cu", include_str!("../../../kernels/cuda/expert.cu")),
    (
        "attn_flash.cu",
        include_str!("../../../kernels/cuda/attn_flash.cu"),
    ),
    ("gemm.cu", include_str!("../../../kernels/cuda/gemm.cu")),
    (
        "moe_sort.cu",
        include_str!("../../../kernels/cuda/moe_sort.cu"),
    ),
];

/// How one kernel is built and launched.
#[derive(Clone, Copy, Debug)]
pub struct CudaKernel {
    /// Its source file under `kernels/cuda/`.
    pub file: &'static str,
    /// The `extern "C"` entry point.
    pub entry: &'static str,
    /// Its params struct in the file (checked against the Rust twin's size).
    pub params: &'static str,
    /// The binding numbers the kernel takes after the params and the step, in order.
    pub bindings: &'static [u32],
    /// Threads per block (the WGSL workgroup size).
    pub block: u32,
}

/// The CUDA version of a kernel, `None` when this backend has none.
pub fn cuda_kernel(k: Kernel) -> Option<CudaKernel> {
    let c = |file, entry, params, bindings, block| CudaKernel {
        file,
        entry,
        params,
        bindings,
        block,
    };
    const Q4: Q4Variant = Q4Variant::PORTABLE;
    const Q4_L8: Q4Variant = Q4Variant {
        lanes: Lanes::Eight,
        ..Q4Variant::PORTABLE
    };
    Some(match k {
        Kernel::Embed => c("embed.cu", "embed", "EmbedParams", &[2, 3, 4], 64),
        Kernel::RmsNorm => c("rmsnorm.cu", "rmsnorm", "RmsNormParams", &[2, 3, 4], 64),
        Kernel::Matmul => c("matmul.cu", "matmul", "MatmulParams", &[2, 3, 4, 5], 64),
        // The KV cache in f32, f16 or q8_0 (`--kv-precision`): one entry point per format.
        Kernel::RopeKv(kv) => c(
            "rope_kv.cu",
            kv_entry(kv, ["rope_kv", "rope_kv_kv16", "rope_kv_kvq8"]),
            "RopeKvParams",
            &[2, 3, 4, 5, 6, 7, 8],
            64,
        ),
        Kernel::Attention(kv) => c(
            "attention.cu",
            kv_entry(kv, ["attention", "attention_kv16", "attention_kvq8"]),
            "AttentionParams",
            &[2, 3, 4, 5, 6],
            64,
        ),
        Kernel::RouterTopk => c(
            "router_topk.cu",
            "router_topk",
            "RouterTopkParams",
            &[2, 3, 4],
            64,
        ),
        Kernel::FfnGateUp => c(
            "ffn.cu",
            "ffn_gate_up",
            "FfnGateUpParams",
            &[2, 3, 4, 5, 6],
            64,
        ),
        Kernel::FfnDown => c("ffn.cu", "ffn_down", "FfnDownParams", &[2, 3, 4, 5, 6], 64),
        Kernel::Q4GateUp(Q4) => c(
            "q4.cu",
            "ffn_gate_up_q4",
            "Q4GateUpParams",
            &[2, 3, 4, 5, 6, 7, 15],
            64,
        ),
        Kernel::Q4Down(Q4) => c(
            "q4.cu",
            "ffn_down_q4",
            "Q4DownParams",
            &[2, 3, 4, 5, 6, 7, 15],
            64,
        ),
        Kernel::Q4DownCombine(Q4) => c(
            "q4.cu",
            "ffn_down_q4_combine",
            "Q4DownParams",
            &[2, 3, 4, 5, 6, 7, 8, 15],
            64,
        ),
        Kernel::Q4GateUp(Q4_L8) => c(
            "q4.cu",
            "ffn_gate_up_q4_l8",
            "Q4GateUpParams",
            &[2, 3, 4, 5, 6, 7, 15],
            64,
        ),
        Kernel::Q4Down(Q4_L8) => c(
            "q4.cu",
            "ffn_down_q4_l8",
            "Q4DownParams",
            &[2, 3, 4, 5, 6, 7, 15],
            64,
        ),
        Kernel::Q4DownCombine(Q4_L8) => c(
            "q4.cu",
            "ffn_down_q4_combine_l8",
            "Q4DownParams",
            &[2, 3, 4, 5, 6, 7, 8, 15],
            64,
        ),
        Kernel::MoeCombine => c(
            "moe_combine.cu",
            "moe_combine",
            "MoeCombineParams",
            &[2, 3, 4, 5, 6, 7, 8, 9],
            64,
        ),
        Kernel::Argmax => c("argmax.cu", "argmax", "ArgmaxParams", &[2, 3, 4], 256),
        Kernel::Matvec(r) => c(
            "matvec.cu",
            rows_entry(
                r,
                &[
                    (WeightFormat::F16, ["matvec_f16_sg", "matvec_f16_wg"]),
                    (WeightFormat::Q8, ["matvec_q8_sg", "matvec_q8_wg"]),
                    (WeightFormat::Q4A, ["matvec_q4a_sg", "matvec_q4a_wg"]),
                    (WeightFormat::Q4K, ["matvec_q4k_sg", "matvec_q4k_wg"]),
                    (WeightFormat::Q5K, ["matvec_q5k_sg", "matvec_q5k_wg"]),
                    (WeightFormat::Q6K, ["matvec_q6k_sg", "matvec_q6k_wg"]),
                    (WeightFormat::Q5A, ["matvec_q5a_sg", "matvec_q5a_wg"]),
                ],
            )?,
            "DenseParams",
            if r.format.has_scales() {
                &[2, 3, 4, 5, 10, 11]
            } else {
                &[2, 3, 4, 5, 10]
            },
            64,
        ),
        Kernel::MatvecNorm(r) => c(
            "matvec.cu",
            rows_entry(
                r,
                &[
                    (
                        WeightFormat::F16,
                        ["matvec_norm_f16_sg", "matvec_norm_f16_wg"],
                    ),
                    (WeightFormat::Q8, ["matvec_norm_q8_sg", "matvec_norm_q8_wg"]),
                    (
                        WeightFormat::Q4A,
                        ["matvec_norm_q4a_sg", "matvec_norm_q4a_wg"],
                    ),
                    (
                        WeightFormat::Q4K,
                        ["matvec_norm_q4k_sg", "matvec_norm_q4k_wg"],
                    ),
                    (
                        WeightFormat::Q5K,
                        ["matvec_norm_q5k_sg", "matvec_norm_q5k_wg"],
                    ),
                    (
                        WeightFormat::Q6K,
                        ["matvec_norm_q6k_sg", "matvec_norm_q6k_wg"],
                    ),
                    (
                        WeightFormat::Q5A,
                        ["matvec_norm_q5a_sg", "matvec_norm_q5a_wg"],
                    ),
                ],
            )?,
            "DenseParams",
            if r.format.has_scales() {
                &[2, 3, 4, 5, 6, 7, 10, 11]
            } else {
                &[2, 3, 4, 5, 6, 7, 10]
            },
            64,
        ),
        Kernel::ExpertGateUp(r) => c(
            "expert.cu",
            rows_entry(
                r,
                &[
                    (
                        WeightFormat::F16,
                        ["expert_gate_up_f16_sg", "expert_gate_up_f16_wg"],
                    ),
                    (
                        WeightFormat::Q4,
                        ["expert_gate_up_q4_sg", "expert_gate_up_q4_wg"],
                    ),
                    (
                        WeightFormat::Q8,
                        ["expert_gate_up_q8_sg", "expert_gate_up_q8_wg"],
                    ),
                    (
                        WeightFormat::Q4A,
                        ["expert_gate_up_q4a_sg", "expert_gate_up_q4a_wg"],
                    ),
                    (
                        WeightFormat::Q4K,
                        ["expert_gate_up_q4k_sg", "expert_gate_up_q4k_wg"],
                    ),
                    (
                        WeightFormat::Q5K,
                        ["expert_gate_up_q5k_sg", "expert_gate_up_q5k_wg"],
                    ),
                    (
                        WeightFormat::Q6K,
                        ["expert_gate_up_q6k_sg", "expert_gate_up_q6k_wg"],
                    ),
                    (
                        WeightFormat::Q5A,
                        ["expert_gate_up_q5a_sg", "expert_gate_up_q5a_wg"],
                    ),
                ],
            )?,
            "ExpertGateUpParams",
            if r.format.has_scales() {
                &[2, 3, 4, 5, 6, 8, 9, 12, 10, 11]
            } else {
                &[2, 3, 4, 5, 6, 8, 9, 12, 10]
            },
            64,
        ),
        Kernel::ExpertDown(r) => c(
            "expert.cu",
            rows_entry(
                r,
                &[
                    (
                        WeightFormat::F16,
                        ["expert_down_f16_sg", "expert_down_f16_wg"],
                    ),
                    (WeightFormat::Q4, ["expert_down_q4_sg", "expert_down_q4_wg"]),
                    (WeightFormat::Q8, ["expert_down_q8_sg", "expert_down_q8_wg"]),
                    (
                        WeightFormat::Q4A,
                        ["expert_down_q4a_sg", "expert_down_q4a_wg"],
                    ),
                    (
                        WeightFormat::Q4K,
                        ["expert_down_q4k_sg", "expert_down_q4k_wg"],
                    ),
                    (
                        WeightFormat::Q5K,
                        ["expert_down_q5k_sg", "expert_down_q5k_wg"],
                    ),
                    (
                        WeightFormat::Q6K,
                        ["expert_down_q6k_sg", "expert_down_q6k_wg"],
                    ),
                    (
                        WeightFormat::Q5A,
                        ["expert_down_q5a_sg", "expert_down_q5a_wg"],
                    ),
                ],
            )?,
            "ExpertDownParams",
            if r.format.has_scales() {
                &[2, 3, 4, 5, 6, 7, 10, 11]
            } else {
                &[2, 3, 4, 5, 6, 7, 10]
            },
            64,
        ),
        Kernel::AttnFlash(kv) => c(
            "attn_flash.cu",
            kv_entry(kv, ["attn_flash", "attn_flash_kv16", "attn_flash_kvq8"]),
            "FlashParams",
            &[2, 3, 4, 5, 6],
            64,
        ),
        Kernel::AttnCombine => c("attn_flash.cu", "attn_combine", "FlashParams", &[2, 3], 64),
        Kernel::Gemm(f) => c(
            "gemm.cu",
            format_entry(
                f,
                &[
                    (WeightFormat::F16, "gemm_f16"),
                    (WeightFormat::Q8, "gemm_q8"),
                    (WeightFormat::Q4A, "gemm_q4a"),
                    (WeightFormat::Q4K, "gemm_q4k"),
                    (WeightFormat::Q5K, "gemm_q5k"),
                    (WeightFormat::Q6K, "gemm_q6k"),
                    (WeightFormat::Q5A, "gemm_q5a"),
                ],
            )?,
            "DenseParams",
            if f.has_scales() {
                &[2, 3, 4, 5, 10, 11]
            } else {
                &[2, 3, 4, 5, 10]
            },
            64,
        ),
        Kernel::ExpertGemm(f) => c(
            "gemm.cu",
            format_entry(
                f,
                &[
                    (WeightFormat::F16, "expert_gemm_f16"),
                    (WeightFormat::Q4, "expert_gemm_q4"),
                    (WeightFormat::Q8, "expert_gemm_q8"),
                    (WeightFormat::Q4A, "expert_gemm_q4a"),
                    (WeightFormat::Q4K, "expert_gemm_q4k"),
                    (WeightFormat::Q5K, "expert_gemm_q5k"),
                    (WeightFormat::Q6K, "expert_gemm_q6k"),
                    (WeightFormat::Q5A, "expert_gemm_q5a"),
                ],
            )?,
            "ExpertGemmParams",
            if f.has_scales() {
                &[2, 3, 4, 5, 6, 10, 11]
            } else {
                &[2, 3, 4, 5, 6, 10]
            },
            64,
        ),
        Kernel::MoeSort => c("moe_sort.cu", "moe_sort", "MoeSortParams", &[2, 3], 1),
        _ => return None,
    })
}

/// The entry point of a GPU-shaped row kernel's variant: `entries` holds, per weight format
/// with a CUDA port, its (Reduce::Subgroup, Reduce::Workgroup) entries; a format without
/// one has none (and is refused by name).
fn rows_entry(
    r: RowsVariant,
    entries: &[(WeightFormat, [&'static str; 2])],
) -> Option<&'static str> {
    let (_, e) = entries.iter().find(|(f, _)| *f == r.format)?;
    Some(match r.reduce {
        Reduce::Subgroup => e[0],
        Reduce::Workgroup => e[1],
    })
}

/// The entry point of a tiled kernel in weight format `f`: `entries` holds the formats with
/// a CUDA port (templates over the format, one entry each); a format without one has none
/// (and is refused by name).
fn format_entry(f: WeightFormat, entries: &[(WeightFormat, &'static str)]) -> Option<&'static str> {
    entries.iter().find(|(g, _)| *g == f).map(|(_, e)| *e)
}

/// The entry point of a kernel that reads or writes the KV cache, for format `kv`:
/// `entries` holds the f32, the f16 and the q8_0 entry.
fn kv_entry(kv: KvFormat, entries: [&'static str; 3]) -> &'static str {
    match kv {
        KvFormat::F32 => entries[0],
        KvFormat::F16 => entries[1],
        KvFormat::Q8 => entries[2],
    }
}

/// Every kernel with a CUDA version.
pub fn kernels() -> Vec<Kernel> {
    Kernel::all()
        .into_iter()
        .filter(|k| cuda_kernel(*k).is_some())
        .collect()
}

/// Check that `op`, run with `kernel` (its own or its one-token alternative), fits the CUDA
/// kernel: exactly the bindings it takes and a params block of its size. The launcher calls
/// this for every op it prepares; tests call it on the forward pass's programs.
pub fn check_op(op: &Op, kernel: Kernel) -> Result<CudaKernel> {
    let ck = cuda_kernel(kernel).ok_or_else(|| no_cuda_version(kernel))?;
    let (_, size) = kernel.params_layout();
    if op.params.len() != size || size % 4 != 0 {
        return Err(Error::Other(format!(
            "internal: {kernel}: {} parameter bytes, the kernel takes {size}",
            op.params.len()
        )));
    }
    if let Some(b) = ck
        .bindings
        .iter()
        .find(|b| !op.binds.iter().any(|x| x.binding == **b))
    {
        return Err(Error::Other(format!(
            "internal: {kernel}: binding {b} is not bound"
        )));
    }
    if let Some(x) = op.binds.iter().find(|x| !ck.bindings.contains(&x.binding)) {
        return Err(Error::Other(format!(
            "internal: {kernel}: binding {} is not one of the kernel's {:?}",
            x.binding, ck.bindings
        )));
    }
    Ok(ck)
}

/// The error for a kernel this backend has no version of.
pub fn no_cuda_version(k: Kernel) -> Error {
    Error::Gpu(format!(
        "kernel {k} has no CUDA version (the CUDA backend runs the GPU-shaped kernels and the storage kernels with f32 arithmetic; the kernel plan picks only those on it)"
    ))
}

/// The kernels of one source file.
pub fn kernels_of(file: &str) -> Vec<Kernel> {
    kernels()
        .into_iter()
        .filter(|k| cuda_kernel(*k).is_some_and(|c| c.file == file))
        .collect()
}

/// The complete CUDA C source of a file: every params struct's Rust size (for the file's
/// layout checks), the f16 conversion piece, the common header, the row kernels' pieces
/// (their files only), the file.
pub fn assemble(file: &str, f16: &str) -> Result<String> {
    let body = SOURCES
        .iter()
        .find(|(f, _)| *f == file)
        .map(|(_, s)| *s)
        .ok_or_else(|| Error::Other(format!("internal: no CUDA source {file}")))?;
    let mut s = String::new();
    let mut seen = Vec::new();
    for k in kernels() {
        let Some(ck) = cuda_kernel(k) else { continue };
        if !seen.contains(&ck.params) {
            seen.push(ck.params);
            s.push_str(&format!(
                "#define WGMOE_SIZE_{} {}\n",
                ck.params,
                k.params_layout().1
            ));
        }
    }
    s.push_str(f16);
    s.push_str(COMMON);
    s.push('\n');
    if ROWS_FILES.contains(&file) {
        s.push_str(ROWS);
        s.push('\n');
    }
    s.push_str(body);
    Ok(s)
}

/// The source NVRTC compiles for a kernel (its file's).
pub fn source(k: Kernel) -> Result<String> {
    let ck = cuda_kernel(k).ok_or_else(|| no_cuda_version(k))?;
    assemble(ck.file, F16_PTX)
}

/// The compiled file holding a kernel, for `arch`: PTX text for a virtual architecture
/// (`compute_90`, or `None` for NVRTC's default), a CUBIN for a real one (`sm_90`). Each
/// file is compiled once per process and architecture.
pub fn binary(k: Kernel, arch: Option<&str>) -> Result<Vec<u8>> {
    type Cache = Mutex<HashMap<(&'static str, Option<String>), Vec<u8>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let ck = cuda_kernel(k).ok_or_else(|| no_cuda_version(k))?;
    let cache = CACHE.get_or_init(Cache::default);
    let key = (ck.file, arch.map(str::to_string));
    if let Some(p) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
        return Ok(p);
    }
    let p = compile_source(ck.file, &source(k)?, arch)?;
    if let Ok(mut c) = cache.lock() {
        c.insert(key, p.clone());
    }
    Ok(p)
}

/// PTX of a kernel (`arch`: a virtual architecture or `None`), as text.
pub fn ptx(k: Kernel, arch: Option<&str>) -> Result<String> {
    if arch.is_some_and(|a| a.starts_with("sm_")) {
        return Err(Error::Other(format!(
            "internal: PTX asked for a real architecture {arch:?}"
        )));
    }
    String::from_utf8(binary(k, arch)?)
        .map_err(|_| Error::Gpu(format!("NVRTC: the PTX of {k} is not text")))
}

/// NVRTC's error string for a result.
fn nvrtc_error(r: nv::nvrtcResult) -> String {
    // SAFETY: nvrtcGetErrorString returns a static string for any result value.
    let p = unsafe { nv::nvrtcGetErrorString(r) };
    if p.is_null() {
        return format!("{r:?}");
    }
    // SAFETY: non-null, NUL-terminated, static.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// Compile CUDA C source with NVRTC (through its C API: cudarc's wrapper unwraps the log
/// and has no CUBIN): PTX text, or a CUBIN when `arch` is a real architecture (`sm_90`).
/// The error holds the compiler's log.
pub fn compile_source(name: &str, src: &str, arch: Option<&str>) -> Result<Vec<u8>> {
    let cubin = arch.is_some_and(|a| a.starts_with("sm_"));
    load::nvrtc()?;
    let fail = |what: &str, r: nv::nvrtcResult| {
        Error::Gpu(format!("NVRTC {what} of {name}: {}", nvrtc_error(r)))
    };
    let csrc = CString::new(src).map_err(|_| Error::Other(format!("internal: NUL in {name}")))?;
    let cname = CString::new("kernel.cu").map_err(|_| Error::Other(format!("internal: {name}")))?;
    let mut opts = vec!["--std=c++14".to_string()];
    if let Some(a) = arch {
        opts.push(format!("--gpu-architecture={a}"));
    }
    let copts: Vec<CString> = opts
        .iter()
        .filter_map(|o| CString::new(o.as_str()).ok())
        .collect();
    let optp: Vec<*const std::ffi::c_char> = copts.iter().map(|o| o.as_ptr()).collect();
    load::guard("NVRTC", || {
        let mut prog: nv::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: every pointer refers to a live NUL-terminated string; no headers.
        let r = unsafe {
            nv::nvrtcCreateProgram(
                &mut prog,
                csrc.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if r != nv::nvrtcResult::NVRTC_SUCCESS {
            return Err(fail("program creation", r));
        }
        let out = (|| {
            // SAFETY: `prog` was created above; `optp` holds live option strings.
            let r = unsafe { nv::nvrtcCompileProgram(prog, optp.len() as i32, optp.as_ptr()) };
            if r != nv::nvrtcResult::NVRTC_SUCCESS {
                let log = program_log(prog);
                return Err(Error::Gpu(format!(
                    "NVRTC compilation of {name} (options {opts:?}) failed: {}\n{log}",
                    nvrtc_error(r)
                )));
            }
            let mut size = 0usize;
            // SAFETY: out-pointer to a live usize.
            let r = unsafe {
                if cubin {
                    nv::nvrtcGetCUBINSize(prog, &mut size)
                } else {
                    nv::nvrtcGetPTXSize(prog, &mut size)
                }
            };
            if r != nv::nvrtcResult::NVRTC_SUCCESS {
                return Err(fail("output size", r));
            }
            let mut buf = vec![0u8; size];
            // SAFETY: `buf` holds the `size` bytes NVRTC reported.
            let r = unsafe {
                if cubin {
                    nv::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast())
                } else {
                    nv::nvrtcGetPTX(prog, buf.as_mut_ptr().cast())
                }
            };
            if r != nv::nvrtcResult::NVRTC_SUCCESS {
                return Err(fail("output", r));
            }
            if !cubin {
                // PTX text ends with its NUL.
                while buf.last() == Some(&0) {
                    buf.pop();
                }
            }
            Ok(buf)
        })();
        // SAFETY: destroys the program created above, once.
        unsafe { nv::nvrtcDestroyProgram(&mut prog) };
        out
    })?
}

/// The compiler's log of a program (errors and warnings).
fn program_log(prog: nv::nvrtcProgram) -> String {
    let mut size = 0usize;
    // SAFETY: out-pointer to a live usize; `prog` is live.
    if unsafe { nv::nvrtcGetProgramLogSize(prog, &mut size) } != nv::nvrtcResult::NVRTC_SUCCESS {
        return String::new();
    }
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: `buf` holds `size` bytes.
    if unsafe { nv::nvrtcGetProgramLog(prog, buf.as_mut_ptr().cast()) }
        != nv::nvrtcResult::NVRTC_SUCCESS
    {
        return String::new();
    }
    String::from_utf8_lossy(&buf)
        .trim_end_matches('\0')
        .to_string()
}

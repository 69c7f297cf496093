//! Shared by the integration tests: fixture paths and golden files written by
//! tools/make_fixtures.py with transformers.
#![allow(dead_code)]

pub mod check;
pub mod cli;
pub mod cxx;
pub mod dense;
pub mod engine;
pub mod gpu;
pub mod parity;
pub mod q4;
pub mod rng;
pub mod server;
pub mod st;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

/// The repository root: where the tests were built, or `WGMOE_REPO_DIR` for test binaries
/// run from another checkout (tools/gpu-check.sh on a machine without a Rust toolchain).
pub fn repo() -> PathBuf {
    std::env::var_os("WGMOE_REPO_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

pub fn fixture(name: &str) -> PathBuf {
    repo().join("models").join(name)
}

#[allow(unused_imports)] // not every test binary picks a backend
pub use gpu::{test_backend, use_backend};

pub fn init_env() {
    // Keeps the Vulkan loader quiet, as the README asks users to do.
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
}

pub struct GoldenPrompt {
    pub text: String,
    pub prompt_ids: Vec<u32>,
    pub prompt_logits: Vec<Vec<f32>>,
    pub prompt_gap: Vec<f32>,
    pub generated_ids: Vec<u32>,
    pub step_logits: Vec<Vec<f32>>,
    pub step_gap: Vec<f32>,
    /// Per position (prompt, then generated), the smallest margin of any MoE layer's
    /// router between its k-th and (k+1)-th expert (empty where the golden has none).
    pub router_margin: Vec<f32>,
}

pub struct Golden {
    pub prompts: Vec<GoldenPrompt>,
    pub meta: HashMap<String, String>,
}

fn tensor_f32(st: &SafeTensors, name: &str) -> (Vec<f32>, Vec<usize>) {
    let t = st
        .tensor(name)
        .unwrap_or_else(|e| panic!("golden tensor {name}: {e}"));
    let shape = t.shape().to_vec();
    let d = t.data();
    let v = match t.dtype() {
        Dtype::F32 => d
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => d
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::I64 => d
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f32)
            .collect(),
        other => panic!("golden tensor {name}: unexpected dtype {other:?}"),
    };
    (v, shape)
}

fn tensor_ids(st: &SafeTensors, name: &str) -> Vec<u32> {
    let t = st
        .tensor(name)
        .unwrap_or_else(|e| panic!("golden tensor {name}: {e}"));
    assert_eq!(t.dtype(), Dtype::I64, "{name}");
    t.data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect()
}

fn rows(v: Vec<f32>, shape: &[usize]) -> Vec<Vec<f32>> {
    v.chunks(shape[1]).map(|r| r.to_vec()).collect()
}

/// `file` is e.g. "olmoe-tiny.safetensors" under models/goldens.
pub fn load_golden(file: &str) -> Golden {
    let path = repo().join("models/goldens").join(file);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (_, md) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta: HashMap<String, String> = md.metadata().clone().unwrap_or_default();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut prompts = Vec::new();
    for p in 0.. {
        if st.tensor(&format!("p{p}.prompt_ids")).is_err() {
            break;
        }
        let (pl, ps) = tensor_f32(&st, &format!("p{p}.prompt_logits"));
        let (sl, ss) = tensor_f32(&st, &format!("p{p}.step_logits"));
        prompts.push(GoldenPrompt {
            text: meta.get(&format!("p{p}.text")).cloned().unwrap_or_default(),
            prompt_ids: tensor_ids(&st, &format!("p{p}.prompt_ids")),
            prompt_logits: rows(pl, &ps),
            prompt_gap: tensor_f32(&st, &format!("p{p}.prompt_logits_top2_gap")).0,
            generated_ids: tensor_ids(&st, &format!("p{p}.generated_ids")),
            step_logits: rows(sl, &ss),
            step_gap: tensor_f32(&st, &format!("p{p}.step_top2_gap")).0,
            router_margin: match st.tensor(&format!("p{p}.router_margin")) {
                Ok(_) => {
                    let (m, shape) = tensor_f32(&st, &format!("p{p}.router_margin"));
                    (0..shape[1])
                        .map(|t| {
                            (0..shape[0])
                                .map(|l| m[l * shape[1] + t])
                                .fold(f32::INFINITY, f32::min)
                        })
                        .collect()
                }
                Err(_) => Vec::new(),
            },
        });
    }
    assert!(!prompts.is_empty(), "{}: no prompts", path.display());
    Golden { prompts, meta }
}

/// Largest |a - b| and the index where it occurs.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> (f32, usize) {
    assert_eq!(a.len(), b.len());
    let mut m = (0.0f32, 0usize);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let d = (x - y).abs();
        if d > m.0 || d.is_nan() {
            m = (d, i);
        }
    }
    m
}

/// A symbolic link to a directory. On Windows a directory symlink needs Developer Mode or
/// the privilege to make one; the tests that use it are written for Unix and build there.
pub fn symlink_dir(target: &Path, link: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    return std::os::unix::fs::symlink(target, link);
    #[cfg(windows)]
    return std::os::windows::fs::symlink_dir(target, link);
}

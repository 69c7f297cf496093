//! Writing small safetensors files and checkpoints for the loader tests, and helpers for
//! their error messages.
#![allow(dead_code)]

use std::fs;
use std::path::Path;

use half::bf16;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

/// A tensor to write: name, dtype, shape, raw little-endian bytes.
pub struct T {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

pub fn t_f32(name: &str, shape: &[usize], vals: &[f32]) -> T {
    assert_eq!(shape.iter().product::<usize>(), vals.len());
    T {
        name: name.into(),
        dtype: Dtype::F32,
        shape: shape.to_vec(),
        bytes: vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

pub fn t_bf16(name: &str, shape: &[usize], vals: &[f32]) -> T {
    assert_eq!(shape.iter().product::<usize>(), vals.len());
    T {
        name: name.into(),
        dtype: Dtype::BF16,
        shape: shape.to_vec(),
        bytes: vals
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_bits().to_le_bytes())
            .collect(),
    }
}

pub fn t_bf16_bits(name: &str, bits: &[u16]) -> T {
    T {
        name: name.into(),
        dtype: Dtype::BF16,
        shape: vec![bits.len()],
        bytes: bits.iter().flat_map(|b| b.to_le_bytes()).collect(),
    }
}

pub fn t_f16_bits(name: &str, bits: &[u16]) -> T {
    T {
        name: name.into(),
        dtype: Dtype::F16,
        shape: vec![bits.len()],
        bytes: bits.iter().flat_map(|b| b.to_le_bytes()).collect(),
    }
}

pub fn serialize(tensors: &[T]) -> Vec<u8> {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                TensorView::new(t.dtype, t.shape.clone(), &t.bytes).unwrap(),
            )
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

pub fn write_st(path: &Path, tensors: &[T]) {
    fs::write(path, serialize(tensors)).unwrap();
}

/// Writes shards and an index mapping every tensor to its shard.
pub fn write_sharded(dir: &Path, shards: &[(&str, Vec<T>)]) {
    let mut map = serde_json::Map::new();
    for (file, tensors) in shards {
        write_st(&dir.join(file), tensors);
        for t in tensors {
            map.insert(t.name.clone(), serde_json::Value::String(file.to_string()));
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

pub fn err_string<T>(r: wgmoe::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

pub fn assert_mentions(msg: &str, needles: &[&str]) {
    for n in needles {
        assert!(
            msg.contains(n),
            "error message {msg:?} does not mention {n:?}"
        );
    }
}

/// Deterministic pseudo-random values exactly representable in bf16.
pub fn pattern(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            bf16::from_f32((s % 2001) as f32 / 1000.0 - 1.0).to_f32()
        })
        .collect()
}

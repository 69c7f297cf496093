//! Tensor bytes of a checkpoint to f32 or f16 values, each checked as it is converted.

use half::{bf16, f16};

use super::DType;

// Conversions. Tensor data in a mapping need not be 2- or 4-byte aligned, so elements are
// assembled from little-endian bytes; chunks_exact keeps the loops free of bounds checks.
// Every value is checked as it is converted (it is read anyway): a NaN or ±inf weight, or
// one the f16 conversion would turn into ±inf, is an error naming its flat index.

/// The first bad value of a conversion: its index in the converted range, and the value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BadValue {
    NonFinite {
        index: usize,
        value: f32,
    },
    /// Finite in the source, beyond f16's ±65504.
    OutOfF16Range {
        index: usize,
        value: f32,
    },
}

impl BadValue {
    /// The message, with the index shifted by `offset` (the range's start in the tensor).
    pub fn describe(self, offset: usize) -> String {
        match self {
            BadValue::NonFinite { index, value } => format!(
                "element {} is {value}: wgmoe refuses non-finite (NaN or infinite) weights; the checkpoint is corrupt or was saved from a diverged model",
                offset + index
            ),
            BadValue::OutOfF16Range { index, value } => format!(
                "element {} is {value}, outside the f16 range (|x| <= 65504): wgmoe stores non-routed weights (and f16 experts) as f16, where it would become infinite, and refuses such a checkpoint",
                offset + index
            ),
        }
    }
}

pub(super) fn bf16_at(c: &[u8]) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16)
}

pub(super) fn convert_f32(dt: DType, bytes: &[u8]) -> std::result::Result<Vec<f32>, BadValue> {
    let v: Vec<f32> = match dt {
        // bf16 is the top half of an f32: widening is a shift, exact.
        DType::BF16 => bytes.chunks_exact(2).map(bf16_at).collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    };
    match v.iter().position(|x| !x.is_finite()) {
        Some(index) => Err(BadValue::NonFinite {
            index,
            value: v[index],
        }),
        None => Ok(v),
    }
}

pub(super) fn convert_f16(dt: DType, bytes: &[u8]) -> std::result::Result<Vec<f16>, BadValue> {
    let v: Vec<f16> = match dt {
        // bf16 -> f32 is exact, so this rounds once (to nearest even); tiny values become
        // f16 subnormals or zero, values beyond the f16 range ±inf (refused below).
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_f32(bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
    };
    let Some(index) = v.iter().position(|x| !x.is_finite()) else {
        return Ok(v);
    };
    // The source value, to tell a non-finite weight from an overflow.
    let value = match dt {
        DType::BF16 => bf16_at(&bytes[2 * index..]),
        DType::F16 => v[index].to_f32(),
        DType::F32 => {
            let c = &bytes[4 * index..];
            f32::from_le_bytes([c[0], c[1], c[2], c[3]])
        }
    };
    Err(if value.is_finite() {
        BadValue::OutOfF16Range { index, value }
    } else {
        BadValue::NonFinite { index, value }
    })
}

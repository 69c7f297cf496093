//! ggml tensor types: the id a GGUF tensor info carries, its block shape, and which ones
//! wgmoe can compute with.
//!
//! Ids, block sizes and byte sizes are ggml's (`ggml/include/ggml.h` `enum ggml_type`,
//! `ggml/src/ggml-common.h` block structs, `ggml/src/ggml.c` `type_traits`), checked against
//! the `gguf` Python package's `GGML_QUANT_SIZES` (llama.cpp 0.3.36 sources / gguf 0.19.0).

/// Every tensor type id a GGUF file may carry (ids 4, 5 and 31–33, 36–38 were removed from
/// ggml and are not valid in files).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
    Q2_0,
}

/// Elements in a K-quant super-block (`QK_K`).
pub const QK_K: usize = 256;

impl GgmlType {
    /// (type id, type, elements per block, bytes per block).
    const TABLE: &'static [(u32, GgmlType, usize, usize)] = &[
        (0, GgmlType::F32, 1, 4),
        (1, GgmlType::F16, 1, 2),
        (2, GgmlType::Q4_0, 32, 2 + 16),
        (3, GgmlType::Q4_1, 32, 2 + 2 + 16),
        (6, GgmlType::Q5_0, 32, 2 + 4 + 16),
        (7, GgmlType::Q5_1, 32, 2 + 2 + 4 + 16),
        (8, GgmlType::Q8_0, 32, 2 + 32),
        (9, GgmlType::Q8_1, 32, 4 + 32),
        (10, GgmlType::Q2_K, QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
        (11, GgmlType::Q3_K, QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
        (12, GgmlType::Q4_K, QK_K, 2 + 2 + 12 + QK_K / 2),
        (13, GgmlType::Q5_K, QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2),
        (
            14,
            GgmlType::Q6_K,
            QK_K,
            QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
        ),
        (15, GgmlType::Q8_K, QK_K, 4 + QK_K + QK_K / 8),
        (16, GgmlType::IQ2_XXS, QK_K, 2 + QK_K / 4),
        (17, GgmlType::IQ2_XS, QK_K, 2 + QK_K / 4 + QK_K / 32),
        (18, GgmlType::IQ3_XXS, QK_K, 2 + QK_K / 4 + QK_K / 8),
        (19, GgmlType::IQ1_S, QK_K, 2 + QK_K / 8 + QK_K / 16),
        (20, GgmlType::IQ4_NL, 32, 2 + 16),
        (
            21,
            GgmlType::IQ3_S,
            QK_K,
            2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4,
        ),
        (22, GgmlType::IQ2_S, QK_K, 2 + QK_K / 4 + QK_K / 16),
        (23, GgmlType::IQ4_XS, QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
        (24, GgmlType::I8, 1, 1),
        (25, GgmlType::I16, 1, 2),
        (26, GgmlType::I32, 1, 4),
        (27, GgmlType::I64, 1, 8),
        (28, GgmlType::F64, 1, 8),
        (29, GgmlType::IQ1_M, QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
        (30, GgmlType::BF16, 1, 2),
        (34, GgmlType::TQ1_0, QK_K, 2 + 4 * 13),
        (35, GgmlType::TQ2_0, QK_K, 2 + 64),
        (39, GgmlType::MXFP4, 32, 1 + 16),
        (40, GgmlType::NVFP4, 64, 4 + 32),
        (41, GgmlType::Q1_0, 128, 2 + 16),
        (42, GgmlType::Q2_0, 64, 2 + 16),
    ];

    /// The type of a tensor info's type id; None for ids ggml never had or removed.
    pub fn from_id(id: u32) -> Option<Self> {
        Self::TABLE.iter().find(|e| e.0 == id).map(|e| e.1)
    }

    fn entry(self) -> &'static (u32, GgmlType, usize, usize) {
        // Every variant has exactly one row (checked by a test).
        Self::TABLE
            .iter()
            .find(|e| e.1 == self)
            .unwrap_or(&Self::TABLE[0])
    }

    pub fn id(self) -> u32 {
        self.entry().0
    }

    /// Elements per block (1 for the plain types).
    pub fn block_elems(self) -> usize {
        self.entry().2
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.entry().3
    }

    /// ggml's name of the type (`ggml_type_name`): "q4_K", "f16", "iq2_xxs", ...
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q8_1 => "q8_1",
            GgmlType::Q2_K => "q2_K",
            GgmlType::Q3_K => "q3_K",
            GgmlType::Q4_K => "q4_K",
            GgmlType::Q5_K => "q5_K",
            GgmlType::Q6_K => "q6_K",
            GgmlType::Q8_K => "q8_K",
            GgmlType::IQ2_XXS => "iq2_xxs",
            GgmlType::IQ2_XS => "iq2_xs",
            GgmlType::IQ3_XXS => "iq3_xxs",
            GgmlType::IQ1_S => "iq1_s",
            GgmlType::IQ4_NL => "iq4_nl",
            GgmlType::IQ3_S => "iq3_s",
            GgmlType::IQ2_S => "iq2_s",
            GgmlType::IQ4_XS => "iq4_xs",
            GgmlType::I8 => "i8",
            GgmlType::I16 => "i16",
            GgmlType::I32 => "i32",
            GgmlType::I64 => "i64",
            GgmlType::F64 => "f64",
            GgmlType::IQ1_M => "iq1_m",
            GgmlType::BF16 => "bf16",
            GgmlType::TQ1_0 => "tq1_0",
            GgmlType::TQ2_0 => "tq2_0",
            GgmlType::MXFP4 => "mxfp4",
            GgmlType::NVFP4 => "nvfp4",
            GgmlType::Q1_0 => "q1_0",
            GgmlType::Q2_0 => "q2_0",
        }
    }

    /// The types wgmoe computes with (CPU references in `dequant`; kernels follow them).
    pub const SUPPORTED: &'static [GgmlType] = &[
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];

    pub fn is_supported(self) -> bool {
        Self::SUPPORTED.contains(&self)
    }

    /// Every type, in id order.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        Self::TABLE.iter().map(|e| e.1)
    }

    /// Bytes of one row of `elems` elements, or None when `elems` is not a whole number of
    /// blocks (ggml requires rows of whole blocks).
    pub fn row_bytes(self, elems: u64) -> Option<u64> {
        let be = self.block_elems() as u64;
        if !elems.is_multiple_of(be) {
            return None;
        }
        (elems / be).checked_mul(self.block_bytes() as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_has_one_row_and_ids_round_trip() {
        let all: Vec<GgmlType> = GgmlType::all().collect();
        assert_eq!(all.len(), 35);
        for t in &all {
            assert_eq!(all.iter().filter(|u| *u == t).count(), 1, "{t}");
            assert_eq!(GgmlType::from_id(t.id()), Some(*t));
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 43, 1000] {
            assert_eq!(GgmlType::from_id(removed), None);
        }
    }

    #[test]
    fn block_sizes_of_the_supported_types() {
        // ggml-common.h static_asserts.
        assert_eq!(GgmlType::Q8_0.block_bytes(), 34);
        assert_eq!(GgmlType::Q4_0.block_bytes(), 18);
        assert_eq!(GgmlType::Q5_0.block_bytes(), 22);
        assert_eq!(GgmlType::Q5_1.block_bytes(), 24);
        assert_eq!(GgmlType::Q4_K.block_bytes(), 144);
        assert_eq!(GgmlType::Q5_K.block_bytes(), 176);
        assert_eq!(GgmlType::Q6_K.block_bytes(), 210);
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(320), None);
        assert_eq!(GgmlType::BF16.row_bytes(3), Some(6));
    }
}

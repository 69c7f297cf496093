//! How a packed matrix (an expert slot's, or a GGUF file's dense matrix held in its own
//! blocks) is stored: the kinds of `blocks::quant` (INT4, affine INT4, Q8_0) and of
//! `blocks::kquant` (GGUF's K-quant and 5-bit blocks), and the numbers both modules need of
//! them, here so that neither imports the other.

/// Columns per scale block of wgmoe's INT4 (`blocks::quant`), and per K-quant super-block.
pub const BLOCK: usize = 256;
/// Columns per vec4<u32> of nibbles.
pub const COLS_PER_VEC4: usize = 32;

/// The largest magnitude an INT4 block can hold: its f16 scale max|w| / 7 must be finite.
pub const MAX_ABS: f32 = 65504.0 * 7.0;

/// An affine block's |offset| is at most max|w| + 8 s with s <= 2 max|w| / 15: ~2.1 max|w|.
pub(crate) const AFFINE_SPAN: f32 = 2.1;

/// The largest magnitude a fitted block of a K-plane kind holds: its f16 scales finite.
pub const PLANES_MAX_ABS: f32 = 65504.0;

/// How a packed matrix is stored: wgmoe's INT4, or a GGUF file's blocks (affine INT4 for
/// Q4_0, Q8_0, the K-plane kinds for Q4_K, Q5_K, Q6_K and Q5_0/Q5_1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Q4Kind {
    /// One f16 scale per 256 columns, value = s (nibble - 8): wgmoe's own quantiser.
    Sym256,
    /// An f16 scale and an f16 offset per 32 columns, value = s (nibble - 8) + o: GGUF's
    /// 4-bit blocks as they are.
    Affine32,
    /// ggml's Q8_0 (`blocks::q8_0`: int8 per byte, 16 columns per vec4, an f16 scale per
    /// 32 columns): a GGUF file's Q8_0 expert matrices, and those stored as floats.
    Q8,
    /// GGUF's Q4_K, Q5_K and Q6_K as they are: nibbles, and a side record per 256 columns
    /// (`blocks::kquant`).
    Q4K,
    Q5K,
    Q6K,
    /// GGUF's Q5_0, Q5_1 (and Q4_1) as they are: nibbles, and per 32 columns an f16 scale,
    /// an f16 offset and the 5th bits (`blocks::kquant`).
    Q5A,
}

impl Q4Kind {
    /// Columns per scale block.
    pub fn block(self) -> usize {
        match self {
            Q4Kind::Sym256 | Q4Kind::Q4K | Q4Kind::Q5K | Q4Kind::Q6K => BLOCK,
            Q4Kind::Affine32 | Q4Kind::Q8 | Q4Kind::Q5A => COLS_PER_VEC4,
        }
    }
    /// f16 values per block in the scale section (scale, and the offset if any; a K-plane
    /// kind's whole side record, `blocks::kquant`).
    pub fn halves_per_block(self) -> usize {
        match self {
            Q4Kind::Sym256 | Q4Kind::Q8 => 1,
            Q4Kind::Affine32 => 2,
            k => 2 * k.record_words(),
        }
    }
    /// The largest magnitude a block can hold (its scale and offset finite in f16).
    pub fn max_abs(self) -> f32 {
        match self {
            Q4Kind::Sym256 => MAX_ABS,
            Q4Kind::Affine32 => 65504.0 / AFFINE_SPAN,
            Q4Kind::Q8 => crate::blocks::q8_0::MAX_ABS,
            _ => PLANES_MAX_ABS,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Q4Kind::Sym256 => "int4-b256",
            Q4Kind::Affine32 => "int4-a32",
            Q4Kind::Q8 => "q8_0",
            Q4Kind::Q4K => "q4_K",
            Q4Kind::Q5K => "q5_K",
            Q4Kind::Q6K => "q6_K",
            Q4Kind::Q5A => "q5-a32",
        }
    }

    /// Words of one side record of a K-plane kind (`blocks::kquant`, per [`Self::block`]
    /// columns); 0 for the others.
    pub fn record_words(self) -> usize {
        match self {
            Q4Kind::Q4K => 4,
            Q4Kind::Q5K => 12,
            Q4Kind::Q6K => 21,
            Q4Kind::Q5A => 2,
            _ => 0,
        }
    }

    /// Whether the kind is a nibble plane with side records (`blocks::kquant`).
    pub fn is_planes(self) -> bool {
        matches!(self, Q4Kind::Q4K | Q4Kind::Q5K | Q4Kind::Q6K | Q4Kind::Q5A)
    }

    /// The 4-bit kind a GGUF matrix of this kind is rounded into when every expert matrix
    /// must be 4-bit (`--expert-precision int4-strict`): Q4_K stays, the wider kinds become
    /// affine INT4.
    pub fn four_bit(self) -> Q4Kind {
        match self {
            Q4Kind::Q8 | Q4Kind::Q5K | Q4Kind::Q6K | Q4Kind::Q5A => Q4Kind::Affine32,
            k => k,
        }
    }

    /// Bits of storage per weight (padding aside): what a slot or matrix of this kind costs.
    pub fn bits_per_weight(self) -> f64 {
        (self.cols_per_vec4() as f64).recip() * 128.0
            + (self.halves_per_block() * 16) as f64 / self.block() as f64
    }

    /// Columns per vec4<u32> of the quant section.
    pub fn cols_per_vec4(self) -> usize {
        match self {
            Q4Kind::Q8 => crate::blocks::q8_0::COLS_PER_VEC4,
            _ => COLS_PER_VEC4,
        }
    }
}

/// The kinds of an expert slot's matrices: gate and up share one, down has its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotKinds {
    pub gate_up: Q4Kind,
    pub down: Q4Kind,
}

impl SlotKinds {
    pub const SYM256: SlotKinds = SlotKinds {
        gate_up: Q4Kind::Sym256,
        down: Q4Kind::Sym256,
    };

    /// Each matrix in the kind `--expert-precision int4-strict` holds it in (4 bits).
    pub fn four_bit(self) -> SlotKinds {
        SlotKinds {
            gate_up: self.gate_up.four_bit(),
            down: self.down.four_bit(),
        }
    }
}

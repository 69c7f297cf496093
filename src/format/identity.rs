//! The converted INT4 format's names and identity (`wgmoe quantize` writes it, the loader
//! recognises and validates it; `crate::format::convert` has the writer and the checks): the format
//! constants, the name of a layer's packed-expert tensor, the fast checksum recorded per
//! layer, and how the dense weights are stored (f16, or ggml's Q8_0 blocks).

use crate::format::checkpoint::Checkpoint;

pub const FORMAT: &str = "wgmoe-int4";
pub const FORMAT_VERSION: &str = "1";
pub const ROUNDING: &str = "half-to-even";

pub fn experts_tensor(layer: usize) -> String {
    format!("model.layers.{layer}.mlp.experts.int4")
}

pub fn is_converted(ckpt: &Checkpoint) -> bool {
    ckpt.metadata().get("wgmoe.format").map(String::as_str) == Some(FORMAT)
}

/// Metadata key: how the converted file stores its dense weights (`f16` or `q8_0`; a file
/// written before the key existed stores f16).
pub const DENSE_PRECISION_KEY: &str = "wgmoe.dense_precision";
/// Metadata key: the stored layout of the Q8_0 dense weights (with `q8_0` only).
pub const DENSE_LAYOUT_KEY: &str = "wgmoe.dense_layout";
/// The stored layout of a Q8_0 dense weight [rows, cols]: ggml's blocks as a GGUF Q8_0
/// tensor holds them (`crate::blocks::q8_0`), as a U8 tensor [rows, ggml_q8_row_bytes(cols)].
pub const Q8_0_LAYOUT: &str = "ggml-q8_0: U8 [rows, ceil(cols/32)*34]; per row, blocks of 32 values along the input, each an f16 scale d (little-endian) then 32 int8 (q = roundf(w/d), d = max|w|/127); a partial last block zero-padded";

/// How a checkpoint stores its dense weights (attention q/k/v/o, shared experts, dense MLP
/// layers, lm_head: [`is_dense_weight`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum DenseStorage {
    /// As floats (f16 in a converted model; the source dtype in a Hugging Face one).
    #[serde(rename = "f16")]
    F16,
    /// ggml's Q8_0 blocks ([`Q8_0_LAYOUT`]), written by `wgmoe quantize --dense-precision q8_0`.
    #[serde(rename = "q8_0")]
    Q8_0,
}

impl DenseStorage {
    pub fn name(self) -> &'static str {
        match self {
            DenseStorage::F16 => "f16",
            DenseStorage::Q8_0 => "q8_0",
        }
    }
}

/// The dense weights' storage a checkpoint records: Q8_0 only in a converted model whose
/// metadata says so; a converted model without the key (written before it existed) and a
/// Hugging Face checkpoint hold floats. An unknown value, or Q8_0 without the layout this
/// build reads, is an error naming the file and the key.
pub fn dense_storage(ckpt: &Checkpoint) -> crate::error::Result<DenseStorage> {
    if !is_converted(ckpt) {
        return Ok(DenseStorage::F16);
    }
    let md = ckpt.metadata();
    let file = || ckpt.dir().join("model.safetensors");
    match md.get(DENSE_PRECISION_KEY).map(String::as_str) {
        None | Some("f16") => Ok(DenseStorage::F16),
        Some("q8_0") => match md.get(DENSE_LAYOUT_KEY).map(String::as_str) {
            Some(Q8_0_LAYOUT) => Ok(DenseStorage::Q8_0),
            got => Err(crate::error::Error::bad_file(
                file(),
                format!(
                    "metadata `{DENSE_LAYOUT_KEY}` is `{}`, expected `{Q8_0_LAYOUT}`; re-run `wgmoe quantize`",
                    got.unwrap_or("<missing>")
                ),
            )),
        },
        Some(other) => Err(crate::error::Error::bad_file(
            file(),
            format!(
                "metadata `{DENSE_PRECISION_KEY}` is `{other}`, expected `f16` or `q8_0`; re-run `wgmoe quantize`"
            ),
        )),
    }
}

/// Whether a non-routed tensor is a dense weight, stored in the dense format (attention
/// q/k/v/o, shared experts, dense MLP layers, lm_head; not the router, the shared-expert
/// gate, norms, biases or embeddings): the tensors `--dense-precision q8_0` quantises on
/// load, admission counts in Q8_0, and `wgmoe quantize --dense-precision q8_0` stores so.
pub fn is_dense_weight(name: &str) -> bool {
    name == "lm_head.weight"
        || [
            ".self_attn.q_proj.weight",
            ".self_attn.k_proj.weight",
            ".self_attn.v_proj.weight",
            ".self_attn.o_proj.weight",
            ".mlp.gate_proj.weight",
            ".mlp.up_proj.weight",
            ".mlp.down_proj.weight",
            ".mlp.shared_expert.gate_proj.weight",
            ".mlp.shared_expert.up_proj.weight",
            ".mlp.shared_expert.down_proj.weight",
        ]
        .iter()
        .any(|s| name.ends_with(s))
}

/// Bytes of one row of `cols` values as ggml Q8_0 blocks (34 bytes per 32 values).
pub fn ggml_q8_row_bytes(cols: usize) -> usize {
    cols.div_ceil(crate::blocks::q8_0::BLOCK) * crate::blocks::q8_0::GGML_BLOCK_BYTES
}

/// Whether `name` is stored as Q8_0 blocks in this checkpoint.
pub fn stored_q8(ckpt: &Checkpoint, name: &str) -> crate::error::Result<bool> {
    if ckpt.is_gguf() {
        return Ok(
            is_dense_weight(name) && ckpt.ggml_type(name) == Some(crate::gguf::GgmlType::Q8_0)
        );
    }
    Ok(dense_storage(ckpt)? == DenseStorage::Q8_0 && is_dense_weight(name))
}

/// A 64-bit checksum fast enough to run over gigabytes at load (one multiply per 8 bytes).
pub fn fast_hash(bytes: &[u8]) -> u64 {
    let mut h = FastHasher::new(bytes.len() as u64);
    h.update(bytes);
    h.finish()
}

/// `fast_hash` computed incrementally, for data written in pieces. The total length is part
/// of the hash's seed, so it must be known up front.
#[derive(Clone, Debug)]
pub struct FastHasher {
    h: u64,
    carry: [u8; 8],
    n_carry: usize,
    total: u64,
    seen: u64,
}

impl FastHasher {
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    pub fn new(total_len: u64) -> Self {
        FastHasher {
            h: 0xcbf2_9ce4_8422_2325 ^ total_len,
            carry: [0; 8],
            n_carry: 0,
            total: total_len,
            seen: 0,
        }
    }

    fn word(&mut self, c: &[u8]) {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        self.h = (self.h ^ w).wrapping_mul(Self::PRIME).rotate_left(29);
    }

    pub fn update(&mut self, mut bytes: &[u8]) {
        self.seen += bytes.len() as u64;
        if self.n_carry > 0 {
            let take = (8 - self.n_carry).min(bytes.len());
            self.carry[self.n_carry..self.n_carry + take].copy_from_slice(&bytes[..take]);
            self.n_carry += take;
            bytes = &bytes[take..];
            if self.n_carry < 8 {
                return;
            }
            let c = self.carry;
            self.word(&c);
            self.n_carry = 0;
        }
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.word(c);
        }
        let rest = chunks.remainder();
        self.carry[..rest.len()].copy_from_slice(rest);
        self.n_carry = rest.len();
    }

    /// Bytes hashed so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// The hash; `None` when the bytes seen are not the length given to `new`.
    pub fn try_finish(&self) -> Option<u64> {
        (self.seen == self.total).then(|| self.finish())
    }

    pub fn finish(&self) -> u64 {
        let mut h = self.h;
        for &b in &self.carry[..self.n_carry] {
            h = (h ^ b as u64).wrapping_mul(Self::PRIME);
        }
        h ^ (h >> 32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incremental_hash_matches_one_shot() {
        let data: Vec<u8> = (0..1001u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        for len in [0usize, 1, 7, 8, 9, 64, 1000, 1001] {
            let d = &data[..len];
            let want = fast_hash(d);
            for piece in [1usize, 3, 8, 13, 500] {
                let mut h = FastHasher::new(len as u64);
                for c in d.chunks(piece) {
                    h.update(c);
                }
                assert_eq!(h.try_finish(), Some(want), "len {len} piece {piece}");
            }
        }
        let mut h = FastHasher::new(10);
        h.update(&[1, 2, 3]);
        assert_eq!(h.try_finish(), None);
    }
}

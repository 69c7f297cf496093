//! The converted INT4 format's names and identity (`wgmoe quantize` writes it, the loader
//! recognises and validates it; `crate::format::convert` has the writer and the checks): the format
//! constants, the name of a layer's packed-expert tensor, and the fast checksum recorded
//! per layer.

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

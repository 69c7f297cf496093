//! The host source: the complete, immutable, already-quantised expert set in host memory,
//! from which every upload to a device slot is copied. Nothing writes to it after load.

use std::sync::Arc;

use crate::blocks::quant::Q4SlotLayout;
use crate::error::{Error, Result};
use crate::format::checkpoint::Checkpoint;

/// Where one layer's packed experts live in host memory. Never written after load.
pub enum HostLayer {
    /// A `model.layers.{l}.mlp.experts.int4` tensor of a converted file, memory-mapped
    /// read-only.
    Mapped(String),
    /// Quantised on load, then frozen (a boxed slice is never resized or rewritten).
    Owned(Box<[u8]>),
}

pub struct HostSource {
    pub ckpt: Arc<Checkpoint>,
    /// Per layer: its packed experts (None for a layer without routed experts).
    pub layers: Vec<Option<HostLayer>>,
    pub num_experts: usize,
    pub slot_bytes: usize,
    /// Per layer: the slot layout its experts are packed in (a GGUF file's layers may hold
    /// theirs in different kinds; every slot takes `slot_bytes`).
    pub layouts: Vec<Q4SlotLayout>,
}

impl HostSource {
    /// The slot layout of layer `layer`'s experts.
    pub fn layout(&self, layer: usize) -> Result<&Q4SlotLayout> {
        self.layouts
            .get(layer)
            .ok_or_else(|| Error::Other(format!("layer {layer} has no slot layout")))
    }

    pub fn layer_bytes(&self, layer: usize) -> Result<&[u8]> {
        match self.layers.get(layer).and_then(|l| l.as_ref()) {
            Some(HostLayer::Owned(b)) => Ok(b),
            Some(HostLayer::Mapped(name)) => {
                self.ckpt.raw_u8(name, &[self.num_experts, self.slot_bytes])
            }
            None => Err(Error::Other(format!("layer {layer} has no routed experts"))),
        }
    }

    /// The packed bytes of one expert.
    pub fn expert(&self, layer: usize, expert: u32) -> Result<&[u8]> {
        let b = self.layer_bytes(layer)?;
        let s = expert as usize * self.slot_bytes;
        b.get(s..s + self.slot_bytes).ok_or_else(|| {
            Error::Other(format!(
                "expert {expert} of layer {layer} is outside the host source"
            ))
        })
    }

    /// Checksum of every layer's packed experts (tests show it unchanged after a run).
    pub fn checksum(&self) -> Result<u64> {
        let mut h = 0u64;
        for l in 0..self.layers.len() {
            if self.layers[l].is_some() {
                h = h.rotate_left(7) ^ crate::format::identity::fast_hash(self.layer_bytes(l)?);
            }
        }
        Ok(h)
    }
}

//! wgmoe: Mixture-of-Experts inference on wgpu compute shaders.

pub mod checkpoint;
pub mod config;
pub mod cpu_ref;
pub mod error;
pub mod tokenizer;

pub use error::{Error, Result};
pub mod gpu;
pub mod model;
pub mod engine;
pub mod generate;
pub mod sampling;
pub mod quant;
pub mod convert;
pub mod eval;
pub mod inspect;
pub mod residency;
pub mod synth;
pub mod bench;

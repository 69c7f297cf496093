//! wgmoe: Mixture-of-Experts inference on wgpu compute shaders.

pub mod checkpoint;
pub mod config;
pub mod cpu_ref;
pub mod error;
pub mod tokenizer;

pub use error::{Error, Result};
pub mod bench;
pub mod convert;
pub mod engine;
pub mod eval;
pub mod generate;
pub mod gpu;
pub mod inspect;
pub mod interrupt;
pub mod limits;
pub mod model;
pub mod output_dir;
pub mod quant;
pub mod residency;
pub mod sampling;
pub mod synth;

//! wgmoe: Mixture-of-Experts inference on wgpu compute shaders.
//!
//! The modules read bottom-up: formats and configs (`config`, `checkpoint`, `tokenizer`,
//! `quant`, `format`, `manifest`, `convert`), the device-independent residency state
//! machine (`residency`), the backend seam (`backend`, with the wgpu implementation), the
//! model on a device (`model`), then `admission`, `engine`, `generate` and the commands'
//! helpers (`bench`, `eval`, `inspect`, `synth`); `session` keeps a model loaded with a
//! reusable KV cache, and `serve` is the HTTP server over it.

pub mod admission;
pub mod backend;
pub mod bandwidth;
pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod convert;
pub mod cpu_ref;
pub mod engine;
pub mod error;
pub mod eval;
pub mod format;
pub mod generate;
pub mod gguf;
pub mod heatmap;
pub mod inspect;
pub mod interrupt;
pub mod kernel_report;
pub mod limits;
pub mod live;
pub mod manifest;
pub mod measure;
pub mod model;
pub mod output_dir;
pub mod planner;
pub mod q8_0;
pub mod quant;
pub mod render;
pub mod residency;
pub mod sampling;
pub mod serve;
pub mod session;
pub mod simulate;
pub mod svg;
pub mod synth;
pub mod tokenizer;
pub mod trace;
pub mod units;

pub use error::{Error, Result};

//! wgmoe: Mixture-of-Experts inference on wgpu compute shaders.
//!
//! The modules read bottom-up, as ARCHITECTURE.md's layer table (`tests/layering.rs`
//! pins it): foundations (`error`, `limits`, `units`, `interrupt`), the quantised block
//! formats (`blocks`) and the tokenizer, `config`, GGUF files (`gguf`), checkpoints and
//! formats (`format`: checkpoints, the converted format, manifests, routing traces,
//! pictures), the
//! device-independent residency state machine (`residency`), the backend seam (`backend`,
//! with the wgpu implementation), the model on a device (`model`), then `runtime`
//! (admission, opening a model, the generation loop, sampling) and the commands' helpers
//! (`insight`: inspect, kernels, eval, measure, simulate, heatmap, live; `bench`, `synth`,
//! `planner`); `session` keeps a model loaded with a reusable KV cache, and `serve` is the
//! HTTP server over it; `loadtest` is a client that loads and checks a running server.

pub mod backend;
pub mod bench;
pub mod blocks;
pub mod cache_dir;
pub mod config;
pub mod cpu_ref;
pub mod error;
pub mod format;
pub mod gguf;
pub mod insight;
pub mod interrupt;
pub mod limits;
pub mod loadtest;
pub mod model;
pub mod planner;
pub mod residency;
pub mod runtime;
pub mod serve;
pub mod session;
pub mod synth;
pub mod tokenizer;
pub mod units;

pub use error::{Error, Result};

//! Formats and configs, the bottom layer (with `config`, `gguf`, `limits` and `units`):
//! what wgmoe reads and writes, with no device and no model behind it. Safetensors
//! checkpoints and tokenizers, the INT4 and Q8_0 layouts and quantisers, the converted format's
//! identity, its writer and its output directories, the manifest of tensors a config
//! implies, routing traces, the measured-bandwidth file, and SVG/PNG pictures.

pub mod bandwidth;
pub mod block_scale;
pub mod checkpoint;
pub mod convert;
pub mod identity;
pub mod kind;
pub mod kquant;
pub mod manifest;
pub mod output_dir;
pub mod q8_0;
pub mod quant;
pub mod render;
pub mod safetensors_stream;
pub mod svg;
pub mod tokenizer;
pub mod trace;

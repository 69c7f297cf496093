//! Checkpoints and formats, above `blocks`, `tokenizer`, `config` and `gguf`: what wgmoe
//! reads and writes, with no device and no model behind it. Safetensors and GGUF
//! checkpoints behind one `Checkpoint`, the converted format's identity,
//! its writer and its output directories, the manifest of tensors a config implies, routing
//! traces, the measured-bandwidth file, and SVG/PNG pictures.

pub mod bandwidth;
pub mod checkpoint;
pub mod convert;
pub mod identity;
pub mod manifest;
pub mod output_dir;
pub mod render;
pub mod safetensors_stream;
pub mod svg;
pub mod trace;

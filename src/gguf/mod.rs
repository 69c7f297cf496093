//! GGUF models (llama.cpp's format): the memory-mapped, validated reader (`file`, `model`),
//! ggml's block types and their CPU dequantisers (`types`, `dequant`), metadata ->
//! [`crate::config::ModelConfig`] (`config`), llama.cpp's tensor names (`names`), the Q/K
//! row order of llama-arch files (`permute`), and the tokenizer in the file (`tokenizer`).
//!
//! Loading a model's tensors:
//! ```no_run
//! # fn main() -> wgmoe::Result<()> {
//! use wgmoe::gguf::{GgufModel, ModelTensors};
//! let model = GgufModel::open(std::path::Path::new("model-Q4_K_M.gguf"))?;
//! let cfg = wgmoe::gguf::model_config(&model)?; // validates every tensor too
//! let names = ModelTensors::resolve(&model, &cfg)?;
//! let down = model.tensor(match &names.layers[0].experts {
//!     wgmoe::gguf::names::Experts::Separate { down, .. } => down,
//!     wgmoe::gguf::names::Experts::FusedGateUp { down, .. } => down,
//! })?;
//! let expert3 = down.expert(3)?; // one contiguous slice: ne {n_ff, n_embd}
//! let _bytes: &[u8] = expert3.data;
//! # Ok(()) }
//! ```

pub mod config;
pub mod dequant;
pub mod file;
pub mod meta;
pub mod model;
pub mod names;
pub mod permute;
pub mod source;
pub mod tokenizer;
pub mod types;
pub mod writer;

pub use config::{model_config, native_kind};
pub use file::{GgufFile, TensorInfo};
pub use meta::{MetaValue, Metadata};
pub use model::{is_gguf_path, GgufModel, TensorView};
pub use names::ModelTensors;
pub use types::GgmlType;

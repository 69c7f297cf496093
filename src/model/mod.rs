//! A model on a device: its weights, the op builders, the workspace and the forward pass
//! that runs them, with the expert residency runtime for partial residency.

mod attention_ops;
mod costs;
pub mod dense_mlp;
mod fills;
pub mod forward;
mod layers;
mod matmul_q8;
pub mod moe;
pub mod norm_fold;
mod op_env;
pub mod ops;
pub mod residency;
pub mod slot_mats;
pub mod solo;
mod step;
pub use step::StepRead;
pub mod tensors;
mod trace_hook;
pub mod weights;
pub mod workspace;

pub use forward::{Forward, ForwardOptions, Head, MAX_PIPELINE_DEPTH};
pub use moe::Executor;
pub use weights::ModelWeights;

//! A model on the GPU: its weights and the forward pass that runs them.

pub mod forward;
pub mod moe;
pub mod residency;
pub mod weights;

pub use forward::{Forward, ForwardOptions, Head};
pub use weights::ModelWeights;

//! The wgpu engine: device context, kernels and the operations built from them.

pub mod context;
pub mod kernels;
pub mod program;
pub mod tensor;

pub use context::{AdapterRequest, BackendChoice, GpuBuffer, GpuContext};

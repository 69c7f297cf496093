//! Quantised block formats, the bottom layer: the INT4 layouts (symmetric and affine, per
//! block of 32 to 256), Q8_0, the K-plane kinds read from GGUF (Q4_K, Q5_K, Q6_K, Q5_0,
//! Q5_1), their slot layouts, byte arithmetic, quantisers and dequantisers. No device, no
//! file and no config behind it: `config`, `gguf` and `format` all build on it.

pub mod block_scale;
pub mod kind;
pub mod kquant;
pub mod q8_0;
pub mod quant;

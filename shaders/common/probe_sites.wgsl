// Load sites of the memory-access probe (`wgmoe kernels`): which class of buffer a global
// load reads. The Rust twins are `backend::probe::Site`.
const SITE_W: u32 = 0u;      // weight words (16 bytes)
const SITE_WS: u32 = 1u;     // weight scales
const SITE_X: u32 = 2u;      // activations
const SITE_KV: u32 = 3u;     // the KV cache
// ids, slot tables, partial sums, and the small vectors of weights a step reads once (norm
// scales, one embedding row): sector efficiency is judged on the weight matrices.
const SITE_OTHER: u32 = 4u;

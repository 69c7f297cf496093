// The parameters and output bindings of the dense products over 16-byte weight words
// (matvec.wgsl, gemm.wgsl, matmul_q8.wgsl, matmul_q8_u.wgsl; backend::params::DenseParams).
struct Params {
    k: u32,               // input features
    n_rows: u32,          // rows served by this dispatch
    row_base: u32,        // output index of its first row
    words_per_row: u32,   // 16-byte words per weight row
    x_stride: u32,        // floats per token row of x
    out_stride: u32,      // floats per output row
    flags: u32,           // MATMUL_BIAS, MATMUL_ACCUMULATE, LAST_TOKEN_ONLY
    w_row0: u32,          // index of the first row inside the weight binding
    s_word0: u32,         // u32 offset of the scales in their binding (formats with scales)
    blocks_per_row: u32,  // scales per row
    group_rows: u32,      // matvec: rows per workgroup, 1 to ROWS (0: ROWS)
    eps: f32,             // matvec_norm: the RMSNorm's epsilon
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

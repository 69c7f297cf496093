// The parameters of the scratch-row attention kernels (attention.wgsl, attention_w.wgsl):
// scores go to a row of `scratch` per (head, token), so the context length is bounded by
// the cache, not by workgroup memory.
struct Params {
    n_heads: u32,
    n_kv: u32,
    head_dim: u32,
    scratch_stride: u32,  // floats per scratch row (>= cache capacity in positions)
    scale: f32,
    _a: u32,
    _b: u32,
    _c: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(5) var<storage, read_write> scratch: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

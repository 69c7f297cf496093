// Row r of a workgroup's ROWS (at most 4) as a vec4 mask: a lane adds a word's dot
// product into the accumulator of its row without indexing a private array (llvmpipe
// gives those scratch memory that Mesa 22.3 never frees).
fn onehot4(r: u32) -> vec4<f32> {
    return select(vec4<f32>(0.0), vec4<f32>(1.0), vec4<u32>(0u, 1u, 2u, 3u) == vec4<u32>(r));
}

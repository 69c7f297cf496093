// W4A16 activations from the uniform window (the `uniform_window` piece), for one-token
// steps: about 10x faster than storage loads on llvmpipe. Rows must start at a multiple of
// 4 floats; columns at and past `len` read as 0.
fn act32(base: u32, k0: u32, len: u32) -> Act32 {
    return Act32(xa(base, k0, len), xa(base, k0 + 4u, len), xa(base, k0 + 8u, len), xa(base, k0 + 12u, len),
                 xa(base, k0 + 16u, len), xa(base, k0 + 20u, len), xa(base, k0 + 24u, len), xa(base, k0 + 28u, len));
}

// W4A16 activations from the uniform window (the `uniform_window` piece), for one-token
// steps: about 10x faster than storage loads on llvmpipe. Rows must start at a multiple of
// 4 floats; columns at and past `len` read as 0.
// The token a workgroup serves: the window holds one token's activations (grid z is 1).
// A constant, so indices derived from it stay what the compiler sees as the old one-token
// kernels' (the workgroup's z coordinate made llvmpipe's fused down kernel 3x slower).
fn window_token(z: u32) -> u32 {
    return 0u;
}

fn act32(base: u32, k0: u32, len: u32) -> Act32 {
    return Act32(xa(base, k0, len), xa(base, k0 + 4u, len), xa(base, k0 + 8u, len), xa(base, k0 + 12u, len),
                 xa(base, k0 + 16u, len), xa(base, k0 + 20u, len), xa(base, k0 + 24u, len), xa(base, k0 + 28u, len));
}

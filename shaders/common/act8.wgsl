// Eight activations at a time from the storage buffer `x` (declared by the kernel at
// binding 2), for the f16-weight kernels. Columns at and past `len` read as 0: neither
// padding nor the next row may contribute (0 * NaN would). No dynamically indexed private
// array: llvmpipe gives those scratch memory per dispatch, and Mesa 22.3 does not free it.

// Column k of the row starting at float `base`, 0 at and past `len`.
fn act_at(base: u32, k: u32, len: u32) -> f32 {
    return select(0.0, x[base + min(k, len - 1u)], k < len);
}

// Columns k0 .. k0 + 8, all inside the row.
fn act8_whole(base: u32, k0: u32) -> array<vec4<f32>, 2> {
    let i = base + k0;
    return array<vec4<f32>, 2>(vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]),
                               vec4<f32>(x[i + 4u], x[i + 5u], x[i + 6u], x[i + 7u]));
}

// Columns k0 .. k0 + 8 of a row of `len`, the ones past its end 0.
fn act8_tail(base: u32, k0: u32, len: u32) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(
        vec4<f32>(act_at(base, k0, len), act_at(base, k0 + 1u, len), act_at(base, k0 + 2u, len), act_at(base, k0 + 3u, len)),
        vec4<f32>(act_at(base, k0 + 4u, len), act_at(base, k0 + 5u, len), act_at(base, k0 + 6u, len), act_at(base, k0 + 7u, len)));
}

// Columns k0 .. k0 + 8 of a row of `len`: one of the above, as the row allows.
fn act8(base: u32, k0: u32, len: u32) -> array<vec4<f32>, 2> {
    if (k0 + 8u <= len) { return act8_whole(base, k0); }
    return act8_tail(base, k0, len);
}

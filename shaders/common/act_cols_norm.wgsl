// Columns of the activations with the RMSNorm applied on load (matvec_norm: the norm
// folded into its consumer, so a one-token step needs no norm dispatch):
//   col(k) = w[k] * (x[k] * s),   s = inverseSqrt(mean(x^2) + eps)
// exactly as rmsnorm.wgsl computes it (the same per-lane sums and tree, the same products),
// so the product equals the unfused pair's bit for bit. Every workgroup computes s from the
// row it reads anyway (a device-wide reduction has no fence in WGSL: recomputed, not
// shared); the one workgroup `act_prepare` is told to writes the normalised row to
// binding 7 for the step's later consumers (the experts, the shared expert, the guess).
// Columns at and past `len` read as 0.
@group(0) @binding(6) var<storage, read> norm_w: array<u32>;  // f16 pairs
@group(0) @binding(7) var<storage, read_write> xn_out: array<f32>;

var<private> act_s: f32;
var<workgroup> act_ss: array<f32, 64>;

fn norm_weight(k: u32) -> f32 {
    probe(SITE_OTHER, (k / 2u) * 4u, 4u);
    return unpack2x16float(norm_w[k / 2u])[k % 2u];
}

// The row's scale (every lane of the workgroup calls it, in uniform control flow), and
// with `write_row` the normalised row into xn_out at the same offset as x's.
fn act_prepare(xb: u32, k: u32, li: u32, eps: f32, write_row: bool) {
    var ss = 0.0;
    for (var i = li; i < k; i += 64u) {
        let v = xs(xb + i);
        ss += v * v;
    }
    act_ss[li] = ss;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (li < s) { act_ss[li] += act_ss[li + s]; }
        workgroupBarrier();
    }
    act_s = inverseSqrt(act_ss[0] / f32(k) + eps);
    if (write_row) {
        for (var i = li; i < k; i += 64u) {
            xn_out[xb + i] = norm_weight(i) * (xs(xb + i) * act_s);
        }
    }
}

// Column k of the row at float `base`, normalised; 0 at and past `len`.
fn x_at(base: u32, k: u32, len: u32) -> f32 {
    let c = min(k, len - 1u);
    return select(0.0, norm_weight(c) * (xs(base + c) * act_s), k < len);
}

fn x4_at(base: u32, k: u32, len: u32) -> vec4<f32> {
    return vec4<f32>(x_at(base, k, len), x_at(base, k + 1u, len), x_at(base, k + 2u, len), x_at(base, k + 3u, len));
}

// Columns k0 .. k0 + 4 of the row at `base`: one vec4 load when aligned and whole.
fn x_quad(base: u32, k0: u32, len: u32) -> vec4<f32> {
    if (k0 + 4u <= len && (base + k0) % 4u == 0u && k0 % 2u == 0u) {
        let w = vec4<f32>(unpack2x16float(norm_w[k0 / 2u]), unpack2x16float(norm_w[k0 / 2u + 1u]));
        probe(SITE_OTHER, (k0 / 2u) * 4u, 8u);
        return w * (xv((base + k0) / 4u) * act_s);
    }
    return x4_at(base, k0, len);
}

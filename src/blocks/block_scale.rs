//! The one check that every block format with an f16 scale per block makes before it
//! packs values: a block whose scale would overflow f16 cannot be stored. INT4
//! (`blocks::quant`) and Q8_0 (`blocks::q8_0`) share it.

use half::f16;

/// The first element of `w` (rows of `inp` values, in blocks of `block` along each row)
/// whose block's scale `f16(max|w| / qmax)` would overflow f16, and its value: the
/// element of largest magnitude in the first such block. INT4 and Q8_0 share it.
pub fn first_oversized_block(
    w: &[f32],
    inp: usize,
    block: usize,
    qmax: f32,
) -> Option<(usize, f32)> {
    if inp == 0 {
        return None;
    }
    for (r, row) in w.chunks(inp).enumerate() {
        for (b, blk) in row.chunks(block).enumerate() {
            let amax = blk.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
            if !f16::from_f32(amax / qmax).is_finite() {
                let k = blk.iter().position(|x| x.abs() == amax).unwrap_or(0);
                return Some((r * inp + b * block + k, blk[k]));
            }
        }
    }
    None
}

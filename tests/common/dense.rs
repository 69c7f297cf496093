//! Shared by the dense matmul tests (tests/kernels_dense.rs, tests/kernels_matvec.rs): a
//! matmul case, its seeded inputs and CPU reference, and `ops::matmul` as the forward pass
//! records it.

use half::f16;

use super::check::strided;
use super::rng::Rng;
use wgmoe::backend::params::flags;
use wgmoe::backend::{Buffer, Program};
use wgmoe::cpu_ref;
use wgmoe::model::ops::{self, OpEnv};
use wgmoe::model::tensors::F16Matrix;

#[derive(Clone, Copy, Debug)]
pub struct MatmulCase {
    pub t: usize,
    pub k: usize,
    pub n: usize,
    pub x_stride: usize,
    pub out_stride: usize,
    pub flags: u32,
}

impl MatmulCase {
    pub fn new(t: usize, k: usize, n: usize, flags: u32) -> Self {
        MatmulCase {
            t,
            k,
            n,
            x_stride: k,
            out_stride: n,
            flags,
        }
    }

    pub fn out_rows(&self) -> usize {
        if self.flags & flags::LAST_TOKEN_ONLY != 0 {
            1
        } else {
            self.t
        }
    }
}

/// Seeded inputs of one matmul case: activations [t, k], f16 weights [n, k], a bias and
/// the output's prior contents (columns past n of a strided row hold 55, which must survive).
pub struct MatmulData {
    pub xs: Vec<f32>,
    pub w: Vec<f16>,
    pub bias: Vec<f32>,
    pub out0: Vec<f32>,
}

impl MatmulData {
    pub fn new(seed: u64, c: &MatmulCase) -> Self {
        let mut rng = Rng::new(seed);
        let xs = rng.vec(c.t * c.k, 1.0);
        let w = rng.f16s(c.n * c.k, 1.0);
        let bias = rng.vec(c.n, 1.0);
        let out0 = (0..c.out_rows() * c.out_stride)
            .map(|i| {
                if i % c.out_stride < c.n {
                    rng.f32(2.0)
                } else {
                    55.0
                }
            })
            .collect();
        MatmulData { xs, w, bias, out0 }
    }

    /// The CPU reference's output rows, strided as the GPU writes them.
    pub fn want(&self, c: &MatmulCase) -> Vec<f32> {
        let has = |f: u32| c.flags & f != 0;
        let x_rows = if has(flags::LAST_TOKEN_ONLY) {
            &self.xs[(c.t - 1) * c.k..]
        } else {
            &self.xs[..]
        };
        let prev: Vec<f32> = self
            .out0
            .iter()
            .enumerate()
            .filter(|(i, _)| i % c.out_stride < c.n)
            .map(|(_, v)| *v)
            .collect();
        let want = cpu_ref::matmul(
            x_rows,
            c.k,
            &self.w,
            c.n,
            has(flags::MATMUL_BIAS).then_some(&self.bias[..]),
            has(flags::MATMUL_ACCUMULATE).then_some(&prev[..]),
        )
        .unwrap();
        strided(&want, c.n, c.out_stride, 55.0)
    }
}

/// `ops::matmul` over every chunk of `m` as the forward pass records it, with the case's
/// flags (the bias flag follows whether a bias is given).
#[allow(clippy::too_many_arguments)]
pub fn push_matmul(
    prog: &mut Program,
    env: &OpEnv,
    m: &F16Matrix,
    x: &Buffer,
    bias: Option<&Buffer>,
    out: &Buffer,
    out_stride: usize,
    flags: u32,
) {
    assert_eq!(
        flags & flags::MATMUL_BIAS != 0,
        bias.is_some(),
        "matmul: the bias flag follows the bias"
    );
    ops::matmul(
        prog,
        env,
        m,
        x,
        bias,
        out,
        out_stride,
        flags & !flags::MATMUL_BIAS,
    );
}

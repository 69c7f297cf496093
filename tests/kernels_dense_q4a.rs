//! Dense matrices in affine INT4 (`WeightFormat::Q4A`: a GGUF file's Q4_0/Q4_K attention
//! and lm_head blocks as they are) through `ops::matmul` as the forward pass records it:
//! one-token steps (and the last token alone) on the matvec, multi-token steps on the
//! tiled GEMM, on every plan (affine matrices have no storage kernel). Against
//! `cpu_ref::w4a16_matmul` over the same packed bytes (f64 sums), plus bias and
//! accumulation.

mod common;

use common::check::{check, strided};
use common::dense::*;
use common::gpu::*;
use common::rng::Rng;
use wgmoe::backend::kernel::{Kernel, WeightFormat};
use wgmoe::backend::params::*;
use wgmoe::backend::plan::{DecodeKernels, PrefillKernels};
use wgmoe::backend::{Device, KernelOverrides, KernelPlan, Program};
use wgmoe::cpu_ref;
use wgmoe::format::quant::{Affine4, Q4Kind, Q4Matrix};
use wgmoe::model::ops::OpEnv;
use wgmoe::model::tensors::F16Matrix;

/// As the kernel tests' MATVEC_TOL, relative to the output's magnitude.
const TOL: f32 = 3e-5;

/// Random affine rows: every nibble value, per 32 columns a scale (1 in 16 zero) and an
/// offset of either sign, rows of very different magnitudes.
fn random_affine(rng: &mut Rng, rows: usize, cols: usize) -> Affine4 {
    let nb = cols.div_ceil(32);
    let nibbles = (0..rows * cols).map(|_| rng.below(16) as u8).collect();
    let blocks = (0..rows * nb)
        .map(|i| {
            let mag = [1.0, 1e-3, 40.0][(i / nb) % 3];
            let a = if rng.below(16) == 0 {
                0.0
            } else {
                0.002 + rng.f32(0.03)
            };
            (a * mag, rng.f32(0.1) * mag)
        })
        .collect();
    Affine4 { nibbles, blocks }
}

fn q4a_case(dev: &Device, plan: &KernelPlan, seed: u64, c: MatmulCase, min_chunks: usize) {
    let data = MatmulData::new(seed, &c);
    let mut rng = Rng::new(seed ^ 0x51f1);
    let a = random_affine(&mut rng, c.n, c.k);
    let m = F16Matrix::upload_q4a(dev, "w", c.n, c.k, &a).unwrap();
    assert_eq!(m.format, WeightFormat::Q4A);
    assert!(m.chunks.len() >= min_chunks, "{} chunks", m.chunks.len());
    let qm = Q4Matrix {
        out: c.n,
        inp: c.k,
        kind: Q4Kind::Affine32,
    };
    let (mut q, mut s) = (vec![0u8; qm.q_bytes()], vec![0u8; qm.scale_bytes()]);
    qm.pack_affine(&a, &mut q, &mut s);
    let step = dev.step_buffer(0, c.t).unwrap();
    let xs = strided(&data.xs, c.k, c.x_stride, f32::NAN);
    let x = f32_buf(dev, &xs);
    let has = |f: u32| c.flags & f != 0;
    let b = has(flags::MATMUL_BIAS).then(|| f32_buf(dev, &data.bias));
    let out = f32_buf(dev, &data.out0);
    let d = dummy(dev);
    let env = OpEnv {
        plan,
        chunk: c.t,
        dummy: &d,
    };
    let mut prog = Program::default();
    push_matmul(
        &mut prog,
        &env,
        &m,
        &x,
        b.as_ref(),
        &out,
        c.out_stride,
        c.flags,
    );
    let one = c.t == 1 || has(flags::LAST_TOKEN_ONLY);
    for op in &mut prog.ops {
        let k = match (&op.decode, one && !has(flags::LAST_TOKEN_ONLY)) {
            (Some(d), true) => d.kernel,
            _ => op.kernel,
        };
        let want = if one {
            Kernel::Matvec(plan.rows(WeightFormat::Q4A))
        } else {
            Kernel::Gemm(WeightFormat::Q4A)
        };
        assert_eq!(k, want, "T {} flags {:#b}", c.t, c.flags);
        if c.x_stride != c.k {
            patch_params(op, |p: &mut DenseParams| p.x_stride = c.x_stride as u32);
        }
    }
    run(dev, prog, &step, c.t);
    let x_rows = if has(flags::LAST_TOKEN_ONLY) {
        &data.xs[(c.t - 1) * c.k..]
    } else {
        &data.xs[..]
    };
    let prod = cpu_ref::w4a16_matmul(x_rows, qm, &q, &s).unwrap();
    let rows = x_rows.len() / c.k;
    let mut want = Vec::with_capacity(rows * c.n);
    for t in 0..rows {
        for n in 0..c.n {
            let mut v = prod[t * c.n + n];
            if has(flags::MATMUL_BIAS) {
                v += data.bias[n];
            }
            if has(flags::MATMUL_ACCUMULATE) {
                v += data.out0[t * c.out_stride + n];
            }
            want.push(v);
        }
    }
    let want = strided(&want, c.n, c.out_stride, 55.0);
    let got = read_f32(dev, &out, c.out_rows() * c.out_stride);
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let what = format!(
        "int4-a32 {:?}/{:?}/{:?} T {} K {} N {} strides {}/{} flags {:#b} chunks {}",
        plan.reduce,
        plan.coalesced_decode,
        plan.tiled_prefill,
        c.t,
        c.k,
        c.n,
        c.x_stride,
        c.out_stride,
        c.flags,
        m.chunks.len()
    );
    check(&what, &got, &want, TOL * scale);
}

#[test]
fn affine_int4_matvec_and_gemm_match_cpu() {
    use flags::{LAST_TOKEN_ONLY as LAST, MATMUL_ACCUMULATE as ACCUMULATE, MATMUL_BIAS as BIAS};
    let dev = device(None);
    let storage = KernelOverrides {
        decode: Some(DecodeKernels::Storage),
        prefill: Some(PrefillKernels::Storage),
        ..Default::default()
    };
    let mut plans: Vec<KernelPlan> = [false, true]
        .into_iter()
        .map(|portable| {
            plan(
                &dev,
                &KernelOverrides {
                    portable,
                    decode: Some(DecodeKernels::Coalesced),
                    ..Default::default()
                },
            )
        })
        .collect();
    plans.push(plan(&dev, &KernelOverrides::default()));
    plans.push(plan(&dev, &storage));
    for (pi, p) in plans.iter().enumerate() {
        for (i, c) in [
            MatmulCase::new(1, 5, 3, 0),
            MatmulCase::new(1, 45, 9, BIAS),
            MatmulCase::new(1, 64, 33, ACCUMULATE),
            MatmulCase::new(1, 1000, 70, BIAS | ACCUMULATE),
            MatmulCase::new(6, 100, 37, LAST | BIAS),
            MatmulCase::new(17, 65, 33, BIAS | ACCUMULATE),
            MatmulCase::new(40, 2048, 65, 0),
            MatmulCase {
                t: 9,
                k: 13,
                n: 61,
                x_stride: 20,
                out_stride: 67,
                flags: BIAS,
            },
        ]
        .into_iter()
        .enumerate()
        {
            q4a_case(&dev, p, 5400 + (pi * 16 + i) as u64, c, 1);
        }
    }
    // A split matrix: K = 256 (128 nibble + 32 pair bytes a row), 24 rows to a 4 KiB chunk.
    let dev = device(Some(4096));
    let p = plan(&dev, &KernelOverrides::default());
    q4a_case(&dev, &p, 5490, MatmulCase::new(1, 256, 70, BIAS), 2);
    q4a_case(&dev, &p, 5491, MatmulCase::new(20, 256, 70, ACCUMULATE), 2);
}

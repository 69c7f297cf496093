//! Dense matrices in a GGUF file's block kinds, held as they are (affine INT4 for Q4_0,
//! nibble planes with side records for Q4_K, Q5_K, Q6_K and Q5_0/Q5_1: `blocks/kquant.rs`),
//! and stacks of parts of different kinds (a file's q, k and v), through `ops::matmul` as
//! the forward pass records it: one-token steps (and the last token alone) on the matvec,
//! multi-token steps on the tiled GEMM, on every plan (these kinds have no storage
//! kernel). Against `cpu_ref::w4a16_matmul` over the same packed bytes (f64 sums), plus
//! bias and accumulation.

mod common;

use common::check::{check, strided};
use common::dense::*;
use common::gpu::*;
use common::q4::random_krows;
use common::rng::Rng;
use wgmoe::backend::kernel::{Kernel, WeightFormat};
use wgmoe::backend::params::*;
use wgmoe::backend::plan::{DecodeKernels, PrefillKernels};
use wgmoe::backend::{Device, KernelOverrides, KernelPlan, Program};
use wgmoe::blocks::quant::{Affine4, Q4Kind, Q4Matrix};
use wgmoe::cpu_ref;
use wgmoe::model::ops::OpEnv;
use wgmoe::model::tensors::{DenseRows, F16Matrix};

/// As the kernel tests' MATVEC_TOL, relative to the output's magnitude.
const TOL: f32 = 3e-5;

/// Row magnitudes of very different sizes.
fn mag(row: usize) -> f32 {
    [1.0, 1e-3, 40.0][row % 3]
}

/// Random affine rows: every nibble value, per 32 columns a scale (1 in 16 zero) and an
/// offset of either sign, rows of very different magnitudes.
fn random_affine(rng: &mut Rng, rows: usize, cols: usize) -> Affine4 {
    let nb = cols.div_ceil(32);
    let nibbles = (0..rows * cols).map(|_| rng.below(16) as u8).collect();
    let blocks = (0..rows * nb)
        .map(|i| {
            let m = mag(i / nb);
            let a = if rng.below(16) == 0 {
                0.0
            } else {
                0.002 + rng.f32(0.03)
            };
            (a * m, rng.f32(0.1) * m)
        })
        .collect();
    Affine4 { nibbles, blocks }
}

/// Random rows of `kind` and the packed bytes of the same rows (the reference's input).
fn random_rows(
    rng: &mut Rng,
    kind: Q4Kind,
    rows: usize,
    cols: usize,
) -> (DenseRows, Vec<u8>, Vec<u8>) {
    let qm = Q4Matrix {
        out: rows,
        inp: cols,
        kind,
    };
    let (mut q, mut s) = (vec![0u8; qm.q_bytes()], vec![0u8; qm.scale_bytes()]);
    let rows = if kind == Q4Kind::Affine32 {
        let a = random_affine(rng, rows, cols);
        qm.pack_affine(&a, &mut q, &mut s);
        DenseRows::Affine(a)
    } else {
        let r = random_krows(rng, kind, rows, cols, mag);
        qm.pack_planes(&r, &mut q, &mut s);
        DenseRows::Planes(r)
    };
    (rows, q, s)
}

/// The GGUF block kinds of the dense matrices.
const KINDS: [Q4Kind; 5] = [
    Q4Kind::Affine32,
    Q4Kind::Q4K,
    Q4Kind::Q5K,
    Q4Kind::Q6K,
    Q4Kind::Q5A,
];

/// One matrix stacked from parts of `kinds` (rows split as evenly as they go), against
/// the reference of each part.
fn blocks_case(
    dev: &Device,
    plan: &KernelPlan,
    seed: u64,
    c: MatmulCase,
    kinds: &[Q4Kind],
    min_chunks: usize,
) {
    let data = MatmulData::new(seed, &c);
    let mut rng = Rng::new(seed ^ 0x51f1);
    let mut parts = Vec::new();
    let mut refs = Vec::new();
    let mut r0 = 0;
    for (i, &kind) in kinds.iter().enumerate() {
        let n = (c.n - r0) / (kinds.len() - i);
        let (rows, q, s) = random_rows(&mut rng, kind, n, c.k);
        parts.push(rows);
        refs.push((n, kind, q, s));
        r0 += n;
    }
    let m = F16Matrix::upload_rows(dev, "w", c.k, parts).unwrap();
    assert_eq!(m.rows, c.n);
    // Split or not, a run of one kind takes the bytes admission counts for it.
    let mut runs: Vec<(Q4Kind, usize)> = Vec::new();
    for r in &refs {
        match runs.last_mut() {
            Some(l) if l.0 == r.1 => l.1 += r.0,
            _ => runs.push((r.1, r.0)),
        }
    }
    let planned: u64 = runs
        .iter()
        .map(|&(k, n)| F16Matrix::chunk_bytes(WeightFormat::int4(k), n, c.k))
        .sum();
    let held: u64 = m.chunks.iter().map(|ch| ch.buffer.size()).sum();
    assert_eq!(held, planned, "{} chunks", m.chunks.len());
    assert!(m.chunks.len() >= min_chunks, "{} chunks", m.chunks.len());
    for ch in &m.chunks {
        let (mut start, mut part) = (0, 0);
        while start + refs[part].0 <= ch.row_start {
            start += refs[part].0;
            part += 1;
        }
        assert_eq!(
            ch.format,
            WeightFormat::int4(refs[part].1),
            "chunk at row {}",
            ch.row_start
        );
    }
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
        let f = Kernel::weight_format(k).unwrap_or(WeightFormat::F16);
        assert!(
            kinds.iter().any(|&kind| WeightFormat::int4(kind) == f),
            "{k:?}"
        );
        let want = if one {
            Kernel::Matvec(plan.rows(f))
        } else {
            Kernel::Gemm(f)
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
    let rows = x_rows.len() / c.k;
    let mut prod = vec![0.0; rows * c.n];
    let mut r0 = 0;
    for (n, kind, q, s) in &refs {
        let qm = Q4Matrix {
            out: *n,
            inp: c.k,
            kind: *kind,
        };
        let part = cpu_ref::w4a16_matmul(x_rows, qm, q, s).unwrap();
        for t in 0..rows {
            prod[t * c.n + r0..t * c.n + r0 + n].copy_from_slice(&part[t * n..(t + 1) * n]);
        }
        r0 += n;
    }
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
    let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
    let what = format!(
        "{} {:?}/{:?}/{:?} T {} K {} N {} strides {}/{} flags {:#b} chunks {}",
        names.join("+"),
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

/// Every plan a device may pick, and the storage plan.
fn plans(dev: &Device) -> Vec<KernelPlan> {
    let storage = KernelOverrides {
        decode: Some(DecodeKernels::Storage),
        prefill: Some(PrefillKernels::Storage),
        ..Default::default()
    };
    let mut plans: Vec<KernelPlan> = [false, true]
        .into_iter()
        .map(|portable| {
            plan(
                dev,
                &KernelOverrides {
                    portable,
                    decode: Some(DecodeKernels::Coalesced),
                    ..Default::default()
                },
            )
        })
        .collect();
    plans.push(plan(dev, &KernelOverrides::default()));
    plans.push(plan(dev, &storage));
    plans
}

#[test]
fn affine_int4_matvec_and_gemm_match_cpu() {
    use flags::{LAST_TOKEN_ONLY as LAST, MATMUL_ACCUMULATE as ACCUMULATE, MATMUL_BIAS as BIAS};
    let dev = device(None);
    for (pi, p) in plans(&dev).iter().enumerate() {
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
            blocks_case(
                &dev,
                p,
                5400 + (pi * 16 + i) as u64,
                c,
                &[Q4Kind::Affine32],
                1,
            );
        }
    }
    // A split matrix: K = 256 (128 nibble + 32 pair bytes a row), 24 rows to a 4 KiB chunk.
    let dev = device(Some(4096));
    let p = plan(&dev, &KernelOverrides::default());
    let a32 = [Q4Kind::Affine32];
    blocks_case(&dev, &p, 5490, MatmulCase::new(1, 256, 70, BIAS), &a32, 2);
    blocks_case(
        &dev,
        &p,
        5491,
        MatmulCase::new(20, 256, 70, ACCUMULATE),
        &a32,
        2,
    );
}

/// Q4_K, Q5_K, Q6_K and Q5_0/Q5_1 matrices (rows of whole 256-column blocks as GGUF has
/// them, and partial ones, which the layout allows), on every plan.
#[test]
fn k_quant_and_5_bit_matvec_and_gemm_match_cpu() {
    use flags::{LAST_TOKEN_ONLY as LAST, MATMUL_ACCUMULATE as ACCUMULATE, MATMUL_BIAS as BIAS};
    let dev = device(None);
    let cases = [
        MatmulCase::new(1, 256, 9, BIAS),
        MatmulCase::new(1, 512, 33, ACCUMULATE),
        MatmulCase::new(1, 300, 70, BIAS | ACCUMULATE),
        MatmulCase::new(6, 256, 37, LAST | BIAS),
        MatmulCase::new(17, 768, 33, BIAS | ACCUMULATE),
        MatmulCase::new(40, 2048, 65, 0),
        MatmulCase {
            t: 9,
            k: 96,
            n: 61,
            x_stride: 100,
            out_stride: 67,
            flags: BIAS,
        },
    ];
    for (pi, p) in plans(&dev).iter().enumerate() {
        for (ki, &kind) in KINDS[1..].iter().enumerate() {
            for (i, &c) in cases.iter().enumerate() {
                // One plan of four runs every case; the others one case in turn.
                if pi != ki % 4 && i != (pi + ki) % cases.len() {
                    continue;
                }
                let seed = 5600 + (pi * 64 + ki * 8 + i) as u64;
                blocks_case(&dev, p, seed, c, &[kind], 1);
            }
        }
    }
}

/// A stack of parts of different kinds (a Q4_K_M file's q and k in Q4_K, v in Q6_K;
/// Mixtral's Q8_0 k and v), whole and split into chunks: each run of one kind takes its own
/// kernels, and the rows land where the stack puts them.
#[test]
fn stacked_parts_of_different_kinds_match_cpu() {
    use flags::{LAST_TOKEN_ONLY as LAST, MATMUL_ACCUMULATE as ACCUMULATE, MATMUL_BIAS as BIAS};
    let stacks: [&[Q4Kind]; 3] = [
        &[Q4Kind::Q4K, Q4Kind::Q4K, Q4Kind::Q6K],
        &[Q4Kind::Q5A, Q4Kind::Affine32, Q4Kind::Q5K],
        &[Q4Kind::Q6K, Q4Kind::Q4K, Q4Kind::Q6K],
    ];
    let dev = device(None);
    for (pi, p) in plans(&dev).iter().enumerate() {
        for (si, kinds) in stacks.iter().enumerate() {
            let seed = 5800 + (pi * 8 + si) as u64;
            blocks_case(&dev, p, seed, MatmulCase::new(1, 256, 45, BIAS), kinds, 2);
            blocks_case(
                &dev,
                p,
                seed + 100,
                MatmulCase::new(11, 512, 30, ACCUMULATE),
                kinds,
                2,
            );
            blocks_case(
                &dev,
                p,
                seed + 200,
                MatmulCase::new(5, 256, 24, LAST),
                kinds,
                2,
            );
        }
    }
    // Split under a 4 KiB binding: each part in chunks of its own.
    let dev = device(Some(4096));
    let p = plan(&dev, &KernelOverrides::default());
    blocks_case(
        &dev,
        &p,
        5890,
        MatmulCase::new(1, 256, 90, BIAS),
        stacks[0],
        4,
    );
    blocks_case(
        &dev,
        &p,
        5891,
        MatmulCase::new(20, 256, 90, ACCUMULATE),
        stacks[2],
        4,
    );
}

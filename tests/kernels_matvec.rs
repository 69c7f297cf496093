//! The GPU-shaped matvec (shaders/matvec.wgsl: a workgroup per 4 weight rows, lanes
//! reading consecutive 16-byte words, reduced through subgroups or workgroup memory) as
//! `ops::matmul` records it on GPUs: the one-token alternative of every matmul, and the
//! last-token lm_head of multi-token steps; and the router's column splits
//! (`ops::router_matmul`), which router_topk adds back together. Against the CPU
//! reference (`wgmoe::cpu_ref`). With Q8_0 weights: the matvec and the GEMM of dense
//! matrices, and the Q8_0 SwiGLU blocks (shared experts, dense MLPs) on the expert
//! kernels. Runs on lavapipe in CI at every subgroup size; a missing adapter is a failure,
//! never a skip.

mod common;

use common::check::check;
use common::dense::*;
use common::gpu::*;
use common::rng::Rng;
use wgmoe::backend::kernel::{Kernel, WeightFormat};
use wgmoe::backend::params::*;
use wgmoe::backend::plan::DecodeKernels;
use wgmoe::backend::{Device, KernelOverrides, KernelPlan, Program};
use wgmoe::blocks::q8_0::Q8Matrix;
use wgmoe::cpu_ref;
use wgmoe::model::ops::{self, OpEnv};
use wgmoe::model::tensors::F16Matrix;

/// As MATMUL_TOL: f32 sums of 8-product words, in another order (64 lanes, then the
/// workgroup's reduction).
const MATVEC_TOL: f32 = 2e-5;

/// The coalesced decode plans: subgroup and workgroup-memory reductions.
fn plans(dev: &Device) -> Vec<KernelPlan> {
    [false, true]
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
        .collect()
}

/// `ops::matmul` with the coalesced plan, run on a step of `c.t` tokens: one token runs
/// the matvec alternative; more run the storage matmul (or, LAST_TOKEN_ONLY, the matvec).
fn matvec_case(dev: &Device, plan: &KernelPlan, seed: u64, c: MatmulCase, min_chunks: usize) {
    let data = MatmulData::new(seed, &c);
    let m = F16Matrix::upload(dev, "w", c.n, c.k, &data.w).unwrap();
    assert!(m.chunks.len() >= min_chunks, "{} chunks", m.chunks.len());
    let step = dev.step_buffer(0, c.t).unwrap();
    let x = f32_buf(
        dev,
        &common::check::strided(&data.xs, c.k, c.x_stride, f32::NAN),
    );
    let has_bias = c.flags & flags::MATMUL_BIAS != 0;
    let b = has_bias.then(|| f32_buf(dev, &data.bias));
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
    let last = c.flags & flags::LAST_TOKEN_ONLY != 0;
    for op in &mut prog.ops {
        let mv = if last {
            op.kernel
        } else {
            op.decode.as_ref().expect("a one-token alternative").kernel
        };
        assert!(
            matches!(mv, Kernel::Matvec(_)),
            "the matvec serves one token: {mv}"
        );
        if c.x_stride != c.k {
            patch_params(op, |p: &mut DenseParams| p.x_stride = c.x_stride as u32);
        }
    }
    run(dev, prog, &step, c.t);
    let what = format!(
        "matvec[{:?}] T {} K {} N {} strides {}/{} flags {:#b} chunks {}",
        plan.reduce,
        c.t,
        c.k,
        c.n,
        c.x_stride,
        c.out_stride,
        c.flags,
        m.chunks.len()
    );
    check(
        &what,
        &read_f32(dev, &out, c.out_rows() * c.out_stride),
        &data.want(&c),
        MATVEC_TOL,
    );
}

#[test]
fn matvec_matches_cpu() {
    use flags::{LAST_TOKEN_ONLY as LAST, MATMUL_ACCUMULATE as ACCUMULATE, MATMUL_BIAS as BIAS};
    let dev = device(None);
    // K below one word, not a multiple of 4 or 8, a partial last word, long rows; rows not
    // a multiple of 4 (a partial last row group) and fewer than one group.
    let cases = [
        MatmulCase::new(1, 1, 3, 0),
        MatmulCase::new(1, 7, 65, BIAS),
        MatmulCase::new(1, 13, 100, ACCUMULATE),
        MatmulCase::new(1, 100, 2, BIAS | ACCUMULATE),
        MatmulCase::new(1, 257, 130, BIAS),
        MatmulCase::new(1, 1408, 70, ACCUMULATE),
        MatmulCase::new(1, 2048, 301, 0),
        MatmulCase::new(1, 4100, 9, BIAS),
        MatmulCase::new(6, 100, 70, LAST),
        MatmulCase::new(9, 257, 130, LAST | BIAS | ACCUMULATE),
        MatmulCase {
            t: 5,
            k: 13,
            n: 50,
            x_stride: 16,
            out_stride: 53,
            flags: LAST,
        },
        MatmulCase {
            t: 1,
            k: 100,
            n: 33,
            x_stride: 100,
            out_stride: 40,
            flags: BIAS,
        },
    ];
    for plan in plans(&dev) {
        for (i, c) in cases.iter().enumerate() {
            matvec_case(&dev, &plan, 3000 + i as u64, *c, 1);
        }
    }
}

#[test]
fn matvec_split_matrix_matches_cpu() {
    use flags::{LAST_TOKEN_ONLY as LAST, MATMUL_BIAS as BIAS};
    // A 4 KiB binding: K = 1408 one row to a chunk, K = 257 seven, K = 100 nineteen.
    let dev = device(Some(4096));
    for plan in plans(&dev) {
        matvec_case(&dev, &plan, 3100, MatmulCase::new(1, 257, 70, BIAS), 10);
        matvec_case(&dev, &plan, 3101, MatmulCase::new(1, 1408, 9, 0), 9);
        matvec_case(
            &dev,
            &plan,
            3102,
            MatmulCase::new(6, 100, 130, LAST | BIAS),
            7,
        );
    }
}

/// The router of a one-token step: its matvec split over the columns into partial rows,
/// which router_topk adds into row 0 before the softmax: the same experts and weights as
/// the reference on the whole logits, and row 0 holds the logits (the shared-expert gate's
/// column too, which moe_combine reads).
#[test]
fn router_split_logits_add_up_in_router_topk() {
    let dev = device(None);
    for plan in plans(&dev) {
        // (experts + gate column, hidden, top-k): Mixtral's 8 rows of 4096, 61 of 2048
        // (Qwen1.5: 60 experts and the gate), 129 of 256, a 3-row router of 100.
        for (i, &(rows, hidden, top_k, experts)) in [
            (8, 4096, 2, 8),
            (61, 2048, 4, 60),
            (129, 256, 8, 128),
            (3, 100, 1, 3),
        ]
        .iter()
        .enumerate()
        {
            let splits = ops::router_splits(rows, hidden);
            assert!(splits >= 1);
            if rows <= 64 {
                assert!(splits > 1, "{rows} rows of {hidden}: split");
            }
            let mut rng = Rng::new(3200 + i as u64);
            let w = rng.f16s(rows * hidden, 0.2);
            let xs = rng.vec(hidden, 1.0);
            let m = F16Matrix::upload(&dev, "router", rows, hidden, &w).unwrap();
            let x = f32_buf(&dev, &xs);
            let logits = f32_buf(&dev, &vec![f32::NAN; splits * rows]);
            let ids = u32_buf(&dev, &vec![0; top_k]);
            let weights = f32_buf(&dev, &vec![0.0; top_k]);
            let d = dummy(&dev);
            let env = OpEnv {
                plan: &plan,
                chunk: 4,
                dummy: &d,
            };
            let mut prog = Program::default();
            ops::router_matmul(&mut prog, &env, &m, &x, &logits, rows);
            ops::router_topk(
                &mut prog,
                &RouterTopkParams {
                    n_experts: experts as u32,
                    top_k: top_k as u32,
                    logits_stride: rows as u32,
                    norm_topk: 1,
                    splits: splits as u32,
                    ..Default::default()
                },
                &logits,
                &ids,
                &weights,
            );
            run(&dev, prog, &dev.step_buffer(0, 1).unwrap(), 1);
            let want = cpu_ref::matmul(&xs, hidden, &w, rows, None, None).unwrap();
            let what = format!(
                "router {rows} x {hidden}, {splits} splits [{:?}]",
                plan.reduce
            );
            let got = read_f32(&dev, &logits, rows);
            check(&what, &got, &want, MATVEC_TOL);
            let (want_ids, _) = cpu_ref::router_topk(&got, rows, experts, top_k, true).unwrap();
            assert_eq!(read_u32(&dev, &ids, top_k), want_ids, "{what}: top-k ids");
        }
    }
}

/// The tiled GEMM (gemm.wgsl) as `ops::matmul` records it for multi-token steps on GPUs.
fn gemm_case(dev: &Device, seed: u64, c: MatmulCase, min_chunks: usize) {
    let plan = plan(
        dev,
        &KernelOverrides {
            decode: Some(DecodeKernels::Coalesced),
            prefill: Some(wgmoe::backend::plan::PrefillKernels::Tiled),
            ..Default::default()
        },
    );
    let data = MatmulData::new(seed, &c);
    let m = F16Matrix::upload(dev, "w", c.n, c.k, &data.w).unwrap();
    assert!(m.chunks.len() >= min_chunks, "{} chunks", m.chunks.len());
    let step = dev.step_buffer(0, c.t).unwrap();
    let x = f32_buf(
        dev,
        &common::check::strided(&data.xs, c.k, c.x_stride, f32::NAN),
    );
    let b = (c.flags & flags::MATMUL_BIAS != 0).then(|| f32_buf(dev, &data.bias));
    let out = f32_buf(dev, &data.out0);
    let d = dummy(dev);
    let env = OpEnv {
        plan: &plan,
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
    for op in &mut prog.ops {
        assert!(
            matches!(op.kernel, Kernel::Gemm(_)),
            "multi-token steps: {}",
            op.kernel
        );
        if c.x_stride != c.k {
            patch_params(op, |p: &mut DenseParams| p.x_stride = c.x_stride as u32);
        }
    }
    run(dev, prog, &step, c.t);
    let what = format!(
        "gemm T {} K {} N {} strides {}/{} flags {:#b} chunks {}",
        c.t,
        c.k,
        c.n,
        c.x_stride,
        c.out_stride,
        c.flags,
        m.chunks.len()
    );
    check(
        &what,
        &read_f32(dev, &out, c.out_rows() * c.out_stride),
        &data.want(&c),
        MATVEC_TOL,
    );
}

#[test]
fn gemm_matches_cpu() {
    use flags::{MATMUL_ACCUMULATE as ACCUMULATE, MATMUL_BIAS as BIAS};
    let dev = device(None);
    // Token counts around the 16-token tile, K around the 64-column step and below one
    // word, rows around the 32-row tile.
    for (i, c) in [
        MatmulCase::new(2, 1, 3, 0),
        MatmulCase::new(5, 7, 65, BIAS),
        MatmulCase::new(16, 64, 32, ACCUMULATE),
        MatmulCase::new(17, 65, 33, BIAS | ACCUMULATE),
        MatmulCase::new(40, 257, 130, BIAS),
        MatmulCase::new(33, 1408, 70, ACCUMULATE),
        MatmulCase::new(64, 2048, 100, 0),
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
        gemm_case(&dev, 3300 + i as u64, c, 1);
    }
    // A split matrix: K = 257 (528-byte rows) seven rows to a 4 KiB chunk.
    let dev = device(Some(4096));
    gemm_case(&dev, 3310, MatmulCase::new(20, 257, 70, BIAS), 10);
}

/// A Q8_0 matrix through `ops::matmul` under `plan`: one-token steps (and the last token
/// alone) run the Q8_0 matvec, multi-token steps the Q8_0 GEMM, except under the storage
/// plan (CPU adapters), where the Q8_0 storage matmul serves every step. Against
/// `cpu_ref::matmul_q8` over the same packed weights (quantised here by `blocks::q8_0`, as
/// on load).
fn q8_case(dev: &Device, plan: &KernelPlan, seed: u64, c: MatmulCase, min_chunks: usize) {
    let data = MatmulData::new(seed, &c);
    let mut rng = Rng::new(seed ^ 0x9e37);
    // Rows of very different magnitudes: each block's scale follows its own values.
    let w: Vec<f32> = (0..c.n * c.k)
        .map(|i| rng.f32(1.0) * [1.0, 1e-3, 40.0][(i / c.k) % 3])
        .collect();
    let qm = Q8Matrix { out: c.n, inp: c.k };
    let (mut q, mut s) = (vec![0u8; qm.q_bytes()], vec![0u8; qm.scale_bytes()]);
    qm.pack(&w, &mut q, &mut s);
    let m = F16Matrix::upload_q8(dev, "w", c.n, c.k, &w).unwrap();
    assert_eq!(m.uniform_format(), Some(WeightFormat::Q8));
    assert!(m.chunks.len() >= min_chunks, "{} chunks", m.chunks.len());
    let step = dev.step_buffer(0, c.t).unwrap();
    // Window-capable where the rows are packed, as the engine's activations: the storage
    // plan reads them from uniform windows.
    let windows = c.x_stride == c.k;
    let xs = common::check::strided(&data.xs, c.k, c.x_stride, f32::NAN);
    let x = if windows {
        window_buf(dev, &xs)
    } else {
        f32_buf(dev, &xs)
    };
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
        if !plan.coalesced_decode && !plan.tiled_prefill {
            let want = if one && !has(flags::LAST_TOKEN_ONLY) {
                if windows && plan.matmul_decode_uniform(c.k) {
                    Kernel::MatmulQ8Uniform
                } else {
                    Kernel::MatmulQ8
                }
            } else if windows && plan.matmul_window_tokens(c.k, c.t) > 0 {
                Kernel::MatmulQ8Window
            } else {
                Kernel::MatmulQ8
            };
            assert_eq!(k, want, "the storage plan");
        } else if one {
            assert_eq!(k, Kernel::Matvec(plan.rows(WeightFormat::Q8)), "one token");
        } else {
            assert_eq!(k, Kernel::Gemm(WeightFormat::Q8), "multi-token steps");
        }
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
    let prev: Vec<f32> = data
        .out0
        .iter()
        .enumerate()
        .filter(|(i, _)| i % c.out_stride < c.n)
        .map(|(_, v)| *v)
        .collect();
    let want = cpu_ref::matmul_q8(
        x_rows,
        qm,
        &q,
        &s,
        has(flags::MATMUL_BIAS).then_some(&data.bias[..]),
        has(flags::MATMUL_ACCUMULATE).then_some(&prev[..]),
    )
    .unwrap();
    let what = format!(
        "q8_0 {:?}/{:?}/{:?} T {} K {} N {} strides {}/{} flags {:#b} chunks {}",
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
    // Products of 40-scaled rows: the tolerance is relative to the output's magnitude.
    let got = read_f32(dev, &out, c.out_rows() * c.out_stride);
    let want = common::check::strided(&want, c.n, c.out_stride, 55.0);
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    check(&what, &got, &want, MATVEC_TOL * scale);
}

#[test]
fn q8_matvec_and_gemm_match_cpu() {
    use flags::{LAST_TOKEN_ONLY as LAST, MATMUL_ACCUMULATE as ACCUMULATE, MATMUL_BIAS as BIAS};
    let dev = device(None);
    // Every plan: the coalesced ones (both reductions), the adapter's default and the
    // storage plan (the Q8_0 storage matmul).
    let mut all = plans(&dev);
    all.push(plan(&dev, &KernelOverrides::default()));
    all.push(plan(
        &dev,
        &KernelOverrides {
            decode: Some(wgmoe::backend::plan::DecodeKernels::Storage),
            prefill: Some(wgmoe::backend::plan::PrefillKernels::Storage),
            ..Default::default()
        },
    ));
    for (pi, plan) in all.iter().enumerate() {
        // K below one block, a partial last block, one and several blocks; rows around
        // the matvec's 4 and the GEMM's 32.
        for (i, c) in [
            MatmulCase::new(1, 5, 3, 0),
            MatmulCase::new(1, 45, 9, BIAS),
            MatmulCase::new(1, 64, 33, ACCUMULATE),
            MatmulCase::new(1, 1000, 70, BIAS | ACCUMULATE),
            MatmulCase::new(6, 100, 37, LAST | BIAS),
            MatmulCase::new(3, 33, 7, BIAS),
            MatmulCase::new(17, 65, 33, BIAS | ACCUMULATE),
            MatmulCase::new(40, 2048, 65, 0),
            // Partial last blocks with K % 4 == 0: the window kernel stops at K.
            MatmulCase::new(12, 100, 19, ACCUMULATE),
            MatmulCase::new(9, 36, 70, BIAS),
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
            q8_case(&dev, plan, 4400 + (pi * 16 + i) as u64, c, 1);
        }
    }
    // A split matrix: K = 100 (128 quant + 8 scale bytes a row) 29 rows to a 4 KiB chunk.
    let dev = device(Some(4096));
    let p = plan(&dev, &KernelOverrides::default());
    q8_case(&dev, &p, 4490, MatmulCase::new(1, 100, 70, BIAS), 2);
    q8_case(&dev, &p, 4491, MatmulCase::new(20, 100, 70, ACCUMULATE), 2);
}

/// A Q8_0 SwiGLU block (a shared expert or dense MLP, `DenseMlp::Q8`) through
/// `MoeDispatch::swiglu_dense` as the layer programs record it: one-token steps on the
/// expert row kernels, multi-token steps on the expert GEMM, on every plan. Against
/// `cpu_ref::swiglu_expert` over the Q8_0 round trip of the same weights.
#[test]
fn q8_swiglu_blocks_match_cpu() {
    use wgmoe::model::dense_mlp::{DenseMlp, Q8Mlp};
    use wgmoe::model::moe::MoeDispatch;
    let dev = device(None);
    let mut all = plans(&dev);
    all.push(plan(&dev, &KernelOverrides::default()));
    for (pi, plan) in all.iter().enumerate() {
        // Partial blocks on both sides, rows around the row kernels' 4 and the GEMM's tile.
        for (i, &(hid, inter, t)) in [(64, 96, 1), (45, 70, 1), (64, 96, 5), (100, 33, 17)]
            .iter()
            .enumerate()
        {
            let mut rng = Rng::new(5500 + (pi * 8 + i) as u64);
            let mut mat = |rows: usize, cols: usize| -> Vec<f32> {
                (0..rows * cols)
                    .map(|j| rng.f32(1.0) * [1.0, 0.01, 8.0][(j / cols) % 3])
                    .collect()
            };
            let (g, u, d) = (mat(inter, hid), mat(inter, hid), mat(hid, inter));
            let mlp = DenseMlp::Q8(
                Q8Mlp::upload(
                    &dev,
                    "mlp",
                    ["gate", "up", "down"],
                    (hid, inter),
                    [&g, &u, &d],
                )
                .unwrap(),
            );
            let xs = rng.vec(t * hid, 1.0);
            let x = f32_buf(&dev, &xs);
            let h = f32_buf(&dev, &vec![f32::NAN; t * inter]);
            let y = f32_buf(&dev, &vec![f32::NAN; t * hid]);
            let dm = dummy(&dev);
            let m = MoeDispatch {
                plan,
                sorted: None,
                fuse_combine: false,
                decode_uniform: false,
                coalesced: plan.coalesced_decode,
                tiled: None,
                one_token: t == 1,
                hidden: hid,
                top_k: 1,
                dummy: &dm,
                xn: &x,
                topk_ids: &dm,
                topk_w: &dm,
                hbuf: &h,
                y: &dm,
                x: &dm,
                route: None,
            };
            let mut prog = Program::default();
            m.swiglu_dense(&mut prog, &mlp, &y);
            for op in &prog.ops {
                let want = if t == 1 {
                    matches!(op.kernel, Kernel::ExpertGateUp(r) | Kernel::ExpertDown(r) if r.format == WeightFormat::Q8)
                } else {
                    op.kernel == Kernel::ExpertGemm(WeightFormat::Q8)
                };
                assert!(want, "T {t}: {}", op.kernel);
            }
            run(&dev, prog, &dev.step_buffer(0, t).unwrap(), t);
            let rt = |w: &[f32], rows, cols| wgmoe::blocks::q8_0::round_trip(w, rows, cols);
            let want = cpu_ref::swiglu_expert(
                &xs,
                hid,
                &rt(&g, inter, hid),
                &rt(&u, inter, hid),
                &rt(&d, hid, inter),
                inter,
            )
            .unwrap();
            let scale = want.iter().fold(1.0f32, |a, v| a.max(v.abs()));
            check(
                &format!("q8_0 swiglu plan {pi} H {hid} I {inter} T {t}"),
                &read_f32(&dev, &y, t * hid),
                &want,
                MATVEC_TOL * 4.0 * scale,
            );
        }
    }
}

//! The K-plane kernels of a CUDA device (GGUF's Q4_K, Q5_K, Q6_K and Q5_0/Q5_1 blocks as
//! they are: `FmtKQ` in kernels/cuda/rows.cuh) emulated against the WGSL kernels on
//! lavapipe, from the same buffers, with the harness of cuda_emulated.rs: the matvec (and
//! with the norm folded in) and the dense GEMM over a matrix in chunks, the expert row kernels (gate/up, down fused into x)
//! and the tiled expert GEMMs over a pool in chunks, with either reduction. The WGSL
//! kernels are checked against the CPU reference in tests/kernels_dense_gguf.rs and
//! tests/kernels_experts_gguf.rs.

use super::*;
use common::gpu::{f32_buf, Gpu};
use common::q4::{case, random_krows, Setup};
use common::rng::Rng;
use wgmoe::backend::kernel::WeightFormat;
use wgmoe::backend::params::flags;
use wgmoe::backend::plan::Switch;
use wgmoe::backend::KernelOverrides;
use wgmoe::blocks::quant::{Q4Kind, Q4SlotLayout};
use wgmoe::model::moe::MoePairs;
use wgmoe::model::ops;
use wgmoe::model::tensors::{DenseRows, F16Matrix};

/// Every K-plane CUDA kernel, run emulated and on lavapipe; returns the kernels it ran.
pub(super) fn k_plane_kernels(emu: &Emulator) -> Vec<Kernel> {
    let mut seen = Vec::new();
    for (ki, kind) in [Q4Kind::Q4K, Q4Kind::Q5K, Q4Kind::Q6K, Q4Kind::Q5A]
        .into_iter()
        .enumerate()
    {
        for portable in [false, true] {
            let o = KernelOverrides {
                portable,
                decode: Some(DecodeKernels::Coalesced),
                prefill: Some(PrefillKernels::Tiled),
                f16_arithmetic: Some(Switch::Off),
            };
            // Dense: 21 rows of 512 columns in chunks under 4 KiB bindings.
            let g = Gpu::new(Some(4096), o);
            let mut rng = Rng::new(900 + ki as u64);
            let (rows, cols, t) = (21, 512, 19);
            let r = random_krows(&mut rng, kind, rows, cols, |_| 1.0);
            let m = F16Matrix::upload_rows(&g.dev, "w", cols, vec![DenseRows::Planes(r)]).unwrap();
            assert!(m.chunks.len() > 1, "{} chunks", m.chunks.len());
            let x = f32_buf(&g.dev, &rng.vec(t * cols, 1.0));
            let bias = f32_buf(&g.dev, &rng.vec(rows, 1.0));
            let dst = f32_buf(&g.dev, &rng.vec(t * rows, 1.0));
            let d = common::gpu::dummy(&g.dev);
            let env = ops::OpEnv {
                plan: &g.plan,
                chunk: t,
                dummy: &d,
            };
            for (fl, tokens) in [
                (flags::LAST_TOKEN_ONLY, t),
                (flags::MATMUL_ACCUMULATE, 1),
                (flags::MATMUL_ACCUMULATE, t),
            ] {
                let mut prog = Program::default();
                ops::matmul(&mut prog, &env, &m, &x, Some(&bias), &dst, rows, fl);
                let what = format!(
                    "{} dense flags {fl:#b} T {tokens} portable {portable}",
                    kind.name()
                );
                let ks = compare(emu, &g.dev, &what, &prog, 0, tokens);
                assert!(
                    ks.iter()
                        .all(|k| k.weight_format() == Some(WeightFormat::int4(kind))),
                    "{what}: {ks:?}"
                );
                seen.extend(ks);
            }
            // The norm folded into the matvec (matvec_norm): one token, writing the
            // normalised row, and the last token of a multi-token step.
            let nw = common::gpu::u32_buf(
                &g.dev,
                &(0..cols / 2)
                    .map(|i| 0x3c00_3800 + (i as u32 % 7) * 0x0100_0100)
                    .collect::<Vec<u32>>(),
            );
            let xn = f32_buf(&g.dev, &vec![f32::NAN; t * cols]);
            for (fl, tokens) in [(0, 1), (flags::LAST_TOKEN_ONLY, t)] {
                let norm = wgmoe::model::norm_fold::NormInput {
                    weight: &nw,
                    x: &x,
                    xn: &xn,
                    n: cols,
                    eps: 1e-5,
                    write: fl == 0,
                    stage: "norm",
                };
                let mut prog = Program::default();
                wgmoe::model::norm_fold::normed_matmul(
                    &mut prog, &env, &norm, &m, None, &dst, rows, fl,
                );
                let what = format!(
                    "{} folded norm flags {fl:#b} T {tokens} portable {portable}",
                    kind.name()
                );
                let ks = compare(emu, &g.dev, &what, &prog, 0, tokens);
                assert!(
                    ks.iter().all(|k| matches!(k, Kernel::MatvecNorm(_))),
                    "{what}: {ks:?}"
                );
                seen.extend(ks);
            }
            // Experts: slots of this kind for gate/up, and a down of another kind in turn,
            // 3 slots a chunk.
            let down = [Q4Kind::Q6K, Q4Kind::Q4K, Q4Kind::Q5A, Q4Kind::Q5K]
                [(ki + usize::from(portable)) % 4];
            let c = case(256, 512, 5, 7, 2, 19);
            let bytes = Q4SlotLayout::mixed(c.hidden, c.inter, kind, down).bytes as u64;
            let g = Gpu::new(Some(3 * bytes), o);
            let s = Setup::random_mixed(&g, 910 + ki as u64, c, kind, down);
            assert!(s.pool().chunks.len() > 1);
            let what = format!(
                "{}/{} experts portable {portable}",
                kind.name(),
                down.name()
            );
            // One token a step: the row kernels, down fused into x.
            let h = f32_buf(&g.dev, &vec![f32::NAN; c.t * c.top_k * c.inter]);
            let xb = f32_buf(&g.dev, &s.x0);
            let mut prog = Program::default();
            let mut dm = s.moe(&s.x_b, &h, &s.dummy, &xb);
            dm.coalesced = true;
            dm.q4_gate_up(&mut prog, s.pool(), &s.slot_b, (0, c.top_k));
            dm.q4_down(&mut prog, s.pool(), &s.slot_b, None);
            let ks = compare(emu, &g.dev, &format!("{what} rows"), &prog, 0, 1);
            assert!(
                ks.iter()
                    .all(|k| matches!(k, Kernel::ExpertGateUp(_) | Kernel::ExpertDown(_))),
                "{what}: {ks:?}"
            );
            seen.extend(ks);
            // A multi-token step: the pairs' sort and the tiled expert GEMMs.
            let pmax = c.t * c.top_k;
            let pairs = MoePairs {
                pmax,
                n_experts: c.n_experts,
                buffer: common::gpu::u32_buf(&g.dev, &vec![0; 2 * pmax + c.n_experts]),
            };
            let y = f32_buf(&g.dev, &vec![f32::NAN; c.t * c.top_k * c.hidden]);
            let mut dm = s.moe(&s.x_b, &h, &y, &s.dummy);
            dm.coalesced = false;
            dm.tiled = Some(&pairs);
            let mut prog = Program::default();
            dm.routed(&mut prog, Executor::Grouped, &s.store, &s.slot_b);
            let ks = compare(emu, &g.dev, &format!("{what} tiled"), &prog, 0, c.t);
            assert!(
                ks.iter().any(|k| matches!(k, Kernel::ExpertGemm(_))),
                "{what}: {ks:?}"
            );
            seen.extend(ks);
        }
    }
    seen
}

//! The RMSNorm folded into its consumer (`model::norm_fold`, `Kernel::MatvecNorm`,
//! shaders/common/act_cols_norm.wgsl): on the GPU plan a one-token step runs no norm
//! dispatch, its matvecs normalising the residual stream on load. Against the CPU
//! reference (rmsnorm then the product, f16 weights) and against the unfused pair on the
//! GPU (rmsnorm.wgsl then the plain matvec, for every weight format: those are checked
//! against the CPU in tests/kernels_matvec.rs and tests/kernels_dense_gguf.rs), at widths
//! beyond the fixtures (36, 130, 1000 and 2056 columns), with both reductions, the router's
//! column splits, the last token of a multi-token step, and the normalised row written for
//! later consumers. Runs on lavapipe at every subgroup size in CI.

mod common;

use common::check::check;
use common::gpu::*;
use common::q4::random_krows;
use common::rng::Rng;
use half::f16;
use wgmoe::backend::kernel::{Kernel, WeightFormat};
use wgmoe::backend::params::flags;
use wgmoe::backend::plan::DecodeKernels;
use wgmoe::backend::{Device, KernelOverrides, KernelPlan, Program, LONGEST};
use wgmoe::blocks::quant::Q4Kind;
use wgmoe::cpu_ref;
use wgmoe::model::norm_fold::{self, NormInput};
use wgmoe::model::ops::{self, OpEnv};
use wgmoe::model::tensors::{DenseRows, F16Matrix};

/// f32 sums in another order (the fused kernel reads the same normalised values; the
/// storage kernels of multi-token steps sum differently).
const TOL: f32 = 2e-5;
const EPS: f32 = 1e-6;

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

/// A weight matrix of `n` rows and `k` columns in format `f`, and its f16 values where
/// the CPU reference has them (f16).
fn matrix(
    dev: &Device,
    rng: &mut Rng,
    f: WeightFormat,
    n: usize,
    k: usize,
) -> (F16Matrix, Option<Vec<f16>>) {
    match f {
        WeightFormat::F16 => {
            let w: Vec<f16> = (0..n * k).map(|_| f16::from_f32(rng.f32(0.5))).collect();
            (F16Matrix::upload(dev, "w", n, k, &w).unwrap(), Some(w))
        }
        WeightFormat::Q8 => {
            let w: Vec<f32> = (0..n * k).map(|_| rng.f32(0.5)).collect();
            (F16Matrix::upload_q8(dev, "w", n, k, &w).unwrap(), None)
        }
        _ => {
            let kind = [Q4Kind::Q4K, Q4Kind::Q5K, Q4Kind::Q6K, Q4Kind::Q5A]
                .into_iter()
                .find(|q| WeightFormat::int4(*q) == f)
                .unwrap();
            let r = random_krows(rng, kind, n, k, |_| 0.05);
            (
                F16Matrix::upload_rows(dev, "w", k, vec![DenseRows::Planes(r)]).unwrap(),
                None,
            )
        }
    }
}

#[derive(Clone, Copy)]
struct Case {
    t: usize,
    k: usize,
    n: usize,
    flags: u32,
    router: bool,
    write: bool,
}

/// One case on one plan: the fused program against the unfused one (and, for f16, the
/// CPU), from the same buffers.
fn run_case(dev: &Device, plan: &KernelPlan, f: WeightFormat, seed: u64, c: &Case) {
    let mut rng = Rng::new(seed);
    let (m, w16) = matrix(dev, &mut rng, f, c.n, c.k);
    // Rows of different magnitudes: the scale is each row's own.
    let xs: Vec<f32> = (0..c.t * c.k)
        .map(|i| rng.f32(1.0) * [1.0, 30.0, 1e-2][(i / c.k) % 3])
        .collect();
    let nw: Vec<f16> = (0..c.k).map(|_| f16::from_f32(rng.f32(2.0))).collect();
    let nw_words: Vec<u32> = nw
        .chunks(2)
        .map(|p| u32::from(p[0].to_bits()) | (u32::from(p.get(1).map_or(0, |h| h.to_bits())) << 16))
        .collect();
    let last = c.flags & flags::LAST_TOKEN_ONLY != 0;
    let splits = if c.router {
        ops::router_splits(c.n, c.k)
    } else {
        1
    };
    let out_rows = if last { 1 } else { c.t } * splits;
    let out0 = rng.vec(out_rows * c.n, 1.0);
    let d = dummy(dev);
    let env = OpEnv {
        plan,
        chunk: c.t,
        dummy: &d,
    };
    let x = window_buf(dev, &xs);
    let nwb = u32_buf(dev, &nw_words);
    let step = dev.step_buffer(0, c.t).unwrap();
    let what = format!(
        "{} [{:?}] T {} K {} N {} flags {:#b} router {} write {}",
        f.name(),
        plan.reduce,
        c.t,
        c.k,
        c.n,
        c.flags,
        c.router,
        c.write
    );
    // Unfused: rmsnorm.wgsl into xn, then the plain product.
    let (xn_u, out_u) = (
        window_buf(dev, &vec![f32::NAN; c.t * c.k]),
        f32_buf(dev, &out0),
    );
    let mut p = Program::default();
    ops::rmsnorm(&mut p, &nwb, &x, &xn_u, c.k, EPS);
    if c.router {
        ops::router_matmul(&mut p, &env, &m, &xn_u, &out_u, c.n);
    } else {
        ops::matmul(&mut p, &env, &m, &xn_u, None, &out_u, c.n, c.flags);
    }
    run(dev, p, &step, c.t);
    // Fused.
    let (xn_f, out_f) = (
        window_buf(dev, &vec![f32::NAN; c.t * c.k]),
        f32_buf(dev, &out0),
    );
    let norm = NormInput {
        weight: &nwb,
        x: &x,
        xn: &xn_f,
        n: c.k,
        eps: EPS,
        write: c.write,
        stage: "norm",
    };
    let mut p = Program::default();
    if c.router {
        norm_fold::normed_router_matmul(&mut p, &env, &norm, &m, &out_f, c.n);
    } else {
        norm_fold::normed_matmul(&mut p, &env, &norm, &m, None, &out_f, c.n, c.flags);
    }
    // One-token steps (and the last token alone) dispatch no norm: every dispatch is the
    // normalising matvec.
    let kernels: Vec<Kernel> = p
        .ops
        .iter()
        .filter_map(|o| o.dispatch(c.t as u32, LONGEST).map(|(k, _, _)| k))
        .collect();
    if c.t == 1 || last {
        assert!(
            kernels.iter().all(|k| matches!(k, Kernel::MatvecNorm(_))),
            "{what}: {kernels:?}"
        );
    } else {
        assert_eq!(kernels.first(), Some(&Kernel::RmsNorm), "{what}");
    }
    run(dev, p, &step, c.t);
    let got = read_f32(dev, &out_f, out_rows * c.n);
    check(&what, &got, &read_f32(dev, &out_u, out_rows * c.n), TOL);
    if let (Some(w), false) = (&w16, c.router) {
        let xn = cpu_ref::rmsnorm(&xs, &nw, EPS).unwrap();
        let rows = if last {
            &xn[(c.t - 1) * c.k..]
        } else {
            &xn[..]
        };
        let acc = (c.flags & flags::MATMUL_ACCUMULATE != 0).then_some(&out0[..]);
        let want = cpu_ref::matmul(rows, c.k, w, c.n, None, acc).unwrap();
        check(&format!("{what} vs CPU"), &got, &want, TOL);
    }
    // The normalised row: written where asked (a one-token step), as rmsnorm.wgsl writes
    // it; untouched where not (no later op reads it).
    let xn = read_f32(dev, &xn_f, c.t * c.k);
    if c.t == 1 && c.write {
        check(&format!("{what} xn"), &xn, &read_f32(dev, &xn_u, c.k), 1e-6);
    } else if c.t == 1 || last {
        assert!(xn.iter().all(|v| v.is_nan()), "{what}: xn written");
    }
}

fn cases() -> Vec<Case> {
    use flags::{LAST_TOKEN_ONLY as LAST, MATMUL_ACCUMULATE as ACC};
    let c = |t, k, n, flags, router, write| Case {
        t,
        k,
        n,
        flags,
        router,
        write,
    };
    vec![
        c(1, 36, 9, 0, false, false),
        c(1, 130, 301, ACC, false, true),
        c(1, 1000, 7, 0, true, true),
        c(1, 2056, 129, 0, true, true),
        c(5, 130, 50, LAST, false, false),
        c(3, 1000, 33, ACC, false, true),
        c(4, 2056, 61, 0, true, true),
    ]
}

#[test]
fn folded_norm_matches_the_norm_then_the_product_in_f16_and_q8_0() {
    let dev = device(None);
    for plan in plans(&dev) {
        for (i, c) in cases().iter().enumerate() {
            for f in [WeightFormat::F16, WeightFormat::Q8] {
                run_case(&dev, &plan, f, 100 + i as u64, c);
            }
        }
    }
}

#[test]
fn folded_norm_matches_in_every_gguf_block_kind() {
    let dev = device(None);
    for plan in plans(&dev) {
        for (i, c) in cases().iter().enumerate() {
            // K-plane rows are whole 256- (32-) column blocks where the kind needs them.
            let k = c.k.div_ceil(256) * 256;
            let c = Case { k, ..*c };
            for f in [
                WeightFormat::Q4K,
                WeightFormat::Q5K,
                WeightFormat::Q6K,
                WeightFormat::Q5A,
            ] {
                run_case(&dev, &plan, f, 200 + i as u64, &c);
            }
        }
    }
}

/// Every family's fixture on the GPU plan: a one-token step dispatches a norm only before a
/// dense layer's MLP (Qwen3-MoE's dense layers; none in the others), the head none, so a
/// MoE layer saves two dispatches and the head one against the storage plan's count of
/// norms; a multi-token step keeps every norm. The tokens of this plan are the goldens'
/// (tests/parity_families.rs, tests/pipeline.rs).
#[test]
fn one_token_steps_dispatch_no_norm_before_a_matvec_on_every_family() {
    use common::cli::{MIXTRAL, OLMOE, QWEN, QWEN3};
    use wgmoe::backend::plan::PrefillKernels;
    for name in [OLMOE, QWEN, QWEN3, MIXTRAL] {
        let gpu = KernelOverrides {
            decode: Some(DecodeKernels::Coalesced),
            prefill: Some(PrefillKernels::Tiled),
            ..Default::default()
        };
        let e = common::engine::load_on(
            name,
            64,
            Default::default(),
            wgmoe::model::Executor::Grouped,
            gpu,
        )
        .unwrap_or_else(|err| panic!("{name}: {err}"));
        let cfg = &e.fwd.cfg;
        let dense = (0..cfg.num_layers)
            .filter(|&l| !cfg.sparse_layers.get(l).copied().unwrap_or(true))
            .count();
        let step = e.fwd.decode_step_kernels(LONGEST);
        let norms: Vec<&str> = step
            .iter()
            .filter(|(_, k)| *k == Kernel::RmsNorm)
            .map(|(s, _)| *s)
            .collect();
        assert_eq!(norms, vec!["ffn_norm"; dense], "{name}: {step:?}");
        let folded = step
            .iter()
            .filter(|(_, k)| matches!(k, Kernel::MatvecNorm(_)))
            .count();
        assert!(
            // Every qkv, every router, the lm_head.
            folded >= cfg.num_layers + (cfg.num_layers - dense) + 1,
            "{name}: {folded} folded matvecs"
        );
        assert_eq!(e.fwd.dispatches_per_decode_step(LONGEST), step.len());
        // Multi-token steps: both norms of every layer.
        let norms_at = |t: u32| {
            e.fwd
                .layers
                .iter()
                .flat_map(|l| l.pre.program().ops.iter())
                .filter(|o| {
                    o.dispatch(t, LONGEST)
                        .is_some_and(|(k, _, _)| k == Kernel::RmsNorm)
                })
                .count()
        };
        assert_eq!(norms_at(8), 2 * cfg.num_layers, "{name}");
    }
}

//! The CUDA kernels (`--features cuda`) against the CPU references, with the tolerances of
//! the wgpu kernel tests (tests/kernels_*.rs; the constants below name their origin).
//! Programs come from the forward pass's op builders, as there. Without a CUDA device each
//! test prints "not run: no CUDA device" and returns: it has checked nothing, and says so
//! (set WGMOE_REQUIRE_CUDA=1 to make a missing device a failure, as tools/gpu-check.sh
//! does). The whole wgpu kernel suites also run on CUDA with WGMOE_TEST_BACKEND=cuda.
#![cfg(feature = "cuda")]

mod common;

use common::check::check;
use common::gpu::*;
use common::q4::{Setup, Q4_TOL, SHAPES};
use common::rng::Rng;
use wgmoe::backend::params::*;
use wgmoe::backend::{BackendChoice, Device, DeviceRequest, KernelOverrides, Program};
use wgmoe::cpu_ref;
use wgmoe::model::ops::{self, OpEnv};
use wgmoe::model::tensors::{upload_f16_vec, F16Matrix};

/// tests/kernels_dense.rs
const EMBED_TOL: f32 = 0.0;
const RMSNORM_TOL: f32 = 1e-5;
const MATMUL_TOL: f32 = 2e-5;
/// tests/kernels_moe.rs
const ROUTER_TOL: f32 = 1e-6;

/// The CUDA device and its plan, or None (printed) when this machine has none.
fn cuda(test: &str) -> Option<Gpu> {
    common::use_backend(BackendChoice::Cuda);
    init_env();
    match Device::open(&DeviceRequest {
        backend: Some(BackendChoice::Cuda),
        ..Default::default()
    }) {
        Ok(dev) => {
            let plan = plan(&dev, &KernelOverrides::default());
            println!(
                "{test}: on `{}` ({})",
                dev.info().name,
                dev.info().driver_string()
            );
            Some(Gpu { dev, plan })
        }
        Err(e) if std::env::var_os("WGMOE_REQUIRE_CUDA").is_none() => {
            println!("{test}: not run: no CUDA device ({e})");
            None
        }
        Err(e) => panic!("{test}: WGMOE_REQUIRE_CUDA is set and no CUDA device opens: {e}"),
    }
}

#[test]
fn cuda_embed_matches_cpu() {
    let Some(g) = cuda("cuda_embed_matches_cpu") else {
        return;
    };
    let dev = &g.dev;
    for (seed, vocab, hidden, ids) in [
        (1u64, 40usize, 7usize, vec![0u32, 39, 5, 5, 17]),
        (3, 33, 70, vec![32, 0, 1, 16, 31, 2, 2, 20, 15]),
    ] {
        let mut rng = Rng::new(seed);
        let table = rng.f16s(vocab * hidden, 2.0);
        let m = F16Matrix::upload(dev, "embed", vocab, hidden, &table).unwrap();
        let t = ids.len();
        let step = dev.step_buffer(0, t).unwrap();
        let ids_b = u32_buf(dev, &ids);
        let x = f32_buf(dev, &vec![f32::NAN; t * hidden]);
        let mut prog = Program::default();
        ops::embed(&mut prog, &m, &ids_b, &x, hidden);
        run(dev, prog, &step, t);
        let want = cpu_ref::embed(&table, hidden, &ids).unwrap();
        check(
            &format!("cuda embed {vocab}x{hidden} T {t}"),
            &read_f32(dev, &x, t * hidden),
            &want,
            EMBED_TOL,
        );
    }
}

#[test]
fn cuda_rmsnorm_matches_cpu() {
    let Some(g) = cuda("cuda_rmsnorm_matches_cpu") else {
        return;
    };
    let dev = &g.dev;
    for (i, (t, n)) in [(1, 1), (5, 7), (6, 64), (2, 257), (3, 1408)]
        .into_iter()
        .enumerate()
    {
        let mut rng = Rng::new(10 + i as u64);
        let rows = rng.vec(t * n, 3.0);
        let weight = rng.f16_range(n, 0.5, 1.5);
        let step = dev.step_buffer(0, t).unwrap();
        let x = f32_buf(dev, &rows);
        let w = upload_f16_vec(dev, "norm", &weight).unwrap();
        let out = f32_buf(dev, &vec![-7.0; t * n]);
        let mut prog = Program::default();
        ops::rmsnorm(&mut prog, &w, &x, &out, n, 1e-5);
        run(dev, prog, &step, t);
        let want = cpu_ref::rmsnorm(&rows, &weight, 1e-5).unwrap();
        check(
            &format!("cuda rmsnorm T {t} n {n}"),
            &read_f32(dev, &out, t * n),
            &want,
            RMSNORM_TOL,
        );
    }
}

#[test]
fn cuda_matmul_matches_cpu() {
    let Some(g) = cuda("cuda_matmul_matches_cpu") else {
        return;
    };
    let dev = &g.dev;
    use flags::{LAST_TOKEN_ONLY as LAST, MATMUL_ACCUMULATE as ACC};
    // (T, K, N, bias, flags)
    for (i, (t, k, n, bias, fl)) in [
        (1, 1, 3, false, 0),
        (5, 7, 65, false, 0),
        (7, 13, 100, true, 0),
        (9, 100, 70, false, ACC),
        (6, 257, 130, true, ACC),
        (5, 2048, 100, true, 0),
        (6, 100, 70, false, LAST),
        (9, 257, 130, true, LAST | ACC),
    ]
    .into_iter()
    .enumerate()
    {
        let mut rng = Rng::new(100 + i as u64);
        let xs = rng.vec(t * k, 1.0);
        let w = rng.f16s(n * k, 1.0);
        let b = rng.vec(n, 1.0);
        let out_rows = if fl & LAST != 0 { 1 } else { t };
        let out0 = rng.vec(out_rows * n, 2.0);
        let m = F16Matrix::upload(dev, "w", n, k, &w).unwrap();
        let step = dev.step_buffer(0, t).unwrap();
        let x = f32_buf(dev, &xs);
        let bias_b = bias.then(|| f32_buf(dev, &b));
        let out = f32_buf(dev, &out0);
        let d = dummy(dev);
        let env = OpEnv {
            plan: &g.plan,
            chunk: t,
            dummy: &d,
        };
        let mut prog = Program::default();
        ops::matmul(&mut prog, &env, &m, &x, bias_b.as_ref(), &out, n, fl);
        run(dev, prog, &step, t);
        let x_rows = if fl & LAST != 0 {
            &xs[(t - 1) * k..]
        } else {
            &xs[..]
        };
        let want = cpu_ref::matmul(
            x_rows,
            k,
            &w,
            n,
            bias.then_some(&b[..]),
            (fl & ACC != 0).then_some(&out0[..]),
        )
        .unwrap();
        check(
            &format!("cuda matmul T {t} K {k} N {n} bias {bias} flags {fl:#b}"),
            &read_f32(dev, &out, out_rows * n),
            &want,
            MATMUL_TOL,
        );
    }
}

#[test]
fn cuda_router_topk_matches_cpu() {
    let Some(g) = cuda("cuda_router_topk_matches_cpu") else {
        return;
    };
    let dev = &g.dev;
    let mut rng = Rng::new(700);
    for (t, e, k, norm, stride) in [
        (5, 5, 1, false, 5),
        (9, 60, 8, true, 61),
        (70, 64, 8, false, 64),
    ] {
        let logits = rng.vec(t * stride, 4.0);
        let step = dev.step_buffer(0, t).unwrap();
        let lb = f32_buf(dev, &logits);
        let ids = u32_buf(dev, &vec![u32::MAX; t * k]);
        let w = f32_buf(dev, &vec![f32::NAN; t * k]);
        let mut prog = Program::default();
        ops::router_topk(
            &mut prog,
            &RouterTopkParams {
                n_experts: e as u32,
                top_k: k as u32,
                logits_stride: stride as u32,
                norm_topk: norm as u32,
                ..Default::default()
            },
            &lb,
            &ids,
            &w,
        );
        run(dev, prog, &step, t);
        let (want_ids, want_w) = cpu_ref::router_topk(&logits, stride, e, k, norm).unwrap();
        let what = format!("cuda router_topk T {t} experts {e} top {k} norm {norm}");
        assert_eq!(read_u32(dev, &ids, t * k), want_ids, "{what}");
        check(&what, &read_f32(dev, &w, t * k), &want_w, ROUTER_TOL);
    }
}

#[test]
fn cuda_argmax_matches_cpu() {
    let Some(g) = cuda("cuda_argmax_matches_cpu") else {
        return;
    };
    let dev = &g.dev;
    let mut rng = Rng::new(1000);
    for n in [1usize, 255, 256, 257, 3001] {
        let mut logits = rng.vec(2 * n, 10.0);
        let step = dev.step_buffer(0, 2).unwrap();
        // (Suppressing the only id of a one-wide row leaves none: not a case.)
        let sup0 = if n > 1 { vec![0u32] } else { vec![] };
        for (last_row, suppress) in [(false, vec![]), (true, sup0), (true, vec![])] {
            let row = if last_row { &logits[n..] } else { &logits[..n] };
            let want = cpu_ref::argmax(row, &suppress);
            let lb = f32_buf(dev, &logits);
            let mut sup = [0u32; 4];
            sup[..suppress.len()].copy_from_slice(&suppress);
            for split in [false, true] {
                let token = u32_buf(dev, &[u32::MAX - 1; 4]);
                let part = u32_buf(dev, &vec![7; 4 * ops::argmax_parts(n)]);
                let mut prog = Program::default();
                ops::argmax(
                    &mut prog,
                    &ArgmaxParams {
                        n: n as u32,
                        n_suppress: suppress.len() as u32,
                        row_stride: n as u32,
                        flags: if last_row { flags::ARGMAX_LAST_ROW } else { 0 },
                        suppress: sup,
                    },
                    &lb,
                    &token,
                    &part,
                    split,
                );
                run(dev, prog, &step, 2);
                assert_eq!(
                    read_u32(dev, &token, 1)[0],
                    want,
                    "cuda argmax n {n} last_row {last_row} suppress {suppress:?} split {split}"
                );
            }
        }
        // A non-finite value flags the row.
        logits[n / 2] = f32::NAN;
        let lb = f32_buf(dev, &logits);
        for split in [false, true] {
            let token = u32_buf(dev, &[0; 4]);
            let part = u32_buf(dev, &vec![0; 4 * ops::argmax_parts(n)]);
            let mut prog = Program::default();
            ops::argmax(
                &mut prog,
                &ArgmaxParams {
                    n: n as u32,
                    row_stride: n as u32,
                    ..Default::default()
                },
                &lb,
                &token,
                &part,
                split,
            );
            run(dev, prog, &step, 2);
            assert_eq!(
                read_u32(dev, &token, 1)[0],
                u32::MAX,
                "cuda argmax NaN n {n} split {split}"
            );
        }
    }
}

#[test]
fn cuda_w4a16_kernels_match_cpu() {
    let Some(g) = cuda("cuda_w4a16_kernels_match_cpu") else {
        return;
    };
    // The plan's variant (8 lanes per row on a warp) and the portable one (1 lane).
    let portable = Gpu {
        dev: g.dev.clone(),
        plan: plan(
            &g.dev,
            &KernelOverrides {
                portable: true,
                ..Default::default()
            },
        ),
    };
    for (i, &c) in SHAPES.iter().enumerate() {
        for g in [&g, &portable] {
            w4a16_case(g, 100 + i as u64, c);
        }
    }
}

fn w4a16_case(g: &Gpu, seed: u64, c: common::q4::Case) {
    {
        let s = Setup::random(g, seed, c);
        let all = s.all_chunks();
        let what = s.what();
        check(
            &format!("cuda ffn_gate_up_q4 {what}"),
            &s.gpu_gate_up(&all),
            &s.want_gate_up(),
            Q4_TOL,
        );
        check(
            &format!("cuda ffn_down_q4 per slot {what}"),
            &s.gpu_down(&s.h_b, &all),
            &s.want_down(&s.h_in),
            Q4_TOL,
        );
        check(
            &format!("cuda ffn_down_q4 fused {what}"),
            &s.gpu_fused(&s.h_b, &all),
            &s.want_fused(&s.h_in, &all),
            Q4_TOL,
        );
    }
}

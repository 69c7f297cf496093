//! The other variants of the W4A16 expert kernels, each against what tests/kernels_q4.rs
//! checks against the CPU reference (harness: tests/common/q4.rs): values after the last
//! activation row the kernels must not read, the one-token kernels reading a 64 KiB
//! uniform window (bit-identical to the portable ones), the f16-arithmetic kernels (within
//! a tolerance of the f32 ones), and the expert-major prefill kernels (sort, gather,
//! gate/up, down). The dispatches are the forward pass's own (`model::moe::MoeDispatch`).
//! Runs on lavapipe in CI; a missing adapter is a failure, never a skip.

mod common;

use common::check::{check, check_bits};
use common::gpu::*;
use common::q4::*;
use common::rng::Rng;
use wgmoe::backend::kernel::{Activations, Arith, Kernel, Lanes, Q4Variant};
use wgmoe::backend::plan::{DecodeKernels, PrefillKernels, Switch};
use wgmoe::backend::{KernelOverrides, Program};
use wgmoe::blocks::quant::Q4SlotLayout;
use wgmoe::model::moe::{Executor, MoeDispatch};
use wgmoe::model::tensors::{ExpertStore, Q4Pool};

// ---------------------------------------------------------------------------------------------
// Values the kernels must not read
//
// Activations are only defined for the first `in` columns of a row. With in-dims not
// multiples of 32 the last nibble vec4 of a row covers columns past `in`; their padding
// nibbles are 8 (weight 0), but 0 * NaN = NaN, so a kernel must not multiply them with
// whatever follows the row. In the forward pass that is the next row, or, after the last
// token of a step shorter than the buffers, stale values of an earlier step. Here: NaN
// after the last row (the first W4A16 kernels loaded 32 activations with no `< in` guard
// and failed these).

/// Indices of the `width`-wide rows of `v` holding a NaN.
fn nan_rows(v: &[f32], width: usize) -> Vec<usize> {
    (0..v.len() / width)
        .filter(|r| v[r * width..(r + 1) * width].iter().any(|x| x.is_nan()))
        .collect()
}

fn with_nan_tail(v: &[f32]) -> Vec<f32> {
    let mut v = v.to_vec();
    v.extend(std::iter::repeat_n(f32::NAN, 64));
    v
}

/// gate_up with NaN after the last token's x row.
#[test]
fn w4a16_gate_up_ignores_values_after_x() {
    for o in VARIANTS {
        let g = Gpu::new(None, o);
        for (i, c) in [case(33, 65, 4, 5, 3, 5), case(300, 100, 4, 4, 2, 1)]
            .into_iter()
            .enumerate()
        {
            let s = Setup::random(&g, 700 + i as u64, c);
            let x_nan = f32_buf(&g.dev, &with_nan_tail(&s.xs));
            let got = s.gpu_gate_up_on(&x_nan, &s.all_chunks());
            let what = format!("ffn_gate_up_q4, NaN after x, {}", s.what());
            eprintln!(
                "{what}: NaN rows {:?} of {}",
                nan_rows(&got, c.inter),
                c.t * c.top_k
            );
            check(&what, &got, &s.want_gate_up(), Q4_TOL);
        }
    }
}

/// down (per slot and fused) with NaN after the last row of h.
#[test]
fn w4a16_down_ignores_values_after_h() {
    for o in VARIANTS {
        let g = Gpu::new(None, o);
        for (i, c) in [case(33, 65, 4, 5, 3, 5), case(100, 300, 4, 4, 2, 1)]
            .into_iter()
            .enumerate()
        {
            let s = Setup::random(&g, 710 + i as u64, c);
            let h_nan = f32_buf(&g.dev, &with_nan_tail(&s.h_in));
            let all = s.all_chunks();
            let got_y = s.gpu_down(&h_nan, &all);
            let got_x = s.gpu_fused(&h_nan, &all);
            let what = format!("NaN after h, {}", s.what());
            eprintln!(
                "{what}: NaN rows: per slot {:?} of {}, fused {:?} of {}",
                nan_rows(&got_y, c.hidden),
                c.t * c.top_k,
                nan_rows(&got_x, c.hidden),
                c.t
            );
            check(
                &format!("ffn_down_q4 per slot {what}"),
                &got_y,
                &s.want_down(&s.h_in),
                Q4_TOL,
            );
            check(
                &format!("ffn_down_q4 fused {what}"),
                &got_x,
                &s.want_fused(&s.h_in, &all),
                Q4_TOL,
            );
        }
    }
}

/// The one-token decode kernels (activations in a uniform window) run the same arithmetic
/// in the same order as the portable kernels, which are checked against the CPU reference
/// in tests/kernels_q4.rs: their outputs must be bit-identical, for both executors, with
/// the gate/up -> down chain, fused combine, partial blocks and a split pool.
#[test]
fn w4a16_uniform_decode_kernels_equal_portable() {
    for &(h, i, e, k, cap) in &[
        (64usize, 96usize, 7usize, 3usize, None),
        (256, 320, 6, 3, None),
        (260, 1412, 9, 4, None),
        (2048, 1408, 8, 4, Some(20u64 << 20)),
        (100, 36, 5, 5, Some(8192)),
    ] {
        let g = Gpu::portable(cap, true);
        let dev = &g.dev;
        let layout = Q4SlotLayout::new(h, i);
        let mut rng = Rng::new((h * 31 + i) as u64);
        let pool = Q4Pool::new(dev, "experts", e, layout).unwrap();
        for s in 0..e {
            pool.write_slot(dev, s, &random_slot(&mut rng, &layout))
                .unwrap();
        }
        let store = ExpertStore::Int4(pool);
        let perm: Vec<u32> = rng.permutation(e).iter().map(|&p| p as u32).collect();
        let ids: Vec<u32> = perm[..k].to_vec();
        let slot_of = u32_buf(
            dev,
            &rng.permutation(e)
                .iter()
                .map(|&p| p as u32)
                .collect::<Vec<_>>(),
        );
        let xv = rng.vec(h, 1.0);
        let w: Vec<f32> = (0..k).map(|_| rng.f32(1.0)).collect();
        let x0 = rng.vec(h, 1.0);
        let step = dev.step_buffer(0, 1).unwrap();
        let dummy = dummy(dev);
        let topk_ids = u32_buf(dev, &ids);
        let topk_w = f32_buf(dev, &w);
        let mut outs = Vec::new();
        for uniform in [false, true] {
            for executor in [Executor::Grouped, Executor::PerExpert] {
                let xn = uniform_buf(dev, &xv);
                let hbuf = uniform_buf(dev, &vec![0.0; k * i]);
                let y = f32_buf(dev, &vec![0.0; k * h]);
                let x = f32_buf(dev, &x0);
                let moe = MoeDispatch {
                    plan: &g.plan,
                    sorted: None,
                    fuse_combine: true,
                    decode_uniform: uniform,
                    coalesced: false,
                    tiled: None,
                    one_token: false,
                    hidden: h,
                    top_k: k,
                    dummy: &dummy,
                    xn: &xn,
                    topk_ids: &topk_ids,
                    topk_w: &topk_w,
                    hbuf: &hbuf,
                    y: &y,
                    x: &x,
                    route: None,
                };
                let mut prog = Program::default();
                let _ = moe.routed(&mut prog, executor, &store, &slot_of);
                let want = if uniform {
                    g.plan.q4_uniform()
                } else {
                    Q4Variant::PORTABLE
                };
                assert_eq!(
                    want.act,
                    if uniform {
                        Activations::Uniform
                    } else {
                        Activations::Storage
                    }
                );
                assert!(
                    prog.ops.iter().all(|o| o.kernel.q4_variant() == Some(want)),
                    "uniform {uniform}: every op is {want:?}"
                );
                run(dev, prog, &step, 1);
                outs.push((
                    uniform,
                    executor,
                    read_f32(dev, &hbuf, k * i),
                    read_f32(dev, &y, k * h),
                    read_f32(dev, &x, h),
                ));
            }
        }
        for exec in [Executor::Grouped, Executor::PerExpert] {
            let a = outs.iter().find(|o| !o.0 && o.1 == exec).unwrap();
            let b = outs.iter().find(|o| o.0 && o.1 == exec).unwrap();
            let what = format!("H {h} I {i} E {e} k {k} cap {cap:?} {exec:?}");
            check_bits(&format!("{what}: h"), &b.2, &a.2);
            check_bits(&format!("{what}: y"), &b.3, &a.3);
            check_bits(&format!("{what}: x"), &b.4, &a.4);
        }
    }
}

/// The f16-arithmetic W4A16 kernels (the GPU default where SHADER_F16 exists) against the
/// f32 subgroup kernels, which are checked against the CPU reference in
/// tests/kernels_q4.rs. Only the products and the 4-term sums of each nibble half-word are
/// f16 (activations rounded to 11 bits, then each 4-product sum rounded again, up to 8 |x|
/// in magnitude); every longer sum is f32. With the cancellation of 256-input blocks of
/// random signs and the SiLU product that allows about 1e-2 relative (measured worst on
/// lavapipe: 7e-3).
const F16_ARITH_TOL: f32 = 1.5e-2;

#[test]
fn w4a16_f16_arithmetic_matches_f32_kernels() {
    let dev = device(None);
    if !subgroup_kernels(
        &dev,
        Kernel::Q4GateUp(Q4Variant {
            act: Activations::Storage,
            lanes: Lanes::Eight,
            arith: Arith::F16,
        }),
    ) {
        return;
    }
    let plan_of = |f16: Switch| {
        plan(
            &dev,
            &KernelOverrides {
                f16_arithmetic: Some(f16),
                decode: Some(DecodeKernels::Storage),
                ..Default::default()
            },
        )
    };
    let (p32, p16) = (plan_of(Switch::Off), plan_of(Switch::On));
    assert!(
        p16.f16_arithmetic,
        "lavapipe has SHADER_F16 and subgroups: the f16 kernels must be built"
    );
    assert!(!p32.f16_arithmetic);
    for &(h, i, e, k, t) in &[
        (64usize, 96usize, 7usize, 3usize, 1usize),
        (256, 320, 6, 3, 5),
        (300, 1412, 9, 4, 2),
        (2048, 1408, 8, 4, 1),
    ] {
        let mut outs = Vec::new();
        for (plan, arith) in [(&p32, Arith::F32), (&p16, Arith::F16)] {
            let layout = Q4SlotLayout::new(h, i);
            let mut rng = Rng::new((h * 7 + i) as u64);
            let pool = Q4Pool::new(&dev, "experts", e, layout).unwrap();
            for sl in 0..e {
                pool.write_slot(&dev, sl, &random_slot(&mut rng, &layout))
                    .unwrap();
            }
            let store = ExpertStore::Int4(pool);
            let ids: Vec<u32> = (0..t)
                .flat_map(|_| {
                    rng.permutation(e)[..k]
                        .iter()
                        .map(|&p| p as u32)
                        .collect::<Vec<_>>()
                })
                .collect();
            let slot_of = u32_buf(&dev, &(0..e as u32).collect::<Vec<_>>());
            let xn = f32_buf(&dev, &rng.vec(t * h, 1.0));
            let w: Vec<f32> = (0..t * k).map(|_| rng.f32(1.0)).collect();
            let x = f32_buf(&dev, &rng.vec(t * h, 1.0));
            let step = dev.step_buffer(0, t).unwrap();
            let dummy = dummy(&dev);
            let (topk_ids, topk_w) = (u32_buf(&dev, &ids), f32_buf(&dev, &w));
            let hbuf = f32_buf(&dev, &vec![0.0; t * k * i]);
            let y = f32_buf(&dev, &vec![0.0; t * k * h]);
            let moe = MoeDispatch {
                plan,
                sorted: None,
                fuse_combine: true,
                decode_uniform: false,
                coalesced: false,
                tiled: None,
                one_token: false,
                hidden: h,
                top_k: k,
                dummy: &dummy,
                xn: &xn,
                topk_ids: &topk_ids,
                topk_w: &topk_w,
                hbuf: &hbuf,
                y: &y,
                x: &x,
                route: None,
            };
            let mut prog = Program::default();
            let _ = moe.routed(&mut prog, Executor::Grouped, &store, &slot_of);
            let want = Q4Variant {
                act: Activations::Storage,
                lanes: Lanes::Eight,
                arith,
            };
            assert!(
                prog.ops.iter().all(|o| o.kernel.q4_variant() == Some(want)),
                "every op is {want:?}"
            );
            run(&dev, prog, &step, t);
            outs.push((read_f32(&dev, &hbuf, t * k * i), read_f32(&dev, &x, t * h)));
        }
        let what = format!("H {h} I {i} E {e} k {k} T {t}");
        check(
            &format!("{what}: f16-arith h vs f32"),
            &outs[1].0,
            &outs[0].0,
            F16_ARITH_TOL,
        );
        check(
            &format!("{what}: f16-arith x vs f32"),
            &outs[1].1,
            &outs[0].1,
            F16_ARITH_TOL,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Expert-major kernels (multi-token steps on CPU adapters): sort, gather, gate/up, down

/// Sort, gather, gate/up and down chained, against the CPU reference chained the same way
/// (the sum of two kernels' rounding, hence twice the single-kernel tolerance).
const EXPERT_MAJOR_TOL: f32 = 4e-5;

#[test]
fn w4a16_expert_major_matches_cpu() {
    let g = Gpu::portable(None, false);
    if !subgroup_kernels(&g.dev, Kernel::Q4GateUpSorted) {
        return;
    }
    assert!(
        g.plan.window_prefill && g.plan.expert_major(true, true, 64),
        "lavapipe has subgroups of 8 lanes: the expert-major kernels must be built"
    );
    // The shapes above plus long runs per expert (more than 8 pairs: several groups of 8,
    // a partial last one) and many tokens.
    let mut cases: Vec<Case> = SHAPES.to_vec();
    cases.extend([
        case(64, 96, 3, 4, 2, 20),
        case(100, 36, 2, 2, 1, 17),
        case(257, 300, 5, 6, 4, 33),
        case(1024, 512, 64, 64, 8, 16),
    ]);
    for (i, &c) in cases.iter().enumerate() {
        let s = Setup::random(&g, 900 + i as u64, c);
        let (pairs, pair_experts, y) = s.gpu_expert_major();
        let np = c.t * c.top_k;
        // A stable counting sort by expert: pairs in (expert, token, j) order.
        let mut want: Vec<u32> = (0..np as u32).collect();
        want.sort_by_key(|&q| s.ids[q as usize]);
        assert_eq!(&pairs[..], &want[..], "sorted pairs, case {c:?}");
        let experts: Vec<u32> = want.iter().map(|&q| s.ids[q as usize]).collect();
        assert_eq!(&pair_experts[..], &experts[..], "pair experts, case {c:?}");
        let h = s.want_gate_up();
        check(
            &format!("expert-major gate_up -> down {}", s.what()),
            &y,
            &s.want_down(&h),
            EXPERT_MAJOR_TOL,
        );
    }
}

/// Split pools: each chunk's dispatches serve exactly the pairs whose expert lives there.
#[test]
fn w4a16_expert_major_split_pool_matches_cpu() {
    for (c, per_chunk) in [
        (case(300, 65, 7, 10, 4, 9), 3usize),
        (case(96, 1408, 5, 7, 3, 12), 2),
    ] {
        let l = Q4SlotLayout::new(c.hidden, c.inter);
        let g = Gpu::portable(Some((per_chunk * l.bytes) as u64), false);
        if !subgroup_kernels(&g.dev, Kernel::Q4GateUpSorted) {
            return;
        }
        let s = Setup::random(&g, 990 + c.hidden as u64, c);
        assert!(s.pool().chunks.len() > 1, "{}", s.what());
        let (_, _, y) = s.gpu_expert_major();
        let h = s.want_gate_up();
        check(
            &format!("expert-major split {}", s.what()),
            &y,
            &s.want_down(&h),
            EXPERT_MAJOR_TOL,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Tiled expert GEMMs (multi-token steps on GPUs): sort, gate/up, down over the sorted pairs

/// gate/up against the reference on the same input, down on the GPU's h: each kernel
/// alone (MATMUL_TOL-like, as Q4_TOL).
#[test]
fn w4a16_expert_gemm_matches_cpu() {
    let tiled = KernelOverrides {
        prefill: Some(PrefillKernels::Tiled),
        ..Default::default()
    };
    // The shapes above plus runs longer than a 16-pair tile, many tokens, split pools.
    let mut cases: Vec<(Case, Option<usize>)> = SHAPES.iter().map(|&c| (c, None)).collect();
    cases.extend([
        (case(64, 96, 3, 4, 2, 20), None),
        (case(257, 300, 5, 6, 4, 33), None),
        (case(1024, 512, 64, 64, 8, 16), None),
        (case(300, 65, 7, 10, 4, 9), Some(3)),
        (case(96, 1408, 5, 7, 3, 12), Some(2)),
    ]);
    for (i, &(c, per_chunk)) in cases.iter().enumerate() {
        let cap = per_chunk.map(|n| (n * Q4SlotLayout::new(c.hidden, c.inter).bytes) as u64);
        let g = Gpu::new(cap, tiled);
        let s = Setup::random(&g, 1100 + i as u64, c);
        let (h, y) = s.gpu_expert_gemm();
        let what = s.what();
        check(
            &format!("expert_gemm gate_up {what}"),
            &h,
            &s.want_gate_up(),
            Q4_TOL,
        );
        check(
            &format!("expert_gemm down {what}"),
            &y,
            &s.want_down(&h),
            Q4_TOL,
        );
    }
}

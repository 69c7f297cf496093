//! The W4A16 expert kernels (shaders/ffn_gate_up_q4.wgsl, shaders/ffn_down_q4.wgsl, in
//! the variants the kernel plan picks) against `wgmoe::cpu_ref::w4a16_*`, which reads the
//! same packed slot bytes element by element through `Q4Matrix::nibble` /
//! `Q4Matrix::scale` and sums in f64. The dispatches are the forward pass's own
//! (`model::moe::MoeDispatch`: one op per pool chunk), over a slot table that maps expert
//! ids to permuted pool slots, the extra slots holding unrelated experts (harness and
//! random slots: tests/common/q4.rs). Runs on lavapipe in CI; a missing adapter is a
//! failure, never a skip. The quantise -> pack -> kernel path on real-ish weights is
//! checked on its own. The other kernel variants (one-token uniform windows, f16
//! arithmetic, expert-major) and values the kernels must not read: tests/kernels_q4_variants.rs.
//!
//! A difference is measured as in tests/common/check.rs: `|gpu - cpu| / max(1, rms(cpu),
//! |cpu|)`, the largest one printed per case.

mod common;

use half::bf16;

use common::check::{check, check_bits, check_floor};
use common::gpu::*;
use common::q4::*;
use common::rng::Rng;
use wgmoe::backend::params::*;
use wgmoe::backend::Program;
use wgmoe::blocks::quant::{Q4SlotLayout, BLOCK};
use wgmoe::model::moe::Executor;
use wgmoe::model::ops::{self, CombineBuffers};

/// Serving top-k index j by its own dispatch (j_base = j, grid y = 1) runs the very same
/// invocation arithmetic as the grouped dispatch: bit-identical.
const SPLIT_TOL: f32 = 0.0;
/// Fused combine vs per-slot y + moe_combine: the same products; only the order of the
/// additions differs when several chunks each add their part to x.
const FUSED_VS_COMBINE_TOL: f32 = 1e-6;
/// Kernel vs a dense f64 dot with `Q4Matrix::dequantize`d weights: as Q4_TOL (the
/// dequantised weights q * scale are exact in f32, so only the kernel's rounding differs).
const DEQUANT_TOL: f32 = 2e-5;

// ---------------------------------------------------------------------------------------------
// 1. gate_up

#[test]
fn w4a16_gate_up_matches_cpu() {
    for o in VARIANTS {
        let g = Gpu::new(None, o);
        for (i, &c) in SHAPES.iter().enumerate() {
            let s = Setup::random(&g, 100 + i as u64, c);
            let got = s.gpu_gate_up(&s.all_chunks());
            check(
                &format!("ffn_gate_up_q4 {}", s.what()),
                &got,
                &s.want_gate_up(),
                Q4_TOL,
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 2. down, per slot and fused

#[test]
fn w4a16_down_matches_cpu() {
    for o in VARIANTS {
        let g = Gpu::new(None, o);
        for (i, &c) in SHAPES.iter().enumerate() {
            let s = Setup::random(&g, 200 + i as u64, c);
            let all = s.all_chunks();
            let what = s.what();
            check(
                &format!("ffn_down_q4 per slot {what}"),
                &s.gpu_down(&s.h_b, &all),
                &s.want_down(&s.h_in),
                Q4_TOL,
            );
            check(
                &format!("ffn_down_q4 fused {what}"),
                &s.gpu_fused(&s.h_b, &all),
                &s.want_fused(&s.h_in, &all),
                Q4_TOL,
            );
        }
    }
}

/// Several chunks: gate_up, down per slot and fused over all chunks match the CPU; and run
/// over ONE chunk alone, each kernel touches exactly the (token, top-k) rows whose expert
/// lives in that chunk (per slot: the other rows keep their NaN; fused: x gains only that
/// chunk's experts, and a token with none of them keeps x bit for bit).
#[test]
fn w4a16_split_pool_matches_cpu() {
    for o in VARIANTS {
        // (case, slots per chunk): 4 chunks of 3 + 3 + 3 + 1; 4 of 2; 6 of 1.
        let cases = [
            (case(300, 65, 7, 10, 4, 5), 3),
            (case(33, 320, 8, 8, 8, 5), 2),
            (case(257, 3, 5, 6, 5, 1), 1),
            (case(96, 1408, 5, 7, 3, 5), 2),
        ];
        for (i, &(c, per_chunk)) in cases.iter().enumerate() {
            let bytes = Q4SlotLayout::new(c.hidden, c.inter).bytes as u64;
            let g = Gpu::new(Some(per_chunk * bytes), o);
            let s = Setup::random(&g, 300 + i as u64, c);
            let n_chunks = c.slots.div_ceil(per_chunk as usize);
            assert_eq!(s.pool().chunks.len(), n_chunks, "Q4Pool chunks");
            assert_eq!(s.pool().slots_per_chunk, per_chunk as usize);
            let all = s.all_chunks();
            let what = s.what();
            let want_h = s.want_gate_up();
            let want_y = s.want_down(&s.h_in);
            check(
                &format!("ffn_gate_up_q4 {what}"),
                &s.gpu_gate_up(&all),
                &want_h,
                Q4_TOL,
            );
            check(
                &format!("ffn_down_q4 per slot {what}"),
                &s.gpu_down(&s.h_b, &all),
                &want_y,
                Q4_TOL,
            );
            check(
                &format!("ffn_down_q4 fused {what}"),
                &s.gpu_fused(&s.h_b, &all),
                &s.want_fused(&s.h_in, &all),
                Q4_TOL,
            );

            let (k, t) = (c.top_k, c.t);
            for ci in all.iter().copied() {
                // Rows (t, j) served by this chunk: the exact values; the rest: still NaN.
                let mine = |row: usize| s.chunk_of(s.slot(row / k, row % k)) == ci;
                for (name, got, want, width) in [
                    ("ffn_gate_up_q4", s.gpu_gate_up(&[ci]), &want_h, c.inter),
                    (
                        "ffn_down_q4 per slot",
                        s.gpu_down(&s.h_b, &[ci]),
                        &want_y,
                        c.hidden,
                    ),
                ] {
                    let (mut g, mut w) = (Vec::new(), Vec::new());
                    for row in 0..t * k {
                        let r = row * width..(row + 1) * width;
                        if mine(row) {
                            g.extend_from_slice(&got[r.clone()]);
                            w.extend_from_slice(&want[r]);
                        } else {
                            assert!(
                                got[r].iter().all(|v| v.is_nan()),
                                "{name} chunk {ci} alone wrote row {row} of another chunk ({what})"
                            );
                        }
                    }
                    check(
                        &format!("{name} chunk {ci} alone, {} rows, {what}", g.len() / width),
                        &g,
                        &w,
                        Q4_TOL,
                    );
                }
                let got = s.gpu_fused(&s.h_b, &[ci]);
                check(
                    &format!("ffn_down_q4 fused chunk {ci} alone {what}"),
                    &got,
                    &s.want_fused(&s.h_in, &[ci]),
                    Q4_TOL,
                );
                for tt in 0..t {
                    if !(0..k).any(|j| s.chunk_of(s.slot(tt, j)) == ci) {
                        let r = tt * c.hidden..(tt + 1) * c.hidden;
                        check_bits(
                            &format!("fused chunk {ci} alone leaves token {tt} ({what})"),
                            &got[r.clone()],
                            &s.x0[r],
                        );
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 3. per-expert executor vs grouped

/// The per-expert executor (for each j: gate_up with j_base = j and grid y = 1, then down
/// per slot into y; then moe_combine) against the grouped one (gate_up over all top-k
/// indices, then the fused combine), both recorded by `MoeDispatch::routed` as the forward
/// pass records them.
fn per_expert_case(s: &Setup) {
    let (c, dev) = (s.c, &s.g.dev);
    let (k, t) = (c.top_k, c.t);
    let what = s.what();
    let nh = t * k * c.inter;
    let ny = t * k * c.hidden;

    // Grouped: h and the fused combine; then, for comparison, y per slot from that h.
    let hg = f32_buf(dev, &vec![f32::NAN; nh]);
    let yg = f32_buf(dev, &vec![f32::NAN; ny]);
    let xg = f32_buf(dev, &s.x0);
    let mut grouped = Program::default();
    let flags =
        s.moe(&s.x_b, &hg, &yg, &xg)
            .routed(&mut grouped, Executor::Grouped, &s.store, &s.slot_b);
    assert_eq!(
        flags, 0,
        "grouped INT4: the combine is fused, nothing left for moe_combine"
    );
    s.run(grouped);
    let mut ys = Program::default();
    s.moe(&s.x_b, &hg, &yg, &xg)
        .q4_down(&mut ys, s.pool(), &s.slot_b, Some((0, k)));
    s.run(ys);

    // Per expert: one top-k index per dispatch, gate_up and down interleaved on one h
    // (NaN where not written yet), then moe_combine.
    let hp = f32_buf(dev, &vec![f32::NAN; nh]);
    let yp = f32_buf(dev, &vec![f32::NAN; ny]);
    let xp = f32_buf(dev, &s.x0);
    let mut per = Program::default();
    let flags =
        s.moe(&s.x_b, &hp, &yp, &xp)
            .routed(&mut per, Executor::PerExpert, &s.store, &s.slot_b);
    assert_eq!(flags, flags::COMBINE_ROUTED);
    assert_eq!(
        per.ops.len(),
        2 * k * s.pool().chunks.len(),
        "per expert: gate_up and down per j and chunk"
    );
    ops::moe_combine(
        &mut per,
        &MoeCombineParams {
            hidden: c.hidden as u32,
            top_k: k as u32,
            flags,
            ..Default::default()
        },
        &CombineBuffers {
            y: &yp,
            weights: &s.w_b,
            shared_y: &s.dummy,
            router: &s.dummy,
            x: &xp,
            ids: &s.dummy,
            slot_of: &s.dummy,
            host_y: &s.dummy,
        },
    );
    s.run(per);

    let (hg, hp) = (read_f32(dev, &hg, nh), read_f32(dev, &hp, nh));
    let (yg, yp) = (read_f32(dev, &yg, ny), read_f32(dev, &yp, ny));
    let (xg, xp) = (
        read_f32(dev, &xg, t * c.hidden),
        read_f32(dev, &xp, t * c.hidden),
    );
    assert_eq!(SPLIT_TOL, 0.0);
    check_bits(
        &format!("ffn_gate_up_q4 per expert vs grouped {what}"),
        &hp,
        &hg,
    );
    check_bits(
        &format!("ffn_down_q4 per slot, per expert vs grouped {what}"),
        &yp,
        &yg,
    );
    check(
        &format!("per expert + moe_combine vs fused {what}"),
        &xp,
        &xg,
        FUSED_VS_COMBINE_TOL,
    );
    // And the grouped chain against the CPU (down fed the GPU's h).
    check(
        &format!("ffn_gate_up_q4 grouped {what}"),
        &hg,
        &s.want_gate_up(),
        Q4_TOL,
    );
    check(
        &format!("ffn_gate_up_q4 + fused down {what}"),
        &xg,
        &s.want_fused(&hg, &s.all_chunks()),
        Q4_TOL,
    );
}

#[test]
fn w4a16_per_expert_dispatch_equals_grouped() {
    for o in VARIANTS {
        let g = Gpu::new(None, o);
        for (i, c) in [
            case(300, 65, 7, 9, 4, 5),
            case(2056, 96, 8, 8, 8, 5),
            case(33, 257, 5, 6, 1, 1),
        ]
        .into_iter()
        .enumerate()
        {
            per_expert_case(&Setup::random(&g, 400 + i as u64, c));
        }
        let c = case(257, 100, 7, 10, 6, 5);
        let g = Gpu::new(
            Some(3 * Q4SlotLayout::new(c.hidden, c.inter).bytes as u64),
            o,
        );
        let s = Setup::random(&g, 410, c);
        assert_eq!(s.pool().chunks.len(), 4);
        per_expert_case(&s);
    }
}

// ---------------------------------------------------------------------------------------------
// 4. quantise -> pack -> kernel on real-ish weights

/// bf16-rounded, roughly normal weights (sum of three uniforms) of standard deviation
/// `std`, about 1 in 2000 an outlier of 10..20 std.
fn realish(rng: &mut Rng, n: usize, std: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let mut v = (rng.f32(1.0) + rng.f32(1.0) + rng.f32(1.0)) * std;
            if rng.below(2000) == 0 {
                v = v.signum() * std * (15.0 + rng.f32(5.0));
            }
            bf16::from_f32(v).to_f32()
        })
        .collect()
}

/// Dense `x · W^T` in f64 with W the dequantised matrix [out, in].
fn dense(x: &[f32], w: &[f32], out: usize, inp: usize) -> Vec<f64> {
    let mut y = Vec::new();
    for xr in x.chunks(inp) {
        for n in 0..out {
            y.push(
                xr.iter()
                    .zip(&w[n * inp..(n + 1) * inp])
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum(),
            );
        }
    }
    y
}

struct Dequant {
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

/// Quantise (gate, up, down) with `Q4SlotLayout::pack_expert`; check every dequantised
/// weight is within half a step of the original (0 exactly where the block's scale is 0).
fn quantise_expert(l: &Q4SlotLayout, w: [&[f32]; 3]) -> (Vec<u8>, Dequant) {
    let mut slot = vec![0u8; l.bytes];
    l.pack_expert(w[0], w[1], w[2], &mut slot);
    let mut dq = Vec::new();
    for ((m, q_at, s_at), orig) in [
        (l.gate, l.gate_q, l.gate_s),
        (l.gate, l.up_q, l.up_s),
        (l.down, l.down_q, l.down_s),
    ]
    .into_iter()
    .zip(w)
    {
        let (q, s) = (
            &slot[q_at..q_at + m.q_bytes()],
            &slot[s_at..s_at + m.scale_bytes()],
        );
        let d = m.dequantize(q, s);
        for n in 0..m.out {
            for k in 0..m.inp {
                let sc = m.scale(s, n, k / BLOCK).to_f32();
                let (a, b) = (orig[n * m.inp + k], d[n * m.inp + k]);
                assert!(
                    (a - b).abs() <= 0.5 * sc * (1.0 + 1e-6),
                    "dequantised ({n}, {k}): {b} vs {a}, scale {sc}"
                );
            }
        }
        dq.push(d);
    }
    let down = dq.pop().unwrap();
    let up = dq.pop().unwrap();
    let gate = dq.pop().unwrap();
    (slot, Dequant { gate, up, down })
}

/// Experts with outliers, an all-zero block (scale 0) in gate and down and an all-zero row
/// in up, quantised and packed by the crate; gate_up and the fused combine against a dense
/// f64 reference of the dequantised weights (`Q4Matrix::dequantize`).
#[test]
fn w4a16_quantised_realish_weights_match_dequantised_reference() {
    for o in VARIANTS {
        let g = Gpu::new(None, o);
        let c = case(576, 300, 5, 6, 3, 5); // in-dims 2 blocks + 64 and 1 block + 44
        let (hid, inter) = (c.hidden, c.inter);
        let l = Q4SlotLayout::new(hid, inter);
        let mut rng = Rng::new(500);
        let mut host = Vec::new();
        let mut deq = Vec::new();
        let mut orig = Vec::new();
        for e in 0..c.slots {
            let mut gate = realish(&mut rng, inter * hid, 0.02);
            let mut up = realish(&mut rng, inter * hid, 0.02);
            let mut down = realish(&mut rng, hid * inter, 0.02);
            gate[3 * hid + BLOCK..3 * hid + 2 * BLOCK].fill(0.0); // row 3, block 1
            up[(e % inter) * hid..(e % inter + 1) * hid].fill(0.0); // a whole row
            down[7 * inter..7 * inter + BLOCK].fill(0.0); // row 7, block 0
            let (slot, d) = quantise_expert(&l, [&gate, &up, &down]);
            assert_eq!(
                l.gate.scale(&slot[l.gate_s..], 3, 1).to_f32(),
                0.0,
                "zero block -> scale 0"
            );
            assert_eq!(
                l.down.scale(&slot[l.down_s..], 7, 0).to_f32(),
                0.0,
                "zero block -> scale 0"
            );
            host.push(slot);
            deq.push(d);
            orig.push([gate, up, down]);
        }
        // Activations with a few outlier channels, as residual streams have.
        let mut s = Setup::with_slots(&g, &mut rng, c, host, 1.0);
        let mut xs = s.xs.clone();
        for t in 0..c.t {
            xs[t * hid + 5] *= 20.0;
            xs[t * hid + 300] *= -15.0;
        }
        s.set_x(xs.clone());
        let (k, t) = (c.top_k, c.t);
        let h = f32_buf(&g.dev, &vec![f32::NAN; t * k * inter]);
        let x = f32_buf(&g.dev, &s.x0);
        let mut prog = Program::default();
        let flags = s.moe(&s.x_b, &h, &s.dummy, &x).routed(
            &mut prog,
            Executor::Grouped,
            &s.store,
            &s.slot_b,
        );
        assert_eq!(flags, 0);
        s.run(prog);
        let got_h = s.read(&h, t * k * inter);
        let got_x = s.read(&x, t * hid);

        // Dense references: with the dequantised weights (the kernel must match), and with the
        // original ones (the quantisation error, printed for information).
        let expert_of = |tt: usize, j: usize| s.slot(tt, j);
        let (mut want_h, mut want_x, mut orig_x) = (Vec::new(), Vec::new(), Vec::new());
        for tt in 0..t {
            let xr = &xs[tt * hid..(tt + 1) * hid];
            let mut acc: Vec<f64> = s.x0[tt * hid..(tt + 1) * hid]
                .iter()
                .map(|&v| v as f64)
                .collect();
            let mut acc_o = acc.clone();
            for j in 0..k {
                let e = expert_of(tt, j);
                let w = s.weights[tt * k + j] as f64;
                let d = &deq[e];
                let g = dense(xr, &d.gate, inter, hid);
                let u = dense(xr, &d.up, inter, hid);
                let hr: Vec<f32> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| (g / (1.0 + (-g).exp()) * u) as f32)
                    .collect();
                want_h.extend_from_slice(&hr);
                // down is fed the GPU's h, so the combine is judged on its own.
                let y = dense(&got_h[(tt * k + j) * inter..][..inter], &d.down, hid, inter);
                acc.iter_mut().zip(&y).for_each(|(a, y)| *a += w * y);
                let o = &orig[e];
                let go = dense(xr, &o[0], inter, hid);
                let uo = dense(xr, &o[1], inter, hid);
                let ho: Vec<f32> = go
                    .iter()
                    .zip(&uo)
                    .map(|(g, u)| (g / (1.0 + (-g).exp()) * u) as f32)
                    .collect();
                let yo = dense(&ho, &o[2], hid, inter);
                acc_o.iter_mut().zip(&yo).for_each(|(a, y)| *a += w * y);
            }
            want_x.extend(acc.iter().map(|&v| v as f32));
            orig_x.extend(acc_o.iter().map(|&v| v as f32));
        }
        let what = s.what();
        check(
            &format!("ffn_gate_up_q4 quantised vs dequantised {what}"),
            &got_h,
            &want_h,
            DEQUANT_TOL,
        );
        check(
            &format!("ffn_down_q4 fused quantised vs dequantised {what}"),
            &got_x,
            &want_x,
            DEQUANT_TOL,
        );
        // The packed-bytes reference agrees with the dense one.
        check(
            "cpu_ref::w4a16_gate_up vs dense dequantised",
            &s.want_gate_up(),
            &want_h,
            DEQUANT_TOL,
        );
        // Quantisation error of the MoE update (x - x0) against the unquantised weights.
        let upd = |v: &[f32]| {
            v.iter()
                .zip(&s.x0)
                .map(|(a, b)| (a - b) as f64)
                .collect::<Vec<f64>>()
        };
        let (gu, ou) = (upd(&got_x), upd(&orig_x));
        let err = (gu
            .iter()
            .zip(&ou)
            .map(|(a, b)| (a - b).powi(2))
            .sum::<f64>()
            / ou.iter().map(|b| b * b).sum::<f64>())
        .sqrt();
        // Expected about 0.4: a dot product over blocks without an outlier is off by ~11% rms
        // (step = amax / 7 ~ 0.38 std, error step / sqrt 12), over the ~12% of blocks holding
        // an outlier by ~60%; gate * up then down compound three such errors. An output
        // uncorrelated with the true one (a layout or scale mix-up) would be off by 1 or more.
        eprintln!("INT4 quantisation: relative L2 error of the MoE update vs unquantised weights {err:.3} ({what})");
        assert!(
            err < 0.8,
            "quantisation error {err} far above the expected ~0.4: layout or scale mix-up?"
        );
    }
}

/// Small weights get f16 scales below f16's smallest normal (6.1e-5): subnormal scales
/// must be unpacked exactly, not flushed to zero. Weights of amplitude ~2e-4 (scales
/// ~3e-5) with one normal block; activations ~1e3 so outputs are O(1) and a difference is
/// judged relative to the output's own rms (no floor of 1).
#[test]
fn w4a16_subnormal_scales_match_cpu() {
    for o in VARIANTS {
        let g = Gpu::new(None, o);
        let c = case(300, 260, 3, 4, 2, 5);
        let (hid, inter) = (c.hidden, c.inter);
        let l = Q4SlotLayout::new(hid, inter);
        let mut rng = Rng::new(600);
        let mut host = Vec::new();
        let mut subnormal = 0usize;
        for _ in 0..c.slots {
            let gate: Vec<f32> = rng.vec(inter * hid, 2e-4);
            let up: Vec<f32> = rng.vec(inter * hid, 2e-4);
            let down: Vec<f32> = rng.vec(hid * inter, 2e-4);
            let (slot, _) = quantise_expert(&l, [&gate, &up, &down]);
            for (m, s_at) in [(l.gate, l.gate_s), (l.gate, l.up_s), (l.down, l.down_s)] {
                for n in 0..m.out {
                    for b in 0..m.blocks() {
                        subnormal += (m.scale(&slot[s_at..], n, b).classify()
                            == std::num::FpCategory::Subnormal)
                            as usize;
                    }
                }
            }
            host.push(slot);
        }
        assert!(subnormal > 0, "no subnormal scale: the test lost its point");
        let s = Setup::with_slots(&g, &mut rng, c, host, 1000.0);
        let all = s.all_chunks();
        let what = format!("{}, {subnormal} subnormal scales", s.what());
        let got_h = s.gpu_gate_up(&all);
        check_floor(
            &format!("ffn_gate_up_q4 {what}"),
            &got_h,
            &s.want_gate_up(),
            Q4_TOL,
            0.0,
        );
        check_floor(
            &format!("ffn_down_q4 per slot {what}"),
            &s.gpu_down(&s.h_b, &all),
            &s.want_down(&s.h_in),
            Q4_TOL,
            0.0,
        );
        // The fused combine onto x0 = 0, so the update itself is judged.
        let x0 = vec![0.0f32; c.t * hid];
        let s = Setup { x0, ..s };
        check_floor(
            &format!("ffn_down_q4 fused {what}"),
            &s.gpu_fused(&s.h_b, &all),
            &s.want_fused(&s.h_in, &all),
            Q4_TOL,
            0.0,
        );
    }
}

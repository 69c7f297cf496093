//! The tiled prefill kernels of a CUDA device (dense GEMM, the pairs' sort, expert GEMMs)
//! emulated and checked against the CPU reference, with the harness of cuda_emulated.rs.

use super::*;
use wgmoe::backend::kernel::WeightFormat;
use wgmoe::blocks::quant::Q4Kind;

const A32: Q4Kind = Q4Kind::Affine32;

/// Run `program` through the emulated kernels only, from the device buffers' present
/// contents; returns the buffers it binds and their emulated contents.
fn emulated(emu: &Emulator, dev: &Device, program: &Program, tokens: usize) -> Emulated {
    let bufs = buffers(program);
    let mut host: Vec<Host> = bufs
        .iter()
        .map(|b| Host::new(&dev.read(b, 0, b.size()).unwrap()))
        .collect();
    let step = Step {
        pos0: 0,
        n_tokens: tokens as u32,
        ..Default::default()
    };
    emulate(emu, program, &bufs, &mut host, step, tokens as u32);
    Emulated { bufs, host }
}

struct Emulated {
    bufs: Vec<Buffer>,
    host: Vec<Host>,
}

impl Emulated {
    /// The first `n` words of `b` after the emulated run.
    fn words(&self, b: &Buffer, n: usize) -> Vec<u32> {
        let i = self.bufs.iter().position(|x| x.same(b)).unwrap();
        self.host[i].words()[..n].to_vec()
    }
    fn f32s(&self, b: &Buffer, n: usize) -> Vec<f32> {
        self.words(b, n).into_iter().map(f32::from_bits).collect()
    }
}

/// As the kernel tests' MATMUL_TOL / FFN_TOL / Q4_TOL: f32 sums in another order than the
/// reference's f64 ones.
const GEMM_TOL: f32 = 2e-5;

/// Top-2 ids of `t` tokens over 5 experts whose runs of sorted pairs are 0 (expert 0), t
/// (1: more than two tiles of 16), about t / 2 each (2 and 3) and 1 (4).
fn gemm_ids(t: usize) -> Vec<u32> {
    (0..t)
        .flat_map(|i| [1, if i == 0 { 4 } else { 2 + (i % 2) as u32 }])
        .collect()
}

/// The sort's pairs buffer for `ids` (capacity `pmax`, `experts` experts), filled with
/// u32::MAX before: the pairs in expert order (stable), their experts, each expert's run
/// end; the places past the step's pairs untouched.
fn want_pairs(ids: &[u32], pmax: usize, experts: usize) -> Vec<u32> {
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by_key(|&q| ids[q]);
    let mut v = vec![u32::MAX; 2 * pmax + experts];
    for (s, &q) in order.iter().enumerate() {
        v[s] = q as u32;
        v[pmax + s] = ids[q];
    }
    for e in 0..experts {
        v[2 * pmax + e] = ids.iter().filter(|&&x| x as usize <= e).count() as u32;
    }
    v
}

/// The tiled prefill kernels a CUDA device runs for multi-token steps, emulated and checked
/// against the CPU reference (not lavapipe): the dense GEMM over a matrix in chunks (3
/// token tiles, the last partial; rows and columns not multiples of the tiles; with bias
/// and accumulation and without), the pairs' sort, and the expert GEMMs, gate/up then
/// down, over f16 and INT4 pools in several chunks with permuted slots, for runs of 0, 1,
/// about T / 2 and T (> 2 tiles) pairs; and the fixed slot (a dense MLP, a shared expert),
/// f16 and Q8_0; the dense GEMM and the fixed slot over Q8_0 weights too.
#[test]
fn emulated_tiled_gemms_match_the_cpu_reference() {
    use common::check::check;
    use common::dense::{push_matmul, MatmulCase, MatmulData};
    use common::gpu::{f32_buf, u32_buf, Gpu};
    use common::rng::Rng;
    use wgmoe::backend::params::flags;
    use wgmoe::backend::plan::Switch;
    use wgmoe::backend::KernelOverrides;
    use wgmoe::cpu_ref;
    use wgmoe::model::moe::{MoeDispatch, MoePairs};
    use wgmoe::model::ops::OpEnv;
    use wgmoe::model::tensors::{ExpertPool, ExpertStore, F16Matrix};
    let Some(emu) = emulator() else {
        return;
    };
    let tiled = KernelOverrides {
        portable: false,
        decode: Some(DecodeKernels::Coalesced),
        prefill: Some(PrefillKernels::Tiled),
        f16_arithmetic: Some(Switch::Off),
    };
    let mut seen: Vec<Kernel> = Vec::new();
    let kernels_of = |p: &Program, t: usize| -> Vec<Kernel> {
        p.ops
            .iter()
            .filter_map(|o| o.dispatch(t as u32, wgmoe::backend::LONGEST).map(|d| d.0))
            .collect()
    };

    // The dense GEMM: rows of 300 columns (4 steps of 64 and a partial one), 70 rows (3
    // tiles of 32, the last partial) in 16 KiB chunks.
    let g = Gpu::new(Some(16384), tiled);
    for (i, fl) in [0, flags::MATMUL_BIAS | flags::MATMUL_ACCUMULATE]
        .into_iter()
        .enumerate()
    {
        let c = MatmulCase::new(37, 300, 70, fl);
        let data = MatmulData::new(700 + i as u64, &c);
        let m = F16Matrix::upload(&g.dev, "w", c.n, c.k, &data.w).unwrap();
        assert!(m.chunks.len() > 1, "{} chunks", m.chunks.len());
        let x = f32_buf(&g.dev, &data.xs);
        let b = (fl & flags::MATMUL_BIAS != 0).then(|| f32_buf(&g.dev, &data.bias));
        let out = f32_buf(&g.dev, &data.out0);
        let d = common::gpu::dummy(&g.dev);
        let env = OpEnv {
            plan: &g.plan,
            chunk: c.t,
            dummy: &d,
        };
        let mut prog = Program::default();
        push_matmul(&mut prog, &env, &m, &x, b.as_ref(), &out, c.n, fl);
        let ks = kernels_of(&prog, c.t);
        assert!(
            ks.iter().all(|k| *k == Kernel::Gemm(WeightFormat::F16)),
            "{ks:?}"
        );
        seen.extend(ks);
        let r = emulated(emu, &g.dev, &prog, c.t);
        check(
            &format!("emulated gemm T 37 K 300 N 70 flags {fl:#b}"),
            &r.f32s(&out, c.t * c.n),
            &data.want(&c),
            GEMM_TOL,
        );
    }

    // The dense GEMM over Q8_0 weights, the same shape (19 words a row, the last block
    // partial), rows of very different magnitudes (each block's scale follows its own
    // values), in 16 KiB chunks; against the CPU reference over the same packed weights.
    for (i, fl) in [0, flags::MATMUL_BIAS | flags::MATMUL_ACCUMULATE]
        .into_iter()
        .enumerate()
    {
        use wgmoe::blocks::q8_0::Q8Matrix;
        let c = MatmulCase::new(37, 300, 70, fl);
        let data = MatmulData::new(740 + i as u64, &c);
        let mut rng = Rng::new(750 + i as u64);
        let w: Vec<f32> = (0..c.n * c.k)
            .map(|j| rng.f32(1.0) * [1.0, 1e-3, 40.0][(j / c.k) % 3])
            .collect();
        let qm = Q8Matrix { out: c.n, inp: c.k };
        let (mut q, mut sc) = (vec![0u8; qm.q_bytes()], vec![0u8; qm.scale_bytes()]);
        qm.pack(&w, &mut q, &mut sc);
        let m = F16Matrix::upload_q8(&g.dev, "w", c.n, c.k, &w).unwrap();
        assert_eq!(m.uniform_format(), Some(WeightFormat::Q8));
        assert!(m.chunks.len() > 1, "{} chunks", m.chunks.len());
        let x = f32_buf(&g.dev, &data.xs);
        let has = |f: u32| fl & f != 0;
        let b = has(flags::MATMUL_BIAS).then(|| f32_buf(&g.dev, &data.bias));
        let out = f32_buf(&g.dev, &data.out0);
        let d = common::gpu::dummy(&g.dev);
        let env = OpEnv {
            plan: &g.plan,
            chunk: c.t,
            dummy: &d,
        };
        let mut prog = Program::default();
        push_matmul(&mut prog, &env, &m, &x, b.as_ref(), &out, c.n, fl);
        let ks = kernels_of(&prog, c.t);
        assert!(
            ks.iter().all(|k| *k == Kernel::Gemm(WeightFormat::Q8)),
            "{ks:?}"
        );
        seen.extend(ks);
        let r = emulated(emu, &g.dev, &prog, c.t);
        let want = cpu_ref::matmul_q8(
            &data.xs,
            qm,
            &q,
            &sc,
            has(flags::MATMUL_BIAS).then_some(&data.bias[..]),
            has(flags::MATMUL_ACCUMULATE).then_some(&data.out0[..]),
        )
        .unwrap();
        check(
            &format!("emulated gemm[q8_0] T 37 K 300 N 70 flags {fl:#b}"),
            &r.f32s(&out, c.t * c.n),
            &want,
            GEMM_TOL,
        );
    }

    let (t, k, experts, slots) = (37, 2, 5, 7);
    let ids = gemm_ids(t);
    let pmax = (t + 3) * k;
    let want_sorted = want_pairs(&ids, pmax, experts);
    let runs: Vec<u32> = (0..experts)
        .map(|e| {
            want_sorted[2 * pmax + e]
                - if e > 0 {
                    want_sorted[2 * pmax + e - 1]
                } else {
                    0
                }
        })
        .collect();
    assert_eq!(runs, [0, 37, 18, 18, 1]);
    // The routed experts through the forward pass's own dispatch; returns the emulated
    // (pairs, h, y).
    let routed =
        |g: &Gpu, store: &ExpertStore, slot_b: &Buffer, x: &Buffer, inter: usize, hidden: usize| {
            let dev = &g.dev;
            let pairs = MoePairs {
                pmax,
                n_experts: experts,
                buffer: u32_buf(dev, &vec![u32::MAX; 2 * pmax + experts]),
            };
            let ids_b = u32_buf(dev, &ids);
            let h = f32_buf(dev, &vec![f32::NAN; t * k * inter]);
            let y = f32_buf(dev, &vec![f32::NAN; t * k * hidden]);
            let d = common::gpu::dummy(dev);
            let m = MoeDispatch {
                plan: &g.plan,
                sorted: None,
                fuse_combine: false,
                decode_uniform: false,
                coalesced: false,
                tiled: Some(&pairs),
                one_token: false,
                hidden,
                top_k: k,
                dummy: &d,
                xn: x,
                topk_ids: &ids_b,
                topk_w: &d,
                hbuf: &h,
                y: &y,
                x: &d,
                route: None,
            };
            let mut prog = Program::default();
            let fl = m.routed(&mut prog, Executor::Grouped, store, slot_b);
            assert_eq!(fl, flags::COMBINE_ROUTED);
            let ks = kernels_of(&prog, t);
            let r = emulated(emu, dev, &prog, t);
            (
                ks,
                r.words(&pairs.buffer, 2 * pmax + experts),
                r.f32s(&h, t * k * inter),
                r.f32s(&y, t * k * hidden),
            )
        };

    // f16 experts: 200 columns (3 steps of 64 and a partial one), 70 rows; 3 slots a chunk.
    let (hidden, inter) = (200, 70);
    let slot_bytes = ExpertPool::slot_bytes(hidden, inter);
    let g = Gpu::new(Some(3 * slot_bytes), tiled);
    let mut rng = Rng::new(710);
    let pool = ExpertPool::new(&g.dev, "pool", slots, hidden, inter).unwrap();
    assert!(pool.chunks.len() > 1);
    let mats: Vec<[Vec<half::f16>; 3]> = (0..slots)
        .map(|_| {
            [
                rng.f16s(inter * hidden, 1.0),
                rng.f16s(inter * hidden, 1.0),
                rng.f16s(hidden * inter, 1.0),
            ]
        })
        .collect();
    for (s, [gate, up, down]) in mats.iter().enumerate() {
        pool.write_slot(&g.dev, s, gate, up, down).unwrap();
    }
    let slot_of = rng.permutation(slots)[..experts].to_vec();
    let slot_b = u32_buf(
        &g.dev,
        &slot_of.iter().map(|&s| s as u32).collect::<Vec<_>>(),
    );
    let xs = rng.vec(t * hidden, 1.0);
    let x = f32_buf(&g.dev, &xs);
    let store = ExpertStore::F16(pool);
    let (ks, pairs, h, y) = routed(&g, &store, &slot_b, &x, inter, hidden);
    assert!(
        ks.contains(&Kernel::ExpertGemm(WeightFormat::F16)),
        "{ks:?}"
    );
    seen.extend(ks);
    assert_eq!(pairs, want_sorted, "emulated moe_sort");
    let (mut want_h, mut want_y) = (Vec::new(), Vec::new());
    for q in 0..t * k {
        let [gate, up, down] = &mats[slot_of[ids[q] as usize]];
        let xr = &xs[q / k * hidden..][..hidden];
        want_h.extend(cpu_ref::swiglu_gate_up(xr, hidden, gate, up, inter).unwrap());
        let hr = &h[q * inter..][..inter];
        want_y.extend(cpu_ref::matmul(hr, inter, down, hidden, None, None).unwrap());
    }
    let what = format!("H {hidden} I {inter} T {t} top {k} runs {runs:?}");
    check(
        &format!("emulated expert_gemm[f16] gate/up {what}"),
        &h,
        &want_h,
        GEMM_TOL,
    );
    check(
        &format!("emulated expert_gemm[f16] down {what}"),
        &y,
        &want_y,
        GEMM_TOL,
    );

    // The fixed slot: slot 0 for every token, gate/up then down.
    let ExpertStore::F16(pool) = &store else {
        unreachable!()
    };
    let hf = f32_buf(&g.dev, &vec![f32::NAN; t * inter]);
    let yf = f32_buf(&g.dev, &vec![f32::NAN; t * hidden]);
    let d = common::gpu::dummy(&g.dev);
    let m = MoeDispatch {
        plan: &g.plan,
        sorted: None,
        fuse_combine: false,
        decode_uniform: false,
        coalesced: false,
        tiled: Some(&MoePairs {
            pmax,
            n_experts: experts,
            buffer: d.clone(),
        }),
        one_token: false,
        hidden,
        top_k: k,
        dummy: &d,
        xn: &x,
        topk_ids: &d,
        topk_w: &d,
        hbuf: &hf,
        y: &d,
        x: &d,
        route: None,
    };
    let mut prog = Program::default();
    m.swiglu_f16(&mut prog, pool, None, (0, 1), &yf);
    let ks = kernels_of(&prog, t);
    assert!(
        ks.iter()
            .all(|k| *k == Kernel::ExpertGemm(WeightFormat::F16)),
        "{ks:?}"
    );
    seen.extend(ks);
    let r = emulated(emu, &g.dev, &prog, t);
    let [gate, up, down] = &mats[0];
    check(
        &format!("emulated expert_gemm[f16] fixed slot H {hidden} I {inter} T {t}"),
        &r.f32s(&yf, t * hidden),
        &cpu_ref::swiglu_expert(&xs, hidden, gate, up, down, inter).unwrap(),
        GEMM_TOL,
    );

    // A Q8_0 SwiGLU block (a dense MLP, a shared expert: `DenseMlp::Q8`), the fixed slot
    // of the Q8_0 expert GEMM: 100 hidden columns (4 blocks, the last partial; rows not
    // 16-byte aligned), 70 intermediate (3 blocks); against the CPU reference over the
    // Q8_0 round trip of the same weights.
    {
        use wgmoe::model::dense_mlp::{DenseMlp, Q8Mlp};
        let (hid, inter) = (100, 70);
        let mut rng = Rng::new(730);
        let mut mat = |rows: usize, cols: usize| -> Vec<f32> {
            (0..rows * cols)
                .map(|j| rng.f32(1.0) * [1.0, 0.01, 8.0][(j / cols) % 3])
                .collect()
        };
        let (gw, uw, dw) = (mat(inter, hid), mat(inter, hid), mat(hid, inter));
        let mlp = DenseMlp::Q8(
            Q8Mlp::upload(
                &g.dev,
                "mlp",
                ["gate", "up", "down"],
                (hid, inter),
                [&gw, &uw, &dw],
            )
            .unwrap(),
        );
        let xs = rng.vec(t * hid, 1.0);
        let x = f32_buf(&g.dev, &xs);
        let h = f32_buf(&g.dev, &vec![f32::NAN; t * inter]);
        let y = f32_buf(&g.dev, &vec![f32::NAN; t * hid]);
        let d = common::gpu::dummy(&g.dev);
        let m = MoeDispatch {
            plan: &g.plan,
            sorted: None,
            fuse_combine: false,
            decode_uniform: false,
            coalesced: g.plan.coalesced_decode,
            tiled: None,
            one_token: false,
            hidden: hid,
            top_k: 1,
            dummy: &d,
            xn: &x,
            topk_ids: &d,
            topk_w: &d,
            hbuf: &h,
            y: &d,
            x: &d,
            route: None,
        };
        let mut prog = Program::default();
        m.swiglu_dense(&mut prog, &mlp, &y);
        let ks = kernels_of(&prog, t);
        assert!(
            ks.iter()
                .all(|k| *k == Kernel::ExpertGemm(WeightFormat::Q8)),
            "{ks:?}"
        );
        seen.extend(ks);
        let r = emulated(emu, &g.dev, &prog, t);
        let rt = |w: &[f32], rows, cols| wgmoe::blocks::q8_0::round_trip(w, rows, cols);
        let want = cpu_ref::swiglu_expert(
            &xs,
            hid,
            &rt(&gw, inter, hid),
            &rt(&uw, inter, hid),
            &rt(&dw, hid, inter),
            inter,
        )
        .unwrap();
        check(
            &format!("emulated expert_gemm[q8_0] fixed slot H {hid} I {inter} T {t}"),
            &r.f32s(&y, t * hid),
            &want,
            GEMM_TOL,
        );
    }

    // INT4 experts (random nibbles and scales, NaN in the unused scale halves): 300
    // columns (2 scale blocks, the last partial), 70 rows; 3 slots a chunk.
    let c = common::q4::case(300, 70, experts, slots, k, t);
    let layout = wgmoe::blocks::quant::Q4SlotLayout::new(c.hidden, c.inter);
    let g = Gpu::new(Some(3 * layout.bytes as u64), tiled);
    let mut s = common::q4::Setup::random(&g, 720, c);
    assert!(s.pool().chunks.len() > 1);
    // The references route by the setup's ids.
    s.ids = ids.clone();
    let (ks, pairs, h, y) = routed(&g, &s.store, &s.slot_b, &s.x_b, c.inter, c.hidden);
    assert!(ks.contains(&Kernel::ExpertGemm(WeightFormat::Q4)), "{ks:?}");
    seen.extend(ks);
    assert_eq!(pairs, want_sorted, "emulated moe_sort");
    let what = format!(
        "H {} I {} T {t} top {k} in {} chunks, runs {runs:?}",
        c.hidden,
        c.inter,
        s.pool().chunks.len()
    );
    check(
        &format!("emulated expert_gemm[int4] gate/up {what}"),
        &h,
        &s.want_gate_up(),
        GEMM_TOL,
    );
    check(
        &format!("emulated expert_gemm[int4] down {what}"),
        &y,
        &s.want_down(&h),
        GEMM_TOL,
    );

    // Affine INT4 experts (GGUF's 4-bit blocks: a scale and an offset per 32 columns,
    // random, NaN in the unused halves): the tiled GEMMs, then the decode row kernels
    // (gate/up, and down fused into x) on one token per step of the same pool.
    let layout = wgmoe::blocks::quant::Q4SlotLayout::with_kind(c.hidden, c.inter, A32);
    let g = Gpu::new(Some(3 * layout.bytes as u64), tiled);
    let mut s = common::q4::Setup::random_kind(&g, 730, c, A32);
    assert!(s.pool().chunks.len() > 1);
    s.ids = ids.clone();
    let (ks, pairs, h, y) = routed(&g, &s.store, &s.slot_b, &s.x_b, c.inter, c.hidden);
    assert!(
        ks.contains(&Kernel::ExpertGemm(WeightFormat::Q4A)),
        "{ks:?}"
    );
    seen.extend(ks);
    assert_eq!(pairs, want_sorted, "emulated moe_sort");
    let what = format!(
        "H {} I {} T {t} top {k} in {} chunks",
        c.hidden,
        c.inter,
        s.pool().chunks.len()
    );
    check(
        &format!("emulated expert_gemm[int4-a32] gate/up {what}"),
        &h,
        &s.want_gate_up(),
        GEMM_TOL,
    );
    check(
        &format!("emulated expert_gemm[int4-a32] down {what}"),
        &y,
        &s.want_down(&h),
        GEMM_TOL,
    );
    let ids_b = u32_buf(&g.dev, &ids);
    s.ids_b = ids_b;
    let hb = f32_buf(&g.dev, &vec![f32::NAN; c.t * k * c.inter]);
    let xb = f32_buf(&g.dev, &s.x0);
    let mut prog = Program::default();
    let mut d = s.moe(&s.x_b, &hb, &s.dummy, &xb);
    d.coalesced = true;
    d.q4_gate_up(&mut prog, s.pool(), &s.slot_b, (0, k));
    d.q4_down(&mut prog, s.pool(), &s.slot_b, None);
    let ks = kernels_of(&prog, c.t);
    assert!(
        ks.iter().all(|k| matches!(k, Kernel::ExpertGateUp(r) | Kernel::ExpertDown(r) if r.format == WeightFormat::Q4A)),
        "{ks:?}"
    );
    seen.extend(ks);
    let r = emulated(emu, &g.dev, &prog, c.t);
    let h_rows = r.f32s(&hb, c.t * k * c.inter);
    check(
        &format!("emulated expert_gate_up[int4-a32] {what}"),
        &h_rows,
        &s.want_gate_up(),
        GEMM_TOL,
    );
    let all = s.all_chunks();
    check(
        &format!("emulated expert_down[int4-a32] fused {what}"),
        &r.f32s(&xb, c.t * c.hidden),
        &s.want_fused(&h_rows, &all),
        GEMM_TOL,
    );

    for want in [
        Kernel::Gemm(WeightFormat::F16),
        Kernel::ExpertGemm(WeightFormat::F16),
        Kernel::ExpertGemm(WeightFormat::Q4),
        Kernel::ExpertGemm(WeightFormat::Q4A),
        Kernel::Gemm(WeightFormat::Q8),
        Kernel::ExpertGemm(WeightFormat::Q8),
        Kernel::MoeSort,
    ] {
        assert!(seen.contains(&want), "{want} never emulated: {seen:?}");
    }
}

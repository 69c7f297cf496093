//! The MoE kernels with f32/f16 arithmetic (router_topk, the f16 SwiGLU expert halves
//! ffn_gate_up / ffn_down over an expert pool, moe_combine), against
//! their CPU references (`wgmoe::cpu_ref`), through the forward pass's op builders
//! (`wgmoe::model::ops`, `MoeDispatch::swiglu_f16`). Runs on lavapipe in CI; a missing
//! adapter is a failure, never a skip. Differences are measured as described in
//! tests/common/check.rs.

mod common;

use half::f16;

use common::check::{check, strided};
use common::gpu::*;
use common::rng::Rng;
use wgmoe::backend::kernel::WeightFormat;
use wgmoe::backend::params::*;
use wgmoe::backend::{Buffer, Device, Kernel, KernelOverrides, KernelPlan, Program};
use wgmoe::cpu_ref::{self, Routed};
use wgmoe::model::moe::MoeDispatch;
use wgmoe::model::ops::{self, CombineBuffers};
use wgmoe::model::tensors::ExpertPool;

/// Softmax sums in the same order; only exp may differ by an ulp or two.
const ROUTER_TOL: f32 = 1e-6;
/// Like matmul: f32 accumulation order in gate/up (and down) dot products, plus exp in silu.
const FFN_TOL: f32 = 2e-5;
/// At most nine products added per element, in the same order as the reference.
const COMBINE_TOL: f32 = 1e-6;

// ---------------------------------------------------------------------------------------------
// router_topk

fn router_case(
    dev: &Device,
    what: &str,
    logits: &[f32],
    stride: usize,
    n_experts: usize,
    top_k: usize,
    norm: bool,
) {
    let t = logits.len() / stride;
    let step = dev.step_buffer(0, t).unwrap();
    let lb = f32_buf(dev, logits);
    let ids = u32_buf(dev, &vec![u32::MAX; t * top_k]);
    let w = f32_buf(dev, &vec![f32::NAN; t * top_k]);
    let mut prog = Program::default();
    ops::router_topk(
        &mut prog,
        &RouterTopkParams {
            n_experts: n_experts as u32,
            top_k: top_k as u32,
            logits_stride: stride as u32,
            norm_topk: norm as u32,
            ..Default::default()
        },
        &lb,
        &ids,
        &w,
    );
    run(dev, prog, &step, t);
    let (want_ids, want_w) = cpu_ref::router_topk(logits, stride, n_experts, top_k, norm).unwrap();
    let what = format!("router_topk {what}: T {t} experts {n_experts} top {top_k} norm {norm}");
    let got_ids = read_u32(dev, &ids, t * top_k);
    if let Some(i) = got_ids.iter().zip(&want_ids).position(|(a, b)| a != b) {
        panic!(
            "{what}: token {} pick {}: gpu expert {} != cpu expert {} (row {:?})",
            i / top_k,
            i % top_k,
            got_ids[i],
            want_ids[i],
            &logits[i / top_k * stride..][..n_experts]
        );
    }
    check(&what, &read_f32(dev, &w, t * top_k), &want_w, ROUTER_TOL);
}

#[test]
fn router_topk_matches_cpu() {
    let dev = device(None);
    let mut rng = Rng::new(700);
    // (tokens, experts, top_k, norm_topk, row stride)
    let cases = [
        (5, 5, 1, false, 5),
        (7, 7, 3, true, 8),
        (9, 60, 8, true, 61),
        (6, 60, 4, false, 60),
        (70, 64, 8, false, 64),
        (3, 5, 5, true, 5),
    ];
    for (t, e, k, norm, stride) in cases {
        let logits = rng.vec(t * stride, 4.0);
        router_case(&dev, "random", &logits, stride, e, k, norm);
    }
}

#[test]
fn router_topk_ties_pick_lowest_index() {
    let dev = device(None);
    let mut rng = Rng::new(701);
    // Small integer logits: many exact ties.
    let logits: Vec<f32> = (0..9 * 8).map(|_| rng.below(3) as f32).collect();
    router_case(&dev, "integer ties", &logits, 8, 8, 3, true);
    let all_equal = vec![0.5; 4 * 7];
    router_case(&dev, "all equal", &all_equal, 7, 7, 3, false);
}

// ---------------------------------------------------------------------------------------------
// ffn_gate_up and ffn_down over an expert pool

struct Expert {
    gate: Vec<f16>,
    up: Vec<f16>,
    down: Vec<f16>,
}

struct FfnCase {
    hidden: usize,
    inter: usize,
    n_experts: usize,
    /// Pool slots (>= n_experts); the extra slots hold unrelated weights.
    slots: usize,
    top_k: usize,
    t: usize,
    /// false: fixed slot 0 (dense MLP / shared expert).
    routed: bool,
    x_stride: usize,
}

/// The buffers one f16 SwiGLU dispatch chain reads and writes.
struct Swiglu<'a> {
    plan: &'a KernelPlan,
    pool: &'a ExpertPool,
    dummy: &'a Buffer,
    ids: &'a Buffer,
    /// The slot table (routed), or None (fixed slot 0).
    slot_of: Option<&'a Buffer>,
    hidden: usize,
    top_k: usize,
    x_stride: usize,
}

impl Swiglu<'_> {
    /// `MoeDispatch::swiglu_f16` for top-k indices j0 .. j0 + count (the per-expert
    /// executor serves one per dispatch): gate_up reads x and writes h, down reads h and
    /// writes `out`; then only the ops of `keep` (None: all). An x row stride other than
    /// hidden, which the builder does not expose, is set in the recorded gate_up ops.
    fn push(
        &self,
        prog: &mut Program,
        js: (usize, usize),
        x: &Buffer,
        h: &Buffer,
        out: &Buffer,
        keep: Option<Kernel>,
    ) {
        let d = MoeDispatch {
            plan: self.plan,
            sorted: None,
            fuse_combine: false,
            decode_uniform: false,
            coalesced: self.plan.coalesced_decode,
            tiled: None,
            one_token: self.plan.coalesced_decode,
            hidden: self.hidden,
            top_k: self.top_k,
            dummy: self.dummy,
            xn: x,
            topk_ids: self.ids,
            topk_w: self.dummy,
            hbuf: h,
            y: self.dummy,
            x: self.dummy,
            route: None,
        };
        let mut p = Program::default();
        d.swiglu_f16(&mut p, self.pool, self.slot_of, js, out);
        let chunks = self.pool.chunks.len();
        assert_eq!(
            p.len(),
            2 * chunks,
            "swiglu_f16: gate_up and down per pool chunk"
        );
        let (gate_up, down) = ffn_kernels(self.plan);
        assert!(p.ops[..chunks].iter().all(|o| o.kernel == gate_up));
        assert!(p.ops[chunks..].iter().all(|o| o.kernel == down));
        if let Some(k) = keep {
            let k = if k == Kernel::FfnGateUp {
                gate_up
            } else {
                down
            };
            keep_ops(&mut p, |_, o| o.kernel == k);
        }
        for op in &mut p.ops {
            if op.kernel == gate_up && self.x_stride != self.hidden {
                if self.plan.coalesced_decode {
                    patch_params(op, |p: &mut ExpertGateUpParams| {
                        p.x_stride = self.x_stride as u32
                    });
                } else {
                    patch_params(op, |p: &mut FfnGateUpParams| {
                        p.x_stride = self.x_stride as u32
                    });
                }
            }
        }
        prog.ops.extend(p.ops);
    }
}

/// The f16 SwiGLU kernels `plan` runs (gate/up, down).
fn ffn_kernels(plan: &KernelPlan) -> (Kernel, Kernel) {
    if plan.coalesced_decode {
        let r = plan.rows(WeightFormat::F16);
        (Kernel::ExpertGateUp(r), Kernel::ExpertDown(r))
    } else {
        (Kernel::FfnGateUp, Kernel::FfnDown)
    }
}

/// The kernel choices every f16 SwiGLU case runs under: the device's own (the storage
/// kernels on lavapipe), and the GPU-shaped row kernels reducing through subgroups and
/// through workgroup memory.
fn ffn_plans(dev: &Device) -> Vec<KernelPlan> {
    let coalesced = |portable| KernelOverrides {
        portable,
        decode: Some(wgmoe::backend::plan::DecodeKernels::Coalesced),
        ..Default::default()
    };
    vec![
        plan(dev, &KernelOverrides::default()),
        plan(dev, &coalesced(false)),
        plan(dev, &coalesced(true)),
    ]
}

/// Runs gate_up, down, and the two chained, for one pool under each of `ffn_plans`.
fn ffn_case(dev: &Device, seed: u64, c: &FfnCase, min_chunks: usize) {
    for plan in ffn_plans(dev) {
        ffn_case_on(dev, &plan, seed, c, min_chunks);
    }
}

/// Runs gate_up, down, and the two chained, for one pool; checks h, y and the chained y.
fn ffn_case_on(dev: &Device, plan: &KernelPlan, seed: u64, c: &FfnCase, min_chunks: usize) {
    let (hid, inter, t) = (c.hidden, c.inter, c.t);
    let k = if c.routed { c.top_k } else { 1 };
    let mut rng = Rng::new(seed);
    let experts: Vec<Expert> = (0..c.slots)
        .map(|_| Expert {
            gate: rng.f16s(inter * hid, 1.0),
            up: rng.f16s(inter * hid, 1.0),
            down: rng.f16s(hid * inter, 1.0),
        })
        .collect();
    // Expert e lives in slot slot_of[e]: a permutation, not the identity.
    let slot_of: Vec<usize> = if c.routed {
        rng.permutation(c.slots)[..c.n_experts].to_vec()
    } else {
        vec![0]
    };
    let ids: Vec<u32> = (0..t)
        .flat_map(|_| {
            rng.permutation(c.n_experts)[..k]
                .iter()
                .map(|&e| e as u32)
                .collect::<Vec<_>>()
        })
        .collect();
    let xs = rng.vec(t * hid, 1.0);
    let h_in = rng.vec(t * k * inter, 1.0);

    let pool = ExpertPool::new(dev, "pool", c.slots, hid, inter).unwrap();
    assert!(
        pool.chunks.len() >= min_chunks,
        "expected >= {min_chunks} pool chunks, got {}",
        pool.chunks.len()
    );
    // Slot s holds expert e with slot_of[e] = s; the remaining slots hold the rest.
    let mut free: Vec<usize> = (c.n_experts..c.slots).collect();
    let expert_in_slot: Vec<usize> = (0..c.slots)
        .map(|s| {
            slot_of
                .iter()
                .position(|&x| x == s)
                .unwrap_or_else(|| free.pop().unwrap())
        })
        .collect();
    for (s, &e) in expert_in_slot.iter().enumerate() {
        pool.write_slot(dev, s, &experts[e].gate, &experts[e].up, &experts[e].down)
            .unwrap();
    }

    let step = dev.step_buffer(0, t).unwrap();
    let x = f32_buf(dev, &strided(&xs, hid, c.x_stride, f32::NAN));
    let ids_b = u32_buf(dev, &ids);
    let slot_b = u32_buf(dev, &slot_of.iter().map(|&s| s as u32).collect::<Vec<_>>());
    let h_b = f32_buf(dev, &h_in);
    let h_out = f32_buf(dev, &vec![f32::NAN; t * k * inter]);
    let y_b = f32_buf(dev, &vec![f32::NAN; t * k * hid]);
    let y_chain = f32_buf(dev, &vec![f32::NAN; t * k * hid]);
    let d = dummy(dev);
    let sw = Swiglu {
        plan,
        pool: &pool,
        dummy: &d,
        ids: &ids_b,
        slot_of: c.routed.then_some(&slot_b),
        hidden: hid,
        top_k: c.top_k,
        x_stride: c.x_stride,
    };

    // gate_up alone into h_out; down alone on h_in into y.
    let mut prog = Program::default();
    sw.push(&mut prog, (0, k), &x, &h_out, &d, Some(Kernel::FfnGateUp));
    sw.push(&mut prog, (0, k), &d, &h_b, &y_b, Some(Kernel::FfnDown));
    run(dev, prog, &step, t);
    let mut chain = Program::default();
    let h_tmp = f32_buf(dev, &vec![0.0; t * k * inter]);
    sw.push(&mut chain, (0, k), &x, &h_tmp, &y_chain, None);
    run(dev, chain, &step, t);
    // The same chain with the top-k indices split over dispatches by j_base: [0, 1), [1, k).
    let y_split = f32_buf(dev, &vec![f32::NAN; t * k * hid]);
    let mut split = Program::default();
    let h_tmp2 = f32_buf(dev, &vec![0.0; t * k * inter]);
    let ranges: Vec<(usize, usize)> = if k > 1 {
        vec![(0, 1), (1, k - 1)]
    } else {
        vec![(0, 1)]
    };
    for &r in &ranges {
        sw.push(&mut split, r, &x, &h_tmp2, &y_split, None);
    }
    run(dev, split, &step, t);

    let (mut want_h, mut want_y, mut want_chain) = (Vec::new(), Vec::new(), Vec::new());
    for ti in 0..t {
        let xr = &xs[ti * hid..(ti + 1) * hid];
        for j in 0..k {
            let e = if c.routed {
                ids[ti * k + j] as usize
            } else {
                expert_in_slot[0]
            };
            let ex = &experts[e];
            want_h.extend(cpu_ref::swiglu_gate_up(xr, hid, &ex.gate, &ex.up, inter).unwrap());
            let hr = &h_in[(ti * k + j) * inter..][..inter];
            want_y.extend(cpu_ref::matmul(hr, inter, &ex.down, hid, None, None).unwrap());
            want_chain.extend(
                cpu_ref::swiglu_expert(xr, hid, &ex.gate, &ex.up, &ex.down, inter).unwrap(),
            );
        }
    }
    let mode = if c.routed {
        format!(
            "routed {} experts in {} slots top {k}",
            c.n_experts, c.slots
        )
    } else {
        "fixed slot".into()
    };
    let what = format!(
        "[{}] H {hid} I {inter} T {t} {mode} chunks {}",
        ffn_kernels(plan).0,
        pool.chunks.len()
    );
    check(
        &format!("ffn_gate_up {what}"),
        &read_f32(dev, &h_out, t * k * inter),
        &want_h,
        FFN_TOL,
    );
    check(
        &format!("ffn_down {what}"),
        &read_f32(dev, &y_b, t * k * hid),
        &want_y,
        FFN_TOL,
    );
    check(
        &format!("ffn_gate_up+down {what}"),
        &read_f32(dev, &y_chain, t * k * hid),
        &want_chain,
        FFN_TOL,
    );
    check(
        &format!("ffn_gate_up+down by j_base {ranges:?} {what}"),
        &read_f32(dev, &y_split, t * k * hid),
        &want_chain,
        FFN_TOL,
    );
}

#[test]
fn ffn_routed_matches_cpu() {
    let dev = device(None);
    let c = |hidden, inter, n_experts, slots, top_k, t| FfnCase {
        hidden,
        inter,
        n_experts,
        slots,
        top_k,
        t,
        routed: true,
        x_stride: hidden,
    };
    ffn_case(&dev, 800, &c(13, 20, 7, 9, 3, 5), 1);
    ffn_case(&dev, 801, &c(16, 24, 60, 60, 8, 2), 1);
    ffn_case(&dev, 802, &c(7, 65, 5, 5, 1, 9), 1);
    ffn_case(&dev, 803, &c(100, 1, 5, 6, 3, 1), 1);
}

#[test]
fn ffn_fixed_slot_matches_cpu() {
    let dev = device(None);
    let c = |hidden, inter, t, x_stride| FfnCase {
        hidden,
        inter,
        n_experts: 1,
        slots: 1,
        top_k: 1,
        t,
        routed: false,
        x_stride,
    };
    ffn_case(&dev, 810, &c(100, 44, 6, 100), 1);
    ffn_case(&dev, 811, &c(13, 70, 1, 16), 1);
    ffn_case(&dev, 812, &c(64, 257, 5, 64), 1);
}

#[test]
fn ffn_split_pool_matches_cpu() {
    // H 13, I 20: a slot is 2*20*16 + 13*24 halves = 1904 bytes; a 6 KiB binding holds 3.
    let slot = ExpertPool::slot_bytes(13, 20);
    let dev = device(Some(3 * slot + 16));
    let c = FfnCase {
        hidden: 13,
        inter: 20,
        n_experts: 7,
        slots: 8,
        top_k: 3,
        t: 6,
        routed: true,
        x_stride: 13,
    };
    ffn_case(&dev, 820, &c, 3);
    let c = FfnCase {
        hidden: 13,
        inter: 20,
        n_experts: 7,
        slots: 7,
        top_k: 7,
        t: 2,
        routed: true,
        x_stride: 13,
    };
    ffn_case(&dev, 821, &c, 3);
}

// ---------------------------------------------------------------------------------------------
// moe_combine

#[allow(clippy::too_many_arguments)]
fn combine_case(
    dev: &Device,
    seed: u64,
    t: usize,
    hid: usize,
    top_k: usize,
    flags: u32,
    gate_stride: usize,
    gate_col: usize,
) {
    use flags::{
        COMBINE_HOST as HOST, COMBINE_RESIDENT as RESIDENT, COMBINE_ROUTED as ROUTED,
        COMBINE_SHARED as SHARED, COMBINE_SHARED_GATED as SHARED_GATED,
    };
    let mut rng = Rng::new(seed);
    let x0 = rng.vec(t * hid, 2.0);
    let mut y = rng.vec(t * top_k * hid, 2.0);
    let w = rng
        .vec(t * top_k, 1.0)
        .iter()
        .map(|v| v.abs())
        .collect::<Vec<_>>();
    let shared = rng.vec(t * hid, 2.0);
    let router = rng.vec(t * gate_stride, 4.0);
    let host = rng.vec(t * hid, 2.0);
    // Experts 0..2*top_k; the pool has `slots` slots and about half the experts a slot
    // (NO_SLOT or a stale index past the pool otherwise). The rows of y of pairs without
    // a slot are NaN: reading one is a failure.
    let n_exp = 2 * top_k as u32;
    let slots = top_k as u32;
    let slot_of: Vec<u32> = (0..n_exp)
        .map(|e| match e % 3 {
            0 => e / 3 % slots,
            1 => u32::MAX,
            _ => slots + e,
        })
        .collect();
    let ids: Vec<u32> = (0..t * top_k)
        .map(|_| rng.below(n_exp as usize) as u32)
        .collect();
    let resident: Vec<bool> = ids.iter().map(|&e| slot_of[e as usize] < slots).collect();
    if flags & RESIDENT != 0 {
        for (tj, r) in resident.iter().enumerate() {
            if !r {
                y[tj * hid..(tj + 1) * hid].fill(f32::NAN);
            }
        }
    }
    let step = dev.step_buffer(0, t).unwrap();
    let (yb, wb, sb, rb, hb) = (
        f32_buf(dev, &y),
        f32_buf(dev, &w),
        f32_buf(dev, &shared),
        f32_buf(dev, &router),
        f32_buf(dev, &host),
    );
    let (ib, slb) = (u32_buf(dev, &ids), u32_buf(dev, &slot_of));
    let x = f32_buf(dev, &x0);
    let mut prog = Program::default();
    ops::moe_combine(
        &mut prog,
        &MoeCombineParams {
            hidden: hid as u32,
            top_k: top_k as u32,
            flags,
            gate_stride: gate_stride as u32,
            gate_col: gate_col as u32,
            slots,
            ..Default::default()
        },
        &CombineBuffers {
            y: &yb,
            weights: &wb,
            shared_y: &sb,
            router: &rb,
            x: &x,
            ids: &ib,
            slot_of: &slb,
            host_y: &hb,
        },
    );
    run(dev, prog, &step, t);
    let gates: Vec<f32> = (0..t)
        .map(|ti| router[ti * gate_stride + gate_col])
        .collect();
    let routed = (flags & ROUTED != 0).then_some(Routed {
        y: &y,
        weights: &w,
        top_k,
        resident: (flags & RESIDENT != 0).then_some(&resident[..]),
    });
    let want = cpu_ref::moe_combine(
        &x0,
        hid,
        routed,
        (flags & SHARED != 0).then_some(&shared[..]),
        (flags & SHARED_GATED != 0).then_some(&gates[..]),
        (flags & HOST != 0).then_some(&host[..]),
    )
    .unwrap();
    check(
        &format!("moe_combine T {t} H {hid} top {top_k} flags {flags:#b}"),
        &read_f32(dev, &x, t * hid),
        &want,
        COMBINE_TOL,
    );
}

#[test]
fn moe_combine_matches_cpu() {
    use flags::{
        COMBINE_HOST as HOST, COMBINE_RESIDENT as RESIDENT, COMBINE_ROUTED as ROUTED,
        COMBINE_SHARED as SHARED, COMBINE_SHARED_GATED as SHARED_GATED,
    };
    let dev = device(None);
    combine_case(&dev, 900, 5, 13, 3, ROUTED, 7, 0);
    combine_case(&dev, 901, 7, 100, 8, ROUTED | SHARED | SHARED_GATED, 61, 60);
    combine_case(&dev, 902, 1, 70, 1, SHARED, 5, 0);
    combine_case(&dev, 903, 9, 7, 1, ROUTED | SHARED, 4, 3);
    // Hybrid residency: resident pairs from y, the CPU's sum from host_y.
    combine_case(&dev, 904, 6, 100, 8, ROUTED | RESIDENT | HOST, 7, 0);
    combine_case(
        &dev,
        905,
        1,
        65,
        4,
        ROUTED | RESIDENT | HOST | SHARED | SHARED_GATED,
        61,
        60,
    );
    combine_case(&dev, 906, 3, 33, 2, HOST | SHARED, 4, 3);
    combine_case(&dev, 907, 4, 20, 3, HOST, 4, 3);
}

/// The tiled GEMMs of multi-token steps on GPUs over f16 pools: a fixed slot (dense MLP,
/// shared expert: every token) through `swiglu_f16`, and routed experts over the sorted
/// pairs through `routed` (grouped executor), chained gate/up -> down against the
/// reference chained the same way.
#[test]
fn ffn_tiled_gemm_matches_cpu() {
    let dev = device(None);
    let plan = plan(
        &dev,
        &KernelOverrides {
            prefill: Some(wgmoe::backend::plan::PrefillKernels::Tiled),
            ..Default::default()
        },
    );
    for (i, &(hid, inter, experts, k, t)) in [
        (100, 44, 1, 1, 6),
        (64, 257, 1, 1, 37),
        (13, 20, 7, 3, 5),
        (96, 70, 5, 2, 33),
    ]
    .iter()
    .enumerate()
    {
        let routed = experts > 1;
        let mut rng = Rng::new(4000 + i as u64);
        let pool = ExpertPool::new(&dev, "pool", experts, hid, inter).unwrap();
        let ex: Vec<Expert> = (0..experts)
            .map(|s| {
                let e = Expert {
                    gate: rng.f16s(inter * hid, 1.0),
                    up: rng.f16s(inter * hid, 1.0),
                    down: rng.f16s(hid * inter, 1.0),
                };
                pool.write_slot(&dev, s, &e.gate, &e.up, &e.down).unwrap();
                e
            })
            .collect();
        let ids: Vec<u32> = (0..t)
            .flat_map(|_| {
                rng.permutation(experts)[..k]
                    .iter()
                    .map(|&e| e as u32)
                    .collect::<Vec<_>>()
            })
            .collect();
        let xs = rng.vec(t * hid, 1.0);
        let x = f32_buf(&dev, &xs);
        let ids_b = u32_buf(&dev, &ids);
        let slot_b = u32_buf(&dev, &(0..experts as u32).collect::<Vec<_>>());
        let h = f32_buf(&dev, &vec![f32::NAN; t * k * inter]);
        let y = f32_buf(&dev, &vec![f32::NAN; t * k * hid]);
        let d = dummy(&dev);
        let pmax = t * k;
        let pairs = wgmoe::model::moe::MoePairs {
            pmax,
            n_experts: experts,
            buffer: u32_buf(&dev, &vec![0; 2 * pmax + experts]),
        };
        let m = MoeDispatch {
            plan: &plan,
            sorted: None,
            fuse_combine: false,
            decode_uniform: false,
            coalesced: false,
            tiled: Some(&pairs),
            one_token: false,
            hidden: hid,
            top_k: k,
            dummy: &d,
            xn: &x,
            topk_ids: &ids_b,
            topk_w: &d,
            hbuf: &h,
            y: &y,
            x: &d,
            route: None,
        };
        let mut prog = Program::default();
        if routed {
            let store = wgmoe::model::tensors::ExpertStore::F16(pool);
            m.routed(&mut prog, wgmoe::model::Executor::Grouped, &store, &slot_b);
        } else {
            m.swiglu_f16(&mut prog, &pool, None, (0, 1), &y);
        }
        assert!(prog
            .ops
            .iter()
            .any(|o| matches!(o.kernel, Kernel::ExpertGemm(_))));
        run(&dev, prog, &dev.step_buffer(0, t).unwrap(), t);
        let mut want = Vec::new();
        for ti in 0..t {
            for j in 0..k {
                let e = &ex[ids[ti * k + j] as usize];
                let xr = &xs[ti * hid..(ti + 1) * hid];
                want.extend(
                    cpu_ref::swiglu_expert(xr, hid, &e.gate, &e.up, &e.down, inter).unwrap(),
                );
            }
        }
        check(
            &format!("expert_gemm[f16] H {hid} I {inter} {experts} experts top {k} T {t}"),
            &read_f32(&dev, &y, t * k * hid),
            &want,
            FFN_TOL,
        );
    }
}

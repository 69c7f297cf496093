//! Fused routing (`FFN_ROUTE`): on the GPU plan a one-token step's expert gate/up computes
//! the token's top-k from the router's logits in every workgroup (shaders/common/
//! route_topk.wgsl), so a MoE layer needs no router_topk dispatch. Checked against the CPU
//! reference (`cpu_ref::router_topk`, then `cpu_ref::w4a16_gate_up` of the experts it
//! picks) and bit for bit against the pair it replaces (router_topk, then the unfused
//! gate/up), through the forward pass's op builders: odd expert counts, top-k 1 to 8, the
//! router matvec's column splits 1 to 8, renormalised or not, exact ties, a shared-expert
//! gate column in the row, pools in several chunks (each chunk's dispatch routes, the
//! first writes the ids and weights), both reductions (subgroups and workgroup memory).
//! The combine's shared gate read from the partial rows is checked too.

mod common;

use common::check::{check, check_bits};
use common::gpu::*;
use common::q4::*;
use common::rng::Rng;
use wgmoe::backend::params::*;
use wgmoe::backend::Program;
use wgmoe::blocks::quant::Q4SlotLayout;
use wgmoe::cpu_ref;
use wgmoe::model::moe::{FusedRoute, MoeDispatch};
use wgmoe::model::ops::{self, CombineBuffers};

/// router_topk's tolerance against the CPU (the same softmax sums; exp within an ulp).
const ROUTER_TOL: f32 = 1e-6;

/// One token's route: `splits` partial rows of `stride` floats (`n_experts` experts, the
/// rest extra columns such as Qwen's shared-expert gate).
struct Route {
    parts: Vec<f32>,
    stride: usize,
    splits: usize,
    norm: bool,
}

impl Route {
    fn random(
        rng: &mut Rng,
        n_experts: usize,
        extra: usize,
        splits: usize,
        norm: bool,
        ties: bool,
    ) -> Route {
        let stride = n_experts + extra;
        let parts = (0..splits * stride)
            .map(|_| {
                if ties {
                    // Small integers: many exact ties after the sum.
                    rng.below(3) as f32
                } else {
                    rng.f32(2.0)
                }
            })
            .collect();
        Route {
            parts,
            stride,
            splits,
            norm,
        }
    }

    /// The logit row as the kernels add it: the partial rows in split order.
    fn row(&self) -> Vec<f32> {
        (0..self.stride)
            .map(|c| {
                let mut v = 0.0f32;
                for s in 0..self.splits {
                    v += self.parts[s * self.stride + c];
                }
                v
            })
            .collect()
    }
}

/// Fused against the CPU and against router_topk + unfused gate/up, for one token.
fn route_case(g: &Gpu, s: &mut Setup, r: &Route) {
    let c = s.c;
    assert_eq!(c.t, 1, "fused routing serves one-token steps");
    let dev = &g.dev;
    let k = c.top_k;
    let what = format!(
        "{} route: stride {} splits {} norm {}",
        s.what(),
        r.stride,
        r.splits,
        r.norm
    );
    let (want_ids, want_w) =
        cpu_ref::router_topk(&r.row(), r.stride, c.n_experts, k, r.norm).unwrap();
    s.ids = want_ids.clone();
    let want_h = s.want_gate_up();
    // The pair fusion replaces: router_topk (which adds the partial rows into row 0 in
    // place: its own copy) into the setup's ids and weights, then the unfused gate/up.
    let n_h = k * c.inter;
    let pair_logits = f32_buf(dev, &r.parts);
    let h1 = f32_buf(dev, &vec![f32::NAN; n_h]);
    let mut prog = Program::default();
    ops::router_topk(
        &mut prog,
        &RouterTopkParams {
            n_experts: c.n_experts as u32,
            top_k: k as u32,
            logits_stride: r.stride as u32,
            norm_topk: r.norm as u32,
            splits: r.splits as u32,
            ..Default::default()
        },
        &pair_logits,
        &s.ids_b,
        &s.w_b,
    );
    s.moe(&s.x_b, &h1, &s.dummy, &s.dummy)
        .q4_gate_up(&mut prog, s.pool(), &s.slot_b, (0, k));
    s.run(prog);
    let ids1 = read_u32(dev, &s.ids_b, k);
    let w1 = s.read(&s.w_b, k);
    let h1 = s.read(&h1, n_h);
    // Fused: the ids and weights start as garbage and must come out written.
    let logits = f32_buf(dev, &r.parts);
    let ids2 = u32_buf(dev, &vec![u32::MAX; k]);
    let w2 = f32_buf(dev, &vec![f32::NAN; k]);
    let h2 = f32_buf(dev, &vec![f32::NAN; n_h]);
    let m = MoeDispatch {
        topk_ids: &ids2,
        topk_w: &w2,
        route: Some(FusedRoute {
            logits: &logits,
            experts: c.n_experts as u32,
            stride: r.stride as u32,
            splits: r.splits as u32,
            norm: r.norm,
        }),
        ..s.moe(&s.x_b, &h2, &s.dummy, &s.dummy)
    };
    let mut prog = Program::default();
    m.q4_gate_up(&mut prog, s.pool(), &s.slot_b, (0, k));
    assert!(!prog.ops.is_empty(), "{what}: no dispatch");
    s.run(prog);
    let ids2 = read_u32(dev, &ids2, k);
    assert_eq!(ids2, want_ids, "{what}: fused ids vs the CPU's");
    assert_eq!(ids2, ids1, "{what}: fused ids vs router_topk's");
    check(
        &format!("{what}: weights"),
        &s.read(&w2, k),
        &want_w,
        ROUTER_TOL,
    );
    check_bits(
        &format!("{what}: weights vs router_topk"),
        &s.read(&w2, k),
        &w1,
    );
    let h2 = s.read(&h2, n_h);
    check(&format!("{what}: h"), &h2, &want_h, Q4_TOL);
    check_bits(&format!("{what}: h vs the unfused gate/up"), &h2, &h1);
}

#[test]
fn fused_routing_matches_router_topk_and_cpu() {
    // (hidden, inter, experts, slots, top_k), extra columns, splits, norm, ties.
    let cases = [
        (case(64, 7, 5, 5, 1, 1), 0, 1, false, false),
        (case(33, 96, 7, 9, 3, 1), 1, 3, true, false),
        (case(257, 33, 60, 64, 8, 1), 1, 8, true, false),
        (case(100, 65, 129, 130, 8, 1), 0, 4, false, false),
        (case(31, 64, 300, 300, 6, 1), 0, 2, true, false),
        (case(96, 31, 9, 12, 4, 1), 0, 3, true, true),
        (case(32, 1, 8, 9, 8, 1), 0, 1, false, true),
        (case(2056, 320, 64, 66, 8, 1), 1, 5, false, false),
    ];
    for o in &VARIANTS[2..] {
        let g = Gpu::new(None, *o);
        assert!(g.plan.coalesced_decode);
        for (i, &(c, extra, splits, norm, ties)) in cases.iter().enumerate() {
            let mut s = Setup::random(&g, 900 + i as u64, c);
            let mut rng = Rng::new(950 + i as u64);
            let r = Route::random(&mut rng, c.n_experts, extra, splits, norm, ties);
            route_case(&g, &mut s, &r);
        }
    }
}

/// A pool in chunks: every chunk's dispatch routes for itself; the first writes.
#[test]
fn fused_routing_over_a_split_pool() {
    for o in &VARIANTS[2..] {
        for (i, (c, per_chunk)) in [
            (case(300, 65, 7, 10, 4, 1), 3u64),
            (case(33, 320, 20, 20, 8, 1), 2),
        ]
        .into_iter()
        .enumerate()
        {
            let bytes = Q4SlotLayout::new(c.hidden, c.inter).bytes as u64;
            let g = Gpu::new(Some(per_chunk * bytes), *o);
            let mut s = Setup::random(&g, 970 + i as u64, c);
            assert!(s.pool().chunks.len() > 1, "{}", s.what());
            let mut rng = Rng::new(980 + i as u64);
            let r = Route::random(&mut rng, c.n_experts, 0, 4, true, false);
            route_case(&g, &mut s, &r);
        }
    }
}

/// The combine's shared-expert gate read from the router's partial rows (`gate_splits`)
/// equals the gate read from the summed row, bit for bit.
#[test]
fn combine_reads_the_gate_from_partial_rows() {
    let g = Gpu::new(None, VARIANTS[2]);
    let dev = &g.dev;
    let mut rng = Rng::new(990);
    let (hidden, experts, splits) = (70, 6, 5);
    let r = Route::random(&mut rng, experts, 1, splits, false, false);
    let shared = f32_buf(dev, &rng.vec(hidden, 1.0));
    let x0 = rng.vec(hidden, 1.0);
    let step = dev.step_buffer(0, 1).unwrap();
    let dummy = f32_buf(dev, &[0.0; 4]);
    let run_with = |logits: &[f32], gate_splits: u32| {
        let lb = f32_buf(dev, logits);
        let x = f32_buf(dev, &x0);
        let mut prog = Program::default();
        ops::moe_combine(
            &mut prog,
            &MoeCombineParams {
                hidden: hidden as u32,
                top_k: 1,
                flags: flags::COMBINE_SHARED | flags::COMBINE_SHARED_GATED,
                gate_stride: r.stride as u32,
                gate_col: experts as u32,
                gate_splits,
                ..Default::default()
            },
            &CombineBuffers {
                y: &dummy,
                weights: &dummy,
                shared_y: &shared,
                router: &lb,
                x: &x,
                ids: &dummy,
                slot_of: &dummy,
                host_y: &dummy,
            },
        );
        run(dev, prog, &step, 1);
        read_f32(dev, &x, hidden)
    };
    let summed = run_with(&r.row(), 0);
    let parts = run_with(&r.parts, splits as u32);
    check_bits("combine gate from partial rows", &parts, &summed);
    assert!(
        summed.iter().zip(&x0).any(|(a, b)| a != b),
        "the gate term added nothing"
    );
}

/// Every family's fixture on the GPU plan: a one-token step has no router_topk dispatch
/// (each MoE layer's gate/up routes), so it is a dispatch a MoE layer shorter than the
/// same engine's unfused programs; the default plan of a CPU adapter keeps router_topk.
/// The tokens are the goldens' (tests/parity_families.rs runs this plan).
#[test]
fn one_token_steps_on_the_gpu_plan_dispatch_no_router_topk() {
    use common::cli::{MIXTRAL, OLMOE, QWEN, QWEN3};
    use wgmoe::backend::plan::{DecodeKernels, PrefillKernels};
    use wgmoe::backend::{Kernel, KernelOverrides, LONGEST};
    for name in [OLMOE, QWEN, QWEN3, MIXTRAL] {
        let load = |kernels| {
            common::engine::load_on(
                name,
                64,
                Default::default(),
                wgmoe::model::Executor::Grouped,
                kernels,
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let gpu = load(KernelOverrides {
            decode: Some(DecodeKernels::Coalesced),
            prefill: Some(PrefillKernels::Tiled),
            ..Default::default()
        });
        let cfg = gpu.fwd.cfg.clone();
        let moe = (0..cfg.num_layers)
            .filter(|&l| cfg.sparse_layers.get(l).copied().unwrap_or(true))
            .count();
        let step = gpu.fwd.decode_step_kernels(LONGEST);
        assert!(
            !step.iter().any(|(_, k)| *k == Kernel::RouterTopk),
            "{name}: {step:?}"
        );
        let fused = gpu
            .fwd
            .layers
            .iter()
            .filter(|l| l.fused_decode.is_some())
            .count();
        assert_eq!(fused, moe, "{name}: fused layers");
        // One-token dispatches of the layers' programs, fused and not.
        let count = |progs: &[&wgmoe::backend::Prepared]| {
            progs
                .iter()
                .flat_map(|p| p.program().ops.iter())
                .filter(|o| o.dispatch(1, LONGEST).is_some())
                .count()
        };
        let (mut fused_n, mut unfused_n) = (0, 0);
        for l in &gpu.fwd.layers {
            let (a, b) = l.step_programs(1, false);
            fused_n += count(&[a, b]);
            unfused_n += count(&[l.pre_for(false), l.post_for(1)]);
        }
        assert_eq!(
            fused_n + moe,
            unfused_n,
            "{name}: one dispatch fewer a MoE layer"
        );
        let default = load(KernelOverrides::default());
        let k = default.fwd.decode_step_kernels(LONGEST);
        assert_eq!(
            k.iter().filter(|(_, k)| *k == Kernel::RouterTopk).count(),
            moe,
            "{name}: the CPU adapter's plan"
        );
    }
}

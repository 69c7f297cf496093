//! The routed experts of one MoE layer (and single-slot SwiGLU blocks: Qwen's shared
//! expert, dense MLP layers) as op builders, for both executors and both precisions.

use crate::backend::kernel::{Activations, Kernel, Q4Variant, ROWS_PER_WORKGROUP};
use crate::backend::params::*;
use crate::backend::{
    binds, groups64, Bind, Buffer, Device, Dim, KernelPlan, Op, Program, Resource, Usage,
};
use crate::error::Result;
use crate::model::dense_mlp::DenseMlp;
use crate::model::ops::numbered;
use crate::model::slot_mats::SlotMats;
use crate::model::tensors::{ExpertPool, ExpertStore, Q4Pool};
use crate::model::workspace::{row, WorkspaceBuffer};

/// How the routed experts of a layer are dispatched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Executor {
    /// One dispatch chain (gate/up, down) per selected expert.
    PerExpert,
    /// All top-k experts of a layer in one dispatch per stage; with INT4 experts the down
    /// projection and the weighted combine are fused.
    Grouped,
}

/// Buffers of the expert-major path for multi-token steps on CPU adapters: the step's
/// (token, top-k index) pairs sorted by expert, their activations gathered in that order
/// and their SwiGLU intermediates, one row per pair (sizes in `model::workspace`).
pub struct MoeSorted {
    /// Pair capacity: chunk * top_k.
    pub pmax: usize,
    pub n_experts: usize,
    /// Floats per row of `xg` / `hg` (hidden / intermediate rounded up to 32).
    pub x_row: usize,
    pub h_row: usize,
    /// [pair of sorted position; its expert; end of each expert's run] (moe_sort.wgsl).
    pub pairs: Buffer,
    pub xg: Buffer,
    pub hg: Buffer,
}

impl MoeSorted {
    /// Allocate the buffers the workspace table sizes.
    pub fn new(
        dev: &Device,
        table: &[WorkspaceBuffer],
        chunk: usize,
        top_k: usize,
        n_experts: usize,
        hidden: usize,
        inter: usize,
    ) -> Result<Self> {
        let alloc = |name: &str| -> Result<Buffer> {
            dev.alloc(name, row(table, name)?.bytes, Usage::Storage)
        };
        Ok(MoeSorted {
            pmax: chunk * top_k,
            n_experts,
            x_row: hidden.next_multiple_of(32),
            h_row: inter.next_multiple_of(32),
            pairs: alloc("moe_pairs")?,
            xg: alloc("moe_x_sorted")?,
            hg: alloc("moe_h_sorted")?,
        })
    }
}

/// The step's (token, top-k index) pairs sorted by expert (moe_sort.wgsl's layout), for
/// the tiled expert GEMMs of multi-token steps on GPUs.
pub struct MoePairs {
    /// Pair capacity: chunk * top_k.
    pub pmax: usize,
    pub n_experts: usize,
    pub buffer: Buffer,
}

/// The buffers and choices of a layer's expert dispatches.
#[derive(Clone)]
pub struct MoeDispatch<'a> {
    pub plan: &'a KernelPlan,
    /// Multi-token steps with INT4 experts and the grouped executor: the expert-major
    /// kernels (CPU adapters).
    pub sorted: Option<&'a MoeSorted>,
    /// Grouped INT4 experts: add the down projection into x in the same dispatch (fused
    /// combine). Off when the expert outputs must be idempotent per (token, top-k) pair:
    /// partial residency runs a step's experts in several batches of resident ones.
    pub fuse_combine: bool,
    /// One-token steps: the INT4 kernels read activations from a 64 KiB uniform window of
    /// `xn` / `hbuf` (which must be window-capable).
    pub decode_uniform: bool,
    /// The GPU-shaped row kernels (one-token steps on GPUs): a workgroup per 4 rows of an
    /// expert, lanes reading consecutive words; f16 and INT4 pools, shared experts and
    /// dense MLPs alike.
    pub coalesced: bool,
    /// Multi-token steps on the tiled GEMMs (GPUs): routed experts over `pairs` sorted by
    /// expert (grouped executor), shared experts and dense MLPs as one fixed slot.
    pub tiled: Option<&'a MoePairs>,
    /// A one-token step's program (the decode alternatives); false for multi-token steps
    /// (whose program may also serve one-token steps where no decode program differs).
    pub one_token: bool,
    pub hidden: usize,
    pub top_k: usize,
    pub dummy: &'a Buffer,
    /// Normed hidden state [T, H] (expert input).
    pub xn: &'a Buffer,
    pub topk_ids: &'a Buffer,
    pub topk_w: &'a Buffer,
    /// SwiGLU intermediate [T, k, I].
    pub hbuf: &'a Buffer,
    /// Per-expert outputs [T, k, H].
    pub y: &'a Buffer,
    /// Residual stream [T, H].
    pub x: &'a Buffer,
    /// Fused routing (one-token programs on the GPU plan): the gate/up dispatch computes
    /// the top-k from the router's logits instead of reading `topk_ids`.
    pub route: Option<FusedRoute<'a>>,
}

/// The router's logits as `router_topk` reads them, for fused routing (`FFN_ROUTE`).
#[derive(Clone, Copy)]
pub struct FusedRoute<'a> {
    pub logits: &'a Buffer,
    pub experts: u32,
    /// Floats per logit row.
    pub stride: u32,
    /// Partial rows a one-token step's logits arrive in (the matvec's column splits).
    pub splits: u32,
    /// Renormalise the top-k weights (`norm_topk_prob`).
    pub norm: bool,
}

impl MoeDispatch<'_> {
    /// Routed experts. Returns the combine flags the layer's combine dispatch still needs
    /// (0 when the executor already added the experts into x).
    pub fn routed(
        &self,
        prog: &mut Program,
        executor: Executor,
        store: &ExpertStore,
        slot_of: &Buffer,
    ) -> u32 {
        let k = self.top_k;
        let per_expert = executor == Executor::PerExpert;
        if self.coalesced {
            let Some(mats) = SlotMats::of(store) else {
                // Computed on the CPU; the combine adds them (COMBINE_HOST).
                return 0;
            };
            let route = Some(slot_of);
            if per_expert {
                for j in 0..k {
                    self.rows_gate_up(prog, &mats, route, (j, 1));
                    self.rows_down(prog, &mats, route, Some((j, 1)), self.y);
                }
                return flags::COMBINE_ROUTED;
            }
            self.rows_gate_up(prog, &mats, route, (0, k));
            if self.fuse_combine {
                self.rows_down(prog, &mats, route, None, self.x);
                return 0;
            }
            self.rows_down(prog, &mats, route, Some((0, k)), self.y);
            return flags::COMBINE_ROUTED;
        }
        if let (Some(pairs), false) = (self.tiled, per_expert) {
            let Some(mats) = SlotMats::of(store) else {
                return 0;
            };
            prog.stage("experts_sort");
            prog.push(Op::new(
                Kernel::MoeSort,
                &MoeSortParams {
                    n_experts: pairs.n_experts as u32,
                    top_k: k as u32,
                    pmax: pairs.pmax as u32,
                    _a: 0,
                },
                binds(&[self.topk_ids, &pairs.buffer]),
                [Dim::Const(1), Dim::Const(1), Dim::Const(1)],
            ));
            self.gemm(prog, &mats, Some((slot_of, pairs)), self.y);
            return flags::COMBINE_ROUTED;
        }
        match store {
            ExpertStore::F16(pool) if per_expert => {
                for j in 0..k {
                    self.swiglu_f16(prog, pool, Some(slot_of), (j, 1), self.y);
                }
                flags::COMBINE_ROUTED
            }
            ExpertStore::F16(pool) => {
                self.swiglu_f16(prog, pool, Some(slot_of), (0, k), self.y);
                flags::COMBINE_ROUTED
            }
            ExpertStore::Int4(pool) if per_expert => {
                for j in 0..k {
                    self.q4_gate_up(prog, pool, slot_of, (j, 1));
                    self.q4_down(prog, pool, slot_of, Some((j, 1)));
                }
                flags::COMBINE_ROUTED
            }
            ExpertStore::Int4(pool) if self.sorted.is_some() && pool.layout.is_sym256() => {
                self.q4_expert_major(prog, pool, slot_of);
                flags::COMBINE_ROUTED
            }
            ExpertStore::Int4(pool) if self.fuse_combine => {
                self.q4_gate_up(prog, pool, slot_of, (0, k));
                self.q4_down(prog, pool, slot_of, None);
                0
            }
            ExpertStore::Int4(pool) => {
                self.q4_gate_up(prog, pool, slot_of, (0, k));
                self.q4_down(prog, pool, slot_of, Some((0, k)));
                flags::COMBINE_ROUTED
            }
            // Computed on the CPU; the combine adds them (COMBINE_HOST).
            ExpertStore::Host => 0,
        }
    }

    /// A shared expert or dense MLP into `out` [T, H]: f16 as one fixed slot of its pool,
    /// Q8_0 (or a GGUF file's blocks) on the GPU-shaped expert kernels (rows for one-token
    /// steps, the tiled GEMM otherwise), whatever the plan's f16 kernels are.
    pub fn swiglu_dense(&self, prog: &mut Program, mlp: &DenseMlp, out: &Buffer) {
        if let DenseMlp::F16(pool) = mlp {
            return self.swiglu_f16(prog, pool, None, (0, 1), out);
        }
        let Some(mats) = mlp.mats() else {
            return;
        };
        if self.one_token {
            self.rows_gate_up(prog, &mats, None, (0, 1));
            self.rows_down(prog, &mats, None, Some((0, 1)), out);
        } else {
            self.gemm(prog, &mats, None, out);
        }
    }

    /// SwiGLU over an f16 expert pool: routed (ids via the slot table) or one fixed slot.
    /// `js` = (first top-k index, count) served by these dispatches.
    pub fn swiglu_f16(
        &self,
        prog: &mut Program,
        pool: &ExpertPool,
        routed: Option<&Buffer>,
        js: (usize, usize),
        out: &Buffer,
    ) {
        let (h, k) = (self.hidden, self.top_k);
        if let (Some(_), None) = (self.tiled, routed) {
            self.gemm(prog, &SlotMats::f16(pool), None, out);
            return;
        }
        if self.coalesced {
            let mats = SlotMats::f16(pool);
            match routed {
                Some(_) => {
                    self.rows_gate_up(prog, &mats, routed, js);
                    self.rows_down(prog, &mats, routed, Some(js), out);
                }
                None => {
                    self.rows_gate_up(prog, &mats, None, (0, 1));
                    self.rows_down(prog, &mats, None, Some((0, 1)), out);
                }
            }
            return;
        }
        let (kk, top_k, fl, slot_of) = match routed {
            Some(s) => (js.1, k, 0, s),
            None => (1, 1, flags::FFN_FIXED_SLOT, self.dummy),
        };
        for (ci, chunk) in pool.chunks.iter().enumerate() {
            let (first, n) = pool.chunk_slots(ci);
            if routed.is_some() {
                prog.stage("experts_gate_up");
            }
            prog.push(Op::new(
                Kernel::FfnGateUp,
                &FfnGateUpParams {
                    hidden: h as u32,
                    inter: pool.inter as u32,
                    top_k: top_k as u32,
                    x_stride: h as u32,
                    in_vec4: pool.in_vec4(),
                    slot_vec4: pool.slot_vec4(),
                    first_slot: first as u32,
                    chunk_slots: n as u32,
                    flags: fl,
                    j_base: js.0 as u32,
                    ..Default::default()
                },
                binds(&[self.xn, self.topk_ids, slot_of, chunk, self.hbuf]),
                [
                    Dim::Const(groups64(pool.inter)),
                    Dim::Const(kk as u32),
                    Dim::Tokens,
                ],
            ));
        }
        for (ci, chunk) in pool.chunks.iter().enumerate() {
            let (first, n) = pool.chunk_slots(ci);
            if routed.is_some() {
                prog.stage("experts_down");
            }
            prog.push(Op::new(
                Kernel::FfnDown,
                &FfnDownParams {
                    hidden: h as u32,
                    inter: pool.inter as u32,
                    top_k: top_k as u32,
                    in_vec4: pool.in_vec4(),
                    down_vec4: pool.down_vec4(),
                    slot_vec4: pool.slot_vec4(),
                    first_slot: first as u32,
                    chunk_slots: n as u32,
                    flags: fl,
                    j_base: js.0 as u32,
                    ..Default::default()
                },
                binds(&[self.hbuf, self.topk_ids, slot_of, chunk, out]),
                [Dim::Const(groups64(h)), Dim::Const(kk as u32), Dim::Tokens],
            ));
        }
    }

    /// Expert-major W4A16 experts into y [T, k, H]: sort the pairs by expert, gather their
    /// activations, then gate/up and down with one workgroup row per expert (each expert's
    /// weights are read once per 8 of its pairs). The caller adds the combine.
    pub fn q4_expert_major(&self, prog: &mut Program, pool: &Q4Pool, slot_of: &Buffer) {
        let Some(w) = self.sorted else { return };
        let l = &pool.layout;
        let (h, k) = (self.hidden, self.top_k);
        prog.stage("experts_sort");
        prog.push(Op::new(
            Kernel::MoeSort,
            &MoeSortParams {
                n_experts: w.n_experts as u32,
                top_k: k as u32,
                pmax: w.pmax as u32,
                _a: 0,
            },
            binds(&[self.topk_ids, &w.pairs]),
            [Dim::Const(1), Dim::Const(1), Dim::Const(1)],
        ));
        prog.stage("experts_sort");
        prog.push(Op::new(
            Kernel::MoeGather,
            &MoeGatherParams {
                hidden: h as u32,
                top_k: k as u32,
                row_stride: w.x_row as u32,
                _a: 0,
            },
            binds(&[self.xn, &w.pairs, &w.xg]),
            [Dim::Const(groups64(h)), Dim::Tokens, Dim::Const(k as u32)],
        ));
        let e = w.n_experts as u32;
        for (ci, chunk) in pool.chunks.iter().enumerate() {
            let (first, n) = pool.chunk_slots(ci);
            prog.stage("experts_gate_up");
            prog.push(Op::new(
                Kernel::Q4GateUpSorted,
                &Q4GateUpSortedParams {
                    hidden: h as u32,
                    inter: l.inter as u32,
                    top_k: k as u32,
                    pmax: w.pmax as u32,
                    x_row4: (w.x_row / 4) as u32,
                    h_row: w.h_row as u32,
                    n_experts: e,
                    slot_vec4: pool.slot_vec4(),
                    first_slot: first as u32,
                    chunk_slots: n as u32,
                    gate_q: (l.gate_q / 16) as u32,
                    up_q: (l.up_q / 16) as u32,
                    gate_s: (l.gate_s / 4) as u32,
                    up_s: (l.up_s / 4) as u32,
                    ..Default::default()
                },
                binds(&[&w.xg, &w.pairs, slot_of, chunk, chunk, &w.hg]),
                [Dim::Const(groups64(l.inter)), Dim::Const(e), Dim::Const(1)],
            ));
        }
        for (ci, chunk) in pool.chunks.iter().enumerate() {
            let (first, n) = pool.chunk_slots(ci);
            prog.stage("experts_down");
            prog.push(Op::new(
                Kernel::Q4DownSorted,
                &Q4DownSortedParams {
                    hidden: h as u32,
                    inter: l.inter as u32,
                    top_k: k as u32,
                    pmax: w.pmax as u32,
                    h_row4: (w.h_row / 4) as u32,
                    n_experts: e,
                    slot_vec4: pool.slot_vec4(),
                    first_slot: first as u32,
                    chunk_slots: n as u32,
                    down_q: (l.down_q / 16) as u32,
                    down_s: (l.down_s / 4) as u32,
                    _a: 0,
                },
                binds(&[&w.hg, &w.pairs, slot_of, chunk, chunk, self.y]),
                [
                    Dim::Const(h.div_ceil(Q4_DOWN_SORTED_ROWS) as u32),
                    Dim::Const(e),
                    Dim::Const(1),
                ],
            ));
        }
    }

    /// Tiled expert GEMMs, gate/up (+ SiLU) into h then down into `out` (y [T, k, H], or
    /// for one fixed slot [T, H]): over the sorted pairs with `route` = (slot table,
    /// pairs), or every token of slot 0. One dispatch per pool chunk each.
    fn gemm(
        &self,
        prog: &mut Program,
        m: &SlotMats,
        route: Option<(&Buffer, &MoePairs)>,
        out: &Buffer,
    ) {
        let (top_k, fixed, slot_of, pairs, pmax, experts) = match route {
            Some((s, p)) => (self.top_k, 0, s, &p.buffer, p.pmax, p.n_experts),
            None => (1, flags::FFN_FIXED_SLOT, self.dummy, self.dummy, 0, 1),
        };
        for (down, stage) in [(false, "experts_gate_up"), (true, "experts_down")] {
            let format = if down { m.down_format } else { m.format };
            let kernel = Kernel::ExpertGemm(format);
            if route.is_some() {
                prog.stage(stage);
            }
            let (inp, outp) = if down {
                (self.hbuf, out)
            } else {
                (self.xn, self.hbuf)
            };
            for (first, n, chunk) in &m.chunks {
                let mut b = vec![
                    (2, inp),
                    (3, inp),
                    (4, pairs),
                    (5, slot_of),
                    (6, outp),
                    (10, chunk),
                ];
                if format.has_scales() {
                    b.push((11, chunk));
                }
                let (in_dim, out_dim) = if down {
                    (m.inter, self.hidden)
                } else {
                    (self.hidden, m.inter)
                };
                prog.push(Op::new(
                    kernel,
                    &ExpertGemmParams {
                        in_dim: in_dim as u32,
                        out_dim: out_dim as u32,
                        top_k: top_k as u32,
                        pmax: pmax as u32,
                        n_experts: experts as u32,
                        slot_words: m.slot_words,
                        first_slot: *first as u32,
                        chunk_slots: *n as u32,
                        a_w: if down { m.down_w } else { m.gate_w },
                        b_w: m.up_w,
                        a_s: if down { m.down_s } else { m.gate_s },
                        b_s: m.up_s,
                        words_per_row: if down { m.down_words } else { m.in_words },
                        blocks_per_row: if down { m.down_blocks } else { m.in_blocks },
                        flags: fixed | if down { flags::EXPERT_GEMM_DOWN } else { 0 },
                        _a: 0,
                    },
                    numbered(&b),
                    [
                        Dim::Const(out_dim.div_ceil(EXPERT_GEMM_ROWS) as u32),
                        Dim::Const(experts as u32),
                        Dim::TokensDiv(GEMM_TOKENS as u32),
                    ],
                ));
            }
        }
    }

    /// GPU-shaped gate/up (+ SiLU) for top-k indices js.0 .. js.0 + js.1 (`route`: the
    /// layer's slot table; None: one fixed slot, top-k 1), one dispatch per pool chunk.
    fn rows_gate_up(
        &self,
        prog: &mut Program,
        m: &SlotMats,
        route: Option<&Buffer>,
        js: (usize, usize),
    ) {
        let (top_k, mut fl, slot_of) = match route {
            Some(s) => (self.top_k, 0, s),
            None => (1, flags::FFN_FIXED_SLOT, self.dummy),
        };
        // Fused routing serves every top-k index in one dispatch per chunk.
        let fused = self
            .route
            .filter(|_| route.is_some() && js == (0, self.top_k));
        if fused.is_some() {
            fl |= flags::FFN_ROUTE;
        }
        for (ci, (first, n, chunk)) in m.chunks.iter().enumerate() {
            let write = if fused.is_some() && ci == 0 {
                flags::FFN_ROUTE_WRITE
            } else {
                0
            };
            // Fused, the ids are written (12), not read (4); unfused, 9 and 12 are the
            // h buffer the op writes anyway (one read-write use), never written there.
            let (ids, logits, w_out, ids_out) = match fused {
                Some(r) => (self.dummy, r.logits, self.topk_w, self.topk_ids),
                None => (self.topk_ids, self.dummy, self.hbuf, self.hbuf),
            };
            let mut b = vec![
                (2, self.xn),
                (3, self.xn),
                (4, ids),
                (5, slot_of),
                (6, self.hbuf),
                (8, logits),
                (9, w_out),
                (10, chunk),
                (12, ids_out),
            ];
            if m.format.has_scales() {
                b.push((11, chunk));
            }
            let stage = if route.is_some() {
                "experts_gate_up"
            } else {
                ""
            };
            prog.push(
                Op::new(
                    Kernel::ExpertGateUp(self.plan.rows(m.format)),
                    &ExpertGateUpParams {
                        hidden: self.hidden as u32,
                        inter: m.inter as u32,
                        top_k: top_k as u32,
                        j_base: js.0 as u32,
                        x_stride: self.hidden as u32,
                        slot_words: m.slot_words,
                        first_slot: *first as u32,
                        chunk_slots: *n as u32,
                        gate_w: m.gate_w,
                        up_w: m.up_w,
                        gate_s: m.gate_s,
                        up_s: m.up_s,
                        words_per_row: m.in_words,
                        blocks_per_row: m.in_blocks,
                        flags: fl | write,
                        route_experts: fused.map_or(0, |r| r.experts),
                        route_stride: fused.map_or(0, |r| r.stride),
                        route_splits: fused.map_or(0, |r| r.splits),
                        route_norm: fused.is_some_and(|r| r.norm) as u32,
                        _a: 0,
                    },
                    numbered(&b),
                    [
                        Dim::Const(m.inter.div_ceil(ROWS_PER_WORKGROUP) as u32),
                        Dim::Const(js.1 as u32),
                        Dim::Tokens,
                    ],
                )
                .in_stage(stage),
            );
        }
    }

    /// GPU-shaped down projection: per (token, top-k index) into `out` = y [T, k, H] for
    /// `js` = Some((first, count)), or (None) the top-k's weighted sum added into x.
    fn rows_down(
        &self,
        prog: &mut Program,
        m: &SlotMats,
        route: Option<&Buffer>,
        js: Option<(usize, usize)>,
        out: &Buffer,
    ) {
        let (top_k, mut fl, slot_of) = match route {
            Some(s) => (self.top_k, 0, s),
            None => (1, flags::FFN_FIXED_SLOT, self.dummy),
        };
        let (j0, ny) = match js {
            Some(j) => j,
            None => {
                fl |= flags::EXPERT_COMBINE;
                (0, 1)
            }
        };
        for (first, n, chunk) in &m.chunks {
            let mut b = vec![
                (2, self.hbuf),
                (3, self.hbuf),
                (4, self.topk_ids),
                (5, slot_of),
                (6, self.topk_w),
                (7, out),
                (10, chunk),
            ];
            if m.down_format.has_scales() {
                b.push((11, chunk));
            }
            let stage = if route.is_some() { "experts_down" } else { "" };
            prog.push(
                Op::new(
                    Kernel::ExpertDown(self.plan.rows(m.down_format)),
                    &ExpertDownParams {
                        hidden: self.hidden as u32,
                        inter: m.inter as u32,
                        top_k: top_k as u32,
                        j_base: j0 as u32,
                        slot_words: m.slot_words,
                        first_slot: *first as u32,
                        chunk_slots: *n as u32,
                        down_w: m.down_w,
                        down_s: m.down_s,
                        words_per_row: m.down_words,
                        blocks_per_row: m.down_blocks,
                        flags: fl,
                    },
                    numbered(&b),
                    [
                        Dim::Const(self.hidden.div_ceil(ROWS_PER_WORKGROUP) as u32),
                        Dim::Const(ny as u32),
                        Dim::Tokens,
                    ],
                )
                .in_stage(stage),
            );
        }
    }

    /// The W4A16 variant of these dispatches.
    fn q4_variant(&self) -> Q4Variant {
        if self.decode_uniform {
            self.plan.q4_uniform()
        } else {
            self.plan.q4_storage()
        }
    }

    /// Bindings of a W4A16 kernel: `act` at binding 2 (a uniform window at offset 0, or
    /// storage and again at binding 15 as vec4s), then `rest` from binding 3.
    fn q4_binds(&self, q: Q4Variant, act: &Buffer, rest: &[&Buffer]) -> Vec<Bind> {
        let mut v = Vec::with_capacity(rest.len() + 2);
        v.push(Bind {
            binding: 2,
            resource: match q.act {
                Activations::Uniform => Resource::Window {
                    buffer: act.clone(),
                    offset: 0,
                },
                Activations::Storage => Resource::Buffer(act.clone()),
            },
        });
        for (i, b) in rest.iter().enumerate() {
            v.push(Bind {
                binding: 3 + i as u32,
                resource: Resource::Buffer((*b).clone()),
            });
        }
        if q.act == Activations::Storage {
            v.push(Bind {
                binding: 15,
                resource: Resource::Buffer(act.clone()),
            });
        }
        v
    }

    /// W4A16 gate/up for top-k indices js.0 .. js.0 + js.1, one dispatch per chunk.
    pub fn q4_gate_up(
        &self,
        prog: &mut Program,
        pool: &Q4Pool,
        slot_of: &Buffer,
        js: (usize, usize),
    ) {
        // The lavapipe-tuned INT4 kernels read block-256 slots; affine ones take the rows.
        if self.coalesced || !pool.layout.is_sym256() {
            self.rows_gate_up(prog, &SlotMats::q4(pool), Some(slot_of), js);
            return;
        }
        let l = &pool.layout;
        let q = self.q4_variant();
        for (ci, chunk) in pool.chunks.iter().enumerate() {
            let (first, n) = pool.chunk_slots(ci);
            prog.stage("experts_gate_up");
            prog.push(Op::new(
                Kernel::Q4GateUp(q),
                &Q4GateUpParams {
                    hidden: self.hidden as u32,
                    inter: l.inter as u32,
                    top_k: self.top_k as u32,
                    j_base: js.0 as u32,
                    x_stride: self.hidden as u32,
                    slot_vec4: pool.slot_vec4(),
                    first_slot: first as u32,
                    chunk_slots: n as u32,
                    gate_q: (l.gate_q / 16) as u32,
                    up_q: (l.up_q / 16) as u32,
                    gate_s: (l.gate_s / 4) as u32,
                    up_s: (l.up_s / 4) as u32,
                    ..Default::default()
                },
                self.q4_binds(
                    q,
                    self.xn,
                    &[self.topk_ids, slot_of, chunk, chunk, self.hbuf],
                ),
                [
                    Dim::Const(l.inter.div_ceil(q.rows_per_workgroup()) as u32),
                    Dim::Const(js.1 as u32),
                    Dim::Tokens,
                ],
            ));
        }
    }

    /// W4A16 down: per top-k index into y, or (fused, `js` None) weighted into x.
    pub fn q4_down(
        &self,
        prog: &mut Program,
        pool: &Q4Pool,
        slot_of: &Buffer,
        js: Option<(usize, usize)>,
    ) {
        if self.coalesced || !pool.layout.is_sym256() {
            let out = if js.is_some() { self.y } else { self.x };
            self.rows_down(prog, &SlotMats::q4(pool), Some(slot_of), js, out);
            return;
        }
        let l = &pool.layout;
        let q = self.q4_variant();
        for (ci, chunk) in pool.chunks.iter().enumerate() {
            let (first, n) = pool.chunk_slots(ci);
            let (kernel, j0, ny, out) = match js {
                Some((j0, n)) => (Kernel::Q4Down(q), j0, n, self.y),
                None => (Kernel::Q4DownCombine(q), 0, 1, self.x),
            };
            prog.stage("experts_down");
            prog.push(Op::new(
                kernel,
                &Q4DownParams {
                    hidden: self.hidden as u32,
                    inter: l.inter as u32,
                    top_k: self.top_k as u32,
                    j_base: j0 as u32,
                    slot_vec4: pool.slot_vec4(),
                    first_slot: first as u32,
                    chunk_slots: n as u32,
                    down_q: (l.down_q / 16) as u32,
                    down_s: (l.down_s / 4) as u32,
                    ..Default::default()
                },
                match js {
                    Some(_) => {
                        self.q4_binds(q, self.hbuf, &[self.topk_ids, slot_of, chunk, chunk, out])
                    }
                    None => self.q4_binds(
                        q,
                        self.hbuf,
                        &[self.topk_ids, slot_of, chunk, chunk, self.topk_w, out],
                    ),
                },
                [
                    Dim::Const(self.hidden.div_ceil(q.rows_per_workgroup()) as u32),
                    Dim::Const(ny as u32),
                    Dim::Tokens,
                ],
            ));
        }
    }
}

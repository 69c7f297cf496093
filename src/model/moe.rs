//! Dispatches of the routed experts of one MoE layer (and of single-slot SwiGLU blocks:
//! Qwen's shared expert, dense MLP layers), for both executors and both precisions.

use crate::gpu::kernels::*;
use crate::gpu::program::{groups64, Dim, Program};
use crate::gpu::tensor::{ExpertPool, ExpertStore, Q4Pool};
use crate::gpu::{GpuBuffer, GpuContext};
use crate::model::forward::Executor;

/// The storage W4A16 kernels bind their activations a second time, as vec4s; the
/// uniform (decode) ones do not.
fn q4_bindings<'b>(
    k: Kernel,
    base: &[&'b wgpu::Buffer],
    act: &'b wgpu::Buffer,
) -> Vec<&'b wgpu::Buffer> {
    let mut v = base.to_vec();
    if !k.uniform_activation() {
        v.push(act);
    }
    v
}

fn groups(rows: usize, k: Kernel) -> u32 {
    rows.div_ceil(k.rows_per_workgroup()) as u32
}

/// Buffers of the expert-major path for multi-token steps on CPU adapters: the step's
/// (token, top-k index) pairs sorted by expert, their activations gathered in that order
/// and their SwiGLU intermediates, one row per pair.
pub struct MoeSorted {
    /// Pair capacity: chunk * top_k.
    pub pmax: usize,
    pub n_experts: usize,
    /// Floats per row of `xg` / `hg` (hidden / intermediate rounded up to 32).
    pub x_row: usize,
    pub h_row: usize,
    /// [pair of sorted position; its expert; end of each expert's run] (moe_sort.wgsl).
    pub pairs: GpuBuffer,
    pub xg: GpuBuffer,
    pub hg: GpuBuffer,
}

impl MoeSorted {
    pub fn new(ctx: &GpuContext, chunk: usize, top_k: usize, e: usize, h: usize, i: usize) -> Self {
        let (pmax, x_row, h_row) = Self::shape(chunk, top_k, h, i);
        let storage = |label: &str, bytes: usize| {
            ctx.buffer(
                label,
                bytes as u64,
                wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC,
            )
        };
        MoeSorted {
            pmax,
            n_experts: e,
            x_row,
            h_row,
            pairs: storage("moe_pairs", (2 * pmax + e) * 4),
            xg: storage("moe_x_sorted", pmax * x_row * 4),
            hg: storage("moe_h_sorted", pmax * h_row * 4),
        }
    }

    /// Pair capacity and the row strides of `xg` / `hg` (rounded up to the kernels' 32-wide
    /// vec4 groups).
    fn shape(chunk: usize, top_k: usize, h: usize, i: usize) -> (usize, usize, usize) {
        (
            chunk * top_k,
            h.next_multiple_of(32),
            i.next_multiple_of(32),
        )
    }

    /// Bytes `new` allocates.
    pub fn bytes(chunk: usize, top_k: usize, e: usize, h: usize, i: usize) -> usize {
        let (pmax, x_row, h_row) = Self::shape(chunk, top_k, h, i);
        (2 * pmax + e + pmax * (x_row + h_row)) * 4
    }
}

/// The buffers a layer's expert dispatches read and write.
pub struct MoeDispatch<'a> {
    /// Multi-token steps with INT4 experts and the grouped executor: the expert-major
    /// kernels (CPU adapters).
    pub sorted: Option<&'a MoeSorted>,
    /// Grouped INT4 experts: add the down projection into x in the same dispatch (fused
    /// combine). Off when the expert outputs must be idempotent per (token, top-k) pair:
    /// partial residency runs a step's experts in several batches of resident ones.
    pub fuse_combine: bool,
    /// One-token steps: the INT4 kernels read activations from a 64 KiB uniform binding of
    /// `xn` / `hbuf` (which must be created with UNIFORM usage and at least that size).
    pub decode_uniform: bool,
    pub ctx: &'a GpuContext,
    pub step: &'a wgpu::Buffer,
    pub hidden: usize,
    pub top_k: usize,
    pub dummy: &'a wgpu::Buffer,
    /// Normed hidden state [T, H] (expert input).
    pub xn: &'a wgpu::Buffer,
    pub topk_ids: &'a wgpu::Buffer,
    pub topk_w: &'a wgpu::Buffer,
    /// SwiGLU intermediate [T, k, I].
    pub hbuf: &'a wgpu::Buffer,
    /// Per-expert outputs [T, k, H].
    pub y: &'a wgpu::Buffer,
    /// Residual stream [T, H].
    pub x: &'a wgpu::Buffer,
}

impl MoeDispatch<'_> {
    /// Routed experts. Returns the `combine_flags` the layer's combine dispatch still
    /// needs (0 when the executor already added the experts into x).
    pub fn routed(
        &self,
        prog: &mut Program,
        executor: Executor,
        store: &ExpertStore,
        slot_of: &wgpu::Buffer,
    ) -> u32 {
        let k = self.top_k;
        let per_expert = executor == Executor::PerExpert;
        match store {
            ExpertStore::F16(pool) if per_expert => {
                for j in 0..k {
                    self.swiglu_f16(prog, pool, Some(slot_of), (j, 1), self.y);
                }
                combine_flags::ROUTED
            }
            ExpertStore::F16(pool) => {
                self.swiglu_f16(prog, pool, Some(slot_of), (0, k), self.y);
                combine_flags::ROUTED
            }
            ExpertStore::Int4(pool) if per_expert => {
                for j in 0..k {
                    self.q4_gate_up(prog, pool, slot_of, (j, 1));
                    self.q4_down(prog, pool, slot_of, Some((j, 1)));
                }
                combine_flags::ROUTED
            }
            ExpertStore::Int4(pool) if self.sorted.is_some() => {
                self.q4_expert_major(prog, pool, slot_of);
                combine_flags::ROUTED
            }
            ExpertStore::Int4(pool) if self.fuse_combine => {
                self.q4_gate_up(prog, pool, slot_of, (0, k));
                self.q4_down(prog, pool, slot_of, None);
                0
            }
            ExpertStore::Int4(pool) => {
                self.q4_gate_up(prog, pool, slot_of, (0, k));
                self.q4_down(prog, pool, slot_of, Some((0, k)));
                combine_flags::ROUTED
            }
        }
    }

    /// SwiGLU over an f16 expert pool: routed (ids via the slot table) or one fixed slot.
    /// `js` = (first top-k index, count) served by these dispatches.
    pub fn swiglu_f16(
        &self,
        prog: &mut Program,
        pool: &ExpertPool,
        routed: Option<&wgpu::Buffer>,
        js: (usize, usize),
        out: &wgpu::Buffer,
    ) {
        let (h, k) = (self.hidden, self.top_k);
        let (kk, top_k, flags, slot_of) = match routed {
            Some(s) => (js.1, k, 0, s),
            None => (1, 1, FFN_FIXED_SLOT, self.dummy),
        };
        let tok = Dim::Tokens;
        for (ci, chunk) in pool.chunks.iter().enumerate() {
            let first = ci * pool.slots_per_chunk;
            let n = pool.slots_per_chunk.min(pool.slots - first);
            prog.push(
                self.ctx,
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
                    flags,
                    j_base: js.0 as u32,
                    _pad: [0; 2],
                },
                self.step,
                &[self.xn, self.topk_ids, slot_of, chunk, self.hbuf],
                [Dim::Const(groups64(pool.inter)), Dim::Const(kk as u32), tok],
            );
        }
        for (ci, chunk) in pool.chunks.iter().enumerate() {
            let first = ci * pool.slots_per_chunk;
            let n = pool.slots_per_chunk.min(pool.slots - first);
            prog.push(
                self.ctx,
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
                    flags,
                    j_base: js.0 as u32,
                    _pad: [0; 2],
                },
                self.step,
                &[self.hbuf, self.topk_ids, slot_of, chunk, out],
                [Dim::Const(groups64(h)), Dim::Const(kk as u32), tok],
            );
        }
    }

    /// Expert-major W4A16 experts into y [T, k, H]: sort the pairs by expert, gather their
    /// activations, then gate/up and down with one workgroup row per expert (each expert's
    /// weights are read once per 8 of its pairs). The caller adds the combine.
    pub fn q4_expert_major(&self, prog: &mut Program, pool: &Q4Pool, slot_of: &wgpu::Buffer) {
        let Some(w) = self.sorted else { return };
        let l = &pool.layout;
        let (h, k) = (self.hidden, self.top_k);
        prog.push(
            self.ctx,
            Kernel::MoeSort,
            &MoeSortParams {
                n_experts: w.n_experts as u32,
                top_k: k as u32,
                pmax: w.pmax as u32,
                _pad: 0,
            },
            self.step,
            &[self.topk_ids, &w.pairs],
            [Dim::Const(1), Dim::Const(1), Dim::Const(1)],
        );
        prog.push(
            self.ctx,
            Kernel::MoeGather,
            &MoeGatherParams {
                hidden: h as u32,
                top_k: k as u32,
                row_stride: w.x_row as u32,
                _pad: 0,
            },
            self.step,
            &[self.xn, &w.pairs, &w.xg],
            [Dim::Const(groups64(h)), Dim::Tokens, Dim::Const(k as u32)],
        );
        let e = w.n_experts as u32;
        for (ci, chunk) in pool.chunks.iter().enumerate() {
            let first = ci * pool.slots_per_chunk;
            let n = pool.slots_per_chunk.min(pool.slots - first);
            prog.push(
                self.ctx,
                Kernel::FfnGateUpQ4E,
                &FfnQ4EParams {
                    hidden: h as u32,
                    inter: l.inter as u32,
                    top_k: k as u32,
                    pmax: w.pmax as u32,
                    in_row4: (w.x_row / 4) as u32,
                    out_row: w.h_row as u32,
                    n_experts: e,
                    _t: 0,
                    slot_vec4: pool.slot_vec4(),
                    first_slot: first as u32,
                    chunk_slots: n as u32,
                    a_q: (l.gate_q / 16) as u32,
                    b_q: (l.up_q / 16) as u32,
                    a_s: (l.gate_s / 4) as u32,
                    b_s: (l.up_s / 4) as u32,
                    _pad: 0,
                },
                self.step,
                &[&w.xg, &w.pairs, slot_of, chunk, chunk, &w.hg],
                [Dim::Const(groups64(l.inter)), Dim::Const(e), Dim::Const(1)],
            );
        }
        for (ci, chunk) in pool.chunks.iter().enumerate() {
            let first = ci * pool.slots_per_chunk;
            let n = pool.slots_per_chunk.min(pool.slots - first);
            prog.push(
                self.ctx,
                Kernel::FfnDownQ4E,
                &FfnQ4EParams {
                    hidden: h as u32,
                    inter: l.inter as u32,
                    top_k: k as u32,
                    pmax: w.pmax as u32,
                    in_row4: (w.h_row / 4) as u32,
                    out_row: h as u32,
                    n_experts: e,
                    _t: 0,
                    slot_vec4: pool.slot_vec4(),
                    first_slot: first as u32,
                    chunk_slots: n as u32,
                    a_q: (l.down_q / 16) as u32,
                    b_q: 0,
                    a_s: (l.down_s / 4) as u32,
                    b_s: 0,
                    _pad: 0,
                },
                self.step,
                &[&w.hg, &w.pairs, slot_of, chunk, chunk, self.y],
                [
                    Dim::Const(h.div_ceil(128) as u32),
                    Dim::Const(e),
                    Dim::Const(1),
                ],
            );
        }
    }

    /// W4A16 gate/up for top-k indices js.0 .. js.0 + js.1, one dispatch per chunk.
    pub fn q4_gate_up(
        &self,
        prog: &mut Program,
        pool: &Q4Pool,
        slot_of: &wgpu::Buffer,
        js: (usize, usize),
    ) {
        let l = &pool.layout;
        for (ci, chunk) in pool.chunks.iter().enumerate() {
            let first = ci * pool.slots_per_chunk;
            let kernel = if self.decode_uniform {
                Kernel::FfnGateUpQ4U
            } else {
                self.ctx.kernels.q4_gate_up()
            };
            prog.push(
                self.ctx,
                kernel,
                &FfnQ4Params {
                    hidden: self.hidden as u32,
                    inter: l.inter as u32,
                    top_k: self.top_k as u32,
                    j_base: js.0 as u32,
                    x_stride: self.hidden as u32,
                    slot_vec4: pool.slot_vec4(),
                    first_slot: first as u32,
                    chunk_slots: pool.slots_per_chunk.min(pool.slots - first) as u32,
                    a_q: (l.gate_q / 16) as u32,
                    b_q: (l.up_q / 16) as u32,
                    a_s: (l.gate_s / 4) as u32,
                    b_s: (l.up_s / 4) as u32,
                    flags: 0,
                    _pad: [0; 3],
                },
                self.step,
                &q4_bindings(
                    kernel,
                    &[self.xn, self.topk_ids, slot_of, chunk, chunk, self.hbuf],
                    self.xn,
                ),
                [
                    Dim::Const(groups(l.inter, kernel)),
                    Dim::Const(js.1 as u32),
                    Dim::Tokens,
                ],
            );
        }
    }

    /// W4A16 down: per top-k index into y, or (fused, `js` None) weighted into x.
    pub fn q4_down(
        &self,
        prog: &mut Program,
        pool: &Q4Pool,
        slot_of: &wgpu::Buffer,
        js: Option<(usize, usize)>,
    ) {
        let l = &pool.layout;
        for (ci, chunk) in pool.chunks.iter().enumerate() {
            let first = ci * pool.slots_per_chunk;
            let (flags, j0, ny, out) = match js {
                Some((j0, n)) => (0, j0, n, self.y),
                None => (Q4_DOWN_FUSED_COMBINE, 0, 1, self.x),
            };
            let kernel = if self.decode_uniform {
                Kernel::FfnDownQ4U
            } else {
                self.ctx.kernels.q4_down()
            };
            prog.push(
                self.ctx,
                kernel,
                &FfnQ4Params {
                    hidden: self.hidden as u32,
                    inter: l.inter as u32,
                    top_k: self.top_k as u32,
                    j_base: j0 as u32,
                    x_stride: 0,
                    slot_vec4: pool.slot_vec4(),
                    first_slot: first as u32,
                    chunk_slots: pool.slots_per_chunk.min(pool.slots - first) as u32,
                    a_q: (l.down_q / 16) as u32,
                    b_q: 0,
                    a_s: (l.down_s / 4) as u32,
                    b_s: 0,
                    flags,
                    _pad: [0; 3],
                },
                self.step,
                &q4_bindings(
                    kernel,
                    &[
                        self.hbuf,
                        self.topk_ids,
                        slot_of,
                        chunk,
                        chunk,
                        self.topk_w,
                        out,
                    ],
                    self.hbuf,
                ),
                [
                    Dim::Const(groups(self.hidden, kernel)),
                    Dim::Const(ny as u32),
                    Dim::Tokens,
                ],
            );
        }
    }
}

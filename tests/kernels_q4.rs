//! The W4A16 expert kernels (shaders/ffn_gate_up_q4*.wgsl, shaders/ffn_down_q4*.wgsl)
//! against `wgmoe::cpu_ref::w4a16_*`, which reads the same packed slot bytes element by
//! element through `Q4Matrix::nibble` / `Q4Matrix::scale` and sums in f64. The dispatches
//! are the forward pass's own (`model::moe::MoeDispatch`: one op per pool chunk), over a
//! slot table that maps expert ids to permuted pool slots, the extra slots holding
//! unrelated experts. Runs on lavapipe in CI; a missing adapter is a failure, never a skip.
//!
//! Random slots hold random nibbles (all 16 values, -8 included) and random f16 scales
//! (some zero) at the places `Q4Matrix::pack` writes real weights, found by packing an
//! all-ones matrix, so the tests follow the layout wherever src/quant.rs puts it; padding
//! nibbles stay 8 and unused scale halves are f16 NaN, so a kernel that reads a scale it
//! should not turns its output into NaN. The quantise -> pack -> kernel path on real-ish
//! weights is checked on its own.
//!
//! A difference is measured as in tests/kernels.rs: `|gpu - cpu| / max(1, rms(cpu), |cpu|)`,
//! the largest one printed per case.

mod common;

use half::{bf16, f16};

use wgmoe::cpu_ref;
use wgmoe::gpu::kernels::*;
use wgmoe::gpu::program::{groups64, Dim, Program};
use wgmoe::gpu::tensor::{upload_f32_vec, ExpertStore, Q4Pool};
use wgmoe::gpu::{AdapterRequest, GpuBuffer, GpuContext};
use wgmoe::model::forward::Executor;
use wgmoe::model::moe::MoeDispatch;
use wgmoe::quant::{Q4Matrix, Q4SlotLayout, BLOCK};

/// The kernels sum in f32 (dot4 pairs, then 256-input block sums, one scale multiply per
/// block) what the reference sums in f64; up to 2056 terms per output, plus exp in silu
/// and, fused, up to 8 weighted terms and the residual. As MATMUL_TOL / FFN_TOL.
const Q4_TOL: f32 = 2e-5;
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
// Harness (as tests/kernels.rs)

/// `portable` for each W4A16 kernel variant a test runs: the portable kernels, and the
/// device's own choice (the subgroup kernels where the adapter has subgroups of at least
/// 8 lanes; the portable ones again elsewhere).
const VARIANTS: [bool; 2] = [true, false];

/// A fresh device per test and variant; `cap` limits the storage binding, so Q4Pool::new
/// makes several chunks.
fn gpu(cap: Option<u64>, portable: bool) -> GpuContext {
    common::init_env();
    GpuContext::new(&AdapterRequest {
        max_binding: cap,
        portable_kernels: portable,
        ..Default::default()
    })
    .unwrap_or_else(|e| {
        panic!("kernel tests need a GPU adapter (lavapipe in CI), none usable: {e}")
    })
}

/// xorshift64*: seeded, tiny, good enough for test data.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Uniform in [-scale, scale).
    fn f32(&mut self, scale: f32) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32(scale)).collect()
    }
    fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            p.swap(i, self.below(i + 1));
        }
        p
    }
}

fn step_buf(ctx: &GpuContext, pos0: usize, n_tokens: usize) -> GpuBuffer {
    let s = Step {
        pos0: pos0 as u32,
        n_tokens: n_tokens as u32,
        _pad: [0; 2],
    };
    ctx.uniform_with("step", bytemuck::bytes_of(&s))
}

fn f32_buf(ctx: &GpuContext, data: &[f32]) -> GpuBuffer {
    upload_f32_vec(ctx, "test_f32", data)
}

fn u32_buf(ctx: &GpuContext, data: &[u32]) -> GpuBuffer {
    ctx.storage_with("test_u32", bytemuck::cast_slice(data))
}

/// Record the program in one compute pass, submit once, wait, and fail on any GPU error.
fn run(ctx: &GpuContext, prog: &Program, tokens: usize) {
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        prog.record(ctx, &mut pass, tokens as u32);
    }
    ctx.queue.submit([enc.finish()]);
    ctx.sync().unwrap_or_else(|e| panic!("GPU error: {e}"));
}

fn read_f32(ctx: &GpuContext, buf: &wgpu::Buffer, n: usize) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(&ctx.read_back(buf, 0, (n * 4) as u64).unwrap())
}

/// Fails unless every `|got - want| / max(floor, rms(want), |want|) <= tol`; prints the
/// largest such difference, its index and both values, and returns it.
fn check_floor(what: &str, got: &[f32], want: &[f32], tol: f32, floor: f32) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let rms = (want.iter().map(|w| w * w).sum::<f32>() / want.len().max(1) as f32).sqrt();
    let scale = rms.max(floor);
    let mut worst = (0.0f32, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs() / w.abs().max(scale);
        if d > worst.0 || d.is_nan() {
            worst = (d, i);
            if d.is_nan() {
                break;
            }
        }
    }
    let (d, i) = worst;
    eprintln!("{what}: max diff {d:.2e} at [{i}] (tolerance {tol:.0e})");
    assert!(
        d <= tol,
        "{what}: |gpu - cpu| = {d:.3e} at index {i} (gpu {}, cpu {}) exceeds the tolerance {tol:.0e}",
        got[i],
        want[i]
    );
    d
}

/// The house measure: relative to max(1, rms, |want|).
fn check(what: &str, got: &[f32], want: &[f32], tol: f32) -> f32 {
    check_floor(what, got, want, tol, 1.0)
}

/// Bit-identical (NaN included).
fn check_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad = got
        .iter()
        .zip(want)
        .position(|(g, w)| g.to_bits() != w.to_bits());
    eprintln!(
        "{what}: {}",
        if bad.is_none() {
            "bit-identical"
        } else {
            "DIFFERS"
        }
    );
    if let Some(i) = bad {
        panic!(
            "{what}: index {i}: {} vs {} (must be bit-identical)",
            got[i], want[i]
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Packed slots

const F16_NAN: [u8; 2] = [0x00, 0x7E];

/// Random nibbles (all 16 values) and scales (about 1 in 16 exactly zero, the rest in
/// [0.002, 0.06)) for one [out, in] matrix, at the places where `Q4Matrix::pack` puts
/// real weights: packing all-ones makes every real nibble 15 (q = 7) and every real scale
/// f16(1/7), and leaves padding nibbles 8 and unused scale bytes 0. Padding stays 8; unused
/// scale halves become NaN.
fn random_matrix(rng: &mut Rng, m: Q4Matrix) -> (Vec<u8>, Vec<u8>) {
    let (mut q, mut s) = (vec![0u8; m.q_bytes()], vec![0u8; m.scale_bytes()]);
    m.pack(&vec![1.0; m.out * m.inp], &mut q, &mut s);
    let mut real = 0;
    let mut nibble = |v: u8| match v {
        15 => {
            real += 1;
            rng.below(16) as u8
        }
        8 => 8,
        other => panic!("Q4Matrix::pack of all-ones wrote nibble {other}"),
    };
    for byte in q.iter_mut() {
        let lo = nibble(*byte & 0xF);
        *byte = lo | (nibble(*byte >> 4) << 4);
    }
    assert_eq!(
        real,
        m.out * m.inp,
        "real nibbles of a packed [{}, {}] matrix",
        m.out,
        m.inp
    );
    let seventh = f16::from_f32(1.0 / 7.0).to_le_bytes();
    let mut real = 0;
    for half in s.chunks_exact_mut(2) {
        if half == seventh {
            real += 1;
            let v = if rng.below(16) == 0 {
                f16::ZERO
            } else {
                f16::from_f32(0.031 + rng.f32(0.029))
            };
            half.copy_from_slice(&v.to_le_bytes());
        } else {
            assert_eq!(
                half,
                [0, 0],
                "Q4Matrix::pack of all-ones wrote an unexpected scale"
            );
            half.copy_from_slice(&F16_NAN);
        }
    }
    assert_eq!(
        real,
        m.out * m.blocks(),
        "real scales of a packed [{}, {}] matrix",
        m.out,
        m.inp
    );
    (q, s)
}

/// One slot of random gate, up and down sections.
fn random_slot(rng: &mut Rng, l: &Q4SlotLayout) -> Vec<u8> {
    let mut slot = vec![0u8; l.bytes];
    for (m, q_at, s_at) in [
        (l.gate, l.gate_q, l.gate_s),
        (l.gate, l.up_q, l.up_s),
        (l.down, l.down_q, l.down_s),
    ] {
        let (q, s) = random_matrix(rng, m);
        slot[q_at..q_at + q.len()].copy_from_slice(&q);
        slot[s_at..s_at + s.len()].copy_from_slice(&s);
    }
    slot
}

// ---------------------------------------------------------------------------------------------
// One routed MoE layer's worth of INT4 experts on the GPU

#[derive(Clone, Copy, Debug)]
struct Case {
    hidden: usize,
    inter: usize,
    n_experts: usize,
    /// Pool slots (>= n_experts); the slots no expert maps to hold unrelated experts.
    slots: usize,
    top_k: usize,
    t: usize,
}

const fn case(
    hidden: usize,
    inter: usize,
    n_experts: usize,
    slots: usize,
    top_k: usize,
    t: usize,
) -> Case {
    Case {
        hidden,
        inter,
        n_experts,
        slots,
        top_k,
        t,
    }
}

struct Setup<'a> {
    ctx: &'a GpuContext,
    c: Case,
    layout: Q4SlotLayout,
    /// The pool, as the forward pass holds it.
    store: ExpertStore,
    /// Host copy of each pool slot's bytes.
    host: Vec<Vec<u8>>,
    /// Expert id -> pool slot (a permutation, not the identity).
    slot_of: Vec<usize>,
    ids: Vec<u32>,
    weights: Vec<f32>,
    /// gate_up input [T, hidden].
    xs: Vec<f32>,
    /// down input [T, top_k, inter].
    h_in: Vec<f32>,
    /// The residual [T, hidden] the fused combine adds into (non-zero).
    x0: Vec<f32>,
    step: GpuBuffer,
    ids_b: GpuBuffer,
    slot_b: GpuBuffer,
    w_b: GpuBuffer,
    x_b: GpuBuffer,
    h_b: GpuBuffer,
    dummy: GpuBuffer,
    /// The kernels MoeDispatch picked on this device.
    kernels: String,
}

/// Keep only the ops of `chunks` from a program holding one op per pool chunk.
fn keep_chunks(prog: &mut Program, n_chunks: usize, chunks: &[usize]) {
    assert_eq!(
        prog.ops.len(),
        n_chunks,
        "MoeDispatch: one op per pool chunk expected"
    );
    let ops = std::mem::take(&mut prog.ops);
    prog.ops = ops
        .into_iter()
        .enumerate()
        .filter(|(i, _)| chunks.contains(i))
        .map(|(_, op)| op)
        .collect();
}

impl<'a> Setup<'a> {
    /// Random slots.
    fn random(ctx: &'a GpuContext, seed: u64, c: Case) -> Self {
        let mut rng = Rng::new(seed);
        let layout = Q4SlotLayout::new(c.hidden, c.inter);
        let host = (0..c.slots)
            .map(|_| random_slot(&mut rng, &layout))
            .collect();
        Self::with_slots(ctx, &mut rng, c, host, 1.0)
    }

    /// `host[s]` = the bytes of pool slot s; activations uniform in [-x_scale, x_scale).
    fn with_slots(
        ctx: &'a GpuContext,
        rng: &mut Rng,
        c: Case,
        host: Vec<Vec<u8>>,
        x_scale: f32,
    ) -> Self {
        let layout = Q4SlotLayout::new(c.hidden, c.inter);
        assert_eq!(host.len(), c.slots);
        let pool = Q4Pool::new(ctx, "q4_pool", c.slots, layout).unwrap();
        for (s, bytes) in host.iter().enumerate() {
            pool.write_slot(ctx, s, bytes);
        }
        let slot_of = rng.permutation(c.slots)[..c.n_experts].to_vec();
        let ids: Vec<u32> = (0..c.t)
            .flat_map(|_| {
                rng.permutation(c.n_experts)[..c.top_k]
                    .iter()
                    .map(|&e| e as u32)
                    .collect::<Vec<_>>()
            })
            .collect();
        let weights: Vec<f32> = (0..c.t * c.top_k).map(|_| 0.5 + rng.f32(0.5)).collect();
        let xs = rng.vec(c.t * c.hidden, x_scale);
        let h_in = rng.vec(c.t * c.top_k * c.inter, x_scale);
        let x0 = rng.vec(c.t * c.hidden, 2.0);
        let mut s = Setup {
            ctx,
            c,
            layout,
            store: ExpertStore::Int4(pool),
            host,
            step: step_buf(ctx, 0, c.t),
            ids_b: u32_buf(ctx, &ids),
            slot_b: u32_buf(ctx, &slot_of.iter().map(|&s| s as u32).collect::<Vec<_>>()),
            w_b: f32_buf(ctx, &weights),
            x_b: f32_buf(ctx, &xs),
            h_b: f32_buf(ctx, &h_in),
            dummy: f32_buf(ctx, &[0.0; 4]),
            kernels: String::new(),
            slot_of,
            ids,
            weights,
            xs,
            h_in,
            x0,
        };
        let mut prog = Program::default();
        let d = s.moe(&s.dummy, &s.dummy, &s.dummy, &s.dummy);
        d.q4_gate_up(&mut prog, s.pool(), &s.slot_b, (0, 1));
        d.q4_down(&mut prog, s.pool(), &s.slot_b, None);
        let n = s.pool().chunks.len();
        s.kernels = format!(
            "{} + {}",
            prog.ops[0].kernel.name(),
            prog.ops[n].kernel.name()
        );
        s
    }

    /// Replace the gate_up input.
    fn set_x(&mut self, xs: Vec<f32>) {
        assert_eq!(xs.len(), self.c.t * self.c.hidden);
        self.x_b = f32_buf(self.ctx, &xs);
        self.xs = xs;
    }

    fn pool(&self) -> &Q4Pool {
        match &self.store {
            ExpertStore::Int4(p) => p,
            ExpertStore::F16(_) => unreachable!(),
        }
    }

    fn what(&self) -> String {
        let c = &self.c;
        format!(
            "[{}] H {} I {} T {} top {} of {} experts in {} slots, {} chunks",
            self.kernels,
            c.hidden,
            c.inter,
            c.t,
            c.top_k,
            c.n_experts,
            c.slots,
            self.pool().chunks.len()
        )
    }

    fn all_chunks(&self) -> Vec<usize> {
        (0..self.pool().chunks.len()).collect()
    }

    /// Pool slot of top-k index j of token t.
    fn slot(&self, t: usize, j: usize) -> usize {
        self.slot_of[self.ids[t * self.c.top_k + j] as usize]
    }

    fn chunk_of(&self, slot: usize) -> usize {
        slot / self.pool().slots_per_chunk
    }

    /// The forward pass's expert dispatches over these buffers: gate_up reads `xn` and
    /// writes `h`; down reads `h` and writes `y` (per slot) or adds into `x` (fused).
    fn moe<'b>(
        &'b self,
        xn: &'b wgpu::Buffer,
        h: &'b wgpu::Buffer,
        y: &'b wgpu::Buffer,
        x: &'b wgpu::Buffer,
    ) -> MoeDispatch<'b> {
        MoeDispatch {
            sorted: None,
            fuse_combine: true,
            decode_uniform: false,
            ctx: self.ctx,
            step: &self.step,
            hidden: self.c.hidden,
            top_k: self.c.top_k,
            dummy: &self.dummy,
            xn,
            topk_ids: &self.ids_b,
            topk_w: &self.w_b,
            hbuf: h,
            y,
            x,
        }
    }

    /// gate_up over `x` and the pool's `chunks` into a NaN-filled h; returns h [T, top_k, inter].
    fn gpu_gate_up_on(&self, x: &wgpu::Buffer, chunks: &[usize]) -> Vec<f32> {
        let c = self.c;
        let n = c.t * c.top_k * c.inter;
        let h = f32_buf(self.ctx, &vec![f32::NAN; n]);
        let mut prog = Program::default();
        self.moe(x, &h, &self.dummy, &self.dummy).q4_gate_up(
            &mut prog,
            self.pool(),
            &self.slot_b,
            (0, c.top_k),
        );
        keep_chunks(&mut prog, self.pool().chunks.len(), chunks);
        run(self.ctx, &prog, c.t);
        read_f32(self.ctx, &h, n)
    }

    fn gpu_gate_up(&self, chunks: &[usize]) -> Vec<f32> {
        self.gpu_gate_up_on(&self.x_b, chunks)
    }

    /// down per slot over `chunks` on `h` into a NaN-filled y; returns y [T, top_k, hidden].
    fn gpu_down(&self, h: &wgpu::Buffer, chunks: &[usize]) -> Vec<f32> {
        let c = self.c;
        let n = c.t * c.top_k * c.hidden;
        let y = f32_buf(self.ctx, &vec![f32::NAN; n]);
        let mut prog = Program::default();
        self.moe(&self.dummy, h, &y, &self.dummy).q4_down(
            &mut prog,
            self.pool(),
            &self.slot_b,
            Some((0, c.top_k)),
        );
        keep_chunks(&mut prog, self.pool().chunks.len(), chunks);
        run(self.ctx, &prog, c.t);
        read_f32(self.ctx, &y, n)
    }

    /// The fused combine over `chunks` on `h`, x starting at x0; returns x [T, hidden].
    fn gpu_fused(&self, h: &wgpu::Buffer, chunks: &[usize]) -> Vec<f32> {
        let c = self.c;
        let x = f32_buf(self.ctx, &self.x0);
        let mut prog = Program::default();
        self.moe(&self.dummy, h, &self.dummy, &x).q4_down(
            &mut prog,
            self.pool(),
            &self.slot_b,
            None,
        );
        keep_chunks(&mut prog, self.pool().chunks.len(), chunks);
        run(self.ctx, &prog, c.t);
        read_f32(self.ctx, &x, c.t * c.hidden)
    }

    fn want_gate_up(&self) -> Vec<f32> {
        let (hid, k) = (self.c.hidden, self.c.top_k);
        let mut want = Vec::new();
        for t in 0..self.c.t {
            for j in 0..k {
                let xr = &self.xs[t * hid..(t + 1) * hid];
                want.extend(
                    cpu_ref::w4a16_gate_up(xr, &self.layout, &self.host[self.slot(t, j)]).unwrap(),
                );
            }
        }
        want
    }

    fn want_down(&self, h: &[f32]) -> Vec<f32> {
        let (inter, k) = (self.c.inter, self.c.top_k);
        let mut want = Vec::new();
        for t in 0..self.c.t {
            for j in 0..k {
                let hr = &h[(t * k + j) * inter..][..inter];
                want.extend(
                    cpu_ref::w4a16_down(hr, &self.layout, &self.host[self.slot(t, j)]).unwrap(),
                );
            }
        }
        want
    }

    /// x0 plus the weighted outputs of the experts whose slot lies in one of `chunks`.
    fn want_fused(&self, h: &[f32], chunks: &[usize]) -> Vec<f32> {
        let k = self.c.top_k;
        let slots: Vec<Option<&[u8]>> = (0..self.c.t * k)
            .map(|i| {
                let s = self.slot(i / k, i % k);
                chunks
                    .contains(&self.chunk_of(s))
                    .then_some(&self.host[s][..])
            })
            .collect();
        cpu_ref::w4a16_down_combine(&self.x0, h, &self.weights, k, &self.layout, &slots).unwrap()
    }
}

/// (hidden, inter, experts, slots, top_k, T): in-dims (hidden for gate/up, inter for
/// down) below one block, exactly one, and with a partial last block (257, 300,
/// 1408 = 5 * 256 + 128, 2056 = 2048 + 8); out-dims not multiples of 64; top_k 1..8;
/// T 1 and 5; always more slots than experts or a permuted table.
const SHAPES: [Case; 16] = [
    case(1, 65, 3, 4, 1, 1),
    case(7, 3, 5, 7, 2, 5),
    case(31, 320, 4, 6, 3, 1),
    case(32, 1, 8, 9, 8, 5),
    case(33, 96, 6, 8, 4, 5),
    case(64, 7, 5, 5, 5, 1),
    case(96, 31, 7, 9, 6, 5),
    case(100, 256, 4, 5, 2, 5),
    case(256, 100, 7, 8, 7, 1),
    case(257, 33, 9, 12, 8, 5),
    case(300, 64, 5, 7, 3, 5),
    case(1408, 65, 4, 6, 4, 5),
    case(2056, 320, 8, 10, 8, 5),
    case(65, 1408, 3, 4, 2, 5),
    case(3, 2056, 2, 3, 2, 1),
    case(257, 300, 4, 5, 3, 5),
];

// ---------------------------------------------------------------------------------------------
// 1. gate_up

#[test]
fn w4a16_gate_up_matches_cpu() {
    for portable in VARIANTS {
        let ctx = gpu(None, portable);
        for (i, &c) in SHAPES.iter().enumerate() {
            let s = Setup::random(&ctx, 100 + i as u64, c);
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
    for portable in VARIANTS {
        let ctx = gpu(None, portable);
        for (i, &c) in SHAPES.iter().enumerate() {
            let s = Setup::random(&ctx, 200 + i as u64, c);
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
    for portable in VARIANTS {
        // (case, slots per chunk): 4 chunks of 3 + 3 + 3 + 1; 4 of 2; 6 of 1.
        let cases = [
            (case(300, 65, 7, 10, 4, 5), 3),
            (case(33, 320, 8, 8, 8, 5), 2),
            (case(257, 3, 5, 6, 5, 1), 1),
            (case(96, 1408, 5, 7, 3, 5), 2),
        ];
        for (i, &(c, per_chunk)) in cases.iter().enumerate() {
            let bytes = Q4SlotLayout::new(c.hidden, c.inter).bytes as u64;
            let ctx = gpu(Some(per_chunk * bytes), portable);
            let s = Setup::random(&ctx, 300 + i as u64, c);
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
    let (c, ctx) = (s.c, s.ctx);
    let (k, t) = (c.top_k, c.t);
    let what = s.what();
    let nh = t * k * c.inter;
    let ny = t * k * c.hidden;

    // Grouped: h and the fused combine; then, for comparison, y per slot from that h.
    let hg = f32_buf(ctx, &vec![f32::NAN; nh]);
    let yg = f32_buf(ctx, &vec![f32::NAN; ny]);
    let xg = f32_buf(ctx, &s.x0);
    let mut grouped = Program::default();
    let flags =
        s.moe(&s.x_b, &hg, &yg, &xg)
            .routed(&mut grouped, Executor::Grouped, &s.store, &s.slot_b);
    assert_eq!(
        flags, 0,
        "grouped INT4: the combine is fused, nothing left for moe_combine"
    );
    run(ctx, &grouped, t);
    let mut ys = Program::default();
    s.moe(&s.x_b, &hg, &yg, &xg)
        .q4_down(&mut ys, s.pool(), &s.slot_b, Some((0, k)));
    run(ctx, &ys, t);

    // Per expert: one top-k index per dispatch, gate_up and down interleaved on one h
    // (NaN where not written yet), then moe_combine.
    let hp = f32_buf(ctx, &vec![f32::NAN; nh]);
    let yp = f32_buf(ctx, &vec![f32::NAN; ny]);
    let xp = f32_buf(ctx, &s.x0);
    let mut per = Program::default();
    let flags =
        s.moe(&s.x_b, &hp, &yp, &xp)
            .routed(&mut per, Executor::PerExpert, &s.store, &s.slot_b);
    assert_eq!(flags, combine_flags::ROUTED);
    assert_eq!(
        per.ops.len(),
        2 * k * s.pool().chunks.len(),
        "per expert: gate_up and down per j and chunk"
    );
    per.push(
        ctx,
        Kernel::MoeCombine,
        &MoeCombineParams {
            hidden: c.hidden as u32,
            top_k: k as u32,
            flags,
            ..Default::default()
        },
        &s.step,
        &[&yp, &s.w_b, &s.dummy, &s.dummy, &xp],
        [Dim::Const(groups64(c.hidden)), Dim::Tokens, Dim::Const(1)],
    );
    run(ctx, &per, t);

    let (hg, hp) = (read_f32(ctx, &hg, nh), read_f32(ctx, &hp, nh));
    let (yg, yp) = (read_f32(ctx, &yg, ny), read_f32(ctx, &yp, ny));
    let (xg, xp) = (
        read_f32(ctx, &xg, t * c.hidden),
        read_f32(ctx, &xp, t * c.hidden),
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
    for portable in VARIANTS {
        let ctx = gpu(None, portable);
        for (i, c) in [
            case(300, 65, 7, 9, 4, 5),
            case(2056, 96, 8, 8, 8, 5),
            case(33, 257, 5, 6, 1, 1),
        ]
        .into_iter()
        .enumerate()
        {
            per_expert_case(&Setup::random(&ctx, 400 + i as u64, c));
        }
        let c = case(257, 100, 7, 10, 6, 5);
        let ctx = gpu(
            Some(3 * Q4SlotLayout::new(c.hidden, c.inter).bytes as u64),
            portable,
        );
        let s = Setup::random(&ctx, 410, c);
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
    for portable in VARIANTS {
        let ctx = gpu(None, portable);
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
        let mut s = Setup::with_slots(&ctx, &mut rng, c, host, 1.0);
        let mut xs = s.xs.clone();
        for t in 0..c.t {
            xs[t * hid + 5] *= 20.0;
            xs[t * hid + 300] *= -15.0;
        }
        s.set_x(xs.clone());
        let (k, t) = (c.top_k, c.t);
        let h = f32_buf(&ctx, &vec![f32::NAN; t * k * inter]);
        let x = f32_buf(&ctx, &s.x0);
        let mut prog = Program::default();
        let flags = s.moe(&s.x_b, &h, &s.dummy, &x).routed(
            &mut prog,
            Executor::Grouped,
            &s.store,
            &s.slot_b,
        );
        assert_eq!(flags, 0);
        run(&ctx, &prog, t);
        let got_h = read_f32(&ctx, &h, t * k * inter);
        let got_x = read_f32(&ctx, &x, t * hid);

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
    for portable in VARIANTS {
        let ctx = gpu(None, portable);
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
        let s = Setup::with_slots(&ctx, &mut rng, c, host, 1000.0);
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
    for portable in VARIANTS {
        let ctx = gpu(None, portable);
        for (i, c) in [case(33, 65, 4, 5, 3, 5), case(300, 100, 4, 4, 2, 1)]
            .into_iter()
            .enumerate()
        {
            let s = Setup::random(&ctx, 700 + i as u64, c);
            let x_nan = f32_buf(&ctx, &with_nan_tail(&s.xs));
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
    for portable in VARIANTS {
        let ctx = gpu(None, portable);
        for (i, c) in [case(33, 65, 4, 5, 3, 5), case(100, 300, 4, 4, 2, 1)]
            .into_iter()
            .enumerate()
        {
            let s = Setup::random(&ctx, 710 + i as u64, c);
            let h_nan = f32_buf(&ctx, &with_nan_tail(&s.h_in));
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

/// A zero-filled buffer usable as storage and as the decode kernels' 64 KiB uniform window.
fn uniform_capable(ctx: &GpuContext, data: &[f32]) -> GpuBuffer {
    let b = ctx.buffer(
        "uniform_act",
        (data.len() * 4).max(UNIFORM_ACTIVATION_BYTES) as u64,
        wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::UNIFORM
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC,
    );
    ctx.write(&b, 0, bytemuck::cast_slice(data));
    b
}

/// The one-token decode kernels (activations in a uniform window, ffn_*_q4_u.wgsl) run the
/// same arithmetic in the same order as the portable kernels, which are checked against
/// the CPU reference above: their outputs must be bit-identical, for both executors, with
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
        let ctx = gpu(cap, true);
        let layout = Q4SlotLayout::new(h, i);
        let mut rng = Rng::new((h * 31 + i) as u64);
        let pool = Q4Pool::new(&ctx, "experts", e, layout).unwrap();
        for s in 0..e {
            pool.write_slot(&ctx, s, &random_slot(&mut rng, &layout));
        }
        let store = ExpertStore::Int4(pool);
        let perm: Vec<u32> = rng.permutation(e).iter().map(|&p| p as u32).collect();
        let ids: Vec<u32> = perm[..k].to_vec();
        let slot_of = u32_buf(
            &ctx,
            &rng.permutation(e)
                .iter()
                .map(|&p| p as u32)
                .collect::<Vec<_>>(),
        );
        let xv = rng.vec(h, 1.0);
        let w: Vec<f32> = (0..k).map(|_| rng.f32(1.0)).collect();
        let x0 = rng.vec(h, 1.0);
        let step = step_buf(&ctx, 0, 1);
        let dummy = f32_buf(&ctx, &[0.0; 4]);
        let topk_ids = u32_buf(&ctx, &ids);
        let topk_w = f32_buf(&ctx, &w);
        let mut outs = Vec::new();
        for uniform in [false, true] {
            for executor in [Executor::Grouped, Executor::PerExpert] {
                let xn = uniform_capable(&ctx, &xv);
                let hbuf = uniform_capable(&ctx, &vec![0.0; k * i]);
                let y = f32_buf(&ctx, &vec![0.0; k * h]);
                let x = f32_buf(&ctx, &x0);
                let moe = MoeDispatch {
                    sorted: None,
                    fuse_combine: true,
                    decode_uniform: uniform,
                    ctx: &ctx,
                    step: &step,
                    hidden: h,
                    top_k: k,
                    dummy: &dummy,
                    xn: &xn,
                    topk_ids: &topk_ids,
                    topk_w: &topk_w,
                    hbuf: &hbuf,
                    y: &y,
                    x: &x,
                };
                let mut prog = Program::default();
                let _ = moe.routed(&mut prog, executor, &store, &slot_of);
                run(&ctx, &prog, 1);
                outs.push((
                    uniform,
                    executor,
                    read_f32(&ctx, &hbuf, k * i),
                    read_f32(&ctx, &y, k * h),
                    read_f32(&ctx, &x, h),
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

/// The f16-arithmetic W4A16 kernels (ffn_*_q4_sg_h.wgsl, the GPU default where SHADER_F16
/// exists) against the f32 subgroup kernels, which are checked against the CPU reference
/// above. Only the products and the 4-term sums of each nibble half-word are f16
/// (activations rounded to 11 bits, then each 4-product sum rounded again, up to 8 |x| in
/// magnitude); every longer sum is f32. With the cancellation of 256-input blocks of
/// random signs and the SiLU product that allows about 1e-2 relative (measured worst on
/// lavapipe: 7e-3).
const F16_ARITH_TOL: f32 = 1.5e-2;

#[test]
fn w4a16_f16_arithmetic_matches_f32_kernels() {
    common::init_env();
    let ctx = |f16: bool| {
        GpuContext::new(&AdapterRequest {
            f16_arithmetic: Some(f16),
            uniform_decode: Some(false),
            ..Default::default()
        })
        .unwrap()
    };
    let (c32, c16) = (ctx(false), ctx(true));
    assert!(
        c16.kernels.uses_f16_arithmetic(),
        "lavapipe has SHADER_F16 and subgroups: the f16 kernels must be built"
    );
    assert!(!c32.kernels.uses_f16_arithmetic());
    for &(h, i, e, k, t) in &[
        (64usize, 96usize, 7usize, 3usize, 1usize),
        (256, 320, 6, 3, 5),
        (300, 1412, 9, 4, 2),
        (2048, 1408, 8, 4, 1),
    ] {
        let mut outs = Vec::new();
        for c in [&c32, &c16] {
            let layout = Q4SlotLayout::new(h, i);
            let mut rng = Rng::new((h * 7 + i) as u64);
            let pool = Q4Pool::new(c, "experts", e, layout).unwrap();
            for sl in 0..e {
                pool.write_slot(c, sl, &random_slot(&mut rng, &layout));
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
            let slot_of = u32_buf(c, &(0..e as u32).collect::<Vec<_>>());
            let xn = f32_buf(c, &rng.vec(t * h, 1.0));
            let w: Vec<f32> = (0..t * k).map(|_| rng.f32(1.0)).collect();
            let x = f32_buf(c, &rng.vec(t * h, 1.0));
            let step = step_buf(c, 0, t);
            let dummy = f32_buf(c, &[0.0; 4]);
            let (topk_ids, topk_w) = (u32_buf(c, &ids), f32_buf(c, &w));
            let hbuf = f32_buf(c, &vec![0.0; t * k * i]);
            let y = f32_buf(c, &vec![0.0; t * k * h]);
            let moe = MoeDispatch {
                sorted: None,
                fuse_combine: true,
                decode_uniform: false,
                ctx: c,
                step: &step,
                hidden: h,
                top_k: k,
                dummy: &dummy,
                xn: &xn,
                topk_ids: &topk_ids,
                topk_w: &topk_w,
                hbuf: &hbuf,
                y: &y,
                x: &x,
            };
            let mut prog = Program::default();
            let _ = moe.routed(&mut prog, Executor::Grouped, &store, &slot_of);
            run(c, &prog, t);
            outs.push((read_f32(c, &hbuf, t * k * i), read_f32(c, &x, t * h)));
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
// 8. Expert-major kernels (multi-token steps on CPU adapters): sort, gather, gate/up, down

/// Sort, gather, gate/up and down chained, against the CPU reference chained the same way
/// (the sum of two kernels' rounding, hence twice the single-kernel tolerance).
const EXPERT_MAJOR_TOL: f32 = 4e-5;

impl Setup<'_> {
    /// The expert-major path on the step's T tokens: returns (pairs buffer, y [T, k, H]).
    fn gpu_expert_major(&self) -> (Vec<u32>, Vec<f32>) {
        let c = self.c;
        let sorted = wgmoe::model::moe::MoeSorted::new(
            self.ctx,
            c.t,
            c.top_k,
            c.n_experts,
            c.hidden,
            c.inter,
        );
        let n = c.t * c.top_k * c.hidden;
        let y = f32_buf(self.ctx, &vec![f32::NAN; n]);
        let mut d = self.moe(&self.x_b, &self.dummy, &y, &self.dummy);
        d.sorted = Some(&sorted);
        let mut prog = Program::default();
        d.q4_expert_major(&mut prog, self.pool(), &self.slot_b);
        run(self.ctx, &prog, c.t);
        let pairs: Vec<u32> = bytemuck::pod_collect_to_vec(
            &self
                .ctx
                .read_back(
                    &sorted.pairs,
                    0,
                    ((2 * c.t * c.top_k + c.n_experts) * 4) as u64,
                )
                .unwrap(),
        );
        (pairs, read_f32(self.ctx, &y, n))
    }
}

#[test]
fn w4a16_expert_major_matches_cpu() {
    let ctx = gpu(None, false);
    assert!(
        ctx.kernels.uses_subgroups(),
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
        let s = Setup::random(&ctx, 900 + i as u64, c);
        let (pairs, y) = s.gpu_expert_major();
        let np = c.t * c.top_k;
        // A stable counting sort by expert: pairs in (expert, token, j) order.
        let mut want: Vec<u32> = (0..np as u32).collect();
        want.sort_by_key(|&q| s.ids[q as usize]);
        assert_eq!(&pairs[..np], &want[..], "sorted pairs, case {c:?}");
        let experts: Vec<u32> = want.iter().map(|&q| s.ids[q as usize]).collect();
        assert_eq!(&pairs[np..2 * np], &experts[..], "pair experts, case {c:?}");
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
        let ctx = gpu(Some((per_chunk * l.bytes) as u64), false);
        let s = Setup::random(&ctx, 990 + c.hidden as u64, c);
        assert!(s.pool().chunks.len() > 1, "{}", s.what());
        let (_, y) = s.gpu_expert_major();
        let h = s.want_gate_up();
        check(
            &format!("expert-major split {}", s.what()),
            &y,
            &s.want_down(&h),
            EXPERT_MAJOR_TOL,
        );
    }
}

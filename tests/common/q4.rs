//! The W4A16 expert tests' harness (tests/kernels_q4.rs, tests/kernels_q4_variants.rs):
//! random packed slots, and one routed MoE layer's worth of INT4 experts on the device,
//! dispatched by the forward pass's own `MoeDispatch` (one op per pool chunk) over a slot
//! table that maps expert ids to permuted pool slots, the extra slots holding unrelated
//! experts.
//!
//! Random slots hold random nibbles (all 16 values, -8 included) and random f16 scales
//! (some zero) at the places `Q4Matrix::pack` writes real weights, found by packing an
//! all-ones matrix, so the tests follow the layout wherever src/blocks/quant.rs puts it; padding
//! nibbles stay 8 and unused scale halves are f16 NaN, so a kernel that reads a scale it
//! should not turns its output into NaN.

use half::f16;

use super::gpu::*;
use super::rng::Rng;
use wgmoe::backend::plan::DecodeKernels;
use wgmoe::backend::{Buffer, KernelOverrides, Program};
use wgmoe::blocks::quant::{Q4Kind, Q4Matrix, Q4SlotLayout};
use wgmoe::cpu_ref;
use wgmoe::model::moe::{Executor, MoeDispatch, MoePairs, MoeSorted};
use wgmoe::model::tensors::{ExpertStore, Q4Pool};
use wgmoe::model::workspace::{workspace, WorkspaceShape};

/// The kernels sum in f32 (dot4 pairs, then 256-input block sums, one scale multiply per
/// block) what the reference sums in f64; up to 2056 terms per output, plus exp in silu
/// and, fused, up to 8 weighted terms and the residual. As MATMUL_TOL / FFN_TOL.
pub const Q4_TOL: f32 = 2e-5;

/// The kernel choices each W4A16 kernel test runs: the portable kernels, the device's own
/// choice (the subgroup kernels where the adapter has subgroups of at least 8 lanes; the
/// portable ones again elsewhere), and the GPU-shaped row kernels (the decode kernels on
/// GPUs), reducing through subgroups and through workgroup memory.
pub const VARIANTS: [KernelOverrides; 4] = [
    KernelOverrides {
        portable: true,
        decode: None,
        prefill: None,
        f16_arithmetic: None,
    },
    KernelOverrides {
        portable: false,
        decode: None,
        prefill: None,
        f16_arithmetic: None,
    },
    KernelOverrides {
        portable: false,
        decode: Some(DecodeKernels::Coalesced),
        prefill: None,
        f16_arithmetic: None,
    },
    KernelOverrides {
        portable: true,
        decode: Some(DecodeKernels::Coalesced),
        prefill: None,
        f16_arithmetic: None,
    },
];

const F16_NAN: [u8; 2] = [0x00, 0x7E];

/// Random nibbles (all 16 values) and scales (about 1 in 16 exactly zero, the rest in
/// [0.002, 0.06)) for one [out, in] matrix, at the places where `Q4Matrix::pack` puts
/// real weights: packing all-ones makes every real nibble 15 (q = 7) and every real scale
/// f16(1/7), and leaves padding nibbles 8 and unused scale bytes 0. Padding stays 8; unused
/// scale halves become NaN.
pub fn random_matrix(rng: &mut Rng, m: Q4Matrix) -> (Vec<u8>, Vec<u8>) {
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

/// Random nibbles as `random_matrix` (the nibble layout is the same for both kinds) and,
/// for an affine matrix (`Q4Kind::Affine32`), per 32-column block a random scale (about 1
/// in 16 zero) and a random offset in [-0.1, 0.1); the scale section's padding halves NaN.
pub fn random_affine_matrix(rng: &mut Rng, m: Q4Matrix) -> (Vec<u8>, Vec<u8>) {
    assert_eq!(m.kind, Q4Kind::Affine32);
    let (q, _) = random_matrix(rng, Q4Matrix::sym(m.out, m.inp));
    let mut s = vec![0u8; m.scale_bytes()];
    let real = m.out * m.halves_per_row();
    for (i, half) in s.chunks_exact_mut(2).enumerate() {
        let v = if i >= real {
            f16::from_le_bytes(F16_NAN)
        } else if i % 2 == 1 {
            f16::from_f32(rng.f32(0.1))
        } else if rng.below(16) == 0 {
            f16::ZERO
        } else {
            f16::from_f32(0.031 + rng.f32(0.029))
        };
        half.copy_from_slice(&v.to_le_bytes());
    }
    (q, s)
}

/// A random Q8_0 matrix (`Q4Kind::Q8`): quants in -127..=127 at real columns, 0 in the
/// row padding; per 32-column block a random scale (about 1 in 16 zero), the scale
/// section's padding halves NaN.
pub fn random_q8_matrix(rng: &mut Rng, m: Q4Matrix) -> (Vec<u8>, Vec<u8>) {
    assert_eq!(m.kind, Q4Kind::Q8);
    let row = m.vec4_per_row() * 16;
    let mut q = vec![0u8; m.q_bytes()];
    for n in 0..m.out {
        for k in 0..m.inp {
            q[n * row + k] = (rng.below(255) as i32 - 127) as i8 as u8;
        }
    }
    let mut s = vec![0u8; m.scale_bytes()];
    let real = m.out * m.halves_per_row();
    for (i, half) in s.chunks_exact_mut(2).enumerate() {
        let v = if i >= real {
            f16::from_le_bytes(F16_NAN)
        } else if rng.below(16) == 0 {
            f16::ZERO
        } else {
            f16::from_f32(0.002 + rng.f32(0.0018))
        };
        half.copy_from_slice(&v.to_le_bytes());
    }
    (q, s)
}

/// Random rows of a K-plane kind (`wgmoe::blocks::kquant`): nibbles 0..=15 and random
/// high bits; per record finite scales (about 1 in 16 records with d = 0) giving values of
/// about +-0.6 times `mag(row)`, the scale bytes random. A record's unused half (Q6_K's
/// word after d) is f16 NaN: a kernel that reads it turns its output into NaN.
pub fn random_krows(
    rng: &mut Rng,
    kind: Q4Kind,
    rows: usize,
    cols: usize,
    mag: impl Fn(usize) -> f32,
) -> wgmoe::blocks::kquant::KRows {
    use wgmoe::blocks::kquant::{record_words, KRows};
    assert!(kind.is_planes());
    let h = |v: f32| u32::from(f16::from_f32(v).to_bits());
    let nan = u32::from(u16::from_le_bytes(F16_NAN));
    let nibbles = (0..rows * cols).map(|_| rng.below(16) as u8).collect();
    let blocks = cols.div_ceil(kind.block());
    let mut side = Vec::new();
    for r in 0..rows * blocks {
        let m = mag(r / blocks);
        let mut rec: Vec<u32> = (0..record_words(kind))
            .map(|_| rng.next_u64() as u32)
            .collect();
        let zero = rng.below(16) == 0;
        match kind {
            Q4Kind::Q4K | Q4Kind::Q5K => {
                let d = if zero { 0.0 } else { 0.0002 + rng.f32(0.0001) };
                rec[0] = h(d * m) | h((0.0002 + rng.f32(0.0001)) * m) << 16;
            }
            Q4Kind::Q6K => {
                let d = if zero { 0.0 } else { 0.0001 + rng.f32(0.00005) };
                rec[4] = h(d * m) | nan << 16;
            }
            _ => {
                let sc = if zero { 0.0 } else { 0.015 + rng.f32(0.005) };
                rec[0] = h(sc * m) | h(rng.f32(0.3) * m) << 16;
            }
        }
        side.extend(rec);
    }
    KRows {
        kind,
        cols,
        nibbles,
        side,
    }
}

/// `random_krows` packed as one matrix; the scale section's padding halves past the rows'
/// records are f16 NaN.
pub fn random_planes_matrix(rng: &mut Rng, m: Q4Matrix) -> (Vec<u8>, Vec<u8>) {
    let r = random_krows(rng, m.kind, m.out, m.inp, |_| 1.0);
    let (mut q, mut s) = (vec![0u8; m.q_bytes()], vec![0u8; m.scale_bytes()]);
    m.pack_planes(&r, &mut q, &mut s);
    for half in s[4 * r.side.len()..].chunks_exact_mut(2) {
        half.copy_from_slice(&F16_NAN);
    }
    (q, s)
}

/// One slot of random gate, up and down sections.
pub fn random_slot(rng: &mut Rng, l: &Q4SlotLayout) -> Vec<u8> {
    let mut slot = vec![0u8; l.bytes];
    for (m, q_at, s_at) in [
        (l.gate, l.gate_q, l.gate_s),
        (l.gate, l.up_q, l.up_s),
        (l.down, l.down_q, l.down_s),
    ] {
        let (q, s) = match m.kind {
            Q4Kind::Sym256 => random_matrix(rng, m),
            Q4Kind::Affine32 => random_affine_matrix(rng, m),
            Q4Kind::Q8 => random_q8_matrix(rng, m),
            _ => random_planes_matrix(rng, m),
        };
        slot[q_at..q_at + q.len()].copy_from_slice(&q);
        slot[s_at..s_at + s.len()].copy_from_slice(&s);
    }
    slot
}

#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub hidden: usize,
    pub inter: usize,
    pub n_experts: usize,
    /// Pool slots (>= n_experts); the slots no expert maps to hold unrelated experts.
    pub slots: usize,
    pub top_k: usize,
    pub t: usize,
}

pub const fn case(
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

/// (hidden, inter, experts, slots, top_k, T): in-dims (hidden for gate/up, inter for
/// down) below one block, exactly one, and with a partial last block (257, 300,
/// 1408 = 5 * 256 + 128, 2056 = 2048 + 8); out-dims not multiples of 64; top_k 1..8;
/// T 1 and 5; always more slots than experts or a permuted table.
pub const SHAPES: [Case; 16] = [
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

pub struct Setup<'a> {
    pub g: &'a Gpu,
    pub c: Case,
    pub layout: Q4SlotLayout,
    /// The pool, as the forward pass holds it.
    pub store: ExpertStore,
    /// Host copy of each pool slot's bytes.
    pub host: Vec<Vec<u8>>,
    /// Expert id -> pool slot (a permutation, not the identity).
    pub slot_of: Vec<usize>,
    pub ids: Vec<u32>,
    pub weights: Vec<f32>,
    /// gate_up input [T, hidden].
    pub xs: Vec<f32>,
    /// down input [T, top_k, inter].
    pub h_in: Vec<f32>,
    /// The residual [T, hidden] the fused combine adds into (non-zero).
    pub x0: Vec<f32>,
    pub step: Buffer,
    pub ids_b: Buffer,
    pub slot_b: Buffer,
    pub w_b: Buffer,
    pub x_b: Buffer,
    pub h_b: Buffer,
    pub dummy: Buffer,
    /// The kernels MoeDispatch picked on this device.
    pub kernels: String,
}

/// Keep only the ops of `chunks` from a program holding one op per pool chunk.
pub fn keep_chunks(prog: &mut Program, n_chunks: usize, chunks: &[usize]) {
    assert_eq!(
        prog.ops.len(),
        n_chunks,
        "MoeDispatch: one op per pool chunk expected"
    );
    keep_ops(prog, |i, _| chunks.contains(&i));
}

impl<'a> Setup<'a> {
    /// Random slots.
    pub fn random(g: &'a Gpu, seed: u64, c: Case) -> Self {
        Self::random_kind(g, seed, c, Q4Kind::Sym256)
    }

    /// Random slots of `kind`.
    pub fn random_kind(g: &'a Gpu, seed: u64, c: Case, kind: Q4Kind) -> Self {
        Self::random_mixed(g, seed, c, kind, kind)
    }

    /// Random slots of gate/up kind `gate_up` and down kind `down` (`Q4SlotLayout::mixed`).
    pub fn random_mixed(g: &'a Gpu, seed: u64, c: Case, gate_up: Q4Kind, down: Q4Kind) -> Self {
        let mut rng = Rng::new(seed);
        let layout = Q4SlotLayout::mixed(c.hidden, c.inter, gate_up, down);
        let host = (0..c.slots)
            .map(|_| random_slot(&mut rng, &layout))
            .collect();
        Self::with_layout(g, &mut rng, c, layout, host, 1.0)
    }

    /// `host[s]` = the bytes of pool slot s; activations uniform in [-x_scale, x_scale).
    pub fn with_slots(
        g: &'a Gpu,
        rng: &mut Rng,
        c: Case,
        host: Vec<Vec<u8>>,
        x_scale: f32,
    ) -> Self {
        Self::with_layout(
            g,
            rng,
            c,
            Q4SlotLayout::new(c.hidden, c.inter),
            host,
            x_scale,
        )
    }

    /// `with_slots` for slots of `layout`.
    pub fn with_layout(
        g: &'a Gpu,
        rng: &mut Rng,
        c: Case,
        layout: Q4SlotLayout,
        host: Vec<Vec<u8>>,
        x_scale: f32,
    ) -> Self {
        let dev = &g.dev;
        assert_eq!(host.len(), c.slots);
        let pool = Q4Pool::new(dev, "q4_pool", c.slots, layout).unwrap();
        for (s, bytes) in host.iter().enumerate() {
            pool.write_slot(dev, s, bytes).unwrap();
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
            g,
            c,
            layout,
            store: ExpertStore::Int4(pool),
            host,
            step: dev.step_buffer(0, c.t).unwrap(),
            ids_b: u32_buf(dev, &ids),
            slot_b: u32_buf(dev, &slot_of.iter().map(|&s| s as u32).collect::<Vec<_>>()),
            w_b: f32_buf(dev, &weights),
            x_b: f32_buf(dev, &xs),
            h_b: f32_buf(dev, &h_in),
            dummy: f32_buf(dev, &[0.0; 4]),
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
    pub fn set_x(&mut self, xs: Vec<f32>) {
        assert_eq!(xs.len(), self.c.t * self.c.hidden);
        self.x_b = f32_buf(&self.g.dev, &xs);
        self.xs = xs;
    }

    pub fn pool(&self) -> &Q4Pool {
        match &self.store {
            ExpertStore::Int4(p) => p,
            ExpertStore::F16(_) | ExpertStore::Host => unreachable!(),
        }
    }

    pub fn what(&self) -> String {
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

    pub fn all_chunks(&self) -> Vec<usize> {
        (0..self.pool().chunks.len()).collect()
    }

    /// Pool slot of top-k index j of token t.
    pub fn slot(&self, t: usize, j: usize) -> usize {
        self.slot_of[self.ids[t * self.c.top_k + j] as usize]
    }

    pub fn chunk_of(&self, slot: usize) -> usize {
        slot / self.pool().slots_per_chunk
    }

    /// Run a program on the setup's step (T tokens).
    pub fn run(&self, prog: Program) {
        run(&self.g.dev, prog, &self.step, self.c.t);
    }

    pub fn read(&self, buf: &Buffer, n: usize) -> Vec<f32> {
        read_f32(&self.g.dev, buf, n)
    }

    /// The forward pass's expert dispatches over these buffers: gate_up reads `xn` and
    /// writes `h`; down reads `h` and writes `y` (per slot) or adds into `x` (fused).
    pub fn moe<'b>(
        &'b self,
        xn: &'b Buffer,
        h: &'b Buffer,
        y: &'b Buffer,
        x: &'b Buffer,
    ) -> MoeDispatch<'b> {
        MoeDispatch {
            plan: &self.g.plan,
            sorted: None,
            fuse_combine: true,
            decode_uniform: false,
            coalesced: self.g.plan.coalesced_decode,
            tiled: None,
            one_token: self.g.plan.coalesced_decode,
            hidden: self.c.hidden,
            top_k: self.c.top_k,
            dummy: &self.dummy,
            xn,
            topk_ids: &self.ids_b,
            topk_w: &self.w_b,
            hbuf: h,
            y,
            x,
            route: None,
        }
    }

    /// gate_up over `x` and the pool's `chunks` into a NaN-filled h; returns h [T, top_k, inter].
    pub fn gpu_gate_up_on(&self, x: &Buffer, chunks: &[usize]) -> Vec<f32> {
        let c = self.c;
        let n = c.t * c.top_k * c.inter;
        let h = f32_buf(&self.g.dev, &vec![f32::NAN; n]);
        let mut prog = Program::default();
        self.moe(x, &h, &self.dummy, &self.dummy).q4_gate_up(
            &mut prog,
            self.pool(),
            &self.slot_b,
            (0, c.top_k),
        );
        keep_chunks(&mut prog, self.pool().chunks.len(), chunks);
        self.run(prog);
        self.read(&h, n)
    }

    pub fn gpu_gate_up(&self, chunks: &[usize]) -> Vec<f32> {
        self.gpu_gate_up_on(&self.x_b, chunks)
    }

    /// down per slot over `chunks` on `h` into a NaN-filled y; returns y [T, top_k, hidden].
    pub fn gpu_down(&self, h: &Buffer, chunks: &[usize]) -> Vec<f32> {
        let c = self.c;
        let n = c.t * c.top_k * c.hidden;
        let y = f32_buf(&self.g.dev, &vec![f32::NAN; n]);
        let mut prog = Program::default();
        self.moe(&self.dummy, h, &y, &self.dummy).q4_down(
            &mut prog,
            self.pool(),
            &self.slot_b,
            Some((0, c.top_k)),
        );
        keep_chunks(&mut prog, self.pool().chunks.len(), chunks);
        self.run(prog);
        self.read(&y, n)
    }

    /// The fused combine over `chunks` on `h`, x starting at x0; returns x [T, hidden].
    pub fn gpu_fused(&self, h: &Buffer, chunks: &[usize]) -> Vec<f32> {
        let c = self.c;
        let x = f32_buf(&self.g.dev, &self.x0);
        let mut prog = Program::default();
        self.moe(&self.dummy, h, &self.dummy, &x).q4_down(
            &mut prog,
            self.pool(),
            &self.slot_b,
            None,
        );
        keep_chunks(&mut prog, self.pool().chunks.len(), chunks);
        self.run(prog);
        self.read(&x, c.t * c.hidden)
    }

    /// The expert-major path (sort, gather, gate/up, down) on the step's T tokens, with
    /// `MoeSorted` sized by the workspace table of a model of these shapes for a prefill
    /// chunk of max(T, 2) (the table has no expert-major rows for one-token chunks).
    /// Returns (the sorted pair indices, their experts, y [T, k, H]).
    pub fn gpu_expert_major(&self) -> (Vec<u32>, Vec<u32>, Vec<f32>) {
        let c = self.c;
        let dev = &self.g.dev;
        let chunk = c.t.max(2);
        let mut cfg = wgmoe::config::ModelConfig::from_dir(&super::fixture("olmoe-tiny")).unwrap();
        cfg.hidden_size = c.hidden;
        cfg.moe_intermediate = c.inter;
        cfg.dense_intermediate = c.inter;
        cfg.num_experts = c.n_experts;
        cfg.top_k = c.top_k;
        let table = workspace(
            &cfg,
            &WorkspaceShape {
                max_context: chunk,
                chunk,
                all_logits: false,
                score_rows: 0,
                batch: 1,
                expert_major: Some(true),
                host_experts: false,
                kv: wgmoe::backend::kernel::KvFormat::F32,
            },
        )
        .unwrap();
        let sorted =
            MoeSorted::new(dev, &table, chunk, c.top_k, c.n_experts, c.hidden, c.inter).unwrap();
        let n = c.t * c.top_k * c.hidden;
        let y = f32_buf(dev, &vec![f32::NAN; n]);
        let mut d = self.moe(&self.x_b, &self.dummy, &y, &self.dummy);
        d.sorted = Some(&sorted);
        let mut prog = Program::default();
        d.q4_expert_major(&mut prog, self.pool(), &self.slot_b);
        self.run(prog);
        // [pair of sorted position; its expert; end of each expert's run], pmax each.
        let np = c.t * c.top_k;
        let pairs = read_u32(dev, &sorted.pairs, 2 * sorted.pmax + c.n_experts);
        (
            pairs[..np].to_vec(),
            pairs[sorted.pmax..sorted.pmax + np].to_vec(),
            read_f32(dev, &y, n),
        )
    }

    /// The tiled expert GEMMs (multi-token steps on GPUs) through `MoeDispatch::routed`
    /// with the grouped executor: sort, gate/up into h, down into y. Returns (h, y).
    pub fn gpu_expert_gemm(&self) -> (Vec<f32>, Vec<f32>) {
        let c = self.c;
        let dev = &self.g.dev;
        assert!(self.g.plan.tiled_prefill, "the tiled plan");
        let pmax = c.t * c.top_k;
        let pairs = MoePairs {
            pmax,
            n_experts: c.n_experts,
            buffer: u32_buf(dev, &vec![0; 2 * pmax + c.n_experts]),
        };
        let h = f32_buf(dev, &vec![f32::NAN; c.t * c.top_k * c.inter]);
        let y = f32_buf(dev, &vec![f32::NAN; c.t * c.top_k * c.hidden]);
        let mut d = self.moe(&self.x_b, &h, &y, &self.dummy);
        d.coalesced = false;
        d.tiled = Some(&pairs);
        let mut prog = Program::default();
        let fl = d.routed(&mut prog, Executor::Grouped, &self.store, &self.slot_b);
        assert_eq!(fl, wgmoe::backend::params::flags::COMBINE_ROUTED);
        assert!(prog
            .ops
            .iter()
            .any(|o| matches!(o.kernel, wgmoe::backend::Kernel::ExpertGemm(_))));
        self.run(prog);
        (
            read_f32(dev, &h, c.t * c.top_k * c.inter),
            read_f32(dev, &y, c.t * c.top_k * c.hidden),
        )
    }

    pub fn want_gate_up(&self) -> Vec<f32> {
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

    pub fn want_down(&self, h: &[f32]) -> Vec<f32> {
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
    pub fn want_fused(&self, h: &[f32], chunks: &[usize]) -> Vec<f32> {
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

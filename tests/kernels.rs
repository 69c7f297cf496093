//! Every WGSL kernel against its CPU reference (`wgmoe::cpu_ref`) on seeded random inputs
//! and awkward shapes: one-op programs built with `Program::push`, one submission each.
//! Runs on lavapipe in CI; a missing adapter is a failure, never a skip.
//!
//! A difference is measured as `|gpu - cpu| / max(1, rms(cpu), |cpu|)`: relative to the
//! output's magnitude, so that a dot product that cancels to near zero is judged by the
//! size of its terms, not by its small result. Each kernel has its own named tolerance; a
//! failure prints the largest difference and where it is.

mod common;

use half::f16;

use wgmoe::cpu_ref::{self, Heads, QkNorm, Routed};
use wgmoe::gpu::kernels::*;
use wgmoe::gpu::program::{groups64, Dim, Program};
use wgmoe::gpu::tensor::{upload_f16_vec, upload_f32_vec, ExpertPool, F16Matrix};
use wgmoe::gpu::{AdapterRequest, GpuBuffer, GpuContext};
use wgmoe::model::forward::rope_table;

/// f16 to f32 is exact and embed only copies.
const EMBED_TOL: f32 = 0.0;
/// Sum of squares in a different order (64 partial sums) and inverseSqrt vs 1/sqrt.
const RMSNORM_TOL: f32 = 1e-5;
/// f32 accumulation order: the GPU sums 8 products at a time (two dot4) per step.
const MATMUL_TOL: f32 = 2e-5;
/// RMSNorm of q/k (reduction order) then two products per rotated element.
const ROPE_TOL: f32 = 1e-5;
/// Score dot products, exp and the softmax sum, in a different order.
const ATTENTION_TOL: f32 = 1e-5;
/// Softmax sums in the same order; only exp may differ by an ulp or two.
const ROUTER_TOL: f32 = 1e-6;
/// Like matmul: f32 accumulation order in gate/up (and down) dot products, plus exp in silu.
const FFN_TOL: f32 = 2e-5;
/// At most nine products added per element, in the same order as the reference.
const COMBINE_TOL: f32 = 1e-6;

// ---------------------------------------------------------------------------------------------
// Harness

/// A fresh device per test (no cross-talk of validation errors between parallel tests);
/// `cap` limits the storage binding used to split weights, to force several chunks.
fn gpu(cap: Option<u64>) -> GpuContext {
    common::init_env();
    GpuContext::new(&AdapterRequest {
        max_binding: cap,
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
    fn f16s(&mut self, n: usize, scale: f32) -> Vec<f16> {
        (0..n).map(|_| f16::from_f32(self.f32(scale))).collect()
    }
    /// Uniform in [lo, hi) as f16 (norm weights).
    fn f16_range(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f16> {
        (0..n)
            .map(|_| f16::from_f32(lo + (self.f32(1.0) + 1.0) * 0.5 * (hi - lo)))
            .collect()
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

fn dummy(ctx: &GpuContext) -> GpuBuffer {
    f32_buf(ctx, &[0.0; 4])
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

fn read_u32(ctx: &GpuContext, buf: &wgpu::Buffer, n: usize) -> Vec<u32> {
    bytemuck::pod_collect_to_vec(&ctx.read_back(buf, 0, (n * 4) as u64).unwrap())
}

/// Fails unless every `|got - want| / max(1, rms(want), |want|) <= tol`; prints the largest
/// such difference, its index and both values, and returns it.
fn check(what: &str, got: &[f32], want: &[f32], tol: f32) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let rms = (want.iter().map(|w| w * w).sum::<f32>() / want.len().max(1) as f32).sqrt();
    let scale = rms.max(1.0);
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

/// `rows` ([T, width]) laid out with `stride` floats per row, the gaps set to `fill`.
fn strided(rows: &[f32], width: usize, stride: usize, fill: f32) -> Vec<f32> {
    let t = rows.len() / width;
    let mut v = vec![fill; t * stride];
    for r in 0..t {
        v[r * stride..r * stride + width].copy_from_slice(&rows[r * width..(r + 1) * width]);
    }
    v
}

// ---------------------------------------------------------------------------------------------
// embed

fn embed_case(
    seed: u64,
    vocab: usize,
    hidden: usize,
    ids: &[u32],
    cap: Option<u64>,
    min_chunks: usize,
) {
    let ctx = gpu(cap);
    let mut rng = Rng::new(seed);
    let table = rng.f16s(vocab * hidden, 2.0);
    let m = F16Matrix::upload(&ctx, "embed", vocab, hidden, &table).unwrap();
    assert!(
        m.chunks.len() >= min_chunks,
        "expected >= {min_chunks} chunks, got {}",
        m.chunks.len()
    );
    let t = ids.len();
    let step = step_buf(&ctx, 0, t);
    let ids_b = u32_buf(&ctx, ids);
    let x = f32_buf(&ctx, &vec![f32::NAN; t * hidden]);
    let mut prog = Program::default();
    for c in &m.chunks {
        prog.push(
            &ctx,
            Kernel::Embed,
            &EmbedParams {
                hidden: hidden as u32,
                row_start: c.row_start as u32,
                rows: c.rows as u32,
                words_per_row: m.vec4_per_row() * 4,
            },
            &step,
            &[&ids_b, &c.buffer, &x],
            [Dim::Const(groups64(hidden)), Dim::Tokens, Dim::Const(1)],
        );
    }
    run(&ctx, &prog, t);
    let want = cpu_ref::embed(&table, hidden, ids).unwrap();
    let what = format!(
        "embed vocab {vocab} hidden {hidden} T {t} chunks {}",
        m.chunks.len()
    );
    check(&what, &read_f32(&ctx, &x, t * hidden), &want, EMBED_TOL);
}

#[test]
fn embed_matches_cpu() {
    embed_case(1, 40, 7, &[0, 39, 5, 5, 17], None, 1);
    embed_case(2, 9, 1, &[8], None, 1);
    embed_case(3, 33, 70, &[32, 0, 1, 16, 31, 2, 2, 20, 15], None, 1);
}

#[test]
fn embed_split_table_matches_cpu() {
    // hidden 100: rows of 208 bytes, 4 rows per 1 KiB binding, 13 chunks; ids at chunk edges.
    embed_case(4, 50, 100, &[0, 3, 4, 7, 8, 49, 48, 25, 26], Some(1024), 10);
}

// ---------------------------------------------------------------------------------------------
// rmsnorm

#[allow(clippy::too_many_arguments)]
fn rmsnorm_case(
    ctx: &GpuContext,
    seed: u64,
    t: usize,
    n: usize,
    x_stride: usize,
    out_stride: usize,
    last_only: bool,
) {
    let mut rng = Rng::new(seed);
    let rows = rng.vec(t * n, 3.0);
    let weight = rng.f16_range(n, 0.5, 1.5);
    let eps = 1e-5;
    let step = step_buf(ctx, 0, t);
    let x = f32_buf(ctx, &strided(&rows, n, x_stride, 100.0));
    let w = upload_f16_vec(ctx, "norm", &weight);
    let out_rows = if last_only { 1 } else { t };
    let sentinel = -7.0;
    let out = f32_buf(ctx, &vec![sentinel; out_rows * out_stride]);
    let mut prog = Program::default();
    prog.push(
        ctx,
        Kernel::RmsNorm,
        &RmsNormParams {
            n: n as u32,
            x_stride: x_stride as u32,
            out_stride: out_stride as u32,
            flags: if last_only { LAST_TOKEN_ONLY } else { 0 },
            eps,
            _pad: [0; 3],
        },
        &step,
        &[&x, &w, &out],
        [
            if last_only {
                Dim::Const(1)
            } else {
                Dim::Tokens
            },
            Dim::Const(1),
            Dim::Const(1),
        ],
    );
    run(ctx, &prog, t);
    let mut want = cpu_ref::rmsnorm(&rows, &weight, eps).unwrap();
    if last_only {
        want = want[(t - 1) * n..].to_vec();
    }
    let want = strided(&want, n, out_stride, sentinel);
    let what = format!("rmsnorm T {t} n {n} strides {x_stride}/{out_stride} last_only {last_only}");
    check(
        &what,
        &read_f32(ctx, &out, out_rows * out_stride),
        &want,
        RMSNORM_TOL,
    );
}

#[test]
fn rmsnorm_matches_cpu() {
    let ctx = gpu(None);
    for (i, &(t, n)) in [
        (1, 1),
        (5, 7),
        (1, 13),
        (6, 64),
        (9, 100),
        (2, 257),
        (3, 1408),
    ]
    .iter()
    .enumerate()
    {
        rmsnorm_case(&ctx, 10 + i as u64, t, n, n, n, false);
    }
    rmsnorm_case(&ctx, 20, 5, 100, 103, 101, false);
    rmsnorm_case(&ctx, 21, 6, 257, 257, 257, true);
    rmsnorm_case(&ctx, 22, 1, 13, 16, 13, true);
}

// ---------------------------------------------------------------------------------------------
// matmul

struct MatmulCase {
    t: usize,
    k: usize,
    n: usize,
    x_stride: usize,
    out_stride: usize,
    flags: u32,
}

impl MatmulCase {
    fn new(t: usize, k: usize, n: usize, flags: u32) -> Self {
        MatmulCase {
            t,
            k,
            n,
            x_stride: k,
            out_stride: n,
            flags,
        }
    }
}

/// One matmul through every chunk of `m`, as forward.rs records it.
#[allow(clippy::too_many_arguments)]
fn push_matmul(
    ctx: &GpuContext,
    prog: &mut Program,
    step: &wgpu::Buffer,
    m: &F16Matrix,
    x: &wgpu::Buffer,
    bias: &wgpu::Buffer,
    out: &wgpu::Buffer,
    x_stride: usize,
    out_stride: usize,
    flags: u32,
) {
    for c in &m.chunks {
        let last = flags & matmul_flags::LAST_TOKEN_ONLY != 0;
        prog.push(
            ctx,
            Kernel::Matmul,
            &MatmulParams {
                k: m.cols as u32,
                n_rows: c.rows as u32,
                row_base: c.row_start as u32,
                vec4_per_row: m.vec4_per_row(),
                x_stride: x_stride as u32,
                out_stride: out_stride as u32,
                flags,
                _pad: 0,
            },
            step,
            &[x, &c.buffer, bias, out],
            [
                Dim::Const(groups64(c.rows)),
                if last {
                    Dim::Const(1)
                } else {
                    Dim::TokensDiv(MATMUL_TOKENS_PER_THREAD)
                },
                Dim::Const(1),
            ],
        );
    }
}

/// Seeded inputs of one matmul case: activations [t, k], f16 weights [n, k], a bias and
/// the output's prior contents (columns past n of a strided row hold 55, which must survive).
struct MatmulData {
    xs: Vec<f32>,
    w: Vec<f16>,
    bias: Vec<f32>,
    out0: Vec<f32>,
}

impl MatmulData {
    fn new(seed: u64, c: &MatmulCase) -> Self {
        let mut rng = Rng::new(seed);
        let xs = rng.vec(c.t * c.k, 1.0);
        let w = rng.f16s(c.n * c.k, 1.0);
        let bias = rng.vec(c.n, 1.0);
        let out0 = (0..c.out_rows() * c.out_stride)
            .map(|i| {
                if i % c.out_stride < c.n {
                    rng.f32(2.0)
                } else {
                    55.0
                }
            })
            .collect();
        MatmulData { xs, w, bias, out0 }
    }

    /// The CPU reference's output rows, strided as the GPU writes them.
    fn want(&self, c: &MatmulCase) -> Vec<f32> {
        let has = |f: u32| c.flags & f != 0;
        let x_rows = if has(matmul_flags::LAST_TOKEN_ONLY) {
            &self.xs[(c.t - 1) * c.k..]
        } else {
            &self.xs[..]
        };
        let prev: Vec<f32> = self
            .out0
            .iter()
            .enumerate()
            .filter(|(i, _)| i % c.out_stride < c.n)
            .map(|(_, v)| *v)
            .collect();
        let want = cpu_ref::matmul(
            x_rows,
            c.k,
            &self.w,
            c.n,
            has(matmul_flags::BIAS).then_some(&self.bias[..]),
            has(matmul_flags::ACCUMULATE).then_some(&prev[..]),
        )
        .unwrap();
        strided(&want, c.n, c.out_stride, 55.0)
    }
}

impl MatmulCase {
    fn out_rows(&self) -> usize {
        if self.flags & matmul_flags::LAST_TOKEN_ONLY != 0 {
            1
        } else {
            self.t
        }
    }
}

fn matmul_case(ctx: &GpuContext, seed: u64, c: MatmulCase, min_chunks: usize) -> f32 {
    let MatmulCase {
        t,
        k,
        n,
        x_stride,
        out_stride,
        flags,
    } = c;
    let data = MatmulData::new(seed, &c);
    let (xs, w, bias, out0) = (&data.xs, &data.w, &data.bias, &data.out0);
    let has_bias = flags & matmul_flags::BIAS != 0;
    let out_rows = c.out_rows();
    let m = F16Matrix::upload(ctx, "w", n, k, w).unwrap();
    assert!(
        m.chunks.len() >= min_chunks,
        "expected >= {min_chunks} chunks, got {}",
        m.chunks.len()
    );
    let step = step_buf(ctx, 0, t);
    // Stride padding holds NaN: any read of it poisons the result.
    let x = f32_buf(ctx, &strided(xs, k, x_stride, f32::NAN));
    let b = if has_bias {
        f32_buf(ctx, bias)
    } else {
        dummy(ctx)
    };
    let out = f32_buf(ctx, out0);
    let mut prog = Program::default();
    push_matmul(
        ctx, &mut prog, &step, &m, &x, &b, &out, x_stride, out_stride, flags,
    );
    run(ctx, &prog, t);
    let want = data.want(&c);
    let what = format!(
        "matmul T {t} K {k} N {n} strides {x_stride}/{out_stride} flags {flags:#b} chunks {}",
        m.chunks.len()
    );
    check(
        &what,
        &read_f32(ctx, &out, out_rows * out_stride),
        &want,
        MATMUL_TOL,
    )
}

#[test]
fn matmul_matches_cpu() {
    use matmul_flags::*;
    let ctx = gpu(None);
    let cases = [
        MatmulCase::new(1, 1, 3, 0),
        MatmulCase::new(5, 7, 65, 0),
        MatmulCase::new(7, 13, 100, BIAS),
        MatmulCase::new(9, 100, 70, ACCUMULATE),
        MatmulCase::new(6, 257, 130, BIAS | ACCUMULATE),
        MatmulCase::new(1, 1408, 70, 0),
        MatmulCase::new(5, 2048, 100, BIAS),
        MatmulCase::new(8, 16, 8, 0),
        MatmulCase::new(4, 64, 64, BIAS),
        MatmulCase {
            t: 5,
            k: 13,
            n: 61,
            x_stride: 20,
            out_stride: 67,
            flags: BIAS,
        },
        MatmulCase {
            t: 3,
            k: 100,
            n: 33,
            x_stride: 100,
            out_stride: 40,
            flags: ACCUMULATE,
        },
    ];
    for (i, c) in cases.into_iter().enumerate() {
        matmul_case(&ctx, 100 + i as u64, c, 1);
    }
}

#[test]
fn matmul_last_token_only_matches_cpu() {
    use matmul_flags::*;
    let ctx = gpu(None);
    matmul_case(&ctx, 200, MatmulCase::new(6, 100, 70, LAST_TOKEN_ONLY), 1);
    matmul_case(&ctx, 201, MatmulCase::new(1, 7, 5, LAST_TOKEN_ONLY), 1);
    matmul_case(
        &ctx,
        202,
        MatmulCase::new(9, 257, 130, LAST_TOKEN_ONLY | BIAS | ACCUMULATE),
        1,
    );
    matmul_case(
        &ctx,
        203,
        MatmulCase {
            t: 5,
            k: 13,
            n: 50,
            x_stride: 16,
            out_stride: 53,
            flags: LAST_TOKEN_ONLY,
        },
        1,
    );
}

#[test]
fn matmul_split_matrix_matches_cpu() {
    use matmul_flags::*;
    // A 4 KiB binding: rows of K = 1408 (2816 bytes) go one to a chunk, K = 257 (528 bytes)
    // seven, K = 100 (208 bytes) nineteen.
    let ctx = gpu(Some(4096));
    matmul_case(&ctx, 300, MatmulCase::new(7, 257, 70, BIAS), 10);
    matmul_case(&ctx, 301, MatmulCase::new(5, 1408, 9, ACCUMULATE), 9);
    matmul_case(
        &ctx,
        302,
        MatmulCase::new(6, 100, 130, LAST_TOKEN_ONLY | BIAS),
        7,
    );
}

// ---------------------------------------------------------------------------------------------
// rope_kv and attention

struct AttnCase {
    heads: Heads,
    t: usize,
    pos0: usize,
    flags: u32,
}

const ROPE_THETA: f64 = 10000.0;
const CLIP: f32 = 0.75;

fn rope_case(ctx: &GpuContext, seed: u64, c: &AttnCase) {
    let AttnCase {
        heads,
        t,
        pos0,
        flags,
    } = *c;
    let (q_dim, kv_dim, hd) = (heads.q_dim(), heads.kv_dim(), heads.head_dim);
    let positions = pos0 + t + 2;
    let mut rng = Rng::new(seed);
    let qkv = rng.vec(t * heads.qkv_dim(), 2.0);
    let q_norm_w = rng.f16_range(q_dim, 0.5, 1.5);
    let k_norm_w = rng.f16_range(kv_dim, 0.5, 1.5);
    // Rows of the caches other than the step's must survive untouched.
    let cache_k0 = rng.vec(positions * kv_dim, 1.0);
    let cache_v0 = rng.vec(positions * kv_dim, 1.0);
    let eps = 1e-6;
    let table = rope_table(ROPE_THETA, hd, positions);
    let norm = flags & rope_flags::QK_NORM != 0;
    let clip = flags & rope_flags::CLIP != 0;

    let step = step_buf(ctx, pos0, t);
    let qkv_b = f32_buf(ctx, &qkv);
    let qn = upload_f16_vec(ctx, "q_norm", &q_norm_w);
    let kn = upload_f16_vec(ctx, "k_norm", &k_norm_w);
    let d = dummy(ctx);
    let rope = f32_buf(ctx, &table);
    let q_out = f32_buf(ctx, &vec![f32::NAN; t * q_dim]);
    let ck = f32_buf(ctx, &cache_k0);
    let cv = f32_buf(ctx, &cache_v0);
    let mut prog = Program::default();
    prog.push(
        ctx,
        Kernel::RopeKv,
        &RopeKvParams {
            n_heads: heads.n_heads as u32,
            n_kv: heads.n_kv as u32,
            head_dim: hd as u32,
            qkv_stride: heads.qkv_dim() as u32,
            flags,
            eps,
            clip: if clip { CLIP } else { 0.0 },
            rope_rows: positions as u32,
        },
        &step,
        &[
            &qkv_b,
            if norm { &qn } else { &d },
            if norm { &kn } else { &d },
            &rope,
            &q_out,
            &ck,
            &cv,
        ],
        [Dim::Tokens, Dim::Const(1), Dim::Const(1)],
    );
    run(ctx, &prog, t);

    let (mut want_k, mut want_v) = (cache_k0.clone(), cache_v0.clone());
    let qk = norm.then_some(QkNorm {
        q: &q_norm_w,
        k: &k_norm_w,
        eps,
    });
    let want_q = cpu_ref::rope_kv(
        &qkv,
        heads,
        qk,
        clip.then_some(CLIP),
        &table,
        pos0,
        &mut want_k,
        &mut want_v,
    )
    .unwrap();
    let what = format!(
        "rope_kv heads {}/{} dim {hd} T {t} pos0 {pos0} flags {flags:#b}",
        heads.n_heads, heads.n_kv
    );
    check(
        &format!("{what} q"),
        &read_f32(ctx, &q_out, t * q_dim),
        &want_q,
        ROPE_TOL,
    );
    check(
        &format!("{what} cache_k"),
        &read_f32(ctx, &ck, positions * kv_dim),
        &want_k,
        ROPE_TOL,
    );
    check(
        &format!("{what} cache_v"),
        &read_f32(ctx, &cv, positions * kv_dim),
        &want_v,
        ROPE_TOL,
    );
}

fn attn_cases() -> Vec<AttnCase> {
    use rope_flags::*;
    let h = |n_heads, n_kv, head_dim| Heads {
        n_heads,
        n_kv,
        head_dim,
    };
    vec![
        AttnCase {
            heads: h(6, 2, 6),
            t: 5,
            pos0: 0,
            flags: 0,
        },
        AttnCase {
            heads: h(4, 4, 80),
            t: 3,
            pos0: 7,
            flags: QK_NORM,
        },
        AttnCase {
            heads: h(6, 2, 128),
            t: 1,
            pos0: 70,
            flags: QK_NORM | CLIP,
        },
        AttnCase {
            heads: h(2, 1, 8),
            t: 9,
            pos0: 100,
            flags: CLIP,
        },
        AttnCase {
            heads: h(4, 4, 6),
            t: 1,
            pos0: 0,
            flags: QK_NORM,
        },
        AttnCase {
            heads: h(8, 2, 64),
            t: 6,
            pos0: 3,
            flags: 0,
        },
        AttnCase {
            heads: h(16, 16, 128),
            t: 2,
            pos0: 300,
            flags: QK_NORM | CLIP,
        },
    ]
}

#[test]
fn rope_kv_matches_cpu() {
    let ctx = gpu(None);
    for (i, c) in attn_cases().iter().enumerate() {
        rope_case(&ctx, 400 + i as u64, c);
    }
}

fn attention_case(ctx: &GpuContext, seed: u64, c: &AttnCase) {
    let AttnCase { heads, t, pos0, .. } = *c;
    let (q_dim, kv_dim, hd) = (heads.q_dim(), heads.kv_dim(), heads.head_dim);
    let positions = pos0 + t + 2;
    let mut rng = Rng::new(seed);
    // Large enough scores that the softmax is far from uniform.
    let q = rng.vec(t * q_dim, 3.0);
    let mut cache_k = rng.vec(positions * kv_dim, 1.0);
    let cache_v = rng.vec(positions * kv_dim, 1.0);
    // Rows past the last visible key are poison: causality must never read them.
    cache_k[(pos0 + t) * kv_dim..].fill(f32::NAN);
    let mut cache_v_gpu = cache_v.clone();
    cache_v_gpu[(pos0 + t) * kv_dim..].fill(f32::NAN);

    let step = step_buf(ctx, pos0, t);
    let qb = f32_buf(ctx, &q);
    let ck = f32_buf(ctx, &cache_k);
    let cv = f32_buf(ctx, &cache_v_gpu);
    let scratch = f32_buf(ctx, &vec![0.0; t * heads.n_heads * positions]);
    let out = f32_buf(ctx, &vec![f32::NAN; t * q_dim]);
    let mut prog = Program::default();
    prog.push(
        ctx,
        Kernel::Attention,
        &AttentionParams {
            n_heads: heads.n_heads as u32,
            n_kv: heads.n_kv as u32,
            head_dim: hd as u32,
            scratch_stride: positions as u32,
            scale: (hd as f32).powf(-0.5),
            _pad: [0; 3],
        },
        &step,
        &[&qb, &ck, &cv, &scratch, &out],
        [Dim::Const(heads.n_heads as u32), Dim::Tokens, Dim::Const(1)],
    );
    run(ctx, &prog, t);

    let visible = (pos0 + t) * kv_dim;
    let want =
        cpu_ref::attention(&q, heads, &cache_k[..visible], &cache_v[..visible], pos0).unwrap();
    let what = format!(
        "attention heads {}/{} dim {hd} T {t} pos0 {pos0}",
        heads.n_heads, heads.n_kv
    );
    check(&what, &read_f32(ctx, &out, t * q_dim), &want, ATTENTION_TOL);
}

#[test]
fn attention_matches_cpu() {
    let ctx = gpu(None);
    for (i, c) in attn_cases().iter().enumerate() {
        attention_case(&ctx, 500 + i as u64, c);
    }
}

/// Prefill of 5 tokens then a decode step at pos0 = 5 through rope_kv + attention in one
/// program each, sharing the caches, against the reference chained the same way.
#[test]
fn rope_then_attention_prefill_then_decode_matches_cpu() {
    let ctx = gpu(None);
    let heads = Heads {
        n_heads: 6,
        n_kv: 2,
        head_dim: 80,
    };
    let (q_dim, kv_dim, hd) = (heads.q_dim(), heads.kv_dim(), heads.head_dim);
    let positions = 8;
    let mut rng = Rng::new(600);
    let table = rope_table(ROPE_THETA, hd, positions);
    let rope = f32_buf(&ctx, &table);
    let ck = f32_buf(&ctx, &vec![0.0; positions * kv_dim]);
    let cv = f32_buf(&ctx, &vec![0.0; positions * kv_dim]);
    let (mut want_k, mut want_v) = (vec![0.0; positions * kv_dim], vec![0.0; positions * kv_dim]);
    let d = dummy(&ctx);
    for (pos0, t) in [(0, 5), (5, 1)] {
        let qkv = rng.vec(t * heads.qkv_dim(), 2.0);
        let step = step_buf(&ctx, pos0, t);
        let qkv_b = f32_buf(&ctx, &qkv);
        let q = f32_buf(&ctx, &vec![0.0; t * q_dim]);
        let scratch = f32_buf(&ctx, &vec![0.0; t * heads.n_heads * positions]);
        let out = f32_buf(&ctx, &vec![0.0; t * q_dim]);
        let mut prog = Program::default();
        prog.push(
            &ctx,
            Kernel::RopeKv,
            &RopeKvParams {
                n_heads: heads.n_heads as u32,
                n_kv: heads.n_kv as u32,
                head_dim: hd as u32,
                qkv_stride: heads.qkv_dim() as u32,
                flags: 0,
                eps: 1e-6,
                clip: 0.0,
                rope_rows: positions as u32,
            },
            &step,
            &[&qkv_b, &d, &d, &rope, &q, &ck, &cv],
            [Dim::Tokens, Dim::Const(1), Dim::Const(1)],
        );
        prog.push(
            &ctx,
            Kernel::Attention,
            &AttentionParams {
                n_heads: heads.n_heads as u32,
                n_kv: heads.n_kv as u32,
                head_dim: hd as u32,
                scratch_stride: positions as u32,
                scale: (hd as f32).powf(-0.5),
                _pad: [0; 3],
            },
            &step,
            &[&q, &ck, &cv, &scratch, &out],
            [Dim::Const(heads.n_heads as u32), Dim::Tokens, Dim::Const(1)],
        );
        run(&ctx, &prog, t);
        let want_q = cpu_ref::rope_kv(
            &qkv,
            heads,
            None,
            None,
            &table,
            pos0,
            &mut want_k,
            &mut want_v,
        )
        .unwrap();
        let n = (pos0 + t) * kv_dim;
        let want = cpu_ref::attention(&want_q, heads, &want_k[..n], &want_v[..n], pos0).unwrap();
        check(
            &format!("rope+attention pos0 {pos0} T {t}"),
            &read_f32(&ctx, &out, t * q_dim),
            &want,
            ATTENTION_TOL,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// router_topk

fn router_case(
    ctx: &GpuContext,
    what: &str,
    logits: &[f32],
    stride: usize,
    n_experts: usize,
    top_k: usize,
    norm: bool,
) {
    let t = logits.len() / stride;
    let step = step_buf(ctx, 0, t);
    let lb = f32_buf(ctx, logits);
    let ids = u32_buf(ctx, &vec![u32::MAX; t * top_k]);
    let w = f32_buf(ctx, &vec![f32::NAN; t * top_k]);
    let mut prog = Program::default();
    prog.push(
        ctx,
        Kernel::RouterTopk,
        &RouterTopkParams {
            n_experts: n_experts as u32,
            top_k: top_k as u32,
            logits_stride: stride as u32,
            norm_topk: norm as u32,
        },
        &step,
        &[&lb, &ids, &w],
        [Dim::Tokens, Dim::Const(1), Dim::Const(1)],
    );
    run(ctx, &prog, t);
    let (want_ids, want_w) = cpu_ref::router_topk(logits, stride, n_experts, top_k, norm).unwrap();
    let what = format!("router_topk {what}: T {t} experts {n_experts} top {top_k} norm {norm}");
    let got_ids = read_u32(ctx, &ids, t * top_k);
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
    check(&what, &read_f32(ctx, &w, t * top_k), &want_w, ROUTER_TOL);
}

#[test]
fn router_topk_matches_cpu() {
    let ctx = gpu(None);
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
        router_case(&ctx, "random", &logits, stride, e, k, norm);
    }
}

#[test]
fn router_topk_ties_pick_lowest_index() {
    let ctx = gpu(None);
    let mut rng = Rng::new(701);
    // Small integer logits: many exact ties.
    let logits: Vec<f32> = (0..9 * 8).map(|_| rng.below(3) as f32).collect();
    router_case(&ctx, "integer ties", &logits, 8, 8, 3, true);
    let all_equal = vec![0.5; 4 * 7];
    router_case(&ctx, "all equal", &all_equal, 7, 7, 3, false);
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

/// Runs gate_up, down, and the two chained, for one pool; checks h, y and the chained y.
fn ffn_case(ctx: &GpuContext, seed: u64, c: &FfnCase, min_chunks: usize) {
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

    let pool = ExpertPool::new(ctx, "pool", c.slots, hid, inter).unwrap();
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
        pool.write_slot(ctx, s, &experts[e].gate, &experts[e].up, &experts[e].down);
    }

    let step = step_buf(ctx, 0, t);
    let x = f32_buf(ctx, &strided(&xs, hid, c.x_stride, f32::NAN));
    let ids_b = u32_buf(ctx, &ids);
    let slot_b = u32_buf(ctx, &slot_of.iter().map(|&s| s as u32).collect::<Vec<_>>());
    let h_b = f32_buf(ctx, &h_in);
    let h_out = f32_buf(ctx, &vec![f32::NAN; t * k * inter]);
    let y_b = f32_buf(ctx, &vec![f32::NAN; t * k * hid]);
    let y_chain = f32_buf(ctx, &vec![f32::NAN; t * k * hid]);
    let flags = if c.routed { 0 } else { FFN_FIXED_SLOT };

    // Top-k indices j0 .. j0 + count (the per-expert executor serves one per dispatch).
    let push_gate_up = |prog: &mut Program, (j0, count): (usize, usize), out: &wgpu::Buffer| {
        for (ci, chunk) in pool.chunks.iter().enumerate() {
            let first = ci * pool.slots_per_chunk;
            prog.push(
                ctx,
                Kernel::FfnGateUp,
                &FfnGateUpParams {
                    hidden: hid as u32,
                    inter: inter as u32,
                    top_k: k as u32,
                    x_stride: c.x_stride as u32,
                    in_vec4: pool.in_vec4(),
                    slot_vec4: pool.slot_vec4(),
                    first_slot: first as u32,
                    chunk_slots: pool.slots_per_chunk.min(pool.slots - first) as u32,
                    flags,
                    j_base: j0 as u32,
                    ..Default::default()
                },
                &step,
                &[&x, &ids_b, &slot_b, chunk, out],
                [
                    Dim::Const(groups64(inter)),
                    Dim::Const(count as u32),
                    Dim::Tokens,
                ],
            );
        }
    };
    let push_down =
        |prog: &mut Program, (j0, count): (usize, usize), h: &wgpu::Buffer, out: &wgpu::Buffer| {
            for (ci, chunk) in pool.chunks.iter().enumerate() {
                let first = ci * pool.slots_per_chunk;
                prog.push(
                    ctx,
                    Kernel::FfnDown,
                    &FfnDownParams {
                        hidden: hid as u32,
                        inter: inter as u32,
                        top_k: k as u32,
                        in_vec4: pool.in_vec4(),
                        down_vec4: pool.down_vec4(),
                        slot_vec4: pool.slot_vec4(),
                        first_slot: first as u32,
                        chunk_slots: pool.slots_per_chunk.min(pool.slots - first) as u32,
                        flags,
                        j_base: j0 as u32,
                        ..Default::default()
                    },
                    &step,
                    &[h, &ids_b, &slot_b, chunk, out],
                    [
                        Dim::Const(groups64(hid)),
                        Dim::Const(count as u32),
                        Dim::Tokens,
                    ],
                );
            }
        };
    let mut prog = Program::default();
    push_gate_up(&mut prog, (0, k), &h_out);
    push_down(&mut prog, (0, k), &h_b, &y_b);
    run(ctx, &prog, t);
    let mut chain = Program::default();
    let h_tmp = f32_buf(ctx, &vec![0.0; t * k * inter]);
    push_gate_up(&mut chain, (0, k), &h_tmp);
    push_down(&mut chain, (0, k), &h_tmp, &y_chain);
    run(ctx, &chain, t);
    // The same chain with the top-k indices split over dispatches by j_base: [0, 1), [1, k).
    let y_split = f32_buf(ctx, &vec![f32::NAN; t * k * hid]);
    let mut split = Program::default();
    let h_tmp2 = f32_buf(ctx, &vec![0.0; t * k * inter]);
    let ranges: Vec<(usize, usize)> = if k > 1 {
        vec![(0, 1), (1, k - 1)]
    } else {
        vec![(0, 1)]
    };
    for &r in &ranges {
        push_gate_up(&mut split, r, &h_tmp2);
        push_down(&mut split, r, &h_tmp2, &y_split);
    }
    run(ctx, &split, t);

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
        "H {hid} I {inter} T {t} {mode} chunks {}",
        pool.chunks.len()
    );
    check(
        &format!("ffn_gate_up {what}"),
        &read_f32(ctx, &h_out, t * k * inter),
        &want_h,
        FFN_TOL,
    );
    check(
        &format!("ffn_down {what}"),
        &read_f32(ctx, &y_b, t * k * hid),
        &want_y,
        FFN_TOL,
    );
    check(
        &format!("ffn_gate_up+down {what}"),
        &read_f32(ctx, &y_chain, t * k * hid),
        &want_chain,
        FFN_TOL,
    );
    check(
        &format!("ffn_gate_up+down by j_base {ranges:?} {what}"),
        &read_f32(ctx, &y_split, t * k * hid),
        &want_chain,
        FFN_TOL,
    );
}

#[test]
fn ffn_routed_matches_cpu() {
    let ctx = gpu(None);
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
    ffn_case(&ctx, 800, &c(13, 20, 7, 9, 3, 5), 1);
    ffn_case(&ctx, 801, &c(16, 24, 60, 60, 8, 2), 1);
    ffn_case(&ctx, 802, &c(7, 65, 5, 5, 1, 9), 1);
    ffn_case(&ctx, 803, &c(100, 1, 5, 6, 3, 1), 1);
}

#[test]
fn ffn_fixed_slot_matches_cpu() {
    let ctx = gpu(None);
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
    ffn_case(&ctx, 810, &c(100, 44, 6, 100), 1);
    ffn_case(&ctx, 811, &c(13, 70, 1, 16), 1);
    ffn_case(&ctx, 812, &c(64, 257, 5, 64), 1);
}

#[test]
fn ffn_split_pool_matches_cpu() {
    // H 13, I 20: a slot is 2*20*16 + 13*24 halves = 1904 bytes; a 6 KiB binding holds 3.
    let slot = ExpertPool::slot_bytes(13, 20);
    let ctx = gpu(Some(3 * slot + 16));
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
    ffn_case(&ctx, 820, &c, 3);
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
    ffn_case(&ctx, 821, &c, 3);
}

// ---------------------------------------------------------------------------------------------
// moe_combine

#[allow(clippy::too_many_arguments)]
fn combine_case(
    ctx: &GpuContext,
    seed: u64,
    t: usize,
    hid: usize,
    top_k: usize,
    flags: u32,
    gate_stride: usize,
    gate_col: usize,
) {
    use combine_flags::*;
    let mut rng = Rng::new(seed);
    let x0 = rng.vec(t * hid, 2.0);
    let y = rng.vec(t * top_k * hid, 2.0);
    let w = rng
        .vec(t * top_k, 1.0)
        .iter()
        .map(|v| v.abs())
        .collect::<Vec<_>>();
    let shared = rng.vec(t * hid, 2.0);
    let router = rng.vec(t * gate_stride, 4.0);
    let step = step_buf(ctx, 0, t);
    let (yb, wb, sb, rb) = (
        f32_buf(ctx, &y),
        f32_buf(ctx, &w),
        f32_buf(ctx, &shared),
        f32_buf(ctx, &router),
    );
    let x = f32_buf(ctx, &x0);
    let mut prog = Program::default();
    prog.push(
        ctx,
        Kernel::MoeCombine,
        &MoeCombineParams {
            hidden: hid as u32,
            top_k: top_k as u32,
            flags,
            gate_stride: gate_stride as u32,
            gate_col: gate_col as u32,
            _pad: [0; 3],
        },
        &step,
        &[&yb, &wb, &sb, &rb, &x],
        [Dim::Const(groups64(hid)), Dim::Tokens, Dim::Const(1)],
    );
    run(ctx, &prog, t);
    let gates: Vec<f32> = (0..t)
        .map(|ti| router[ti * gate_stride + gate_col])
        .collect();
    let routed = (flags & ROUTED != 0).then_some(Routed {
        y: &y,
        weights: &w,
        top_k,
    });
    let want = cpu_ref::moe_combine(
        &x0,
        hid,
        routed,
        (flags & SHARED != 0).then_some(&shared[..]),
        (flags & SHARED_GATED != 0).then_some(&gates[..]),
    )
    .unwrap();
    check(
        &format!("moe_combine T {t} H {hid} top {top_k} flags {flags:#b}"),
        &read_f32(ctx, &x, t * hid),
        &want,
        COMBINE_TOL,
    );
}

#[test]
fn moe_combine_matches_cpu() {
    use combine_flags::*;
    let ctx = gpu(None);
    combine_case(&ctx, 900, 5, 13, 3, ROUTED, 7, 0);
    combine_case(&ctx, 901, 7, 100, 8, ROUTED | SHARED | SHARED_GATED, 61, 60);
    combine_case(&ctx, 902, 1, 70, 1, SHARED, 5, 0);
    combine_case(&ctx, 903, 9, 7, 1, ROUTED | SHARED, 4, 3);
}

// ---------------------------------------------------------------------------------------------
// argmax

fn argmax_case(
    ctx: &GpuContext,
    what: &str,
    logits: &[f32],
    n: usize,
    last_row: bool,
    suppress: &[u32],
) -> u32 {
    let rows = logits.len() / n;
    let step = step_buf(ctx, 0, rows);
    let lb = f32_buf(ctx, logits);
    let token = u32_buf(ctx, &[u32::MAX - 1; 4]);
    let mut sup = [0u32; 4];
    sup[..suppress.len()].copy_from_slice(suppress);
    // Entries past n_suppress must be ignored: fill them with the row's true argmax.
    let row = if last_row {
        &logits[(rows - 1) * n..]
    } else {
        &logits[..n]
    };
    let unsuppressed = cpu_ref::argmax(row, &[]);
    for s in sup.iter_mut().skip(suppress.len()) {
        *s = unsuppressed;
    }
    let mut prog = Program::default();
    prog.push(
        ctx,
        Kernel::Argmax,
        &ArgmaxParams {
            n: n as u32,
            n_suppress: suppress.len() as u32,
            row_stride: n as u32,
            flags: last_row as u32,
            suppress: sup,
        },
        &step,
        &[&lb, &token],
        [Dim::Const(1), Dim::Const(1), Dim::Const(1)],
    );
    run(ctx, &prog, rows);
    let got = read_u32(ctx, &token, 1)[0];
    // A row holding NaN or ±inf is flagged with u32::MAX (the host reports the step).
    let want = if row.iter().any(|x| !x.is_finite()) {
        u32::MAX
    } else {
        cpu_ref::argmax(row, suppress)
    };
    eprintln!("argmax {what}: gpu {got} cpu {want}");
    assert_eq!(
        got, want,
        "argmax {what}: n {n} rows {rows} last_row {last_row} suppress {suppress:?}"
    );
    got
}

#[test]
fn argmax_matches_cpu() {
    let ctx = gpu(None);
    let mut rng = Rng::new(1000);
    for &n in &[1usize, 5, 255, 256, 257, 1000, 3001] {
        let logits = rng.vec(n, 10.0);
        argmax_case(&ctx, &format!("random n {n}"), &logits, n, false, &[]);
    }
    let logits = rng.vec(5 * 700, 10.0);
    argmax_case(&ctx, "last of 5 rows", &logits, 700, true, &[]);
}

#[test]
fn argmax_ties_and_suppression() {
    let ctx = gpu(None);
    let mut rng = Rng::new(1001);
    let n = 3001;
    let mut logits = rng.vec(n, 10.0);
    for i in [17, 300, 2999] {
        logits[i] = 20.0;
    }
    assert_eq!(argmax_case(&ctx, "tie", &logits, n, false, &[]), 17);
    assert_eq!(
        argmax_case(&ctx, "tie, first suppressed", &logits, n, false, &[17]),
        300
    );
    assert_eq!(
        argmax_case(
            &ctx,
            "tie, all suppressed",
            &logits,
            n,
            false,
            &[2999, 17, 300]
        ),
        cpu_ref::argmax(&logits, &[17, 300, 2999])
    );
    argmax_case(
        &ctx,
        "four suppressed",
        &logits,
        n,
        false,
        &[300, 17, 0, 2999],
    );
    // Ties across lanes of the reduction: equal maxima at indices 255, 256 and 511.
    let mut flat = vec![1.0f32; 600];
    for i in [511, 256, 255] {
        flat[i] = 2.0;
    }
    assert_eq!(
        argmax_case(&ctx, "cross-lane tie", &flat, 600, false, &[]),
        255
    );
    assert_eq!(
        argmax_case(&ctx, "all equal", &[3.0; 300], 300, false, &[0]),
        1
    );
    // Rows: the last one decides, suppression applies to it.
    let mut rows = rng.vec(3 * 40, 1.0);
    rows[2 * 40 + 7] = 5.0;
    rows[2 * 40 + 9] = 4.0;
    rows[9] = 9.0;
    assert_eq!(
        argmax_case(&ctx, "last row, suppressed", &rows, 40, true, &[7]),
        9
    );
}

/// A row holding NaN or ±inf (the model's numbers broke down) must not yield a token:
/// the kernel writes u32::MAX, which the host turns into an error naming the step (and it
/// never submits a step after it). A finite row with a suppressed best id still gives the
/// best unsuppressed one.
#[test]
fn argmax_flags_non_finite_rows() {
    let ctx = gpu(None);
    let neg = vec![f32::NEG_INFINITY; 300];
    argmax_case(&ctx, "all -inf", &neg, 300, false, &[]);
    argmax_case(&ctx, "all -inf, first suppressed", &neg, 300, false, &[0]);
    let mut one = vec![0.5f32; 300];
    one[0] = 1.0;
    assert_eq!(
        argmax_case(&ctx, "finite, best suppressed", &one, 300, false, &[0]),
        1
    );
    argmax_case(&ctx, "all NaN", &[f32::NAN; 300], 300, false, &[]);
    for (bad, at) in [
        (f32::NAN, 299usize),
        (f32::INFINITY, 7),
        (f32::NEG_INFINITY, 128),
    ] {
        let mut row = vec![0.25f32; 300];
        row[at] = bad;
        let got = argmax_case(&ctx, &format!("{bad} at {at}"), &row, 300, false, &[]);
        assert_eq!(got, u32::MAX);
    }
    // Only the row read counts (the last of 3).
    let mut rows = vec![f32::NAN; 600];
    rows.extend((0..300).map(|i| i as f32));
    assert_eq!(
        argmax_case(&ctx, "NaN rows before the last", &rows, 300, true, &[]),
        299
    );
}

/// The one-token matmul (x in a 64 KiB uniform window, matmul_u.wgsl) computes exactly what
/// the storage matmul does for that token: bit-identical, with bias and accumulate, K not a
/// multiple of 8, and a matrix split into chunks.
#[test]
fn matmul_uniform_decode_equals_storage_matmul() {
    for &(k, n, cap) in &[
        (1usize, 3usize, None),
        (13, 70, None),
        (64, 65, None),
        (257, 130, Some(4096u64)),
        (2048, 300, None),
        (4100, 64, None),
    ] {
        let ctx = gpu(cap);
        let mut rng = Rng((k * 131 + n) as u64 | 1);
        let w = rng.f16s(n * k, 0.5);
        let m = F16Matrix::upload(&ctx, "w", n, k, &w).unwrap();
        let xv = rng.vec(k, 1.0);
        let x = ctx.buffer(
            "x_uniform",
            (k * 4).max(UNIFORM_ACTIVATION_BYTES) as u64,
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::UNIFORM
                | wgpu::BufferUsages::COPY_DST,
        );
        ctx.write(&x, 0, bytemuck::cast_slice(&xv));
        let bias = f32_buf(&ctx, &rng.vec(n, 1.0));
        let out0 = rng.vec(n, 1.0);
        let step = step_buf(&ctx, 0, 1);
        let mut outs = Vec::new();
        for kernel in [Kernel::Matmul, Kernel::MatmulU] {
            let out = f32_buf(&ctx, &out0);
            let mut prog = Program::default();
            for c in &m.chunks {
                prog.push(
                    &ctx,
                    kernel,
                    &MatmulParams {
                        k: k as u32,
                        n_rows: c.rows as u32,
                        row_base: c.row_start as u32,
                        vec4_per_row: m.vec4_per_row(),
                        x_stride: k as u32,
                        out_stride: n as u32,
                        flags: matmul_flags::BIAS | matmul_flags::ACCUMULATE,
                        _pad: 0,
                    },
                    &step,
                    &[&x, &c.buffer, &bias, &out],
                    [Dim::Const(groups64(c.rows)), Dim::Const(1), Dim::Const(1)],
                );
            }
            run(&ctx, &prog, 1);
            outs.push(read_f32(&ctx, &out, n));
        }
        assert!(outs[0].iter().all(|v| v.is_finite()));
        for (i, (a, b)) in outs[0].iter().zip(&outs[1]).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "K {k} N {n}: row {i}: storage {a} vs uniform {b}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Window kernels (multi-token steps on CPU adapters): matmul_w, attention_w

/// A zero-filled buffer holding `data` that can also be bound as 64 KiB uniform windows
/// starting at any row (as forward.rs allocates the activations).
fn window_capable(ctx: &GpuContext, data: &[f32]) -> GpuBuffer {
    let b = ctx.buffer(
        "window_act",
        (data.len() * 4 + UNIFORM_ACTIVATION_BYTES) as u64,
        wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::UNIFORM
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC,
    );
    ctx.write(&b, 0, bytemuck::cast_slice(data));
    b
}

/// matmul_w over a program recorded for `chunk` tokens (windows of `window_tokens`, as
/// forward.rs records them), run on a step of t <= chunk tokens; returns the window size.
fn matmul_w_case(ctx: &GpuContext, seed: u64, c: MatmulCase, chunk: usize) -> usize {
    let MatmulCase {
        t,
        k,
        n,
        out_stride,
        flags,
        ..
    } = c;
    let data = MatmulData::new(seed, &c);
    let (xs, w, bias, out0) = (&data.xs, &data.w, &data.bias, &data.out0);
    let last = flags & matmul_flags::LAST_TOKEN_ONLY != 0;
    let has_bias = flags & matmul_flags::BIAS != 0;
    let out_rows = c.out_rows();
    let m = F16Matrix::upload(ctx, "w", n, k, w).unwrap();
    let align = ctx.limits.min_uniform_buffer_offset_alignment as usize;
    let tw = wgmoe::model::forward::window_tokens(k * 4, chunk, align);
    assert!(tw > 0, "K {k} chunk {chunk}: no window fits");
    // Rows past the step's tokens hold NaN: a window must never read them into a result.
    let mut xfull = xs.clone();
    xfull.resize(chunk * k, f32::NAN);
    let x = window_capable(ctx, &xfull);
    let step = step_buf(ctx, 0, t);
    let b = if has_bias {
        f32_buf(ctx, bias)
    } else {
        dummy(ctx)
    };
    let out = f32_buf(ctx, out0);
    let mut prog = Program::default();
    for ch in &m.chunks {
        for t0 in (0..chunk).step_by(tw) {
            let gate = if last {
                Dim::LastIn {
                    first: t0 as u32,
                    len: tw as u32,
                }
            } else {
                Dim::Window {
                    first: t0 as u32,
                    per_token: 1,
                }
            };
            let ty = if last {
                1
            } else {
                (tw as u32).div_ceil(MATMUL_W_TOKENS_PER_THREAD)
            };
            prog.push_window(
                ctx,
                Kernel::MatmulW,
                &MatmulWParams {
                    k: k as u32,
                    n_rows: ch.rows as u32,
                    row_base: ch.row_start as u32,
                    vec4_per_row: m.vec4_per_row(),
                    t0: t0 as u32,
                    out_stride: out_stride as u32,
                    flags,
                    tw: tw as u32,
                },
                &step,
                &[&x, &ch.buffer, &b, &out],
                [Dim::Const(groups64(ch.rows)), Dim::Const(ty), gate],
                (t0 * k * 4) as u64,
                None,
            );
        }
    }
    run(ctx, &prog, t);
    let want = data.want(&c);
    let what = format!(
        "matmul_w T {t} of chunk {chunk} (windows of {tw}) K {k} N {n} out stride {out_stride} flags {flags:#b} chunks {}",
        m.chunks.len()
    );
    check(
        &what,
        &read_f32(ctx, &out, out_rows * out_stride),
        &want,
        MATMUL_TOL,
    );
    tw
}

#[test]
fn matmul_window_matches_cpu() {
    use matmul_flags::*;
    let ctx = gpu(None);
    assert!(
        ctx.kernels.uses_subgroups(),
        "lavapipe has subgroups: matmul_w must be built"
    );
    // (case, chunk): one window; several (K = 1024: 16 tokens, K = 2048: 8); the step
    // shorter than the chunk (windows skipped); K % 8 == 4; the last token in a later
    // window; rows not a multiple of 64; bias and accumulation.
    let cases = [
        (MatmulCase::new(5, 8, 3, 0), 5),
        (MatmulCase::new(9, 100, 70, BIAS), 16),
        (MatmulCase::new(17, 260, 130, ACCUMULATE | BIAS), 17),
        (MatmulCase::new(40, 1024, 33, 0), 64),
        (MatmulCase::new(33, 2048, 20, ACCUMULATE), 40),
        (MatmulCase::new(33, 2048, 20, LAST_TOKEN_ONLY | BIAS), 40),
        (MatmulCase::new(3, 1024, 70, LAST_TOKEN_ONLY), 64),
        (
            MatmulCase {
                t: 12,
                k: 64,
                n: 61,
                x_stride: 64,
                out_stride: 67,
                flags: BIAS,
            },
            12,
        ),
    ];
    let mut windows = Vec::new();
    for (i, (c, chunk)) in cases.into_iter().enumerate() {
        windows.push(matmul_w_case(&ctx, 1500 + i as u64, c, chunk));
    }
    assert!(
        windows.iter().any(|&tw| tw < 16),
        "some case must use several windows"
    );
}

#[test]
fn matmul_window_split_matrix_matches_cpu() {
    use matmul_flags::*;
    let ctx = gpu(Some(4096));
    matmul_w_case(&ctx, 1600, MatmulCase::new(20, 1024, 9, BIAS), 20);
    matmul_w_case(&ctx, 1601, MatmulCase::new(7, 256, 70, LAST_TOKEN_ONLY), 24);
}

/// Window sizes: whole chunks when they fit 64 KiB; otherwise window starts on the
/// uniform offset alignment; none when a row alone is too large or no multiple aligns.
#[test]
fn window_tokens_respects_size_and_alignment() {
    use wgmoe::model::forward::window_tokens;
    assert_eq!(window_tokens(4096, 64, 256), 16);
    assert_eq!(window_tokens(8192, 64, 256), 8);
    assert_eq!(window_tokens(4096, 10, 256), 10);
    assert_eq!(window_tokens(65536 + 4, 2, 256), 0);
    // 1412 floats = 5648 bytes: 11 rows fit, but starts align only every 16 rows.
    assert_eq!(window_tokens(5648, 64, 256), 0);
    assert_eq!(window_tokens(5648, 11, 256), 11);
    // 1000 floats = 4000 bytes: 16 rows fit, starts align every 8 rows.
    assert_eq!(window_tokens(4000, 64, 256), 16);
    assert_eq!(window_tokens(400, 500, 256), 160);
    assert_eq!(window_tokens(1036, 300, 256), 0);
    for (row, chunk) in [(4000usize, 64usize), (400, 500), (4096, 64), (1056, 300)] {
        let tw = window_tokens(row, chunk, 256);
        assert!(tw * row <= UNIFORM_ACTIVATION_BYTES && tw >= 1);
        assert!(tw == chunk || (tw * row) % 256 == 0, "row {row}: {tw}");
    }
}

fn attention_w_case(ctx: &GpuContext, seed: u64, c: &AttnCase) {
    let AttnCase { heads, t, pos0, .. } = *c;
    let (q_dim, kv_dim, hd) = (heads.q_dim(), heads.kv_dim(), heads.head_dim);
    let positions = pos0 + t + 2;
    let mut rng = Rng::new(seed);
    let q = rng.vec(t * q_dim, 3.0);
    let mut cache_k = rng.vec(positions * kv_dim, 1.0);
    let cache_v = rng.vec(positions * kv_dim, 1.0);
    cache_k[(pos0 + t) * kv_dim..].fill(f32::NAN);
    let mut cache_v_gpu = cache_v.clone();
    cache_v_gpu[(pos0 + t) * kv_dim..].fill(f32::NAN);
    let step = step_buf(ctx, pos0, t);
    let qb = f32_buf(ctx, &q);
    let ck = f32_buf(ctx, &cache_k);
    let cv = f32_buf(ctx, &cache_v_gpu);
    let scratch = f32_buf(ctx, &vec![0.0; t * heads.n_heads * positions]);
    let out = f32_buf(ctx, &vec![f32::NAN; t * q_dim]);
    let mut prog = Program::default();
    prog.push(
        ctx,
        Kernel::AttentionW,
        &AttentionParams {
            n_heads: heads.n_heads as u32,
            n_kv: heads.n_kv as u32,
            head_dim: hd as u32,
            scratch_stride: positions as u32,
            scale: (hd as f32).powf(-0.5),
            _pad: [0; 3],
        },
        &step,
        &[&qb, &ck, &cv, &scratch, &out],
        [
            Dim::Const(heads.n_heads as u32),
            Dim::TokensDiv(ATTENTION_W_TOKENS),
            Dim::Const(1),
        ],
    );
    run(ctx, &prog, t);
    let visible = (pos0 + t) * kv_dim;
    let want =
        cpu_ref::attention(&q, heads, &cache_k[..visible], &cache_v[..visible], pos0).unwrap();
    let what = format!(
        "attention_w heads {}/{} dim {hd} T {t} pos0 {pos0}",
        heads.n_heads, heads.n_kv
    );
    check(&what, &read_f32(ctx, &out, t * q_dim), &want, ATTENTION_TOL);
}

#[test]
fn attention_window_matches_cpu() {
    let ctx = gpu(None);
    let h = |n_heads, n_kv, head_dim| Heads {
        n_heads,
        n_kv,
        head_dim,
    };
    let mut cases: Vec<AttnCase> = attn_cases()
        .into_iter()
        .filter(|c| c.heads.head_dim % 4 == 0)
        .collect();
    // Token groups of 8 with a partial last one, more than 64 keys (several key passes),
    // head dims above 64 (several dim passes) and GQA.
    for (heads, t, pos0) in [
        (h(4, 2, 64), 20, 0),
        (h(2, 2, 132), 9, 60),
        (h(3, 1, 16), 70, 0),
        (h(16, 16, 64), 64, 5),
        (h(2, 1, 4), 17, 130),
    ] {
        cases.push(AttnCase {
            heads,
            t,
            pos0,
            flags: 0,
        });
    }
    for (i, c) in cases.iter().enumerate() {
        attention_w_case(&ctx, 1700 + i as u64, c);
    }
}

//! The dense kernels (embed, rmsnorm, the f16 matmuls: storage, one-token uniform window,
//! multi-token windows, and the greedy argmax) against their CPU references (`wgmoe::cpu_ref`) on seeded random
//! inputs and awkward shapes. Programs are built by the forward pass's op builders
//! (`wgmoe::model::ops`); where a case needs a kernel parameter a builder does not expose
//! (strides, last-token rmsnorm) that one op is built or patched directly. Runs on
//! lavapipe in CI; a missing adapter is a failure, never a skip. Differences are measured
//! as described in tests/common/check.rs; each kernel has its own named tolerance.

mod common;

use common::check::{check, strided};
use common::dense::*;
use common::gpu::*;
use common::rng::Rng;
use wgmoe::backend::params::*;
use wgmoe::backend::plan::{window_tokens, DecodeKernels, PrefillKernels};
use wgmoe::backend::{
    binds, groups64, Bind, Device, Dim, Kernel, KernelOverrides, KernelPlan, Op, Program, Resource,
};
use wgmoe::cpu_ref;
use wgmoe::model::ops::{self, OpEnv};
use wgmoe::model::tensors::{upload_f16_vec, F16Matrix};

/// f16 to f32 is exact and embed only copies.
const EMBED_TOL: f32 = 0.0;
/// Sum of squares in a different order (64 partial sums) and inverseSqrt vs 1/sqrt.
const RMSNORM_TOL: f32 = 1e-5;
/// f32 accumulation order: the GPU sums 8 products at a time (two dot4) per step.
const MATMUL_TOL: f32 = 2e-5;

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
    let dev = device(cap);
    let mut rng = Rng::new(seed);
    let table = rng.f16s(vocab * hidden, 2.0);
    let m = F16Matrix::upload(&dev, "embed", vocab, hidden, &table).unwrap();
    assert!(
        m.chunks.len() >= min_chunks,
        "expected >= {min_chunks} chunks, got {}",
        m.chunks.len()
    );
    let t = ids.len();
    let step = dev.step_buffer(0, t).unwrap();
    let ids_b = u32_buf(&dev, ids);
    let x = f32_buf(&dev, &vec![f32::NAN; t * hidden]);
    let mut prog = Program::default();
    ops::embed(&mut prog, &m, &ids_b, &x, hidden);
    assert_eq!(prog.len(), m.chunks.len(), "embed: one op per table chunk");
    run(&dev, prog, &step, t);
    let want = cpu_ref::embed(&table, hidden, ids).unwrap();
    let what = format!(
        "embed vocab {vocab} hidden {hidden} T {t} chunks {}",
        m.chunks.len()
    );
    check(&what, &read_f32(&dev, &x, t * hidden), &want, EMBED_TOL);
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

/// Dense rows through `ops::rmsnorm`; strided rows and the last-token-only variant (which
/// the builder does not expose) as that one op built directly.
fn rmsnorm_case(
    dev: &Device,
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
    let step = dev.step_buffer(0, t).unwrap();
    let x = f32_buf(dev, &strided(&rows, n, x_stride, 100.0));
    let w = upload_f16_vec(dev, "norm", &weight).unwrap();
    let out_rows = if last_only { 1 } else { t };
    let sentinel = -7.0;
    let out = f32_buf(dev, &vec![sentinel; out_rows * out_stride]);
    let mut prog = Program::default();
    if x_stride == n && out_stride == n && !last_only {
        ops::rmsnorm(&mut prog, &w, &x, &out, n, eps);
    } else {
        prog.push(Op::new(
            Kernel::RmsNorm,
            &RmsNormParams {
                n: n as u32,
                x_stride: x_stride as u32,
                out_stride: out_stride as u32,
                flags: if last_only { flags::LAST_TOKEN_ONLY } else { 0 },
                eps,
                ..Default::default()
            },
            binds(&[&x, &w, &out]),
            [
                if last_only {
                    Dim::Const(1)
                } else {
                    Dim::Tokens
                },
                Dim::Const(1),
                Dim::Const(1),
            ],
        ));
    }
    run(dev, prog, &step, t);
    let mut want = cpu_ref::rmsnorm(&rows, &weight, eps).unwrap();
    if last_only {
        want = want[(t - 1) * n..].to_vec();
    }
    let want = strided(&want, n, out_stride, sentinel);
    let what = format!("rmsnorm T {t} n {n} strides {x_stride}/{out_stride} last_only {last_only}");
    check(
        &what,
        &read_f32(dev, &out, out_rows * out_stride),
        &want,
        RMSNORM_TOL,
    );
}

#[test]
fn rmsnorm_matches_cpu() {
    let dev = device(None);
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
        rmsnorm_case(&dev, 10 + i as u64, t, n, n, n, false);
    }
    rmsnorm_case(&dev, 20, 5, 100, 103, 101, false);
    rmsnorm_case(&dev, 21, 6, 257, 257, 257, true);
    rmsnorm_case(&dev, 22, 1, 13, 16, 13, true);
}

// ---------------------------------------------------------------------------------------------
// matmul
/// The storage matmul (x in storage, any plan); x rows `x_stride` floats apart (set in the
/// recorded ops where it is not K, which `ops::matmul` does not expose).
fn matmul_case(dev: &Device, seed: u64, c: MatmulCase, min_chunks: usize) -> f32 {
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
    let has_bias = flags & flags::MATMUL_BIAS != 0;
    let out_rows = c.out_rows();
    let m = F16Matrix::upload(dev, "w", n, k, w).unwrap();
    assert!(
        m.chunks.len() >= min_chunks,
        "expected >= {min_chunks} chunks, got {}",
        m.chunks.len()
    );
    let step = dev.step_buffer(0, t).unwrap();
    // Stride padding holds NaN: any read of it poisons the result.
    let x = f32_buf(dev, &strided(xs, k, x_stride, f32::NAN));
    let b = has_bias.then(|| f32_buf(dev, bias));
    let out = f32_buf(dev, out0);
    let d = dummy(dev);
    let plan = plan(dev, &KernelOverrides::default());
    let env = OpEnv {
        plan: &plan,
        chunk: t,
        dummy: &d,
    };
    let mut prog = Program::default();
    push_matmul(&mut prog, &env, &m, &x, b.as_ref(), &out, out_stride, flags);
    assert_eq!(prog.len(), m.chunks.len(), "matmul: one op per chunk");
    for op in &mut prog.ops {
        assert_eq!(
            op.kernel,
            Kernel::Matmul,
            "x in storage: the storage matmul"
        );
        assert!(
            op.decode.is_none(),
            "x in storage: no one-token alternative"
        );
        if x_stride != k {
            patch_params(op, |p: &mut MatmulParams| p.x_stride = x_stride as u32);
        }
    }
    run(dev, prog, &step, t);
    let want = data.want(&c);
    let what = format!(
        "matmul T {t} K {k} N {n} strides {x_stride}/{out_stride} flags {flags:#b} chunks {}",
        m.chunks.len()
    );
    check(
        &what,
        &read_f32(dev, &out, out_rows * out_stride),
        &want,
        MATMUL_TOL,
    )
}

#[test]
fn matmul_matches_cpu() {
    use flags::{MATMUL_ACCUMULATE as ACCUMULATE, MATMUL_BIAS as BIAS};
    let dev = device(None);
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
        matmul_case(&dev, 100 + i as u64, c, 1);
    }
}

#[test]
fn matmul_last_token_only_matches_cpu() {
    use flags::{LAST_TOKEN_ONLY, MATMUL_ACCUMULATE as ACCUMULATE, MATMUL_BIAS as BIAS};
    let dev = device(None);
    matmul_case(&dev, 200, MatmulCase::new(6, 100, 70, LAST_TOKEN_ONLY), 1);
    matmul_case(&dev, 201, MatmulCase::new(1, 7, 5, LAST_TOKEN_ONLY), 1);
    matmul_case(
        &dev,
        202,
        MatmulCase::new(9, 257, 130, LAST_TOKEN_ONLY | BIAS | ACCUMULATE),
        1,
    );
    matmul_case(
        &dev,
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
    use flags::{LAST_TOKEN_ONLY, MATMUL_ACCUMULATE as ACCUMULATE, MATMUL_BIAS as BIAS};
    // A 4 KiB binding: rows of K = 1408 (2816 bytes) go one to a chunk, K = 257 (528 bytes)
    // seven, K = 100 (208 bytes) nineteen.
    let dev = device(Some(4096));
    matmul_case(&dev, 300, MatmulCase::new(7, 257, 70, BIAS), 10);
    matmul_case(&dev, 301, MatmulCase::new(5, 1408, 9, ACCUMULATE), 9);
    matmul_case(
        &dev,
        302,
        MatmulCase::new(6, 100, 130, LAST_TOKEN_ONLY | BIAS),
        7,
    );
}

/// The one-token matmul (x in a 64 KiB uniform window, matmul_u.wgsl) computes exactly what
/// the storage matmul does for that token: bit-identical, with bias and accumulate, K not a
/// multiple of 8, and a matrix split into chunks. Both kernels run as the same ops built
/// directly (the builder takes the uniform kernel only for K >= 256); where it does, the
/// one-token alternative `ops::matmul` records is that kernel and gives the same bits.
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
        let dev = device(cap);
        let mut rng = Rng((k * 131 + n) as u64 | 1);
        let w = rng.f16s(n * k, 0.5);
        let m = F16Matrix::upload(&dev, "w", n, k, &w).unwrap();
        let xv = rng.vec(k, 1.0);
        let x = uniform_buf(&dev, &xv);
        let bias = f32_buf(&dev, &rng.vec(n, 1.0));
        let out0 = rng.vec(n, 1.0);
        let step = dev.step_buffer(0, 1).unwrap();
        let mut outs = Vec::new();
        for kernel in [Kernel::Matmul, Kernel::MatmulUniform] {
            let out = f32_buf(&dev, &out0);
            let mut prog = Program::default();
            for c in &m.chunks {
                let mut b = binds(&[&x, &c.buffer, &bias, &out]);
                if kernel == Kernel::MatmulUniform {
                    b[0] = Bind {
                        binding: 2,
                        resource: Resource::Window {
                            buffer: x.clone(),
                            offset: 0,
                        },
                    };
                }
                prog.push(Op::new(
                    kernel,
                    &MatmulParams {
                        k: k as u32,
                        n_rows: c.rows as u32,
                        row_base: c.row_start as u32,
                        vec4_per_row: m.words_per_row(c),
                        x_stride: k as u32,
                        out_stride: n as u32,
                        flags: flags::MATMUL_BIAS | flags::MATMUL_ACCUMULATE,
                        _a: 0,
                    },
                    b,
                    [Dim::Const(groups64(c.rows)), Dim::Const(1), Dim::Const(1)],
                ));
            }
            run(&dev, prog, &step, 1);
            outs.push(read_f32(&dev, &out, n));
        }
        let uniform_plan = plan(
            &dev,
            &KernelOverrides {
                decode: Some(DecodeKernels::Uniform),
                ..Default::default()
            },
        );
        if uniform_plan.matmul_decode_uniform(k) {
            let out = f32_buf(&dev, &out0);
            let d = dummy(&dev);
            let env = OpEnv {
                plan: &uniform_plan,
                chunk: 1,
                dummy: &d,
            };
            let mut prog = Program::default();
            ops::matmul(
                &mut prog,
                &env,
                &m,
                &x,
                Some(&bias),
                &out,
                n,
                flags::MATMUL_ACCUMULATE,
            );
            assert!(
                prog.ops
                    .iter()
                    .all(|o| o.decode.as_ref().map(|d| d.kernel) == Some(Kernel::MatmulUniform)),
                "K {k}: ops::matmul's one-token alternative is the uniform matmul"
            );
            run(&dev, prog, &step, 1);
            outs.push(read_f32(&dev, &out, n));
        }
        assert!(outs[0].iter().all(|v| v.is_finite()));
        for o in &outs[1..] {
            for (i, (a, b)) in outs[0].iter().zip(o).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "K {k} N {n}: row {i}: storage {a} vs uniform {b}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Window matmul (multi-token steps on CPU adapters): matmul_w

/// The plan with window prefill, where the device runs the window kernels.
fn window_plan(dev: &Device) -> Option<KernelPlan> {
    subgroup_kernels(dev, Kernel::MatmulWindow).then(|| {
        let p = plan(
            dev,
            &KernelOverrides {
                prefill: Some(PrefillKernels::Window),
                ..Default::default()
            },
        );
        assert!(p.window_prefill && p.subgroups);
        p
    })
}

/// matmul_w through `ops::matmul` over a program recorded for `chunk` tokens (windows of
/// `plan.matmul_window_tokens`), x window-capable, run on a step of t <= chunk tokens;
/// returns the window size.
fn matmul_w_case(dev: &Device, plan: &KernelPlan, seed: u64, c: MatmulCase, chunk: usize) -> usize {
    let MatmulCase {
        t,
        k,
        n,
        out_stride,
        flags,
        ..
    } = c;
    assert_eq!(c.x_stride, k, "the window matmul reads rows of K floats");
    let data = MatmulData::new(seed, &c);
    let (xs, w, bias, out0) = (&data.xs, &data.w, &data.bias, &data.out0);
    let has_bias = flags & flags::MATMUL_BIAS != 0;
    let out_rows = c.out_rows();
    let m = F16Matrix::upload(dev, "w", n, k, w).unwrap();
    let tw = plan.matmul_window_tokens(k, chunk);
    assert!(tw > 0, "K {k} chunk {chunk}: no window fits");
    let align = dev.info().limits.min_uniform_buffer_offset_alignment as usize;
    assert_eq!(tw, window_tokens(k * 4, chunk, align));
    // Rows past the step's tokens hold NaN: a window must never read them into a result.
    let mut xfull = xs.clone();
    xfull.resize(chunk * k, f32::NAN);
    let x = window_buf(dev, &xfull);
    let step = dev.step_buffer(0, t).unwrap();
    let b = has_bias.then(|| f32_buf(dev, bias));
    let out = f32_buf(dev, out0);
    let d = dummy(dev);
    let env = OpEnv {
        plan,
        chunk,
        dummy: &d,
    };
    let mut prog = Program::default();
    push_matmul(&mut prog, &env, &m, &x, b.as_ref(), &out, out_stride, flags);
    assert_eq!(
        prog.len(),
        m.chunks.len() * chunk.div_ceil(tw),
        "matmul_w: one op per chunk and window"
    );
    assert!(
        prog.ops.iter().all(|o| o.kernel == Kernel::MatmulWindow),
        "window-capable x, window plan: the window matmul"
    );
    run(dev, prog, &step, t);
    let want = data.want(&c);
    let what = format!(
        "matmul_w T {t} of chunk {chunk} (windows of {tw}) K {k} N {n} out stride {out_stride} flags {flags:#b} chunks {}",
        m.chunks.len()
    );
    check(
        &what,
        &read_f32(dev, &out, out_rows * out_stride),
        &want,
        MATMUL_TOL,
    );
    tw
}

#[test]
fn matmul_window_matches_cpu() {
    use flags::{LAST_TOKEN_ONLY, MATMUL_ACCUMULATE as ACCUMULATE, MATMUL_BIAS as BIAS};
    let dev = device(None);
    let Some(plan) = window_plan(&dev) else {
        return;
    };
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
        windows.push(matmul_w_case(&dev, &plan, 1500 + i as u64, c, chunk));
    }
    assert!(
        windows.iter().any(|&tw| tw < 16),
        "some case must use several windows"
    );
}

#[test]
fn matmul_window_split_matrix_matches_cpu() {
    use flags::{LAST_TOKEN_ONLY, MATMUL_BIAS as BIAS};
    let dev = device(Some(4096));
    let Some(plan) = window_plan(&dev) else {
        return;
    };
    matmul_w_case(&dev, &plan, 1600, MatmulCase::new(20, 1024, 9, BIAS), 20);
    matmul_w_case(
        &dev,
        &plan,
        1601,
        MatmulCase::new(7, 256, 70, LAST_TOKEN_ONLY),
        24,
    );
}

/// Window sizes: whole chunks when they fit 64 KiB; otherwise window starts on the
/// uniform offset alignment; none when a row alone is too large or no multiple aligns.
#[test]
fn window_tokens_respects_size_and_alignment() {
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
        assert!(tw * row <= UNIFORM_WINDOW_BYTES && tw >= 1);
        assert!(
            tw == chunk || (tw * row).is_multiple_of(256),
            "row {row}: {tw}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// argmax

fn argmax_case(
    dev: &Device,
    what: &str,
    logits: &[f32],
    n: usize,
    last_row: bool,
    suppress: &[u32],
) -> u32 {
    let rows = logits.len() / n;
    let step = dev.step_buffer(0, rows).unwrap();
    let lb = f32_buf(dev, logits);
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
    // A NaN or ±inf anywhere in the row is flagged with u32::MAX (the host reports the step).
    let want = if row.iter().any(|x| !x.is_finite()) {
        u32::MAX
    } else {
        cpu_ref::argmax(row, suppress)
    };
    // Both plans' forms: one workgroup over the row, and the GPU plan's parts then their
    // reduction (its parts buffer starts as garbage, which every part must overwrite).
    let part = u32_buf(dev, &vec![0x7f7f_7f7f; ops::argmax_parts(n) * 4]);
    for split in [false, true] {
        let token = u32_buf(dev, &[u32::MAX - 1; 4]);
        let mut prog = Program::default();
        ops::argmax(
            &mut prog,
            &ArgmaxParams {
                n: n as u32,
                n_suppress: suppress.len() as u32,
                row_stride: n as u32,
                flags: if last_row { flags::ARGMAX_LAST_ROW } else { 0 },
                suppress: sup,
            },
            &lb,
            &token,
            &part,
            split,
        );
        assert_eq!(prog.ops.len(), if split { 2 } else { 1 });
        run(dev, prog, &step, rows);
        let got = read_u32(dev, &token, 1)[0];
        eprintln!("argmax {what} split {split}: gpu {got} cpu {want}");
        assert_eq!(
            got, want,
            "argmax {what}: n {n} rows {rows} last_row {last_row} suppress {suppress:?} split {split}"
        );
    }
    want
}

#[test]
fn argmax_matches_cpu() {
    let dev = device(None);
    let mut rng = Rng::new(1000);
    for &n in &[1usize, 5, 255, 256, 257, 1000, 3001] {
        let logits = rng.vec(n, 10.0);
        argmax_case(&dev, &format!("random n {n}"), &logits, n, false, &[]);
    }
    let logits = rng.vec(5 * 700, 10.0);
    argmax_case(&dev, "last of 5 rows", &logits, 700, true, &[]);
}

/// The split argmax's part boundaries (256 values a part, at most 1024 parts): ties and
/// suppression across them, a NaN in a late part, a row longer than 1024 parts hold.
#[test]
fn argmax_across_parts() {
    let dev = device(None);
    let mut rng = Rng::new(1002);
    for &n in &[
        255usize,
        256,
        257,
        511,
        512,
        513,
        1025,
        50_304,
        151_936,
        1024 * 512 + 3,
    ] {
        let mut logits = rng.vec(n, 10.0);
        argmax_case(&dev, &format!("parts n {n}"), &logits, n, false, &[]);
        if n > 1024 {
            // Equal maxima on both sides of the first boundary and in the last part.
            for i in [n - 1, 512, 511] {
                logits[i] = 30.0;
            }
            assert_eq!(
                argmax_case(&dev, "tie at a boundary", &logits, n, false, &[]),
                511
            );
            assert_eq!(
                argmax_case(
                    &dev,
                    "boundary tie, first suppressed",
                    &logits,
                    n,
                    false,
                    &[511]
                ),
                512
            );
            assert_eq!(
                argmax_case(&dev, "only the last part's", &logits, n, false, &[511, 512]),
                (n - 1) as u32
            );
            logits[n - 2] = f32::NAN;
            assert_eq!(
                argmax_case(&dev, "NaN in the last part", &logits, n, false, &[]),
                u32::MAX
            );
        }
    }
    // Fewer values than parts' lanes: most lanes of every part see nothing.
    let rows = rng.vec(2 * 700, 1.0);
    argmax_case(&dev, "last of 2 rows, parts", &rows, 700, true, &[3]);
}

#[test]
fn argmax_ties_and_suppression() {
    let dev = device(None);
    let mut rng = Rng::new(1001);
    let n = 3001;
    let mut logits = rng.vec(n, 10.0);
    for i in [17, 300, 2999] {
        logits[i] = 20.0;
    }
    assert_eq!(argmax_case(&dev, "tie", &logits, n, false, &[]), 17);
    assert_eq!(
        argmax_case(&dev, "tie, first suppressed", &logits, n, false, &[17]),
        300
    );
    assert_eq!(
        argmax_case(
            &dev,
            "tie, all suppressed",
            &logits,
            n,
            false,
            &[2999, 17, 300]
        ),
        cpu_ref::argmax(&logits, &[17, 300, 2999])
    );
    argmax_case(
        &dev,
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
        argmax_case(&dev, "cross-lane tie", &flat, 600, false, &[]),
        255
    );
    assert_eq!(
        argmax_case(&dev, "all equal", &[3.0; 300], 300, false, &[0]),
        1
    );
    // Rows: the last one decides, suppression applies to it.
    let mut rows = rng.vec(3 * 40, 1.0);
    rows[2 * 40 + 7] = 5.0;
    rows[2 * 40 + 9] = 4.0;
    rows[9] = 9.0;
    assert_eq!(
        argmax_case(&dev, "last row, suppressed", &rows, 40, true, &[7]),
        9
    );
}

/// A row holding NaN or ±inf (the model's numbers broke down) must not yield a token:
/// the kernel writes u32::MAX, which the host turns into an error naming the step (and it
/// never submits a step after it). A finite row with a suppressed best id still gives the
/// best unsuppressed one.
#[test]
fn argmax_flags_non_finite_rows() {
    let dev = device(None);
    let neg = vec![f32::NEG_INFINITY; 300];
    argmax_case(&dev, "all -inf", &neg, 300, false, &[]);
    argmax_case(&dev, "all -inf, first suppressed", &neg, 300, false, &[0]);
    let mut one = vec![0.5f32; 300];
    one[0] = 1.0;
    assert_eq!(
        argmax_case(&dev, "finite, best suppressed", &one, 300, false, &[0]),
        1
    );
    argmax_case(&dev, "all NaN", &[f32::NAN; 300], 300, false, &[]);
    for (bad, at) in [
        (f32::NAN, 299usize),
        (f32::INFINITY, 7),
        (f32::NEG_INFINITY, 128),
    ] {
        let mut row = vec![0.25f32; 300];
        row[at] = bad;
        let got = argmax_case(&dev, &format!("{bad} at {at}"), &row, 300, false, &[]);
        assert_eq!(got, u32::MAX);
    }
    // Only the row read counts (the last of 3).
    let mut rows = vec![f32::NAN; 600];
    rows.extend((0..300).map(|i| i as f32));
    assert_eq!(
        argmax_case(&dev, "NaN rows before the last", &rows, 300, true, &[]),
        299
    );
}

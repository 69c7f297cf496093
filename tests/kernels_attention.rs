//! rope_kv, attention and the window attention (attention_w.wgsl, multi-token steps on CPU
//! adapters) against their CPU references (`wgmoe::cpu_ref`), through the forward pass's
//! op builders (`wgmoe::model::ops::{rope_kv, attention}`), with the kernel plan choosing
//! the attention kernel. Runs on lavapipe in CI; a missing adapter is a failure, never a
//! skip. Differences are measured as described in tests/common/check.rs.

mod common;

use common::check::check;
use common::gpu::*;
use common::rng::Rng;
use wgmoe::backend::kernel::KvFormat;
use wgmoe::backend::params::*;
use wgmoe::backend::plan::PrefillKernels;
use wgmoe::backend::{Buffer, Device, Kernel, KernelOverrides, KernelPlan, Program, LONGEST};
use wgmoe::blocks::q8_0::kv as q8_kv;
use wgmoe::cpu_ref::{self, Heads, QkNorm};
use wgmoe::model::ops::{self, rope_table, AttentionBuffers, OpEnv};
use wgmoe::model::tensors::upload_f16_vec;

/// RMSNorm of q/k (reduction order) then two products per rotated element.
const ROPE_TOL: f32 = 1e-5;
/// Score dot products, exp and the softmax sum, in a different order.
const ATTENTION_TOL: f32 = 1e-5;
/// An f16 cache against the reference's f16 rounding of the same f32 values: where the
/// GPU's f32 and the reference's differ by an ulp across a rounding boundary, one f16 ulp
/// (2^-8 for values in [4, 8)).
const KV_F16_TOL: f32 = 8e-3;

/// A q8_0 cache against the reference's rounding of the same f32 values: one quant step
/// (max|block| / 127, values of magnitude <= 4) where the two round across a boundary.
const KV_Q8_TOL: f32 = 4.0 / 127.0;

/// The cache's shape: values per position and per head.
#[derive(Clone, Copy)]
struct Rows {
    kv_dim: usize,
    hd: usize,
}

/// A KV cache buffer holding `data` as `kv` stores it (f16: two values per u32; q8_0: rows
/// of int8 and block scales).
fn kv_buf(dev: &Device, data: &[f32], kv: KvFormat, r: Rows) -> Buffer {
    let upload = |bytes: &[u8]| {
        dev.upload("test_kv", bytes, wgmoe::backend::Usage::Storage)
            .unwrap()
    };
    match kv {
        KvFormat::F32 => f32_buf(dev, data),
        KvFormat::F16 => {
            let mut h: Vec<half::f16> = data.iter().map(|&v| half::f16::from_f32(v)).collect();
            h.resize(h.len().next_multiple_of(8), half::f16::ZERO);
            upload(bytemuck::cast_slice(&h))
        }
        KvFormat::Q8 => {
            let mut w: Vec<u32> = data
                .chunks(r.kv_dim)
                .flat_map(|row| q8_kv::encode_row(row, r.hd))
                .collect();
            w.resize(w.len().next_multiple_of(4), 0);
            upload(bytemuck::cast_slice(&w))
        }
    }
}

/// The values a `kv` cache holds of `data`.
fn kv_held(data: &[f32], kv: KvFormat, r: Rows) -> Vec<f32> {
    match kv {
        KvFormat::F32 => data.to_vec(),
        KvFormat::F16 => data
            .iter()
            .map(|&v| half::f16::from_f32(v).to_f32())
            .collect(),
        KvFormat::Q8 => q8_kv::round_trip(data, r.kv_dim, r.hd),
    }
}

/// The first `n` values of a `kv` cache buffer.
fn read_kv(dev: &Device, b: &Buffer, n: usize, kv: KvFormat, r: Rows) -> Vec<f32> {
    match kv {
        KvFormat::F32 => read_f32(dev, b, n),
        KvFormat::F16 => read_u32(dev, b, n.div_ceil(2))
            .iter()
            .flat_map(|&w| [w as u16, (w >> 16) as u16])
            .take(n)
            .map(|h| half::f16::from_bits(h).to_f32())
            .collect(),
        KvFormat::Q8 => {
            let positions = n / r.kv_dim;
            let words = read_u32(dev, b, positions * q8_kv::row_words(r.kv_dim, r.hd));
            q8_kv::decode(&words, r.kv_dim, r.hd, positions)
        }
    }
}

fn with_kv(mut plan: KernelPlan, kv: KvFormat) -> KernelPlan {
    plan.kv = kv;
    plan
}

struct AttnCase {
    heads: Heads,
    t: usize,
    pos0: usize,
    flags: u32,
}

const ROPE_THETA: f64 = 10000.0;
const CLIP: f32 = 0.75;

/// The plan whose attention kernel is the one-workgroup-per-(head, token) kernel.
fn storage_plan(dev: &Device) -> KernelPlan {
    plan(
        dev,
        &KernelOverrides {
            prefill: Some(PrefillKernels::Storage),
            ..Default::default()
        },
    )
}

/// The attention kernels' buffers with no q/k norm, no qkv and no RoPE table (`d`, the
/// dummy, for those): q, cache_k, cache_v, scratch, part, out.
fn attention_buffers<'a>(
    d: &'a Buffer,
    [q, cache_k, cache_v, scratch, part, out]: [&'a Buffer; 6],
) -> AttentionBuffers<'a> {
    AttentionBuffers {
        qkv: d,
        q_norm: None,
        k_norm: None,
        rope: d,
        q,
        cache_k,
        cache_v,
        scratch,
        part,
        out,
    }
}

fn attention_params(heads: Heads, positions: usize) -> AttentionParams {
    AttentionParams {
        n_heads: heads.n_heads as u32,
        n_kv: heads.n_kv as u32,
        head_dim: heads.head_dim as u32,
        scratch_stride: positions as u32,
        scale: (heads.head_dim as f32).powf(-0.5),
        ..Default::default()
    }
}

fn rope_case(dev: &Device, seed: u64, c: &AttnCase, kv: KvFormat) {
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
    let per_head = flags & flags::ROPE_QK_NORM_PER_HEAD != 0;
    // Whole-projection norms have a weight per q / k element; per-head norms one vector of
    // head_dim shared by every head.
    let q_norm_w = rng.f16_range(if per_head { hd } else { q_dim }, 0.5, 1.5);
    let k_norm_w = rng.f16_range(if per_head { hd } else { kv_dim }, 0.5, 1.5);
    // Rows of the caches other than the step's must survive untouched.
    let cache_k0 = rng.vec(positions * kv_dim, 1.0);
    let cache_v0 = rng.vec(positions * kv_dim, 1.0);
    let eps = 1e-6;
    let table = rope_table(ROPE_THETA, hd, positions);
    let norm = flags & (flags::ROPE_QK_NORM | flags::ROPE_QK_NORM_PER_HEAD) != 0;
    let clip = flags & flags::ROPE_CLIP != 0;

    let step = dev.step_buffer(pos0, t).unwrap();
    let qkv_b = f32_buf(dev, &qkv);
    let qn = upload_f16_vec(dev, "q_norm", &q_norm_w).unwrap();
    let kn = upload_f16_vec(dev, "k_norm", &k_norm_w).unwrap();
    let d = dummy(dev);
    let rope = f32_buf(dev, &table);
    let q_out = f32_buf(dev, &vec![f32::NAN; t * q_dim]);
    let rows = Rows { kv_dim, hd };
    let ck = kv_buf(dev, &cache_k0, kv, rows);
    let cv = kv_buf(dev, &cache_v0, kv, rows);
    let plan = with_kv(storage_plan(dev), kv);
    let env = OpEnv {
        plan: &plan,
        chunk: t,
        dummy: &d,
    };
    let mut prog = Program::default();
    ops::rope_kv(
        &mut prog,
        &env,
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
        &AttentionBuffers {
            qkv: &qkv_b,
            q_norm: norm.then_some(&qn),
            k_norm: norm.then_some(&kn),
            rope: &rope,
            q: &q_out,
            cache_k: &ck,
            cache_v: &cv,
            scratch: &d,
            part: &d,
            out: &d,
        },
    );
    run(dev, prog, &step, t);

    let (mut want_k, mut want_v) = (kv_held(&cache_k0, kv, rows), kv_held(&cache_v0, kv, rows));
    let qk = norm.then_some(QkNorm {
        q: &q_norm_w,
        k: &k_norm_w,
        eps,
        per_head,
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
    let (want_k, want_v) = (kv_held(&want_k, kv, rows), kv_held(&want_v, kv, rows));
    let kv_tol = match kv {
        KvFormat::F32 => ROPE_TOL,
        KvFormat::F16 => KV_F16_TOL,
        KvFormat::Q8 => KV_Q8_TOL,
    };
    let what = format!(
        "rope_kv[{kv:?} kv] heads {}/{} dim {hd} T {t} pos0 {pos0} flags {flags:#b}",
        heads.n_heads, heads.n_kv
    );
    check(
        &format!("{what} q"),
        &read_f32(dev, &q_out, t * q_dim),
        &want_q,
        ROPE_TOL,
    );
    check(
        &format!("{what} cache_k"),
        &read_kv(dev, &ck, positions * kv_dim, kv, rows),
        &want_k,
        kv_tol,
    );
    check(
        &format!("{what} cache_v"),
        &read_kv(dev, &cv, positions * kv_dim, kv, rows),
        &want_v,
        kv_tol,
    );
}

fn attn_cases() -> Vec<AttnCase> {
    use flags::{ROPE_CLIP as CLIP, ROPE_QK_NORM as QK_NORM, ROPE_QK_NORM_PER_HEAD as PER_HEAD};
    let h = |n_heads, n_kv, head_dim| Heads {
        n_heads,
        n_kv,
        head_dim,
    };
    vec![
        // kv_dim 6: a q8_0 cache's rows do not start on a multiple of 4 values.
        AttnCase {
            heads: h(3, 3, 2),
            t: 1,
            pos0: 600,
            flags: 0,
        },
        // A long context's last position: llvmpipe ends a shader invocation's loops after
        // 65535 iterations, so this guards the one-token kernel's loop counts too.
        AttnCase {
            heads: h(16, 16, 128),
            t: 1,
            pos0: 4094,
            flags: 0,
        },
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
        // Qwen3-MoE: per-head q/k norm, GQA groups of 8 (Qwen3-30B-A3B: 32 heads over 4
        // KV heads of 128, q_dim 4096 above hidden 2048) and of 2.
        AttnCase {
            heads: h(32, 4, 128),
            t: 3,
            pos0: 17,
            flags: PER_HEAD,
        },
        AttnCase {
            heads: h(4, 2, 32),
            t: 7,
            pos0: 0,
            flags: PER_HEAD,
        },
        AttnCase {
            heads: h(8, 1, 16),
            t: 1,
            pos0: 40,
            flags: PER_HEAD | CLIP,
        },
        // Mixtral: GQA groups of 4, no q/k norm (Mixtral-8x7B: 32 heads over 8 of 128).
        AttnCase {
            heads: h(32, 8, 128),
            t: 2,
            pos0: 9,
            flags: 0,
        },
    ]
}

#[test]
fn rope_kv_matches_cpu() {
    let dev = device(None);
    for (i, c) in attn_cases().iter().enumerate() {
        for kv in KvFormat::ALL {
            rope_case(&dev, 400 + i as u64, c, kv);
        }
    }
}

/// `ops::attention` under `plan` for a chunk of `chunk` tokens, run on the case's step;
/// the plan must pick `kernel`.
fn attention_run(
    dev: &Device,
    plan: &KernelPlan,
    chunk: usize,
    kernel: Kernel,
    seed: u64,
    c: &AttnCase,
) {
    let kv = match kernel {
        Kernel::Attention(kv) | Kernel::AttentionWindow(kv) => kv,
        k => panic!("{k} is not a scratch-row attention kernel"),
    };
    let plan = &with_kv(*plan, kv);
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

    let step = dev.step_buffer(pos0, t).unwrap();
    let qb = f32_buf(dev, &q);
    let rows = Rows { kv_dim, hd };
    let ck = kv_buf(dev, &cache_k, kv, rows);
    let cv = kv_buf(dev, &cache_v_gpu, kv, rows);
    let (cache_k, cache_v) = (kv_held(&cache_k, kv, rows), kv_held(&cache_v, kv, rows));
    let scratch = f32_buf(dev, &vec![0.0; t * heads.n_heads * positions]);
    let out = f32_buf(dev, &vec![f32::NAN; t * q_dim]);
    let d = dummy(dev);
    let env = OpEnv {
        plan,
        chunk,
        dummy: &d,
    };
    let mut prog = Program::default();
    ops::attention(
        &mut prog,
        &env,
        &attention_params(heads, positions),
        &attention_buffers(&d, [&qb, &ck, &cv, &scratch, &d, &out]),
        positions,
    );
    assert_eq!(prog.len(), 1);
    assert_eq!(prog.ops[0].kernel, kernel, "the plan's attention kernel");
    run(dev, prog, &step, t);

    let visible = (pos0 + t) * kv_dim;
    let want =
        cpu_ref::attention(&q, heads, &cache_k[..visible], &cache_v[..visible], pos0).unwrap();
    let what = format!(
        "{} heads {}/{} dim {hd} T {t} pos0 {pos0}",
        kernel.name(),
        heads.n_heads,
        heads.n_kv
    );
    check(&what, &read_f32(dev, &out, t * q_dim), &want, ATTENTION_TOL);
}

fn attention_case(dev: &Device, seed: u64, c: &AttnCase) {
    for kv in KvFormat::ALL {
        attention_run(dev, &storage_plan(dev), c.t, Kernel::Attention(kv), seed, c);
    }
}

/// f32 and f16 KV caches.
#[test]
fn attention_matches_cpu() {
    let dev = device(None);
    for (i, c) in attn_cases().iter().enumerate() {
        attention_case(&dev, 500 + i as u64, c);
    }
}

/// Prefill of 5 tokens then a decode step at pos0 = 5 through rope_kv + attention in one
/// program each, sharing the caches, against the reference chained the same way.
#[test]
fn rope_then_attention_prefill_then_decode_matches_cpu() {
    let dev = device(None);
    let heads = Heads {
        n_heads: 6,
        n_kv: 2,
        head_dim: 80,
    };
    let (q_dim, kv_dim, hd) = (heads.q_dim(), heads.kv_dim(), heads.head_dim);
    let positions = 8;
    let mut rng = Rng::new(600);
    let table = rope_table(ROPE_THETA, hd, positions);
    let rope = f32_buf(&dev, &table);
    let ck = f32_buf(&dev, &vec![0.0; positions * kv_dim]);
    let cv = f32_buf(&dev, &vec![0.0; positions * kv_dim]);
    let (mut want_k, mut want_v) = (vec![0.0; positions * kv_dim], vec![0.0; positions * kv_dim]);
    let d = dummy(&dev);
    let plan = storage_plan(&dev);
    for (pos0, t) in [(0, 5), (5, 1)] {
        let qkv = rng.vec(t * heads.qkv_dim(), 2.0);
        let step = dev.step_buffer(pos0, t).unwrap();
        let qkv_b = f32_buf(&dev, &qkv);
        let q = f32_buf(&dev, &vec![0.0; t * q_dim]);
        let scratch = f32_buf(&dev, &vec![0.0; t * heads.n_heads * positions]);
        let out = f32_buf(&dev, &vec![0.0; t * q_dim]);
        let env = OpEnv {
            plan: &plan,
            chunk: 5,
            dummy: &d,
        };
        let ab = AttentionBuffers {
            qkv: &qkv_b,
            q_norm: None,
            k_norm: None,
            rope: &rope,
            q: &q,
            cache_k: &ck,
            cache_v: &cv,
            scratch: &scratch,
            part: &d,
            out: &out,
        };
        let mut prog = Program::default();
        ops::rope_kv(
            &mut prog,
            &env,
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
            &ab,
        );
        ops::attention(
            &mut prog,
            &env,
            &attention_params(heads, positions),
            &ab,
            positions,
        );
        assert_eq!(prog.ops[1].kernel, Kernel::Attention(KvFormat::F32));
        run(&dev, prog, &step, t);
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
            &read_f32(&dev, &out, t * q_dim),
            &want,
            ATTENTION_TOL,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Window attention (multi-token steps on CPU adapters; one-token steps too)

/// The window kernel through `ops::attention` with the window-prefill plan, recorded for a
/// chunk of at least 8 tokens (as the forward pass records it, one-token steps included).
fn attention_w_case(dev: &Device, plan: &KernelPlan, seed: u64, c: &AttnCase) {
    let chunk = c.t.max(ATTENTION_W_TOKENS as usize);
    for kv in KvFormat::ALL {
        attention_run(dev, plan, chunk, Kernel::AttentionWindow(kv), seed, c);
    }
}

#[test]
fn attention_window_matches_cpu() {
    let dev = device(None);
    if !subgroup_kernels(&dev, Kernel::AttentionWindow(KvFormat::F32)) {
        return;
    }
    let plan = plan(
        &dev,
        &KernelOverrides {
            prefill: Some(PrefillKernels::Window),
            ..Default::default()
        },
    );
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
        attention_w_case(&dev, &plan, 1700 + i as u64, c);
    }
}

// ---------------------------------------------------------------------------------------------
// Flash attention (GPU-shaped: a workgroup per KV head and key split, keys tiled)

/// The plan of the GPU-shaped kernels (the default on GPUs).
fn gpu_plan(dev: &Device) -> KernelPlan {
    plan(
        dev,
        &KernelOverrides {
            decode: Some(wgmoe::backend::plan::DecodeKernels::Coalesced),
            prefill: Some(PrefillKernels::Tiled),
            ..Default::default()
        },
    )
}

/// `ops::attention` with the GPU plan over a cache of `max_context` positions (so one-token
/// steps split the keys as they would in a model of that context) against the reference.
fn flash_case(dev: &Device, seed: u64, c: &AttnCase, max_context: usize) {
    for kv in KvFormat::ALL {
        flash_case_kv(dev, seed, c, max_context, kv);
    }
}

fn flash_case_kv(dev: &Device, seed: u64, c: &AttnCase, max_context: usize, kv: KvFormat) {
    let AttnCase { heads, t, pos0, .. } = *c;
    let (q_dim, kv_dim, hd) = (heads.q_dim(), heads.kv_dim(), heads.head_dim);
    assert!(pos0 + t <= max_context);
    let mut rng = Rng::new(seed);
    let q = rng.vec(t * q_dim, 3.0);
    let mut cache_k = rng.vec(max_context * kv_dim, 1.0);
    let mut cache_v = rng.vec(max_context * kv_dim, 1.0);
    // Rows past the last visible key are poison: causality must never read them.
    cache_k[(pos0 + t) * kv_dim..].fill(f32::NAN);
    cache_v[(pos0 + t) * kv_dim..].fill(f32::NAN);
    let plan = with_kv(gpu_plan(dev), kv);
    let shape = ops::flash_shape(heads.n_heads, heads.n_kv, hd, max_context);
    let step = dev.step_buffer(pos0, t).unwrap();
    let qb = f32_buf(dev, &q);
    let rows = Rows { kv_dim, hd };
    let ck = kv_buf(dev, &cache_k, kv, rows);
    let cv = kv_buf(dev, &cache_v, kv, rows);
    let (cache_k, cache_v) = (kv_held(&cache_k, kv, rows), kv_held(&cache_v, kv, rows));
    let part_floats = ops::flash_part_floats(heads.n_heads, heads.n_kv, hd, max_context, t);
    // Splits sized by the step's position (a real step's grid), and at their most (as
    // static analyses count them): both give the same attention.
    for at in [pos0 as u32, LONGEST] {
        // Garbage in the partial outputs: a split record the step did not write is never read.
        let part = f32_buf(dev, &vec![f32::NAN; part_floats]);
        let out = f32_buf(dev, &vec![f32::NAN; t * q_dim]);
        flash_run(
            dev,
            c,
            max_context,
            kv,
            &plan,
            [&step, &qb, &ck, &cv, &part, &out],
            at,
        );
        let visible = (pos0 + t) * kv_dim;
        let want =
            cpu_ref::attention(&q, heads, &cache_k[..visible], &cache_v[..visible], pos0).unwrap();
        let what = format!(
            "flash[{kv:?} kv] heads {}/{} dim {hd} T {t} pos0 {pos0} context {max_context} grid at {at} ({shape:?})",
            heads.n_heads, heads.n_kv
        );
        check(&what, &read_f32(dev, &out, t * q_dim), &want, ATTENTION_TOL);
    }
}

/// The GPU plan's attention ops for case `c`, run for a step at position `at`.
fn flash_run(
    dev: &Device,
    c: &AttnCase,
    max_context: usize,
    kv: KvFormat,
    plan: &KernelPlan,
    [step, qb, ck, cv, part, out]: [&Buffer; 6],
    at: u32,
) {
    let AttnCase { heads, t, .. } = *c;
    let hd = heads.head_dim;
    let shape = ops::flash_shape(heads.n_heads, heads.n_kv, hd, max_context);
    let d = dummy(dev);
    let env = OpEnv {
        plan,
        chunk: t.max(2),
        dummy: &d,
    };
    let mut prog = Program::default();
    ops::attention(
        &mut prog,
        &env,
        &attention_params(heads, max_context),
        &attention_buffers(&d, [qb, ck, cv, &d, part, out]),
        max_context,
    );
    assert_eq!(prog.ops[0].kernel, Kernel::AttnFlash(kv));
    let decode = prog.ops[0]
        .decode
        .as_deref()
        .expect("a one-token alternative");
    assert_eq!(decode.kernel, Kernel::AttnFlash(kv));
    assert_eq!(
        prog.len(),
        1 + usize::from(shape.splits > 1) + usize::from(shape.prefill_splits > 1),
        "a combine after split keys"
    );
    run_at(dev, prog, step, t, at);
}

/// One-token steps launch the key splits their position fills, and their combine only
/// when there are several: at Qwen3-30B-A3B's attention (32 query heads over 4 KV heads of
/// 128, a 40,960-position cache) positions 10, 1000 and 4000 launch 1, 32 and 64 splits
/// of the 4 KV heads; the combine runs from the 33rd key on.
#[test]
fn flash_decode_workgroups_follow_the_position() {
    let dev = device(None);
    let plan = gpu_plan(&dev);
    let d = dummy(&dev);
    let env = OpEnv {
        plan: &plan,
        chunk: 64,
        dummy: &d,
    };
    let heads = Heads {
        n_heads: 32,
        n_kv: 4,
        head_dim: 128,
    };
    let ctx = 40_960;
    let mut prog = Program::default();
    ops::attention(
        &mut prog,
        &env,
        &attention_params(heads, ctx),
        &attention_buffers(&d, [&d; 6]),
        ctx,
    );
    let shape = ops::flash_shape(32, 4, 128, ctx);
    assert_eq!(shape.splits, 64, "{shape:?}");
    let launched = |pos: u32| -> Vec<(Kernel, u32)> {
        prog.ops
            .iter()
            .filter_map(|o| o.dispatch(1, pos))
            .map(|(k, g, _)| (k, g.iter().product()))
            .collect()
    };
    let flash = Kernel::AttnFlash(plan.kv);
    let comb = |n| (Kernel::AttnCombine, n);
    assert_eq!(launched(0), [(flash, 4)]);
    assert_eq!(launched(10), [(flash, 4)]);
    assert_eq!(launched(31), [(flash, 4)]);
    assert_eq!(launched(32), [(flash, 8), comb(32)]);
    assert_eq!(launched(1000), [(flash, 4 * 32), comb(32)]);
    assert_eq!(launched(4000), [(flash, 4 * 64), comb(32)]);
    assert_eq!(launched(LONGEST), [(flash, 4 * 64), comb(32)]);
}

#[test]
fn flash_attention_decode_matches_cpu() {
    let dev = device(None);
    let h = |n_heads, n_kv, head_dim| Heads {
        n_heads,
        n_kv,
        head_dim,
    };
    // GQA groups of 1 to 40 (several head tiles past 32 rows), head dims with odd
    // quarters and up to 512, contexts where the splits are empty, partial or many tiles.
    for (i, (heads, pos0, ctx)) in [
        (h(4, 4, 16), 0, 8),
        (h(8, 2, 64), 37, 64),
        (h(32, 4, 128), 300, 4096),
        (h(16, 16, 128), 1000, 1100),
        (h(6, 2, 80), 129, 512),
        (h(40, 1, 64), 70, 256),
        (h(2, 1, 512), 45, 90),
        (h(3, 3, 2), 600, 700),
        (h(8, 8, 130), 5, 4096),
        // Qwen3-30B-A3B's attention at positions where 1, 32 and 64 splits run.
        (h(32, 4, 128), 10, 4096),
        (h(32, 4, 128), 1000, 4096),
        (h(32, 4, 128), 4000, 4096),
    ]
    .into_iter()
    .enumerate()
    {
        flash_case(
            &dev,
            2000 + i as u64,
            &AttnCase {
                heads,
                t: 1,
                pos0,
                flags: 0,
            },
            ctx,
        );
    }
}

#[test]
fn flash_attention_prefill_matches_cpu() {
    let dev = device(None);
    let h = |n_heads, n_kv, head_dim| Heads {
        n_heads,
        n_kv,
        head_dim,
    };
    // Token groups with a partial last one, causal masks inside a key tile, GQA.
    for (i, (heads, t, pos0)) in [
        (h(4, 4, 16), 37, 0),
        (h(8, 2, 64), 9, 20),
        (h(32, 4, 128), 5, 60),
        (h(2, 1, 80), 33, 3),
        (h(16, 16, 32), 64, 100),
        (h(3, 1, 2), 70, 0),
        // Short chunks late in long contexts: the keys split over workgroups (each walks a
        // bounded run of tiles) and the splits merged per token.
        (h(16, 16, 128), 2, 4094),
        (h(32, 4, 128), 17, 3000),
        (h(2, 1, 512), 3, 700),
        (h(8, 8, 130), 9, 2500),
    ]
    .into_iter()
    .enumerate()
    {
        flash_case(
            &dev,
            2100 + i as u64,
            &AttnCase {
                heads,
                t,
                pos0,
                flags: 0,
            },
            pos0 + t + 3,
        );
    }
}

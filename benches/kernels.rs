//! Kernel benchmarks on the first adapter (lavapipe here): W4A16 vs f16 matvec on the
//! expert shapes of OLMoE-1B-7B and Qwen1.5-MoE-A2.7B, beside this machine's memory read
//! bandwidth, one MoE layer's routed experts with the grouped vs per-expert executor,
//! decode attention (16 heads of 128, context 512 and 2048), the router (f16 router matmul
//! of hidden 2048, then softmax/top-k: OLMoE 64 top-8, Qwen 60 top-4), and one whole decode
//! step of a small synthetic model through the engine. Throughput counters are bytes read
//! (weights, KV cache) or, for the decode step, tokens. Run: `cargo bench --bench kernels`
//! (one group: `cargo bench --bench kernels -- attention router decode prefill`). Every
//! bench id names the adapter it ran on: each argument prints as `<adapter> | <value>`.
//! Each kernel iteration is one submission of REPS dispatches and a wait, so per-dispatch
//! figures carry 1/REPS of the submit cost.

use std::sync::OnceLock;

use divan::counter::{BytesCount, ItemsCount};
use half::f16;
use wgmoe::backend::params::*;
use wgmoe::backend::plan::PrefillKernels;
use wgmoe::backend::{Buffer, Device, KernelOverrides, Prepared, Program, Usage, Work};
use wgmoe::blocks::quant::Q4SlotLayout;
use wgmoe::model::moe::{Executor, MoeDispatch};
use wgmoe::model::ops::{self, AttentionBuffers, CombineBuffers, OpEnv};
use wgmoe::model::tensors::{ExpertStore, F16Matrix, Q4Pool};

#[allow(dead_code)]
#[path = "../tests/common/gpu.rs"]
mod gpu;
#[allow(dead_code)]
#[path = "../tests/common/rng.rs"]
mod rng;

use gpu::Gpu;
use rng::Rng;

fn reps() -> usize {
    std::env::var("WGMOE_BENCH_REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16)
}

fn portable() -> bool {
    std::env::var_os("WGMOE_PORTABLE_KERNELS").is_some()
}

fn main() {
    gpu::init_env();
    let info = dev().info();
    eprintln!(
        "adapter: {} ({}, {}); subgroup kernels: {}",
        info.name,
        info.backend,
        info.driver_string(),
        g().plan.subgroups
    );
    divan::main();
}

/// The device and kernel plan of the kernel benches (`WGMOE_PORTABLE_KERNELS`: no
/// subgroup kernels).
fn g() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| Gpu::portable(None, portable()))
}

fn dev() -> &'static Device {
    &g().dev
}

/// A bench argument that prints as `<adapter> | <value>`, so that every bench id says which
/// adapter it measured (divan's bench names are static; arguments are formatted at run time).
#[derive(Clone, Copy)]
struct On<T>(T);

impl<T: std::fmt::Debug> std::fmt::Display for On<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} | {:?}", dev().info().name, self.0)
    }
}

fn on<T: Copy, const N: usize>(args: [T; N]) -> Vec<On<T>> {
    args.iter().map(|&a| On(a)).collect()
}

/// Deterministic pseudo-random words (tests/common/rng.rs).
fn noise(n: usize, seed: u64) -> Vec<u32> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.next_u64() as u32).collect()
}

fn storage(label: &str, data: &[u8]) -> Buffer {
    dev().upload(label, data, Usage::Storage).expect("upload")
}

/// A buffer the one-token kernels may bind as a 64 KiB uniform window, holding `data`.
fn window(label: &str, data: &[f32]) -> Buffer {
    let b = dev()
        .alloc(
            label,
            (data.len() * 4).max(UNIFORM_WINDOW_BYTES) as u64,
            Usage::Window,
        )
        .expect("alloc");
    dev()
        .write(&b, 0, bytemuck::cast_slice(data))
        .expect("write");
    b
}

fn uniform_noise(n: usize, seed: u64, amp: f32) -> Vec<f32> {
    Rng::new(seed).vec(n, amp)
}

/// A program prepared for steps at `pos0` (one token each).
fn prepare(prog: Program, pos0: usize) -> Prepared {
    let step = dev().step_buffer(pos0, 1).expect("step");
    dev().prepare(prog, &step).expect("prepare")
}

/// One submission of a one-token step of the program, and a wait (position-sized grids at
/// their largest: the benchmark's attention walks its whole context).
fn run(p: &Prepared) {
    dev()
        .submit(&[Work::Run {
            program: p,
            tokens: 1,
            pos0: wgmoe::backend::LONGEST,
        }])
        .expect("submit");
    dev().sync().expect("gpu error");
}

/// (in, out) of the expert matrices: OLMoE gate/up 2048->1024, down 1024->2048; Qwen
/// gate/up 2048->1408, down 1408->2048 (partial last block).
const SHAPES: [(usize, usize); 4] = [(2048, 1408), (2048, 1024), (1024, 2048), (1408, 2048)];

#[divan::bench(args = on(SHAPES), sample_count = 20)]
fn matvec_w4a16(bencher: divan::Bencher, On(shape): On<(usize, usize)>) {
    w4a16_matvec(bencher, shape, false);
}

/// The one-token variant the decode step uses: activations in a 64 KiB uniform window.
#[divan::bench(args = on(SHAPES), sample_count = 20)]
fn matvec_w4a16_decode(bencher: divan::Bencher, On(shape): On<(usize, usize)>) {
    w4a16_matvec(bencher, shape, true);
}

fn w4a16_matvec(bencher: divan::Bencher, (inp, out): (usize, usize), decode: bool) {
    // A one-slot pool whose down matrix is [out, in].
    let layout = Q4SlotLayout::new(out, inp);
    let pool = Q4Pool::new(dev(), "bench", 1, layout).expect("pool");
    let mut slot = vec![0u8; layout.bytes];
    let w: Vec<f32> = noise(3 * inp * out, 1)
        .iter()
        .map(|&r| (r as f32 / u32::MAX as f32) - 0.5)
        .collect();
    layout.pack_expert(
        &w[..inp * out],
        &w[inp * out..2 * inp * out],
        &w[2 * inp * out..],
        &mut slot,
    );
    pool.write_slot(dev(), 0, &slot).expect("write slot");
    let h = window("h", &vec![0.5f32; inp]);
    let zero = storage("ids", bytemuck::cast_slice(&[0u32; 4]));
    let ones = storage("w", bytemuck::cast_slice(&[1.0f32; 4]));
    let y = storage("y", &vec![0u8; out * 4]);
    let dummy = storage("dummy", &[0u8; 16]);
    // The down projection of expert slot 0 for one token into y: the decode kernel
    // (activations in a uniform window) or the plan's storage kernel.
    let moe = MoeDispatch {
        plan: &g().plan,
        sorted: None,
        fuse_combine: false,
        decode_uniform: decode,
        coalesced: false,
        tiled: None,
        one_token: false,
        hidden: out,
        top_k: 1,
        dummy: &dummy,
        xn: &dummy,
        topk_ids: &zero,
        topk_w: &ones,
        hbuf: &h,
        y: &y,
        x: &dummy,
        route: None,
    };
    let mut prog = Program::default();
    for _ in 0..reps() {
        moe.q4_down(&mut prog, &pool, &zero, Some((0, 1)));
    }
    let prog = prepare(prog, 0);
    run(&prog);
    let bytes = (layout.down.q_bytes() + layout.down.scale_bytes()) * reps();
    bencher.counter(BytesCount::new(bytes)).bench(|| run(&prog));
}

/// The storage matmul of one token (`ops::matmul`, x in storage).
#[divan::bench(args = on(SHAPES), sample_count = 20)]
fn matvec_f16(bencher: divan::Bencher, On((inp, out)): On<(usize, usize)>) {
    let w: Vec<f16> = noise(inp * out, 2)
        .iter()
        .map(|&r| f16::from_f32((r as f32 / u32::MAX as f32) - 0.5))
        .collect();
    let m = F16Matrix::upload(dev(), "w", out, inp, &w).expect("upload");
    let x = storage("x", bytemuck::cast_slice(&vec![0.5f32; inp]));
    let dummy = storage("dummy", &[0u8; 16]);
    let y = storage("y", &vec![0u8; out * 4]);
    let env = OpEnv {
        plan: &g().plan,
        chunk: 1,
        dummy: &dummy,
    };
    let mut prog = Program::default();
    for _ in 0..reps() {
        ops::matmul(&mut prog, &env, &m, &x, None, &y, out, 0);
    }
    let prog = prepare(prog, 0);
    run(&prog);
    bencher
        .counter(BytesCount::new(inp * out * 2 * reps()))
        .bench(|| run(&prog));
}

/// This machine's memory read bandwidth: sum of a 256 MiB buffer on one core and on all.
#[divan::bench(args = on([1usize, 2]), sample_count = 10)]
fn memory_read(bencher: divan::Bencher, On(threads): On<usize>) {
    let words = (256usize << 20) / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    bencher.counter(BytesCount::new(words * 8)).bench(|| {
        let per = words.div_ceil(threads);
        std::thread::scope(|s| {
            let hs: Vec<_> = buf
                .chunks(per)
                .map(|c| s.spawn(move || c.iter().fold(0u64, |a, &b| a.wrapping_add(b))))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0u64, u64::wrapping_add)
        })
    });
}

/// The CPU expert kernel (`wgmoe::backend::cpu`, missed experts computed from the host
/// source) on one MoE layer's routed experts for `tokens` tokens: 8 distinct experts
/// (top-8) of OLMoE-1B-7B (hidden 2048, intermediate 1024) or of the scaled shape (1024,
/// 512), a different expert set per token. Each iteration moves on to the next experts of
/// a pool of 64 (204 MB at OLMoE's shape), so the weights come from memory, not from a
/// cache holding the last iteration's. Counter: packed expert bytes read (each expert once
/// per call); compare with `memory_read` of the same thread count.
#[divan::bench(args = [(1usize, 2048usize, 1024usize, 1usize), (2, 2048, 1024, 1), (2, 1024, 512, 1), (2, 1024, 512, 16)], sample_count = 20)]
fn cpu_experts(bencher: divan::Bencher, (threads, h, i, tokens): (usize, usize, usize, usize)) {
    use wgmoe::backend::cpu::{CpuExperts, ExpertPair};
    let (e, k) = (64usize, 8usize);
    let layout = Q4SlotLayout::new(h, i);
    let slots: Vec<Vec<u8>> = (0..e)
        .map(|s| bytemuck::cast_slice(&noise(layout.bytes / 4, 10 + s as u64)).to_vec())
        .collect();
    let cpu = CpuExperts::new(Some(threads)).expect("threads");
    let x: Vec<f32> = noise(tokens * h, 4)
        .iter()
        .map(|&r| (r as f32 / u32::MAX as f32) - 0.5)
        .collect();
    // Iteration j reads the experts of `base` shifted by 8 j (mod 64): the same count of
    // distinct experts every time, never the set the last iteration read.
    let base: Vec<ExpertPair> = (0..tokens * k)
        .map(|p| ExpertPair {
            token: (p / k) as u32,
            expert: ((p * 7 + p / k) % e) as u32,
            weight: 0.125,
        })
        .collect();
    let distinct: std::collections::BTreeSet<u32> = base.iter().map(|p| p.expert).collect();
    let sets: Vec<Vec<ExpertPair>> = (0..e / k)
        .map(|j| {
            base.iter()
                .map(|p| ExpertPair {
                    expert: ((p.expert as usize + j * k) % e) as u32,
                    ..*p
                })
                .collect()
        })
        .collect();
    let mut out = vec![0.0f32; tokens * h];
    let mut j = 0usize;
    eprintln!("cpu experts: {} ({} threads)", cpu.isa(), cpu.threads());
    bencher
        .counter(BytesCount::new(distinct.len() * layout.bytes))
        .bench_local(|| {
            j = (j + 1) % sets.len();
            cpu.run(
                &layout,
                &|e| Ok(&slots[e as usize][..]),
                &x,
                &sets[j],
                &mut out,
            )
            .expect("cpu experts")
        });
}

/// One MoE layer's routed experts (OLMoE shapes: hidden 2048, 64 experts of 1024, top-8;
/// INT4), for one decoded token, per executor. Counter: bytes of the 8 experts read.
#[divan::bench(args = on([Executor::Grouped, Executor::PerExpert]), sample_count = 20)]
fn moe_layer_olmoe_int4(bencher: divan::Bencher, On(executor): On<Executor>) {
    let (h, i, e, k) = (2048usize, 1024usize, 64usize, 8usize);
    let layout = Q4SlotLayout::new(h, i);
    let pool = Q4Pool::new(dev(), "experts", e, layout).expect("pool");
    let slot: Vec<u8> = bytemuck::cast_slice(&noise(layout.bytes / 4, 3)).to_vec();
    for s in 0..e {
        pool.write_slot(dev(), s, &slot).expect("write slot");
    }
    let store = ExpertStore::Int4(pool);
    let ids: Vec<u32> = (0..k as u32).map(|j| j * 7 % e as u32).collect();
    let slot_of: Vec<u32> = (0..e as u32).collect();
    let x = storage("x", &vec![0u8; h * 4]);
    let topk_ids = storage("ids", bytemuck::cast_slice(&ids));
    let topk_w = storage("w", bytemuck::cast_slice(&vec![0.125f32; k]));
    let slot_buf = storage("slot_of", bytemuck::cast_slice(&slot_of));
    // Window-capable activations: one-token steps use the decode kernels, as the runtime.
    let hbuf = window("h", &vec![0.1f32; k * i]);
    let xn = window("xn", &vec![0.1f32; h]);
    let y = storage("y", &vec![0u8; k * h * 4]);
    let dummy = storage("dummy", &[0u8; 16]);
    let moe = MoeDispatch {
        plan: &g().plan,
        sorted: None,
        fuse_combine: true,
        decode_uniform: true,
        coalesced: false,
        tiled: None,
        one_token: false,
        hidden: h,
        top_k: k,
        dummy: &dummy,
        xn: &xn,
        topk_ids: &topk_ids,
        topk_w: &topk_w,
        hbuf: &hbuf,
        y: &y,
        x: &x,
        route: None,
    };
    let mut prog = Program::default();
    let flags = moe.routed(&mut prog, executor, &store, &slot_buf);
    if flags != 0 {
        ops::moe_combine(
            &mut prog,
            &MoeCombineParams {
                hidden: h as u32,
                top_k: k as u32,
                flags,
                ..Default::default()
            },
            &CombineBuffers {
                y: &y,
                weights: &topk_w,
                shared_y: &dummy,
                router: &dummy,
                x: &x,
                ids: &dummy,
                slot_of: &dummy,
                host_y: &dummy,
            },
        );
    }
    eprintln!("moe layer {executor:?}: {} dispatches", prog.len());
    let prog = prepare(prog, 0);
    run(&prog);
    bencher
        .counter(BytesCount::new(k * layout.bytes))
        .bench(|| run(&prog));
}

/// Decode attention of one token over a KV cache of `context` positions: 16 heads of 128
/// (OLMoE-1B-7B / Qwen1.5-MoE-A2.7B), no GQA, params as src/model/forward.rs builds them;
/// `ops::attention` recorded for one-token chunks, so the one-workgroup-per-(head, token)
/// kernel (a model prefilling longer chunks on a CPU adapter decodes with the window
/// kernel). Counter: bytes of K and V read.
#[divan::bench(args = on([512usize, 2048]), sample_count = 10)]
fn attention_16x128_decode(bencher: divan::Bencher, On(context): On<usize>) {
    let (nh, nkv, hd) = (16usize, 16usize, 128usize);
    let kv = context * nkv * hd;
    let q = storage("q", bytemuck::cast_slice(&uniform_noise(nh * hd, 4, 1.0)));
    let ck = storage("cache_k", bytemuck::cast_slice(&uniform_noise(kv, 5, 1.0)));
    let cv = storage("cache_v", bytemuck::cast_slice(&uniform_noise(kv, 6, 1.0)));
    let scratch = storage("scratch", &vec![0u8; nh * context * 4]);
    let attn = storage("attn", &vec![0u8; nh * hd * 4]);
    let dummy = storage("dummy", &[0u8; 16]);
    let env = OpEnv {
        plan: &g().plan,
        chunk: 1,
        dummy: &dummy,
    };
    let ab = AttentionBuffers {
        qkv: &dummy,
        q_norm: None,
        k_norm: None,
        rope: &dummy,
        q: &q,
        cache_k: &ck,
        cache_v: &cv,
        scratch: &scratch,
        part: &dummy,
        out: &attn,
    };
    let mut prog = Program::default();
    for _ in 0..reps() {
        ops::attention(
            &mut prog,
            &env,
            &AttentionParams {
                n_heads: nh as u32,
                n_kv: nkv as u32,
                head_dim: hd as u32,
                scratch_stride: context as u32,
                scale: (hd as f32).powf(-0.5),
                ..Default::default()
            },
            &ab,
            context,
        );
    }
    // The token at the last position sees the whole cache.
    let prog = prepare(prog, context - 1);
    run(&prog);
    bencher
        .counter(BytesCount::new(2 * kv * 4 * reps()))
        .bench(|| run(&prog));
}

/// The router of one decoded token: the f16 router matmul (hidden 2048 -> experts, plus
/// Qwen's shared-expert gate row) and softmax/top-k, as src/model/forward.rs records them
/// (`ops::matmul`, `ops::router_topk`). Args: (experts, top-k, logit rows): OLMoE 64
/// top-8; Qwen1.5-MoE 60 top-4 (61 rows). Counter: bytes of router weights read.
#[divan::bench(args = on([(64usize, 8usize, 64usize), (60, 4, 61)]), sample_count = 20)]
fn router_f16_topk_h2048(
    bencher: divan::Bencher,
    On((experts, top_k, rows)): On<(usize, usize, usize)>,
) {
    let h = 2048usize;
    let w: Vec<f16> = uniform_noise(rows * h, 7, 0.05)
        .into_iter()
        .map(f16::from_f32)
        .collect();
    let m = F16Matrix::upload(dev(), "router", rows, h, &w).expect("upload");
    let xn = storage("xn", bytemuck::cast_slice(&uniform_noise(h, 8, 1.0)));
    let dummy = storage("dummy", &[0u8; 16]);
    let logits = storage("router_logits", &vec![0u8; rows * 4]);
    let ids = storage("topk_ids", &vec![0u8; top_k * 4]);
    let wts = storage("topk_w", &vec![0u8; top_k * 4]);
    let env = OpEnv {
        plan: &g().plan,
        chunk: 1,
        dummy: &dummy,
    };
    let mut prog = Program::default();
    for _ in 0..reps() {
        ops::matmul(&mut prog, &env, &m, &xn, None, &logits, rows, 0);
        ops::router_topk(
            &mut prog,
            &RouterTopkParams {
                n_experts: experts as u32,
                top_k: top_k as u32,
                logits_stride: rows as u32,
                norm_topk: 0,
                ..Default::default()
            },
            &logits,
            &ids,
            &wts,
        );
    }
    let prog = prepare(prog, 0);
    run(&prog);
    bencher
        .counter(BytesCount::new(rows * h * 2 * reps()))
        .bench(|| run(&prog));
}

/// A small synthetic OLMoE-shaped model (hidden 512, 4 layers, 8 heads, 16 experts top-4,
/// expert intermediate 256, vocab 4096; converted INT4), written once per process.
fn synth_model() -> &'static std::path::Path {
    use wgmoe::synth::{
        write_synthetic, ShapeOverrides, SynthArch, SynthFormat, SynthOptions, SynthShape,
        DEFAULT_MAX_SHARD_BYTES,
    };
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let shape = SynthShape::resolve(
            SynthArch::Olmoe1b7b,
            &ShapeOverrides {
                hidden: Some(512),
                layers: Some(4),
                heads: Some(8),
                experts: Some(16),
                top_k: Some(4),
                expert_intermediate: Some(256),
                vocab: Some(4096),
                ..Default::default()
            },
        )
        .expect("shape");
        write_synthetic(
            &SynthOptions {
                arch: SynthArch::Olmoe1b7b,
                shape,
                seed: 0,
                format: SynthFormat::Converted,
                max_shard_bytes: DEFAULT_MAX_SHARD_BYTES,
                gguf_scheme: wgmoe::synth::GgufScheme::Q4KM,
                router_skew: 0.0,
            },
            dir.path(),
            &mut |_, _| {},
        )
        .expect("synth");
        dir
    })
    .path()
}

/// One decode step of the synthetic model through the engine (every expert resident, INT4):
/// `Forward::submit(pos, 1, None, Head::LastArgmax)` then `read_token`, at a fixed position
/// after a 16-token prefill. Counter: tokens (items/s = decode tok/s).
#[divan::bench(args = on([Executor::Grouped, Executor::PerExpert]), sample_count = 20)]
fn decode_step_synth_h512_l4_e16k4(bencher: divan::Bencher, On(executor): On<Executor>) {
    use wgmoe::model::Head;
    use wgmoe::runtime::engine::{Engine, EngineOptions, ExpertPrecision, ResidencyOptions};
    let prompt: Vec<u32> = (0..16u32).map(|i| 10 + i * 37 % 4000).collect();
    let mut engine = Engine::load(
        synth_model(),
        &EngineOptions {
            residency: ResidencyOptions::default(),
            adapter: Default::default(),
            kernels: KernelOverrides {
                portable: portable(),
                ..Default::default()
            },
            expert_precision: ExpertPrecision::Int4,
            dense_precision: wgmoe::runtime::engine::DensePrecision::F16,
            kv_precision: wgmoe::runtime::engine::KvPrecision::F32,
            executor,
            max_context: 64,
            prefill_chunk: 16,
            all_logits: false,
            score_rows: 0,
            batch: 1,
        },
    )
    .expect("load the synthetic model");
    // (Printing here would interleave with divan's table; the adapter is printed first.)
    assert_eq!(
        engine.dev.info().name,
        dev().info().name,
        "same adapter as the kernel benches"
    );
    let fwd = &mut engine.fwd;
    fwd.submit(0, prompt.len(), Some(&prompt), Head::LastArgmax)
        .expect("prefill");
    fwd.read_token().expect("read");
    let pos = prompt.len();
    // A step takes the forward pass mutably (its counters): bench on this thread.
    bencher.counter(ItemsCount::new(1usize)).bench_local(|| {
        fwd.submit(pos, 1, None, Head::LastArgmax)
            .expect("decode step");
        fwd.read_token().expect("read token")
    });
}

/// One 64-token prefill step of the synthetic model through the engine (INT4, grouped),
/// with the window / expert-major kernels (the CPU-adapter default) and with the storage
/// kernels (the GPU default), side by side. Counter: prompt tokens (items/s = prefill tok/s).
#[divan::bench(args = on(["window", "storage"]), sample_count = 10)]
fn prefill_step_synth_h512_l4_e16k4(bencher: divan::Bencher, On(kernels): On<&str>) {
    use wgmoe::model::Head;
    use wgmoe::runtime::engine::{Engine, EngineOptions, ExpertPrecision, ResidencyOptions};
    let n = 64usize;
    let prompt: Vec<u32> = (0..n as u32).map(|i| 10 + i * 37 % 4000).collect();
    let mut engine = Engine::load(
        synth_model(),
        &EngineOptions {
            residency: ResidencyOptions::default(),
            adapter: Default::default(),
            kernels: KernelOverrides {
                prefill: Some(if kernels == "window" {
                    PrefillKernels::Window
                } else {
                    PrefillKernels::Storage
                }),
                ..Default::default()
            },
            expert_precision: ExpertPrecision::Int4,
            dense_precision: wgmoe::runtime::engine::DensePrecision::F16,
            kv_precision: wgmoe::runtime::engine::KvPrecision::F32,
            executor: Executor::Grouped,
            max_context: n + 1,
            prefill_chunk: n,
            all_logits: false,
            score_rows: 0,
            batch: 1,
        },
    )
    .expect("load the synthetic model");
    let fwd = &mut engine.fwd;
    bencher.counter(ItemsCount::new(n)).bench_local(|| {
        fwd.submit(0, n, Some(&prompt), Head::LastArgmax)
            .expect("prefill step");
        fwd.read_token().expect("read token")
    });
}

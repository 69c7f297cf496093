//! The CPU expert kernel (`wgmoe::backend::cpu`) against the CPU reference
//! (`cpu_ref::w4a16_*`, element by element in f64) and against the GPU INT4 kernels on
//! lavapipe, on the packed slots of tests/common/q4.rs: random nibbles (all 16 values),
//! random scales with some zero, and NaN in every scale half no row owns, so reading one
//! turns the output into NaN. Shapes with partial blocks and odd sizes, 1 to 8 tokens.

mod common;

use common::check::check;
use common::gpu::*;
use common::q4::*;
use common::rng::Rng;
use wgmoe::backend::cpu::{CpuExperts, ExpertPair};
use wgmoe::blocks::quant::{Q4Kind, Q4SlotLayout};
use wgmoe::cpu_ref;

/// The kernel sums in f32 (16 running sums per 256-input block, FMA where the CPU has it,
/// one scale multiply per block) what the reference sums in f64, gate/up and down; as the
/// GPU kernels' Q4_TOL.
const CPU_TOL: f32 = 2e-5;
/// CPU kernel vs GPU kernels: both f32, summed in different orders.
const CPU_VS_GPU_TOL: f32 = 4e-5;

/// x0 + sum over each token's pairs of w * expert(x_t), by the reference.
fn reference(
    layout: &Q4SlotLayout,
    slots: &[Vec<u8>],
    x: &[f32],
    x0: &[f32],
    pairs: &[ExpertPair],
) -> Vec<f32> {
    let h = layout.hidden;
    let mut out: Vec<f64> = x0.iter().map(|&v| v as f64).collect();
    for p in pairs {
        let t = p.token as usize;
        let slot = &slots[p.expert as usize];
        let hid = cpu_ref::w4a16_gate_up(&x[t * h..(t + 1) * h], layout, slot).unwrap();
        let y = cpu_ref::w4a16_down(&hid, layout, slot).unwrap();
        for (o, v) in out[t * h..(t + 1) * h].iter_mut().zip(y) {
            *o += p.weight as f64 * v as f64;
        }
    }
    out.into_iter().map(|v| v as f32).collect()
}

/// `top_k` distinct experts per token, weights in [0.5, 1).
fn random_pairs(rng: &mut Rng, tokens: usize, experts: usize, top_k: usize) -> Vec<ExpertPair> {
    (0..tokens)
        .flat_map(|t| {
            let ids = rng.permutation(experts)[..top_k].to_vec();
            ids.into_iter()
                .map(|e| ExpertPair {
                    token: t as u32,
                    expert: e as u32,
                    weight: 0.5 + rng.f32(0.5),
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn run_cpu(
    cpu: &CpuExperts,
    layout: &Q4SlotLayout,
    slots: &[Vec<u8>],
    x: &[f32],
    x0: &[f32],
    pairs: &[ExpertPair],
) -> Vec<f32> {
    let mut out = x0.to_vec();
    let st = cpu
        .run(layout, &|e| Ok(&slots[e as usize][..]), x, pairs, &mut out)
        .unwrap();
    assert_eq!(st.pairs, pairs.len() as u64);
    out
}

/// Block-256 slots, and a GGUF file's slot kinds: affine ones (Q4_0: a block, scale and
/// offset per 32 columns), the K-plane kinds (Q4_K, Q5_K, Q6_K, Q5_0/Q5_1) and Q8_0, gate/up
/// and down each in its own.
#[test]
fn cpu_experts_match_the_reference() {
    use Q4Kind::{Affine32, Sym256, Q4K, Q5A, Q5K, Q6K, Q8};
    let kinds = [
        (Sym256, Sym256),
        (Affine32, Affine32),
        (Affine32, Q8),
        (Q8, Affine32),
        (Q8, Q8),
        (Q4K, Q6K),
        (Q5K, Q4K),
        (Q6K, Q5A),
        (Q5A, Q8),
    ];
    for (i, (c, (kind, down))) in SHAPES
        .iter()
        .flat_map(|c| kinds.map(|k| (c, k)))
        .enumerate()
    {
        let mut rng = Rng::new(7100 + i as u64);
        let layout = Q4SlotLayout::mixed(c.hidden, c.inter, kind, down);
        let slots: Vec<Vec<u8>> = (0..c.n_experts)
            .map(|_| random_slot(&mut rng, &layout))
            .collect();
        // 1 to 8 tokens.
        let t = 1 + i % 8;
        let x = rng.vec(t * c.hidden, 1.0);
        let x0 = rng.vec(t * c.hidden, 2.0);
        let pairs = random_pairs(&mut rng, t, c.n_experts, c.top_k);
        // The best ISA the CPU has, then AVX2 (where the best is AVX-512), then baseline.
        for (threads, isa) in [(1, 0), (2, 0), (3, 0), (2, 1), (2, 2)] {
            let cpu = CpuExperts::new(Some(threads)).unwrap();
            let cpu = match isa {
                1 => cpu.without_avx512(),
                2 => cpu.with_baseline_isa(),
                _ => cpu,
            };
            let got = run_cpu(&cpu, &layout, &slots, &x, &x0, &pairs);
            let want = reference(&layout, &slots, &x, &x0, &pairs);
            check(
                &format!(
                    "cpu experts [{}, {threads} threads, {}/{}] H {} I {} T {t} top {} of {}",
                    cpu.isa(),
                    kind.name(),
                    down.name(),
                    c.hidden,
                    c.inter,
                    c.top_k,
                    c.n_experts
                ),
                &got,
                &want,
                CPU_TOL,
            );
        }
    }
}

/// Tokens routed to no expert keep their row exactly; pairs of one token may come in any
/// order and the result is the same; no pair at all leaves `out` untouched.
#[test]
fn cpu_experts_touch_only_routed_tokens() {
    let mut rng = Rng::new(7200);
    let layout = Q4SlotLayout::new(300, 96);
    let slots: Vec<Vec<u8>> = (0..5).map(|_| random_slot(&mut rng, &layout)).collect();
    let cpu = CpuExperts::new(Some(2)).unwrap();
    let x = rng.vec(4 * 300, 1.0);
    let x0 = rng.vec(4 * 300, 2.0);
    let pairs: Vec<ExpertPair> = [(0, 3, 0.7f32), (2, 1, 0.4), (2, 4, 0.6)]
        .iter()
        .map(|&(t, e, w)| ExpertPair {
            token: t,
            expert: e,
            weight: w,
        })
        .collect();
    let got = run_cpu(&cpu, &layout, &slots, &x, &x0, &pairs);
    assert_eq!(&got[300..600], &x0[300..600], "token 1 has no pair");
    assert_eq!(&got[900..], &x0[900..], "token 3 has no pair");
    let mut reversed = pairs.clone();
    reversed.reverse();
    let again = run_cpu(&cpu, &layout, &slots, &x, &x0, &reversed);
    check("pairs reversed", &again, &got, 1e-6);
    assert_eq!(run_cpu(&cpu, &layout, &slots, &x, &x0, &[]), x0);
    // A pair naming a token outside x is refused, not a panic.
    let bad = [ExpertPair {
        token: 4,
        expert: 0,
        weight: 1.0,
    }];
    let mut out = x0.clone();
    assert!(cpu
        .run(&layout, &|e| Ok(&slots[e as usize][..]), &x, &bad, &mut out)
        .is_err());
}

/// The same routed layer computed by the GPU INT4 kernels (gate_up, then down with the
/// fused weighted combine into x0) and by the CPU kernel from the same slot bytes.
#[test]
fn cpu_experts_match_the_gpu_kernels() {
    let g = Gpu::new(None, Default::default());
    for (i, c) in SHAPES.iter().enumerate() {
        let s = Setup::random(&g, 7300 + i as u64, *c);
        let h = s.gpu_gate_up(&s.all_chunks());
        let h_b = f32_buf(&g.dev, &h);
        let gpu = s.gpu_fused(&h_b, &s.all_chunks());
        let k = c.top_k;
        let pairs: Vec<ExpertPair> = (0..c.t * k)
            .map(|i| ExpertPair {
                token: (i / k) as u32,
                expert: s.ids[i],
                weight: s.weights[i],
            })
            .collect();
        let best = CpuExperts::new(Some(2)).unwrap();
        let avx2 = CpuExperts::new(Some(2)).unwrap().without_avx512();
        for cpu in [best, avx2] {
            let mut out = s.x0.clone();
            cpu.run(
                &s.layout,
                &|e| Ok(&s.host[s.slot_of[e as usize]][..]),
                &s.xs,
                &pairs,
                &mut out,
            )
            .unwrap();
            check(
                &format!("cpu [{}] vs gpu {}", cpu.isa(), s.what()),
                &out,
                &gpu,
                CPU_VS_GPU_TOL,
            );
        }
    }
}

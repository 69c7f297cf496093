//! The expert kernels on a GGUF file's slot kinds, held as its blocks are: affine INT4
//! (`Q4Kind::Affine32`, Q4_0: fmt_q4a.wgsl, tile_q4a.wgsl), the K-plane kinds (Q4_K, Q5_K,
//! Q6_K, Q5_0/Q5_1: kq_common.wgsl with the format's record reader, tile_kq.wgsl) and
//! Q8_0, gate/up and down each in its own kind, in the GPU-shaped row kernels and the
//! tiled expert GEMM, against `wgmoe::cpu_ref::w4a16_*`, which reads the same slot bytes
//! element by element and sums in f64. The dispatches are the forward pass's own
//! (`MoeDispatch`), over random slots whose unused scale halves are NaN
//! (tests/common/q4.rs). These slots take the row kernels on every plan: the
//! lavapipe-tuned INT4 kernels read block-256 slots only.

mod common;

use common::check::check;
use common::gpu::*;
use common::q4::*;
use wgmoe::backend::kernel::WeightFormat;
use wgmoe::backend::plan::PrefillKernels;
use wgmoe::backend::{Kernel, KernelOverrides};
use wgmoe::blocks::quant::{Q4Kind, Q4SlotLayout};

const A32: Q4Kind = Q4Kind::Affine32;

/// As Q4_TOL, plus the offsets' f32 sums of x (one per 32 columns).
const AFFINE_TOL: f32 = 3e-5;

/// The decode row kernels of one setup (gate/up, down per slot, fused) against the CPU.
fn check_decode(s: &Setup, what: &str) {
    let all = s.all_chunks();
    check(
        &format!("gate_up {what}"),
        &s.gpu_gate_up(&all),
        &s.want_gate_up(),
        AFFINE_TOL,
    );
    check(
        &format!("down per slot {what}"),
        &s.gpu_down(&s.h_b, &all),
        &s.want_down(&s.h_in),
        AFFINE_TOL,
    );
    check(
        &format!("down fused {what}"),
        &s.gpu_fused(&s.h_b, &all),
        &s.want_fused(&s.h_in, &all),
        AFFINE_TOL,
    );
}

/// The tiled expert GEMMs (gate/up, then down) on random slots of kinds `(gate/up, down)`,
/// `per_chunk` slots a pool chunk (None: one chunk), against the CPU.
fn check_expert_gemm(c: Case, per_chunk: Option<usize>, (gu, down): (Q4Kind, Q4Kind), seed: u64) {
    let tiled = KernelOverrides {
        prefill: Some(PrefillKernels::Tiled),
        ..Default::default()
    };
    let bytes = Q4SlotLayout::mixed(c.hidden, c.inter, gu, down).bytes;
    let g = Gpu::new(per_chunk.map(|n| (n * bytes) as u64), tiled);
    let s = Setup::random_mixed(&g, seed, c, gu, down);
    let (h, y) = s.gpu_expert_gemm();
    let what = format!("{}/{} {}", gu.name(), down.name(), s.what());
    check(
        &format!("expert_gemm gate_up {what}"),
        &h,
        &s.want_gate_up(),
        AFFINE_TOL,
    );
    check(
        &format!("expert_gemm down {what}"),
        &y,
        &s.want_down(&h),
        AFFINE_TOL,
    );
}

#[test]
fn affine_int4_decode_kernels_match_cpu() {
    for o in VARIANTS {
        let g = Gpu::new(None, o);
        for (i, &c) in SHAPES.iter().enumerate() {
            let s = Setup::random_kind(&g, 1300 + i as u64, c, A32);
            assert!(
                s.kernels.contains("int4-a32"),
                "affine slots run the row kernels: {}",
                s.kernels
            );
            check_decode(&s, &s.what());
        }
    }
}

/// A pool split into chunks: each chunk's dispatch serves its own slots.
#[test]
fn affine_int4_split_pool_matches_cpu() {
    for (i, (c, per_chunk)) in [
        (case(300, 65, 7, 10, 4, 5), 3u64),
        (case(96, 1408, 5, 7, 3, 5), 2),
    ]
    .into_iter()
    .enumerate()
    {
        let bytes = Q4SlotLayout::with_kind(c.hidden, c.inter, A32).bytes as u64;
        let g = Gpu::new(Some(per_chunk * bytes), VARIANTS[1]);
        let s = Setup::random_kind(&g, 1400 + i as u64, c, A32);
        assert_eq!(s.pool().chunks.len(), c.slots.div_ceil(per_chunk as usize));
        let all = s.all_chunks();
        let what = s.what();
        check(
            &format!("gate_up {what}"),
            &s.gpu_gate_up(&all),
            &s.want_gate_up(),
            AFFINE_TOL,
        );
        check(
            &format!("down fused {what}"),
            &s.gpu_fused(&s.h_b, &all),
            &s.want_fused(&s.h_in, &all),
            AFFINE_TOL,
        );
    }
}

/// The tiled expert GEMMs (prefill on GPUs) on affine slots.
#[test]
fn affine_int4_expert_gemm_matches_cpu() {
    let mut cases: Vec<(Case, Option<usize>)> = SHAPES.iter().map(|&c| (c, None)).collect();
    cases.extend([
        (case(257, 300, 5, 6, 4, 33), None),
        (case(300, 65, 7, 10, 4, 9), Some(3)),
    ]);
    for (i, &(c, per_chunk)) in cases.iter().enumerate() {
        check_expert_gemm(c, per_chunk, (A32, A32), 1500 + i as u64);
    }
    // The variant assembled for the affine format is the one that ran.
    assert!(Kernel::all().contains(&Kernel::ExpertGemm(WeightFormat::Q4A)));
}

/// GGUF slots with Q8_0 matrices (Q6_K/Q5_K/Q8_0... experts) beside affine INT4 ones, or
/// all Q8_0: the decode row kernels (gate/up, down per slot, fused) on every variant, and
/// the tiled expert GEMMs, each matrix read in its own format from the one slot.
#[test]
fn gguf_slots_with_q8_matrices_match_cpu() {
    let kinds = [
        (A32, Q4Kind::Q8),
        (Q4Kind::Q8, A32),
        (Q4Kind::Q8, Q4Kind::Q8),
    ];
    for (vi, o) in VARIANTS.iter().enumerate() {
        let g = Gpu::new(None, *o);
        for (i, &c) in SHAPES.iter().enumerate() {
            let (gu, down) = kinds[(i + vi) % kinds.len()];
            let s = Setup::random_mixed(&g, 1600 + i as u64, c, gu, down);
            check_decode(&s, &format!("{}/{} {}", gu.name(), down.name(), s.what()));
        }
    }
    for (i, &(c, per_chunk)) in [
        (case(257, 300, 5, 6, 4, 33), None),
        (case(300, 65, 7, 10, 4, 9), Some(3usize)),
        (case(33, 96, 6, 8, 4, 5), None),
    ]
    .iter()
    .enumerate()
    {
        for (k, &(gu, down)) in kinds.iter().enumerate() {
            check_expert_gemm(c, per_chunk, (gu, down), 1700 + (i * 3 + k) as u64);
        }
    }
}

/// The slot kinds of a GGUF file's experts held as they are: Q4_K, Q5_K, Q6_K and Q5_0/Q5_1
/// (nibble planes and side records), alone and beside each other and Q8_0 / affine INT4
/// (a Q4_K_M file's Q4_K gate/up and Q6_K down): the decode row kernels on every variant,
/// a split pool, and the tiled expert GEMMs.
#[test]
fn gguf_k_plane_slots_match_cpu() {
    use Q4Kind::{Q4K, Q5A, Q5K, Q6K, Q8};
    let kinds = [
        (Q4K, Q6K),
        (Q4K, Q4K),
        (Q5K, Q6K),
        (Q6K, Q8),
        (Q5A, Q4K),
        (Q8, Q5A),
        (A32, Q5K),
    ];
    for (vi, o) in VARIANTS.iter().enumerate() {
        let g = Gpu::new(None, *o);
        for (i, &c) in SHAPES.iter().enumerate() {
            let (gu, down) = kinds[(i + 3 * vi) % kinds.len()];
            let s = Setup::random_mixed(&g, 1800 + (vi * 16 + i) as u64, c, gu, down);
            check_decode(&s, &format!("{}/{} {}", gu.name(), down.name(), s.what()));
        }
    }
    // A split pool: each chunk's dispatch serves its own slots.
    let c = case(512, 256, 7, 10, 4, 5);
    let bytes = Q4SlotLayout::mixed(c.hidden, c.inter, Q4K, Q6K).bytes as u64;
    let g = Gpu::new(Some(3 * bytes), VARIANTS[2]);
    let s = Setup::random_mixed(&g, 1890, c, Q4K, Q6K);
    assert!(s.pool().chunks.len() > 1);
    check_decode(&s, &format!("split {}", s.what()));
    for (i, &(c, per_chunk)) in [
        (case(256, 512, 5, 6, 4, 33), None),
        (case(300, 65, 7, 10, 4, 9), Some(3usize)),
        (case(768, 256, 6, 8, 4, 17), None),
    ]
    .iter()
    .enumerate()
    {
        for (k, &(gu, down)) in kinds.iter().enumerate() {
            if (k + i) % 2 == 0 {
                check_expert_gemm(c, per_chunk, (gu, down), 1900 + (i * 8 + k) as u64);
            }
        }
    }
}

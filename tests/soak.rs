//! A long run at constant thrashing does not grow allocations. Alone in its test binary:
//! it measures the process's RSS, which tests running beside it in the same process would
//! move.

mod common;

use common::engine::*;
use wgmoe::model::Executor;
use wgmoe::runtime::engine::ResidencyOptions;

fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
        * 1024
}

/// 2,000 generated tokens at N = top_k (constant thrashing): after warm-up, runtime GPU
/// allocations and staging stay exactly the same, and RSS stays flat: under 4 KiB per
/// token on average, with or without residency (measured: about 10 and 50 B/token; before
/// router_topk.wgsl stopped leaking on llvmpipe it was about 1 MB per token).
#[test]
fn soak_2000_tokens_at_top_k_does_not_grow() {
    let prompt = [464u32, 1711, 8886, 13];
    // Per-token RSS growth of the same decode loop with every expert resident.
    let mut full = load(
        "olmoe-tiny",
        512,
        ResidencyOptions::default(),
        Executor::Grouped,
    )
    .unwrap();
    greedy(&mut full, &prompt, 100).unwrap();
    let r0 = rss();
    let n_full = greedy(&mut full, &prompt, 400).unwrap().len() as u64;
    let full_rate = rss().saturating_sub(r0) / n_full;
    drop(full);

    let mut eng = load(
        "olmoe-tiny",
        512,
        ResidencyOptions {
            resident_experts: Some(3),
            staging_buffers: 2,
            ..upload()
        },
        Executor::Grouped,
    )
    .unwrap();
    greedy(&mut eng, &prompt, 100).unwrap();
    let (gpu0, rss0) = (eng.dev.tracker().current(), rss());
    let staging0 = eng.fwd.residency.as_ref().unwrap().stats().staging_buffers;
    let mut tokens = 0u64;
    let mut round = 0u32;
    while tokens < 2000 {
        // Varied prompts so routing keeps changing.
        let p: Vec<u32> = prompt.iter().map(|&t| t + round * 37).collect();
        tokens += greedy(&mut eng, &p, 500).unwrap().len() as u64;
        round += 1;
    }
    let r = eng.fwd.residency.as_ref().unwrap();
    let st = r.stats();
    let rate = rss().saturating_sub(rss0) / tokens;
    eprintln!(
        "soak: {tokens} tokens, misses {}, evictions {}, GPU bytes {} -> {}, RSS {} -> {} MiB ({rate} B/token; full residency {full_rate} B/token), staging {} (peak in use {})",
        st.expert_misses, st.expert_evictions, gpu0, eng.dev.tracker().current(), rss0 >> 20, rss() >> 20, st.staging_buffers, st.staging_peak_in_use
    );
    assert!(st.expert_evictions > 1000, "the soak must thrash");
    assert_eq!(eng.dev.tracker().current(), gpu0, "GPU allocations grew");
    assert_eq!(st.staging_buffers, staging0);
    assert!(st.staging_peak_in_use <= staging0);
    assert!(
        rate <= 4096 && full_rate <= 4096,
        "RSS grows {rate} B/token with residency, {full_rate} B/token without"
    );
}

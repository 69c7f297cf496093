//! A model too big for one machine: what serving it across GPUs takes, rather than a
//! pretence that wgmoe runs it.

use serde::Serialize;

/// GPUs per server of the advice (the common 8-GPU node).
pub const GPUS_PER_SERVER: u64 = 8;
/// Headroom over the weights for KV cache, activations and the engine, percent (low, high).
pub const HEADROOM_PERCENT: (u64, u64) = (20, 30);

/// One precision's weight bytes and the GPUs they need.
#[derive(Clone, Debug, Serialize)]
pub struct PrecisionNeed {
    pub precision: String,
    /// How the bytes are counted.
    pub rule: String,
    pub weight_bytes: u64,
    /// Weights alone, rounded up.
    pub min_gpus: u64,
    /// With 20% and 30% headroom, rounded up.
    pub gpus_with_headroom: (u64, u64),
    pub servers_of_8: (u64, u64),
}

#[derive(Clone, Debug, Serialize)]
pub struct ClusterAdvice {
    pub gpu_memory_bytes: u64,
    pub needs: Vec<PrecisionNeed>,
    /// Engines built for serving it across GPUs and machines.
    pub engines: Vec<String>,
}

fn gpus(bytes: u64, headroom_percent: u64, gpu_memory: u64) -> u64 {
    let need = bytes as u128 * (100 + headroom_percent) as u128;
    let per = gpu_memory.max(1) as u128 * 100;
    u64::try_from(need.div_ceil(per)).unwrap_or(u64::MAX)
}

/// The advice for `dense` + `routed` parameters; `int4_bytes` is wgmoe's INT4 format
/// (routed experts INT4 with f16 block scales, the rest f16).
pub fn cluster_advice(dense: u64, routed: u64, int4_bytes: u64, gpu_memory: u64) -> ClusterAdvice {
    let params = dense.saturating_add(routed);
    let need = |precision: &str, rule: &str, bytes: u64| {
        let lo = gpus(bytes, HEADROOM_PERCENT.0, gpu_memory);
        let hi = gpus(bytes, HEADROOM_PERCENT.1, gpu_memory);
        PrecisionNeed {
            precision: precision.into(),
            rule: rule.into(),
            weight_bytes: bytes,
            min_gpus: gpus(bytes, 0, gpu_memory),
            gpus_with_headroom: (lo, hi),
            servers_of_8: (lo.div_ceil(GPUS_PER_SERVER), hi.div_ceil(GPUS_PER_SERVER)),
        }
    };
    ClusterAdvice {
        gpu_memory_bytes: gpu_memory,
        needs: vec![
            need("bf16", "2 bytes per parameter", params.saturating_mul(2)),
            need("fp8", "1 byte per parameter", params),
            need(
                "int4",
                "wgmoe's format: routed experts INT4 (block 256, f16 scales), the rest f16",
                int4_bytes,
            ),
        ],
        engines: vec![
            "vLLM with expert parallelism (`vllm serve MODEL --tensor-parallel-size 8 --enable-expert-parallel`, data parallel across servers)".into(),
            "SGLang with expert parallelism (`--tp-size 8 --ep-size 8`, more nodes with `--nnodes`)".into(),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpus_round_up_and_servers_hold_eight() {
        let gib = 1u64 << 30;
        // 400 GiB of bf16 weights on 80 GiB GPUs: 5 at least, 6 / 6.5 -> 7 with headroom.
        let a = cluster_advice(100 * gib, 100 * gib, 150 * gib, 80 * gib);
        let bf16 = &a.needs[0];
        assert_eq!(bf16.weight_bytes, 400 * gib);
        assert_eq!(bf16.min_gpus, 5);
        assert_eq!(bf16.gpus_with_headroom, (6, 7));
        assert_eq!(bf16.servers_of_8, (1, 1));
        assert_eq!(a.needs[1].weight_bytes, 200 * gib);
        assert_eq!(a.needs[2].min_gpus, 2);
        // 1000 GiB: 13 GPUs, 15 / 17 with headroom: 2 / 3 servers.
        let b = cluster_advice(500 * gib, 0, 0, 80 * gib);
        assert_eq!(b.needs[0].min_gpus, 13);
        assert_eq!(b.needs[0].gpus_with_headroom, (15, 17));
        assert_eq!(b.needs[0].servers_of_8, (2, 3));
    }
}

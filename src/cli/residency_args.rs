//! The expert residency options of `run`, `chat` and `serve` (`--resident-experts`,
//! `--vram`, the miss, cache and prefetch policies), and the notes for those given that
//! the loaded engine does not use.

use std::path::PathBuf;

use clap::Args;

use wgmoe::error::{Error, Result};

use crate::parse_size;

#[derive(Args, Clone)]
pub(crate) struct ResidencyArgs {
    /// Expert slots per layer on the GPU (default all; with --miss-policy upload at least
    /// top_k; 0 = every routed expert on the CPU).
    #[arg(long)]
    pub(crate) resident_experts: Option<usize>,
    /// Every routed expert computed on the CPU (as --resident-experts 0): attention,
    /// norms, router, shared experts and lm_head stay on the GPU.
    #[arg(long, conflicts_with = "resident_experts")]
    pub(crate) cpu_experts: bool,
    /// The first N layers' routed experts all computed on the CPU (llama.cpp's
    /// --n-cpu-moe); the other layers as --resident-experts says.
    #[arg(long, default_value_t = 0)]
    pub(crate) n_cpu_moe: usize,
    /// Where an expert with no GPU slot runs: uploaded, computed on the CPU, or chosen per
    /// miss by a cost model measured at start-up (default: auto below full residency).
    #[arg(long, value_enum)]
    pub(crate) miss_policy: Option<wgmoe::residency::MissPolicy>,
    /// Threads of the CPU expert kernel (default: one per core).
    #[arg(long)]
    pub(crate) cpu_threads: Option<usize>,
    /// GPU memory the runtime may allocate (e.g. 6GiB, 512MiB); derives --resident-experts.
    #[arg(long = "vram", value_name = "SIZE", value_parser = parse_size, alias = "vram-budget")]
    pub(crate) vram_budget: Option<u64>,
    /// Which expert a full cache evicts (default lru).
    #[arg(long, value_parser = ["lru", "lfu-decay", "profile"])]
    pub(crate) cache_policy: Option<String>,
    /// Per-step decay of the LFU access counter (0, 1] (--cache-policy lfu-decay; default
    /// 0.95).
    #[arg(long)]
    pub(crate) decay: Option<f64>,
    /// Expert-frequency profile for --cache-policy profile (written by a calibration
    /// `wgmoe run`).
    #[arg(long)]
    pub(crate) profile: Option<PathBuf>,
    /// Mapped staging buffers for expert uploads (default: top_k, plus the prefetch
    /// width with --prefetch next-layer).
    #[arg(long)]
    pub(crate) staging_buffers: Option<usize>,
    /// Copy the experts the next layer's router predicts from this layer's hidden state
    /// while this layer computes (default: next-layer below full residency, unless
    /// --miss-policy cpu).
    #[arg(long, value_enum)]
    pub(crate) prefetch: Option<wgmoe::residency::Prefetch>,
    /// Experts guessed and prefetched per layer and step (default: top_k).
    #[arg(long, value_name = "N")]
    pub(crate) prefetch_width: Option<usize>,
    /// Threads filling staging buffers while the GPU computes (default 2, at most one per
    /// core; 0: the submitting thread fills them, the GPU waiting).
    #[arg(long, value_name = "N")]
    pub(crate) fill_threads: Option<usize>,
}

impl ResidencyArgs {
    /// The eviction policy's name (lru unless given).
    pub(crate) fn policy_name(&self) -> &str {
        self.cache_policy.as_deref().unwrap_or("lru")
    }

    pub(crate) fn decay_value(&self) -> f64 {
        self.decay
            .unwrap_or(wgmoe::residency::LfuDecay::DEFAULT_DECAY)
    }

    /// Notes for the options given that the loaded engine does not use: `--decay` without
    /// the LFU policy, `--cache-policy` with every expert resident (nothing is evicted).
    pub(crate) fn unused_notes(&self, resident_experts: usize, num_experts: usize) -> Vec<String> {
        let mut notes = Vec::new();
        let policy = self.cache_policy.as_deref();
        if resident_experts >= num_experts {
            if let Some(p) = policy {
                notes.push(format!(
                    "--cache-policy {p} is unused: every expert is resident, so nothing is evicted"
                ));
            }
        }
        if let Some(d) = self.decay {
            if policy != Some("lfu-decay") {
                notes.push(format!(
                    "--decay {d} is unused: it is the decay of --cache-policy lfu-decay, and the policy is {}",
                    policy.unwrap_or("lru (the default)")
                ));
            }
        }
        notes
    }
}

/// `--staging-buffers` as given (0 is refused, as admission would), or 0 for the default.
pub(crate) fn staging_buffers(n: Option<usize>) -> Result<usize> {
    match n {
        Some(0) => Err(Error::option(
            "--staging-buffers",
            format!(
                "0 is outside 1..={}",
                wgmoe::runtime::admission::MAX_STAGING_BUFFERS
            ),
        )),
        Some(n) => Ok(n),
        None => Ok(0),
    }
}

impl ResidencyArgs {
    pub(crate) fn options(&self) -> Result<wgmoe::runtime::engine::ResidencyOptions> {
        let policy: wgmoe::residency::PolicyKind = self
            .policy_name()
            .parse()
            .map_err(|e: wgmoe::residency::ConfigError| Error::option("--cache-policy", e.0))?;
        Ok(wgmoe::runtime::engine::ResidencyOptions {
            resident_experts: if self.cpu_experts {
                Some(0)
            } else {
                self.resident_experts
            },
            vram_budget: self.vram_budget,
            policy,
            decay: self.decay_value(),
            profile: self.profile.clone(),
            staging_buffers: staging_buffers(self.staging_buffers)?,
            record_profile: false,
            miss_policy: self.miss_policy,
            n_cpu_moe: self.n_cpu_moe,
            cpu_threads: self.cpu_threads,
            prefetch: self.prefetch,
            prefetch_width: self.prefetch_width,
            fill_threads: self.fill_threads,
        })
    }
}

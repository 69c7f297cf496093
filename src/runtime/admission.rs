//! Admission control: the expert slots per layer, fixed before any allocation from the
//! same arithmetic the allocations follow (weights, expert slots with spares and staging,
//! the workspace table). A configuration outside the valid range, or over
//! `--vram`, is refused with what would fit. From top_k up to full residency the
//! cost is affine in the slot count, so the largest count a budget holds is found in
//! closed form (below top_k, where CPU misses allow it, at most top_k counts are tried),
//! with checked arithmetic throughout.

use crate::backend::kernel::{KvFormat, WeightFormat};
use crate::blocks::q8_0::Q8Matrix;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::model::tensors::{pad8, ExpertPool, F16Matrix};
use crate::model::workspace::{planned_shape, workspace_bytes, WorkspaceShape};
use crate::residency::MissPolicy;
use crate::units::human;

/// Most mapped staging buffers for expert uploads.
pub const MAX_STAGING_BUFFERS: usize = 1024;

/// What admission needs to know of a run.
#[derive(Clone, Copy, Debug)]
pub struct AdmissionInput {
    pub int4: bool,
    /// The dense weights' format (f16 or Q8_0).
    pub dense: WeightFormat,
    /// The KV cache's format.
    pub kv: KvFormat,
    pub max_context: usize,
    pub prefill_chunk: usize,
    pub all_logits: bool,
    /// Logits rows for the server's prompt scoring (`EngineOptions::score_rows`).
    pub score_rows: usize,
    /// Most sequences of a batched step (`serve --parallel`; 1 otherwise).
    pub batch: usize,
    pub staging_buffers: usize,
    /// Where misses run: with `cpu` or `auto`, fewer than top_k experts per layer (even
    /// none) are valid, and the spare slots shrink to min(top_k, resident).
    pub miss: MissPolicy,
    /// MoE layers whose experts all run on the CPU (`--n-cpu-moe`): no device slots.
    pub cpu_layers: usize,
    /// Prefetch slots per cached layer below full residency (`--prefetch-width`; 0 with
    /// `--prefetch off`).
    pub prefetch_width: usize,
}

/// Bytes of one routed expert's slot on the device.
pub fn slot_bytes(cfg: &ModelConfig, int4: bool) -> u64 {
    if int4 {
        cfg.q4_slot_bytes() as u64
    } else {
        ExpertPool::slot_bytes(cfg.hidden_size, cfg.moe_intermediate)
    }
}

/// Bytes the expert kernels read of one routed expert, averaged over the MoE layers: its
/// slot's sections without the padding up to the largest layer's slot (a GGUF file's layers
/// may hold their experts in different kinds; uploads copy the whole slot).
pub fn expert_read_bytes(cfg: &ModelConfig, int4: bool) -> f64 {
    if !int4 {
        return slot_bytes(cfg, false) as f64;
    }
    let layers: Vec<usize> = (0..cfg.num_layers)
        .filter(|&l| cfg.sparse_layers.get(l).copied().unwrap_or(true))
        .collect();
    if layers.is_empty() {
        return slot_bytes(cfg, true) as f64;
    }
    let total: f64 = layers
        .iter()
        .map(|&l| cfg.q4_slot(l).used_bytes() as f64)
        .sum();
    total / layers.len() as f64
}

/// Whether a non-routed tensor is a dense weight (the one selection the loader, admission
/// and `wgmoe quantize --dense-precision q8_0` share).
pub use crate::format::identity::is_dense_weight;

/// Bytes one non-routed tensor of `shape` takes on the device, with dense weights in
/// `dense`: f16 (biases f32), a matrix's rows padded to 8 halves, any other tensor padded
/// to 8 values; Q8_0 dense weights as the loader packs them (q, k and v stacked in one
/// matrix: k and v count what they add to it).
pub fn tensor_gpu_bytes_in(
    cfg: &ModelConfig,
    dense: WeightFormat,
    name: &str,
    shape: &[usize],
) -> u128 {
    match (dense, shape) {
        (WeightFormat::Q8, [rows, cols]) if is_dense_weight(name) => {
            // A matrix is held in runs of parts of one kind (a GGUF file's blocks as they
            // are, the rest Q8_0; the loader's rule): the bytes of the first `r` rows of the
            // stack `parts`.
            let upto = |parts: &[(String, usize)], r: usize| -> u128 {
                let (mut left, mut bytes) = (r, 0u128);
                for (kind, n) in cfg.dense_runs(parts) {
                    let take = n.min(left);
                    let f = kind.map_or(WeightFormat::Q8, WeightFormat::int4);
                    bytes += F16Matrix::chunk_bytes(f, take, *cols) as u128;
                    left -= take;
                }
                bytes
            };
            let q_dim = cfg.num_heads * cfg.head_dim;
            let kv_dim = cfg.num_kv_heads * cfg.head_dim;
            // q, k and v stack into one matrix: k and v count what they add to it.
            let stacked = ["q_proj", "k_proj", "v_proj"]
                .iter()
                .position(|p| name.ends_with(&format!(".self_attn.{p}.weight")));
            match stacked {
                Some(i) => {
                    let layer = name.split(".self_attn.").next().unwrap_or("");
                    let parts = [q_dim, kv_dim, kv_dim]
                        .iter()
                        .zip(["q_proj", "k_proj", "v_proj"])
                        .map(|(&n, p)| (format!("{layer}.self_attn.{p}.weight"), n))
                        .collect::<Vec<_>>();
                    let before: usize = parts[..i].iter().map(|p| p.1).sum();
                    upto(&parts, before + parts[i].1) - upto(&parts, before)
                }
                None => upto(&[(name.to_string(), *rows)], *rows),
            }
        }
        _ => tensor_gpu_bytes(name, shape),
    }
}

/// With Q8_0 dense weights and tied embeddings, the lm_head is a Q8_0 copy of the
/// embedding table (the lookup reads f16 rows): its bytes (0 otherwise).
pub fn tied_head_copy_bytes(cfg: &ModelConfig, dense: WeightFormat) -> u128 {
    if dense == WeightFormat::Q8 && cfg.tie_word_embeddings {
        Q8Matrix {
            out: cfg.vocab_size,
            inp: cfg.hidden_size,
        }
        .bytes() as u128
    } else {
        0
    }
}

/// Bytes one non-routed tensor of `shape` takes on the device as f16 (biases f32), a
/// matrix's rows padded to 8 halves, any other tensor padded to 8 values.
pub fn tensor_gpu_bytes(name: &str, shape: &[usize]) -> u128 {
    let n: u128 = match shape {
        [rows, cols] => *rows as u128 * pad8(*cols) as u128,
        other => other
            .iter()
            .map(|&d| d as u128)
            .product::<u128>()
            .next_multiple_of(8),
    };
    n * if name.ends_with(".bias") { 4 } else { 2 }
}

/// Bytes of the per-layer expert->slot tables on the device.
pub fn slot_table_bytes(cfg: &ModelConfig) -> u128 {
    let table = (cfg.num_experts as u128 * 4).max(16).next_multiple_of(16);
    cfg.num_sparse_layers() as u128 * table
}

/// Bytes of every non-routed weight as the device holds it (dense weights in `dense`,
/// the rest f16, rows padded to 8 halves; biases f32), with the shared experts and dense
/// MLPs in their slot layout, and the per-layer expert->slot tables (`u64::MAX` when they
/// cannot be counted).
pub fn dense_gpu_bytes(cfg: &ModelConfig, dense: WeightFormat) -> u64 {
    let tensors: u128 = crate::format::manifest::expected_tensors(cfg)
        .iter()
        .map(|(name, shape)| tensor_gpu_bytes_in(cfg, dense, name, shape))
        .sum();
    u64::try_from(tensors + tied_head_copy_bytes(cfg, dense) + slot_table_bytes(cfg))
        .unwrap_or(u64::MAX)
}

/// Device bytes with `n` experts resident per layer, from parts computed once.
#[derive(Clone, Copy, Debug)]
pub struct AdmissionCost {
    /// Non-routed weights, KV cache and workspace.
    pub fixed: u64,
    /// With CPU experts: the CPU experts' sum buffer and the wider routing readback.
    pub host_extra: u64,
    /// One expert slot.
    pub slot: u64,
    /// MoE layers with device slots.
    pub device_layers: u64,
    /// Below full residency, with a cache: the staging buffers.
    pub staging: u64,
    pub num_experts: usize,
    pub top_k: usize,
    pub miss: MissPolicy,
    /// Some layer's experts run on the CPU whatever `n` is.
    pub cpu_layers: bool,
    /// Prefetch slots per layer below full residency.
    pub prefetch: u64,
}

impl AdmissionCost {
    pub fn new(cfg: &ModelConfig, a: &AdmissionInput) -> Result<Self> {
        let (e, k) = (cfg.num_experts, cfg.top_k);
        crate::model::workspace::check_context(cfg, a.max_context, a.prefill_chunk)?;
        let overflow = |what: &str| {
            Error::DoesNotFit(format!(
                "{what}: the byte count overflows 64 bits ({e} experts per layer, {} MoE layers)",
                cfg.num_sparse_layers()
            ))
        };
        let ws = |host_experts: bool| {
            workspace_bytes(
                cfg,
                &WorkspaceShape {
                    kv: a.kv,
                    batch: a.batch,
                    score_rows: a.score_rows,
                    ..planned_shape(
                        cfg,
                        a.max_context,
                        a.prefill_chunk,
                        a.all_logits,
                        host_experts,
                    )
                },
            )
        };
        let (ws, ws_host) = (ws(false)?, ws(true)?);
        let slot = slot_bytes(cfg, a.int4);
        let fixed = dense_gpu_bytes(cfg, a.dense)
            .checked_add(ws)
            .ok_or_else(|| overflow("weights and workspace"))?;
        let device_layers = cfg.num_sparse_layers().saturating_sub(a.cpu_layers) as u64;
        let staging = (a.staging_buffers as u64)
            .checked_mul(slot)
            .ok_or_else(|| overflow("--staging-buffers"))?;
        // The largest counts must be countable, so `bytes` never overflows.
        device_layers
            .checked_mul(slot)
            .and_then(|x| x.checked_mul(e as u64 + k as u64 + a.prefetch_width as u64))
            .and_then(|x| x.checked_add(fixed))
            .and_then(|x| x.checked_add(staging))
            .and_then(|x| x.checked_add(ws_host - ws))
            .ok_or_else(|| overflow("all experts"))?;
        Ok(AdmissionCost {
            fixed,
            host_extra: ws_host - ws,
            slot,
            device_layers,
            staging,
            num_experts: e,
            top_k: k,
            miss: a.miss,
            cpu_layers: a.cpu_layers > 0,
            prefetch: a.prefetch_width as u64,
        })
    }

    /// Device slots per MoE layer with `n` experts resident: all of them, or `n` plus the
    /// spares uploads land in (top_k; min(top_k, n) beside CPU experts) and the prefetch
    /// slots, or none.
    pub fn slots(&self, n: usize) -> u64 {
        let (e, k) = (self.num_experts, self.top_k);
        if n >= e {
            e as u64
        } else if n == 0 {
            0
        } else if self.miss == MissPolicy::Upload {
            (n + k) as u64 + self.prefetch
        } else {
            (n + k.min(n)) as u64 + self.prefetch
        }
    }

    /// Some expert runs on the CPU with `n` resident per layer.
    pub fn host_experts(&self, n: usize) -> bool {
        self.cpu_layers || (n < self.num_experts && self.miss != MissPolicy::Upload)
    }

    /// The fewest experts per layer a device cache may hold: top_k when every miss is
    /// uploaded, none when misses run on the CPU.
    pub fn min_experts(&self) -> usize {
        if self.miss == MissPolicy::Upload && self.device_layers > 0 {
            self.top_k
        } else {
            0
        }
    }

    /// Device bytes with `n` (<= num_experts) experts resident per layer.
    pub fn bytes(&self, n: usize) -> u64 {
        let cache = n > 0 && n < self.num_experts && self.device_layers > 0;
        self.fixed
            + if self.host_experts(n) {
                self.host_extra
            } else {
                0
            }
            + self.device_layers * self.slot * self.slots(n)
            + if cache { self.staging } else { 0 }
    }

    /// The most experts per layer (min_experts..=num_experts) whose bytes fit `budget`.
    pub fn most_within(&self, budget: u64) -> Option<usize> {
        let (e, k) = (self.num_experts, self.top_k);
        if self.bytes(e) <= budget {
            return Some(e);
        }
        let lo = self.min_experts();
        // From top_k up the cost is affine in n: base + per_slot * (n + top_k + prefetch).
        let per_slot = self.device_layers * self.slot;
        let base = self.fixed
            + self.staging
            + if self.host_experts(k) {
                self.host_extra
            } else {
                0
            };
        let affine = budget
            .checked_sub(base)
            .and_then(|avail| match avail.checked_div(per_slot) {
                Some(m) => usize::try_from(m).ok(),
                // No MoE layer with device slots: every n costs the same.
                None => Some(usize::MAX),
            })
            .map(|m| {
                m.saturating_sub(k + self.prefetch as usize)
                    .min(e.saturating_sub(1))
            })
            .filter(|&n| n >= k.max(lo) && self.bytes(n) <= budget);
        if affine.is_some() {
            return affine;
        }
        // Below top_k (CPU misses only): at most top_k counts to try.
        (lo..k.min(e)).rev().find(|&n| self.bytes(n) <= budget)
    }
}

/// Device bytes the runtime allocates with `n` experts resident per layer: non-routed
/// weights, expert slots (plus the spares and the staging buffers below full residency),
/// KV cache and workspace (with the CPU experts' buffers when some run there). An upper
/// bound of what the tracker will show.
pub fn admission_bytes(cfg: &ModelConfig, a: &AdmissionInput, n: usize) -> Result<u64> {
    Ok(AdmissionCost::new(cfg, a)?.bytes(n))
}

/// The expert slots per layer of a run: `--resident-experts` if given (checked against the
/// valid range and the budget), else the most the budget holds, else every expert.
pub fn admit(
    cfg: &ModelConfig,
    a: &AdmissionInput,
    resident_experts: Option<usize>,
    vram_budget: Option<u64>,
) -> Result<usize> {
    let (e, k) = (cfg.num_experts, cfg.top_k);
    if a.staging_buffers == 0 || a.staging_buffers > MAX_STAGING_BUFFERS {
        return Err(Error::option(
            "--staging-buffers",
            format!("{} is outside 1..={MAX_STAGING_BUFFERS}", a.staging_buffers),
        ));
    }
    let cost = AdmissionCost::new(cfg, a)?;
    let lo = cost.min_experts();
    if let Some(n) = resident_experts {
        if n > e {
            return Err(Error::option(
                "--resident-experts",
                format!("{n} is outside the valid range {lo}..={e}: the model has {e} experts per layer"),
            ));
        }
        if n < lo {
            return Err(Error::option(
                "--resident-experts",
                format!(
                    "{n} is outside the valid range {k}..={e} (top_k..=num_experts) with --miss-policy upload; below top_k, misses must run on the CPU: --miss-policy cpu or auto"
                ),
            ));
        }
    }
    let n = match (resident_experts, vram_budget) {
        (None, None) => e,
        (Some(n), None) => n,
        (None, Some(b)) => cost.most_within(b).ok_or_else(|| {
            Error::DoesNotFit(format!(
                "--vram {}: even {lo} experts per layer need {}; non-expert weights, KV cache and workspace alone take {}",
                human(b),
                human(cost.bytes(lo)),
                human(cost.fixed)
            ))
        })?,
        (Some(n), Some(b)) => {
            if cost.bytes(n) > b {
                return Err(Error::DoesNotFit(format!(
                    "{n} experts per layer need {}; the --vram of {} fits {}",
                    human(cost.bytes(n)),
                    human(b),
                    cost.most_within(b)
                        .map_or(format!("none (not even {lo})"), |m| m.to_string())
                )));
            }
            n
        }
    };
    if (n < e || a.cpu_layers > 0) && !a.int4 {
        return Err(Error::option(
            "--resident-experts",
            "partial residency and CPU experts need --expert-precision int4",
        ));
    }
    Ok(n)
}

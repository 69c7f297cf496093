//! Admission control: the expert slots per layer, fixed before any allocation from the
//! same arithmetic the allocations follow (weights, expert slots with spares and staging,
//! the workspace table). A configuration outside the valid range, or over
//! `--vram-budget`, is refused with what would fit. The cost is affine in the slot count on
//! each side of full residency, so the largest count a budget holds is found in closed
//! form, with checked arithmetic throughout.

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::inspect::human;
use crate::model::tensors::{pad8, ExpertPool};
use crate::model::workspace::{planned_shape, workspace_bytes};
use crate::quant::Q4SlotLayout;

/// Most mapped staging buffers for expert uploads.
pub const MAX_STAGING_BUFFERS: usize = 1024;

/// What admission needs to know of a run.
#[derive(Clone, Copy, Debug)]
pub struct AdmissionInput {
    pub int4: bool,
    pub max_context: usize,
    pub prefill_chunk: usize,
    pub all_logits: bool,
    pub staging_buffers: usize,
}

/// Bytes of one routed expert's slot on the device.
pub fn slot_bytes(cfg: &ModelConfig, int4: bool) -> u64 {
    if int4 {
        Q4SlotLayout::new(cfg.hidden_size, cfg.moe_intermediate).bytes as u64
    } else {
        ExpertPool::slot_bytes(cfg.hidden_size, cfg.moe_intermediate)
    }
}

/// Bytes one non-routed tensor of `shape` takes on the device: f16 (biases f32), a matrix's
/// rows padded to 8 halves, any other tensor padded to 8 values.
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

/// Bytes of every non-routed weight as the device holds it (f16, rows padded to 8 halves;
/// biases f32), with the shared experts and dense MLPs in their slot layout, and the
/// per-layer expert->slot tables (`u64::MAX` when they cannot be counted).
pub fn dense_gpu_bytes(cfg: &ModelConfig) -> u64 {
    let tensors: u128 = crate::manifest::expected_tensors(cfg)
        .iter()
        .map(|(name, shape)| tensor_gpu_bytes(name, shape))
        .sum();
    u64::try_from(tensors + slot_table_bytes(cfg)).unwrap_or(u64::MAX)
}

/// Device bytes with `n` experts resident per layer, from parts computed once.
#[derive(Clone, Copy, Debug)]
pub struct AdmissionCost {
    /// Non-routed weights, KV cache and workspace.
    pub fixed: u64,
    /// One expert slot in every MoE layer.
    pub per_slot: u64,
    /// Below full residency only: top_k spare slots per MoE layer and the staging buffers.
    pub partial_extra: u64,
    pub num_experts: usize,
    pub top_k: usize,
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
        let ws = workspace_bytes(
            cfg,
            &planned_shape(cfg, a.max_context, a.prefill_chunk, a.all_logits),
        )?;
        let slot = slot_bytes(cfg, a.int4);
        let fixed = dense_gpu_bytes(cfg)
            .checked_add(ws)
            .ok_or_else(|| overflow("weights and workspace"))?;
        let per_slot = (cfg.num_sparse_layers() as u64)
            .checked_mul(slot)
            .ok_or_else(|| overflow("expert slots"))?;
        let staging = (a.staging_buffers as u64)
            .checked_mul(slot)
            .ok_or_else(|| overflow("--staging-buffers"))?;
        let partial_extra = per_slot
            .checked_mul(k as u64)
            .and_then(|s| s.checked_add(staging))
            .ok_or_else(|| overflow("spare slots and staging"))?;
        // The largest counts must be countable, so `bytes` never overflows.
        per_slot
            .checked_mul(e as u64)
            .and_then(|x| x.checked_add(fixed))
            .and_then(|x| x.checked_add(partial_extra))
            .ok_or_else(|| overflow("all experts"))?;
        Ok(AdmissionCost {
            fixed,
            per_slot,
            partial_extra,
            num_experts: e,
            top_k: k,
        })
    }

    /// Device bytes with `n` (<= num_experts) experts resident per layer.
    pub fn bytes(&self, n: usize) -> u64 {
        let extra = if n < self.num_experts {
            self.partial_extra
        } else {
            0
        };
        self.fixed + self.per_slot * n.min(self.num_experts) as u64 + extra
    }

    /// The most experts per layer (top_k..=num_experts) whose bytes fit `budget`.
    pub fn most_within(&self, budget: u64) -> Option<usize> {
        let (e, k) = (self.num_experts, self.top_k);
        if self.bytes(e) <= budget {
            return Some(e);
        }
        let avail = budget.checked_sub(self.fixed + self.partial_extra)?;
        let n = match avail.checked_div(self.per_slot) {
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
            // No MoE layer: every n costs the same.
            None => usize::MAX,
        };
        let n = n.min(e.saturating_sub(1));
        (n >= k && self.bytes(n) <= budget).then_some(n)
    }
}

/// Device bytes the runtime allocates with `n` experts resident per layer: non-routed
/// weights, expert slots (plus top_k spares and the staging buffers below full
/// residency), KV cache and workspace. An upper bound of what the tracker will show.
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
    if let Some(n) = resident_experts {
        if n < k || n > e {
            return Err(Error::option(
                "--resident-experts",
                format!("{n} is outside the valid range {k}..={e} (top_k..=num_experts)"),
            ));
        }
    }
    if a.staging_buffers == 0 || a.staging_buffers > MAX_STAGING_BUFFERS {
        return Err(Error::option(
            "--staging-buffers",
            format!("{} is outside 1..={MAX_STAGING_BUFFERS}", a.staging_buffers),
        ));
    }
    let cost = AdmissionCost::new(cfg, a)?;
    let n = match (resident_experts, vram_budget) {
        (None, None) => e,
        (Some(n), None) => n,
        (None, Some(b)) => cost.most_within(b).ok_or_else(|| {
            Error::DoesNotFit(format!(
                "--vram-budget {}: even {k} experts per layer (top_k) need {}; non-expert weights, KV cache and workspace alone take {}",
                human(b),
                human(cost.bytes(k)),
                human(cost.fixed)
            ))
        })?,
        (Some(n), Some(b)) => {
            if cost.bytes(n) > b {
                return Err(Error::DoesNotFit(format!(
                    "{n} experts per layer need {}; the --vram-budget of {} fits {}",
                    human(cost.bytes(n)),
                    human(b),
                    cost.most_within(b)
                        .map_or("none (not even top_k)".to_string(), |m| m.to_string())
                )));
            }
            n
        }
    };
    if n < e && !a.int4 {
        return Err(Error::option(
            "--resident-experts",
            "partial residency needs --expert-precision int4",
        ));
    }
    Ok(n)
}

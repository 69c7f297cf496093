//! Admission control: the expert slots per layer, fixed before any allocation from the
//! same arithmetic the allocations follow (weights, expert slots with spares and staging,
//! the workspace table). A configuration outside the valid range, or over
//! `--vram-budget`, is refused with what would fit.

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::inspect::human;
use crate::model::tensors::{pad8, ExpertPool};
use crate::model::workspace::{workspace_bytes, WorkspaceShape};
use crate::quant::Q4SlotLayout;

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

/// Bytes of every non-routed weight as the device holds it (f16, rows padded to 8 halves;
/// biases f32), with the shared experts and dense MLPs in their slot layout, and the
/// per-layer expert->slot tables.
pub fn dense_gpu_bytes(cfg: &ModelConfig) -> u64 {
    let mut total = 0u64;
    for (name, shape) in crate::manifest::expected_tensors(cfg) {
        let n: u64 = match shape.as_slice() {
            [rows, cols] => *rows as u64 * pad8(*cols) as u64,
            other => pad8(other.iter().product::<usize>()) as u64,
        };
        total = total.saturating_add(n.saturating_mul(if name.ends_with(".bias") { 4 } else { 2 }));
    }
    let tables = cfg.num_sparse_layers() as u64 * (cfg.num_experts as u64 * 4).max(16).div_ceil(16) * 16;
    total.saturating_add(tables)
}

/// The bytes that do not depend on the resident expert count: non-routed weights and the
/// workspace.
pub fn fixed_bytes(cfg: &ModelConfig, a: &AdmissionInput) -> Result<u64> {
    let ws = workspace_bytes(
        cfg,
        &WorkspaceShape {
            max_context: a.max_context,
            chunk: crate::model::workspace::effective_chunk(cfg, a.max_context, a.prefill_chunk, None),
            all_logits: a.all_logits,
            expert_major: None,
        },
    )?;
    Ok(dense_gpu_bytes(cfg).saturating_add(ws))
}

/// Device bytes the runtime allocates with `n` experts resident per layer: the fixed
/// bytes, the expert slots (plus top_k spares and the staging buffers below full
/// residency). An upper bound of what the tracker will show.
pub fn admission_bytes(cfg: &ModelConfig, a: &AdmissionInput, n: usize) -> Result<u64> {
    Ok(fixed_bytes(cfg, a)?.saturating_add(expert_bytes(cfg, a, n)))
}

/// The part of `admission_bytes` that depends on `n`.
fn expert_bytes(cfg: &ModelConfig, a: &AdmissionInput, n: usize) -> u64 {
    let (e, k) = (cfg.num_experts, cfg.top_k);
    let slot = slot_bytes(cfg, a.int4);
    let sparse = cfg.num_sparse_layers() as u64;
    let partial = n < e;
    let spares = if partial { k } else { 0 };
    let staging = if partial { a.staging_buffers as u64 * slot } else { 0 };
    sparse
        .saturating_mul((n + spares) as u64)
        .saturating_mul(slot)
        .saturating_add(staging)
}

/// The most experts per layer `budget` holds (None when not even top_k fit), in closed
/// form: full residency, else the largest partial count.
pub fn max_resident(cfg: &ModelConfig, a: &AdmissionInput, budget: u64) -> Result<Option<usize>> {
    let (e, k) = (cfg.num_experts, cfg.top_k);
    let fixed = fixed_bytes(cfg, a)?;
    if fixed.saturating_add(expert_bytes(cfg, a, e)) <= budget {
        return Ok(Some(e));
    }
    let sparse = cfg.num_sparse_layers() as u64;
    let slot = slot_bytes(cfg, a.int4);
    let staging = a.staging_buffers as u64 * slot;
    let Some(room) = budget.checked_sub(fixed.saturating_add(staging)) else {
        return Ok(None);
    };
    // sparse * (n + k) * slot <= room
    let per_n = sparse.saturating_mul(slot).max(1);
    let n = (room / per_n).saturating_sub(k as u64).min(e.saturating_sub(1) as u64) as usize;
    Ok((n >= k).then_some(n))
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
    let n = match (resident_experts, vram_budget) {
        (None, Some(b)) => match max_resident(cfg, a, b)? {
            Some(n) => n,
            None => {
                return Err(Error::DoesNotFit(format!(
                    "--vram-budget {}: even {k} experts per layer (top_k) need {}; non-expert weights, KV cache and workspace alone take {}",
                    human(b),
                    human(admission_bytes(cfg, a, k)?),
                    human(fixed_bytes(cfg, a)?)
                )))
            }
        },
        (Some(n), Some(b)) if admission_bytes(cfg, a, n)? > b => {
            let fits = max_resident(cfg, a, b)?;
            return Err(Error::DoesNotFit(format!(
                "{n} experts per layer need {}; the --vram-budget of {} fits {}",
                human(admission_bytes(cfg, a, n)?),
                human(b),
                fits.map_or("none (not even top_k)".to_string(), |m| m.to_string())
            )));
        }
        (Some(n), _) => n,
        (None, None) => e,
    };
    if n < e && !a.int4 {
        return Err(Error::option(
            "--resident-experts",
            "partial residency needs --expert-precision int4",
        ));
    }
    Ok(n)
}

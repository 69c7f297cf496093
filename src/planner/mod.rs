//! `wgmoe plan`: what a model needs on a card, from its config.json alone. Every byte count
//! comes from the arithmetic the loader and admission control use (`manifest`'s tensors,
//! `admission`'s per-tensor bytes and closed-form cost, the workspace table, the INT4 slot
//! layout), so the plan is what a run allocates; the decode prediction is
//! `t_token = t_compute + bytes_not_resident / bandwidth` with measured or given bandwidths.

mod cluster;
mod text;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::backend::kernel::{KvFormat, WeightFormat};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::insight::inspect::{classify, TensorClass};
use crate::model::workspace::{kv_cache_bytes, planned_shape, workspace_bytes, WorkspaceShape};
use crate::residency::MissPolicy;
use crate::runtime::admission::{
    slot_bytes, tensor_gpu_bytes_in, tied_head_copy_bytes, AdmissionCost, AdmissionInput,
};

pub use cluster::{cluster_advice, ClusterAdvice, PrecisionNeed};
pub use text::render;

/// The verdict of a model neither the card nor the host RAM can hold.
pub const TOO_BIG: &str = "too big for one machine";

/// Bandwidths the prediction uses, and where they came from.
#[derive(Clone, Debug, Serialize)]
pub struct Bandwidths {
    pub device_read_gbps: f64,
    pub h2d_gbps: f64,
    /// The CPU expert kernel's packed-weight read rate (None: not measured, not given).
    pub cpu_expert_gbps: Option<f64>,
    /// One sync point (a submission and a mapped readback), seconds (None: not counted).
    pub round_trip_s: Option<f64>,
    /// e.g. "measured by `wgmoe devices --measure` on <adapter> (<file>)" or "--device-gbps".
    pub source: String,
    /// The adapter measured is a software one (lavapipe): its numbers are CPU numbers.
    pub software_adapter: bool,
}

/// What the plan is for.
#[derive(Clone, Debug)]
pub struct PlanOptions {
    /// Shown as the model in the report and in the command line printed at the end.
    pub model: String,
    /// The directory `wgmoe run` takes (`MODEL_DIR` when the config stands alone).
    pub model_dir: String,
    pub vram: u64,
    pub context: usize,
    pub prefill_chunk: usize,
    pub staging_buffers: usize,
    /// Host RAM, and where that figure came from; None: unknown (not checked).
    pub ram: Option<(u64, String)>,
    /// Memory of one GPU of a serving cluster (for a model too big for one machine).
    pub gpu_memory: u64,
    pub bandwidths: Option<Bandwidths>,
    /// Expert hit rate to predict with (e.g. from `wgmoe simulate`); None: uniform routing.
    pub hit_rate: Option<f64>,
    /// Where misses run (as `run --miss-policy`; auto is the runtime's default).
    pub miss_policy: MissPolicy,
    /// Prefetch slots per cached layer (`--prefetch-width`; 0: `--prefetch off`), and the
    /// measured share of routed experts the guesses held (from a trace), if known.
    pub prefetch_width: usize,
    pub prefetch_accuracy: Option<(f64, String)>,
    /// The dense weights' format (`--dense-precision`) and the KV cache's
    /// (`--kv-precision`).
    pub dense: WeightFormat,
    pub kv: KvFormat,
}

/// Bytes of one class of non-routed tensors as the device holds them.
#[derive(Clone, Debug, Serialize)]
pub struct Component {
    pub name: String,
    pub tensors: usize,
    pub parameters: u64,
    pub bytes: u64,
}

/// The decode-time prediction for one miss policy, with its terms.
#[derive(Clone, Debug, Serialize)]
pub struct Prediction {
    /// `upload` (misses copied to the card and computed there) or `cpu` (misses computed
    /// on the CPU from the host copy).
    pub miss_policy: MissPolicy,
    pub hit_rate: f64,
    pub hit_rate_source: String,
    /// Weights and KV cache a decode step reads on the device (with `cpu`, only the hits
    /// among the routed experts).
    pub bytes_read_per_token: u64,
    pub t_compute_s: f64,
    pub misses_per_token: f64,
    pub bytes_not_resident_per_token: f64,
    /// Host-to-device time of the misses (`upload`; 0 with `cpu`).
    pub t_transfer_s: f64,
    /// CPU time of the misses (`cpu`; 0 with `upload`), not overlapped with the device's.
    pub t_cpu_s: f64,
    /// Sync points a decode step waits for: the token's readback, and below full residency
    /// one routing readback per MoE layer.
    pub sync_points_per_token: usize,
    /// sync points x the measured round trip (0 when no round trip is known).
    pub t_sync_s: f64,
    /// `--prefetch next-layer` with a measured accuracy (`upload`): the transfer time of
    /// the guessed misses, copied while the device computes, as far as the compute time
    /// (less the link time of the wrong guesses) covers it; and the bytes of the wrong
    /// guesses per token.
    pub t_prefetch_hidden_s: f64,
    pub prefetch_wasted_bytes_per_token: f64,
    pub t_token_s: f64,
    pub tokens_per_s: f64,
}

/// The whole plan (`--json` prints it; field names are stable).
#[derive(Clone, Debug, Serialize)]
pub struct PlanReport {
    pub model: String,
    pub model_type: String,
    pub num_layers: usize,
    pub moe_layers: usize,
    pub num_experts: usize,
    pub top_k: usize,
    pub parameters: u64,
    pub routed_parameters: u64,
    /// Storage of the dense weights (`--dense-precision`: "f16" or "q8_0") and of the KV
    /// cache ("f32" or "f16", `--kv-precision`).
    pub dense_precision: String,
    pub kv_precision: String,
    /// How the routed experts are held, in words: "INT4" (wgmoe's block 256), or a GGUF file's
    /// block types by layer count (`gate/up q4_K, down q6_K on 24 layers; ...`).
    pub expert_storage: String,
    /// A GGUF file's dense matrices held in their own block types (by type, with counts);
    /// empty for a safetensors checkpoint.
    pub gguf_dense_storage: String,
    /// Bytes a decode step reads at batch 1 at `context` positions: the non-routed
    /// weights (one row of the embedding table), top_k experts per MoE layer, the KV cache.
    pub bytes_per_token: u64,
    pub components: Vec<Component>,
    pub non_routed_bytes: u64,
    pub expert_bytes: u64,
    pub expert_bytes_f16: u64,
    pub routed_expert_bytes: u64,
    pub routed_expert_bytes_f16: u64,
    pub context: usize,
    pub prefill_chunk: usize,
    pub kv_cache_bytes: u64,
    pub kv_cache_bytes_per_position: u64,
    pub workspace_bytes: u64,
    /// Where misses run in this plan (`--miss-policy`, default auto as in `run`).
    pub miss_policy: MissPolicy,
    /// With CPU experts (cpu, auto): their sum buffer and the wider routing readback.
    pub host_experts_bytes: u64,
    /// Per MoE layer at the planned residency, below full residency: the unpublished
    /// slots uploads land in (top_k with upload, min(top_k, resident) otherwise).
    pub spare_slots_per_layer: usize,
    /// `--prefetch` in this plan (next-layer unless cpu), its width, the prefetch slots
    /// per MoE layer below full residency (beside the spares), and the share of routed
    /// experts the guesses held in the trace given (`--prefetch-trace`), with its source.
    pub prefetch: crate::residency::Prefetch,
    pub prefetch_width: usize,
    pub prefetch_slots_per_layer: usize,
    pub prefetch_accuracy: Option<f64>,
    pub prefetch_accuracy_source: Option<String>,
    /// Below full residency with prefetch on: the bytes one more resident expert per layer
    /// would need (its prefetch slots included), and the residency `--prefetch off` would
    /// give where it is higher (the prefetch slots are what block it).
    pub next_resident_bytes: Option<u64>,
    pub resident_experts_without_prefetch: Option<usize>,
    pub staging_buffers: usize,
    pub staging_bytes: u64,
    /// Bytes that must be on the card at any residency: non-routed weights, KV cache and
    /// workspace; with upload also top_k expert slots and top_k spares per MoE layer and
    /// the staging buffers (cpu and auto: the CPU experts' buffers, no expert at all).
    pub hot_bytes: u64,
    /// The fewest resident experts per layer of the policy (top_k with upload, else 0).
    pub min_resident_experts: usize,
    /// Bytes with every expert resident (no spares, no staging).
    pub all_resident_bytes: u64,
    /// Each further resident expert per layer.
    pub bytes_per_resident_expert: u64,
    pub vram_bytes: u64,
    /// The most experts per layer the VRAM holds (min_resident_experts..=num_experts);
    /// null: not even the minimum.
    pub resident_experts_per_layer: Option<usize>,
    /// The same with every miss uploaded (`--miss-policy upload`), for comparison.
    pub resident_experts_per_layer_upload: Option<usize>,
    /// GPU bytes at that residency.
    pub gpu_bytes: Option<u64>,
    /// Host RAM holding every expert as INT4 below full residency (0 at full residency).
    pub host_source_bytes: u64,
    pub ram_bytes: Option<u64>,
    pub ram_source: Option<String>,
    pub fits: bool,
    /// "all experts resident", "partial residency", "every routed expert on the CPU",
    /// "does not fit the card" or "too big for one machine" (the card holds only part of
    /// the experts and the host RAM cannot hold the host source, every routed expert as
    /// INT4: the only part that must stay in RAM while running).
    pub verdict: String,
    /// One GPU of `--gpu-memory` holds every expert (then RAM is not needed for them).
    pub one_gpu_holds: bool,
    pub bandwidths: Option<Bandwidths>,
    pub predictions: Vec<Prediction>,
    pub predicted_decode_tokens_per_s: Option<f64>,
    /// The `wgmoe run` command line of the plan.
    pub command: Option<String>,
    pub cluster: Option<ClusterAdvice>,
}

fn class_name(c: TensorClass) -> String {
    serde_json::to_value(c)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

fn count(what: &str) -> Error {
    Error::DoesNotFit(format!("{what}: the byte count overflows 64 bits"))
}

/// Per class, the non-routed tensors the config implies as the device holds them, plus
/// the expert->slot tables; and the parameter counts (non-routed, routed).
fn components(cfg: &ModelConfig, dense: WeightFormat) -> Result<(Vec<Component>, u64, u64)> {
    let mut by: BTreeMap<TensorClass, Component> = BTreeMap::new();
    let mut params: u128 = 0;
    for (name, shape) in crate::format::manifest::expected_tensors(cfg) {
        let class = classify(&name);
        let c = by.entry(class).or_insert_with(|| Component {
            name: class_name(class),
            tensors: 0,
            parameters: 0,
            bytes: 0,
        });
        let n: u128 = shape.iter().map(|&d| d as u128).product();
        params += n;
        c.tensors += 1;
        c.parameters = u64::try_from(c.parameters as u128 + n).map_err(|_| count("parameters"))?;
        c.bytes = u64::try_from(c.bytes as u128 + tensor_gpu_bytes_in(cfg, dense, &name, &shape))
            .map_err(|_| count(&name))?;
    }
    let copy = tied_head_copy_bytes(cfg, dense);
    if copy > 0 {
        // The Q8_0 lm_head of tied embeddings: no tensor of its own in the checkpoint.
        let c = by.entry(TensorClass::LmHead).or_insert_with(|| Component {
            name: class_name(TensorClass::LmHead),
            tensors: 0,
            parameters: 0,
            bytes: 0,
        });
        c.bytes = u64::try_from(c.bytes as u128 + copy).map_err(|_| count("lm_head"))?;
    }
    // In the order a token meets them.
    let order = [
        TensorClass::Embeddings,
        TensorClass::Attention,
        TensorClass::Norms,
        TensorClass::Router,
        TensorClass::SharedExperts,
        TensorClass::DenseMlp,
        TensorClass::LmHead,
        TensorClass::RoutedExperts,
        TensorClass::Other,
    ];
    let mut out: Vec<Component> = order.iter().filter_map(|c| by.remove(c)).collect();
    out.push(Component {
        name: "expert_slot_tables".into(),
        tensors: cfg.num_sparse_layers(),
        parameters: 0,
        bytes: u64::try_from(crate::runtime::admission::slot_table_bytes(cfg))
            .map_err(|_| count("slot tables"))?,
    });
    let routed = 3u128
        * cfg.hidden_size as u128
        * cfg.moe_intermediate as u128
        * cfg.num_experts as u128
        * cfg.num_sparse_layers() as u128;
    let p = u64::try_from(params).map_err(|_| count("parameters"))?;
    let r = u64::try_from(routed).map_err(|_| count("routed parameters"))?;
    Ok((out, p, r))
}

/// The plan of `cfg` under `o`.
pub fn plan(cfg: &ModelConfig, o: &PlanOptions) -> Result<PlanReport> {
    if o.context == 0 || o.context > cfg.max_position_embeddings {
        return Err(Error::option(
            "--ctx-size",
            format!(
                "{} positions: must be in 1..={} (max_position_embeddings)",
                o.context, cfg.max_position_embeddings
            ),
        ));
    }
    if o.prefill_chunk == 0 {
        return Err(Error::option("--prefill-chunk", "must be at least 1"));
    }
    if let Some(h) = o.hit_rate {
        if !(0.0..=1.0).contains(&h) {
            return Err(Error::option("--hit-rate", format!("{h} is not in [0, 1]")));
        }
    }
    if o.staging_buffers == 0 || o.staging_buffers > crate::runtime::admission::MAX_STAGING_BUFFERS
    {
        return Err(Error::option(
            "--staging-buffers",
            format!(
                "{} is outside 1..={}",
                o.staging_buffers,
                crate::runtime::admission::MAX_STAGING_BUFFERS
            ),
        ));
    }
    let admission_with = |miss: MissPolicy, prefetch_width: usize| {
        let input = AdmissionInput {
            int4: true,
            dense: o.dense,
            kv: o.kv,
            max_context: o.context,
            prefill_chunk: o.prefill_chunk,
            all_logits: false,
            score_rows: 0,
            batch: 1,
            staging_buffers: o.staging_buffers,
            miss,
            cpu_layers: 0,
            prefetch_width: if miss == MissPolicy::Cpu {
                0
            } else {
                prefetch_width
            },
        };
        AdmissionCost::new(cfg, &input).map_err(|e| Error::option("--ctx-size", e.to_string()))
    };
    let admission = |miss: MissPolicy| admission_with(miss, o.prefetch_width);
    let cost = admission(o.miss_policy)?;
    let upload = admission(MissPolicy::Upload)?;
    let no_prefetch = admission_with(o.miss_policy, 0)?;
    let shape = WorkspaceShape {
        kv: o.kv,
        ..planned_shape(cfg, o.context, o.prefill_chunk, false, false)
    };
    let ws_all = workspace_bytes(cfg, &shape)?;
    let kv = kv_cache_bytes(cfg, &shape)?;
    let (components, dense_params, routed_params) = components(cfg, o.dense)?;
    let non_routed: u64 = components.iter().map(|c| c.bytes).sum();
    let (e, k, moe) = (cfg.num_experts, cfg.top_k, cfg.num_sparse_layers());
    let expert = slot_bytes(cfg, true);
    let expert_read = crate::runtime::admission::expert_read_bytes(cfg, true);
    let expert_f16 = slot_bytes(cfg, false);
    let per_slot = cost.device_layers * cost.slot;
    let routed = per_slot
        .checked_mul(e as u64)
        .ok_or_else(|| count("routed experts"))?;
    let routed_f16 = (moe as u64)
        .checked_mul(e as u64)
        .and_then(|x| x.checked_mul(expert_f16))
        .ok_or_else(|| count("routed experts (f16)"))?;
    let staging = o.staging_buffers as u64 * expert;
    let lo = cost.min_experts().min(e);
    let hot = cost.bytes(lo);
    let n = cost.most_within(o.vram);
    let host_source = match n {
        Some(n) if n < e => routed,
        _ => 0,
    };
    let weights_int4 = non_routed.saturating_add(routed);
    let ram = o.ram.as_ref().map(|r| r.0);
    // RAM holds what stays on the host while the model runs: the host source below full
    // residency (loading streams every weight from the memory-mapped files, so at full
    // residency the model need not fit in RAM). Too big for this machine: the card holds
    // only part of the experts and RAM cannot hold the rest's source.
    let too_big = match n {
        Some(n) if n == e => false,
        _ => ram.is_some_and(|r| routed > r),
    };
    let fits = n.is_some() && !too_big;
    let verdict = if too_big {
        TOO_BIG
    } else {
        match n {
            None => "does not fit the card",
            Some(n) if n == e => "all experts resident",
            Some(0) => "every routed expert on the CPU",
            Some(_) => "partial residency",
        }
    };
    let kv_per_pos = kv / o.context.max(1) as u64;
    let mut predictions = Vec::new();
    if let (Some(bw), Some(n), false) = (&o.bandwidths, n, too_big) {
        let ways: &[MissPolicy] = match o.miss_policy {
            _ if n == e => &[MissPolicy::Upload],
            MissPolicy::Upload => &[MissPolicy::Upload],
            MissPolicy::Cpu => &[MissPolicy::Cpu],
            MissPolicy::Auto => &[MissPolicy::Upload, MissPolicy::Cpu],
        };
        for &w in ways {
            if let Some(p) = predict(cfg, o, bw, &components, kv, (expert, expert_read), n, w)? {
                predictions.push(p);
            }
        }
    }
    // Auto serves each miss the cheaper way: the faster prediction is its own.
    let best = predictions
        .iter()
        .map(|p| p.tokens_per_s)
        .max_by(f64::total_cmp);
    let policy_flag = match o.miss_policy {
        MissPolicy::Auto => String::new(),
        m => format!(" --miss-policy {}", m.name()),
    };
    let command = match (n, too_big) {
        (Some(n), false) if n == e => Some(format!("wgmoe run {}", o.model_dir)),
        (Some(n), false) => Some(format!(
            "wgmoe run {}{policy_flag} --resident-experts {n}",
            o.model_dir
        )),
        _ => None,
    };
    let planned = n.unwrap_or(lo);
    Ok(PlanReport {
        model: o.model.clone(),
        model_type: cfg.arch.model_type().to_string(),
        num_layers: cfg.num_layers,
        moe_layers: moe,
        num_experts: e,
        top_k: k,
        parameters: dense_params.saturating_add(routed_params),
        routed_parameters: routed_params,
        dense_precision: o.dense.name().to_string(),
        expert_storage: expert_storage(cfg),
        gguf_dense_storage: gguf_dense_storage(cfg),
        kv_precision: o.kv.name().to_string(),
        bytes_per_token: bytes_read_per_token(cfg, &components, kv, expert_read),
        components,
        non_routed_bytes: non_routed,
        expert_bytes: expert,
        expert_bytes_f16: expert_f16,
        routed_expert_bytes: routed,
        routed_expert_bytes_f16: routed_f16,
        context: o.context,
        prefill_chunk: shape.chunk,
        kv_cache_bytes: kv,
        kv_cache_bytes_per_position: kv_per_pos,
        workspace_bytes: ws_all - kv,
        miss_policy: o.miss_policy,
        host_experts_bytes: if o.miss_policy == MissPolicy::Upload {
            0
        } else {
            cost.host_extra
        },
        spare_slots_per_layer: if planned < e {
            (cost.slots(planned) as usize).saturating_sub(planned + cost.prefetch as usize)
        } else {
            0
        },
        prefetch: if cost.prefetch > 0 {
            crate::residency::Prefetch::NextLayer
        } else {
            crate::residency::Prefetch::Off
        },
        prefetch_width: cost.prefetch as usize,
        prefetch_slots_per_layer: if planned < e && planned > 0 {
            cost.prefetch as usize
        } else {
            0
        },
        prefetch_accuracy: o.prefetch_accuracy.as_ref().map(|a| a.0),
        prefetch_accuracy_source: o.prefetch_accuracy.as_ref().map(|a| a.1.clone()),
        next_resident_bytes: match n {
            Some(n) if n < e && cost.prefetch > 0 => Some(cost.bytes(n + 1)),
            _ => None,
        },
        resident_experts_without_prefetch: match n {
            Some(n) if n < e && cost.prefetch > 0 => {
                no_prefetch.most_within(o.vram).filter(|&m| m > n)
            }
            None if cost.prefetch > 0 => no_prefetch.most_within(o.vram),
            _ => None,
        },
        staging_buffers: o.staging_buffers,
        staging_bytes: staging,
        hot_bytes: hot,
        min_resident_experts: lo,
        all_resident_bytes: cost.bytes(e),
        bytes_per_resident_expert: per_slot,
        vram_bytes: o.vram,
        resident_experts_per_layer: n,
        resident_experts_per_layer_upload: upload.most_within(o.vram),
        gpu_bytes: n.map(|n| cost.bytes(n)),
        host_source_bytes: host_source,
        ram_bytes: ram,
        ram_source: o.ram.as_ref().map(|r| r.1.clone()),
        fits,
        verdict: verdict.to_string(),
        bandwidths: o.bandwidths.clone(),
        predicted_decode_tokens_per_s: best,
        predictions,
        command,
        // Serving across GPUs only for a model one GPU of --gpu-memory cannot hold.
        one_gpu_holds: cost.most_within(o.gpu_memory) == Some(e),
        cluster: (too_big && cost.most_within(o.gpu_memory) != Some(e))
            .then(|| cluster_advice(dense_params, routed_params, weights_int4, o.gpu_memory)),
    })
}

/// Bytes a decode step reads at batch 1 with `positions` tokens in the KV cache, dense
/// weights in `dense` and routed experts INT4 (`int4`) or f16: `run --json`'s
/// `bytes_per_token`, the same arithmetic as the plan's.
pub fn decode_bytes_per_token(
    cfg: &ModelConfig,
    dense: WeightFormat,
    int4: bool,
    kv: KvFormat,
    positions: usize,
) -> Result<u64> {
    let (components, _, _) = components(cfg, dense)?;
    let shape = WorkspaceShape {
        kv,
        ..planned_shape(cfg, positions.max(1), 1, false, false)
    };
    let kv = kv_cache_bytes(cfg, &shape)?;
    Ok(bytes_read_per_token(
        cfg,
        &components,
        kv,
        crate::runtime::admission::expert_read_bytes(cfg, int4),
    ))
}

/// Bytes a decode step reads on the device: every non-routed weight but the embedding
/// table (one row of it, unless it is also the lm_head), top_k experts per MoE layer
/// (`expert`: the bytes the kernels read of one, averaged over the layers), and the KV
/// cache at the last position of the context.
pub fn bytes_read_per_token(
    cfg: &ModelConfig,
    components: &[Component],
    kv: u64,
    expert: f64,
) -> u64 {
    let embed = components
        .iter()
        .find(|c| c.name == class_name(TensorClass::Embeddings))
        .map_or(0, |c| c.bytes);
    let non_routed: u64 = components.iter().map(|c| c.bytes).sum();
    // Tied embeddings without a copy of their own: the head reads the whole table.
    let head_copy = components
        .iter()
        .any(|c| c.name == class_name(TensorClass::LmHead) && c.bytes > 0);
    let dense = if cfg.tie_word_embeddings && !head_copy {
        non_routed
    } else {
        non_routed - embed + crate::model::tensors::F16Matrix::row_bytes(cfg.hidden_size)
    };
    let experts = ((cfg.num_sparse_layers() * cfg.top_k) as f64 * expert).round() as u64;
    dense.saturating_add(experts).saturating_add(kv)
}

/// The prediction with `n` experts resident per layer, misses served `way` (upload or
/// cpu); None for cpu without a CPU bandwidth. `expert`: the bytes an upload copies of one
/// expert (its slot) and the bytes a kernel reads of it.
#[allow(clippy::too_many_arguments)]
fn predict(
    cfg: &ModelConfig,
    o: &PlanOptions,
    bw: &Bandwidths,
    components: &[Component],
    kv: u64,
    (expert, expert_read): (u64, f64),
    n: usize,
    way: MissPolicy,
) -> Result<Option<Prediction>> {
    let e = cfg.num_experts;
    let (hit_rate, hit_rate_source) = match o.hit_rate {
        _ if n == e => (1.0, "every expert resident".to_string()),
        Some(h) => (h, "--hit-rate".to_string()),
        None => (
            n as f64 / e as f64,
            format!("uniform routing: {n}/{e} resident (the worst case for a cache)"),
        ),
    };
    let pairs = (cfg.num_sparse_layers() * cfg.top_k) as f64;
    let misses = pairs * (1.0 - hit_rate);
    let not_resident = misses * expert_read;
    let gb = 1e9;
    let all = bytes_read_per_token(cfg, components, kv, expert_read);
    let (read, t_transfer, t_cpu) = match way {
        MissPolicy::Cpu => {
            let Some(cpu) = bw.cpu_expert_gbps else {
                return Ok(None);
            };
            // The device reads only the hits; the CPU reads the misses once each.
            let read = all.saturating_sub(not_resident.round() as u64);
            (read, 0.0, not_resident / (cpu * gb))
        }
        // An upload copies the whole slot.
        _ => (all, misses * expert as f64 / (bw.h2d_gbps * gb), 0.0),
    };
    let t_compute = read as f64 / (bw.device_read_gbps * gb);
    let syncs = if n < e {
        cfg.num_sparse_layers() + 1
    } else {
        1
    };
    let t_sync = bw.round_trip_s.map_or(0.0, |r| syncs as f64 * r);
    // Prefetch (uploads below full residency): the guessed share of the misses is copied
    // while the device computes; the wrong guesses (width - accuracy x top_k experts of
    // each layer, non-resident at the miss rate) take link time from that window.
    let (hidden, wasted) = match (o.prefetch_accuracy.as_ref(), way, n < e) {
        (Some((acc, _)), MissPolicy::Upload | MissPolicy::Auto, true) if o.prefetch_width > 0 => {
            let layers = cfg.num_sparse_layers() as f64;
            let miss = 1.0 - hit_rate;
            let wrong = (o.prefetch_width as f64 - acc * cfg.top_k as f64).max(0.0);
            let wasted = layers * wrong * miss * expert as f64;
            let window = (t_compute - wasted / (bw.h2d_gbps * gb)).max(0.0);
            ((acc * t_transfer).min(window), wasted)
        }
        _ => (0.0, 0.0),
    };
    let t_token = t_compute + t_transfer - hidden + t_cpu + t_sync;
    Ok(Some(Prediction {
        miss_policy: way,
        hit_rate,
        hit_rate_source,
        bytes_read_per_token: read,
        t_compute_s: t_compute,
        misses_per_token: misses,
        bytes_not_resident_per_token: not_resident,
        t_transfer_s: t_transfer,
        t_cpu_s: t_cpu,
        sync_points_per_token: syncs,
        t_sync_s: t_sync,
        t_prefetch_hidden_s: hidden,
        prefetch_wasted_bytes_per_token: wasted,
        t_token_s: t_token,
        tokens_per_s: if t_token > 0.0 { 1.0 / t_token } else { 0.0 },
    }))
}

/// `12,884,901,888`: exact byte counts, readable.
pub fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The routed experts' storage in words (issue 39: a GGUF file's experts are not "INT4").
fn expert_storage(cfg: &ModelConfig) -> String {
    if cfg.expert_kinds.is_empty() {
        return "INT4".to_string();
    }
    let mut by_kinds: Vec<((&str, &str), usize)> = Vec::new();
    for k in &cfg.expert_kinds {
        let key = (k.gate_up.name(), k.down.name());
        match by_kinds.iter_mut().find(|(x, _)| *x == key) {
            Some((_, n)) => *n += 1,
            None => by_kinds.push((key, 1)),
        }
    }
    let parts: Vec<String> = by_kinds
        .iter()
        .map(|((g, d), n)| {
            format!(
                "gate/up {g}, down {d} on {}",
                crate::units::count(*n, "layer")
            )
        })
        .collect();
    format!("as the GGUF file's blocks: {}", parts.join("; "))
}

/// A GGUF file's dense matrices held in their own block types: `q4_K x97, q6_K x48`.
fn gguf_dense_storage(cfg: &ModelConfig) -> String {
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for (_, k) in &cfg.gguf_dense_kinds {
        *counts.entry(k.name()).or_default() += 1;
    }
    counts
        .iter()
        .map(|(k, n)| format!("{k} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

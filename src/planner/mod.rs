//! `wgmoe plan`: what a model needs on a card, from its config.json alone. Every byte count
//! comes from the arithmetic the loader and admission control use (`manifest`'s tensors,
//! `admission`'s per-tensor bytes and closed-form cost, the workspace table, the INT4 slot
//! layout), so the plan is what a run allocates; the decode prediction is
//! `t_token = t_compute + bytes_not_resident / bandwidth` with measured or given bandwidths.

mod cluster;
mod text;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::admission::{slot_bytes, tensor_gpu_bytes, AdmissionCost, AdmissionInput};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::inspect::{classify, TensorClass};
use crate::model::workspace::{kv_cache_bytes, planned_shape, workspace_bytes};

pub use cluster::{cluster_advice, ClusterAdvice, PrecisionNeed};
pub use text::render;

/// Bandwidths the prediction uses, and where they came from.
#[derive(Clone, Debug, Serialize)]
pub struct Bandwidths {
    pub device_read_gbps: f64,
    pub h2d_gbps: f64,
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
}

/// Bytes of one class of non-routed tensors as the device holds them.
#[derive(Clone, Debug, Serialize)]
pub struct Component {
    pub name: String,
    pub tensors: usize,
    pub parameters: u64,
    pub bytes: u64,
}

/// How misses are served. Only uploads exist today; a CPU-computed miss policy would add a
/// variant (and a prediction line) here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MissPolicy {
    /// Copy the missed expert from host RAM into a spare slot, then compute on the GPU.
    Upload,
}

impl MissPolicy {
    pub fn describe(self) -> &'static str {
        match self {
            MissPolicy::Upload => "misses uploaded from host RAM, computed on the GPU",
        }
    }
}

/// The decode-time prediction for one miss policy, with its terms.
#[derive(Clone, Debug, Serialize)]
pub struct Prediction {
    pub miss_policy: MissPolicy,
    pub hit_rate: f64,
    pub hit_rate_source: String,
    /// Weights and KV cache a decode step reads on the device.
    pub bytes_read_per_token: u64,
    pub t_compute_s: f64,
    pub misses_per_token: f64,
    pub bytes_not_resident_per_token: f64,
    pub t_transfer_s: f64,
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
    /// Per MoE layer, below full residency: top_k unpublished slots uploads land in.
    pub spare_slots_per_layer: usize,
    pub staging_buffers: usize,
    pub staging_bytes: u64,
    /// Bytes that must be on the card at any residency: non-routed weights, KV cache,
    /// workspace, top_k expert slots and top_k spares per MoE layer, staging buffers.
    pub hot_bytes: u64,
    /// Bytes with every expert resident (no spares, no staging).
    pub all_resident_bytes: u64,
    /// Each further resident expert per layer.
    pub bytes_per_resident_expert: u64,
    pub vram_bytes: u64,
    /// The most experts per layer the VRAM holds (top_k..=num_experts); null: not even top_k.
    pub resident_experts_per_layer: Option<usize>,
    /// GPU bytes at that residency.
    pub gpu_bytes: Option<u64>,
    /// Host RAM holding every expert as INT4 below full residency (0 at full residency).
    pub host_source_bytes: u64,
    pub ram_bytes: Option<u64>,
    pub ram_source: Option<String>,
    pub fits: bool,
    /// "all experts resident", "partial residency", "does not fit the card" or
    /// "too big for one machine" (the INT4 weights exceed the host RAM; the host source,
    /// the only part that must stay in RAM, is the routed experts, so RAM is checked there).
    pub verdict: String,
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
fn components(cfg: &ModelConfig) -> Result<(Vec<Component>, u64, u64)> {
    let mut by: BTreeMap<TensorClass, Component> = BTreeMap::new();
    let mut params: u128 = 0;
    for (name, shape) in crate::manifest::expected_tensors(cfg) {
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
        c.bytes = u64::try_from(c.bytes as u128 + tensor_gpu_bytes(&name, &shape))
            .map_err(|_| count(&name))?;
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
        bytes: u64::try_from(crate::admission::slot_table_bytes(cfg))
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
            "--context",
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
    let input = AdmissionInput {
        int4: true,
        max_context: o.context,
        prefill_chunk: o.prefill_chunk,
        all_logits: false,
        staging_buffers: o.staging_buffers,
    };
    if o.staging_buffers == 0 || o.staging_buffers > crate::admission::MAX_STAGING_BUFFERS {
        return Err(Error::option(
            "--staging-buffers",
            format!(
                "{} is outside 1..={}",
                o.staging_buffers,
                crate::admission::MAX_STAGING_BUFFERS
            ),
        ));
    }
    let cost =
        AdmissionCost::new(cfg, &input).map_err(|e| Error::option("--context", e.to_string()))?;
    let shape = planned_shape(cfg, o.context, o.prefill_chunk, false);
    let ws_all = workspace_bytes(cfg, &shape)?;
    let kv = kv_cache_bytes(cfg, &shape)?;
    let (components, dense_params, routed_params) = components(cfg)?;
    let non_routed: u64 = components.iter().map(|c| c.bytes).sum();
    let (e, k, moe) = (cfg.num_experts, cfg.top_k, cfg.num_sparse_layers());
    let expert = slot_bytes(cfg, true);
    let expert_f16 = slot_bytes(cfg, false);
    let routed = cost
        .per_slot
        .checked_mul(e as u64)
        .ok_or_else(|| count("routed experts"))?;
    let routed_f16 = (moe as u64)
        .checked_mul(e as u64)
        .and_then(|x| x.checked_mul(expert_f16))
        .ok_or_else(|| count("routed experts (f16)"))?;
    let staging = o.staging_buffers as u64 * expert;
    let hot = if k < e { cost.bytes(k) } else { cost.bytes(e) };
    let n = cost.most_within(o.vram);
    let host_source = match n {
        Some(n) if n < e => routed,
        _ => 0,
    };
    let weights_int4 = non_routed.saturating_add(routed);
    let ram = o.ram.as_ref().map(|r| r.0);
    let too_big = ram.is_some_and(|r| weights_int4 > r);
    let fits = n.is_some() && ram.is_none_or(|r| host_source <= r);
    let verdict = if too_big {
        "too big for one machine"
    } else {
        match n {
            None => "does not fit the card",
            Some(n) if n == e => "all experts resident",
            Some(_) => "partial residency",
        }
    };
    let kv_per_pos = kv / o.context.max(1) as u64;
    let mut predictions = Vec::new();
    if let (Some(bw), Some(n), false) = (&o.bandwidths, n, too_big) {
        predictions.push(predict(cfg, o, bw, &components, kv, expert, n)?);
    }
    let command = match (n, too_big) {
        (Some(n), false) if n == e => Some(format!("wgmoe run {}", o.model_dir)),
        (Some(n), false) => Some(format!("wgmoe run {} --resident-experts {n}", o.model_dir)),
        _ => None,
    };
    Ok(PlanReport {
        model: o.model.clone(),
        model_type: cfg.arch.model_type().to_string(),
        num_layers: cfg.num_layers,
        moe_layers: moe,
        num_experts: e,
        top_k: k,
        parameters: dense_params.saturating_add(routed_params),
        routed_parameters: routed_params,
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
        spare_slots_per_layer: if k < e { k } else { 0 },
        staging_buffers: o.staging_buffers,
        staging_bytes: staging,
        hot_bytes: hot,
        all_resident_bytes: cost.bytes(e),
        bytes_per_resident_expert: cost.per_slot,
        vram_bytes: o.vram,
        resident_experts_per_layer: n,
        gpu_bytes: n.map(|n| cost.bytes(n)),
        host_source_bytes: host_source,
        ram_bytes: ram,
        ram_source: o.ram.as_ref().map(|r| r.1.clone()),
        fits: fits && !too_big,
        verdict: verdict.to_string(),
        bandwidths: o.bandwidths.clone(),
        predicted_decode_tokens_per_s: predictions.first().map(|p| p.tokens_per_s),
        predictions,
        command,
        cluster: too_big
            .then(|| cluster_advice(dense_params, routed_params, weights_int4, o.gpu_memory)),
    })
}

/// Bytes a decode step reads on the device: every non-routed weight but the embedding
/// table (one row of it, unless it is also the lm_head), top_k experts per MoE layer, and
/// the KV cache at the last position of the context.
pub fn bytes_read_per_token(
    cfg: &ModelConfig,
    components: &[Component],
    kv: u64,
    expert: u64,
) -> u64 {
    let embed = components
        .iter()
        .find(|c| c.name == class_name(TensorClass::Embeddings))
        .map_or(0, |c| c.bytes);
    let non_routed: u64 = components.iter().map(|c| c.bytes).sum();
    let dense = if cfg.tie_word_embeddings {
        non_routed
    } else {
        non_routed - embed + crate::model::tensors::F16Matrix::row_bytes(cfg.hidden_size)
    };
    let experts = (cfg.num_sparse_layers() * cfg.top_k) as u64 * expert;
    dense.saturating_add(experts).saturating_add(kv)
}

fn predict(
    cfg: &ModelConfig,
    o: &PlanOptions,
    bw: &Bandwidths,
    components: &[Component],
    kv: u64,
    expert: u64,
    n: usize,
) -> Result<Prediction> {
    let e = cfg.num_experts;
    let (hit_rate, hit_rate_source) = match o.hit_rate {
        _ if n == e => (1.0, "every expert resident".to_string()),
        Some(h) => (h, "--hit-rate".to_string()),
        None => (
            n as f64 / e as f64,
            format!("uniform routing: {n}/{e} resident (the worst case for a cache)"),
        ),
    };
    let read = bytes_read_per_token(cfg, components, kv, expert);
    let gb = 1e9;
    let t_compute = read as f64 / (bw.device_read_gbps * gb);
    let misses = (cfg.num_sparse_layers() * cfg.top_k) as f64 * (1.0 - hit_rate);
    let not_resident = misses * expert as f64;
    let t_transfer = not_resident / (bw.h2d_gbps * gb);
    let t_token = t_compute + t_transfer;
    Ok(Prediction {
        miss_policy: MissPolicy::Upload,
        hit_rate,
        hit_rate_source,
        bytes_read_per_token: read,
        t_compute_s: t_compute,
        misses_per_token: misses,
        bytes_not_resident_per_token: not_resident,
        t_transfer_s: t_transfer,
        t_token_s: t_token,
        tokens_per_s: if t_token > 0.0 { 1.0 / t_token } else { 0.0 },
    })
}

/// `12,884,901,888`: exact byte counts, readable.
pub fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

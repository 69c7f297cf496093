//! `wgmoe kernels`: which kernel the plan picks for each stage of a model on a device
//! class, and how each one touches memory, measured from the kernels themselves.
//!
//! The model's real programs (the forward pass's own op builders) are built for a shape
//! model of the config (every weight zero, one layer of each kind) under the kernel plan
//! of the device class, and run one dispatch at a time on a probe build of the WGSL
//! kernels (`backend::probe`): at every global load, lavapipe's 32-lane subgroups count
//! the distinct 32-byte sectors touched and the bytes used. So the bytes read, the sector
//! efficiency and the grids are what the kernels do, not what they are believed to do.
//! Decode runs one token at the last position of the context; prefill one chunk from
//! position 0. The CPU time to record and submit a whole decode step of the real layer
//! count is measured on a second (plain) device.

use crate::backend::probe::{Counts, ProbedOp, Site};
use crate::backend::Device;
use crate::backend::{
    DeviceInfo, DeviceRequest, DeviceType, KernelOverrides, KernelPlan, Prepared, Work,
};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::model::forward::{Forward, ForwardOptions};
use crate::model::weights::ModelWeights;
use crate::model::Executor;

/// The class of device whose kernel plan is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceClass {
    /// A discrete GPU (subgroups of 32, f16).
    Discrete,
    /// An integrated GPU (subgroups of 32, f16).
    Integrated,
    /// A CPU adapter (lavapipe itself).
    Cpu,
}

/// Which steps `wgmoe kernels` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stages {
    Decode,
    Prefill,
    All,
}

pub struct KernelsOptions {
    pub class: DeviceClass,
    pub stages: Stages,
    pub context: usize,
    pub prefill_chunk: usize,
    /// GB/s of device memory the predicted times assume.
    pub bandwidth_gbps: f64,
    pub overrides: KernelOverrides,
    /// INT4 experts (false: f16).
    pub int4: bool,
    /// The dense weights' format (f16 or Q8_0).
    pub dense: crate::backend::kernel::WeightFormat,
    /// What a step costs beyond its bytes.
    pub latency: LatencyModel,
    /// The KV cache's storage (`--kv-precision`; f16 by default, as `run`'s).
    pub kv: crate::backend::kernel::KvFormat,
}

/// The latency side of the prediction: a dispatch takes at least `dispatch_latency_s`
/// (launch, barrier and ramp-up of a link of the chain, `devices --measure`'s figure),
/// and a step at pipeline depth 1 also waits for its token's round trip and its own
/// recording; deeper, recording overlaps the device and a step costs the larger of the two.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct LatencyModel {
    pub dispatch_latency_s: f64,
    pub round_trip_s: f64,
    pub pipeline_depth: usize,
}

impl LatencyModel {
    /// No latency: bytes over bandwidth alone.
    pub const NONE: LatencyModel = LatencyModel {
        dispatch_latency_s: 0.0,
        round_trip_s: 0.0,
        pipeline_depth: 2,
    };

    /// Seconds of one run of a stage of `dispatches` dispatches reading `bytes`.
    pub fn stage_s(&self, bytes: f64, dispatches: f64, gbps: f64) -> f64 {
        (bytes / (gbps * 1e9)).max(dispatches * self.dispatch_latency_s)
    }

    /// Seconds of a decode step whose stages take `device_s` on the device and whose
    /// recording and submission take `encode_s` of CPU.
    pub fn step_s(&self, device_s: f64, encode_s: f64) -> f64 {
        if self.pipeline_depth <= 1 {
            device_s + self.round_trip_s + encode_s
        } else {
            device_s.max(encode_s)
        }
    }
}

/// One stage of the model: its dispatches in one layer (or once, for the head). Where the
/// model's layers differ (a GGUF file's matrix types), the figures of one run are the
/// average over the layers, and `per_token` counts them all.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StageReport {
    /// `decode/<op>` or `prefill/<op>`.
    pub stage: String,
    /// The kernels of its dispatches.
    pub kernel: String,
    /// How many times one token runs it (the layers that have it; for prefill, per token
    /// of the chunk).
    pub per_token: f64,
    pub dispatches: usize,
    /// Workgroups of its smallest dispatch.
    pub workgroups: u64,
    /// Invocations of all its dispatches.
    pub invocations: u64,
    /// Bytes of weights and KV cache its loads use (the streams from device memory).
    pub bytes_read: u64,
    pub weight_bytes: u64,
    pub kv_bytes: u64,
    /// Activations (read by every workgroup; small, cached) and the rest (ids, tables,
    /// partial sums).
    pub activation_bytes: u64,
    pub other_bytes: u64,
    /// Weight loads (words and scales): bytes used / (sectors x 32). None: no weights.
    pub sector_efficiency: Option<f64>,
    /// The same for the KV cache.
    pub kv_sector_efficiency: Option<f64>,
    /// One run: the larger of bytes_read at the bandwidth and its dispatches at the
    /// dispatch latency, microseconds.
    pub predicted_us: f64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct KernelsReport {
    pub config: String,
    pub device_class: DeviceClass,
    /// The adapter the probe ran on, and its subgroup size.
    pub measured_on: String,
    pub subgroup_size: u32,
    pub context: usize,
    /// The KV cache's storage the attention stages read (by `--kv-precision`'s name).
    #[serde(serialize_with = "kv_name")]
    pub kv_precision: crate::backend::kernel::KvFormat,
    pub prefill_chunk: usize,
    pub bandwidth_gbps: f64,
    pub plan: KernelPlan,
    pub kernels: Vec<StageReport>,
    pub stages: Stages,
    /// Weights and KV cache read per decoded token (null when decode was not measured).
    pub bytes_per_token: Option<u64>,
    /// Tokens per second by the latency model (`latency`): each stage the larger of its
    /// bytes over the bandwidth and its dispatches' latency, plus the host where it waits.
    pub predicted_decode_tokens_per_s: Option<f64>,
    /// The same from bytes alone (the bandwidth roofline).
    pub roofline_decode_tokens_per_s: Option<f64>,
    pub latency: LatencyModel,
    /// Weights and KV cache read per prefilled token (null when prefill was not measured).
    pub prefill_bytes_per_token: Option<f64>,
    pub dispatches_per_token: Option<usize>,
    /// CPU seconds to record and submit one decode step of the real layer count.
    pub encode_seconds_per_token: Option<f64>,
}

fn kv_name<S: serde::Serializer>(
    kv: &crate::backend::kernel::KvFormat,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(kv.name())
}

/// The device the plan is decided for: the class's GPU traits on the probe adapter's
/// limits (so matrices split exactly as the probe runs them), or the adapter itself.
fn class_info(class: DeviceClass, real: &DeviceInfo) -> DeviceInfo {
    let mut info = real.clone();
    match class {
        DeviceClass::Cpu => return info,
        DeviceClass::Discrete => info.device_type = DeviceType::DiscreteGpu,
        DeviceClass::Integrated => info.device_type = DeviceType::IntegratedGpu,
    }
    info.name = format!("a {} GPU (modelled)", class_name(class));
    info.shader_f16 = true;
    info.subgroup = true;
    info.subgroup_min_size = 32;
    info.subgroup_max_size = 32;
    info
}

fn class_name(c: DeviceClass) -> &'static str {
    match c {
        DeviceClass::Discrete => "discrete",
        DeviceClass::Integrated => "integrated",
        DeviceClass::Cpu => "cpu",
    }
}

/// The config cut to one layer of each kind it has, and how many layers of each kind the
/// real model has, by the cut model's layer index, and each real layer's cut index. A kind
/// is MoE or dense, with the kinds its GGUF matrices are held in (those differ between
/// layers: a Q4_K_M file's Q6_K `attn_v` and `ffn_down` on some of them).
fn shape_model(cfg: &ModelConfig) -> (ModelConfig, Vec<(usize, usize)>, Vec<usize>) {
    let prefix = |l: usize| format!("model.layers.{l}.");
    // The layer's dense kinds, named without their layer.
    let dense_of = |l: usize| -> Vec<(String, crate::blocks::quant::Q4Kind)> {
        let p = prefix(l);
        cfg.gguf_dense_kinds
            .iter()
            .filter_map(|(n, k)| n.strip_prefix(&p).map(|n| (n.to_string(), *k)))
            .collect()
    };
    type Signature = (
        bool,
        crate::blocks::quant::SlotKinds,
        Vec<(String, crate::blocks::quant::Q4Kind)>,
    );
    let mut signatures: Vec<Signature> = Vec::new();
    let mut kinds: Vec<(usize, usize)> = Vec::new();
    let mut layer_kind = Vec::with_capacity(cfg.num_layers);
    for l in 0..cfg.num_layers {
        let sig = (cfg.sparse_layers[l], cfg.expert_kinds(l), dense_of(l));
        let j = match signatures.iter().position(|s| *s == sig) {
            Some(j) => j,
            None => {
                signatures.push(sig);
                kinds.push((kinds.len(), 0));
                kinds.len() - 1
            }
        };
        kinds[j].1 += 1;
        layer_kind.push(j);
    }
    let mut c = cfg.clone();
    c.num_layers = signatures.len();
    c.sparse_layers = signatures.iter().map(|s| s.0).collect();
    if !cfg.expert_kinds.is_empty() {
        c.expert_kinds = signatures.iter().map(|s| s.1).collect();
    }
    // The cut layer j holds what its kind's layers hold; the head and embeddings keep theirs.
    let mut dense: Vec<(String, crate::blocks::quant::Q4Kind)> = cfg
        .gguf_dense_kinds
        .iter()
        .filter(|(n, _)| !n.starts_with("model.layers."))
        .cloned()
        .collect();
    for (j, (_, _, names)) in signatures.iter().enumerate() {
        dense.extend(names.iter().map(|(n, k)| (format!("{}{n}", prefix(j)), *k)));
    }
    dense.sort();
    c.gguf_dense_kinds = dense;
    (c, kinds, layer_kind)
}

/// The dispatches of one stage: per program that runs it (a layer kind, the head), how
/// many times that program runs per token and the stage's dispatches in one run. Layer
/// kinds may read different bytes (a GGUF file's matrix types differ between layers), so
/// the report gives the average run, weighted by those counts.
struct Stage {
    name: String,
    runs: Vec<(f64, Vec<ProbedOp>)>,
}

impl Stage {
    fn per_token(&self) -> f64 {
        self.runs.iter().map(|r| r.0).sum()
    }
}

/// Add one program's ops, run `per_token` times per token, to their stages.
fn push(stages: &mut Vec<Stage>, prefix: &str, per_token: f64, ops: Vec<ProbedOp>) {
    let mut by_name: Vec<(String, Vec<ProbedOp>)> = Vec::new();
    for op in ops {
        let name = format!(
            "{prefix}/{}",
            if op.stage.is_empty() {
                "other"
            } else {
                op.stage
            }
        );
        match by_name.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push(op),
            None => by_name.push((name, vec![op])),
        }
    }
    for (name, ops) in by_name {
        match stages.iter_mut().find(|s| s.name == name) {
            Some(s) => s.runs.push((per_token, ops)),
            None => stages.push(Stage {
                name,
                runs: vec![(per_token, ops)],
            }),
        }
    }
}

fn summarise(s: &Stage, gbps: f64, latency: &LatencyModel) -> StageReport {
    let per_token = s.per_token();
    let mut counts = Counts::default();
    let mut kernels: Vec<String> = Vec::new();
    let mut dispatches = 0.0;
    let mut invocations = 0.0;
    for (n, ops) in &s.runs {
        // This program's share of the stage's runs.
        let w = if per_token > 0.0 { n / per_token } else { 0.0 };
        let mut run = Counts::default();
        for op in ops {
            run = run.add(&op.counts);
            let name = op.kernel.name();
            if !kernels.contains(&name) {
                kernels.push(name);
            }
        }
        counts = counts.add(&run.scaled(w));
        dispatches += w * ops.len() as f64;
        invocations += w * ops.iter().map(|o| o.invocations()).sum::<u64>() as f64;
    }
    let weights = counts.weights();
    let kv = counts.site(Site::KvCache);
    let bytes_read = weights.bytes + kv.bytes;
    StageReport {
        stage: s.name.clone(),
        kernel: kernels.join(" + "),
        per_token,
        dispatches: dispatches.round() as usize,
        workgroups: s
            .runs
            .iter()
            .flat_map(|r| r.1.iter().map(|o| o.workgroups()))
            .min()
            .unwrap_or(0),
        invocations: invocations.round() as u64,
        bytes_read,
        weight_bytes: weights.bytes,
        kv_bytes: kv.bytes,
        activation_bytes: counts.site(Site::Activations).bytes,
        other_bytes: counts.site(Site::Other).bytes,
        sector_efficiency: weights.sector_efficiency(),
        kv_sector_efficiency: kv.sector_efficiency(),
        predicted_us: latency.stage_s(bytes_read as f64, dispatches, gbps) * 1e6,
    }
}

/// The programs of one step: each layer kind's attention and MLP block, then the head.
fn step_programs(f: &Forward, tokens: usize) -> Vec<(usize, &Prepared)> {
    let mut v = Vec::new();
    for (l, lp) in f.layers.iter().enumerate() {
        let (pre, post) = lp.step_programs(tokens, false);
        v.push((l, pre));
        v.push((l, post));
    }
    v
}

pub fn report(config: &str, cfg: &ModelConfig, o: &KernelsOptions) -> Result<KernelsReport> {
    report_with_progress(config, cfg, o, &mut |_| {})
}

/// [`report`], telling `progress` what it is doing (building the shape, probing each stage's
/// programs, timing the encode): it runs for minutes on a software adapter.
pub fn report_with_progress(
    config: &str,
    cfg: &ModelConfig,
    o: &KernelsOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<KernelsReport> {
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
    if !(o.bandwidth_gbps.is_finite() && o.bandwidth_gbps > 0.0) {
        return Err(Error::option(
            "--bandwidth",
            format!("{} is not a bandwidth in GB/s (> 0)", o.bandwidth_gbps),
        ));
    }
    let dev = Device::open(&DeviceRequest {
        probe: true,
        ..Default::default()
    })?;
    let real = dev.info().clone();
    let mut plan = KernelPlan::decide(&class_info(o.class, &real), &o.overrides)?;
    // The engine sets the cache's storage after deciding the plan; so does this report.
    crate::runtime::engine::check_kv_format(cfg, o.kv)?;
    plan.kv = o.kv;
    let (shape, kinds, layer_kind) = shape_model(cfg);
    progress(&format!(
        "building {} layer shapes on {} (zero weights)",
        shape.num_layers, real.name
    ));
    let fwd = |dev: &Device, shape: &ModelConfig| -> Result<Forward> {
        let weights = ModelWeights::zeros(dev, shape, o.int4, o.dense)?;
        Forward::new(
            dev,
            shape,
            weights,
            plan,
            ForwardOptions {
                executor: Executor::Grouped,
                max_context: o.context,
                prefill_chunk: o.prefill_chunk,
                all_logits: false,
                score_rows: 0,
                suppress: Vec::new(),
                expert_batches: false,
                placement: Vec::new(),
                predict_width: 0,
                batch: 1,
            },
        )
    };
    let f = fwd(&dev, &shape)?;
    let per_layer = |l: usize| kinds.iter().find(|k| k.0 == l).map_or(0, |k| k.1) as f64;
    let mut stages: Vec<Stage> = Vec::new();
    // Decode: one token at the context's last position (attention over every key).
    if o.stages != Stages::Prefill {
        dev.write_step(&f.step, o.context - 1, 1)?;
        let programs = step_programs(&f, 1);
        progress(&format!(
            "probing decode at position {}: {} layer programs",
            o.context - 1,
            programs.len()
        ));
        let pos = (o.context - 1) as u32;
        for (l, p) in programs {
            let ops = dev.probe_program(p, 1, pos)?;
            let (embed, rest): (Vec<_>, Vec<_>) =
                ops.into_iter().partition(|op| op.stage == "embed");
            push(&mut stages, "decode", 1.0, embed);
            push(&mut stages, "decode", per_layer(l), rest);
        }
        push(
            &mut stages,
            "decode",
            1.0,
            dev.probe_program(&f.head_last, 1, pos)?,
        );
        push(
            &mut stages,
            "decode",
            1.0,
            dev.probe_program(f.argmax(), 1, pos)?,
        );
    }
    // Prefill: one chunk from position 0.
    let t = f.opts.prefill_chunk;
    if t > 1 && o.stages != Stages::Decode {
        dev.write_step(&f.step, 0, t)?;
        let per = 1.0 / t as f64;
        let programs = step_programs(&f, t);
        progress(&format!(
            "probing a prefill chunk of {t} tokens: {} layer programs",
            programs.len()
        ));
        for (l, p) in programs {
            let ops = dev.probe_program(p, t as u32, 0)?;
            let (embed, rest): (Vec<_>, Vec<_>) =
                ops.into_iter().partition(|op| op.stage == "embed");
            push(&mut stages, "prefill", per, embed);
            push(&mut stages, "prefill", per_layer(l) * per, rest);
        }
        push(
            &mut stages,
            "prefill",
            per,
            dev.probe_program(&f.head_last, t as u32, 0)?,
        );
    }
    dev.sync()?;
    let kernels: Vec<StageReport> = stages
        .iter()
        .map(|s| summarise(s, o.bandwidth_gbps, &o.latency))
        .collect();
    let total = |prefix: &str| -> f64 {
        kernels
            .iter()
            .filter(|k| k.stage.starts_with(prefix))
            .map(|k| k.bytes_read as f64 * k.per_token)
            .sum()
    };
    let bytes_per_token = total("decode/").round() as u64;
    let prefill_bytes_per_token = total("prefill/");
    let dispatches_per_token = kernels
        .iter()
        .filter(|k| k.stage.starts_with("decode/"))
        .map(|k| (k.dispatches as f64 * k.per_token).round() as usize)
        .sum();
    drop(f);
    drop(dev);
    let decode = o.stages != Stages::Prefill;
    let prefill = o.stages != Stages::Decode && t > 1;
    let encode_seconds_per_token = if decode {
        progress("timing the host's encode of a decode step");
        let plain = Device::open(&DeviceRequest::default())?;
        Some(encode_seconds(&fwd(&plain, &narrow(&shape))?, &layer_kind)?)
    } else {
        None
    };
    // A decode step on the device: every stage by the latency model.
    let device_s: f64 = kernels
        .iter()
        .filter(|k| k.stage.starts_with("decode/"))
        .map(|k| k.predicted_us * 1e-6 * k.per_token)
        .sum();
    Ok(KernelsReport {
        config: config.to_string(),
        device_class: o.class,
        measured_on: format!("{} ({}, {})", real.name, real.backend, real.driver_string()),
        subgroup_size: real.subgroup_max_size,
        context: o.context,
        kv_precision: o.kv,
        prefill_chunk: t,
        bandwidth_gbps: o.bandwidth_gbps,
        plan,
        kernels,
        stages: o.stages,
        bytes_per_token: decode.then_some(bytes_per_token),
        predicted_decode_tokens_per_s: decode.then(|| {
            let step = o
                .latency
                .step_s(device_s, encode_seconds_per_token.unwrap_or(0.0));
            1.0 / step.max(1e-12)
        }),
        roofline_decode_tokens_per_s: decode
            .then(|| o.bandwidth_gbps * 1e9 / bytes_per_token.max(1) as f64),
        latency: o.latency,
        prefill_bytes_per_token: prefill.then_some(prefill_bytes_per_token),
        dispatches_per_token: decode.then_some(dispatches_per_token),
        encode_seconds_per_token,
    })
}

/// CPU seconds to record and submit one decode step of the real model: each layer's
/// prepared programs (the shape model's layer of its kind) repeated to the real layer
/// count, then the head, in one submission, on a plain device; the least of 3.
/// The shape model with narrow matrices, for timing the CPU's encoding: recording a dispatch
/// costs the same whatever the buffer sizes, while executing the real widths on a software
/// driver between the timed submissions would take minutes. The programs (ops, dispatches, bind
/// groups) are the real ones, except that lm_head and expert buffers split into fewer chunks.
fn narrow(shape: &ModelConfig) -> ModelConfig {
    let mut c = shape.clone();
    c.vocab_size = c.vocab_size.min(4096);
    c.moe_intermediate = c.moe_intermediate.min(128);
    c.dense_intermediate = c.dense_intermediate.min(256);
    c.shared_expert_intermediate = c.shared_expert_intermediate.map(|s| s.min(256));
    c
}

fn encode_seconds(f: &Forward, layer_kind: &[usize]) -> Result<f64> {
    let dev = &f.dev;
    dev.write_step(&f.step, 0, 1)?;
    let mut work = Vec::new();
    for &kind in layer_kind {
        let lp = &f.layers[kind];
        let (pre, post) = lp.step_programs(1, false);
        for p in [pre, post] {
            work.push(Work::Run {
                program: p,
                tokens: 1,
                pos0: crate::backend::LONGEST,
            });
        }
    }
    work.push(Work::Run {
        program: &f.head_last,
        tokens: 1,
        pos0: crate::backend::LONGEST,
    });
    work.push(Work::Run {
        program: f.argmax(),
        tokens: 1,
        pos0: crate::backend::LONGEST,
    });
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = std::time::Instant::now();
        dev.submit(&work)?;
        best = best.min(t.elapsed().as_secs_f64());
        dev.sync()?;
    }
    Ok(best)
}

/// The report as a table.
pub fn render(r: &KernelsReport) -> String {
    let mut s = format!(
        "{}: kernels of the {} plan, context {} ({} KV cache), prefill chunk {}, measured on {} (subgroups of {})\n",
        r.config,
        class_name(r.device_class),
        r.context,
        r.kv_precision.name(),
        r.prefill_chunk,
        r.measured_on,
        r.subgroup_size
    );
    let head = [
        "stage",
        "kernel",
        "x/token",
        "dispatches",
        "workgroups",
        "invocations",
        "bytes read",
        "weights eff",
        "kv eff",
        "us",
    ];
    let rows: Vec<[String; 10]> = r
        .kernels
        .iter()
        .map(|k| {
            let eff = |e: Option<f64>| e.map_or("-".to_string(), |e| format!("{e:.3}"));
            [
                k.stage.clone(),
                k.kernel.clone(),
                format!("{:.4}", k.per_token)
                    .trim_end_matches('0')
                    .trim_end_matches('.')
                    .to_string(),
                k.dispatches.to_string(),
                k.workgroups.to_string(),
                k.invocations.to_string(),
                k.bytes_read.to_string(),
                eff(k.sector_efficiency),
                eff(k.kv_sector_efficiency),
                format!("{:.1}", k.predicted_us),
            ]
        })
        .collect();
    let mut width = head.map(|h| h.len());
    for row in &rows {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| -> String {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            if i < 2 {
                l.push_str(&format!("{c:<w$}", w = width[i]));
            } else {
                l.push_str(&format!("{c:>w$}", w = width[i]));
            }
        }
        l.trim_end().to_string()
    };
    s.push_str(&line(&head.map(String::from)));
    s.push('\n');
    for row in &rows {
        s.push_str(&line(row));
        s.push('\n');
    }
    if let (Some(b), Some(d), Some(tps), Some(roof), Some(e)) = (
        r.bytes_per_token,
        r.dispatches_per_token,
        r.predicted_decode_tokens_per_s,
        r.roofline_decode_tokens_per_s,
        r.encode_seconds_per_token,
    ) {
        let l = &r.latency;
        s.push_str(&format!(
            "decode: {:.3} GB of weights and KV cache per token, {d} dispatches; recording and submitting a step takes {:.2} ms of CPU\n",
            b as f64 / 1e9,
            e * 1e3
        ));
        s.push_str(&format!(
            "predicted: {tps:.1} tok/s with {:.1} us per dispatch{} ({roof:.1} tok/s from bytes alone at {} GB/s)\n",
            l.dispatch_latency_s * 1e6,
            if l.pipeline_depth <= 1 {
                format!(", a {:.1} us round trip and the recording per step (pipeline depth 1)", l.round_trip_s * 1e6)
            } else {
                format!(", recording overlapped (pipeline depth {})", l.pipeline_depth)
            },
            r.bandwidth_gbps,
        ));
    }
    if let Some(b) = r.prefill_bytes_per_token {
        s.push_str(&format!(
            "prefill: {:.3} MB of weights and KV cache per token of a {}-token chunk\n",
            b / 1e6,
            r.prefill_chunk
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::LatencyModel;

    #[test]
    fn a_stage_costs_the_larger_of_its_bytes_and_its_dispatches_latency() {
        let l = LatencyModel {
            dispatch_latency_s: 10e-6,
            round_trip_s: 50e-6,
            pipeline_depth: 2,
        };
        // 1 MB at 100 GB/s is 10 us; 3 dispatches at 10 us are 30 us.
        assert!((l.stage_s(1e6, 3.0, 100.0) - 30e-6).abs() < 1e-12);
        // 10 MB is 100 us of bytes: the bytes decide.
        assert!((l.stage_s(1e7, 3.0, 100.0) - 100e-6).abs() < 1e-12);
        assert!((LatencyModel::NONE.stage_s(1e6, 3.0, 100.0) - 10e-6).abs() < 1e-12);
    }

    #[test]
    fn depth_one_adds_the_round_trip_and_recording_deeper_overlaps_them() {
        let mut l = LatencyModel {
            dispatch_latency_s: 0.0,
            round_trip_s: 50e-6,
            pipeline_depth: 1,
        };
        assert!((l.step_s(1e-3, 2e-4) - 1.25e-3).abs() < 1e-12);
        l.pipeline_depth = 2;
        assert!((l.step_s(1e-3, 2e-4) - 1e-3).abs() < 1e-12);
        // A host slower than the device sets the pace.
        assert!((l.step_s(1e-4, 2e-4) - 2e-4).abs() < 1e-12);
    }
}

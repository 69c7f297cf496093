//! Streaming the weights of a synthetic model: the converted INT4 format, or a bf16
//! Hugging Face checkpoint in shards.

use std::collections::BTreeMap;

use half::f16;
use serde_json::json;

use super::random::{generate_float, random_q4_slot, threads, Float, RowScales};
use super::skew::row_scales;
use super::{json_bytes, routing_note, SynthFile, SynthOptions};

use crate::config::{Arch, ModelConfig};
use crate::error::Result;
use crate::format::checkpoint::mixtral_name;
use crate::format::convert::{ConvertedModelWriter, PlannedTensor, SafetensorsStream};

pub(super) fn write_converted_weights(
    opts: &SynthOptions,
    cfg: &ModelConfig,
    dense: Vec<(String, Vec<usize>)>,
    out: &mut crate::format::output_dir::OutputDir,
    on_progress: &mut dyn FnMut(u64, u64),
) -> Result<(Vec<SynthFile>, u64, u64)> {
    let mut extra = BTreeMap::new();
    extra.insert("wgmoe.source_files".to_string(), "[]".to_string());
    extra.insert(
        "wgmoe.synthetic".to_string(),
        json!({"arch": opts.arch.name(), "seed": opts.seed, "router_skew": opts.router_skew, "note": routing_note(opts.router_skew)})
            .to_string(),
    );
    let mut w =
        ConvertedModelWriter::create(&out.stage("model.safetensors"), cfg, dense.clone(), extra)?;
    let total = w.stream().data_bytes();
    let mut done = 0u64;
    on_progress(0, total);
    for (name, shape) in &dense {
        let n: usize = shape.iter().product();
        let scales = row_scales(
            opts.seed,
            name,
            shape.first().copied().unwrap_or(1),
            opts.router_skew,
        );
        let rows = scales.as_deref().map(|scales| RowScales {
            scales,
            row_len: shape.get(1).copied().unwrap_or(1),
        });
        generate_float(opts.seed, name, n, Float::F16, rows, &mut |bytes| {
            let v: &[f16] = bytemuck::cast_slice(bytes);
            w.write_dense(name, v)?;
            done += bytes.len() as u64;
            on_progress(done, total);
            Ok(())
        })?;
    }
    let layout = w.layout();
    let group = threads() * 2;
    let mut buf = vec![0u8; group.min(cfg.num_experts) * layout.bytes];
    for l in (0..cfg.num_layers).filter(|&l| cfg.sparse_layers[l]) {
        let mut e0 = 0;
        while e0 < cfg.num_experts {
            let n = group.min(cfg.num_experts - e0);
            let part = &mut buf[..n * layout.bytes];
            let t = threads();
            let per = n.div_ceil(t);
            std::thread::scope(|s| {
                for (ti, chunk) in part.chunks_mut(per * layout.bytes).enumerate() {
                    let layout = &layout;
                    s.spawn(move || {
                        for (k, slot) in chunk.chunks_mut(layout.bytes).enumerate() {
                            random_q4_slot(layout, opts.seed, l, e0 + ti * per + k, slot);
                        }
                    });
                }
            });
            crate::interrupt::check()?;
            w.write_experts(l, part)?;
            done += part.len() as u64;
            on_progress(done, total);
            e0 += n;
        }
    }
    let s = w.finish()?;
    Ok((
        vec![SynthFile {
            file: "model.safetensors".to_string(),
            bytes: s.bytes,
        }],
        s.dense_f16_bytes,
        s.expert_int4_bytes,
    ))
}

pub(super) fn write_hf_weights(
    opts: &SynthOptions,
    cfg: &ModelConfig,
    dense: Vec<(String, Vec<usize>)>,
    out: &mut crate::format::output_dir::OutputDir,
    on_progress: &mut dyn FnMut(u64, u64),
) -> Result<(Vec<SynthFile>, u64, u64)> {
    let (h, i) = (cfg.hidden_size, cfg.moe_intermediate);
    // The hub's names: Mixtral's routers and experts live under block_sparse_moe.
    let hub = |name: String| match cfg.arch {
        Arch::Mixtral => mixtral_name(&name).unwrap_or(name),
        _ => name,
    };
    // Model order, the per-expert tensors after each layer's router.
    let mut all: Vec<(PlannedTensor, bool)> = Vec::new();
    for (name, shape) in dense {
        let router_layer = name
            .strip_suffix(".mlp.gate.weight")
            .and_then(|p| p.strip_prefix("model.layers."))
            .and_then(|l| l.parse::<usize>().ok());
        all.push((PlannedTensor::new(hub(name), "BF16", shape), false));
        if let Some(l) = router_layer {
            for e in 0..cfg.num_experts {
                let p = format!("model.layers.{l}.mlp.experts.{e}");
                for (proj, shape) in [
                    ("gate_proj", [i, h]),
                    ("up_proj", [i, h]),
                    ("down_proj", [h, i]),
                ] {
                    let name = hub(format!("{p}.{proj}.weight"));
                    all.push((PlannedTensor::new(name, "BF16", shape.to_vec()), true));
                }
            }
        }
    }
    let total: u64 = all.iter().map(|(p, _)| p.bytes as u64).sum();
    // Greedy sequential sharding.
    let mut shards: Vec<Vec<(PlannedTensor, bool)>> = vec![Vec::new()];
    let mut cur = 0u64;
    for t in all {
        let b = t.0.bytes as u64;
        if cur > 0 && cur + b > opts.max_shard_bytes {
            shards.push(Vec::new());
            cur = 0;
        }
        cur += b;
        // `shards` starts with one shard and only grows.
        if let Some(shard) = shards.last_mut() {
            shard.push(t);
        }
    }
    let n_shards = shards.len();
    let name_of = |k: usize| {
        if n_shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", k + 1, n_shards)
        }
    };
    let mut files = Vec::new();
    let mut weight_map = serde_json::Map::new();
    let (mut done, mut dense_bytes, mut expert_bytes) = (0u64, 0u64, 0u64);
    on_progress(0, total);
    for (k, shard) in shards.into_iter().enumerate() {
        let fname = name_of(k);
        let mut meta = BTreeMap::new();
        meta.insert("format".to_string(), "pt".to_string());
        let plan: Vec<PlannedTensor> = shard.iter().map(|(p, _)| p.clone()).collect();
        let mut st = SafetensorsStream::create(&out.stage(&fname), plan, meta)?;
        for (p, is_expert) in &shard {
            weight_map.insert(p.name.clone(), json!(fname));
            let n: usize = p.shape.iter().product();
            let scales = row_scales(
                opts.seed,
                &p.name,
                p.shape.first().copied().unwrap_or(1),
                opts.router_skew,
            );
            let rows = scales.as_deref().map(|scales| RowScales {
                scales,
                row_len: p.shape.get(1).copied().unwrap_or(1),
            });
            generate_float(opts.seed, &p.name, n, Float::BF16, rows, &mut |bytes| {
                st.write(&p.name, bytes)?;
                done += bytes.len() as u64;
                on_progress(done, total);
                Ok(())
            })?;
            if *is_expert {
                expert_bytes += p.bytes as u64;
            } else {
                dense_bytes += p.bytes as u64;
            }
        }
        let bytes = st.finish()?;
        files.push(SynthFile { file: fname, bytes });
    }
    if n_shards > 1 {
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        out.write("model.safetensors.index.json", &json_bytes(&index)?)?;
    }
    Ok((files, dense_bytes, expert_bytes))
}

//! Loading a checkpoint's weights onto the device: everything f16, the routed experts in
//! an expert pool (one slot per expert: full residency; fewer, filled on demand, with the
//! packed experts kept in host memory as the source), Qwen's shared expert and dense MLPs
//! as single-slot pools so the same SwiGLU kernels serve them.

use indicatif::{ProgressBar, ProgressStyle};

use crate::backend::kernel::WeightFormat;
use crate::backend::{Buffer, Device, Usage};
use crate::blocks::quant::{Q4Kind, Q4SlotLayout, Q4Source, SlotKinds};
use crate::config::{ModelConfig, QkNorm};
use crate::error::{Error, Result};
use crate::format::checkpoint::{Checkpoint, ExpertProj};
use crate::format::convert::{is_converted, packed_layer, stored_q8_blocks};
use crate::format::identity::{dense_storage, stored_q8, DenseStorage};
use crate::model::dense_mlp::{DenseMlp, Q8Mlp};
use crate::model::tensors::{
    upload_f16_vec, upload_f32_vec, DenseRows, ExpertPool, ExpertStore, F16Matrix, Q4Pool,
};
use crate::residency::{HostLayer, HostSource};

// One per layer: the size of the larger variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Mlp {
    Moe {
        /// Router rows (one per expert), plus Qwen's shared_expert_gate as the last row.
        router: F16Matrix,
        experts: ExpertStore,
        /// expert id -> pool slot (identity while every expert is resident).
        slot_of: Buffer,
        shared: Option<DenseMlp>,
    },
    Dense {
        mlp: DenseMlp,
    },
}

pub struct LayerWeights {
    pub attn_norm: Buffer,
    /// q, k and v projections stacked by rows: one matmul computes all three.
    pub qkv: F16Matrix,
    pub qkv_bias: Option<Buffer>,
    pub q_norm: Option<Buffer>,
    pub k_norm: Option<Buffer>,
    pub o_proj: F16Matrix,
    pub ffn_norm: Buffer,
    pub mlp: Mlp,
}

pub struct ModelWeights {
    /// Routed experts held in host memory for partial residency (None: all on the GPU).
    pub host: Option<HostSource>,
    pub embed: F16Matrix,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Buffer,
    /// None when the embeddings are tied (`tie_word_embeddings`).
    pub lm_head: Option<F16Matrix>,
}

fn progress(total: u64) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(total), indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("loading {bar:30} {pos}/{len} layers {elapsed} {msg}")
    {
        pb.set_style(style);
    }
    pb
}

impl ModelWeights {
    /// `slots[l]`: layer l's expert slots on the GPU when fewer than all its experts are
    /// resident (capacity + spares; 0: every expert runs on the CPU), None for all (or an
    /// empty list: all, everywhere); below all, the packed experts stay in host memory as
    /// the source.
    pub fn load(
        dev: &Device,
        cfg: &ModelConfig,
        ckpt: &std::sync::Arc<Checkpoint>,
        int4: bool,
        dense: WeightFormat,
        slots: &[Option<usize>],
    ) -> Result<Self> {
        // Fail on a missing or misshapen tensor before any upload.
        crate::format::manifest::check_tensors(cfg, ckpt)?;
        check_dense_storage(ckpt, dense)?;
        if !int4 && is_converted(ckpt) {
            return Err(crate::error::Error::option(
                "--expert-precision",
                format!("{} holds INT4 experts (converted by `wgmoe quantize`); f16 experts need the original checkpoint", ckpt.dir().display()),
            ));
        }
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let q_dim = cfg.num_heads * cfg.head_dim;
        let kv_dim = cfg.num_kv_heads * cfg.head_dim;
        let pb = progress(cfg.num_layers as u64 + 2);
        pb.set_message("embeddings");
        let embed_data = ckpt.read_f16("model.embed_tokens.weight", &[v, h])?;
        let embed = F16Matrix::upload(dev, "embed_tokens", v, h, &embed_data)?;
        drop(embed_data);
        pb.inc(1);

        let mut layers = Vec::with_capacity(cfg.num_layers);
        let mut host_layers = Vec::new();
        for l in 0..cfg.num_layers {
            pb.set_message(format!("layer {l}"));
            let p = format!("model.layers.{l}");
            let attn_norm = upload_f16_vec(
                dev,
                "attn_norm",
                &ckpt.read_f16(&format!("{p}.input_layernorm.weight"), &[h])?,
            )?;
            let qkv = dense_matrix(
                dev,
                ckpt,
                cfg,
                dense,
                "qkv_proj",
                &qkv_parts(l, q_dim, kv_dim),
                h,
            )?;
            let qkv_bias = if cfg.qkv_bias {
                let mut b = ckpt.read_f16(&format!("{p}.self_attn.q_proj.bias"), &[q_dim])?;
                b.extend(ckpt.read_f16(&format!("{p}.self_attn.k_proj.bias"), &[kv_dim])?);
                b.extend(ckpt.read_f16(&format!("{p}.self_attn.v_proj.bias"), &[kv_dim])?);
                // The bias is added in f32 after an f16-weight matmul; keep it f16-rounded
                // like every other weight so GPU and CPU reference agree on the values.
                let b: Vec<f32> = b.iter().map(|x| x.to_f32()).collect();
                Some(upload_f32_vec(dev, "qkv_bias", &b)?)
            } else {
                None
            };
            // Norm weights over the whole projection (OLMoE) or one head (Qwen3).
            let norm_len = match cfg.qk_norm {
                QkNorm::None => None,
                QkNorm::Projection => Some((q_dim, kv_dim)),
                QkNorm::PerHead => Some((cfg.head_dim, cfg.head_dim)),
            };
            let (q_norm, k_norm) = match norm_len {
                Some((qn, kn)) => (
                    Some(upload_f16_vec(
                        dev,
                        "q_norm",
                        &ckpt.read_f16(&format!("{p}.self_attn.q_norm.weight"), &[qn])?,
                    )?),
                    Some(upload_f16_vec(
                        dev,
                        "k_norm",
                        &ckpt.read_f16(&format!("{p}.self_attn.k_norm.weight"), &[kn])?,
                    )?),
                ),
                None => (None, None),
            };
            let o_proj = dense_matrix(
                dev,
                ckpt,
                cfg,
                dense,
                "o_proj",
                &[(format!("{p}.self_attn.o_proj.weight"), h)],
                q_dim,
            )?;
            let ffn_norm = upload_f16_vec(
                dev,
                "ffn_norm",
                &ckpt.read_f16(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
            )?;
            let mlp = if cfg.sparse_layers[l] {
                let slots = slots.get(l).copied().flatten();
                let (mlp, host) = load_moe(dev, cfg, ckpt, l, (int4, dense), slots)?;
                host_layers.push(host);
                mlp
            } else {
                let mlp = dense_mlp(
                    dev,
                    ckpt,
                    cfg,
                    dense,
                    "dense_mlp",
                    &format!("{p}.mlp"),
                    (h, cfg.dense_intermediate),
                )?;
                host_layers.push(None);
                Mlp::Dense { mlp }
            };
            layers.push(LayerWeights {
                attn_norm,
                qkv,
                qkv_bias,
                q_norm,
                k_norm,
                o_proj,
                ffn_norm,
                mlp,
            });
            // Bound host memory: let queued uploads drain layer by layer.
            dev.sync()?;
            pb.inc(1);
        }
        pb.set_message("head");
        let final_norm = upload_f16_vec(
            dev,
            "final_norm",
            &ckpt.read_f16("model.norm.weight", &[h])?,
        )?;
        let tied = cfg.tie_word_embeddings && !ckpt.contains("lm_head.weight");
        let lm_head = match (tied, dense) {
            (true, WeightFormat::F16) => None,
            // A Q8_0 copy of the tied embeddings: the embedding lookup reads f16 rows, the
            // head reads half the bytes per token.
            (true, _) => Some(dense_matrix(
                dev,
                ckpt,
                cfg,
                dense,
                "lm_head",
                &[("model.embed_tokens.weight".to_string(), v)],
                h,
            )?),
            (false, _) => Some(dense_matrix(
                dev,
                ckpt,
                cfg,
                dense,
                "lm_head",
                &[("lm_head.weight".to_string(), v)],
                h,
            )?),
        };
        dev.sync()?;
        pb.inc(1);
        pb.finish_and_clear();
        let host = slots.iter().any(|s| s.is_some()).then(|| HostSource {
            ckpt: ckpt.clone(),
            layers: host_layers,
            num_experts: cfg.num_experts,
            slot_bytes: cfg.q4_slot_bytes(),
            layouts: (0..cfg.num_layers).map(|l| cfg.q4_slot(l)).collect(),
        });
        Ok(ModelWeights {
            host,
            embed,
            layers,
            final_norm,
            lm_head,
        })
    }

    /// Every weight of `cfg` as zeros on the device, every expert resident (INT4 or f16):
    /// a shape model with no checkpoint behind it, for the memory-access report (`wgmoe
    /// kernels`), which runs the model's real programs on it.
    pub fn zeros(dev: &Device, cfg: &ModelConfig, int4: bool, dense: WeightFormat) -> Result<Self> {
        let (h, v, e) = (cfg.hidden_size, cfg.vocab_size, cfg.num_experts);
        let q_dim = cfg.num_heads * cfg.head_dim;
        let kv_dim = cfg.num_kv_heads * cfg.head_dim;
        let zeros = |label: &str, n: usize| dev.alloc(label, (n.max(1) * 2) as u64, Usage::Storage);
        let norm_len = match cfg.qk_norm {
            QkNorm::None => None,
            QkNorm::Projection => Some((q_dim, kv_dim)),
            QkNorm::PerHead => Some((cfg.head_dim, cfg.head_dim)),
        };
        // A GGUF file's dense matrices in their own blocks, as the loader holds them.
        let held = |parts: &[(String, usize)]| -> Vec<(WeightFormat, usize)> {
            if dense != WeightFormat::Q8 {
                let rows = parts.iter().map(|p| p.1).sum();
                return vec![(dense, rows)];
            }
            cfg.dense_runs(parts)
                .into_iter()
                .map(|(k, n)| (k.map_or(WeightFormat::Q8, WeightFormat::int4), n))
                .collect()
        };
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let mlp = if cfg.sparse_layers[l] {
                let router_rows = e + usize::from(cfg.shared_expert_intermediate.is_some());
                let experts = if int4 {
                    let layout = cfg.q4_slot(l);
                    ExpertStore::Int4(Q4Pool::new(dev, "experts_int4", e, layout)?)
                } else {
                    ExpertStore::F16(ExpertPool::new(dev, "experts", e, h, cfg.moe_intermediate)?)
                };
                let table: Vec<u32> = (0..e as u32).collect();
                Mlp::Moe {
                    router: F16Matrix::zeros(dev, "router", router_rows, h)?,
                    experts,
                    slot_of: dev.upload("slot_of", bytemuck::cast_slice(&table), Usage::Storage)?,
                    shared: match cfg.shared_expert_intermediate {
                        Some(si) => Some(DenseMlp::zeros(
                            dev,
                            "shared_expert",
                            dense,
                            (h, si),
                            dense_mlp_kinds(cfg, &format!("model.layers.{l}.mlp.shared_expert")),
                        )?),
                        None => None,
                    },
                }
            } else {
                Mlp::Dense {
                    mlp: DenseMlp::zeros(
                        dev,
                        "dense_mlp",
                        dense,
                        (h, cfg.dense_intermediate),
                        dense_mlp_kinds(cfg, &format!("model.layers.{l}.mlp")),
                    )?,
                }
            };
            layers.push(LayerWeights {
                attn_norm: zeros("attn_norm", h)?,
                qkv: F16Matrix::zeros_parts(
                    dev,
                    "qkv_proj",
                    h,
                    &held(&qkv_parts(l, q_dim, kv_dim)),
                )?,
                qkv_bias: if cfg.qkv_bias {
                    Some(dev.alloc(
                        "qkv_bias",
                        ((q_dim + 2 * kv_dim) * 4) as u64,
                        Usage::Storage,
                    )?)
                } else {
                    None
                },
                q_norm: norm_len.map(|(q, _)| zeros("q_norm", q)).transpose()?,
                k_norm: norm_len.map(|(_, k)| zeros("k_norm", k)).transpose()?,
                o_proj: F16Matrix::zeros_parts(
                    dev,
                    "o_proj",
                    q_dim,
                    &held(&[(format!("model.layers.{l}.self_attn.o_proj.weight"), h)]),
                )?,
                ffn_norm: zeros("ffn_norm", h)?,
                mlp,
            });
        }
        Ok(ModelWeights {
            host: None,
            embed: F16Matrix::zeros(dev, "embed_tokens", v, h)?,
            layers,
            final_norm: zeros("final_norm", h)?,
            lm_head: if cfg.tie_word_embeddings && dense == WeightFormat::F16 {
                None
            } else {
                let parts = if cfg.tie_word_embeddings {
                    vec![(dense, v)]
                } else {
                    held(&[("lm_head.weight".to_string(), v)])
                };
                Some(F16Matrix::zeros_parts(dev, "lm_head", h, &parts)?)
            },
        })
    }

    pub fn lm_head(&self) -> &F16Matrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}

/// A converted model's dense weights are used as stored when they are what `--dense-precision`
/// asks for, quantised on load when stored f16 and asked q8_0, and refused, naming both, when
/// stored q8_0 and asked f16 (the f16 values are gone).
pub fn check_dense_storage(ckpt: &Checkpoint, dense: WeightFormat) -> Result<()> {
    if dense == WeightFormat::F16 && dense_storage(ckpt)? == DenseStorage::Q8_0 {
        return Err(Error::option(
            "--dense-precision",
            format!(
                "`--dense-precision f16` asked, but the model at {} stores q8_0 dense weights (`wgmoe quantize --dense-precision q8_0`): requantize the original checkpoint with `wgmoe quantize --dense-precision f16`, or pass --dense-precision q8_0",
                ckpt.dir().display()
            ),
        ));
    }
    Ok(())
}

/// Layer `l`'s q, k and v projections, stacked in that order into one matrix (name, rows).
pub fn qkv_parts(l: usize, q_dim: usize, kv_dim: usize) -> [(String, usize); 3] {
    let p = format!("model.layers.{l}.self_attn");
    [
        (format!("{p}.q_proj.weight"), q_dim),
        (format!("{p}.k_proj.weight"), kv_dim),
        (format!("{p}.v_proj.weight"), kv_dim),
    ]
}

/// One part of a Q8_0 dense matrix: ggml's blocks as stored, or quantised from the stored
/// values (a value Q8_0 cannot hold is an error naming its tensor).
fn q8_rows(ckpt: &Checkpoint, name: &str, rows: usize, cols: usize) -> Result<DenseRows> {
    if stored_q8(ckpt, name)? {
        return Ok(DenseRows::Q8(
            stored_q8_blocks(ckpt, name, rows, cols)?.to_vec(),
        ));
    }
    let w = ckpt.read_f32(name, &[rows, cols])?;
    if let Some((i, x)) = crate::blocks::q8_0::first_unstorable(&w, cols) {
        return Err(Error::Other(format!(
            "{name} in {}: element [{}, {}] = {x} cannot be stored as Q8_0 (a block's scale max|w|/127 must be a finite f16)",
            ckpt.dir().display(),
            i / cols,
            i % cols
        )));
    }
    Ok(DenseRows::q8_from_values(&w, cols))
}

/// Whether every one of `names` is stored as Q8_0 blocks (a GGUF file may mix types
/// within a fused matrix: Q4_K_M gives attn_v Q6_K on some layers).
fn all_stored_q8<'a>(
    ckpt: &Checkpoint,
    mut names: impl Iterator<Item = &'a String>,
) -> Result<bool> {
    names.try_fold(true, |all, n| Ok(all && stored_q8(ckpt, n)?))
}

/// A shared expert or dense MLP (`prefix`.{gate,up,down}_proj.weight) in `format`.
fn dense_mlp(
    dev: &Device,
    ckpt: &Checkpoint,
    cfg: &ModelConfig,
    format: WeightFormat,
    label: &str,
    prefix: &str,
    (h, i): (usize, usize),
) -> Result<DenseMlp> {
    let names = [
        format!("{prefix}.gate_proj.weight"),
        format!("{prefix}.up_proj.weight"),
        format!("{prefix}.down_proj.weight"),
    ];
    if format == WeightFormat::Q8 {
        if let Some(kinds) = dense_mlp_kinds(cfg, prefix) {
            return blocks_mlp(dev, ckpt, label, &names, (h, i), kinds);
        }
    }
    if format == WeightFormat::F16 {
        let pool = ExpertPool::new(dev, label, 1, h, i)?;
        let gate = ckpt.read_f16(&names[0], &[i, h])?;
        let up = ckpt.read_f16(&names[1], &[i, h])?;
        let down = ckpt.read_f16(&names[2], &[h, i])?;
        pool.write_slot(dev, 0, &gate, &up, &down)?;
        return Ok(DenseMlp::F16(pool));
    }
    if all_stored_q8(ckpt, names.iter())? {
        // A Q8_0 conversion: ggml's blocks as stored, split into the block's sections.
        let gate = stored_q8_blocks(ckpt, &names[0], i, h)?;
        let up = stored_q8_blocks(ckpt, &names[1], i, h)?;
        let down = stored_q8_blocks(ckpt, &names[2], h, i)?;
        return Ok(DenseMlp::Q8(Q8Mlp::upload_ggml(
            dev,
            label,
            (h, i),
            [&gate, &up, &down],
        )?));
    }
    let gate = ckpt.read_f32(&names[0], &[i, h])?;
    let up = ckpt.read_f32(&names[1], &[i, h])?;
    let down = ckpt.read_f32(&names[2], &[h, i])?;
    let shown: Vec<String> = names
        .iter()
        .map(|n| format!("{n} in {}", ckpt.dir().display()))
        .collect();
    Ok(DenseMlp::Q8(Q8Mlp::upload(
        dev,
        label,
        [&shown[0], &shown[1], &shown[2]],
        (h, i),
        [&gate, &up, &down],
    )?))
}

/// The kinds a shared expert or dense MLP (`prefix`.{gate,up,down}_proj.weight) is held in
/// with quantised dense weights, where a GGUF file stores one of its matrices in a block
/// type the kernels compute as it is (`ModelConfig::dense_kind`: gate and up share one);
/// None: Q8_0.
pub fn dense_mlp_kinds(cfg: &ModelConfig, prefix: &str) -> Option<SlotKinds> {
    let gate_up = cfg.dense_kind(&format!("{prefix}.gate_proj.weight"));
    let down = cfg.dense_kind(&format!("{prefix}.down_proj.weight"));
    (gate_up.is_some() || down.is_some()).then(|| SlotKinds {
        gate_up: gate_up.unwrap_or(Q4Kind::Q8),
        down: down.unwrap_or(Q4Kind::Q8),
    })
}

/// A shared expert or dense MLP held in a GGUF file's own blocks: one slot of `kinds`
/// (`Q4SlotLayout`; a matrix of no native kind as Q8_0), served by the expert kernels.
fn blocks_mlp(
    dev: &Device,
    ckpt: &Checkpoint,
    label: &str,
    names: &[String; 3],
    (h, i): (usize, usize),
    kinds: SlotKinds,
) -> Result<DenseMlp> {
    let layout = Q4SlotLayout::mixed(h, i, kinds.gate_up, kinds.down);
    let read = |name: &str, shape: [usize; 2], kind: Q4Kind| -> Result<Q4Source> {
        if kind != Q4Kind::Q8 {
            return match ckpt.read_rows_native(name, &shape, 0, shape[0])? {
                Some(Q4Source::Affine(a)) if kind == Q4Kind::Affine32 => Ok(Q4Source::Affine(a)),
                Some(Q4Source::Planes(p)) if p.kind == kind => Ok(Q4Source::Planes(p)),
                _ => Err(Error::Other(format!(
                    "{name} in {}: not stored in the block type its metadata gave ({})",
                    ckpt.dir().display(),
                    kind.name()
                ))),
            };
        }
        let w = ckpt.read_f32(name, &shape)?;
        if let Some((k, x)) = crate::blocks::q8_0::first_unstorable(&w, shape[1]) {
            return Err(Error::Other(format!(
                "{name} in {}: element [{}, {}] = {x} cannot be stored as Q8_0 (a block's scale max|w|/127 must be a finite f16)",
                ckpt.dir().display(),
                k / shape[1],
                k % shape[1]
            )));
        }
        Ok(Q4Source::Values(w))
    };
    let gate = read(&names[0], [i, h], kinds.gate_up)?;
    let up = read(&names[1], [i, h], kinds.gate_up)?;
    let down = read(&names[2], [h, i], kinds.down)?;
    let mut slot = vec![0u8; layout.bytes];
    layout.pack_expert_from(&gate, &up, &down, &mut slot);
    let pool = Q4Pool::new(dev, label, 1, layout)?;
    pool.write_slot(dev, 0, &slot)?;
    Ok(DenseMlp::Blocks(pool))
}

/// A dense matrix from the checkpoint's tensors `parts` (name, rows) of `cols` columns,
/// stacked by rows, in `format`: f16 as stored, or Q8_0 quantised from the stored values
/// (a value Q8_0 cannot hold is an error naming its tensor).
fn dense_matrix(
    dev: &Device,
    ckpt: &Checkpoint,
    cfg: &ModelConfig,
    format: WeightFormat,
    label: &str,
    parts: &[(String, usize)],
    cols: usize,
) -> Result<F16Matrix> {
    let rows: usize = parts.iter().map(|(_, r)| r).sum();
    // With quantised dense weights, a GGUF file's matrices in a block type the kernels
    // compute as it is are held in their own blocks, part by part (q, k and v of a layer
    // may differ), the rest as Q8_0: the runs `ModelConfig::dense_runs` counts.
    if format == WeightFormat::Q8 && parts.iter().any(|(n, _)| cfg.dense_kind(n).is_some()) {
        let mut rows_of = Vec::with_capacity(parts.len());
        for (name, r) in parts {
            let part = match cfg.dense_kind(name) {
                Some(kind) => match ckpt.read_rows_native(name, &[*r, cols], 0, *r)? {
                    Some(Q4Source::Affine(a)) if kind == Q4Kind::Affine32 => DenseRows::Affine(a),
                    Some(Q4Source::Planes(p)) if p.kind == kind => DenseRows::Planes(p),
                    _ => {
                        return Err(Error::Other(format!(
                            "{name} in {}: not stored in the block type its metadata gave ({})",
                            ckpt.dir().display(),
                            kind.name()
                        )))
                    }
                },
                None => q8_rows(ckpt, name, *r, cols)?,
            };
            rows_of.push(part);
        }
        return F16Matrix::upload_rows(dev, label, cols, rows_of);
    }
    if format == WeightFormat::F16 {
        let mut data = Vec::with_capacity(rows * cols);
        for (name, r) in parts {
            data.extend(ckpt.read_f16(name, &[*r, cols])?);
        }
        return F16Matrix::upload(dev, label, rows, cols, &data);
    }
    if all_stored_q8(ckpt, parts.iter().map(|(n, _)| n))? {
        // A Q8_0 conversion: ggml's blocks as stored, rows in order, so the parts stack.
        let mut blocks = Vec::new();
        for (name, r) in parts {
            blocks.extend_from_slice(&stored_q8_blocks(ckpt, name, *r, cols)?);
        }
        return F16Matrix::upload_q8_ggml(dev, label, rows, cols, &blocks);
    }
    let mut data = Vec::with_capacity(rows * cols);
    for (name, r) in parts {
        let w = ckpt.read_f32(name, &[*r, cols])?;
        if let Some((i, x)) = crate::blocks::q8_0::first_unstorable(&w, cols) {
            return Err(Error::Other(format!(
                "{name} in {}: element [{}, {}] = {x} cannot be stored as Q8_0 (a block's scale max|w|/127 must be a finite f16)",
                ckpt.dir().display(),
                i / cols,
                i % cols
            )));
        }
        data.extend(w);
    }
    F16Matrix::upload_q8(dev, label, rows, cols, &data)
}

fn load_moe(
    dev: &Device,
    cfg: &ModelConfig,
    ckpt: &Checkpoint,
    l: usize,
    (int4, dense): (bool, WeightFormat),
    slots: Option<usize>,
) -> Result<(Mlp, Option<HostLayer>)> {
    let mut host = None;
    let (h, e, i) = (cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate);
    let p = format!("model.layers.{l}.mlp");
    let mut router = ckpt.read_f16(&format!("{p}.gate.weight"), &[e, h])?;
    // Qwen1.5-MoE's shared expert (the only family with one).
    let shared_i = cfg.shared_expert_intermediate;
    if shared_i.is_some() {
        router.extend(ckpt.read_f16(&format!("{p}.shared_expert_gate.weight"), &[1, h])?);
    }
    let router_rows = router.len() / h;
    let router = F16Matrix::upload(dev, "router", router_rows, h, &router)?;
    let experts = if int4 {
        let layout = cfg.q4_slot(l);
        let packed = packed_layer(ckpt, cfg, l)?;
        match slots {
            None => {
                let pool = Q4Pool::new(dev, "experts_int4", e, layout)?;
                for (ex, slot) in packed.chunks_exact(layout.bytes).enumerate() {
                    pool.write_slot(dev, ex, slot)?;
                }
                ExpertStore::Int4(pool)
            }
            Some(n) => {
                // Partial residency: slots start empty and fill on demand from the host
                // source, which keeps every packed expert (and with no slots at all, the
                // CPU computes every expert from it).
                host = Some(match packed {
                    std::borrow::Cow::Borrowed(_) => {
                        HostLayer::Mapped(crate::format::convert::experts_tensor(l))
                    }
                    std::borrow::Cow::Owned(v) => HostLayer::Owned(v.into_boxed_slice()),
                });
                if n == 0 {
                    ExpertStore::Host
                } else {
                    ExpertStore::Int4(Q4Pool::new(dev, "experts_int4", n, layout)?)
                }
            }
        }
    } else {
        let pool = ExpertPool::new(dev, "experts", e, h, i)?;
        for ex in 0..e {
            let gate = ckpt.read_expert_f16(l, ex, ExpertProj::Gate, e, h, i)?;
            let up = ckpt.read_expert_f16(l, ex, ExpertProj::Up, e, h, i)?;
            let down = ckpt.read_expert_f16(l, ex, ExpertProj::Down, e, h, i)?;
            pool.write_slot(dev, ex, &gate, &up, &down)?;
        }
        ExpertStore::F16(pool)
    };
    // expert -> slot: the identity at full residency, empty (NO_SLOT) until filled otherwise.
    let table: Vec<u32> = match slots {
        None => (0..e as u32).collect(),
        Some(_) => vec![crate::residency::NO_SLOT; e],
    };
    let slot_of = dev.upload("slot_of", bytemuck::cast_slice(&table), Usage::Storage)?;
    let shared = match shared_i {
        Some(si) => Some(dense_mlp(
            dev,
            ckpt,
            cfg,
            dense,
            "shared_expert",
            &format!("{p}.shared_expert"),
            (h, si),
        )?),
        None => None,
    };
    Ok((
        Mlp::Moe {
            router,
            experts,
            slot_of,
            shared,
        },
        host,
    ))
}

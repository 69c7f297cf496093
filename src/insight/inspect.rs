//! `wgmoe inspect`: what a checkpoint holds, by class of tensor, and what it costs on the
//! GPU in each expert precision.

use std::collections::BTreeMap;

use crate::blocks::quant::Q4SlotLayout;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::format::checkpoint::Checkpoint;
use crate::format::convert::is_converted;
use crate::gguf::GgmlType;
use crate::model::tensors::ExpertPool;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorClass {
    RoutedExperts,
    SharedExperts,
    DenseMlp,
    Router,
    Attention,
    Norms,
    Embeddings,
    LmHead,
    Other,
}

pub fn classify(name: &str) -> TensorClass {
    if name.contains(".mlp.experts.") || name.contains(".block_sparse_moe.experts.") {
        TensorClass::RoutedExperts
    } else if name.contains(".mlp.shared_expert") {
        TensorClass::SharedExperts
    } else if name.ends_with(".mlp.gate.weight") || name.ends_with(".block_sparse_moe.gate.weight")
    {
        TensorClass::Router
    } else if name.contains(".mlp.") {
        TensorClass::DenseMlp
    } else if name.contains("norm") {
        TensorClass::Norms
    } else if name.contains(".self_attn.") {
        TensorClass::Attention
    } else if name.contains("embed_tokens") {
        TensorClass::Embeddings
    } else if name.starts_with("lm_head") {
        TensorClass::LmHead
    } else {
        TensorClass::Other
    }
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ClassStats {
    pub tensors: usize,
    pub elements: u64,
    /// Bytes as stored in this checkpoint.
    pub stored_bytes: u64,
    pub f16_bytes: u64,
    /// Routed experts only: packed INT4 bytes (block 256, f16 scales, padding included).
    pub int4_bytes: u64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Inspection {
    pub converted_int4: bool,
    /// A converted model's stored dense weights (`wgmoe quantize --dense-precision`): f16,
    /// or q8_0 (which runs with `--dense-precision q8_0` only). None for a Hugging Face
    /// checkpoint (quantised on load as `--dense-precision` says).
    pub stored_dense_precision: Option<crate::format::identity::DenseStorage>,
    pub classes: BTreeMap<TensorClass, ClassStats>,
    pub routed_expert_count: usize,
    pub int4_bytes_per_expert: u64,
    pub f16_bytes_per_expert: u64,
    /// Weights resident on the GPU with every expert resident.
    pub gpu_weight_bytes_int4: u64,
    pub gpu_weight_bytes_f16: Option<u64>,
    pub kv_cache_bytes_per_position: u64,
    /// The storage the GPU byte counts assume (`--dense-precision`, `--kv-precision`).
    pub dense_precision: &'static str,
    pub kv_precision: &'static str,
    /// With `--ctx-size`: that context, the KV cache, the activation workspace (an upper
    /// bound: buffers of kernels a device may not use are counted) and the total with every
    /// expert resident as INT4.
    pub max_context: Option<usize>,
    pub kv_cache_bytes: Option<u64>,
    pub workspace_bytes: Option<u64>,
    pub total_gpu_bytes_int4: Option<u64>,
    #[serde(skip)]
    kv: crate::backend::kernel::KvFormat,
}

impl Inspection {
    /// Fill the context-dependent fields (the arithmetic admission control uses).
    /// Fails (naming `--ctx-size`) when the context cannot be held or its bytes cannot
    /// be counted in 64 bits.
    pub fn add_workspace(
        &mut self,
        cfg: &ModelConfig,
        max_context: usize,
        chunk: usize,
    ) -> Result<()> {
        let option = |e: Error| Error::option("--ctx-size", e.to_string());
        crate::model::workspace::check_context(cfg, max_context, chunk).map_err(option)?;
        let shape = crate::model::workspace::WorkspaceShape {
            kv: self.kv,
            ..crate::model::workspace::planned_shape(cfg, max_context, chunk, false, false)
        };
        let total = crate::model::workspace::workspace_bytes(cfg, &shape).map_err(option)?;
        // The workspace table holds the KV cache too; report it apart.
        let kv = crate::model::workspace::kv_cache_bytes(cfg, &shape).map_err(option)?;
        self.max_context = Some(max_context);
        self.kv_cache_bytes = Some(kv);
        self.workspace_bytes = Some(total - kv);
        self.total_gpu_bytes_int4 = Some(
            self.gpu_weight_bytes_int4
                .checked_add(total)
                .ok_or_else(|| Error::option("--ctx-size", "the byte count overflows 64 bits"))?,
        );
        Ok(())
    }
}

/// The checkpoint's tensors, and the GPU bytes with dense weights in `dense` and the KV
/// cache in `kv`.
pub fn inspect(
    cfg: &ModelConfig,
    ckpt: &Checkpoint,
    dense: crate::backend::kernel::WeightFormat,
    kv: crate::backend::kernel::KvFormat,
) -> Result<Inspection> {
    use crate::format::identity::{dense_storage, ggml_q8_row_bytes, DenseStorage};
    let converted = is_converted(ckpt);
    let storage = dense_storage(ckpt)?;
    let q8 = storage == DenseStorage::Q8_0;
    let mut classes: BTreeMap<TensorClass, ClassStats> = BTreeMap::new();
    let n_sparse = cfg.sparse_layers.iter().filter(|&&s| s).count();
    let routed_count = n_sparse * cfg.num_experts;
    let layout = Q4SlotLayout::new(cfg.hidden_size, cfg.moe_intermediate);
    let per_expert_elems = 3 * cfg.hidden_size as u64 * cfg.moe_intermediate as u64;
    let overflow = |what: &str| Error::Other(format!("inspect: {what} overflow 64 bits"));
    let mul = |a: u64, b: u64, what: &str| a.checked_mul(b).ok_or_else(|| overflow(what));
    for name in ckpt.names() {
        let class = classify(name);
        let st = classes.entry(class).or_default();
        st.tensors += 1;
        if converted && class == TensorClass::RoutedExperts {
            let info = ckpt.raw_u8(name, &[cfg.num_experts, layout.bytes])?;
            let elems = mul(cfg.num_experts as u64, per_expert_elems, "expert elements")?;
            st.elements += elems;
            st.stored_bytes += info.len() as u64;
            st.f16_bytes += mul(elems, 2, "expert bytes")?;
            st.int4_bytes += info.len() as u64;
            continue;
        }
        if let (true, Some([rows, cols])) =
            (q8, crate::format::manifest::q8_stored_shape(cfg, name))
        {
            // ggml's Q8_0 blocks of a [rows, cols] weight.
            let b = ckpt.raw_u8(name, &[rows, ggml_q8_row_bytes(cols)])?;
            let n = rows as u64 * cols as u64;
            st.elements += n;
            st.stored_bytes += b.len() as u64;
            st.f16_bytes += n * 2;
            continue;
        }
        let info = ckpt.info(name)?;
        // The shape's product is bounded by the file: safetensors checked the data length.
        let n: u64 = info.shape.iter().map(|&d| d as u64).product();
        st.elements += n;
        st.stored_bytes += n * info.dtype.size() as u64;
        st.f16_bytes += n * 2;
    }
    let int4_all = mul(
        routed_count as u64,
        layout.bytes as u64,
        "int4 expert bytes",
    )?;
    if let Some(st) = classes.get_mut(&TensorClass::RoutedExperts) {
        st.int4_bytes = int4_all;
    }
    // The non-routed weights as the device holds them (rows padded, the expert->slot
    // tables): admission's arithmetic, so `inspect`, `plan` and the loader agree.
    let dense_gpu = crate::runtime::admission::dense_gpu_bytes(cfg, dense);
    let f16_per_expert = ExpertPool::slot_bytes(cfg.hidden_size, cfg.moe_intermediate);
    Ok(Inspection {
        converted_int4: converted,
        stored_dense_precision: converted.then_some(storage),
        classes,
        routed_expert_count: routed_count,
        int4_bytes_per_expert: layout.bytes as u64,
        f16_bytes_per_expert: f16_per_expert,
        gpu_weight_bytes_int4: dense_gpu
            .checked_add(int4_all)
            .ok_or_else(|| overflow("GPU bytes"))?,
        gpu_weight_bytes_f16: (!converted)
            .then(|| mul(routed_count as u64, f16_per_expert, "f16 expert bytes"))
            .transpose()?
            .map(|b| dense_gpu.saturating_add(b)),
        kv_cache_bytes_per_position: mul(
            cfg.num_layers as u64 * 2,
            kv.row_bytes(cfg.num_kv_heads * cfg.head_dim, cfg.head_dim) as u64,
            "KV cache bytes",
        )?,
        dense_precision: dense.name(),
        kv_precision: kv.name(),
        kv,
        max_context: None,
        kv_cache_bytes: None,
        workspace_bytes: None,
        total_gpu_bytes_int4: None,
    })
}

pub use crate::units::human;

pub fn table(i: &Inspection) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<16} {:>8} {:>14} {:>12} {:>12} {:>12}",
        "class", "tensors", "elements", "stored", "as f16", "as int4"
    );
    for (c, s) in &i.classes {
        let name = serde_json::to_value(c)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        let int4 = if s.int4_bytes > 0 {
            human(s.int4_bytes)
        } else {
            "-".into()
        };
        let _ = writeln!(
            o,
            "{:<16} {:>8} {:>14} {:>12} {:>12} {:>12}",
            name,
            s.tensors,
            s.elements,
            human(s.stored_bytes),
            human(s.f16_bytes),
            int4
        );
    }
    let _ = writeln!(
        o,
        "routed experts: {} ({} each as int4, {} as f16)",
        i.routed_expert_count,
        human(i.int4_bytes_per_expert),
        human(i.f16_bytes_per_expert)
    );
    match i.stored_dense_precision {
        Some(crate::format::identity::DenseStorage::Q8_0) => {
            let _ = writeln!(
                o,
                "dense weights: stored as q8_0 (ggml Q8_0 blocks; the model runs with --dense-precision q8_0 only)"
            );
        }
        Some(crate::format::identity::DenseStorage::F16) => {
            let _ = writeln!(
                o,
                "dense weights: stored as f16 (--dense-precision q8_0 quantises them on load)"
            );
        }
        None => {}
    }
    let _ = writeln!(
        o,
        "GPU-resident weights, all experts int4, {} dense weights: {}",
        i.dense_precision,
        human(i.gpu_weight_bytes_int4)
    );
    if let Some(b) = i.gpu_weight_bytes_f16 {
        let _ = writeln!(o, "GPU-resident weights, all experts f16:  {}", human(b));
    }
    let _ = writeln!(
        o,
        "KV cache: {} per position ({} keys and values)",
        human(i.kv_cache_bytes_per_position),
        i.kv_precision
    );
    if let (Some(n), Some(kv), Some(ws), Some(total)) = (
        i.max_context,
        i.kv_cache_bytes,
        i.workspace_bytes,
        i.total_gpu_bytes_int4,
    ) {
        let _ = writeln!(
            o,
            "at {n} positions: KV cache {}, workspace {} (upper bound), total with every expert resident as int4: {} ({} bytes)",
            human(kv),
            human(ws),
            human(total),
            total
        );
    }
    o
}

/// The class of a GGUF tensor (llama.cpp's names; see `gguf::names`).
pub fn classify_gguf(name: &str) -> TensorClass {
    let layer_part = name.strip_prefix("blk.").and_then(|r| r.split_once('.'));
    match layer_part {
        Some((_, t)) if t.contains("_exps.") => TensorClass::RoutedExperts,
        Some((_, t)) if t.contains("_shexp.") => TensorClass::SharedExperts,
        Some((_, t)) if t.starts_with("ffn_gate_inp.") => TensorClass::Router,
        Some((_, t)) if t.contains("norm") => TensorClass::Norms,
        Some((_, t)) if t.starts_with("ffn_") => TensorClass::DenseMlp,
        Some((_, t)) if t.starts_with("attn_") => TensorClass::Attention,
        Some(_) => TensorClass::Other,
        None if name.contains("norm") => TensorClass::Norms,
        None if name.starts_with("token_embd.") => TensorClass::Embeddings,
        None if name.starts_with("output.") => TensorClass::LmHead,
        None => TensorClass::Other,
    }
}

/// One class of a GGUF file's tensors: how many of each block type, and their bytes.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct GgufClassStats {
    pub tensors: usize,
    pub elements: u64,
    pub bytes: u64,
    /// Block type name -> tensors of that type.
    pub types: BTreeMap<String, usize>,
    /// Block type name -> bytes of that type.
    pub type_bytes: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct GgufInspection {
    pub version: u32,
    pub architecture: Option<String>,
    pub shards: usize,
    pub file_bytes: u64,
    pub tensor_bytes: u64,
    pub classes: BTreeMap<TensorClass, GgufClassStats>,
}

/// What a GGUF model holds, by class of tensor and block type (every type is listed, also
/// those wgmoe cannot compute with).
pub fn inspect_gguf(model: &crate::gguf::GgufModel) -> GgufInspection {
    let mut classes: BTreeMap<TensorClass, GgufClassStats> = BTreeMap::new();
    let mut tensor_bytes = 0;
    for name in model.names() {
        let Some(info) = model.info(name) else {
            continue;
        };
        let st = classes.entry(classify_gguf(name)).or_default();
        let t = info.ggml_type.name().to_string();
        st.tensors += 1;
        st.elements += info.elements();
        st.bytes += info.nbytes;
        *st.types.entry(t.clone()).or_default() += 1;
        *st.type_bytes.entry(t).or_default() += info.nbytes;
        tensor_bytes += info.nbytes;
    }
    GgufInspection {
        version: model.shards()[0].version(),
        architecture: model
            .metadata()
            .opt_str("general.architecture")
            .ok()
            .flatten()
            .map(String::from),
        shards: model.shards().len(),
        file_bytes: model.file_bytes(),
        tensor_bytes,
        classes,
    }
}

pub fn gguf_table(i: &GgufInspection) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<16} {:>8} {:>14} {:>12}  types (tensors, bytes)",
        "class", "tensors", "elements", "bytes"
    );
    for (c, s) in &i.classes {
        let name = serde_json::to_value(c)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        let types: Vec<String> = s
            .types
            .iter()
            .map(|(t, n)| format!("{t} x{n} {}", human(s.type_bytes[t])))
            .collect();
        let _ = writeln!(
            o,
            "{:<16} {:>8} {:>14} {:>12}  {}",
            name,
            s.tensors,
            s.elements,
            human(s.bytes),
            types.join(", ")
        );
    }
    let _ = writeln!(
        o,
        "GGUF v{}, {} shard(s), {} in the file(s), {} of tensor data",
        i.version,
        i.shards,
        human(i.file_bytes),
        human(i.tensor_bytes)
    );
    o
}

/// What loading does with a GGUF model's block types, one line for `run`, `chat` and
/// `serve` to print: per class, the types of the matrices that change form and the form
/// they take on the device, as the loader holds them (`cfg` as the expert precision
/// applies to it: `ModelConfig::expert_kinds`; dense matrices by `gguf::native_kind`).
/// The kernels compute Q4_0, Q4_K, Q5_K, Q6_K, Q5_0/Q5_1 and Q8_0 blocks as they are;
/// other types are decoded on the CPU at load time into wgmoe's formats. Vectors (norms,
/// biases) and the gates (router, shared expert gate) are not listed.
/// The Hugging Face name of a GGUF shared-expert matrix (`blk.L.ffn_{gate,up,down}_shexp`).
fn shared_expert_hf_name(name: &str) -> Option<String> {
    let (layer, rest) = name.strip_prefix("blk.")?.split_once('.')?;
    let proj = ["gate", "up", "down"]
        .into_iter()
        .find(|p| rest == format!("ffn_{p}_shexp.weight"))?;
    Some(format!(
        "model.layers.{layer}.mlp.shared_expert.{proj}_proj.weight"
    ))
}

pub fn gguf_load_note(
    model: &crate::gguf::GgufModel,
    cfg: &crate::config::ModelConfig,
    int4_experts: bool,
    q8_dense: bool,
) -> String {
    use crate::blocks::quant::Q4Kind;
    use crate::gguf::native_kind;
    let form = |k: Q4Kind| match k {
        Q4Kind::Q8 => "Q8_0".to_string(),
        Q4Kind::Affine32 => "INT4 (affine, 32-column blocks)".to_string(),
        Q4Kind::Sym256 => "INT4 (block 256)".to_string(),
        k => k.name().to_string(),
    };
    let mut changed: BTreeMap<(TensorClass, String), BTreeMap<String, usize>> = BTreeMap::new();
    for name in model.names() {
        let Some(info) = model.info(name) else {
            continue;
        };
        let class = classify_gguf(name);
        let matrix = info.ne.get(1).is_some_and(|&r| r > 1);
        if !matrix || name.contains("ffn_gate_inp") {
            continue;
        }
        let ty = info.ggml_type;
        let (to, kept) = match class {
            TensorClass::RoutedExperts if int4_experts => {
                let layer = name
                    .strip_prefix("blk.")
                    .and_then(|r| r.split('.').next())
                    .and_then(|l| l.parse::<usize>().ok())
                    .unwrap_or(0);
                let k = cfg.expert_kinds(layer);
                let kind = if name.contains("ffn_down") {
                    k.down
                } else {
                    k.gate_up
                };
                let as_is =
                    native_kind(ty) == Some(kind) || (ty == GgmlType::Q8_0 && kind == Q4Kind::Q8);
                (form(kind), as_is)
            }
            TensorClass::RoutedExperts
            | TensorClass::Router
            | TensorClass::Norms
            | TensorClass::Embeddings => ("f16".to_string(), ty == GgmlType::F16),
            TensorClass::Attention | TensorClass::LmHead if q8_dense => match native_kind(ty) {
                Some(k) => (form(k), true),
                None => ("Q8_0".to_string(), ty == GgmlType::Q8_0),
            },
            // Shared experts in their own blocks (gate and up in one kind), as the loader's
            // `ModelConfig::dense_kind` says.
            TensorClass::SharedExperts if q8_dense => {
                let hf = shared_expert_hf_name(name);
                match hf.and_then(|n| cfg.dense_kind(&n)) {
                    Some(k) => (form(k), native_kind(ty) == Some(k)),
                    None => ("Q8_0".to_string(), ty == GgmlType::Q8_0),
                }
            }
            _ if q8_dense => ("Q8_0".to_string(), ty == GgmlType::Q8_0),
            _ => ("f16".to_string(), ty == GgmlType::F16),
        };
        if !kept {
            *changed
                .entry((class, to))
                .or_default()
                .entry(ty.name().to_string())
                .or_default() += 1;
        }
    }
    let parts: Vec<String> = changed
        .iter()
        .map(|((c, to), types)| {
            let name = serde_json::to_value(c)
                .ok()
                .and_then(|v| v.as_str().map(|s| s.replace('_', " ")))
                .unwrap_or_default();
            let list: Vec<String> = types.iter().map(|(t, n)| format!("{t} x{n}")).collect();
            format!("{name} {} -> {to}", list.join(", "))
        })
        .collect();
    if parts.is_empty() {
        return "GGUF tensors used in their stored types".to_string();
    }
    format!(
        "GGUF tensors converted at load time: {} (the kernels compute Q4_0, Q4_K, Q5_K, Q6_K, Q5_0/Q5_1 and Q8_0 blocks as they are; other types are decoded on the CPU first)",
        parts.join("; ")
    )
}

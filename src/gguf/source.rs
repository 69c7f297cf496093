//! A GGUF model's tensors under the Hugging Face names the loader reads
//! (`crate::format::checkpoint::Checkpoint` opens a GGUF file through this), so one loader
//! serves both formats.
//!
//! Each Hugging Face tensor is a byte range of one GGUF tensor, in the file's block type:
//! - a routed expert's `mlp.experts.E.{gate,up,down}_proj.weight` is expert E's slice of the
//!   3-D `ffn_{gate,up,down}_exps.weight` (of a fused `ffn_gate_up_exps`, the first or the
//!   second half of that slice);
//! - a fused `attn_qkv` gives q, k and v as row ranges (whole rows are whole blocks);
//! - the Q and K rows of `llama`-arch files are permuted by the converter
//!   ([`super::permute`]): their entries say so, and reading undoes it.
//!
//! ggml's `ne` is fastest-varying first; the shapes here are Hugging Face's (`[rows, cols]`).

use super::model::{GgufModel, TensorView};
use super::names::{blk, Experts, ModelTensors, Qkv};
use super::types::GgmlType;
use crate::config::{Arch, ModelConfig};
use crate::error::Result;

/// One Hugging Face tensor as bytes of a GGUF shard.
#[derive(Debug, Clone)]
pub struct HfTensor {
    pub name: String,
    /// Index into [`GgufModel::shards`].
    pub shard: usize,
    pub ty: GgmlType,
    /// Hugging Face order: `[rows, cols]`, or `[n]` for a vector.
    pub shape: Vec<usize>,
    /// Absolute byte range in the shard file.
    pub start: usize,
    pub end: usize,
    /// `Some(head_dim)`: the rows are in the converter's RoPE order and must be unpermuted.
    pub unpermute_head_dim: Option<usize>,
    /// The GGUF tensor it comes from (for messages).
    pub gguf_name: String,
}

/// Every tensor of `cfg`'s model in `model` under the loader's names. The names are
/// resolved and checked (present, shaped as the metadata says, of a supported type) by
/// [`ModelTensors::resolve`] first.
pub fn hf_tensors(model: &GgufModel, cfg: &ModelConfig) -> Result<Vec<HfTensor>> {
    let names = ModelTensors::resolve(model, cfg)?;
    let (q_dim, kv_dim) = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
    );
    let permuted = cfg.arch == Arch::Mixtral;
    let mut out = Vec::new();
    let one =
        |hf: String, gguf: &str, rows: std::ops::Range<usize>, permute: bool| -> Result<HfTensor> {
            slice(
                model,
                &model.tensor(gguf)?,
                hf,
                rows,
                permute.then_some(cfg.head_dim),
            )
        };
    let all = usize::MAX..usize::MAX;
    out.push(one(
        "model.embed_tokens.weight".into(),
        &names.token_embd,
        all.clone(),
        false,
    )?);
    out.push(one(
        "model.norm.weight".into(),
        &names.output_norm,
        all.clone(),
        false,
    )?);
    if let Some(o) = &names.output {
        out.push(one("lm_head.weight".into(), o, all.clone(), false)?);
    }
    for (l, lt) in names.layers.iter().enumerate() {
        let p = format!("model.layers.{l}");
        out.push(one(
            format!("{p}.input_layernorm.weight"),
            &lt.attn_norm,
            all.clone(),
            false,
        )?);
        out.push(one(
            format!("{p}.post_attention_layernorm.weight"),
            &lt.ffn_norm,
            all.clone(),
            false,
        )?);
        out.push(one(
            format!("{p}.self_attn.o_proj.weight"),
            &lt.attn_output,
            all.clone(),
            false,
        )?);
        let proj = ["q_proj", "k_proj", "v_proj"];
        match &lt.qkv {
            Qkv::Separate { q, k, v, bias } => {
                for (i, t) in [q, k, v].into_iter().enumerate() {
                    out.push(one(
                        format!("{p}.self_attn.{}.weight", proj[i]),
                        t,
                        all.clone(),
                        permuted && i < 2,
                    )?);
                }
                if let Some(b) = bias {
                    for (i, t) in b.iter().enumerate() {
                        out.push(one(
                            format!("{p}.self_attn.{}.bias", proj[i]),
                            t,
                            all.clone(),
                            false,
                        )?);
                    }
                }
            }
            Qkv::Fused { qkv, bias } => {
                let ranges = [
                    0..q_dim,
                    q_dim..q_dim + kv_dim,
                    q_dim + kv_dim..q_dim + 2 * kv_dim,
                ];
                for (i, r) in ranges.iter().enumerate() {
                    out.push(one(
                        format!("{p}.self_attn.{}.weight", proj[i]),
                        qkv,
                        r.clone(),
                        permuted && i < 2,
                    )?);
                    if let Some(b) = bias {
                        out.push(one(
                            format!("{p}.self_attn.{}.bias", proj[i]),
                            b,
                            r.clone(),
                            false,
                        )?);
                    }
                }
            }
        }
        if let Some(n) = &lt.attn_q_norm {
            out.push(one(
                format!("{p}.self_attn.q_norm.weight"),
                n,
                all.clone(),
                false,
            )?);
        }
        if let Some(n) = &lt.attn_k_norm {
            out.push(one(
                format!("{p}.self_attn.k_norm.weight"),
                n,
                all.clone(),
                false,
            )?);
        }
        out.push(one(
            format!("{p}.mlp.gate.weight"),
            &lt.ffn_gate_inp,
            all.clone(),
            false,
        )?);
        if let Some(s) = &lt.shared {
            out.push(one(
                format!("{p}.mlp.shared_expert.gate_proj.weight"),
                &s.gate,
                all.clone(),
                false,
            )?);
            out.push(one(
                format!("{p}.mlp.shared_expert.up_proj.weight"),
                &s.up,
                all.clone(),
                false,
            )?);
            out.push(one(
                format!("{p}.mlp.shared_expert.down_proj.weight"),
                &s.down,
                all.clone(),
                false,
            )?);
            let mut gate = slice(
                model,
                &model.tensor(&s.gate_inp)?,
                format!("{p}.mlp.shared_expert_gate.weight"),
                all.clone(),
                None,
            )?;
            gate.shape = vec![1, cfg.hidden_size];
            out.push(gate);
        }
        let ff = cfg.moe_intermediate;
        for e in 0..cfg.num_experts {
            let x = |s: &str| format!("{p}.mlp.experts.{e}.{s}.weight");
            match &lt.experts {
                Experts::Separate { gate, up, down } => {
                    out.push(expert(model, gate, e, x("gate_proj"), 0..ff)?);
                    out.push(expert(model, up, e, x("up_proj"), 0..ff)?);
                    out.push(expert(model, down, e, x("down_proj"), 0..cfg.hidden_size)?);
                }
                Experts::FusedGateUp { gate_up, down } => {
                    out.push(expert(model, gate_up, e, x("gate_proj"), 0..ff)?);
                    out.push(expert(model, gate_up, e, x("up_proj"), ff..2 * ff)?);
                    out.push(expert(model, down, e, x("down_proj"), 0..cfg.hidden_size)?);
                }
            }
        }
    }
    Ok(out)
}

/// The GGUF tensor names that hold layer `l`'s routed experts (for messages and inspect).
pub fn expert_tensor_prefix(l: usize) -> String {
    blk(l, "ffn_*_exps.weight")
}

/// Rows `rows` of expert `e` of a 3-D expert tensor.
fn expert(
    model: &GgufModel,
    gguf: &str,
    e: usize,
    hf: String,
    rows: std::ops::Range<usize>,
) -> Result<HfTensor> {
    let t = model.tensor(gguf)?.expert(e)?;
    slice(model, &t, hf, rows, None)
}

/// Rows `rows` of a 1-D or 2-D view (`usize::MAX..` for all of it).
fn slice(
    model: &GgufModel,
    t: &TensorView<'_>,
    hf: String,
    rows: std::ops::Range<usize>,
    unpermute_head_dim: Option<usize>,
) -> Result<HfTensor> {
    let shard = model
        .shards()
        .iter()
        .position(|s| s.path() == t.file)
        .ok_or_else(|| t.bad("is in no shard of the model"))?;
    let cols = t.cols() as usize;
    let vector = t.ne.iter().skip(1).all(|&d| d == 1);
    let row_bytes = t.row_bytes() as usize;
    let start = t.file_offset as usize;
    let (r0, n) = if rows.start == usize::MAX {
        (0, t.rows() as usize)
    } else {
        (rows.start, rows.len())
    };
    if r0 + n > t.rows() as usize {
        return Err(t.bad(format!(
            "rows {r0}..{} beyond its {} rows",
            r0 + n,
            t.rows()
        )));
    }
    // A vector (a norm or a bias) sliced by "rows" is sliced by elements.
    let (shape, s, e) = if vector {
        let eb = match t.ggml_type.block_elems() {
            1 => t.ggml_type.block_bytes(),
            _ => {
                return Err(t.bad(format!(
                    "is a vector of {} blocks; wgmoe reads vectors as F32, F16 or BF16",
                    t.ggml_type
                )))
            }
        };
        if rows.start == usize::MAX {
            (vec![cols], start, start + cols * eb)
        } else {
            (vec![n], start + r0 * eb, start + (r0 + n) * eb)
        }
    } else {
        (
            vec![n, cols],
            start + r0 * row_bytes,
            start + (r0 + n) * row_bytes,
        )
    };
    Ok(HfTensor {
        name: hf,
        shard,
        ty: t.ggml_type,
        shape,
        start: s,
        end: e,
        unpermute_head_dim,
        gguf_name: t.name.to_string(),
    })
}

//! llama.cpp's tensor names for the four families, and the check that a file holds exactly
//! the tensors the model needs, in the shapes its metadata implies, in types wgmoe computes
//! with.
//!
//! Shapes are ggml `ne` (fastest first): a `[out, in]` PyTorch weight is `ne = {in, out}`.
//! Routed experts are 3-D: `ffn_{gate,up}_exps` `{n_embd, n_ff, n_expert}`, `ffn_down_exps`
//! `{n_ff, n_embd, n_expert}`; a fused `ffn_gate_up_exps` is `{n_embd, 2 n_ff, n_expert}`
//! with each expert's gate rows first, then its up rows (llama-graph.cpp `build_moe_ffn`).
//! A fused `attn_qkv` is `{n_embd, q + k + v}` (q rows, then k, then v).
//!
//! HF -> GGUF: embed_tokens -> token_embd, lm_head -> output (absent when tied), norm ->
//! output_norm; per layer input_layernorm -> attn_norm, post_attention_layernorm ->
//! ffn_norm, q/k/v/o_proj -> attn_q/attn_k/attn_v/attn_output (+ .bias), q_norm/k_norm ->
//! attn_q_norm/attn_k_norm, the router (mlp.gate / block_sparse_moe.gate) -> ffn_gate_inp,
//! experts -> ffn_*_exps, Qwen2-MoE's shared_expert.* -> ffn_*_shexp and
//! shared_expert_gate -> ffn_gate_inp_shexp (ne `{n_embd}`: one output).

use crate::config::{Arch, ModelConfig, QkNorm};
use crate::error::{Error, Result};

use super::model::{GgufModel, TensorView};

pub const TOKEN_EMBD: &str = "token_embd.weight";
pub const OUTPUT_NORM: &str = "output_norm.weight";
pub const OUTPUT: &str = "output.weight";

/// `blk.{layer}.{suffix}`.
pub fn blk(layer: usize, suffix: &str) -> String {
    format!("blk.{layer}.{suffix}")
}

/// The attention projections: separate, or one fused `attn_qkv`.
#[derive(Debug, Clone, PartialEq)]
pub enum Qkv {
    Separate {
        q: String,
        k: String,
        v: String,
        /// q, k, v biases (Qwen2-MoE).
        bias: Option<[String; 3]>,
    },
    Fused {
        qkv: String,
        bias: Option<String>,
    },
}

/// Routed experts: gate and up apart, or fused.
#[derive(Debug, Clone, PartialEq)]
pub enum Experts {
    Separate {
        gate: String,
        up: String,
        down: String,
    },
    FusedGateUp {
        gate_up: String,
        down: String,
    },
}

/// Qwen2-MoE's shared expert and its sigmoid gate.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedExpert {
    pub gate: String,
    pub up: String,
    pub down: String,
    /// `ffn_gate_inp_shexp.weight`, ne `{n_embd}`.
    pub gate_inp: String,
}

/// The tensors of one layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerTensors {
    pub attn_norm: String,
    pub qkv: Qkv,
    pub attn_output: String,
    /// OLMoE (over the projection) and Qwen3-MoE (per head).
    pub attn_q_norm: Option<String>,
    pub attn_k_norm: Option<String>,
    pub ffn_norm: String,
    /// The router, ne `{n_embd, n_expert}`.
    pub ffn_gate_inp: String,
    pub experts: Experts,
    pub shared: Option<SharedExpert>,
}

/// Every tensor a model needs, by role, all checked present with the right shape and a
/// supported type.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelTensors {
    pub token_embd: String,
    pub output_norm: String,
    /// `output.weight`; None when the embeddings are tied (llama.cpp then uses token_embd).
    pub output: Option<String>,
    pub layers: Vec<LayerTensors>,
}

/// Rows of `token_embd.weight` (the vocabulary the model computes logits for).
pub fn vocab_rows(model: &GgufModel, hidden: usize) -> Result<usize> {
    let t = model.tensor(TOKEN_EMBD)?;
    if t.ne.len() != 2 || t.ne[0] != hidden as u64 {
        return Err(t.bad(format!(
            "shape {:?}, expected {{{hidden}, n_vocab}} (embedding_length {hidden})",
            t.ne
        )));
    }
    usize::try_from(t.ne[1]).map_err(|_| t.bad("too many rows"))
}

impl ModelTensors {
    /// The tensor names of `cfg`'s model in `model`, each checked: present, shaped as the
    /// metadata implies, of a supported type. A tensor the model does not use is refused
    /// (it may be a computation wgmoe does not implement).
    pub fn resolve(model: &GgufModel, cfg: &ModelConfig) -> Result<Self> {
        let e = cfg.hidden_size as u64;
        let q = (cfg.num_heads * cfg.head_dim) as u64;
        let kv = (cfg.num_kv_heads * cfg.head_dim) as u64;
        let ff = cfg.moe_intermediate as u64;
        let n_exp = cfg.num_experts as u64;
        let vocab = cfg.vocab_size as u64;
        let mut used: Vec<String> = Vec::new();
        let mut need = |name: &str, ne: &[u64]| -> Result<()> {
            check(model.tensor(name)?, ne)?;
            used.push(name.to_string());
            Ok(())
        };
        need(TOKEN_EMBD, &[e, vocab])?;
        need(OUTPUT_NORM, &[e])?;
        let output = if model.contains(OUTPUT) {
            need(OUTPUT, &[e, vocab])?;
            Some(OUTPUT.to_string())
        } else {
            None
        };
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let n = |s: &str| blk(l, s);
            need(&n("attn_norm.weight"), &[e])?;
            let qkv = if model.contains(&n("attn_qkv.weight")) {
                need(&n("attn_qkv.weight"), &[e, q + 2 * kv])?;
                let bias = if model.contains(&n("attn_qkv.bias")) {
                    need(&n("attn_qkv.bias"), &[q + 2 * kv])?;
                    Some(n("attn_qkv.bias"))
                } else {
                    None
                };
                Qkv::Fused {
                    qkv: n("attn_qkv.weight"),
                    bias,
                }
            } else {
                need(&n("attn_q.weight"), &[e, q])?;
                need(&n("attn_k.weight"), &[e, kv])?;
                need(&n("attn_v.weight"), &[e, kv])?;
                let bias = if cfg.qkv_bias {
                    need(&n("attn_q.bias"), &[q])?;
                    need(&n("attn_k.bias"), &[kv])?;
                    need(&n("attn_v.bias"), &[kv])?;
                    Some([n("attn_q.bias"), n("attn_k.bias"), n("attn_v.bias")])
                } else {
                    None
                };
                Qkv::Separate {
                    q: n("attn_q.weight"),
                    k: n("attn_k.weight"),
                    v: n("attn_v.weight"),
                    bias,
                }
            };
            need(&n("attn_output.weight"), &[q, e])?;
            let (qn, kn) = match cfg.qk_norm {
                QkNorm::None => (None, None),
                QkNorm::Projection => (Some(q), Some(kv)),
                QkNorm::PerHead => (Some(cfg.head_dim as u64), Some(cfg.head_dim as u64)),
            };
            let mut norm = |s: &str, len: Option<u64>| -> Result<Option<String>> {
                match len {
                    Some(len) => {
                        need(&n(s), &[len])?;
                        Ok(Some(n(s)))
                    }
                    None => Ok(None),
                }
            };
            let attn_q_norm = norm("attn_q_norm.weight", qn)?;
            let attn_k_norm = norm("attn_k_norm.weight", kn)?;
            need(&n("ffn_norm.weight"), &[e])?;
            need(&n("ffn_gate_inp.weight"), &[e, n_exp])?;
            let experts = if model.contains(&n("ffn_gate_up_exps.weight")) {
                need(&n("ffn_gate_up_exps.weight"), &[e, 2 * ff, n_exp])?;
                need(&n("ffn_down_exps.weight"), &[ff, e, n_exp])?;
                Experts::FusedGateUp {
                    gate_up: n("ffn_gate_up_exps.weight"),
                    down: n("ffn_down_exps.weight"),
                }
            } else {
                if model.contains(&n("ffn_gate.0.weight")) {
                    return Err(Error::BadTensor {
                        path: model.path().to_path_buf(),
                        name: n("ffn_gate.0.weight"),
                        msg: "one tensor per expert is the layout of early Mixtral GGUF files, which wgmoe does not read; convert the model again with a current llama.cpp".into(),
                    });
                }
                need(&n("ffn_gate_exps.weight"), &[e, ff, n_exp])?;
                need(&n("ffn_up_exps.weight"), &[e, ff, n_exp])?;
                need(&n("ffn_down_exps.weight"), &[ff, e, n_exp])?;
                Experts::Separate {
                    gate: n("ffn_gate_exps.weight"),
                    up: n("ffn_up_exps.weight"),
                    down: n("ffn_down_exps.weight"),
                }
            };
            let shared = match (cfg.arch, cfg.shared_expert_intermediate) {
                (Arch::Qwen2Moe, Some(sff)) => {
                    let sff = sff as u64;
                    need(&n("ffn_gate_shexp.weight"), &[e, sff])?;
                    need(&n("ffn_up_shexp.weight"), &[e, sff])?;
                    need(&n("ffn_down_shexp.weight"), &[sff, e])?;
                    need(&n("ffn_gate_inp_shexp.weight"), &[e])?;
                    Some(SharedExpert {
                        gate: n("ffn_gate_shexp.weight"),
                        up: n("ffn_up_shexp.weight"),
                        down: n("ffn_down_shexp.weight"),
                        gate_inp: n("ffn_gate_inp_shexp.weight"),
                    })
                }
                _ => None,
            };
            layers.push(LayerTensors {
                attn_norm: n("attn_norm.weight"),
                qkv,
                attn_output: n("attn_output.weight"),
                attn_q_norm,
                attn_k_norm,
                ffn_norm: n("ffn_norm.weight"),
                ffn_gate_inp: n("ffn_gate_inp.weight"),
                experts,
                shared,
            });
        }
        let used: std::collections::BTreeSet<String> = used.into_iter().collect();
        if let Some(extra) = model.names().find(|n| !used.contains(*n)) {
            return Err(Error::BadTensor {
                path: model.path().to_path_buf(),
                name: extra.to_string(),
                msg: format!(
                    "is not a tensor of a {} model as wgmoe implements it (block_count {}, expert_count {}); it is refused rather than ignored",
                    cfg.arch, cfg.num_layers, cfg.num_experts
                ),
            });
        }
        Ok(ModelTensors {
            token_embd: TOKEN_EMBD.to_string(),
            output_norm: OUTPUT_NORM.to_string(),
            output,
            layers,
        })
    }

    /// The lm_head: `output.weight`, or `token_embd.weight` when tied.
    pub fn lm_head(&self) -> &str {
        self.output.as_deref().unwrap_or(&self.token_embd)
    }
}

/// Shapes compare as ggml does: trailing extents of 1 do not count (the converter writes
/// Qwen2-MoE's shared-expert gate as `{n_embd, 1}` where llama.cpp asks for `{n_embd}`).
fn check(t: TensorView<'_>, ne: &[u64]) -> Result<()> {
    fn trim(ne: &[u64]) -> &[u64] {
        let n = ne.iter().rposition(|&d| d != 1).map_or(0, |i| i + 1);
        &ne[..n]
    }
    if trim(t.ne) != trim(ne) {
        return Err(t.bad(format!(
            "shape (ne) {:?}, expected {:?} from the metadata",
            t.ne, ne
        )));
    }
    t.require_supported()
}

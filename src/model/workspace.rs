//! The workspace of the forward pass: every activation buffer, the KV cache, the RoPE table
//! and the readback buffers, as one table. `Forward::new` allocates exactly these rows and
//! admission control (and `inspect --max-context`) adds them up before anything is
//! allocated, so the two cannot disagree.

use crate::backend::kernel::KvFormat;
use crate::backend::params::UNIFORM_WINDOW_BYTES;
use crate::backend::Usage;
use crate::config::{Arch, ModelConfig};
use crate::error::{Error, Result};

/// What the workspace is sized for.
#[derive(Clone, Copy, Debug)]
pub struct WorkspaceShape {
    /// Positions the KV cache holds.
    pub max_context: usize,
    /// Tokens per submission (after `effective_chunk`).
    pub chunk: usize,
    /// Logits of every position of a chunk (tests, evaluation), not only the last.
    pub all_logits: bool,
    /// Logits rows at least (the server's prompt scoring reads that many positions of a
    /// chunk at once; 0: none beyond the others), at most the chunk.
    pub score_rows: usize,
    /// Most sequences of a batched step (`serve --parallel`): the logits hold that many
    /// rows at least.
    pub batch: usize,
    /// The expert-major prefill buffers (window kernels, INT4, grouped executor). `None`:
    /// not known yet (no device): counted, as an upper bound.
    pub expert_major: Option<bool>,
    /// Some routed experts run on the CPU: their weighted sum is written into `host_y`
    /// and each layer's routing readback also carries the router weights and the experts'
    /// input.
    pub host_experts: bool,
    /// How the KV cache holds keys and values (f32, or f16: half the bytes).
    pub kv: KvFormat,
}

/// One buffer of the workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkspaceBuffer {
    pub name: String,
    pub bytes: u64,
    pub usage: Usage,
}

/// The prefill chunk a forward pass really uses: at least 1, at most the context, and
/// small enough that a chunk's attention scratch (heads x chunk x context floats) fits one
/// storage binding of `binding_limit` bytes (when known).
pub fn effective_chunk(
    cfg: &ModelConfig,
    max_context: usize,
    chunk: usize,
    binding_limit: Option<u64>,
) -> usize {
    let ctxlen = max_context.max(1) as u64;
    let max_chunk = match binding_limit {
        Some(b) => (b / (cfg.num_heads as u64 * ctxlen * 4).max(1)).max(1),
        None => u64::MAX,
    };
    (chunk as u64).clamp(1, max_chunk).min(ctxlen) as usize
}

/// Floats of one router row: the experts, plus Qwen's shared-expert gate logit.
pub fn router_stride(cfg: &ModelConfig) -> usize {
    cfg.num_experts
        + usize::from(cfg.arch == Arch::Qwen2Moe && cfg.shared_expert_intermediate.is_some())
}

/// Widest SwiGLU intermediate of a step's token: k routed experts, the shared expert or a
/// dense MLP.
pub fn intermediate_width(cfg: &ModelConfig) -> usize {
    (cfg.top_k * cfg.moe_intermediate)
        .max(cfg.shared_expert_intermediate.unwrap_or(0))
        .max(cfg.dense_intermediate)
}

/// Row strides (floats) of the expert-major buffers: hidden and intermediate rounded up to
/// the kernels' 32-wide vec4 groups.
pub fn sorted_rows(cfg: &ModelConfig) -> (usize, usize) {
    (
        cfg.hidden_size.next_multiple_of(32),
        cfg.moe_intermediate.next_multiple_of(32),
    )
}

/// Bytes reserved for the kernels' parameter uniforms (one small buffer per dispatch).
pub fn params_allowance(cfg: &ModelConfig) -> u64 {
    8192 + cfg.num_layers as u64 * 4096
}

struct Table {
    rows: Vec<WorkspaceBuffer>,
}

impl Table {
    fn add(&mut self, name: impl Into<String>, usage: Usage, factors: &[usize]) -> Result<()> {
        self.add_of(name, usage, 4, factors)
    }

    /// A buffer of `elem` bytes per element.
    fn add_of(
        &mut self,
        name: impl Into<String>,
        usage: Usage,
        elem: u64,
        factors: &[usize],
    ) -> Result<()> {
        let name = name.into();
        let mut bytes: u64 = elem;
        for &f in factors {
            bytes = bytes.checked_mul(f as u64).ok_or_else(|| {
                Error::DoesNotFit(format!("the {name} buffer's size overflows 64 bits"))
            })?;
        }
        if usage == Usage::Window {
            // Room for a 64 KiB window starting at any row of the data.
            bytes = bytes.saturating_add(UNIFORM_WINDOW_BYTES as u64);
        }
        self.rows.push(WorkspaceBuffer { name, bytes, usage });
        Ok(())
    }
}

/// Rows of the logits buffer: every position of a chunk of `t` (`all_logits`), else the
/// larger of a batched step's sequences and the scoring rows, at most the chunk.
pub fn logit_rows(all_logits: bool, t: usize, batch: usize, score_rows: usize) -> usize {
    if all_logits {
        t.max(batch)
    } else {
        batch.max(score_rows.min(t)).max(1)
    }
}

/// Every buffer of the workspace (sizes as requested; the device rounds to 16 bytes).
pub fn workspace(cfg: &ModelConfig, s: &WorkspaceShape) -> Result<Vec<WorkspaceBuffer>> {
    let (h, v, k) = (cfg.hidden_size, cfg.vocab_size, cfg.top_k);
    let q_dim = cfg.num_heads * cfg.head_dim;
    let kv_dim = cfg.num_kv_heads * cfg.head_dim;
    let ctxlen = s.max_context.max(1);
    let t = s.chunk.max(1);
    let logit_rows = logit_rows(s.all_logits, t, s.batch, s.score_rows);
    let mut w = Table { rows: Vec::new() };
    use Usage::*;
    w.add("ids", Storage, &[t])?;
    w.add("x", Storage, &[t, h])?;
    // Activations the one-token and window kernels bind as uniform windows.
    w.add("xn", Window, &[t, h])?;
    w.add("qkv", Storage, &[t, q_dim + 2 * kv_dim])?;
    w.add("q", Storage, &[t, q_dim])?;
    w.add("attn_out", Window, &[t, q_dim])?;
    w.add("attn_scratch", Storage, &[t, cfg.num_heads, ctxlen])?;
    w.add(
        "attn_part",
        Storage,
        &[crate::model::ops::flash_part_floats(
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            ctxlen,
            t,
        )],
    )?;
    // One-token steps on GPUs split the router's columns into partial rows.
    let router_rows = t.max(crate::model::ops::router_splits(router_stride(cfg), h));
    w.add("router_logits", Storage, &[router_rows, router_stride(cfg)])?;
    w.add("topk_ids", Storage, &[t, k])?;
    if s.batch > 1 {
        // Batched steps' per-token MLP blocks (`model::solo`).
        w.add("solo_row", Storage, &[h.max(router_stride(cfg)).max(k)])?;
        w.add("solo_x0", Storage, &[h])?;
    }
    w.add("topk_weights", Storage, &[t, k])?;
    // The next MoE layer's router on this layer's hidden state (one-token steps): its
    // logits and its top-k' guess, k' at most every expert (`--prefetch next-layer`).
    w.add(
        "predict_logits",
        Storage,
        &[router_rows, router_stride(cfg)],
    )?;
    w.add("predict_ids", Storage, &[cfg.num_experts])?;
    w.add("predict_weights", Storage, &[cfg.num_experts])?;
    w.add("ffn_h", Window, &[t, intermediate_width(cfg)])?;
    w.add("ffn_y", Storage, &[t, k, h])?;
    w.add("shared_y", Storage, &[t, h])?;
    w.add("x_final", Window, &[t, h])?;
    w.add("logits", Storage, &[logit_rows, v])?;
    // The split argmax's parts: (value bits, index, non-finite, 0) per workgroup.
    w.add(
        "argmax_part",
        Storage,
        &[crate::model::ops::argmax_parts(v), 4],
    )?;
    w.add("dummy", Storage, &[4])?;
    // One readback buffer per step a pipelined generation keeps in flight (each is mapped
    // on its own while later steps run).
    for i in 0..crate::model::MAX_PIPELINE_DEPTH {
        w.add(format!("token_ring.{i}"), Readback, &[4])?;
    }
    // Per routed layer: the router's ids and weights (the weights used by CPU experts and
    // traces; CPU experts also read the experts' input xn), then the next layer's guess,
    // read back in one copy.
    let e = cfg.num_experts;
    if s.host_experts {
        w.add("route_readback", Readback, &[t * (2 * k + h) + e])?;
        w.add("host_y", Storage, &[t, h])?;
    } else {
        w.add("route_readback", Readback, &[t * 2 * k + e])?;
    }
    // cos/sin per position and rotated pair.
    w.add("rope", Storage, &[ctxlen, cfg.head_dim])?;
    for l in 0..cfg.num_layers {
        let row = s.kv.row_bytes(kv_dim, cfg.head_dim);
        w.add_of(format!("cache_k.{l}"), Storage, 4, &[ctxlen, row / 4])?;
        w.add_of(format!("cache_v.{l}"), Storage, 4, &[ctxlen, row / 4])?;
    }
    if t > 1 {
        // The step's pairs sorted by expert: the expert-major kernels (CPU adapters) and the
        // tiled expert GEMMs (GPUs) read them.
        let pmax = t * k;
        w.add("moe_pairs", Storage, &[2 * pmax + cfg.num_experts])?;
        if s.expert_major.unwrap_or(true) {
            let (x_row, h_row) = sorted_rows(cfg);
            w.add("moe_x_sorted", Storage, &[pmax, x_row])?;
            w.add("moe_h_sorted", Storage, &[pmax, h_row])?;
        }
    }
    Ok(w.rows)
}

impl WorkspaceBuffer {
    /// Bytes as the device allocates them (rounded up to 16).
    pub fn device_bytes(&self) -> u64 {
        self.bytes.max(16).div_ceil(16) * 16
    }

    /// A row of the KV cache (keys or values of one layer).
    pub fn is_kv_cache(&self) -> bool {
        self.name.starts_with("cache_")
    }
}

/// The shape admission, `inspect` and `plan` count before any device exists: the chunk as
/// far as it is known without the binding limit, and the expert-major buffers counted.
pub fn planned_shape(
    cfg: &ModelConfig,
    max_context: usize,
    chunk: usize,
    all_logits: bool,
    host_experts: bool,
) -> WorkspaceShape {
    WorkspaceShape {
        max_context,
        chunk: effective_chunk(cfg, max_context, chunk, None),
        all_logits,
        score_rows: 0,
        batch: 1,
        // Not known before the device: counted, as an upper bound.
        expert_major: None,
        host_experts,
        kv: KvFormat::F32,
    }
}

/// Bytes of the workspace as the device allocates it (rows rounded to 16 bytes), plus the
/// parameter uniforms' allowance and the step uniform.
pub fn workspace_bytes(cfg: &ModelConfig, s: &WorkspaceShape) -> Result<u64> {
    let rows = workspace(cfg, s)?;
    let mut total = params_allowance(cfg) + 16;
    for r in rows {
        total = total
            .checked_add(r.device_bytes())
            .ok_or_else(|| Error::DoesNotFit("the workspace's size overflows 64 bits".into()))?;
    }
    Ok(total)
}

/// The KV cache's bytes within [`workspace_bytes`] (the table holds it, reports show it
/// apart).
pub fn kv_cache_bytes(cfg: &ModelConfig, s: &WorkspaceShape) -> Result<u64> {
    Ok(workspace(cfg, s)?
        .iter()
        .filter(|r| r.is_kv_cache())
        .map(|r| r.device_bytes())
        .sum())
}

/// Find a row of the table by name.
pub fn row<'a>(rows: &'a [WorkspaceBuffer], name: &str) -> Result<&'a WorkspaceBuffer> {
    rows.iter()
        .find(|r| r.name == name)
        .ok_or_else(|| Error::Other(format!("internal: workspace has no `{name}` buffer")))
}

/// Refuse a context (KV-cache positions) and prefill chunk whose KV cache and workspace
/// would not even be countable: an upper bound of every term of
/// `workspace_bytes`, in u128, must stay below 2^62 bytes, so that function's
/// arithmetic cannot overflow. (Whether the bytes fit the adapter is admission's job.)
pub fn check_context(cfg: &ModelConfig, max_context: usize, chunk: usize) -> Result<()> {
    let c = max_context.max(1) as u128;
    let t = (chunk as u128).clamp(1, c);
    let (h, v, k, e) = (
        cfg.hidden_size as u128,
        cfg.vocab_size as u128,
        cfg.top_k as u128,
        cfg.num_experts as u128,
    );
    let hd = cfg.head_dim as u128;
    let q = cfg.num_heads as u128 * hd;
    let kv = cfg.num_kv_heads as u128 * hd;
    let layers = cfg.num_layers as u128;
    let inter = (cfg.moe_intermediate as u128)
        .max(cfg.shared_expert_intermediate.unwrap_or(0) as u128)
        .max(cfg.dense_intermediate as u128);
    let per_token = 4 * h
        + 2 * e
        + 3 * q
        + 2 * kv
        + cfg.num_heads as u128 * c
        + e
        + 2 * k
        + 2
        + k * (inter + h)
        + inter
        + v;
    // Expert-major prefill buffers: per (token, top-k) pair an input and an output row.
    let sorted = t * k * (2 * h + 2 * inter + 1024) + e;
    let floats = t * per_token + c * hd + layers * 2 * c * kv + sorted + layers * (e + 4096);
    let bytes = floats * 4 + (1 << 22);
    if bytes >= 1 << 62 {
        return Err(Error::DoesNotFit(format!(
            "a context of {max_context} positions (prefill chunk {chunk}) needs about {} bytes of KV cache and workspace (more than 2^62)",
            bytes
        )));
    }
    Ok(())
}

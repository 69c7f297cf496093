//! A plain CPU reference of every WGSL kernel, the oracle of `tests/kernels.rs`.
//!
//! Same semantics as the shaders, written as directly as possible: f32 math, f16 weights
//! given unpadded and row-major (`[rows, cols]`), activations as row-major `[T, ...]`
//! slices. Strides, chunking, padding and flags such as "last token only" are the GPU's
//! business; a test selects the rows it needs. Each function names the transformers line
//! it mirrors. Shapes are checked and reported as errors, never as panics.

use half::f16;

use crate::blocks::q8_0::Q8Matrix;
use crate::blocks::quant::{Q4Matrix, Q4SlotLayout};
use crate::error::{Error, Result};

fn need(what: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::Other(format!(
            "cpu_ref: {what} has {got} values, expected {want}"
        )))
    }
}

fn rows_of(what: &str, len: usize, width: usize) -> Result<usize> {
    if width == 0 || !len.is_multiple_of(width) {
        return Err(Error::Other(format!(
            "cpu_ref: {what} of {len} values is not whole rows of {width}"
        )));
    }
    Ok(len / width)
}

fn dot<W: Copy + Into<f32>>(a: &[f32], w: &[W]) -> f32 {
    a.iter().zip(w).map(|(x, &w)| x * w.into()).sum()
}

/// `x * sigmoid(x)` (transformers' `ACT2FN["silu"]`).
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Rows `ids` of an f16 `[vocab, hidden]` table, as f32 `[T, hidden]`.
/// Mirrors `inputs_embeds = self.embed_tokens(input_ids)`.
pub fn embed(table: &[f16], hidden: usize, ids: &[u32]) -> Result<Vec<f32>> {
    let vocab = rows_of("embedding table", table.len(), hidden)?;
    let mut out = Vec::with_capacity(ids.len() * hidden);
    for &id in ids {
        let id = id as usize;
        if id >= vocab {
            return Err(Error::Other(format!(
                "cpu_ref: token id {id} outside a vocabulary of {vocab}"
            )));
        }
        out.extend(
            table[id * hidden..(id + 1) * hidden]
                .iter()
                .map(|w| w.to_f32()),
        );
    }
    Ok(out)
}

/// RMSNorm of each row of `x` ([T, n]). Mirrors OlmoeRMSNorm / Qwen2MoeRMSNorm:
/// `variance = hidden_states.pow(2).mean(-1, keepdim=True)`,
/// `hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)`,
/// `return self.weight * hidden_states.to(input_dtype)`.
pub fn rmsnorm(x: &[f32], weight: &[f16], eps: f32) -> Result<Vec<f32>> {
    let n = weight.len();
    rows_of("rmsnorm input", x.len(), n)?;
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(n) {
        let variance = row.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let inv = 1.0 / (variance + eps).sqrt();
        out.extend(row.iter().zip(weight).map(|(v, w)| w.to_f32() * (v * inv)));
    }
    Ok(out)
}

/// `x [T, K] · W[N, K]^T (+ bias) (+ accumulate_into)`, as `[T, N]`.
/// Mirrors `nn.Linear`: `F.linear(input, self.weight, self.bias)`; `accumulate_into` is the
/// residual add that follows o_proj (`hidden_states = residual + hidden_states`).
pub fn matmul<W: Copy + Into<f32>>(
    x: &[f32],
    k: usize,
    w: &[W],
    n: usize,
    bias: Option<&[f32]>,
    accumulate_into: Option<&[f32]>,
) -> Result<Vec<f32>> {
    let t = rows_of("matmul input", x.len(), k)?;
    need("matmul weight", w.len(), n * k)?;
    if let Some(b) = bias {
        need("matmul bias", b.len(), n)?;
    }
    if let Some(acc) = accumulate_into {
        need("matmul accumulator", acc.len(), t * n)?;
    }
    let mut out = Vec::with_capacity(t * n);
    for ti in 0..t {
        let xr = &x[ti * k..(ti + 1) * k];
        for r in 0..n {
            let mut v = dot(xr, &w[r * k..(r + 1) * k]);
            if let Some(b) = bias {
                v += b[r];
            }
            if let Some(acc) = accumulate_into {
                v += acc[ti * n + r];
            }
            out.push(v);
        }
    }
    Ok(out)
}

/// `matmul` with a packed Q8_0 weight (`blocks::q8_0`: quants `q`, scales `s`): the W8A16
/// kernels' reference, over the dequantised values q * f32(d).
pub fn matmul_q8(
    x: &[f32],
    m: Q8Matrix,
    q: &[u8],
    s: &[u8],
    bias: Option<&[f32]>,
    accumulate_into: Option<&[f32]>,
) -> Result<Vec<f32>> {
    need("matmul_q8 quants", q.len(), m.q_bytes())?;
    need("matmul_q8 scales", s.len(), m.scale_bytes())?;
    matmul(x, m.inp, &m.dequantize(q, s), m.out, bias, accumulate_into)
}

/// Attention head layout shared by `rope_kv` and `attention`.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
}

impl Heads {
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv * self.head_dim
    }
    pub fn qkv_dim(&self) -> usize {
        self.q_dim() + 2 * self.kv_dim()
    }
}

/// OLMoE's q_norm / k_norm: RMSNorm over the whole q (`n_heads * head_dim`) and k
/// (`n_kv * head_dim`) projections, not per head.
#[derive(Clone, Copy, Debug)]
pub struct QkNorm<'a> {
    pub q: &'a [f16],
    pub k: &'a [f16],
    pub eps: f32,
    /// Each head over head_dim with one weight vector of head_dim values (Qwen3), rather
    /// than the whole projection (OLMoE).
    pub per_head: bool,
}

/// rotate_half RoPE of one head in place, with the (cos, sin) pairs of one position
/// (`rope_row`: `head_dim / 2` pairs, as `model::forward::rope_table`).
/// Mirrors `q_embed = (q * cos) + (rotate_half(q) * sin)`.
fn rotate(head: &mut [f32], rope_row: &[f32]) {
    let half = head.len() / 2;
    for i in 0..half {
        let (cos, sin) = (rope_row[2 * i], rope_row[2 * i + 1]);
        let (a, b) = (head[i], head[i + half]);
        head[i] = a * cos - b * sin;
        head[i + half] = b * cos + a * sin;
    }
}

/// Split fused `qkv` rows ([T, q_dim + 2 kv_dim]) into q, k, v; optionally RMSNorm q and k
/// over the whole projection, clip all three to [-clip, clip], apply RoPE to q and k at
/// position `pos0 + t`, and store k and v in row `pos0 + t` of the caches
/// ([positions, kv_dim]). Returns the rotated q, [T, q_dim]. `rope` is
/// `model::forward::rope_table(theta, head_dim, rows)`. Mirrors OlmoeAttention.forward:
/// `query_states = self.q_norm(self.q_proj(hidden_states))`,
/// `query_states.clamp_(min=-self.config.clip_qkv, max=self.config.clip_qkv)`,
/// `query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)`,
/// `key_states, value_states = past_key_value.update(key_states, value_states, ...)`.
#[allow(clippy::too_many_arguments)]
pub fn rope_kv(
    qkv: &[f32],
    heads: Heads,
    qk_norm: Option<QkNorm<'_>>,
    clip: Option<f32>,
    rope: &[f32],
    pos0: usize,
    cache_k: &mut [f32],
    cache_v: &mut [f32],
) -> Result<Vec<f32>> {
    let (q_dim, kv_dim, hd) = (heads.q_dim(), heads.kv_dim(), heads.head_dim);
    let t = rows_of("rope_kv qkv", qkv.len(), heads.qkv_dim())?;
    let rope_rows = rows_of("rope table", rope.len(), hd)?;
    let positions = rows_of("k cache", cache_k.len(), kv_dim)?;
    need("v cache", cache_v.len(), cache_k.len())?;
    if pos0 + t > positions.min(rope_rows) {
        return Err(Error::Other(format!(
            "cpu_ref: positions up to {} exceed the cache ({positions}) or the rope table ({rope_rows})",
            pos0 + t
        )));
    }
    if let Some(n) = &qk_norm {
        let (qn, kn) = if n.per_head {
            (hd, hd)
        } else {
            (q_dim, kv_dim)
        };
        need("q_norm weight", n.q.len(), qn)?;
        need("k_norm weight", n.k.len(), kn)?;
    }
    let clamp = |v: f32| clip.map_or(v, |c| v.clamp(-c, c));
    let mut q_out = Vec::with_capacity(t * q_dim);
    for (ti, row) in qkv.chunks(heads.qkv_dim()).enumerate() {
        let (mut q, mut k) = (row[..q_dim].to_vec(), row[q_dim..q_dim + kv_dim].to_vec());
        let v = &row[q_dim + kv_dim..];
        if let Some(n) = &qk_norm {
            // rmsnorm normalises each row of the weight's length: the whole projection, or
            // (per head) each head.
            q = rmsnorm(&q, n.q, n.eps)?;
            k = rmsnorm(&k, n.k, n.eps)?;
        }
        q.iter_mut().for_each(|x| *x = clamp(*x));
        k.iter_mut().for_each(|x| *x = clamp(*x));
        let pos = pos0 + ti;
        let rope_row = &rope[pos * hd..(pos + 1) * hd];
        q.chunks_mut(hd).for_each(|h| rotate(h, rope_row));
        k.chunks_mut(hd).for_each(|h| rotate(h, rope_row));
        q_out.extend_from_slice(&q);
        cache_k[pos * kv_dim..(pos + 1) * kv_dim].copy_from_slice(&k);
        for (c, x) in cache_v[pos * kv_dim..(pos + 1) * kv_dim].iter_mut().zip(v) {
            *c = clamp(*x);
        }
    }
    Ok(q_out)
}

/// Causal attention of q ([T, q_dim], tokens at positions pos0..pos0+T) over cache rows
/// 0..=pos0+t; query head h reads kv head h / (n_heads / n_kv). Returns [T, q_dim].
/// Mirrors eager_attention_forward:
/// `key_states = repeat_kv(key, module.num_key_value_groups)`,
/// `attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling`,
/// `attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32)`,
/// `attn_output = torch.matmul(attn_weights, value_states)`, with `scaling = head_dim**-0.5`.
pub fn attention(
    q: &[f32],
    heads: Heads,
    cache_k: &[f32],
    cache_v: &[f32],
    pos0: usize,
) -> Result<Vec<f32>> {
    let (q_dim, kv_dim, hd) = (heads.q_dim(), heads.kv_dim(), heads.head_dim);
    let t = rows_of("attention q", q.len(), q_dim)?;
    let positions = rows_of("k cache", cache_k.len(), kv_dim)?;
    need("v cache", cache_v.len(), cache_k.len())?;
    if heads.n_kv == 0 || !heads.n_heads.is_multiple_of(heads.n_kv) || pos0 + t > positions {
        return Err(Error::Other(format!(
            "cpu_ref: attention shape {heads:?}, pos0 {pos0}, {t} tokens, {positions} cached"
        )));
    }
    let group = heads.n_heads / heads.n_kv;
    let scale = (hd as f32).powf(-0.5);
    let mut out = vec![0.0f32; t * q_dim];
    for ti in 0..t {
        let n_keys = pos0 + ti + 1;
        for h in 0..heads.n_heads {
            let kvh = h / group;
            let qh = &q[ti * q_dim + h * hd..][..hd];
            let scores: Vec<f32> = (0..n_keys)
                .map(|j| {
                    let kh = &cache_k[j * kv_dim + kvh * hd..][..hd];
                    qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f32>() * scale
                })
                .collect();
            let p = softmax(&scores);
            let o = &mut out[ti * q_dim + h * hd..][..hd];
            for (j, pj) in p.iter().enumerate() {
                let vh = &cache_v[j * kv_dim + kvh * hd..][..hd];
                o.iter_mut().zip(vh).for_each(|(o, v)| *o += pj * v);
            }
        }
    }
    Ok(out)
}

/// Softmax in f32 with the maximum subtracted first.
pub fn softmax(x: &[f32]) -> Vec<f32> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = x.iter().map(|v| (v - m).exp()).collect();
    let s: f32 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

/// Per token: softmax over the first `n_experts` of a logits row (`stride` floats per row),
/// the `top_k` most probable experts (lowest index on ties) and their weights, optionally
/// renormalised to sum to 1. Returns (ids, weights), each [T, top_k]. Mirrors
/// `routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)`,
/// `routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)`,
/// `if self.norm_topk_prob: routing_weights /= routing_weights.sum(dim=-1, keepdim=True)`.
pub fn router_topk(
    logits: &[f32],
    stride: usize,
    n_experts: usize,
    top_k: usize,
    norm_topk: bool,
) -> Result<(Vec<u32>, Vec<f32>)> {
    let t = rows_of("router logits", logits.len(), stride)?;
    if n_experts > stride || top_k > n_experts {
        return Err(Error::Other(format!(
            "cpu_ref: top {top_k} of {n_experts} experts, row stride {stride}"
        )));
    }
    let (mut ids, mut weights) = (Vec::new(), Vec::new());
    for ti in 0..t {
        let probs = softmax(&logits[ti * stride..ti * stride + n_experts]);
        let mut order: Vec<usize> = (0..n_experts).collect();
        // Stable sort: equal probabilities keep the lower index first.
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
        let picked: Vec<f32> = order[..top_k].iter().map(|&e| probs[e]).collect();
        let sum: f32 = picked.iter().sum();
        ids.extend(order[..top_k].iter().map(|&e| e as u32));
        weights.extend(picked.iter().map(|w| if norm_topk { w / sum } else { *w }));
    }
    Ok((ids, weights))
}

/// First half of a SwiGLU expert: `silu(x · gate^T) * (x · up^T)`, x [T, hidden],
/// gate and up [inter, hidden]; returns [T, inter]. Mirrors
/// `self.act_fn(self.gate_proj(x)) * self.up_proj(x)`.
pub fn swiglu_gate_up<W: Copy + Into<f32>>(
    x: &[f32],
    hidden: usize,
    gate: &[W],
    up: &[W],
    inter: usize,
) -> Result<Vec<f32>> {
    let g = matmul(x, hidden, gate, inter, None, None)?;
    let u = matmul(x, hidden, up, inter, None, None)?;
    Ok(g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect())
}

/// A whole SwiGLU expert (or dense MLP): gate, up [inter, hidden], down [hidden, inter];
/// x [T, hidden] to [T, hidden]. Mirrors OlmoeMLP.forward:
/// `down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))`.
pub fn swiglu_expert<W: Copy + Into<f32>>(
    x: &[f32],
    hidden: usize,
    gate: &[W],
    up: &[W],
    down: &[W],
    inter: usize,
) -> Result<Vec<f32>> {
    let h = swiglu_gate_up(x, hidden, gate, up, inter)?;
    matmul(&h, inter, down, hidden, None, None)
}

/// The routed experts' outputs of each token: `y` [T, top_k, hidden] and their router
/// weights [T, top_k].
#[derive(Clone, Copy, Debug)]
pub struct Routed<'a> {
    pub y: &'a [f32],
    pub weights: &'a [f32],
    pub top_k: usize,
    /// Per (token, top-k index): whether that pair is summed from y (COMBINE_RESIDENT;
    /// None: every pair).
    pub resident: Option<&'a [bool]>,
}

/// The residual stream after the MoE block: `x + sum_j w[t, j] * y[t, j] + g_t * shared[t]`
/// with `g_t = sigmoid(shared_gate[t])` when a gate logit per token is given, else 1.
/// Mirrors `final_hidden_states.index_add_(0, top_x, current_hidden_states)` (with
/// `current_hidden_states = expert_layer(current_state) * routing_weights[top_x, idx, None]`),
/// Qwen2Moe's `shared_expert_output = F.sigmoid(self.shared_expert_gate(hidden_states)) *
/// shared_expert_output`, `final_hidden_states = final_hidden_states + shared_expert_output`,
/// and the decoder layer's `hidden_states = residual + hidden_states`. `host` [T, hidden]
/// is added as it is (the CPU experts' weighted sum, COMBINE_HOST).
pub fn moe_combine(
    x: &[f32],
    hidden: usize,
    routed: Option<Routed<'_>>,
    shared: Option<&[f32]>,
    shared_gate: Option<&[f32]>,
    host: Option<&[f32]>,
) -> Result<Vec<f32>> {
    let t = rows_of("residual", x.len(), hidden)?;
    if let Some(hy) = host {
        need("CPU expert sums", hy.len(), t * hidden)?;
    }
    if let Some(r) = &routed {
        need("expert outputs", r.y.len(), t * r.top_k * hidden)?;
        need("expert weights", r.weights.len(), t * r.top_k)?;
    }
    if let Some(s) = shared {
        need("shared expert output", s.len(), t * hidden)?;
    }
    if let Some(g) = shared_gate {
        need("shared expert gate logits", g.len(), t)?;
    }
    let mut out = x.to_vec();
    for ti in 0..t {
        for m in 0..hidden {
            let mut acc = 0.0f32;
            if let Some(r) = &routed {
                for j in 0..r.top_k {
                    let tj = ti * r.top_k + j;
                    if r.resident.is_none_or(|s| s[tj]) {
                        acc += r.weights[tj] * r.y[tj * hidden + m];
                    }
                }
            }
            if let Some(s) = shared {
                let g = shared_gate.map_or(1.0, |g| sigmoid(g[ti]));
                acc += g * s[ti * hidden + m];
            }
            if let Some(hy) = host {
                acc += hy[ti * hidden + m];
            }
            out[ti * hidden + m] += acc;
        }
    }
    Ok(out)
}

/// Greedy choice: the largest logit, lowest index on ties, skipping `suppress`.
/// Mirrors `next_tokens = torch.argmax(next_token_scores, dim=-1)`.
pub fn argmax(logits: &[f32], suppress: &[u32]) -> u32 {
    crate::runtime::sampling::argmax(logits, suppress)
}

// ---------------------------------------------------------------------------------------------
// W4A16 routed experts: INT4 weights in the packed layout of `crate::blocks::quant`

/// Row `n` of a packed INT4 matrix dotted with `x` (`m.inp` values), read element by
/// element through `Q4Matrix::nibble` and `Q4Matrix::scale`. Per-block scaling, as the
/// kernels do it: each block of 256 inputs is summed unscaled, `sum (nibble - 8) * x`, and
/// multiplied by its f16 scale once; but every sum here is in f64, so the result is the
/// exact value (to f64) and a test measures only the kernels' f32 rounding.
/// Affine matrices (`Q4Kind::Affine32`) add each block's offset times the block's sum of x;
/// Q8_0 matrices (`Q4Kind::Q8`) hold an int8 per byte in column order.
fn q4_row_dot(m: Q4Matrix, q: &[u8], s: &[u8], n: usize, x: &[f32]) -> f64 {
    if m.kind.is_planes() {
        return planes_row_dot(m, q, s, n, x);
    }
    let block = m.kind.block();
    let row = m.vec4_per_row() * 16;
    let quant = |k: usize| match m.kind {
        crate::blocks::quant::Q4Kind::Q8 => q[n * row + k] as i8 as i32,
        _ => m.nibble(q, n, k) as i32 - 8,
    };
    let mut acc = 0.0f64;
    for b in 0..m.blocks() {
        let cols = b * block..((b + 1) * block).min(m.inp);
        let mut bs = 0.0f64;
        let mut xs = 0.0f64;
        for (k, &xk) in cols.clone().zip(&x[cols]) {
            bs += quant(k) as f64 * xk as f64;
            xs += xk as f64;
        }
        acc += m.scale(s, n, b).to_f64() * bs + m.offset(s, n, b).to_f64() * xs;
    }
    acc
}

/// Row `n` of a K-plane matrix (`blocks::kquant`) dotted with `x`: per 16 columns,
/// `a sum(q x) + b sum(x)` with the record's (a, b) for them, in f64.
fn planes_row_dot(m: Q4Matrix, q: &[u8], s: &[u8], n: usize, x: &[f32]) -> f64 {
    let side: Vec<u32> = (0..m.halves_per_row() / 2)
        .map(|i| m.side_word(s, n, i))
        .collect();
    let mut acc = 0.0f64;
    for k0 in (0..m.inp).step_by(16) {
        let (mut qx, mut xs) = (0.0f64, 0.0f64);
        let (a, b, _) = crate::blocks::kquant::terms(m.kind, &side, k0, 0);
        for (k, &xk) in x.iter().enumerate().take((k0 + 16).min(m.inp)).skip(k0) {
            let (_, _, qk) = crate::blocks::kquant::terms(m.kind, &side, k, m.nibble(q, n, k));
            qx += f64::from(qk) * xk as f64;
            xs += xk as f64;
        }
        acc += a as f64 * qx + b as f64 * xs;
    }
    acc
}

fn q4_sections(what: &str, m: Q4Matrix, q: &[u8], s: &[u8]) -> Result<()> {
    if q.len() < m.q_bytes() || s.len() < m.scale_bytes() {
        return Err(Error::Other(format!(
            "cpu_ref: {what} [{}, {}] needs {} nibble and {} scale bytes, got {} and {}",
            m.out,
            m.inp,
            m.q_bytes(),
            m.scale_bytes(),
            q.len(),
            s.len()
        )));
    }
    Ok(())
}

/// `x [T, in] · W^T` for one packed INT4 matrix `m`: `q` and `s` are its nibble and scale
/// sections as written by `Q4Matrix::pack`. Returns [T, out]. Per-block scaling in f64
/// (see `q4_row_dot`), one rounding to f32 at the end.
pub fn w4a16_matmul(x: &[f32], m: Q4Matrix, q: &[u8], s: &[u8]) -> Result<Vec<f32>> {
    let t = rows_of("w4a16 matmul input", x.len(), m.inp)?;
    q4_sections("w4a16 matrix", m, q, s)?;
    let mut out = Vec::with_capacity(t * m.out);
    for xr in x.chunks(m.inp) {
        out.extend((0..m.out).map(|n| q4_row_dot(m, q, s, n, xr) as f32));
    }
    Ok(out)
}

fn q4_slot<'a>(layout: &Q4SlotLayout, slot: &'a [u8]) -> Result<&'a [u8]> {
    need("INT4 expert slot (bytes)", slot.len(), layout.bytes)?;
    Ok(slot)
}

/// First half of an INT4 SwiGLU expert straight from its packed slot bytes
/// (`Q4SlotLayout`): `silu(x · gate^T) * (x · up^T)`, x [T, hidden], returns [T, inter].
/// What shaders/ffn_gate_up_q4.wgsl computes for one (token, top-k index). Per-block
/// scaling in f64 (see `q4_row_dot`); silu and the product in f64, rounded once to f32.
/// Mirrors `self.act_fn(self.gate_proj(x)) * self.up_proj(x)` with the dequantised weights.
pub fn w4a16_gate_up(x: &[f32], layout: &Q4SlotLayout, slot: &[u8]) -> Result<Vec<f32>> {
    let slot = q4_slot(layout, slot)?;
    let (h, i, g) = (layout.hidden, layout.inter, layout.gate);
    let t = rows_of("w4a16 gate_up input", x.len(), h)?;
    let (gq, uq) = (
        &slot[layout.gate_q..layout.up_q],
        &slot[layout.up_q..layout.down_q],
    );
    let (gs, us) = (
        &slot[layout.gate_s..layout.up_s],
        &slot[layout.up_s..layout.down_s],
    );
    q4_sections("w4a16 gate", g, gq, gs)?;
    q4_sections("w4a16 up", g, uq, us)?;
    let mut out = Vec::with_capacity(t * i);
    for xr in x.chunks(h) {
        for n in 0..i {
            let gv = q4_row_dot(g, gq, gs, n, xr);
            let uv = q4_row_dot(g, uq, us, n, xr);
            out.push((gv / (1.0 + (-gv).exp()) * uv) as f32);
        }
    }
    Ok(out)
}

/// Second half of an INT4 SwiGLU expert from its packed slot bytes: `h · down^T`,
/// h [T, inter], returns [T, hidden]. What shaders/ffn_down_q4.wgsl computes per slot
/// for one (token, top-k index). Per-block scaling in f64.
/// Mirrors `self.down_proj(...)` with the dequantised weights.
pub fn w4a16_down(h: &[f32], layout: &Q4SlotLayout, slot: &[u8]) -> Result<Vec<f32>> {
    let slot = q4_slot(layout, slot)?;
    let d = layout.down;
    w4a16_matmul(
        h,
        d,
        &slot[layout.down_q..layout.gate_s],
        &slot[layout.down_s..],
    )
}

/// The fused weighted combine of shaders/ffn_down_q4_combine.wgsl:
/// `x[t] + sum_j w[t, j] * (down_{t,j} · h[t, j])` over the top-k indices whose slot is
/// given (`slots[t * top_k + j]`; `None` = that expert lives in another chunk and is not
/// added). x [T, hidden], h [T, top_k, inter], weights [T, top_k]; returns [T, hidden].
/// Everything, x included, is summed in f64 and rounded once, so a token with no slot
/// given keeps x exactly. Mirrors `final_hidden_states.index_add_(0, top_x,
/// current_hidden_states)` with `current_hidden_states = expert_layer(current_state) *
/// routing_weights[top_x, idx, None]`, plus the decoder layer's residual add.
pub fn w4a16_down_combine(
    x: &[f32],
    h: &[f32],
    weights: &[f32],
    top_k: usize,
    layout: &Q4SlotLayout,
    slots: &[Option<&[u8]>],
) -> Result<Vec<f32>> {
    let (hid, inter) = (layout.hidden, layout.inter);
    let t = rows_of("residual", x.len(), hid)?;
    need("expert activations", h.len(), t * top_k * inter)?;
    need("expert weights", weights.len(), t * top_k)?;
    need("expert slots", slots.len(), t * top_k)?;
    let d = layout.down;
    let mut out = Vec::with_capacity(t * hid);
    for ti in 0..t {
        let mut acc: Vec<f64> = x[ti * hid..(ti + 1) * hid]
            .iter()
            .map(|&v| v as f64)
            .collect();
        for j in 0..top_k {
            let Some(slot) = slots[ti * top_k + j] else {
                continue;
            };
            let slot = q4_slot(layout, slot)?;
            let (q, s) = (&slot[layout.down_q..layout.gate_s], &slot[layout.down_s..]);
            q4_sections("w4a16 down", d, q, s)?;
            let hr = &h[(ti * top_k + j) * inter..][..inter];
            let w = weights[ti * top_k + j] as f64;
            for (m, a) in acc.iter_mut().enumerate() {
                *a += w * q4_row_dot(d, q, s, m, hr);
            }
        }
        out.extend(acc.iter().map(|&v| v as f32));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16s(v: &[f32]) -> Vec<f16> {
        v.iter().map(|&x| f16::from_f32(x)).collect()
    }

    #[test]
    fn small_hand_checked_cases() {
        // [1, 2] · [[1, 0], [1, 1]]^T + [0.5, 0] = [1.5, 3]
        let y = matmul(
            &[1.0, 2.0],
            2,
            &f16s(&[1.0, 0.0, 1.0, 1.0]),
            2,
            Some(&[0.5, 0.0]),
            None,
        )
        .unwrap();
        assert_eq!(y, vec![1.5, 3.0]);
        // rms of [3, 4] is sqrt(12.5)
        let n = rmsnorm(&[3.0, 4.0], &f16s(&[1.0, 2.0]), 0.0).unwrap();
        assert!(
            (n[0] - 3.0 / 12.5f32.sqrt()).abs() < 1e-6
                && (n[1] - 8.0 / 12.5f32.sqrt()).abs() < 1e-6
        );
        let (ids, w) = router_topk(&[1.0, 3.0, 3.0, 0.0], 4, 4, 2, true).unwrap();
        assert_eq!(ids, vec![1, 2]);
        assert_eq!(w, vec![0.5, 0.5]);
        assert!(matmul(&[1.0, 2.0, 3.0], 2, &f16s(&[1.0, 0.0]), 1, None, None).is_err());
    }
}

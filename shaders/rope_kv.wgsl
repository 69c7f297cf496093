// Per token: optional RMSNorm of q and k, over the whole projection (ROPE_QK_NORM; OLMoE:
// `query_states = self.q_norm(self.q_proj(hidden_states))`, q_norm over num_heads*head_dim
// and k_norm over num_kv_heads*head_dim) or over each head (ROPE_QK_NORM_PER_HEAD; Qwen3:
// `self.q_norm(self.q_proj(hidden_states).view(hidden_shape))`, one head_dim weight vector
// for every head), optional clip of q/k/v, then rotary embedding
// (rotate_half style, cos/sin from a table computed on the host in f32 like
// transformers' inv_freq), then q goes to q_out and k, v are stored into the layer's KV
// cache at the token's position (in its sequence's rows: `tok_pos`, `tok_kv0`). One
// workgroup per token.

struct Params {
    n_heads: u32,
    n_kv: u32,
    head_dim: u32,
    qkv_stride: u32,   // q_dim + 2 * kv_dim
    flags: u32,        // ROPE_QK_NORM, ROPE_CLIP
    eps: f32,
    clip: f32,
    rope_rows: u32,    // positions held by the cos/sin table
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;
@group(0) @binding(3) var<storage, read> q_norm_w: array<u32>;  // f16 pairs
@group(0) @binding(4) var<storage, read> k_norm_w: array<u32>;
@group(0) @binding(5) var<storage, read> rope: array<vec2<f32>>; // [pos][head_dim/2] (cos, sin)
@group(0) @binding(6) var<storage, read_write> q_out: array<f32>;
// cache_k (7) and cache_v (8) come from the KV store piece (kv_store_row).

const WG: u32 = 64u;
var<workgroup> red_q: array<f32, 64>;
var<workgroup> red_k: array<f32, 64>;
// Per-head norm: 1 / rms of each query head, then of each KV head (ROPE_MAX_NORM_HEADS on
// the host bounds n_heads + n_kv).
const MAX_NORM_HEADS: u32 = 512u;
var<workgroup> inv_head: array<f32, 512>;

fn f16_at(buf_is_q: bool, i: u32) -> f32 {
    if (buf_is_q) { return unpack2x16float(q_norm_w[i / 2u])[i % 2u]; }
    return unpack2x16float(k_norm_w[i / 2u])[i % 2u];
}

fn clipped(v: f32) -> f32 {
    if ((p.flags & ROPE_CLIP) != 0u) { return clamp(v, -p.clip, p.clip); }
    return v;
}

// Key element j of this token (normed as q is, then clipped), before rotation.
fn k_in(base: u32, q_dim: u32, j: u32, inv_k: f32) -> f32 {
    var a = qkv[base + q_dim + j];
    if ((p.flags & ROPE_QK_NORM) != 0u) {
        a = f16_at(false, j) * (a * inv_k);
    } else if ((p.flags & ROPE_QK_NORM_PER_HEAD) != 0u) {
        a = f16_at(false, j % p.head_dim) * (a * inv_head[p.n_heads + j / p.head_dim]);
    }
    return clipped(a);
}

// Key element j after rotate_half: with i = j mod head_dim and h = head_dim / 2,
// k[j] cos - k[j + h] sin for i < h, k[j] cos + k[j - h] sin otherwise.
fn k_roped(base: u32, q_dim: u32, j: u32, inv_k: f32, rrow: u32) -> f32 {
    let half = p.head_dim / 2u;
    let i = j % p.head_dim;
    if (i < half) {
        let cs = rope[rrow + i];
        return k_in(base, q_dim, j, inv_k) * cs.x - k_in(base, q_dim, j + half, inv_k) * cs.y;
    }
    let cs = rope[rrow + i - half];
    return k_in(base, q_dim, j, inv_k) * cs.x + k_in(base, q_dim, j - half, inv_k) * cs.y;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let t = wid.x;
    if (t >= step.n_tokens) { return; }
    let pos = tok_pos(t);
    let q_dim = p.n_heads * p.head_dim;
    let kv_dim = p.n_kv * p.head_dim;
    let base = t * p.qkv_stride;
    let half = p.head_dim / 2u;
    let norm = (p.flags & ROPE_QK_NORM) != 0u;
    let per_head = (p.flags & ROPE_QK_NORM_PER_HEAD) != 0u;
    if (per_head) {
        // One lane per head: a head's head_dim squares summed in order, no barrier per head.
        for (var hh = lid.x; hh < min(p.n_heads + p.n_kv, MAX_NORM_HEADS); hh += WG) {
            var off = hh * p.head_dim;
            if (hh >= p.n_heads) { off = q_dim + (hh - p.n_heads) * p.head_dim; }
            var s = 0.0;
            for (var i = 0u; i < p.head_dim; i++) { let v = qkv[base + off + i]; s += v * v; }
            inv_head[hh] = inverseSqrt(s / f32(p.head_dim) + p.eps);
        }
    }

    var inv_q = 1.0;
    var inv_k = 1.0;
    if (norm) {
        var sq = 0.0;
        for (var i = lid.x; i < q_dim; i += WG) { let v = qkv[base + i]; sq += v * v; }
        var sk = 0.0;
        for (var i = lid.x; i < kv_dim; i += WG) { let v = qkv[base + q_dim + i]; sk += v * v; }
        red_q[lid.x] = sq;
        red_k[lid.x] = sk;
    }
    workgroupBarrier();
    if (norm) {
        for (var s = WG / 2u; s > 0u; s >>= 1u) {
            if (lid.x < s) {
                red_q[lid.x] += red_q[lid.x + s];
                red_k[lid.x] += red_k[lid.x + s];
            }
            workgroupBarrier();
        }
        inv_q = inverseSqrt(red_q[0] / f32(q_dim) + p.eps);
        inv_k = inverseSqrt(red_k[0] / f32(kv_dim) + p.eps);
    }

    let rrow = min(pos, p.rope_rows - 1u) * half;
    // q: pairs (i, i + half) of each head
    for (var idx = lid.x; idx < p.n_heads * half; idx += WG) {
        let h = idx / half;
        let i = idx % half;
        let ia = h * p.head_dim + i;
        let ib = ia + half;
        probe_bytes(SITE_X, 8u);
        var a = qkv[base + ia];
        var b = qkv[base + ib];
        if (norm) {
            a = f16_at(true, ia) * (a * inv_q);
            b = f16_at(true, ib) * (b * inv_q);
        } else if (per_head) {
            a = f16_at(true, i) * (a * inv_head[h]);
            b = f16_at(true, i + half) * (b * inv_head[h]);
        }
        a = clipped(a);
        b = clipped(b);
        let cs = rope[rrow + i];
        q_out[t * q_dim + ia] = a * cs.x - b * cs.y;
        q_out[t * q_dim + ib] = b * cs.x + a * cs.y;
    }
    // k (normed, clipped, rotated) and v (clipped) into the cache, as its format stores them.
    kv_store_row(lid.x, tok_kv0(t) + pos, base, q_dim, kv_dim, inv_k, rrow);
}

// Value element j of this token, clipped.
fn v_in(base: u32, q_dim: u32, kv_dim: u32, j: u32) -> f32 {
    return clipped(qkv[base + q_dim + kv_dim + j]);
}

// Merges the key splits of attn_flash.wgsl (one-token steps): for each query head,
//   out = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s,   M = max_s m_s
// where split s left its unnormalised output o_s, max m_s and sum l_s. A split without
// keys has m_s = -3e38 and l_s = 0, and weighs nothing. One workgroup per (head, token).

struct Params {
    n_heads: u32,
    n_kv: u32,
    head_dim: u32,
    g_tile: u32,
    q_tokens: u32,
    tk: u32,
    min_chunk: u32,
    splits: u32,
    scale: f32,
    flags: u32,
    _b: u32,
    _c: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> part: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn part_at(i: u32) -> f32 {
    probe(SITE_OTHER, i * 4u, 4u);
    return part[i];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let h = wid.x;
    let t = wid.y;
    if (t >= step.n_tokens) { return; }
    let d = p.head_dim;
    let rec = d + 2u;
    let base = (t * p.n_heads + h) * p.splits * rec;
    // A one-token step sized by its position launched `live` splits (attn_flash wrote it).
    var live = p.splits;
    if ((p.flags & ATTN_LIVE_SPLITS) != 0u) {
        live = min(p.splits, u32(part_at(p.n_heads * p.splits * rec)));
    }
    var mx = -3.0e38;
    for (var s = 0u; s < live; s++) { mx = max(mx, part_at(base + s * rec + d)); }
    var l = 0.0;
    for (var s = 0u; s < live; s++) {
        l += exp(part_at(base + s * rec + d) - mx) * part_at(base + s * rec + d + 1u);
    }
    for (var c = li; c < d; c += 64u) {
        var acc = 0.0;
        for (var s = 0u; s < live; s++) {
            acc += exp(part_at(base + s * rec + d) - mx) * part_at(base + s * rec + c);
        }
        out[(t * p.n_heads + h) * d + c] = acc / l;
    }
}

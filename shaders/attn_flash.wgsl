// Causal attention for GPUs, flash style, over the KV cache:
//   out[t, h] = softmax_j(q[t, h] . k[j, kvh] * scale) @ v[:, kvh],  j <= pos0 + t
// A workgroup serves up to QR query rows of one KV head kvh: g_tile of its query heads
// (GQA: query head h reads KV head h / (n_heads / n_kv), as transformers' repeat_kv) for
// q_tokens tokens, so each K/V row is read once for all of them. Keys are staged in
// workgroup memory a tile of TK rows at a time (neighbouring lanes load neighbouring
// floats of a row), scores and the online softmax (running max and sum, rescaling the
// output when the max grows) stay in workgroup memory, as does the output.
// Grid: (KV heads x head tiles, S key splits, token groups). With S = 1 a workgroup covers
// every key of its tokens and writes the normalised output. One-token steps split the keys
// into S chunks over more workgroups (flash-decoding): chunk s writes its unnormalised
// output, max and sum to `part`, and attn_combine.wgsl merges the chunks.

struct Params {
    n_heads: u32,
    n_kv: u32,
    head_dim: u32,
    g_tile: u32,       // query heads of a group per workgroup
    q_tokens: u32,     // tokens per workgroup
    tk: u32,           // keys per tile (TK)
    min_chunk: u32,    // fewest keys per split
    splits: u32,       // S, the grid's y
    scale: f32,
    flags: u32,        // ATTN_LIVE_SPLITS
    _b: u32,
    _c: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> q: array<f32>;
// cache_k (3) and cache_v (4) come from the KV piece.
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
// [T][n_heads][S][head_dim + 2]: a split's output, then its max and sum.
@group(0) @binding(6) var<storage, read_write> part: array<f32>;

const WG: u32 = 64u;
// Capacities (floats): the query rows and the outputs (QR x head_dim each), one tile of
// keys or values (TK x head_dim), the scores of a tile (QR x TK); the host sizes g_tile,
// q_tokens and tk to fit (backend::params::ATTN_FLASH_*).
const QD: u32 = 1024u;
const PD: u32 = 512u;
const MAX_QR: u32 = 32u;
const NEG: f32 = -3.0e38;
var<workgroup> q_s: array<f32, 1024>;
var<workgroup> o_s: array<f32, 1024>;
var<workgroup> kv_s: array<f32, 1024>;
var<workgroup> p_s: array<f32, 512>;
var<workgroup> m_s: array<f32, 32>;
var<workgroup> l_s: array<f32, 32>;
var<workgroup> a_s: array<f32, 32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let d = p.head_dim;
    let group = p.n_heads / p.n_kv;
    let tiles = (group + p.g_tile - 1u) / p.g_tile;
    let kvh = wid.x / tiles;
    let g0 = (wid.x % tiles) * p.g_tile;
    let gn = min(p.g_tile, group - g0);
    let t0 = wid.z * p.q_tokens;
    if (t0 >= step.n_tokens) { return; }
    let tn = min(p.q_tokens, step.n_tokens - t0);
    let rows = gn * tn;
    let q_dim = p.n_heads * d;
    let kv_dim = p.n_kv * d;
    let tk = p.tk;
    // This split's keys: the group's last token sees the most.
    // (A batched step's tokens are of different sequences: it runs with q_tokens = 1.)
    let n_keys = tok_pos(t0) + tn;
    let r0 = tok_kv0(t0);  // the sequence's first row in the cache
    let s = wid.y;
    // The splits launched: p.splits, or fewer for a one-token step sized by its position
    // (ATTN_LIVE_SPLITS); `part` keeps p.splits records a head either way.
    let live = nwg.y;
    var chunk = max(p.min_chunk, (n_keys + live - 1u) / live);
    chunk = (chunk + tk - 1u) / tk * tk;
    let k0 = min(s * chunk, n_keys);
    let k1 = min(k0 + chunk, n_keys);

    // Row r is token t0 + r / gn, query head kvh * group + g0 + r % gn.
    for (var e = li; e < rows * d; e += WG) {
        let r = e / d;
        let h = kvh * group + g0 + r % gn;
        let qi = (t0 + r / gn) * q_dim + h * d + e % d;
        probe_bytes(SITE_X, 4u);
        q_s[e] = q[qi] * p.scale;
        o_s[e] = 0.0;
    }
    if (li < rows) {
        m_s[li] = NEG;
        l_s[li] = 0.0;
    }
    workgroupBarrier();

    for (var kt = k0; kt < k1; kt += tk) {
        let nk = min(tk, k1 - kt);
        for (var e = li; e < nk * d; e += WG) {
            kv_s[e] = k_at((r0 + kt + e / d) * kv_dim + kvh * d + e % d);
        }
        workgroupBarrier();
        for (var e = li; e < rows * nk; e += WG) {
            let r = e / nk;
            let j = e % nk;
            var sc = 0.0;
            for (var i = 0u; i < d; i++) { sc += q_s[r * d + i] * kv_s[j * d + i]; }
            // Causal: token t sees keys 0 ..= its position.
            let visible = kt + j <= tok_pos(t0) + r / gn;
            p_s[r * tk + j] = select(NEG, sc, visible);
        }
        workgroupBarrier();
        for (var e = li; e < nk * d; e += WG) {
            kv_s[e] = v_at((r0 + kt + e / d) * kv_dim + kvh * d + e % d);
        }
        if (li < rows) {
            let r = li;
            var mx = m_s[r];
            for (var j = 0u; j < nk; j++) { mx = max(mx, p_s[r * tk + j]); }
            var sum = 0.0;
            for (var j = 0u; j < nk; j++) {
                let sc = p_s[r * tk + j];
                let pv = select(0.0, exp(sc - mx), sc > NEG);
                p_s[r * tk + j] = pv;
                sum += pv;
            }
            let alpha = exp(m_s[r] - mx);
            a_s[r] = alpha;
            l_s[r] = l_s[r] * alpha + sum;
            m_s[r] = mx;
        }
        workgroupBarrier();
        for (var e = li; e < rows * d; e += WG) {
            let r = e / d;
            let c = e % d;
            var acc = o_s[e] * a_s[r];
            for (var j = 0u; j < nk; j++) { acc += p_s[r * tk + j] * kv_s[j * d + c]; }
            o_s[e] = acc;
        }
        workgroupBarrier();
    }

    for (var e = li; e < rows * d; e += WG) {
        let r = e / d;
        let t = t0 + r / gn;
        let h = kvh * group + g0 + r % gn;
        if (live == 1u) {
            out[t * q_dim + h * d + e % d] = o_s[e] / l_s[r];
        } else {
            part[((t * p.n_heads + h) * p.splits + s) * (d + 2u) + e % d] = o_s[e];
        }
    }
    if (live > 1u && li < rows) {
        let t = t0 + li / gn;
        let h = kvh * group + g0 + li % gn;
        let b = ((t * p.n_heads + h) * p.splits + s) * (d + 2u) + d;
        part[b] = m_s[li];
        part[b + 1u] = l_s[li];
    }
    // The combine merges as many splits as were launched (it does not know the grid).
    if ((p.flags & ATTN_LIVE_SPLITS) != 0u && wid.x == 0u && wid.y == 0u && li == 0u) {
        part[p.n_heads * p.splits * (d + 2u)] = f32(live);
    }
}

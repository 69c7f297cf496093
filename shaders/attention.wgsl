// Causal attention of one query head over the KV cache, one workgroup per (head, token):
//   scores = q.k * head_dim^-0.5; p = softmax(scores) in f32; out = p @ V
// Keys 0..=pos0+t are visible. Scores go to a scratch row in global memory so the context
// length is bounded by the cache, not by workgroup memory. GQA: query head h reads kv
// head h / (n_heads / n_kv), as transformers' repeat_kv.

// Params, p, scratch (5) and out (6) come from attn_scratch.wgsl.

@group(0) @binding(2) var<storage, read> q: array<f32>;
// cache_k (3) and cache_v (4) come from the KV piece.

const WG: u32 = 64u;
const MAX_HEAD_DIM: u32 = 512u;
var<workgroup> qs: array<f32, 512>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let h = wid.x;
    let t = wid.y;
    if (t >= step.n_tokens) { return; }
    let d = p.head_dim;
    let q_dim = p.n_heads * d;
    let kv_dim = p.n_kv * d;
    let kvh = h / (p.n_heads / p.n_kv);
    let n_keys = tok_pos(t) + 1u;
    let r0 = tok_kv0(t);  // the sequence's first row in the cache
    let srow = (t * p.n_heads + h) * p.scratch_stride;

    for (var i = lid.x; i < d; i += WG) { qs[i] = q[t * q_dim + h * d + i]; }
    workgroupBarrier();

    var m = -3.0e38;
    for (var j = lid.x; j < n_keys; j += WG) {
        let kb = (r0 + j) * kv_dim + kvh * d;
        var s = 0.0;
        for (var i = 0u; i < d; i++) { s += qs[i] * k_at(kb + i); }
        s *= p.scale;
        scratch[srow + j] = s;
        m = max(m, s);
    }
    let mx = wg_max(m, lid.x);

    var sum = 0.0;
    for (var j = lid.x; j < n_keys; j += WG) {
        let e = exp(scratch[srow + j] - mx);
        scratch[srow + j] = e;
        sum += e;
    }
    let inv = 1.0 / wg_sum(sum, lid.x);
    // Scratch was written by other invocations of this workgroup.
    storageBarrier();

    for (var i = lid.x; i < d; i += WG) {
        var acc = 0.0;
        for (var j = 0u; j < n_keys; j++) {
            acc += scratch[srow + j] * v_at((r0 + j) * kv_dim + kvh * d + i);
        }
        out[t * q_dim + h * d + i] = acc * inv;
    }
}

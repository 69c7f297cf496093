// Router: softmax over all experts in f32, then top-k on the probabilities (as
// transformers: `routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)`,
// then `torch.topk`), optionally renormalised (`norm_topk_prob`). One workgroup per
// token: the lanes compute the probabilities together (every lane active: on llvmpipe,
// exp in a mostly inactive workgroup leaked memory on each dispatch), then lane 0 picks
// the top k, ties to the lower expert index.

struct Params {
    n_experts: u32,
    top_k: u32,
    logits_stride: u32,
    norm_topk: u32,
}
struct Step { pos0: u32, n_tokens: u32, _a: u32, _b: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> weights: array<f32>;

const WG: u32 = 64u;
/// Most experts a router may have (workgroup memory).
const MAX_EXPERTS: u32 = 1024u;
var<workgroup> probs: array<f32, 1024>;
var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let t = wid.x;
    if (t >= step.n_tokens) { return; }
    let lb = t * p.logits_stride;
    let n = min(p.n_experts, MAX_EXPERTS);
    var m = -3.4e38;
    for (var e = lid.x; e < n; e += WG) { m = max(m, logits[lb + e]); }
    red[lid.x] = m;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid.x < s) { red[lid.x] = max(red[lid.x], red[lid.x + s]); }
        workgroupBarrier();
    }
    let mx = red[0];
    workgroupBarrier();
    var sum = 0.0;
    for (var e = lid.x; e < n; e += WG) {
        let v = exp(logits[lb + e] - mx);
        probs[e] = v;
        sum += v;
    }
    red[lid.x] = sum;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid.x < s) { red[lid.x] += red[lid.x + s]; }
        workgroupBarrier();
    }
    let total = red[0];
    if (lid.x != 0u) { return; }
    let ob = t * p.top_k;
    var picked_sum = 0.0;
    // The j-th pick is the best expert ranked after the (j-1)-th in the order
    // (probability descending, index ascending): nothing picked needs remembering.
    var prev_v = 3.4e38;
    var prev_e = 0xffffffffu;
    for (var j = 0u; j < p.top_k; j++) {
        var best = 0xffffffffu;
        var best_v = -1.0;
        for (var e = 0u; e < n; e++) {
            let v = probs[e];
            let after_prev = v < prev_v || (v == prev_v && (prev_e == 0xffffffffu || e > prev_e));
            if (after_prev && (best == 0xffffffffu || v > best_v)) {
                best = e;
                best_v = v;
            }
        }
        ids[ob + j] = best;
        let w = best_v / total;
        weights[ob + j] = w;
        picked_sum += w;
        prev_v = best_v;
        prev_e = best;
    }
    if (p.norm_topk != 0u) {
        for (var j = 0u; j < p.top_k; j++) { weights[ob + j] = weights[ob + j] / picked_sum; }
    }
}

// Router: softmax over all experts in f32, then top-k on the probabilities (as
// transformers: `routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)`,
// then `torch.topk`), optionally renormalised (`norm_topk_prob`). One workgroup per
// token: the lanes reduce the max and the softmax sum together, then lane 0 picks the top
// k, ties to the lower expert index, recomputing each probability from its logit (the same
// f32 operations, so the same values): on llvmpipe (Mesa 22.3) a workgroup array of the
// probabilities leaked about 0.5 MB per dispatch.

struct Params {
    n_experts: u32,
    top_k: u32,
    logits_stride: u32,
    norm_topk: u32,
    splits: u32,       // one-token steps: partial rows of the logits to add first
    _a: u32,
    _b: u32,
    _c: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> weights: array<f32>;

const WG: u32 = 64u;
/// Most experts a router may have (ROUTER_MAX_EXPERTS on the host).
const MAX_EXPERTS: u32 = 1024u;
// red (the top-k tree's values) comes from wg_tree.wgsl.
var<workgroup> redi: array<u32, 64>;
const NONE: u32 = 0xffffffffu;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let t = wid.x;
    if (t >= step.n_tokens) { return; }
    let lb = t * p.logits_stride;
    let n = min(p.n_experts, MAX_EXPERTS);
    // A one-token step's router matvec split its columns into `splits` partial rows: add
    // them into row 0 (every column of the row, the shared-expert gate's too), in split
    // order, before anything reads them.
    if (step.n_tokens == 1u && p.splits > 1u) {
        for (var c = lid.x; c < p.logits_stride; c += WG) {
            var v = 0.0;
            for (var s = 0u; s < p.splits; s++) { v += logits[s * p.logits_stride + c]; }
            logits[c] = v;
        }
        storageBarrier();
        workgroupBarrier();
    }
    var m = -3.4e38;
    for (var e = lid.x; e < n; e += WG) {
        probe_bytes(SITE_X, 4u);
        m = max(m, logits[lb + e]);
    }
    let mx = wg_max(m, lid.x);
    var sum = 0.0;
    for (var e0 = 0u; e0 < n; e0 += WG) {
        let e = e0 + lid.x;
        let v = exp(logits[lb + min(e, n - 1u)] - mx);
        sum += select(0.0, v, e < n);
    }
    let total = wg_sum(sum, lid.x);
    // Top-k: pick j is the best expert ranked after pick j-1 in the order (probability
    // descending, index ascending), so nothing picked needs remembering. Each lane takes
    // the best of its experts, then a tree reduction; probabilities are recomputed from the
    // logits (the same f32 operations, so the same values). (A serial selection by one
    // lane, or a workgroup array of the probabilities, leaked memory on every dispatch on
    // llvmpipe, Mesa 22.3.)
    let lead = lid.x == 0u;
    let ob = t * p.top_k;
    var picked_sum = 0.0;
    var prev_v = 3.4e38;
    var prev_e = NONE;
    for (var j = 0u; j < p.top_k; j++) {
        var best = NONE;
        var best_v = -1.0;
        for (var e0 = 0u; e0 < n; e0 += WG) {
            let e = e0 + lid.x;
            let v = exp(logits[lb + min(e, n - 1u)] - mx);
            let after_prev = v < prev_v || (v == prev_v && (prev_e == NONE || e > prev_e));
            if (e < n && after_prev && (best == NONE || v > best_v)) {
                best = e;
                best_v = v;
            }
        }
        red[lid.x] = best_v;
        redi[lid.x] = best;
        workgroupBarrier();
        for (var s = WG / 2u; s > 0u; s >>= 1u) {
            if (lid.x < s) {
                let ov = red[lid.x + s];
                let oi = redi[lid.x + s];
                let ci = redi[lid.x];
                if (oi != NONE && (ci == NONE || ov > red[lid.x] || (ov == red[lid.x] && oi < ci))) {
                    red[lid.x] = ov;
                    redi[lid.x] = oi;
                }
            }
            workgroupBarrier();
        }
        let bv = red[0];
        let bi = redi[0];
        workgroupBarrier();
        let w = bv / total;
        if (lead) {
            ids[ob + j] = bi;
            weights[ob + j] = w;
        }
        picked_sum += w;
        prev_v = bv;
        prev_e = bi;
    }
    if (lead && p.norm_topk != 0u) {
        for (var j = 0u; j < p.top_k; j++) { weights[ob + j] = weights[ob + j] / picked_sum; }
    }
}

// Router: softmax over all experts in f32, then top-k (as transformers:
// `routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)`, then
// `torch.topk`), optionally renormalised (`norm_topk_prob`). One invocation per token;
// ties pick the lower expert index. Writes expert ids and their weights per token.

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

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x;
    if (t >= step.n_tokens) { return; }
    let lb = t * p.logits_stride;
    var mx = -3.0e38;
    for (var e = 0u; e < p.n_experts; e++) { mx = max(mx, logits[lb + e]); }
    var sum = 0.0;
    for (var e = 0u; e < p.n_experts; e++) { sum += exp(logits[lb + e] - mx); }
    let ob = t * p.top_k;
    var picked_sum = 0.0;
    for (var j = 0u; j < p.top_k; j++) {
        var best = 0xffffffffu;
        var best_v = -3.0e38;
        for (var e = 0u; e < p.n_experts; e++) {
            var taken = false;
            for (var i = 0u; i < j; i++) { if (ids[ob + i] == e) { taken = true; } }
            let v = logits[lb + e];
            if (!taken && (best == 0xffffffffu || v > best_v)) {
                best = e;
                best_v = v;
            }
        }
        ids[ob + j] = best;
        let w = exp(best_v - mx) / sum;
        weights[ob + j] = w;
        picked_sum += w;
    }
    if (p.norm_topk != 0u) {
        for (var j = 0u; j < p.top_k; j++) { weights[ob + j] = weights[ob + j] / picked_sum; }
    }
}

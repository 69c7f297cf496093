// Fused routing (FFN_ROUTE; one-token steps on the GPU plan): every workgroup of the
// gate/up dispatch computes its token's top-k from the router's logits itself, so the
// layer needs no router_topk dispatch. WGSL has no fence between the workgroups of one
// dispatch, so none can wait for another's result: each recomputes it (the logits are a
// few hundred bytes, read from cache). The arithmetic is router_topk.wgsl's, operation for
// operation (the split partial rows added in split order, the max and the softmax sum over
// the same 64-lane tree, picks by probability descending then index ascending, each
// probability recomputed from its logit), so the ids and weights are the same values.
// With FFN_ROUTE_WRITE, lane 0 of the token's workgroup (0, 0) writes them for
// expert_down, the combine and the host. The trees use the reduce piece's `red`.
// (Unfused ops bind 9 and 12 to a buffer they write anyway: never written here.)

@group(0) @binding(8) var<storage, read> route_logits: array<f32>;
@group(0) @binding(9) var<storage, read_write> route_weights: array<f32>;
@group(0) @binding(12) var<storage, read_write> route_ids: array<u32>;

const ROUTE_NONE: f32 = -1.0;

// Expert e's logit: the router matvec's partial rows (its column splits) added in order.
fn route_logit(lb: u32, e: u32) -> f32 {
    if (p.route_splits <= 1u) { return route_logits[lb + e]; }
    var v = 0.0;
    for (var s = 0u; s < p.route_splits; s++) { v += route_logits[s * p.route_stride + e]; }
    return v;
}

fn route_max(v: f32, li: u32) -> f32 {
    red[li] = vec4<f32>(v, 0.0, 0.0, 0.0);
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (li < s) { red[li].x = max(red[li].x, red[li + s].x); }
        workgroupBarrier();
    }
    let r = red[0].x;
    workgroupBarrier();
    return r;
}

fn route_sum(v: f32, li: u32) -> f32 {
    red[li] = vec4<f32>(v, 0.0, 0.0, 0.0);
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (li < s) { red[li].x += red[li + s].x; }
        workgroupBarrier();
    }
    let r = red[0].x;
    workgroupBarrier();
    return r;
}

// The expert of token t's top-k index j. Every lane calls it, in uniform control flow.
fn route_expert(t: u32, j: u32, li: u32, write: bool) -> u32 {
    let n = max(p.route_experts, 1u);
    let lb = t * p.route_stride;
    var m = -3.4e38;
    for (var e = li; e < n; e += 64u) { m = max(m, route_logit(lb, e)); }
    let mx = route_max(m, li);
    var sum = 0.0;
    for (var e0 = 0u; e0 < n; e0 += 64u) {
        let e = e0 + li;
        let v = exp(route_logit(lb, min(e, n - 1u)) - mx);
        sum += select(0.0, v, e < n);
    }
    let total = route_sum(sum, li);
    let lead = write && li == 0u;
    let ob = t * p.top_k;
    var picked_sum = 0.0;
    var prev_v = 3.4e38;
    var prev_e = ROUTE_NONE;
    var mine = 0u;
    for (var jj = 0u; jj < p.top_k; jj++) {
        var best = ROUTE_NONE;
        var best_v = -1.0;
        for (var e0 = 0u; e0 < n; e0 += 64u) {
            let e = e0 + li;
            let v = exp(route_logit(lb, min(e, n - 1u)) - mx);
            let after_prev = v < prev_v || (v == prev_v && (prev_e == ROUTE_NONE || f32(e) > prev_e));
            if (e < n && after_prev && (best == ROUTE_NONE || v > best_v)) {
                best = f32(e);
                best_v = v;
            }
        }
        red[li] = vec4<f32>(best_v, best, 0.0, 0.0);
        workgroupBarrier();
        for (var s = 32u; s > 0u; s >>= 1u) {
            if (li < s) {
                let o = red[li + s];
                let c = red[li];
                if (o.y != ROUTE_NONE && (c.y == ROUTE_NONE || o.x > c.x || (o.x == c.x && o.y < c.y))) {
                    red[li] = o;
                }
            }
            workgroupBarrier();
        }
        let b = red[0];
        workgroupBarrier();
        let w = b.x / total;
        let bi = u32(max(b.y, 0.0));
        if (lead) {
            route_ids[ob + jj] = bi;
            route_weights[ob + jj] = w;
        }
        if (jj == j) { mine = bi; }
        picked_sum += w;
        prev_v = b.x;
        prev_e = b.y;
    }
    if (lead && p.route_norm != 0u) {
        for (var jj = 0u; jj < p.top_k; jj++) {
            route_weights[ob + jj] = route_weights[ob + jj] / picked_sum;
        }
    }
    return mine;
}

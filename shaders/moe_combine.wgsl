// Adds the MoE block's output to the residual stream:
//   x[t] += sum_j w[t, j] * y[t, j] + g_t * shared[t] + host[t]
// with g_t = sigmoid(shared_expert_gate(x_t)) for Qwen's shared expert (its logit is an
// extra row of the router matmul), 1 for a dense MLP layer, and no shared term for OLMoE.
// With COMBINE_RESIDENT only the pairs whose expert has a device slot (slot_of below
// `slots`) are summed from y: the others were computed on the CPU, whose weighted sum
// arrives as host[t] (COMBINE_HOST).

struct Params {
    hidden: u32,
    top_k: u32,
    flags: u32,          // COMBINE_ROUTED, _RESIDENT, _SHARED, _SHARED_GATED, _HOST
    gate_stride: u32,    // floats per router-logit row
    gate_col: u32,       // column of the shared-expert gate logit
    slots: u32,          // COMBINE_RESIDENT: device slots of the layer's expert pool
    gate_splits: u32,    // > 1: the gate logit is the sum of that many partial rows
    _c: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read> weights: array<f32>;
@group(0) @binding(4) var<storage, read> shared_y: array<f32>;
@group(0) @binding(5) var<storage, read> router_logits: array<f32>;
@group(0) @binding(6) var<storage, read_write> x: array<f32>;
@group(0) @binding(7) var<storage, read> ids: array<u32>;
@group(0) @binding(8) var<storage, read> slot_of: array<u32>;
@group(0) @binding(9) var<storage, read> host_y: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let m = gid.x;
    let t = gid.y;
    if (m >= p.hidden || t >= step.n_tokens) { return; }
    var acc = 0.0;
    if ((p.flags & COMBINE_ROUTED) != 0u) {
        let resident_only = (p.flags & COMBINE_RESIDENT) != 0u;
        for (var j = 0u; j < p.top_k; j++) {
            let tj = t * p.top_k + j;
            if (!resident_only || slot_of[ids[tj]] < p.slots) {
                probe_bytes(SITE_X, 4u);
                acc += weights[tj] * y[tj * p.hidden + m];
            }
        }
    }
    if ((p.flags & COMBINE_SHARED) != 0u) {
        var g = 1.0;
        if ((p.flags & COMBINE_SHARED_GATED) != 0u) {
            // Fused routing leaves a one-token step's logits as the router matvec's
            // partial rows: added in order, as router_topk adds them.
            var l = router_logits[t * p.gate_stride + p.gate_col];
            if (p.gate_splits > 1u) {
                l = 0.0;
                for (var s = 0u; s < p.gate_splits; s++) {
                    l += router_logits[s * p.gate_stride + p.gate_col];
                }
            }
            g = 1.0 / (1.0 + exp(-l));
        }
        probe_bytes(SITE_X, 4u);
        acc += g * shared_y[t * p.hidden + m];
    }
    if ((p.flags & COMBINE_HOST) != 0u) {
        acc += host_y[t * p.hidden + m];
    }
    probe_bytes(SITE_X, 4u);
    x[t * p.hidden + m] += acc;
}

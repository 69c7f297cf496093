// Causal attention for multi-token (prefill) steps on CPU adapters, one workgroup per
// (head, group of 8 tokens): the 8 queries share every key and value load.
//   scores = q.k * head_dim^-0.5; p = softmax(scores) in f32; out = p @ V
// Token t of the step sees keys 0 ..= pos0 + t. llvmpipe (Mesa 22.3) loads even
// lane-invariant addresses lane by lane, so each lane loads data only it needs (a key or
// value row element, or one token's query / probabilities) and subgroupBroadcast shares
// the per-token values: lane l of each subgroup holds token l's. Needs subgroups of at
// least 8 lanes and head_dim % 4 == 0; the one-token kernel is attention.wgsl. Scores go
// to the same scratch rows as there; GQA as there.

// Params, p, scratch (5) and out (6) come from attn_scratch.wgsl.

@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;
// cache_k (3) and cache_v (4) come from the KV piece (k4_at, v_at).

// Per-subgroup partial maxima / sums of the 8 tokens, one pair of slots per 8 local
// invocations: each subgroup's first lane writes slot li / 8, unwritten slots hold the
// identity. This relies on subgroups being aligned runs of local invocation indices of at
// least 8 lanes, and not on the reported subgroup size: llvmpipe with 1024-bit vectors
// reports subgroup_size 32 but runs subgroups of 16 lanes, so `li / subgroup_size` named
// the wrong slots there and the reductions lost subgroups (NaN or wrong tokens).
var<workgroup> red: array<vec4<f32>, 16>;

const NEG: f32 = -3.0e38;

// Max / sum over the workgroup of per-lane vec4 pairs (tokens 0..3, 4..7).
fn reduce(a: vec4<f32>, b: vec4<f32>, is_max: bool, li: u32, sl: u32) -> array<vec4<f32>, 2> {
    let identity = select(vec4<f32>(0.0), vec4<f32>(NEG), is_max);
    if (li < 8u) { red[2u * li] = identity; red[2u * li + 1u] = identity; }
    workgroupBarrier();
    var ra = a;
    var rb = b;
    if (is_max) { ra = subgroupMax(a); rb = subgroupMax(b); } else { ra = subgroupAdd(a); rb = subgroupAdd(b); }
    if (sl == 0u) { red[2u * (li / 8u)] = ra; red[2u * (li / 8u) + 1u] = rb; }
    workgroupBarrier();
    var oa = red[0];
    var ob = red[1];
    for (var g = 1u; g < 8u; g++) {
        if (is_max) { oa = max(oa, red[2u * g]); ob = max(ob, red[2u * g + 1u]); }
        else { oa += red[2u * g]; ob += red[2u * g + 1u]; }
    }
    workgroupBarrier();
    return array<vec4<f32>, 2>(oa, ob);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32,
        @builtin(subgroup_invocation_id) sl: u32) {
    let h = wid.x;
    let tg = wid.y * 8u;
    if (tg >= step.n_tokens) { return; }
    let cnt = min(8u, step.n_tokens - tg);
    let d = p.head_dim;
    let d4 = d / 4u;
    let q_dim = p.n_heads * d;
    let kv_dim = p.n_kv * d;
    let kvh = h / (p.n_heads / p.n_kv);
    let lim = step.pos0 + tg;            // token tg + u sees keys <= lim + u
    let r0 = step.kv0;                   // one sequence: its first row in the cache
    let nk = lim + cnt;                  // keys the group's last token sees
    // This lane's token (past cnt: the last one again, not stored).
    let tu = min(sl % 8u, cnt - 1u);
    let qb = ((tg + tu) * q_dim + h * d) / 4u;
    let su = vec4<u32>(0u, 1u, 2u, 3u);

    // Scores, lanes over keys.
    var m0 = vec4<f32>(NEG);
    var m1 = vec4<f32>(NEG);
    for (var j0 = 0u; j0 < nk; j0 += 64u) {
        let j = j0 + li;
        let kb = ((r0 + min(j, nk - 1u)) * kv_dim + kvh * d) / 4u;
        var s0 = vec4<f32>(0.0);
        var s1 = vec4<f32>(0.0);
        for (var i = 0u; i < d4; i++) {
            let kv = k4_at(kb + i);
            let qv = q[qb + i];
            s0 += vec4<f32>(dot(kv, subgroupBroadcast(qv, 0u)), dot(kv, subgroupBroadcast(qv, 1u)),
                            dot(kv, subgroupBroadcast(qv, 2u)), dot(kv, subgroupBroadcast(qv, 3u)));
            s1 += vec4<f32>(dot(kv, subgroupBroadcast(qv, 4u)), dot(kv, subgroupBroadcast(qv, 5u)),
                            dot(kv, subgroupBroadcast(qv, 6u)), dot(kv, subgroupBroadcast(qv, 7u)));
        }
        let jv = vec4<u32>(j);
        s0 = select(vec4<f32>(NEG), s0 * p.scale, jv <= vec4<u32>(lim) + su);
        s1 = select(vec4<f32>(NEG), s1 * p.scale, jv <= vec4<u32>(lim + 4u) + su);
        if (j < nk) {
            for (var u = 0u; u < cnt; u++) {
                var v = 0.0;
                if (u < 4u) { v = s0[u]; } else { v = s1[u - 4u]; }
                scratch[((tg + u) * p.n_heads + h) * p.scratch_stride + j] = v;
            }
        }
        m0 = max(m0, s0);
        m1 = max(m1, s1);
    }
    let mx = reduce(m0, m1, true, li, sl);

    // exp(score - max) in place, and the sums.
    var z0 = vec4<f32>(0.0);
    var z1 = vec4<f32>(0.0);
    for (var j = li; j < nk; j += 64u) {
        for (var u = 0u; u < cnt; u++) {
            let o = ((tg + u) * p.n_heads + h) * p.scratch_stride + j;
            if (u < 4u) {
                let e = exp(scratch[o] - mx[0][u]);
                scratch[o] = e;
                z0[u] += e;
            } else {
                let e = exp(scratch[o] - mx[1][u - 4u]);
                scratch[o] = e;
                z1[u - 4u] += e;
            }
        }
    }
    let z = reduce(z0, z1, false, li, sl);
    // The probabilities were written by other invocations of this workgroup.
    storageBarrier();

    // out = p @ V, lanes over dims; lane l of each subgroup loads token l's probabilities.
    let prow = ((tg + tu) * p.n_heads + h) * p.scratch_stride;
    for (var i0 = 0u; i0 < d; i0 += 64u) {
        let i = min(i0 + li, d - 1u);
        var a0 = vec4<f32>(0.0);
        var a1 = vec4<f32>(0.0);
        for (var j = 0u; j < nk; j++) {
            // Keys past this lane's token are exp(NEG - max) = 0 in scratch.
            let pj = scratch[prow + j];
            let v = v_at((r0 + j) * kv_dim + kvh * d + i);
            a0 += v * vec4<f32>(subgroupBroadcast(pj, 0u), subgroupBroadcast(pj, 1u),
                                subgroupBroadcast(pj, 2u), subgroupBroadcast(pj, 3u));
            a1 += v * vec4<f32>(subgroupBroadcast(pj, 4u), subgroupBroadcast(pj, 5u),
                                subgroupBroadcast(pj, 6u), subgroupBroadcast(pj, 7u));
        }
        if (i0 + li < d) {
            a0 /= z[0];
            a1 /= z[1];
            for (var u = 0u; u < cnt; u++) {
                var v = 0.0;
                if (u < 4u) { v = a0[u]; } else { v = a1[u - 4u]; }
                out[(tg + u) * q_dim + h * d + i] = v;
            }
        }
    }
}

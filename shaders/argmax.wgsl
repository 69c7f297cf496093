// Greedy sampling on the GPU: the index of the largest logit of row `row`, lowest index on
// ties (as torch.argmax), with up to four token ids suppressed (EOS when it must not end
// the response). Writes the id where the next step's embedding reads it, so a decode step
// needs no CPU round trip; the host reads back these 4 bytes only to stream text.
// A row holding a non-finite value (NaN or +-inf: the model's numbers broke down) yields
// the id 0xffffffff instead, which the host turns into an error naming the step.
//
// Three modes (flags). Plain: one workgroup scans the whole row (CPU adapters, where a
// dispatch costs more than the scan). ARGMAX_PARTS: workgroup g of G scans its share of
// the row and writes (value bits, index, non-finite) to part[g]; ARGMAX_FROM_PARTS: one
// workgroup reduces the p.n parts into the id. WGSL has no fence between the workgroups of
// one dispatch, so GPUs take the second small dispatch: the vocabulary (600 KB at 151,936)
// spreads over G workgroups and the last one reads G parts of 16 bytes.

struct Params {
    n: u32,             // the row's length (ARGMAX_FROM_PARTS: the number of parts)
    n_suppress: u32,
    row_stride: u32,
    flags: u32,         // ARGMAX_LAST_ROW, ARGMAX_PARTS, ARGMAX_FROM_PARTS
    suppress: vec4<u32>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> token: array<u32>;
@group(0) @binding(4) var<storage, read_write> part: array<vec4<u32>>;

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;
var<workgroup> best_v: array<f32, 256>;
var<workgroup> best_i: array<u32, 256>;
// Set when any value of the row is NaN or infinite (workgroup memory starts zeroed).
var<workgroup> non_finite: atomic<u32>;

fn suppressed(i: u32) -> bool {
    for (var s = 0u; s < p.n_suppress; s++) {
        if (p.suppress[s] == i) { return true; }
    }
    return false;
}

// Whether candidate (ov, oi) replaces (mv, mi): a larger value, or the same at a lower
// index; NONE is no candidate.
fn better(ov: f32, oi: u32, mv: f32, mi: u32) -> bool {
    return oi != NONE && (mi == NONE || ov > mv || (ov == mv && oi < mi));
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    var bv = -3.4e38;
    var bi = NONE;
    if ((p.flags & ARGMAX_FROM_PARTS) != 0u) {
        for (var j = lid.x; j < p.n; j += WG) {
            probe_bytes(SITE_X, 16u);
            let q = part[j];
            if (q.z != 0u) { atomicOr(&non_finite, 1u); }
            let v = bitcast<f32>(q.x);
            if (better(v, q.y, bv, bi)) { bv = v; bi = q.y; }
        }
    } else {
        var row = 0u;
        if ((p.flags & ARGMAX_LAST_ROW) != 0u) { row = (step.n_tokens - 1u) * p.row_stride; }
        var lo = 0u;
        var hi = p.n;
        if ((p.flags & ARGMAX_PARTS) != 0u) {
            let per = (p.n + nwg.x - 1u) / nwg.x;
            lo = min(wid.x * per, p.n);
            hi = min(lo + per, p.n);
        }
        for (var i = lo + lid.x; i < hi; i += WG) {
            probe_bytes(SITE_X, 4u);
            let v = logits[row + i];
            // Exponent bits all ones: inf or NaN (a bit test, which no fast-math can drop).
            if ((bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u) { atomicOr(&non_finite, 1u); }
            // The first candidate is taken whatever its value, so a row of -inf or NaN
            // still yields a valid id (as sampling::argmax on the host).
            if ((bi == NONE || v > bv) && !suppressed(i)) { bv = v; bi = i; }
        }
    }
    best_v[lid.x] = bv;
    best_i[lid.x] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid.x < s) {
            let ov = best_v[lid.x + s];
            let oi = best_i[lid.x + s];
            if (better(ov, oi, best_v[lid.x], best_i[lid.x])) {
                best_v[lid.x] = ov;
                best_i[lid.x] = oi;
            }
        }
        workgroupBarrier();
    }
    if (lid.x == 0u) {
        let nf = atomicLoad(&non_finite);
        if ((p.flags & ARGMAX_PARTS) != 0u) {
            part[wid.x] = vec4<u32>(bitcast<u32>(best_v[0]), best_i[0], nf, 0u);
        } else if (nf != 0u) {
            token[0] = NONE;
        } else {
            token[0] = best_i[0];
        }
    }
}

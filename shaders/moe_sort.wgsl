// Orders the (token, top-k index) pairs of a step by expert, for the expert-major
// (prefill) W4A16 kernels: a stable counting sort, so each expert's pairs are contiguous
// and in token order. pairs[s] = t * top_k + j of sorted position s, pairs[pmax + s] its
// expert, pairs[2 pmax + e] the end of expert e's run (its start is the previous expert's
// end, or 0). One invocation
// does it serially: a step has at most chunk * top_k pairs (hundreds), and a parallel
// sort's barriers would cost more than the loop on the CPU adapters this path serves.

struct Params {
    n_experts: u32,
    top_k: u32,
    pmax: u32,           // capacity: chunk * top_k
    _a: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> pairs: array<u32>;

@compute @workgroup_size(1)
fn main() {
    let np = min(step.n_tokens * p.top_k, p.pmax);
    let cnt = 2u * p.pmax;
    let last = p.n_experts - 1u;
    for (var e = 0u; e < p.n_experts; e++) { pairs[cnt + e] = 0u; }
    for (var q = 0u; q < np; q++) {
        let e = min(ids[q], last);
        pairs[cnt + e] += 1u;
    }
    var run = 0u;
    for (var e = 0u; e < p.n_experts; e++) {
        let c = pairs[cnt + e];
        pairs[cnt + e] = run;
        run += c;
    }
    for (var q = 0u; q < np; q++) {
        let e = min(ids[q], last);
        let s = pairs[cnt + e];
        pairs[cnt + e] = s + 1u;
        pairs[s] = q;
        pairs[p.pmax + s] = e;
    }
}

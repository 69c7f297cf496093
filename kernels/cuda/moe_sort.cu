// Orders the step's (token, top-k index) pairs by expert for the tiled expert GEMMs
// (shaders/moe_sort.wgsl): a stable counting sort, so each expert's pairs are contiguous and
// in token order. pairs[s] = t * top_k + j of sorted position s, pairs[pmax + s] its expert,
// pairs[2 pmax + e] the end of expert e's run (its start is the previous expert's end, or 0).
// One thread does it serially, as the WGSL: a step has at most chunk * top_k pairs.

struct MoeSortParams { u32 n_experts; u32 top_k; u32 pmax; u32 _a; };
CHECK_PARAMS(MoeSortParams);

extern "C" __global__ void moe_sort(MoeSortParams p, const Step* step, const u32* ids, u32* pairs) {
    u32 np = min(step->n_tokens * p.top_k, p.pmax);
    u32 cnt = 2u * p.pmax;
    u32 last = p.n_experts - 1u;
    for (u32 e = 0; e < p.n_experts; e++) pairs[cnt + e] = 0u;
    for (u32 q = 0; q < np; q++) pairs[cnt + min(ids[q], last)] += 1u;
    u32 run = 0u;
    for (u32 e = 0; e < p.n_experts; e++) {
        u32 c = pairs[cnt + e];
        pairs[cnt + e] = run;
        run += c;
    }
    for (u32 q = 0; q < np; q++) {
        u32 e = min(ids[q], last);
        u32 s = pairs[cnt + e];
        pairs[cnt + e] = s + 1u;
        pairs[s] = q;
        pairs[p.pmax + s] = e;
    }
}

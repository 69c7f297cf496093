// Tiled expert GEMMs for GPUs (prefill steps), over the step's (token, top-k index) pairs
// sorted by expert (moe_sort.wgsl): a workgroup serves TM pairs of one expert's run and a
// tile of its rows, staging the pairs' activation rows and the (dequantised) weight rows in
// workgroup memory a step of KC columns at a time (neighbouring lanes load neighbouring
// 16-byte words), so each expert weight byte is read once per TM of its pairs:
//   gate/up (EXPERT_GEMM_DOWN off): h[t, j, n] = silu(gate_e[n] . x_t) * (up_e[n] . x_t)
//   down    (EXPERT_GEMM_DOWN):     y[t, j, m] = down_e[m] . h[t, j, :]
// for the pairs (t, j) routed to expert e; the combine adds y afterwards. Pairs are read
// and written at their (t, j) rows, so nothing is gathered. Experts whose slot is not in
// this chunk of the pool are left to another dispatch. With FFN_FIXED_SLOT (a dense MLP,
// Qwen's shared expert) slot 0 serves every token, top_k is 1 and the pairs are the
// tokens. Grid: (row tiles, experts (1 fixed), pair tiles of a run).

struct Params {
    in_dim: u32,          // input features (hidden for gate/up, inter for down)
    out_dim: u32,         // output rows (inter for gate/up, hidden for down)
    top_k: u32,
    pmax: u32,            // pair capacity (offset of the experts' run ends in `pairs`)
    n_experts: u32,
    slot_words: u32,
    first_slot: u32,
    chunk_slots: u32,
    a_w: u32,             // word offset of the first matrix inside a slot (gate, or down)
    b_w: u32,             // of the second (up)
    a_s: u32,             // u32 offset of their scales inside a slot
    b_s: u32,
    words_per_row: u32,
    blocks_per_row: u32,
    flags: u32,           // EXPERT_GEMM_DOWN, FFN_FIXED_SLOT
    _a: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// binding 2 and 3: x [T, hidden] (gate/up) or h [T, top_k, inter] (down), from the
// activation piece; 10 (and 11): the pool chunk.
@group(0) @binding(4) var<storage, read> pairs: array<u32>;
@group(0) @binding(5) var<storage, read> slot_of: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

const TM: u32 = 16u;
const TN: u32 = 16u;
const KC: u32 = 64u;
const WP: u32 = 65u;
var<workgroup> xt: array<f32, 1024>;
// Two weight tiles of TN rows: gate and up (down uses the first).
var<workgroup> wt: array<f32, 2080>;

// Sorted pair `i`: its (token, top-k index) row t * top_k + j, or, fixed, the token.
fn pair_at(i: u32, fixed: bool) -> u32 {
    if (fixed) { return i; }
    probe(SITE_OTHER, i * 4u, 4u);
    return pairs[i];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let down = (p.flags & EXPERT_GEMM_DOWN) != 0u;
    let fixed = (p.flags & FFN_FIXED_SLOT) != 0u;
    let e = wid.y;
    if (e >= p.n_experts || step.n_tokens == 0u) { return; }
    // Expert e's sorted pairs [s, q): moe_sort left each count slot at its run's end.
    var q = step.n_tokens;
    var s = 0u;
    var slot = 0u;
    if (!fixed) {
        let cnt = 2u * p.pmax;
        probe(SITE_OTHER, (cnt + e) * 4u, 4u);
        q = pairs[cnt + e];
        if (e > 0u) { s = pairs[cnt + e - 1u]; }
        slot = slot_of[e];
    }
    let p0 = s + wid.z * TM;
    let n0 = wid.x * TN;
    if (p0 >= q || n0 >= p.out_dim) { return; }
    let np = min(TM, q - p0);
    if (slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) { return; }
    let sw = (slot - p.first_slot) * p.slot_words;
    let nr = min(TN, p.out_dim - n0);
    let nb = p.blocks_per_row;
    let as0 = (sw * 4u + p.a_s) * 2u;
    let bs0 = (sw * 4u + p.b_s) * 2u;
    stage_scales(0u, as0 + n0 * nb, as0 + (n0 + nr) * nb, li);
    if (!down) { stage_scales(1u, bs0 + n0 * nb, bs0 + (n0 + nr) * nb, li); }
    let wpc = KC / WORD_COLS;
    let r = li % TN;
    let g = li / TN;
    var ga = vec4<f32>(0.0);
    var ua = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < p.in_dim; k0 += KC) {
        workgroupBarrier();
        for (var i = li; i < TM * KC / 4u; i += 64u) {
            let pp = i / (KC / 4u);
            let col = k0 + (i % (KC / 4u)) * 4u;
            var v = vec4<f32>(0.0);
            if (pp < np) {
                let pair = pair_at(p0 + pp, fixed);
                // gate/up read the pair's token row, down the pair's own intermediate row.
                var base = (pair / p.top_k) * p.in_dim;
                if (down) { base = pair * p.in_dim; }
                v = x_quad(base, col, p.in_dim);
            }
            let d = pp * KC + (i % (KC / 4u)) * 4u;
            xt[d] = v.x; xt[d + 1u] = v.y; xt[d + 2u] = v.z; xt[d + 3u] = v.w;
        }
        let mats = select(2u, 1u, down);
        for (var i = li; i < mats * TN * wpc; i += 64u) {
            let mi = i / (TN * wpc);
            let rr = (i / wpc) % TN;
            let c = k0 / WORD_COLS + i % wpc;
            let n = n0 + rr;
            let w0 = select(p.a_w, p.b_w, mi == 1u);
            let s0 = select(as0, bs0, mi == 1u);
            stage_word(mi, sw + w0 + n * p.words_per_row, c, s0 + n * nb,
                       mi * TN * WP + rr * WP + (i % wpc) * WORD_COLS, rr < nr && c < p.words_per_row);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < KC; kk++) {
            let b = g * 4u * KC + kk;
            let x = vec4<f32>(xt[b], xt[b + KC], xt[b + 2u * KC], xt[b + 3u * KC]);
            ga += x * wt[r * WP + kk];
            if (!down) { ua += x * wt[TN * WP + r * WP + kk]; }
        }
    }
    if (r >= nr) { return; }
    // silu(g) = g * sigmoid(g)
    var v = ga;
    if (!down) { v = ga / (vec4<f32>(1.0) + exp(-ga)) * ua; }
    for (var i = 0u; i < 4u; i++) {
        let pp = g * 4u + i;
        if (pp < np) {
            out[pair_at(p0 + pp, fixed) * p.out_dim + n0 + r] = v[i];
        }
    }
}

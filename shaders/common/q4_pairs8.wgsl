// The expert-major W4A16 kernels for CPU adapters (ffn_gate_up_q4_e.wgsl,
// ffn_down_q4_e.wgsl): two INT4 rows against 8 sorted pairs at a time, lane l of each
// subgroup holding pair l's activations and subgroupBroadcast handing them to the others
// (llvmpipe loads even lane-invariant addresses lane by lane: one useful load per lane
// instead of eight copies). Needs subgroups of at least 8 lanes, and `p`, `pairs` and
// `slot_of` from the kernel.

// What workgroup column e serves: expert e's sorted pairs [s, q) (moe_sort left each
// count slot at its run's end) and the vec4 offset `sv` of its slot in this dispatch's
// chunk; s == q when it has no pairs, or another chunk holds its slot.
struct ExpertRun { s: u32, q: u32, sv: u32 }

fn expert_run(e: u32) -> ExpertRun {
    let none = ExpertRun(0u, 0u, 0u);
    if (e >= p.n_experts || step.n_tokens == 0u) { return none; }
    let cnt = 2u * p.pmax;
    var s = 0u;
    if (e > 0u) { s = pairs[cnt + e - 1u]; }
    let q = pairs[cnt + e];
    let slot = slot_of[e];
    if (s >= q || slot < p.first_slot || slot >= p.first_slot + p.chunk_slots) { return none; }
    return ExpertRun(s, q, (slot - p.first_slot) * p.slot_vec4);
}

// Rows a and b against pairs 0..4 (a0, b0) and 4..8 (a1, b1).
struct Acc8 { a0: vec4<f32>, a1: vec4<f32>, b0: vec4<f32>, b1: vec4<f32> }

fn acc8_zero() -> Acc8 {
    return Acc8(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
}

// Kernels call this four times per vec4 word, inline: a helper taking the vec4 words and
// making the four calls made llvmpipe (Mesa 22.3) leak host memory on every dispatch
// (`run --decode-kernels storage` on olmoe-tiny: 2.1 MB instead of 0.28 MB per token).
// One word of rows a (`wa`, block scale `sa`) and b against the 8 pairs' columns i .. i + 8
// (this lane's pair as xa, xb), accumulated.
fn word_pairs8(acc: Acc8, wa: u32, wb: u32, sa: f32, sb: f32, xa: vec4<f32>, xb: vec4<f32>) -> Acc8 {
    let al = lo4(wa, sa);
    let ah = hi4(wa, sa);
    let bl = lo4(wb, sb);
    let bh = hi4(wb, sb);
    let p0 = subgroupBroadcast(xa, 0u); let q0 = subgroupBroadcast(xb, 0u);
    let p1 = subgroupBroadcast(xa, 1u); let q1 = subgroupBroadcast(xb, 1u);
    let p2 = subgroupBroadcast(xa, 2u); let q2 = subgroupBroadcast(xb, 2u);
    let p3 = subgroupBroadcast(xa, 3u); let q3 = subgroupBroadcast(xb, 3u);
    let p4 = subgroupBroadcast(xa, 4u); let q4 = subgroupBroadcast(xb, 4u);
    let p5 = subgroupBroadcast(xa, 5u); let q5 = subgroupBroadcast(xb, 5u);
    let p6 = subgroupBroadcast(xa, 6u); let q6 = subgroupBroadcast(xb, 6u);
    let p7 = subgroupBroadcast(xa, 7u); let q7 = subgroupBroadcast(xb, 7u);
    return Acc8(
        acc.a0 + vec4<f32>(dot(al, p0) + dot(ah, q0), dot(al, p1) + dot(ah, q1),
                           dot(al, p2) + dot(ah, q2), dot(al, p3) + dot(ah, q3)),
        acc.a1 + vec4<f32>(dot(al, p4) + dot(ah, q4), dot(al, p5) + dot(ah, q5),
                           dot(al, p6) + dot(ah, q6), dot(al, p7) + dot(ah, q7)),
        acc.b0 + vec4<f32>(dot(bl, p0) + dot(bh, q0), dot(bl, p1) + dot(bh, q1),
                           dot(bl, p2) + dot(bh, q2), dot(bl, p3) + dot(bh, q3)),
        acc.b1 + vec4<f32>(dot(bl, p4) + dot(bh, q4), dot(bl, p5) + dot(bh, q5),
                           dot(bl, p6) + dot(bh, q6), dot(bl, p7) + dot(bh, q7)));
}

// Pair j (< 8) of a row's results.
fn pair8(lo: vec4<f32>, hi: vec4<f32>, j: u32) -> f32 {
    if (j < 4u) { return lo[j]; }
    return hi[j - 4u];
}

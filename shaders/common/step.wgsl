// Per-submission state every kernel reads at binding 1 (the Rust twin is
// `backend::params::StepUniform`): where the step's tokens start in the sequence, how many
// there are, and where the sequence's rows start in the KV cache (kv0: a `serve
// --parallel` slot's region). A batched step (batched != 0) holds one token of each of
// several sequences: token t sits at position tok[t].x and its sequence's rows start at
// tok[t].y; only rope_kv and the per-token attention kernels read such a step.
struct Step { pos0: u32, n_tokens: u32, kv0: u32, batched: u32, tok: array<vec4<u32>, 64> }
@group(0) @binding(1) var<uniform> step: Step;

// Token t's position in its sequence.
fn tok_pos(t: u32) -> u32 {
    if (step.batched != 0u) { return step.tok[t].x; }
    return step.pos0 + t;
}

// The KV cache row where token t's sequence starts.
fn tok_kv0(t: u32) -> u32 {
    if (step.batched != 0u) { return step.tok[t].y; }
    return step.kv0;
}

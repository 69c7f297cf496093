// Per-submission state every kernel reads at binding 1: where the step's tokens start in
// the sequence and how many there are (the Rust twin is `backend::params::Step`).
struct Step { pos0: u32, n_tokens: u32, _a: u32, _b: u32 }
@group(0) @binding(1) var<uniform> step: Step;

// One invocation per output row: portable, no subgroup operations.
const LANES: u32 = 1u;

// This invocation's lane within its row: always 0. A constant, not `li % 1u`, so that
// values derived from it stay uniform across the workgroup (llvmpipe then loads a uniform
// window's address once for all lanes).
fn row_lane(li: u32) -> u32 {
    return 0u;
}

fn reduce_lanes(v: f32) -> f32 {
    return v;
}

// Store (or add) a row's result: the one invocation of the row does, unconditionally
// (rows past the end returned early). Straight-line on purpose: a guarded store here made
// llvmpipe compile the kernels about 3x slower.
fn store_row(i: u32, v: f32, lane: u32, row: u32, rows: u32) {
    out[i] = v;
}

fn add_row(i: u32, v: f32, lane: u32, row: u32, rows: u32) {
    out[i] += v;
}

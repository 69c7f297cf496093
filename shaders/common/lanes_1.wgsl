// One invocation per output row: portable, no subgroup operations.
const LANES: u32 = 1u;

fn reduce_lanes(v: f32) -> f32 {
    return v;
}

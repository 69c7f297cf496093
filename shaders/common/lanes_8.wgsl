// A row per 8 consecutive lanes of one subgroup (needs SUBGROUP with subgroups of at least
// 8 lanes): lane l takes vec4 l of every 256-input block, so the 8 lanes of a row read 128
// contiguous bytes and one scale each, and their partial sums are combined with shuffles.
const LANES: u32 = 8u;

// This invocation's lane within its row of 8.
fn row_lane(li: u32) -> u32 {
    return li % 8u;
}

fn reduce_lanes(v: f32) -> f32 {
    var s = v;
    s += subgroupShuffleXor(s, 4u);
    s += subgroupShuffleXor(s, 2u);
    s += subgroupShuffleXor(s, 1u);
    return s;
}

// Store (or add) a row's result: lane 0 of each row inside the matrix (the rows past the
// end computed a copy of the last row and store nothing).
fn store_row(i: u32, v: f32, lane: u32, row: u32, rows: u32) {
    if (lane == 0u && row < rows) { out[i] = v; }
}

fn add_row(i: u32, v: f32, lane: u32, row: u32, rows: u32) {
    if (lane == 0u && row < rows) { out[i] += v; }
}

// A row per 8 consecutive lanes of one subgroup (needs SUBGROUP with subgroups of at least
// 8 lanes): lane l takes vec4 l of every 256-input block, so the 8 lanes of a row read 128
// contiguous bytes and one scale each, and their partial sums are combined with shuffles.
const LANES: u32 = 8u;

fn reduce_lanes(v: f32) -> f32 {
    var s = v;
    s += subgroupShuffleXor(s, 4u);
    s += subgroupShuffleXor(s, 2u);
    s += subgroupShuffleXor(s, 1u);
    return s;
}

// The max and the sum of a scalar over the 64 lanes of a workgroup through workgroup
// memory (a tree, six barriers; no subgroup operations), the result in every lane. Every
// lane calls them, in uniform control flow: they hold barriers.
var<workgroup> red: array<f32, 64>;

fn wg_max(v: f32, li: u32) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (li < s) { red[li] = max(red[li], red[li + s]); }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn wg_sum(v: f32, li: u32) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (li < s) { red[li] += red[li + s]; }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

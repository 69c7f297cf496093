// Workgroup sums through workgroup memory alone (portable: no subgroup operations;
// `--portable-kernels`): a tree over the 64 lanes, six barriers. Same interface as
// reduce_sg.wgsl.
struct Inv {
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
}

var<workgroup> red: array<vec4<f32>, 64>;

// The sum of `v` over the 64 lanes, in lane 0 (the other lanes' value is unspecified).
// Every lane calls it, in uniform control flow: it holds barriers.
fn wg_sum4(v: vec4<f32>, inv: Inv) -> vec4<f32> {
    red[inv.li] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (inv.li < s) { red[inv.li] += red[inv.li + s]; }
        workgroupBarrier();
    }
    let t = red[0];
    workgroupBarrier();
    return t;
}

// Workgroup sums through subgroups (needs SUBGROUP; any subgroup size, 4 to 128 lanes):
// each subgroup adds its lanes with subgroupAdd, its first lane leaves the sum in
// workgroup memory, and lane 0 adds the subgroups' sums. The kernel's entry point takes
// its builtins as `inv: Inv`, so the portable piece (reduce_wg.wgsl) can declare fewer.
struct Inv {
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_id) sg_id: u32,
    @builtin(num_subgroups) n_sg: u32,
}

var<workgroup> red: array<vec4<f32>, 64>;

// The sum of `v` over the 64 lanes, in lane 0 (the other lanes' value is unspecified).
// Every lane calls it, in uniform control flow: it holds barriers.
fn wg_sum4(v: vec4<f32>, inv: Inv) -> vec4<f32> {
    let s = subgroupAdd(v);
    if (inv.sg_lane == 0u) { red[inv.sg_id] = s; }
    workgroupBarrier();
    var t = vec4<f32>(0.0);
    if (inv.li == 0u) {
        for (var i = 0u; i < inv.n_sg; i++) { t += red[i]; }
    }
    workgroupBarrier();
    return t;
}

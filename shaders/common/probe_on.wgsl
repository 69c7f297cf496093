// The memory-access probe, on (a probe build, `wgmoe kernels`; needs SUBGROUP): at each
// global load, the active lanes of the subgroup count the distinct 32-byte sectors their
// addresses touch and the distinct addresses they read (each `size` bytes, aligned, so a
// load never straddles a sector), and one lane adds them to the site's counters:
// [requests, sectors, bytes used, 0]. On lavapipe with LP_NATIVE_VECTOR_WIDTH=1024 a
// subgroup is 32 lanes run in lockstep, as a warp, so sectors per request is what Nsight
// Compute reports. Distinct values are counted by retiring the smallest one left each
// round (subgroupMin), so inactive lanes never take part.
@group(0) @binding(14) var<storage, read_write> probe_counts: array<atomic<u32>>;

fn probe_distinct(v: u32) -> u32 {
    var left = true;
    var n = 0u;
    loop {
        if (!subgroupAny(left)) { break; }
        let m = subgroupMin(select(0xffffffffu, v, left));
        if (v == m) { left = false; }
        n += 1u;
    }
    return n;
}

fn probe(site: u32, byte: u32, size: u32) {
    let sectors = probe_distinct(byte / 32u);
    let words = probe_distinct(byte / size);
    if (subgroupExclusiveAdd(1u) == 0u) {
        atomicAdd(&probe_counts[site * 4u], 1u);
        atomicAdd(&probe_counts[site * 4u + 1u], sectors);
        atomicAdd(&probe_counts[site * 4u + 2u], words * size);
    }
}

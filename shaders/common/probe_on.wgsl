// The memory-access probe, on (a probe build, `wgmoe kernels`; needs SUBGROUP). At each
// weight or KV-cache load, the active lanes of the subgroup count the distinct addresses
// they read (each `size` bytes, aligned, so a load never straddles a sector) and the
// distinct 32-byte sectors those touch, and one lane adds them to the site's counters:
// [requests, sectors, bytes used, lanes]. Distinct addresses are counted by retiring the
// smallest one left each round (subgroupMin), so inactive lanes never take part; they
// retire in ascending order, so a new sector is one unlike the previous round's.
// Activation loads (probe_bytes) only count their lanes' bytes: they are small and cached.
// lavapipe executes subgroups of at most 16 lanes (it reports 32 with
// LP_NATIVE_VECTOR_WIDTH=1024): a request here is half an NVIDIA warp.
@group(0) @binding(14) var<storage, read_write> probe_counts: array<atomic<u32>>;

fn probe(site: u32, byte: u32, size: u32) {
    let word = byte / size;
    let per_sector = max(32u / size, 1u);
    let lanes = subgroupAdd(1u);
    var words = 0u;
    var sectors = 0u;
    // Fast path (and the common one): the active lanes read consecutive words in lane order.
    let run = word - subgroupExclusiveAdd(1u);
    let first = subgroupMin(run);
    if (first == subgroupMax(run)) {
        words = lanes;
        sectors = (first + lanes - 1u) / per_sector - first / per_sector + 1u;
    } else {
        var left = true;
        var last = 0xffffffffu;
        loop {
            let m = subgroupMin(select(0xffffffffu, word, left));
            if (m == 0xffffffffu) { break; }
            if (word == m) { left = false; }
            words += 1u;
            let s = m / per_sector;
            if (s != last) { sectors += 1u; last = s; }
        }
    }
    if (subgroupExclusiveAdd(1u) == 0u) {
        atomicAdd(&probe_counts[site * 4u], 1u);
        atomicAdd(&probe_counts[site * 4u + 1u], sectors);
        atomicAdd(&probe_counts[site * 4u + 2u], words * size);
        atomicAdd(&probe_counts[site * 4u + 3u], lanes);
    }
}

fn probe_bytes(site: u32, size: u32) {
    let lanes = subgroupAdd(1u);
    if (subgroupExclusiveAdd(1u) == 0u) {
        atomicAdd(&probe_counts[site * 4u], 1u);
        atomicAdd(&probe_counts[site * 4u + 2u], lanes * size);
        atomicAdd(&probe_counts[site * 4u + 3u], lanes);
    }
}

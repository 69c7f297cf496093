// The memory-access probe, off: kernels call probe() / probe_bytes() beside their global
// loads and they compile to nothing.
fn probe(site: u32, byte: u32, size: u32) {}

fn probe_bytes(site: u32, size: u32) {}

// Greedy sampling on the GPU: the index of the largest logit of row `row`, lowest index on
// ties (as torch.argmax), with up to four token ids suppressed (EOS when it must not end
// the response). Writes the id where the next step's embedding reads it, so a decode step
// needs no CPU round trip; the host reads back these 4 bytes only to stream text.
// A row holding a non-finite value (NaN or +-inf: the model's numbers broke down) yields
// the id 0xffffffff instead, which the host turns into an error naming the step.

struct Params {
    n: u32,
    n_suppress: u32,
    row_stride: u32,
    flags: u32,         // ARGMAX_LAST_ROW
    suppress: vec4<u32>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> token: array<u32>;

const WG: u32 = 256u;
var<workgroup> best_v: array<f32, 256>;
var<workgroup> best_i: array<u32, 256>;
// Set when any value of the row is NaN or infinite (workgroup memory starts zeroed).
var<workgroup> non_finite: atomic<u32>;

fn suppressed(i: u32) -> bool {
    for (var s = 0u; s < p.n_suppress; s++) {
        if (p.suppress[s] == i) { return true; }
    }
    return false;
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {
    var row = 0u;
    if ((p.flags & ARGMAX_LAST_ROW) != 0u) { row = (step.n_tokens - 1u) * p.row_stride; }
    var bv = -3.4e38;
    var bi = 0xffffffffu;
    for (var i = lid.x; i < p.n; i += WG) {
        probe_bytes(SITE_X, 4u);
        let v = logits[row + i];
        // Exponent bits all ones: inf or NaN (a bit test, which no fast-math can drop).
        if ((bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u) { atomicOr(&non_finite, 1u); }
        // The first candidate is taken whatever its value, so a row of -inf or NaN still
        // yields a valid id (as sampling::argmax on the host).
        if ((bi == 0xffffffffu || v > bv) && !suppressed(i)) { bv = v; bi = i; }
    }
    best_v[lid.x] = bv;
    best_i[lid.x] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid.x < s) {
            let ov = best_v[lid.x + s];
            let oi = best_i[lid.x + s];
            let mine = best_i[lid.x];
            let better = ov > best_v[lid.x] || (ov == best_v[lid.x] && oi < mine);
            if (oi != 0xffffffffu && (mine == 0xffffffffu || better)) {
                best_v[lid.x] = ov;
                best_i[lid.x] = oi;
            }
        }
        workgroupBarrier();
    }
    if (lid.x == 0u) {
        if (atomicLoad(&non_finite) != 0u) {
            token[0] = 0xffffffffu;
        } else {
            token[0] = best_i[0];
        }
    }
}

// Embedding gather: x[t, :] = f32(table[ids[t], :]) for the tokens whose row lives in this
// chunk of the table. Tables larger than one storage binding are split by rows into
// chunks, one dispatch each; a token outside the chunk is left to another dispatch.

struct Params {
    hidden: u32,
    row_start: u32,      // first vocabulary row held by this chunk
    rows: u32,           // rows in this chunk
    words_per_row: u32,  // u32 words per row (two f16 each, row padded to 8 halves)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read> table: array<u32>;
@group(0) @binding(4) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let h = gid.x;
    let t = gid.y;
    if (h >= p.hidden || t >= step.n_tokens) { return; }
    let id = ids[t];
    if (id < p.row_start || id >= p.row_start + p.rows) { return; }
    let wi = (id - p.row_start) * p.words_per_row + h / 2u;
    probe(SITE_OTHER, wi * 4u, 4u);
    let word = table[wi];
    x[t * p.hidden + h] = unpack2x16float(word)[h % 2u];
}

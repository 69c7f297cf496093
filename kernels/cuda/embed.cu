// Embedding gather (shaders/embed.wgsl): x[t, :] = f32(table[ids[t], :]) for the tokens
// whose row lives in this chunk of the table. Grid (hidden / 64, tokens), block 64.

struct EmbedParams { u32 hidden; u32 row_start; u32 rows; u32 words_per_row; };
CHECK_PARAMS(EmbedParams);

extern "C" __global__ void embed(EmbedParams p, const Step* step, const u32* ids,
                                 const u32* table, float* x) {
    u32 h = blockIdx.x * blockDim.x + threadIdx.x;
    u32 t = blockIdx.y;
    if (h >= p.hidden || t >= step->n_tokens) return;
    u32 id = ids[t];
    if (id < p.row_start || id >= p.row_start + p.rows) return;
    u32 word = table[(id - p.row_start) * p.words_per_row + h / 2u];
    x[t * p.hidden + h] = f16_to_f32((h % 2u) ? (word >> 16) : word);
}

// INT4 weights (layout in src/blocks/quant.rs): two nibbles per byte, 8 columns per u32 word
// (low nibbles of its bytes are columns 0..3, high nibbles 4..7), stored value = q + 8;
// one f16 scale per 256-input block, two per u32 word of `ws` (declared by the kernel).

// Scale `half_index` of the scales starting at u32 word `word_base`.
fn q4_scale(word_base: u32, half_index: u32) -> f32 {
    probe(SITE_WS, (word_base + half_index / 2u) * 4u, 4u);
    return unpack2x16float(ws[word_base + half_index / 2u])[half_index % 2u];
}

// Word `i` of the nibbles (`wq`, declared by the kernel).
fn wq_at(i: u32) -> vec4<u32> {
    probe(SITE_W, i * 16u, 16u);
    return wq[i];
}

// Columns 0..3 (lo4) or 4..7 (hi4) of one word, times the block scale.
fn lo4(w: u32, s: f32) -> vec4<f32> {
    return (vec4<f32>(unpack4xU8(w & 0x0F0F0F0Fu)) - vec4<f32>(8.0)) * s;
}

fn hi4(w: u32, s: f32) -> vec4<f32> {
    return (vec4<f32>(unpack4xU8((w >> 4u) & 0x0F0F0F0Fu)) - vec4<f32>(8.0)) * s;
}

//! A small GGUF writer for tests: hand-built files, valid or broken on purpose.

#![allow(dead_code)]

/// A metadata value as written.
#[derive(Clone, Debug)]
pub enum V {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    U64(u64),
    I64(i64),
    F64(f64),
    /// Element type id and elements.
    Arr(u32, Vec<V>),
}

pub fn s(x: &str) -> V {
    V::Str(x.to_string())
}

impl V {
    fn type_id(&self) -> u32 {
        match self {
            V::U8(_) => 0,
            V::I8(_) => 1,
            V::U16(_) => 2,
            V::I16(_) => 3,
            V::U32(_) => 4,
            V::I32(_) => 5,
            V::F32(_) => 6,
            V::Bool(_) => 7,
            V::Str(_) => 8,
            V::Arr(..) => 9,
            V::U64(_) => 10,
            V::I64(_) => 11,
            V::F64(_) => 12,
        }
    }

    fn write(&self, o: &mut Vec<u8>) {
        match self {
            V::U8(v) => o.push(*v),
            V::I8(v) => o.push(*v as u8),
            V::U16(v) => o.extend(v.to_le_bytes()),
            V::I16(v) => o.extend(v.to_le_bytes()),
            V::U32(v) => o.extend(v.to_le_bytes()),
            V::I32(v) => o.extend(v.to_le_bytes()),
            V::F32(v) => o.extend(v.to_le_bytes()),
            V::Bool(v) => o.push(*v as u8),
            V::Str(v) => write_str(o, v),
            V::U64(v) => o.extend(v.to_le_bytes()),
            V::I64(v) => o.extend(v.to_le_bytes()),
            V::F64(v) => o.extend(v.to_le_bytes()),
            V::Arr(t, items) => {
                o.extend(t.to_le_bytes());
                o.extend((items.len() as u64).to_le_bytes());
                for i in items {
                    i.write(o);
                }
            }
        }
    }
}

fn write_str(o: &mut Vec<u8>, v: &str) {
    o.extend((v.len() as u64).to_le_bytes());
    o.extend(v.as_bytes());
}

#[derive(Clone, Debug)]
pub struct T {
    pub name: String,
    pub ne: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
    /// Write this offset instead of the laid-out one.
    pub offset: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct Gguf {
    pub version: u32,
    pub kv: Vec<(String, V)>,
    pub tensors: Vec<T>,
    /// Alignment used to lay out the data (write `general.alignment` yourself to declare it).
    pub alignment: u64,
}

impl Default for Gguf {
    fn default() -> Self {
        Gguf {
            version: 3,
            kv: Vec::new(),
            tensors: Vec::new(),
            alignment: 32,
        }
    }
}

impl Gguf {
    pub fn kv(mut self, k: &str, v: V) -> Self {
        self.kv.push((k.to_string(), v));
        self
    }

    pub fn set(&mut self, k: &str, v: V) {
        match self.kv.iter_mut().find(|(key, _)| key == k) {
            Some(e) => e.1 = v,
            None => self.kv.push((k.to_string(), v)),
        }
    }

    pub fn remove(&mut self, k: &str) {
        self.kv.retain(|(key, _)| key != k);
    }

    pub fn tensor(mut self, name: &str, ne: &[u64], type_id: u32, data: Vec<u8>) -> Self {
        self.tensors.push(T {
            name: name.to_string(),
            ne: ne.to_vec(),
            type_id,
            data,
            offset: None,
        });
        self
    }

    /// An f32 tensor of the given shape, values 0.01 * index.
    pub fn f32_tensor(self, name: &str, ne: &[u64]) -> Self {
        let n: u64 = ne.iter().product();
        let data = (0..n)
            .flat_map(|i| (i as f32 * 0.01).to_le_bytes())
            .collect();
        self.tensor(name, ne, 0, data)
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut o = Vec::new();
        o.extend(b"GGUF");
        o.extend(self.version.to_le_bytes());
        o.extend((self.tensors.len() as u64).to_le_bytes());
        o.extend((self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            write_str(&mut o, k);
            o.extend(v.type_id().to_le_bytes());
            v.write(&mut o);
        }
        let a = self.alignment;
        let mut offsets = Vec::new();
        let mut off = 0u64;
        for t in &self.tensors {
            offsets.push(t.offset.unwrap_or(off));
            off = (off + t.data.len() as u64).div_ceil(a) * a;
        }
        for (t, &offset) in self.tensors.iter().zip(&offsets) {
            write_str(&mut o, &t.name);
            o.extend((t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                o.extend(d.to_le_bytes());
            }
            o.extend(t.type_id.to_le_bytes());
            o.extend(offset.to_le_bytes());
        }
        while !(o.len() as u64).is_multiple_of(a) {
            o.push(0);
        }
        let data_start = o.len();
        for (t, &offset) in self.tensors.iter().zip(&offsets) {
            let at = data_start + offset as usize;
            if o.len() < at + t.data.len() {
                o.resize(at + t.data.len(), 0);
            }
            o[at..at + t.data.len()].copy_from_slice(&t.data);
        }
        o
    }

    pub fn write(&self, path: &std::path::Path) {
        std::fs::write(path, self.bytes()).unwrap();
    }
}

/// A complete small model of `arch` ("olmoe", "qwen2moe", "qwen3moe" or "llama") in f32:
/// hidden 16, 2 layers, 2 heads of 8 (kv 1, olmoe 2), 4 experts top-2, expert ff 8, vocab 12.
pub fn tiny_model(arch: &str) -> Gguf {
    let (e, ff, n_exp, vocab, layers, heads, hd) = (16u64, 8u64, 4u64, 12u64, 2, 2u64, 8u64);
    let kvh = if arch == "olmoe" { 2 } else { 1 };
    let q = heads * hd;
    let kv = kvh * hd;
    let a = |k: &str| format!("{arch}.{k}");
    let tokens: Vec<V> = (0..vocab).map(|i| s(&format!("t{i}"))).collect();
    let mut g = Gguf::default()
        .kv("general.architecture", s(arch))
        .kv(&a("block_count"), V::U32(layers))
        .kv(&a("context_length"), V::U32(128))
        .kv(&a("embedding_length"), V::U32(e as u32))
        .kv(&a("attention.head_count"), V::U32(heads as u32))
        .kv(&a("attention.head_count_kv"), V::U32(kvh as u32))
        .kv(&a("attention.layer_norm_rms_epsilon"), V::F32(1e-6))
        .kv(&a("rope.freq_base"), V::F32(10000.0))
        .kv(&a("expert_count"), V::U32(n_exp as u32))
        .kv(&a("expert_used_count"), V::U32(2))
        .kv("tokenizer.ggml.model", s("gpt2"))
        .kv("tokenizer.ggml.pre", s("gpt-2"))
        .kv("tokenizer.ggml.tokens", V::Arr(8, tokens))
        .kv("tokenizer.ggml.merges", V::Arr(8, vec![]))
        .kv("tokenizer.ggml.eos_token_id", V::U32(11));
    match arch {
        "qwen2moe" | "qwen3moe" => {
            g = g
                .kv(&a("expert_feed_forward_length"), V::U32(ff as u32))
                .kv(&a("feed_forward_length"), V::U32(32))
        }
        _ => g = g.kv(&a("feed_forward_length"), V::U32(ff as u32)),
    }
    if arch == "qwen2moe" {
        g = g.kv(&a("expert_shared_feed_forward_length"), V::U32(24));
    }
    if arch == "qwen3moe" {
        g = g.kv(&a("attention.key_length"), V::U32(hd as u32));
    }
    g = g
        .f32_tensor("token_embd.weight", &[e, vocab])
        .f32_tensor("output_norm.weight", &[e])
        .f32_tensor("output.weight", &[e, vocab]);
    for l in 0..layers {
        let n = |x: &str| format!("blk.{l}.{x}");
        g = g
            .f32_tensor(&n("attn_norm.weight"), &[e])
            .f32_tensor(&n("attn_q.weight"), &[e, q])
            .f32_tensor(&n("attn_k.weight"), &[e, kv])
            .f32_tensor(&n("attn_v.weight"), &[e, kv])
            .f32_tensor(&n("attn_output.weight"), &[q, e])
            .f32_tensor(&n("ffn_norm.weight"), &[e])
            .f32_tensor(&n("ffn_gate_inp.weight"), &[e, n_exp])
            .f32_tensor(&n("ffn_gate_exps.weight"), &[e, ff, n_exp])
            .f32_tensor(&n("ffn_up_exps.weight"), &[e, ff, n_exp])
            .f32_tensor(&n("ffn_down_exps.weight"), &[ff, e, n_exp]);
        match arch {
            "olmoe" => {
                g = g
                    .f32_tensor(&n("attn_q_norm.weight"), &[q])
                    .f32_tensor(&n("attn_k_norm.weight"), &[kv])
            }
            "qwen3moe" => {
                g = g
                    .f32_tensor(&n("attn_q_norm.weight"), &[hd])
                    .f32_tensor(&n("attn_k_norm.weight"), &[hd])
            }
            "qwen2moe" => {
                g = g
                    .f32_tensor(&n("attn_q.bias"), &[q])
                    .f32_tensor(&n("attn_k.bias"), &[kv])
                    .f32_tensor(&n("attn_v.bias"), &[kv])
                    .f32_tensor(&n("ffn_gate_shexp.weight"), &[e, 24])
                    .f32_tensor(&n("ffn_up_shexp.weight"), &[e, 24])
                    .f32_tensor(&n("ffn_down_shexp.weight"), &[24, e])
                    .f32_tensor(&n("ffn_gate_inp_shexp.weight"), &[e])
            }
            _ => {}
        }
    }
    g
}

//! The synthetic tokenizer: a word-level vocabulary (the bench prompts' words first, then
//! filler words) with the real model's special tokens, and its tokenizer_config.json with
//! a chat template.

use serde_json::{json, Value};

use super::shape::{SynthArch, SynthShape};

/// The bench prompts; their words go first in the synthetic vocabulary.
pub(super) const BENCH_PROMPTS: &str = include_str!("../../bench/prompts.json");

/// The special tokens of a synthetic vocabulary, with the ids they have in the real one
/// (moved to the top of a smaller vocabulary).
pub(super) struct Specials {
    /// (token, id).
    pub(super) tokens: Vec<(String, u32)>,
    pub(super) eos: u32,
    /// The tokenizer's bos_token.
    pub(super) bos: Option<u32>,
    /// config.json's bos_token_id (Qwen3 gives one whose token the tokenizer does not add).
    pub(super) bos_config: Option<u32>,
    pub(super) pad: Option<u32>,
}

pub(super) fn specials(arch: SynthArch, vocab: usize) -> Specials {
    let wanted: Vec<(&str, u32)> = match arch {
        SynthArch::Olmoe1b7b => vec![
            ("<unk>", 0),
            ("<|padding|>", 1),
            ("<|endoftext|>", 50279),
            ("<|system|>", 50280),
            ("<|user|>", 50281),
            ("<|assistant|>", 50282),
        ],
        SynthArch::Qwen15MoeA27b | SynthArch::Qwen3Moe30bA3b => vec![
            ("<|endoftext|>", 151643),
            ("<|im_start|>", 151644),
            ("<|im_end|>", 151645),
            // Not a Qwen token: the word-level vocabulary's unknown token.
            ("<unk>", 151646),
        ],
        SynthArch::Mixtral8x7b => vec![("<unk>", 0), ("<s>", 1), ("</s>", 2)],
    };
    let v = vocab as u32;
    let mut used: Vec<u32> = wanted
        .iter()
        .map(|&(_, id)| id)
        .filter(|&id| id < v)
        .collect();
    let mut next_free = v;
    let mut tokens = Vec::new();
    for (t, id) in wanted {
        let id = if id < v {
            id
        } else {
            loop {
                next_free -= 1;
                if !used.contains(&next_free) {
                    break;
                }
            }
            used.push(next_free);
            next_free
        };
        tokens.push((t.to_string(), id));
    }
    let id_of = |name: &str| {
        tokens
            .iter()
            .find(|(t, _)| t == name)
            .map(|&(_, id)| id)
            .unwrap_or(0)
    };
    let text_end = id_of("<|endoftext|>");
    // (eos, tokenizer bos, config bos, pad) as the real checkpoints give them.
    let (eos, bos, bos_config, pad) = match arch {
        SynthArch::Olmoe1b7b => (text_end, None, None, Some(id_of("<|padding|>"))),
        SynthArch::Qwen15MoeA27b => (text_end, Some(text_end), Some(text_end), Some(text_end)),
        SynthArch::Qwen3Moe30bA3b => (id_of("<|im_end|>"), None, Some(text_end), Some(text_end)),
        SynthArch::Mixtral8x7b => (id_of("</s>"), Some(id_of("<s>")), Some(id_of("<s>")), None),
    };
    Specials {
        tokens,
        eos,
        bos,
        bos_config,
        pad,
    }
}

/// The words of `text` as a `Whitespace` pre-tokenizer splits it (`\w+|[^\w\s]+`).
pub(super) fn split_words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut cur_word = false;
    for c in text.chars() {
        if c.is_whitespace() {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            continue;
        }
        let w = c.is_alphanumeric() || c == '_';
        if !cur.is_empty() && w != cur_word {
            out.push(std::mem::take(&mut cur));
        }
        cur_word = w;
        cur.push(c);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// id -> token for a vocabulary of `vocab` tokens: the special tokens at their ids, then
/// the bench prompts' words in order of appearance, then filler words.
pub(super) fn vocabulary(arch: SynthArch, vocab: usize) -> (Vec<String>, Specials) {
    let sp = specials(arch, vocab);
    let mut by_id: Vec<Option<String>> = vec![None; vocab];
    let mut seen = std::collections::HashSet::new();
    for (t, id) in &sp.tokens {
        by_id[*id as usize] = Some(t.clone());
        seen.insert(t.clone());
    }
    let mut words: Vec<String> = Vec::new();
    if let Ok(v) = serde_json::from_str::<Value>(BENCH_PROMPTS) {
        for p in v["prompts"].as_array().into_iter().flatten() {
            for w in split_words(p["text"].as_str().unwrap_or("")) {
                if seen.insert(w.clone()) {
                    words.push(w);
                }
            }
        }
    }
    let mut words = words.into_iter();
    for (id, slot) in by_id.iter_mut().enumerate() {
        if slot.is_none() {
            *slot = Some(match words.next() {
                Some(w) => w,
                None => {
                    let mut w = format!("w{id}");
                    while !seen.insert(w.clone()) {
                        w.push('_');
                    }
                    w
                }
            });
        }
    }
    (
        by_id.into_iter().map(Option::unwrap_or_default).collect(),
        sp,
    )
}

/// tokenizer.json: a WordLevel model with a Whitespace pre-tokenizer.
pub(super) fn tokenizer_json(tokens: &[String], sp: &Specials) -> Value {
    let vocab: serde_json::Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    let mut added: Vec<(u32, &str)> = sp.tokens.iter().map(|(t, id)| (*id, t.as_str())).collect();
    added.sort();
    let added: Vec<Value> = added
        .into_iter()
        .map(|(id, t)| json!({"id": id, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    })
}

pub(super) const OLMOE_CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\n' + message['content'] + eos_token + '\n' }}{% endif %}{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}{% endfor %}";
/// Qwen3's ChatML without a default system message (its thinking switches left out).
pub(super) const QWEN3_CHAT_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
/// Mixtral-Instruct's [INST] template (system messages are not part of it).
pub(super) const MIXTRAL_CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}";
pub(super) const CHATML_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

pub(super) fn tokenizer_config_json(
    arch: SynthArch,
    shape: &SynthShape,
    tokens: &[String],
    sp: &Specials,
) -> Value {
    let tok = |id: u32| tokens[id as usize].clone();
    let decoder: serde_json::Map<String, Value> = sp
        .tokens
        .iter()
        .map(|(t, id)| (id.to_string(), json!({"content": t, "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": true})))
        .collect();
    json!({
        "add_bos_token": false,
        "add_eos_token": false,
        "added_tokens_decoder": decoder,
        "bos_token": sp.bos.map(tok),
        "eos_token": tok(sp.eos),
        "pad_token": sp.pad.map(tok),
        "unk_token": "<unk>",
        "chat_template": match arch {
            SynthArch::Olmoe1b7b => OLMOE_CHAT_TEMPLATE,
            SynthArch::Qwen15MoeA27b => CHATML_TEMPLATE,
            SynthArch::Qwen3Moe30bA3b => QWEN3_CHAT_TEMPLATE,
            SynthArch::Mixtral8x7b => MIXTRAL_CHAT_TEMPLATE,
        },
        "clean_up_tokenization_spaces": false,
        "model_max_length": shape.max_position_embeddings,
        "tokenizer_class": "PreTrainedTokenizerFast",
    })
}

//! The tokenizer stored in a GGUF file (`tokenizer.ggml.*`), built as a `tokenizers` pipeline
//! that tokenizes as llama.cpp does (src/llama-vocab.cpp), wrapped in wgmoe's [`Tokenizer`].
//!
//! - `gpt2` (byte-level BPE): tokens + merges, and the pre-tokenizer regexes llama.cpp uses
//!   for the `tokenizer.ggml.pre` name: `gpt-2` and `olmo` (GPT-2's regex), `qwen2`
//!   (Qwen2's), `default` (llama.cpp's default sequence, also used when the key is absent).
//!   Any other name is refused, naming it.
//! - `llama` (SentencePiece BPE): the space prefix and `▁` escaping, merges derived from the
//!   scores (a pair merges into a token by that token's score, highest first, as llama.cpp's
//!   SPM session does), byte fallback to `<0xXX>` tokens.
//!
//! Control and unknown tokens are special added tokens, user-defined tokens plain added
//! tokens: both are matched in the text first, as `llama-tokenize` does by default. A BOS is
//! added where `tokenizer.ggml.add_bos_token` says, else by llama.cpp's default for the
//! vocabulary (SPM yes, BPE no).

use std::path::Path;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior,
};

use super::meta::{value_type, MetaValue, Metadata};
use super::model::GgufModel;
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// llama.cpp's token types (`llama_token_type`).
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// GPT-2's pre-tokenizer regex (tokenizers' ByteLevel uses exactly this one).
pub const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Qwen2's (as in its tokenizer.json; llama.cpp spells the case-insensitive group out).
pub const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// llama.cpp's default BPE pre-tokenizer: these regexes applied one after the other, each
/// splitting the pieces of the one before.
pub const DEFAULT_REGEXES: &[&str] = &[
    r"[\p{P}\$\+<=>\^~\|]+",
    GPT2_REGEX,
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
];

/// `tokenizer.ggml.pre` names wgmoe tokenizes as llama.cpp does, and their regexes.
pub fn pre_regexes(pre: &str) -> Option<Vec<&'static str>> {
    Some(match pre {
        "gpt-2" | "olmo" => vec![GPT2_REGEX],
        "qwen2" | "deepseek-r1-qwen" => vec![QWEN2_REGEX],
        "default" | "" => DEFAULT_REGEXES.to_vec(),
        _ => return None,
    })
}

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_TEMPLATE: &str = "tokenizer.chat_template";

/// The tokenizer of `model`'s metadata.
pub fn tokenizer(model: &GgufModel) -> Result<Tokenizer> {
    from_metadata(model.metadata())
}

/// The tokenizer described by `meta`.
pub fn from_metadata(meta: &Metadata) -> Result<Tokenizer> {
    let kind = meta.req_str(KEY_MODEL)?;
    let tokens = meta
        .opt_str_array(KEY_TOKENS)?
        .ok_or_else(|| meta.missing(KEY_TOKENS))?;
    if tokens.is_empty() || tokens.len() > crate::limits::MAX_VOCAB {
        return Err(meta.error(
            KEY_TOKENS,
            format!(
                "{} tokens (1 to {} supported)",
                tokens.len(),
                crate::limits::MAX_VOCAB
            ),
        ));
    }
    let types = int_array(meta, KEY_TYPES, tokens.len())?;
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), i as u32))
        .collect();
    if vocab.len() != tokens.len() {
        return Err(meta.error(KEY_TOKENS, "holds the same token twice"));
    }
    let err = |e: tokenizers::Error| {
        Error::Tokenizer(format!(
            "{}: cannot build the tokenizer: {e}",
            meta.path().display()
        ))
    };
    let (mut inner, default_add_bos) = match kind {
        "gpt2" => {
            let merges = merges(meta)?;
            let bpe = BPE::builder()
                .vocab_and_merges(vocab, merges)
                .build()
                .map_err(err)?;
            let pre = meta.opt_str(KEY_PRE)?.unwrap_or("");
            let regexes = pre_regexes(pre).ok_or_else(|| {
                meta.error(
                    KEY_PRE,
                    format!("pre-tokenizer {pre:?} is not supported (supported: gpt-2, olmo, qwen2, default)"),
                )
            })?;
            let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
            for r in regexes {
                let split = Split::new(
                    SplitPattern::Regex(r.to_string()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map_err(err)?;
                steps.push(split.into());
            }
            steps.push(ByteLevel::new(false, false, false).into());
            let mut t = tokenizers::Tokenizer::new(bpe);
            t.with_pre_tokenizer(Some(PreSequence::new(steps)));
            t.with_decoder(Some(ByteLevel::new(false, false, false)));
            (t, false)
        }
        "llama" => {
            let scores = float_array(meta, KEY_SCORES, tokens.len())?;
            let merges = spm_merges(&tokens, &scores);
            let unk_id = meta
                .opt_u32("tokenizer.ggml.unknown_token_id")?
                .unwrap_or(0);
            let unk = tokens.get(unk_id as usize).ok_or_else(|| {
                meta.error(
                    "tokenizer.ggml.unknown_token_id",
                    format!("{unk_id} is outside the {} tokens", tokens.len()),
                )
            })?;
            let bpe = BPE::builder()
                .vocab_and_merges(vocab, merges)
                .unk_token(unk.to_string())
                .fuse_unk(true)
                .byte_fallback(true)
                .build()
                .map_err(err)?;
            let mut t = tokenizers::Tokenizer::new(bpe);
            let add_prefix = meta
                .opt_bool("tokenizer.ggml.add_space_prefix")?
                .unwrap_or(true);
            let mut norm: Vec<NormalizerWrapper> = Vec::new();
            if add_prefix {
                norm.push(Prepend::new("▁".into()).into());
            }
            norm.push(Replace::new(" ", "▁").map_err(err)?.into());
            t.with_normalizer(Some(NormalizerSequence::new(norm)));
            let mut dec: Vec<DecoderWrapper> = vec![
                Replace::new("▁", " ").map_err(err)?.into(),
                ByteFallback::new().into(),
                Fuse::new().into(),
            ];
            if add_prefix {
                dec.push(Strip::new(' ', 1, 0).into());
            }
            t.with_decoder(Some(DecoderSequence::new(dec)));
            (t, true)
        }
        other => {
            return Err(meta.error(
                KEY_MODEL,
                format!("tokenizer {other:?} is not supported (gpt2 or llama)"),
            ))
        }
    };
    if meta.opt_bool("tokenizer.ggml.remove_extra_whitespaces")? == Some(true) {
        return Err(meta.error(
            "tokenizer.ggml.remove_extra_whitespaces",
            "true is not supported",
        ));
    }

    let mut special = Vec::new();
    let mut user = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        match types.get(i).copied().unwrap_or(token_type::NORMAL) {
            token_type::CONTROL | token_type::UNKNOWN => {
                special.push(AddedToken::from(t.to_string(), true).normalized(false))
            }
            token_type::USER_DEFINED => {
                user.push(AddedToken::from(t.to_string(), false).normalized(false))
            }
            _ => {}
        }
    }
    inner.add_special_tokens(&special);
    inner.add_tokens(&user);

    let sp = specials(meta, default_add_bos)?;
    Ok(sp.with(inner))
}

/// The tokenizer's specials in the metadata: the bos/eos texts, whether a BOS is added
/// (`default_add_bos` where the metadata does not say) and the chat template.
struct Specials {
    bos: Option<String>,
    eos: Option<String>,
    add_bos: bool,
    template: Option<String>,
    source: Option<std::path::PathBuf>,
}

impl Specials {
    /// `inner` with these specials.
    fn with(self, inner: tokenizers::Tokenizer) -> Tokenizer {
        Tokenizer::from_parts(
            inner,
            self.bos,
            self.eos,
            Some(self.add_bos),
            self.template,
            self.source,
        )
    }
}

fn specials(meta: &Metadata, default_add_bos: bool) -> Result<Specials> {
    let tokens = meta.opt_str_array(KEY_TOKENS)?.unwrap_or_default();
    let tok_text = |key: &str| -> Result<Option<String>> {
        match meta.opt_u32(key)? {
            None => Ok(None),
            Some(id) => tokens
                .get(id as usize)
                .map(|t| Some(t.to_string()))
                .ok_or_else(|| {
                    meta.error(key, format!("{id} is outside the {} tokens", tokens.len()))
                }),
        }
    };
    let bos = tok_text("tokenizer.ggml.bos_token_id")?;
    let eos = tok_text("tokenizer.ggml.eos_token_id")?;
    let add_bos = meta
        .opt_bool("tokenizer.ggml.add_bos_token")?
        .unwrap_or(default_add_bos);
    if add_bos && bos.is_none() {
        return Err(meta.error(
            "tokenizer.ggml.bos_token_id",
            "missing, but a BOS token is to be added",
        ));
    }
    let template = meta.opt_str(KEY_TEMPLATE)?.map(str::to_string);
    let source = template.as_ref().map(|_| meta.path().to_path_buf());
    Ok(Specials {
        bos,
        eos,
        add_bos,
        template,
        source,
    })
}

/// `--tokenizer FILE`: a tokenizer.json replaces the file's tokenizer. With a
/// tokenizer_config.json beside it, that config supplies the specials and template (as for
/// a checkpoint directory); without one, they come from the GGUF metadata.
pub fn with_override(model: &GgufModel, file: &Path) -> Result<Tokenizer> {
    let dir = file.parent().unwrap_or(Path::new("."));
    if dir.join("tokenizer_config.json").is_file() {
        return Tokenizer::from_file(file);
    }
    let inner = tokenizers::Tokenizer::from_file(file)
        .map_err(|e| Error::Tokenizer(format!("{}: cannot load: {e}", file.display())))?;
    // The file's own tokenizer is not built: it may be one wgmoe cannot build, which is
    // what an override is for. Its specials are read from the metadata.
    let meta = model.metadata();
    let kind = meta.opt_str(KEY_MODEL)?.unwrap_or("");
    let sp = specials(meta, kind == "llama")?;
    if sp.add_bos {
        let bos = sp.bos.as_deref().unwrap_or_default();
        if inner.token_to_id(bos).is_none() {
            return Err(Error::option(
                "--tokenizer",
                format!(
                    "{}: the model's BOS token {bos:?}, added to every prompt, is not in it; put a tokenizer_config.json beside it that says which specials it has",
                    file.display()
                ),
            ));
        }
    }
    Ok(sp.with(inner))
}

/// `--tokenizer FILE` for the model at `model`: a GGUF file's own tokenizer (its
/// metadata: a vocab-only file is enough), else `with_override` for a GGUF model, the
/// file (and a tokenizer_config.json beside it) for a checkpoint directory.
pub fn override_for(model: &Path, file: &Path) -> Result<Tokenizer> {
    if file.is_file() && super::is_gguf_path(file) {
        return tokenizer(&GgufModel::open_header(file)?);
    }
    if super::is_gguf_path(model) {
        return with_override(&GgufModel::open_header(model)?, file);
    }
    Tokenizer::from_file(file)
}

/// End-of-generation ids, as llama.cpp collects them: the eos, eot and eom ids of the
/// metadata and the tokens whose text llama.cpp treats as end of generation (for these
/// families: `<|im_end|>`, `<|endoftext|>`, `</s>`, ...). Sorted, no repeats.
pub fn eog_ids(meta: &Metadata) -> Result<Vec<u32>> {
    const EOG_TEXTS: &[&str] = &[
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "<|end_of_text|>",
    ];
    let mut ids = Vec::new();
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(id) = meta.opt_u32(key)? {
            ids.push(id);
        }
    }
    if let Some(tokens) = meta.opt_str_array(KEY_TOKENS)? {
        for (i, t) in tokens.iter().enumerate() {
            if EOG_TEXTS.contains(t) {
                ids.push(i as u32);
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// `tokenizer.ggml.merges`: "left right" split at the first space after the first byte
/// (llama.cpp's `word.find(' ', 1)`).
fn merges(meta: &Metadata) -> Result<Vec<(String, String)>> {
    let items = meta
        .opt_str_array(KEY_MERGES)?
        .ok_or_else(|| meta.missing(KEY_MERGES))?;
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let pos = m
                .char_indices()
                .skip(1)
                .find(|&(_, c)| c == ' ')
                .map(|(p, _)| p)
                .ok_or_else(|| meta.error(KEY_MERGES, format!("entry {i} {m:?} has no space")))?;
            Ok((m[..pos].to_string(), m[pos + 1..].to_string()))
        })
        .collect()
}

/// SentencePiece BPE as merges: every split of a token into two tokens is a merge ranked by
/// the merged token's score (highest first); ties by merged id, then the parts' ids.
pub fn spm_merges(tokens: &[&str], scores: &[f32]) -> Vec<(String, String)> {
    let index: std::collections::HashMap<&str, usize> =
        tokens.iter().enumerate().map(|(i, t)| (*t, i)).collect();
    let mut found: Vec<(f32, usize, usize, usize)> = Vec::new();
    for (id, t) in tokens.iter().enumerate() {
        for (pos, _) in t.char_indices().skip(1) {
            let (l, r) = t.split_at(pos);
            if let (Some(&li), Some(&ri)) = (index.get(l), index.get(r)) {
                found.push((scores[id], id, li, ri));
            }
        }
    }
    found.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
    });
    found
        .into_iter()
        .map(|(_, _, l, r)| (tokens[l].to_string(), tokens[r].to_string()))
        .collect()
}

fn int_array(meta: &Metadata, key: &str, n: usize) -> Result<Vec<i32>> {
    let Some(items) = meta.opt_array(key, value_type::I32)? else {
        return Ok(Vec::new());
    };
    if items.len() < n {
        return Err(meta.error(key, format!("{} entries for {n} tokens", items.len())));
    }
    Ok(items
        .iter()
        .map(|v| match v {
            MetaValue::I32(x) => *x,
            _ => 0,
        })
        .collect())
}

fn float_array(meta: &Metadata, key: &str, n: usize) -> Result<Vec<f32>> {
    let items = meta
        .opt_array(key, value_type::F32)?
        .ok_or_else(|| meta.error(key, "missing (a SentencePiece vocabulary needs scores)"))?;
    if items.len() < n {
        return Err(meta.error(key, format!("{} entries for {n} tokens", items.len())));
    }
    Ok(items
        .iter()
        .map(|v| match v {
            MetaValue::F32(x) => *x,
            _ => 0.0,
        })
        .collect())
}

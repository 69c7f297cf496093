//! The shipped prompt set (`bench/prompts.json`) and its tokenisation for a model.

use std::path::Path;

use crate::error::{Error, Result};
use crate::runtime::engine::Engine;

pub(super) const PROMPTS_JSON: &str = include_str!("../../bench/prompts.json");

#[derive(Clone, Debug, serde::Deserialize, serde::Serialize)]
pub struct BenchPrompt {
    pub id: String,
    pub kind: String,
    pub length: String,
    pub text: String,
}

#[derive(serde::Deserialize)]
pub(super) struct PromptFile {
    name: String,
    prompts: Vec<BenchPrompt>,
}

/// The shipped prompt set: (name, prompts).
pub fn prompt_set() -> Result<(String, Vec<BenchPrompt>)> {
    let f: PromptFile = serde_json::from_str(PROMPTS_JSON).map_err(|e| {
        Error::bad_file(
            "bench/prompts.json",
            format!("invalid (built into the binary): {e}"),
        )
    })?;
    Ok((f.name, f.prompts))
}

/// Prompt token ids for the bench, cut to `limit` tokens each.
pub(super) struct Prompts {
    pub(super) ids: Vec<Vec<u32>>,
    pub(super) notes: Vec<String>,
}

pub(super) fn tokenize_prompts(
    dir: &Path,
    tokenizer: Option<&Path>,
    prompts: &[BenchPrompt],
    vocab: usize,
    limit: usize,
) -> Result<Prompts> {
    let tok = match tokenizer {
        Some(f) => Some(crate::gguf::tokenizer::override_for(dir, f)?),
        None => Engine::own_tokenizer(dir)?,
    };
    let mut notes = Vec::new();
    let mut ids = Vec::new();
    if tok.is_none() {
        notes.push("no tokenizer.json: prompts are their UTF-8 bytes as token ids".to_string());
    }
    let mut cut = Vec::new();
    for p in prompts {
        let mut v = match &tok {
            Some(t) => t.encode(&p.text, true)?,
            None => p.text.bytes().map(|b| b as u32 % vocab as u32).collect(),
        };
        if v.is_empty() {
            return Err(Error::Tokenizer(format!(
                "bench prompt `{}` encodes to no tokens",
                p.id
            )));
        }
        if let Some(&bad) = v.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Tokenizer(format!(
                "bench prompt `{}`: token id {bad} is outside the vocabulary ({vocab})",
                p.id
            )));
        }
        if v.len() > limit {
            cut.push(format!("{} ({} -> {})", p.id, v.len(), limit));
            v.truncate(limit);
        }
        ids.push(v);
    }
    if !cut.is_empty() {
        notes.push(format!(
            "prompts cut to max_position_embeddings - n = {limit} tokens: {}",
            cut.join(", ")
        ));
    }
    Ok(Prompts { ids, notes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_set_has_twelve_distinct_prompts() {
        let (name, p) = prompt_set().unwrap();
        assert!(!name.is_empty());
        assert_eq!(p.len(), 12);
        let ids: std::collections::HashSet<_> = p.iter().map(|p| &p.id).collect();
        assert_eq!(ids.len(), 12);
        for kind in ["prose", "code", "math", "chat"] {
            assert!(p.iter().filter(|p| p.kind == kind).count() >= 3, "{kind}");
        }
        assert!(p.iter().any(|p| p.length == "short") && p.iter().any(|p| p.length == "long"));
    }
}

//! `POST /tokenize` and `POST /detokenize`, as llama-server names and shapes them: clients
//! count a prompt's tokens, or turn ids back into text, with the served model's own
//! tokenizer. They run on the HTTP side (the tokenizer is shared, read-only), so they never
//! wait behind generation.

use serde_json::{json, Value};

use crate::serve::api::{field, object, opt_bool, wrong_type, ApiError};
use crate::tokenizer::Tokenizer;

/// `{"content": TEXT, "add_special": bool, "with_pieces": bool}` → `{"tokens": [...]}`:
/// ids, or with `with_pieces` objects `{"id", "piece"}` (a piece is the token's text alone,
/// special tokens as written). `add_special` (default false, as llama-server) adds what the
/// tokenizer adds to a prompt (a BOS where the model has one).
pub fn tokenize(tok: &Tokenizer, body: &Value) -> Result<Value, ApiError> {
    let o = object(body)?;
    let content = match field(o, "content") {
        Some(Value::String(s)) => s,
        Some(v) => return Err(wrong_type("content", "a string", v)),
        None => {
            return Err(ApiError::invalid(
                "content",
                "`content` (the text to tokenize) is required",
            ))
        }
    };
    let add_special = opt_bool(o, "add_special")?.unwrap_or(false);
    let with_pieces = opt_bool(o, "with_pieces")?.unwrap_or(false);
    let ids = tok
        .encode(content, add_special)
        .map_err(|e| ApiError::invalid("content", e.to_string()))?;
    if !with_pieces {
        return Ok(json!({ "tokens": ids }));
    }
    let tokens = ids
        .iter()
        .map(|&id| {
            let piece = tok
                .decode_keeping_special(&[id])
                .map_err(|e| ApiError::invalid("content", e.to_string()))?;
            Ok(json!({"id": id, "piece": piece}))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(json!({ "tokens": tokens }))
}

/// `{"tokens": [ids]}` → `{"content": TEXT}`, special tokens written out (llama-server's
/// answer); an id the tokenizer does not know is a 400 naming its place.
pub fn detokenize(tok: &Tokenizer, body: &Value) -> Result<Value, ApiError> {
    let o = object(body)?;
    let list = match field(o, "tokens") {
        Some(Value::Array(a)) => a,
        Some(v) => return Err(wrong_type("tokens", "an array of token ids", v)),
        None => {
            return Err(ApiError::invalid(
                "tokens",
                "`tokens` (the ids to turn into text) is required",
            ))
        }
    };
    let mut ids = Vec::with_capacity(list.len());
    for (i, v) in list.iter().enumerate() {
        let id = v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                wrong_type(&format!("tokens[{i}]"), "a token id (an integer from 0)", v)
            })?;
        if tok.id_to_token(id).is_none() {
            return Err(ApiError::invalid(
                &format!("tokens[{i}]"),
                format!(
                    "`tokens[{i}]` {id}: not an id of the tokenizer (its vocabulary has {} tokens)",
                    tok.vocab_size()
                ),
            ));
        }
        ids.push(id);
    }
    let content = tok
        .decode_keeping_special(&ids)
        .map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(json!({ "content": content }))
}

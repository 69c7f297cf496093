//! Log-probabilities in the APIs' shapes. The worker turns each generated token's logits
//! row into a [`Logprob`] (the log-softmax over the whole vocabulary of the raw logits:
//! before temperature, top-k/top-p and any penalty, so a sampled request reports the
//! model's own distribution); the HTTP side writes them as the Completions API's
//! `{tokens, token_logprobs, top_logprobs, text_offset}` or the Chat API's
//! `{content: [{token, logprob, bytes, top_logprobs}]}`, whole or per streamed chunk.

use serde_json::{json, Map, Value};

use crate::error::Result;
use crate::runtime::logprobs::token_logprob;
use crate::tokenizer::Tokenizer;

/// One generated token: its text, log-probability and most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct Logprob {
    pub id: u32,
    /// The token's own text, special tokens as written.
    pub token: String,
    /// None for a scored prompt's first token, which nothing predicts (the API's null).
    pub logprob: Option<f32>,
    /// (text, log-probability) of the most likely tokens, most likely first.
    pub top: Vec<(String, f32)>,
}

impl Logprob {
    /// Token `id` chosen from `row`, with `n` alternatives.
    pub fn of(tok: &Tokenizer, row: &[f32], id: u32, n: usize) -> Result<Logprob> {
        let t = token_logprob(row, id, n);
        let text = |i: u32| tok.decode_keeping_special(&[i]);
        Ok(Logprob {
            id,
            token: text(id)?,
            logprob: Some(t.logprob),
            top: t
                .top
                .iter()
                .map(|&(i, lp)| Ok((text(i)?, lp)))
                .collect::<Result<_>>()?,
        })
    }
}

/// A scored prompt's first token: its text, no log-probability and no alternatives.
pub fn unscored(tok: &Tokenizer, id: u32) -> Result<Logprob> {
    Ok(Logprob {
        id,
        token: tok.decode_keeping_special(&[id])?,
        logprob: None,
        top: Vec::new(),
    })
}

/// The Completions API's `logprobs` of `entries`, the first starting at character
/// `offset` of the returned text (after an echoed prompt); returns the offset after them.
pub fn completion(entries: &[Logprob], mut offset: usize) -> (Value, usize) {
    let mut text_offset = Vec::with_capacity(entries.len());
    for e in entries {
        text_offset.push(offset);
        offset += e.token.chars().count();
    }
    let top: Vec<Value> = entries
        .iter()
        .map(|e| {
            if e.logprob.is_none() {
                return Value::Null;
            }
            let m: Map<String, Value> =
                e.top.iter().map(|(t, lp)| (t.clone(), json!(lp))).collect();
            Value::Object(m)
        })
        .collect();
    let v = json!({
        "tokens": entries.iter().map(|e| e.token.as_str()).collect::<Vec<_>>(),
        "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    });
    (v, offset)
}

/// The Completions API's `logprobs` of a scored prompt, its offsets into the echoed
/// `text`: a token whose text does not come next there (a BOS the prompt's text does not
/// hold, a piece decoded differently alone) takes no width if it is the first, else its
/// own, never past the text's end.
pub fn prompt_completion(prompt: &[Logprob], text: &str) -> Value {
    let (mut v, _) = completion(prompt, 0);
    let total = text.chars().count();
    let (mut off, mut byte) = (0usize, 0usize);
    let mut offs = Vec::with_capacity(prompt.len());
    for (i, e) in prompt.iter().enumerate() {
        offs.push(off);
        let rest = &text[byte..];
        let n = if rest.starts_with(&e.token) {
            e.token.chars().count()
        } else if i == 0 {
            0
        } else {
            e.token.chars().count().min(total - off)
        };
        byte += rest.char_indices().nth(n).map_or(rest.len(), |(b, _)| b);
        off += n;
    }
    v["text_offset"] = json!(offs);
    v
}

/// The Completions API's `logprobs` of an echoed, scored prompt (offsets into the echo,
/// `text`) followed by the generated tokens (from character `start`, after the echo).
pub fn completion_scored(
    prompt: &[Logprob],
    generated: &[Logprob],
    text: &str,
    start: usize,
) -> Value {
    let mut a = prompt_completion(prompt, text);
    let (b, _) = completion(generated, start);
    for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        if let (Some(Value::Array(x)), Value::Array(y)) = (a.get_mut(key), &b[key]) {
            x.extend(y.iter().cloned());
        }
    }
    a
}

/// The Chat API's `logprobs` of `entries`.
pub fn chat(entries: &[Logprob]) -> Value {
    let item =
        |token: &str, lp: f32| json!({"token": token, "logprob": lp, "bytes": token.as_bytes()});
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = item(&e.token, e.logprob.unwrap_or(f32::NAN));
            if e.logprob.is_none() {
                v["logprob"] = Value::Null;
            }
            v["top_logprobs"] = e.top.iter().map(|(t, lp)| item(t, *lp)).collect();
            v
        })
        .collect();
    json!({"content": content, "refusal": null})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lp(token: &str, logprob: f32, top: &[(&str, f32)]) -> Logprob {
        Logprob {
            id: 0,
            token: token.into(),
            logprob: Some(logprob),
            top: top.iter().map(|&(t, l)| (t.into(), l)).collect(),
        }
    }

    #[test]
    fn the_shapes_are_the_apis() {
        let e = [
            lp("Hé", -0.5, &[("Hé", -0.5), ("x", -2.0)]),
            lp("!", -1.0, &[]),
        ];
        let (c, end) = completion(&e, 3);
        assert_eq!(
            c,
            json!({"tokens": ["Hé", "!"], "token_logprobs": [-0.5, -1.0],
                   "top_logprobs": [{"Hé": -0.5, "x": -2.0}, {}], "text_offset": [3, 5]})
        );
        assert_eq!(end, 6);
        let h = chat(&e);
        assert_eq!(h["content"][0]["bytes"], json!([72, 195, 169]));
        assert_eq!(
            h["content"][0]["top_logprobs"][1],
            json!({"token": "x", "logprob": -2.0, "bytes": [120]})
        );
        assert_eq!(h["content"][1]["top_logprobs"], json!([]));
    }

    /// A scored prompt: its first token null in both lists, its offsets from 0, the
    /// generated tokens' after the echo.
    #[test]
    fn a_scored_prompt_leads_with_nulls() {
        let first = Logprob {
            id: 1,
            token: "<s>".into(),
            logprob: None,
            top: vec![],
        };
        let prompt = [first, lp("ab", -3.0, &[("ab", -3.0)])];
        let c = [lp("c", -0.25, &[("c", -0.25)])];
        // The echo holds the BOS's text (a prompt of ids): offsets along it.
        let v = completion_scored(&prompt, &c, "<s>ab", 5);
        assert_eq!(
            v,
            json!({"tokens": ["<s>", "ab", "c"], "token_logprobs": [null, -3.0, -0.25],
                   "top_logprobs": [null, {"ab": -3.0}, {"c": -0.25}], "text_offset": [0, 3, 5]})
        );
        // A text prompt's echo does not: the BOS takes no width, the offsets never go back.
        let v = completion_scored(&prompt, &c, "ab", 2);
        assert_eq!(v["text_offset"], json!([0, 0, 2]));
        // A piece that decodes differently alone keeps its width, within the text.
        let odd = [lp("x", -1.0, &[]), lp("yz", -1.0, &[]), lp("q", -1.0, &[])];
        assert_eq!(
            prompt_completion(&odd, "ayz")["text_offset"],
            json!([0, 0, 2])
        );
    }
}

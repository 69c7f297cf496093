//! Tokenizer and chat template of a checkpoint directory.
//!
//! `tokenizer.json` is loaded with the `tokenizers` crate (the same implementation the Python
//! fast tokenizers use). `tokenizer_config.json` is optional and supplies the special-token
//! strings, `add_bos_token` and the chat template; transformers >= 4.4x / 5 save the template
//! as a separate `chat_template.jinja`, which takes precedence when present (as in transformers).
//! The `tokenizer_class` field is ignored: transformers 5 writes class names older loaders
//! don't know, and tokenizer.json alone defines the tokenization.

use std::path::{Path, PathBuf};

use minijinja::value::{from_args, Value as JValue, ValueKind};
use minijinja::{Environment, ErrorKind, State};
use serde_json::Value;

use crate::error::{Error, Result};

/// Template instructions one chat rendering may execute (published templates need a few
/// thousand per message).
pub const CHAT_TEMPLATE_FUEL: u64 = 20_000_000;
/// Nesting depth of macro calls and includes in a chat template.
pub const CHAT_TEMPLATE_RECURSION: usize = 100;

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_token: Option<String>,
    eos_token: Option<String>,
    add_bos_token: Option<bool>,
    chat_template: Option<String>,
    /// File the chat template came from, for error messages.
    chat_template_source: Option<PathBuf>,
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json` and, if present, `dir/tokenizer_config.json` and
    /// `dir/chat_template.jinja`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.is_file() {
            return Err(Error::bad_file(
                &tok_path,
                "missing (the checkpoint directory must contain tokenizer.json)",
            ));
        }
        Self::from_file(&tok_path)
    }

    /// Loads the tokenizer.json `tok_path` and, if present beside it, `tokenizer_config.json`
    /// and `chat_template.jinja` (a `--tokenizer FILE` override).
    pub fn from_file(tok_path: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(tok_path)
            .map_err(|e| Error::Tokenizer(format!("{}: cannot load: {e}", tok_path.display())))?;

        let mut tok = Tokenizer::from_parts(inner, None, None, None, None, None);
        let dir = tok_path.parent().unwrap_or(Path::new("."));

        let cfg_path = dir.join("tokenizer_config.json");
        match std::fs::read_to_string(&cfg_path) {
            Ok(text) => tok.apply_config(&text, &cfg_path)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&cfg_path, e)),
        }

        let jinja_path = dir.join("chat_template.jinja");
        match std::fs::read_to_string(&jinja_path) {
            Ok(text) => {
                tok.chat_template = Some(text);
                tok.chat_template_source = Some(jinja_path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&jinja_path, e)),
        }
        Ok(tok)
    }

    /// A tokenizer built elsewhere (from a GGUF file's metadata): the `tokenizers` pipeline,
    /// the BOS/EOS token strings, whether `encode` prepends the BOS, and the chat template
    /// with the file it came from (named in errors).
    pub fn from_parts(
        inner: tokenizers::Tokenizer,
        bos_token: Option<String>,
        eos_token: Option<String>,
        add_bos_token: Option<bool>,
        chat_template: Option<String>,
        chat_template_source: Option<PathBuf>,
    ) -> Self {
        Tokenizer {
            inner,
            bos_token,
            eos_token,
            add_bos_token,
            chat_template,
            chat_template_source,
        }
    }

    fn apply_config(&mut self, text: &str, path: &Path) -> Result<()> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| Error::bad_file(path, format!("invalid JSON: {e}")))?;
        let Value::Object(obj) = value else {
            return Err(Error::bad_file(path, "expected a JSON object at top level"));
        };
        self.bos_token = special_token(&obj, "bos_token", path)?;
        self.eos_token = special_token(&obj, "eos_token", path)?;
        self.add_bos_token = match obj.get("add_bos_token") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(v) => {
                return Err(Error::field(
                    path,
                    "add_bos_token",
                    format!("expected true or false, found {v}"),
                ))
            }
        };
        self.chat_template = match obj.get("chat_template") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            // List form: [{"name": "default", "template": ...}, {"name": "tool_use", ...}].
            // transformers uses the one named "default".
            Some(Value::Array(items)) => {
                let mut default = None;
                for (i, item) in items.iter().enumerate() {
                    let field = format!("chat_template[{i}]");
                    let name = item.get("name").and_then(Value::as_str);
                    let tmpl = item.get("template").and_then(Value::as_str);
                    let (Some(name), Some(tmpl)) = (name, tmpl) else {
                        return Err(Error::field(
                            path,
                            field,
                            "expected {\"name\": string, \"template\": string}",
                        ));
                    };
                    if name == "default" {
                        default = Some(tmpl.to_string());
                    }
                }
                if default.is_none() && !items.is_empty() {
                    return Err(Error::field(
                        path,
                        "chat_template",
                        "list form has no template named \"default\"",
                    ));
                }
                default
            }
            Some(v) => {
                return Err(Error::field(
                    path,
                    "chat_template",
                    format!("expected a string or a list, found {v}"),
                ))
            }
        };
        if self.chat_template.is_some() {
            self.chat_template_source = Some(path.to_path_buf());
        }
        Ok(())
    }

    /// Token ids of `text`. With `add_special_tokens`, the tokenizer.json post-processor adds
    /// what it defines (e.g. a BOS), and a BOS is prepended if tokenizer_config.json says
    /// `add_bos_token: true` and it is not there yet. Text rendered by `apply_chat_template`
    /// already carries its special tokens: encode it with `add_special_tokens = false`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| Error::Tokenizer(format!("encode failed: {e}")))?;
        let mut ids = enc.get_ids().to_vec();
        if add_special_tokens && self.add_bos_token == Some(true) {
            if let Some(bos) = self.bos_token_id() {
                if ids.first() != Some(&bos) {
                    ids.insert(0, bos);
                }
            }
        }
        Ok(ids)
    }

    /// Text of `ids`, skipping special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| Error::Tokenizer(format!("decode failed: {e}")))
    }

    /// Text of `ids` with the special tokens written out (`/detokenize`, a token's piece).
    pub fn decode_keeping_special(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| Error::Tokenizer(format!("decode failed: {e}")))
    }

    /// Vocabulary size including added tokens (may be smaller than the model's embedding rows).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The largest token id (ids need not be dense: a vocabulary may skip some).
    pub fn max_id(&self) -> Option<u32> {
        self.inner.get_vocab(true).values().copied().max()
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token.as_deref().and_then(|t| self.token_to_id(t))
    }

    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token.as_deref().and_then(|t| self.token_to_id(t))
    }

    pub fn add_bos_token(&self) -> Option<bool> {
        self.add_bos_token
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Use `template` as the chat template (`--chat-template`); `source` names it in errors.
    pub fn set_chat_template(&mut self, template: String, source: impl Into<PathBuf>) {
        self.chat_template = Some(template);
        self.chat_template_source = Some(source.into());
    }

    /// Renders the chat template for `messages` (role, content) the way transformers does:
    /// Jinja with trim_blocks and lstrip_blocks, `bos_token`, `eos_token`, `messages` and
    /// `add_generation_prompt` in scope, and a `raise_exception(msg)` function.
    pub fn apply_chat_template(
        &self,
        messages: &[(String, String)],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let Some(template) = self.chat_template.as_deref() else {
            return Err(Error::Tokenizer(
                "this tokenizer has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja)".into(),
            ));
        };
        let source = self
            .chat_template_source
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "chat template".into());
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // A template is code from the checkpoint: bound its work and its recursion, so a
        // template with an unbounded loop fails instead of hanging `run --chat`.
        env.set_fuel(Some(CHAT_TEMPLATE_FUEL));
        env.set_recursion_limit(CHAT_TEMPLATE_RECURSION);
        // What the template says when it refuses a conversation, kept for the error.
        let raised = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
        let keep = raised.clone();
        env.add_function(
            "raise_exception",
            move |msg: String| -> std::result::Result<JValue, minijinja::Error> {
                if let Ok(mut r) = keep.lock() {
                    *r = Some(msg.clone());
                }
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.set_unknown_method_callback(python_methods);
        let tmpl = env.template_from_str(template).map_err(|e| {
            Error::Tokenizer(format!(
                "{source}: cannot parse chat_template: {}",
                jinja_error(&e)
            ))
        })?;
        let msgs: Vec<JValue> = messages
            .iter()
            .map(|(role, content)| {
                JValue::from_iter([
                    ("role", JValue::from(role.as_str())),
                    ("content", JValue::from(content.as_str())),
                ])
            })
            .collect();
        let ctx = minijinja::context! {
            messages => msgs,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
        };
        tmpl.render(ctx).map_err(|e| {
            if let Some(said) = raised.lock().ok().and_then(|mut r| r.take()) {
                return Error::ChatTemplate {
                    message: None,
                    msg: format!("{source}: the chat template refused the conversation: {said}"),
                    said,
                    template: source.clone(),
                };
            }
            let what = match e.kind() {
                ErrorKind::OutOfFuel => format!(
                    "did not finish within {CHAT_TEMPLATE_FUEL} template steps (an unbounded loop?)"
                ),
                _ => format!("rendering failed: {}", jinja_error(&e)),
            };
            Error::Tokenizer(format!("{source}: chat_template {what}"))
        })
    }
}

/// A minijinja error with its causes, on one line.
fn jinja_error(e: &minijinja::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// `bos_token` / `eos_token` in tokenizer_config.json: a string, an AddedToken object
/// ({"content": "...", ...}), or null.
fn special_token(
    obj: &serde_json::Map<String, Value>,
    key: &str,
    path: &Path,
) -> Result<Option<String>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(m)) => match m.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(Error::field(
                path,
                format!("{key}.content"),
                "missing or not a string",
            )),
        },
        Some(v) => Err(Error::field(
            path,
            key,
            format!("expected a string or {{\"content\": ...}}, found {v}"),
        )),
    }
}

/// The Python str/dict methods HF chat templates commonly call (jinja2 runs them as real
/// Python methods; minijinja has none). Anything else is an "unknown method" error.
fn python_methods(
    state: &State,
    value: &JValue,
    method: &str,
    args: &[JValue],
) -> std::result::Result<JValue, minijinja::Error> {
    match value.kind() {
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default();
            match method {
                "strip" | "lstrip" | "rstrip" => {
                    let (chars,): (Option<&str>,) = from_args(args)?;
                    let pat = |c: char| match chars {
                        Some(set) => set.contains(c),
                        None => c.is_whitespace(),
                    };
                    Ok(JValue::from(match method {
                        "strip" => s.trim_matches(pat),
                        "lstrip" => s.trim_start_matches(pat),
                        _ => s.trim_end_matches(pat),
                    }))
                }
                "startswith" | "endswith" => {
                    let (arg,): (JValue,) = from_args(args)?;
                    // Python accepts a string or a tuple of strings.
                    let prefixes: Vec<String> = if let Some(p) = arg.as_str() {
                        vec![p.to_string()]
                    } else {
                        arg.try_iter()?
                            .map(|v| v.as_str().unwrap_or_default().to_string())
                            .collect()
                    };
                    let hit = prefixes.iter().any(|p| {
                        if method == "startswith" {
                            s.starts_with(p.as_str())
                        } else {
                            s.ends_with(p.as_str())
                        }
                    });
                    Ok(JValue::from(hit))
                }
                "upper" => Ok(JValue::from(s.to_uppercase())),
                "lower" => Ok(JValue::from(s.to_lowercase())),
                "replace" => {
                    let (from, to): (&str, &str) = from_args(args)?;
                    Ok(JValue::from(s.replace(from, to)))
                }
                "split" => {
                    let (sep,): (Option<&str>,) = from_args(args)?;
                    let parts: Vec<JValue> = match sep {
                        Some(sep) => s.split(sep).map(JValue::from).collect(),
                        None => s.split_whitespace().map(JValue::from).collect(),
                    };
                    Ok(JValue::from(parts))
                }
                _ => Err(minijinja::Error::from(ErrorKind::UnknownMethod)),
            }
        }
        ValueKind::Map => match method {
            "items" => {
                let _: () = from_args(args)?;
                state.apply_filter("items", std::slice::from_ref(value))
            }
            "keys" => {
                let _: () = from_args(args)?;
                Ok(JValue::from(value.try_iter()?.collect::<Vec<_>>()))
            }
            "values" => {
                let _: () = from_args(args)?;
                let vals = value
                    .try_iter()?
                    .map(|k| value.get_item(&k))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                Ok(JValue::from(vals))
            }
            "get" => {
                let (key, default): (JValue, Option<JValue>) = from_args(args)?;
                let v = value.get_item(&key)?;
                Ok(if v.is_undefined() {
                    default.unwrap_or(JValue::from(()))
                } else {
                    v
                })
            }
            _ => Err(minijinja::Error::from(ErrorKind::UnknownMethod)),
        },
        _ => Err(minijinja::Error::from(ErrorKind::UnknownMethod)),
    }
}

/// Incremental detokenizer for streaming output.
///
/// Decoding tokens one at a time is wrong for byte-level BPE (a multi-byte UTF-8 character
/// can span tokens) and for decoders that depend on neighbouring tokens, so each `push`
/// decodes a short window of recent ids twice — without and with the new id — and emits the
/// difference. While the text ends with U+FFFD (an incomplete UTF-8 sequence) nothing is
/// emitted and the window grows until the character completes. The window restarts after
/// each emission, so the cost per token stays small regardless of the output length.
#[derive(Debug, Default, Clone)]
pub struct TextStream {
    ids: Vec<u32>,
    /// Start of the decode window.
    prefix_offset: usize,
    /// End of the text already emitted (ids[..read_offset] are fully printed).
    read_offset: usize,
}

impl TextStream {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `id`; returns the newly completed text (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        self.emit(tok, false)
    }

    /// Everything still held back (e.g. an incomplete character at the end of generation).
    pub fn finish(&mut self, tok: &Tokenizer) -> Result<String> {
        self.emit(tok, true)
    }

    /// All ids pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    fn emit(&mut self, tok: &Tokenizer, force: bool) -> Result<String> {
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = tok.decode(&self.ids[self.prefix_offset..])?;
        let complete = force || !full.ends_with('\u{FFFD}');
        // Slicing at the old text's length (as text-generation-inference does) rather than
        // requiring `full` to start with `prefix` keeps the stream going even if a decoder
        // rewrites a character of the context (e.g. whitespace cleanup).
        if complete && full.len() > prefix.len() && full.is_char_boundary(prefix.len()) {
            let new = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(new)
        } else {
            Ok(String::new())
        }
    }
}

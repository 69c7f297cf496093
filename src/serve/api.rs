//! The OpenAI request bodies, checked field by field into what the worker runs, and the
//! errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`. No HTTP
//! types here: the status is a number the HTTP layer turns into a response.

use serde_json::{json, Map, Value};

use crate::session::chat::{Message, Role};

#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// OpenAI's `type`: invalid_request_error, authentication_error, server_error...
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: the request is wrong; `param` names the field.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: (!param.is_empty()).then(|| param.to_string()),
            code: None,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn status(
        status: u16,
        kind: &'static str,
        code: &'static str,
        msg: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            message: msg.into(),
            kind,
            param: None,
            code: Some(code),
        }
    }

    /// The `{"error": {...}}` body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

type ApiResult<T> = std::result::Result<T, ApiError>;

/// 404 `model_not_found` (OpenAI's answer to a model it does not have): `asked` is not the
/// model this server serves.
pub fn model_not_found(asked: &str, served: &str) -> ApiError {
    let mut e = ApiError::status(
        404,
        "invalid_request_error",
        "model_not_found",
        format!("The model `{asked}` does not exist: this server serves `{served}` (GET /v1/models lists it; leave `model` out to use it)"),
    );
    e.param = Some("model".to_string());
    e
}

/// What to generate from.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptInput {
    /// `/v1/chat/completions`: rendered with the chat template.
    Chat(Vec<Message>),
    /// `/v1/completions` with a string: tokenized as `run -p` does.
    Text(String),
    /// `/v1/completions` with token ids.
    Ids(Vec<u32>),
}

/// Sampling fields a request may set; what it leaves out comes from the server's options.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SamplingRequest {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub seed: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub prompt: PromptInput,
    /// `max_completion_tokens` or `max_tokens`; None: until EOS or the context is full
    /// (chat), OpenAI's 16 (completions).
    pub max_tokens: Option<usize>,
    pub sampling: SamplingRequest,
    pub stop: Vec<String>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with `usage` and no choices.
    pub include_usage: bool,
    /// llama-server's extension: do not stop at EOS (it is never chosen).
    pub ignore_eos: bool,
    /// The model the request names (checked against the served one by the HTTP side).
    pub model: Option<String>,
    /// Log-probabilities of the generated tokens with this many most likely alternatives
    /// each (completions' `logprobs: N`, chat's `logprobs: true` + `top_logprobs: N`).
    pub logprobs: Option<usize>,
    /// Completions' `echo`: the prompt's text in front of the completion; with
    /// `logprobs`, the prompt's own tokens scored too (the first one's log-probability
    /// null), and with `max_tokens` 0 nothing generated.
    pub echo: bool,
}

impl Request {
    /// The prompt's own tokens are scored (`echo` with `logprobs`).
    pub fn scores_prompt(&self) -> bool {
        self.echo && self.logprobs.is_some()
    }
}

/// The most alternatives a token's `top_logprobs` may list (the API's bound).
pub const MAX_TOP_LOGPROBS: u64 = 20;

/// A count of alternatives in 0..=MAX_TOP_LOGPROBS.
fn top_count(o: &Map<String, Value>, name: &str) -> ApiResult<Option<usize>> {
    match field(o, name) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n <= MAX_TOP_LOGPROBS => Ok(Some(n as usize)),
            _ => Err(wrong_type(
                name,
                &format!("an integer from 0 to {MAX_TOP_LOGPROBS}"),
                v,
            )),
        },
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// What was given, for an error: a number or a boolean as written (`-1`, `3.5`), a short
/// string quoted, anything else by its kind.
fn given(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::String(s) if s.chars().count() <= 40 => format!("the string {v}"),
        _ => kind_of(v).to_string(),
    }
}

pub(super) fn wrong_type(param: &str, want: &str, v: &Value) -> ApiError {
    ApiError::invalid(param, format!("`{param}` must be {want}, not {}", given(v)))
}

/// A field that is absent or null is None.
pub(super) fn field<'a>(o: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    o.get(name).filter(|v| !v.is_null())
}

pub(super) fn opt_bool(o: &Map<String, Value>, name: &str) -> ApiResult<Option<bool>> {
    match field(o, name) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(wrong_type(name, "a boolean", v)),
    }
}

fn opt_uint(o: &Map<String, Value>, name: &str) -> ApiResult<Option<u64>> {
    match field(o, name) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| wrong_type(name, "a non-negative integer", v)),
    }
}

fn opt_number(o: &Map<String, Value>, name: &str) -> ApiResult<Option<f64>> {
    match field(o, name) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| wrong_type(name, "a number", v)),
    }
}

pub(super) fn object(body: &Value) -> ApiResult<&Map<String, Value>> {
    body.as_object().ok_or_else(|| {
        ApiError::invalid(
            "",
            format!(
                "the request body must be a JSON object, not {}",
                kind_of(body)
            ),
        )
    })
}

/// The fields both endpoints share.
fn common(o: &Map<String, Value>, prompt: PromptInput) -> ApiResult<Request> {
    let max_tokens = opt_uint(o, "max_tokens")?;
    let max_completion = opt_uint(o, "max_completion_tokens")?;
    let max_tokens = match (max_completion, max_tokens) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::invalid(
                "max_completion_tokens",
                format!("`max_completion_tokens` ({a}) and `max_tokens` ({b}) disagree; give one"),
            ))
        }
        (Some(a), _) | (None, Some(a)) => Some(a),
        (None, None) => None,
    };
    // 0 is only meaningful with completions' `echo` (the prompt scored, nothing
    // generated): `completion_only` admits it there.
    let completion = o.contains_key("prompt") && !o.contains_key("messages");
    if max_tokens == Some(0) && !(completion && opt_bool(o, "echo")? == Some(true)) {
        let p = if max_completion.is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        return Err(ApiError::invalid(
            p,
            format!(
                "`{p}` must be at least 1 (0 only with completions' `echo`, to score the prompt)"
            ),
        ));
    }
    let temperature = opt_number(o, "temperature")?;
    if let Some(t) = temperature {
        if !(0.0..=2.0).contains(&t) {
            return Err(ApiError::invalid(
                "temperature",
                format!("`temperature` {t} is not in [0, 2]"),
            ));
        }
    }
    let top_p = opt_number(o, "top_p")?;
    if let Some(p) = top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::invalid(
                "top_p",
                format!("`top_p` {p} is not in (0, 1]"),
            ));
        }
    }
    let top_k = opt_uint(o, "top_k")?;
    let seed = opt_uint(o, "seed")?;
    let stop = match field(o, "stop") {
        None => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            if a.len() > 16 {
                return Err(ApiError::invalid("stop", "`stop` holds at most 16 strings"));
            }
            a.iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| wrong_type("stop", "a string or an array of strings", v))
                })
                .collect::<ApiResult<_>>()?
        }
        Some(v) => return Err(wrong_type("stop", "a string or an array of strings", v)),
    };
    if let Some(n) = opt_uint(o, "n")? {
        if n != 1 {
            return Err(ApiError::invalid(
                "n",
                format!("`n` {n}: only one choice per request is supported"),
            ));
        }
    }
    let model = match field(o, "model") {
        None => None,
        Some(Value::String(m)) => Some(m.clone()),
        Some(m) => return Err(wrong_type("model", "a string", m)),
    };
    for unsupported in ["tools", "functions"] {
        if let Some(v) = field(o, unsupported) {
            if v.as_array().is_none_or(|a| !a.is_empty()) {
                return Err(ApiError::invalid(
                    unsupported,
                    format!("`{unsupported}`: tool calling is not supported"),
                ));
            }
        }
    }
    // Options that change the tokens are refused rather than ignored; their neutral
    // values (which many clients send) are accepted.
    for penalty in ["frequency_penalty", "presence_penalty"] {
        if let Some(x) = opt_number(o, penalty)? {
            if x != 0.0 {
                return Err(ApiError::invalid(
                    penalty,
                    format!("`{penalty}` {x}: penalties are not supported (0 or leave it out)"),
                ));
            }
        }
    }
    match field(o, "logit_bias") {
        None => {}
        Some(Value::Object(m)) if m.is_empty() => {}
        Some(_) => {
            return Err(ApiError::invalid(
                "logit_bias",
                "`logit_bias` is not supported (leave it out or send {})",
            ))
        }
    }
    if let Some(rf) = field(o, "response_format") {
        let kind = rf.get("type").and_then(Value::as_str);
        if kind != Some("text") {
            return Err(ApiError::invalid(
                "response_format",
                "`response_format`: only {\"type\": \"text\"} is supported (no JSON mode or schemas)",
            ));
        }
    }
    let include_usage = match field(o, "stream_options") {
        None => false,
        Some(Value::Object(so)) => opt_bool(so, "include_usage")
            .map_err(|_| {
                let p = "stream_options.include_usage";
                wrong_type(p, "a boolean", &so["include_usage"])
            })?
            .unwrap_or(false),
        Some(v) => return Err(wrong_type("stream_options", "an object", v)),
    };
    Ok(Request {
        prompt,
        max_tokens: max_tokens.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        sampling: SamplingRequest {
            temperature: temperature.map(|t| t as f32),
            top_p: top_p.map(|p| p as f32),
            top_k: top_k.map(|k| usize::try_from(k).unwrap_or(usize::MAX)),
            seed,
        },
        stop,
        stream: opt_bool(o, "stream")?.unwrap_or(false),
        include_usage,
        ignore_eos: opt_bool(o, "ignore_eos")?.unwrap_or(false),
        model,
        logprobs: None,
        echo: false,
    })
}

fn content(i: usize, role: Role, v: Option<&Value>) -> ApiResult<String> {
    let param = format!("messages[{i}].content");
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        // An assistant turn that only called tools has no content.
        None if role == Role::Assistant => Ok(String::new()),
        None => Err(ApiError::invalid(&param, format!("`{param}` is missing"))),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                let pp = format!("{param}[{j}]");
                let ty = p.get("type").and_then(Value::as_str);
                match (ty, p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    (Some("text"), _) => {
                        return Err(ApiError::invalid(
                            &pp,
                            format!("`{pp}.text` must be a string"),
                        ))
                    }
                    (Some(other), _) => {
                        return Err(ApiError::invalid(
                            &pp,
                            format!(
                                "`{pp}`: content of type `{other}` is not supported (text only)"
                            ),
                        ))
                    }
                    (None, _) => {
                        return Err(ApiError::invalid(
                            &pp,
                            format!("`{pp}` must be an object with a `type`"),
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(v) => Err(wrong_type(&param, "a string or an array of text parts", v)),
    }
}

/// A `/v1/chat/completions` body.
pub fn chat_request(body: &Value) -> ApiResult<Request> {
    let o = object(body)?;
    let msgs = match o.get("messages") {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid("messages", "`messages` is required"))
        }
        Some(Value::Array(a)) => a,
        Some(v) => return Err(wrong_type("messages", "an array of messages", v)),
    };
    if msgs.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` is empty: give at least one message",
        ));
    }
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let param = format!("messages[{i}]");
        let Some(mo) = m.as_object() else {
            return Err(wrong_type(&param, "an object with `role` and `content`", m));
        };
        let role = match mo.get("role") {
            Some(Value::String(r)) => match r.as_str() {
                "system" | "developer" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                "tool" | "function" => {
                    return Err(ApiError::invalid(
                        &format!("{param}.role"),
                        format!("`{param}.role` `{r}`: tool messages are not supported"),
                    ))
                }
                _ => {
                    return Err(ApiError::invalid(
                        &format!("{param}.role"),
                        format!(
                        "`{param}.role`: unknown role `{r}` (system, developer, user or assistant)"
                    ),
                    ))
                }
            },
            None | Some(Value::Null) => {
                return Err(ApiError::invalid(
                    &format!("{param}.role"),
                    format!("`{param}.role` is required"),
                ))
            }
            Some(v) => return Err(wrong_type(&format!("{param}.role"), "a string", v)),
        };
        let text = content(i, role, field(mo, "content"))?;
        out.push(Message::new(role, text));
    }
    // Chat's `logprobs` is a boolean, `top_logprobs` the count of alternatives (which
    // needs `logprobs`, as OpenAI answers).
    let logprobs = opt_bool(o, "logprobs")?.unwrap_or(false);
    let top = top_count(o, "top_logprobs")?;
    if top.is_some() && !logprobs {
        return Err(ApiError::invalid(
            "top_logprobs",
            "`top_logprobs` needs `logprobs`: true",
        ));
    }
    let mut r = common(o, PromptInput::Chat(out))?;
    r.logprobs = logprobs.then_some(top.unwrap_or(0));
    Ok(r)
}

/// A `/v1/completions` body: `prompt` is a string, or one string or one list of token ids
/// in an array (OpenAI allows several prompts; one request here is one completion).
pub fn completion_request(body: &Value) -> ApiResult<Request> {
    let o = object(body)?;
    let ids = |a: &[Value]| -> ApiResult<Vec<u32>> {
        a.iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| wrong_type("prompt", "a string or an array of token ids", v))
            })
            .collect()
    };
    let prompt = match o.get("prompt") {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid("prompt", "`prompt` is required"))
        }
        Some(Value::String(s)) => PromptInput::Text(s.clone()),
        Some(Value::Array(a)) => match a.as_slice() {
            [] => return Err(ApiError::invalid("prompt", "`prompt` is empty")),
            [Value::String(s)] => PromptInput::Text(s.clone()),
            [Value::Array(inner)] => PromptInput::Ids(ids(inner)?),
            [Value::Number(_), ..] => PromptInput::Ids(ids(a)?),
            [_, _, ..] if a.iter().all(|v| v.is_string() || v.is_array()) => {
                return Err(ApiError::invalid(
                    "prompt",
                    "`prompt`: one prompt per request (this one holds several)",
                ))
            }
            _ => {
                return Err(wrong_type(
                    "prompt",
                    "a string or an array of token ids",
                    &a[0],
                ))
            }
        },
        Some(v) => return Err(wrong_type("prompt", "a string or an array of token ids", v)),
    };
    if matches!(&prompt, PromptInput::Ids(v) if v.is_empty()) {
        return Err(ApiError::invalid("prompt", "`prompt` is empty"));
    }
    let (logprobs, echo) = completion_only(o)?;
    let mut r = common(o, prompt)?;
    r.logprobs = logprobs;
    r.echo = echo;
    Ok(r)
}

/// The Completions API's own fields: `logprobs` (an integer here, the count of most likely
/// tokens, not chat's boolean) and `echo`; the others refused rather than ignored (their
/// neutral values accepted), as the shared ones.
fn completion_only(o: &Map<String, Value>) -> ApiResult<(Option<usize>, bool)> {
    let logprobs = top_count(o, "logprobs")?;
    let echo = opt_bool(o, "echo")?.unwrap_or(false);
    if let Some(n) = opt_uint(o, "best_of")? {
        if n != 1 {
            return Err(ApiError::invalid(
                "best_of",
                format!("`best_of` {n}: only one candidate per request is generated (1 or leave it out)"),
            ));
        }
    }
    match field(o, "suffix") {
        None => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(_)) => {
            return Err(ApiError::invalid(
                "suffix",
                "`suffix`: insertion (text after the completion) is not supported (leave it out)",
            ))
        }
        Some(v) => return Err(wrong_type("suffix", "a string or null", v)),
    }
    Ok((logprobs, echo))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> ApiResult<Request> {
        chat_request(&body)
    }

    #[test]
    fn a_chat_request_is_read_with_its_options() {
        let r = chat(json!({
            "model": "x",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": null},
            ],
            "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": 3,
            "stop": "END", "stream": true, "stream_options": {"include_usage": true},
        }))
        .unwrap();
        assert_eq!(
            r.prompt,
            PromptInput::Chat(vec![
                Message::new(Role::System, "be brief"),
                Message::new(Role::User, "ab"),
                Message::new(Role::Assistant, ""),
            ])
        );
        assert_eq!(r.max_tokens, Some(7));
        assert_eq!(r.sampling.temperature, Some(0.5));
        assert_eq!(r.sampling.seed, Some(3));
        assert_eq!(r.stop, vec!["END".to_string()]);
        assert!(r.stream && r.include_usage && !r.ignore_eos);
    }

    #[test]
    fn bad_chat_requests_name_the_field() {
        let cases = [
            (json!([1]), ""),
            (json!({}), "messages"),
            (json!({"messages": []}), "messages"),
            (json!({"messages": "hi"}), "messages"),
            (
                json!({"messages": [{"role": "wizard", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"messages": [{"role": "tool", "content": "x"}]}),
                "messages[0].role",
            ),
            (json!({"messages": [{"content": "x"}]}), "messages[0].role"),
            (
                json!({"messages": [{"role": "user", "content": 5}]}),
                "messages[0].content",
            ),
            (
                json!({"messages": [{"role": "user"}]}),
                "messages[0].content",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
                "messages[0].content[0]",
            ),
        ];
        for (body, param) in cases {
            let e = chat(body.clone()).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref().unwrap_or(""), param, "{body}: {e:?}");
        }
        let ok = json!([{"role": "user", "content": "x"}]);
        let cases = [
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"max_tokens": "5"}), "max_tokens"),
            (json!({"max_tokens": -1}), "max_tokens"),
            (json!({"max_tokens": 1.5}), "max_tokens"),
            (
                json!({"max_tokens": 4, "max_completion_tokens": 5}),
                "max_completion_tokens",
            ),
            (json!({"temperature": 3}), "temperature"),
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"top_p": 0}), "top_p"),
            (json!({"seed": -2}), "seed"),
            (json!({"stop": 1}), "stop"),
            (json!({"stop": ["a", 2]}), "stop"),
            (json!({"stream": "yes"}), "stream"),
            (json!({"n": 2}), "n"),
            (json!({"model": 1}), "model"),
            (json!({"tools": [{"type": "function"}]}), "tools"),
            (json!({"frequency_penalty": 0.5}), "frequency_penalty"),
            (json!({"presence_penalty": -1}), "presence_penalty"),
            (json!({"presence_penalty": "x"}), "presence_penalty"),
            (json!({"logit_bias": {"42": 10}}), "logit_bias"),
            (
                json!({"response_format": {"type": "json_object"}}),
                "response_format",
            ),
            (
                json!({"stream_options": {"include_usage": 1}}),
                "stream_options.include_usage",
            ),
        ];
        for (extra, param) in cases {
            let mut body = extra.clone();
            body["messages"] = ok.clone();
            let e = chat(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
            assert!(e.message.contains(param), "{body}: {e:?}");
        }
    }

    #[test]
    fn neutral_values_of_unsupported_options_are_accepted() {
        let body = json!({
            "messages": [{"role": "user", "content": "x"}],
            "frequency_penalty": 0,
            "presence_penalty": 0.0,
            "logit_bias": {},
            "response_format": {"type": "text"},
            "tools": [],
            "logprobs": false,
        });
        assert!(chat(body.clone()).is_ok(), "{body}");
    }

    #[test]
    fn completion_prompts_are_one_string_or_one_list_of_ids() {
        let p = |v: Value| completion_request(&json!({"prompt": v})).map(|r| r.prompt);
        assert_eq!(p(json!("hi")), Ok(PromptInput::Text("hi".into())));
        assert_eq!(p(json!(["hi"])), Ok(PromptInput::Text("hi".into())));
        assert_eq!(p(json!([1, 2])), Ok(PromptInput::Ids(vec![1, 2])));
        assert_eq!(p(json!([[1, 2]])), Ok(PromptInput::Ids(vec![1, 2])));
        for bad in [
            json!(["a", "b"]),
            json!([]),
            json!([[]]),
            json!([1, "a"]),
            json!(3),
            json!(null),
        ] {
            let e = p(bad.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("prompt"), "{bad}");
        }
    }

    /// The Completions API's own fields: `logprobs` an integer of 0..=20 and `echo` read,
    /// `best_of` and `suffix` refused naming the field, neutral values passing; chat's
    /// `logprobs` a boolean with `top_logprobs` its count.
    #[test]
    fn completion_fields_are_read_or_refused_not_ignored() {
        let c = |extra: Value| {
            let mut b = json!({"prompt": "hi"});
            for (k, v) in extra.as_object().unwrap() {
                b[k] = v.clone();
            }
            completion_request(&b)
        };
        for (extra, param, words) in [
            (json!({"best_of": 3}), "best_of", "only one"),
            (json!({"suffix": "end"}), "suffix", "not supported"),
            (json!({"logprobs": 21}), "logprobs", "from 0 to 20"),
            (json!({"logprobs": -1}), "logprobs", "from 0 to 20"),
            (json!({"logprobs": true}), "logprobs", "an integer"),
            (json!({"echo": "yes"}), "echo", "a boolean"),
            (json!({"suffix": 1}), "suffix", "a string"),
        ] {
            let e = c(extra.clone()).unwrap_err();
            assert_eq!(e.status, 400, "{extra}");
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {e:?}");
            assert!(
                e.message.contains(param) && e.message.contains(words),
                "{extra}: {e:?}"
            );
            assert!(!e.message.contains("boolean, not 2"), "{e:?}");
        }
        for ok in [
            json!({"echo": false, "best_of": 1, "suffix": null, "logprobs": null}),
            json!({"suffix": ""}),
        ] {
            let r = c(ok.clone()).unwrap();
            assert_eq!((r.logprobs, r.echo), (None, false), "{ok}");
        }
        assert_eq!(c(json!({"logprobs": 0})).unwrap().logprobs, Some(0));
        assert_eq!(c(json!({"logprobs": 20})).unwrap().logprobs, Some(20));
        assert!(c(json!({"echo": true})).unwrap().echo);
        // Prompt scoring: echo with logprobs, max_tokens 0 allowed only with echo.
        let r = c(json!({"echo": true, "logprobs": 1, "max_tokens": 0})).unwrap();
        assert!(r.scores_prompt() && r.max_tokens == Some(0));
        assert!(!c(json!({"echo": true})).unwrap().scores_prompt());
        let e = c(json!({"max_tokens": 0})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"), "{e:?}");
        assert!(e.message.contains("echo"), "{e:?}");
        // Chat's logprobs is a boolean, top_logprobs its count.
        let ch = |extra: Value| {
            let mut b = json!({"messages": [{"role": "user", "content": "x"}]});
            for (k, v) in extra.as_object().unwrap() {
                b[k] = v.clone();
            }
            chat(b)
        };
        assert_eq!(ch(json!({"logprobs": true})).unwrap().logprobs, Some(0));
        assert_eq!(
            ch(json!({"logprobs": true, "top_logprobs": 3}))
                .unwrap()
                .logprobs,
            Some(3)
        );
        assert_eq!(ch(json!({"logprobs": false})).unwrap().logprobs, None);
        for (extra, param) in [
            (json!({"logprobs": 2}), "logprobs"),
            (json!({"top_logprobs": 2}), "top_logprobs"),
            (
                json!({"logprobs": true, "top_logprobs": 21}),
                "top_logprobs",
            ),
        ] {
            let e = ch(extra.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {e:?}");
        }
        let r = c(json!({"model": "m"})).unwrap();
        assert_eq!(r.model.as_deref(), Some("m"));
    }

    #[test]
    fn the_error_body_has_openai_fields() {
        let e = ApiError::invalid("messages", "bad").with_code("context_length_exceeded");
        assert_eq!(
            e.body(),
            json!({"error": {"message": "bad", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}})
        );
    }
}

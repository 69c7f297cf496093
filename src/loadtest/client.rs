//! One client's side of `loadtest`: the request bodies (good and malformed), one request
//! sent and its answer read (a JSON body, or server-sent events chunk by chunk, dropped
//! early where the plan says so), and the server reached once before the load.

use std::io::{BufRead, BufReader, Read};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{prompt_ids, Endpoint, Options, Record, Role};
use crate::error::{Error, Result};

/// The malformed requests, in the order the plan hands them out (the first ones are
/// what a small run sends): each must get a 4xx with a JSON error.
pub const BAD_KINDS: [&str; 7] = [
    "invalid_json",
    "token_outside_vocabulary",
    "max_tokens_zero",
    "empty_prompt",
    "temperature_out_of_range",
    "stream_not_boolean",
    "n_not_one",
];

/// The name of malformed kind `k` on `endpoint` (chat sends an unknown role where
/// completions sends a token id outside the vocabulary).
pub fn bad_kind(endpoint: Endpoint, k: usize) -> &'static str {
    match BAD_KINDS[k % BAD_KINDS.len()] {
        "token_outside_vocabulary" if endpoint == Endpoint::Chat => "unknown_role",
        name => name,
    }
}

/// Longest line of an event stream, and most bytes of a non-streamed answer or an error.
const MAX_LINE: u64 = 16 << 20;

/// Words of the chat prompts (`--endpoint chat`).
const WORDS: [&str; 16] = [
    "river", "clock", "stone", "green", "light", "window", "paper", "north", "quiet", "bread",
    "music", "cloud", "table", "silver", "garden", "winter",
];

/// How one request ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// A 200 answer, read to its end or to the client's drop.
    Answer(Answer),
    /// Another status, with whether the body was a JSON `{"error": {"message"}}`.
    Status {
        status: u16,
        error_json: bool,
        message: String,
    },
    /// No answer: the request could not be sent (refused, reset, no such host).
    Connection(String),
    /// No complete answer within `--timeout`.
    Timeout(String),
    /// A 200 whose body broke off before its end.
    Broken(String),
    /// A 200 whose body is not what the API promises.
    Protocol(String),
}

/// What a 200 answer held.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Answer {
    /// The response's `id` (every chunk of a stream must carry the same).
    pub id: Option<String>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// A stream's two `usage` objects (finish chunk, usage-only chunk) disagree.
    pub usage_conflict: bool,
    /// Content chunks of a stream.
    pub chunks: usize,
    /// Choices with a `finish_reason`: one per answer.
    pub finishes: usize,
    pub finish_reason: Option<String>,
    /// The stream ended with `data: [DONE]`.
    pub done_marker: bool,
    /// The client dropped the stream (the plan's disconnect).
    pub disconnected: bool,
    /// An `{"error": ...}` event in the stream (or body).
    pub error_event: Option<String>,
    /// The generated text (stream pieces joined).
    pub text: String,
}

/// Each client's HTTP agent: its own keep-alive connection, statuses as answers.
pub fn agent(o: &Options) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(o.timeout))
        .user_agent(concat!("wgmoe-loadtest/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

/// The request bodies of one run.
pub struct Bodies {
    endpoint: Endpoint,
    stream: bool,
    prompt_tokens: usize,
    max_tokens: usize,
    seed: u64,
    model: Option<String>,
}

impl Bodies {
    pub fn new(o: &Options, model: Option<&str>) -> Self {
        Bodies {
            endpoint: o.endpoint,
            stream: o.stream,
            prompt_tokens: o.prompt_tokens,
            max_tokens: o.max_tokens,
            seed: o.seed,
            model: model.map(str::to_string),
        }
    }

    fn value(&self, index: usize) -> Value {
        let ids = prompt_ids(self.seed, index, self.prompt_tokens);
        let mut v = json!({
            "max_tokens": self.max_tokens,
            "ignore_eos": true,
            "temperature": 0,
            "stream": self.stream,
        });
        match self.endpoint {
            Endpoint::Completions => v["prompt"] = json!(ids),
            Endpoint::Chat => {
                let words: Vec<&str> = ids
                    .iter()
                    .map(|&t| WORDS[t as usize % WORDS.len()])
                    .collect();
                v["messages"] = json!([{"role": "user", "content": words.join(" ")}]);
            }
        }
        if self.stream {
            v["stream_options"] = json!({"include_usage": true});
        }
        if let Some(m) = &self.model {
            v["model"] = json!(m);
        }
        v
    }

    /// The well-formed body of request `index`.
    pub fn good(&self, index: usize) -> String {
        self.value(index).to_string()
    }

    /// The malformed body of request `index`, of kind `k % BAD_KINDS.len()`.
    pub fn bad(&self, index: usize, k: usize) -> String {
        let mut v = self.value(index);
        let chat = self.endpoint == Endpoint::Chat;
        match BAD_KINDS[k % BAD_KINDS.len()] {
            "invalid_json" => {
                let s = v.to_string();
                let half = s.chars().count() / 2;
                return s.chars().take(half).collect();
            }
            "token_outside_vocabulary" if chat => {
                v["messages"] = json!([{"role": "wizard", "content": "hello"}]);
            }
            "token_outside_vocabulary" => v["prompt"] = json!([u32::MAX]),
            "max_tokens_zero" => v["max_tokens"] = json!(0),
            "empty_prompt" if chat => v["messages"] = json!([]),
            "empty_prompt" => v["prompt"] = json!([]),
            "temperature_out_of_range" => v["temperature"] = json!(7),
            "stream_not_boolean" => v["stream"] = json!("yes"),
            _ => v["n"] = json!(2),
        }
        v.to_string()
    }
}

fn timed_out(e: &ureq::Error) -> bool {
    match e {
        ureq::Error::Timeout(_) => true,
        ureq::Error::Io(io) => io_timed_out(io),
        _ => false,
    }
}

fn io_timed_out(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::TimedOut
        || e.get_ref()
            .and_then(|x| x.downcast_ref::<ureq::Error>())
            .is_some_and(|u| matches!(u, ureq::Error::Timeout(_)))
}

/// A failed send in words.
fn describe(e: &ureq::Error) -> String {
    match e {
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            "connection refused".into()
        }
        ureq::Error::Io(io) => format!("{} ({:?})", io, io.kind()),
        ureq::Error::HostNotFound => "host not found".into(),
        e => e.to_string(),
    }
}

fn failed_send(e: &ureq::Error, timeout: Duration) -> Outcome {
    if timed_out(e) {
        Outcome::Timeout(format!(
            "no answer within --timeout {}s",
            timeout.as_secs_f64()
        ))
    } else {
        Outcome::Connection(describe(e))
    }
}

/// The `{"error": {"message"}}` of an error body, if it is one.
fn error_message(v: &Value) -> Option<String> {
    let e = v.get("error")?;
    e.get("message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| e.as_str().map(str::to_string))
}

/// (prompt_tokens, completion_tokens) of a `usage` object.
fn usage_of(v: &Value) -> Option<(Option<u64>, Option<u64>)> {
    let u = v.get("usage").filter(|u| u.is_object())?;
    Some((
        u.get("prompt_tokens").and_then(Value::as_u64),
        u.get("completion_tokens").and_then(Value::as_u64),
    ))
}

fn read_limited(r: &mut ureq::http::Response<ureq::Body>) -> std::io::Result<String> {
    let mut buf = Vec::new();
    r.body_mut()
        .as_reader()
        .take(MAX_LINE)
        .read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Send request (client, seq) of role `role` and read its answer.
pub fn send(
    agent: &ureq::Agent,
    base: &str,
    o: &Options,
    bodies: &Bodies,
    client: usize,
    seq: usize,
    role: Role,
) -> Record {
    let index = client * o.requests + seq;
    let body = match role {
        Role::Bad(k) => bodies.bad(index, k),
        Role::Good | Role::Disconnect => bodies.good(index),
    };
    let url = format!("{base}{}", o.endpoint.path());
    let mut req = agent.post(&url).header("Content-Type", "application/json");
    if let Some(k) = &o.api_key {
        req = req.header("Authorization", format!("Bearer {k}"));
    }
    let t0 = Instant::now();
    let (outcome, ttft_s) = match req.send(body.as_str()) {
        Err(e) => (failed_send(&e, o.timeout), None),
        Ok(mut r) => {
            let status = r.status().as_u16();
            if status != 200 {
                (status_outcome(status, read_limited(&mut r)), None)
            } else if o.stream && !matches!(role, Role::Bad(_)) {
                let drop_after = (role == Role::Disconnect).then_some(o.disconnect_after);
                read_stream(&mut r, t0, drop_after, o)
            } else {
                (read_whole(&mut r, o), None)
            }
        }
    };
    Record {
        client,
        seq,
        role,
        outcome,
        latency_s: t0.elapsed().as_secs_f64(),
        ttft_s,
    }
}

fn status_outcome(status: u16, body: std::io::Result<String>) -> Outcome {
    let text = body.unwrap_or_default();
    let msg = serde_json::from_str::<Value>(&text)
        .ok()
        .as_ref()
        .and_then(error_message);
    Outcome::Status {
        status,
        error_json: msg.is_some(),
        message: msg.unwrap_or_else(|| text.chars().take(200).collect()),
    }
}

fn broken(e: &std::io::Error, o: &Options) -> Outcome {
    if io_timed_out(e) {
        Outcome::Timeout(format!(
            "the answer did not end within --timeout {}s",
            o.timeout.as_secs_f64()
        ))
    } else {
        Outcome::Broken(format!("the answer broke off: {e}"))
    }
}

/// A 200 that is not streamed: one JSON body.
fn read_whole(r: &mut ureq::http::Response<ureq::Body>, o: &Options) -> Outcome {
    let text = match read_limited(r) {
        Ok(t) => t,
        Err(e) => return broken(&e, o),
    };
    let v: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return Outcome::Protocol(format!("the answer is not JSON: {e}")),
    };
    let mut a = Answer {
        id: v.get("id").and_then(Value::as_str).map(str::to_string),
        error_event: error_message(&v),
        ..Answer::default()
    };
    if let Some((p, c)) = usage_of(&v) {
        a.prompt_tokens = p;
        a.completion_tokens = c;
    }
    if let Some(choices) = v.get("choices").and_then(Value::as_array) {
        for c in choices {
            if let Some(fr) = c.get("finish_reason").and_then(Value::as_str) {
                a.finishes += 1;
                a.finish_reason = Some(fr.to_string());
            }
            let text = c
                .get("text")
                .or_else(|| c.get("message").and_then(|m| m.get("content")))
                .and_then(Value::as_str)
                .unwrap_or("");
            a.text.push_str(text);
        }
    }
    Outcome::Answer(a)
}

/// One `data:` payload of a stream into `a`; `Err` for what breaks the protocol.
fn on_event(a: &mut Answer, data: &str, endpoint: Endpoint) -> std::result::Result<bool, String> {
    if a.done_marker {
        return Err(format!("an event after [DONE]: {}", short(data)));
    }
    if data == "[DONE]" {
        a.done_marker = true;
        return Ok(false);
    }
    let v: Value = serde_json::from_str(data)
        .map_err(|e| format!("an event is not JSON ({e}): {}", short(data)))?;
    if let Some(m) = error_message(&v) {
        a.error_event = Some(m);
        return Ok(false);
    }
    if let Some(id) = v.get("id").and_then(Value::as_str) {
        match &a.id {
            None => a.id = Some(id.to_string()),
            Some(first) if first != id => {
                return Err(format!("one stream carries the ids {first} and {id}"))
            }
            Some(_) => {}
        }
    }
    let choices = v
        .get("choices")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("a chunk without `choices`: {}", short(data)))?;
    let usage = usage_of(&v);
    if let Some((p, c)) = usage {
        if a.prompt_tokens.is_some() || a.completion_tokens.is_some() {
            a.usage_conflict |= (a.prompt_tokens, a.completion_tokens) != (p, c);
        }
        a.prompt_tokens = p;
        a.completion_tokens = c;
    }
    let Some(c0) = choices.first() else {
        return Ok(false); // the usage-only chunk
    };
    if let Some(fr) = c0.get("finish_reason").and_then(Value::as_str) {
        a.finishes += 1;
        a.finish_reason = Some(fr.to_string());
        return Ok(false);
    }
    let piece = match endpoint {
        Endpoint::Completions => c0.get("text"),
        Endpoint::Chat => c0.get("delta").and_then(|d| d.get("content")),
    };
    a.text.push_str(piece.and_then(Value::as_str).unwrap_or(""));
    a.chunks += 1;
    Ok(true)
}

fn short(s: &str) -> String {
    let mut t: String = s.chars().take(120).collect();
    if t.len() < s.len() {
        t.push_str("...");
    }
    t
}

/// A 200 stream: the events one by one; with `drop_after`, the connection is dropped
/// after that many content chunks. Returns the outcome and the time to the first chunk.
fn read_stream(
    r: &mut ureq::http::Response<ureq::Body>,
    t0: Instant,
    drop_after: Option<usize>,
    o: &Options,
) -> (Outcome, Option<f64>) {
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    if !ct.starts_with("text/event-stream") {
        let what = if ct.is_empty() { "none".into() } else { ct };
        return (
            Outcome::Protocol(format!(
                "a stream was asked for, the answer's content-type is {what}"
            )),
            None,
        );
    }
    let mut reader = BufReader::new(r.body_mut().as_reader());
    let mut a = Answer::default();
    let mut ttft = None;
    let mut data = String::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line) {
            Ok(n) => n,
            Err(e) => return (broken(&e, o), ttft),
        };
        if n as u64 >= MAX_LINE {
            return (
                Outcome::Protocol(format!("an event line longer than {MAX_LINE} bytes")),
                ttft,
            );
        }
        let text = String::from_utf8_lossy(&line);
        let l = text.trim_end_matches(['\n', '\r']);
        if n == 0 || l.is_empty() {
            // The end of an event (or of the stream).
            if !data.is_empty() {
                match on_event(&mut a, &data, o.endpoint) {
                    Ok(true) => {
                        if ttft.is_none() {
                            ttft = Some(t0.elapsed().as_secs_f64());
                        }
                        if drop_after.is_some_and(|k| a.chunks >= k) {
                            // Returning drops the reader and the connection with it.
                            a.disconnected = true;
                            return (Outcome::Answer(a), ttft);
                        }
                    }
                    Ok(false) => {}
                    Err(m) => return (Outcome::Protocol(m), ttft),
                }
                data.clear();
            }
            if n == 0 {
                break;
            }
            continue;
        }
        if let Some(d) = l.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(d.strip_prefix(' ').unwrap_or(d));
        }
        // `event:`, `id:`, `retry:` and `:` comments carry nothing checked here.
    }
    (Outcome::Answer(a), ttft)
}

/// GET `base/health` (and `/v1/models` for the model's name) before any load: a server
/// that cannot be reached, or wants another key, is one clear error naming the URL.
pub fn preflight(base: &str, o: &Options) -> Result<Option<String>> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(o.timeout.min(Duration::from_secs(30))))
        .build()
        .into();
    let get = |path: &str| {
        let mut r = agent.get(format!("{base}{path}"));
        if let Some(k) = &o.api_key {
            r = r.header("Authorization", format!("Bearer {k}"));
        }
        r.call()
    };
    let mut r = get("/health").map_err(|e| {
        let hint = match &e {
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                " (is the server running? `wgmoe serve MODEL --port PORT` prints its address)"
            }
            _ => "",
        };
        Error::Other(format!("cannot reach {base}: {}{hint}", describe(&e)))
    })?;
    let status = r.status().as_u16();
    match status {
        200 | 404 => {}
        401 | 403 => {
            let msg = match status_outcome(status, read_limited(&mut r)) {
                Outcome::Status { message, .. } => message,
                _ => String::new(),
            };
            let what = if o.api_key.is_some() {
                "refused the API key"
            } else {
                "wants an API key"
            };
            return Err(Error::option(
                "--api-key",
                format!("{base} {what} ({status}: {msg})"),
            ));
        }
        s => {
            return Err(Error::Other(format!(
                "{base}/health answered {s}: the server is not ready"
            )))
        }
    }
    let model = get("/v1/models").ok().and_then(|mut r| {
        if r.status().as_u16() != 200 {
            return None;
        }
        let v: Value = serde_json::from_str(&read_limited(&mut r).ok()?).ok()?;
        v.get("data")?
            .get(0)?
            .get("id")?
            .as_str()
            .map(str::to_string)
    });
    Ok(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(endpoint: Endpoint) -> Options {
        Options {
            url: String::new(),
            clients: 1,
            requests: 1,
            prompt_tokens: 5,
            max_tokens: 3,
            stream: true,
            endpoint,
            bad_fraction: 0.0,
            disconnect_fraction: 0.0,
            disconnect_after: 1,
            seed: 3,
            api_key: None,
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn good_bodies_are_exact_and_bad_ones_are_each_wrong() {
        for ep in [Endpoint::Completions, Endpoint::Chat] {
            let b = Bodies::new(&opts(ep), Some("m"));
            let v: Value = serde_json::from_str(&b.good(0)).unwrap();
            assert_eq!(v["max_tokens"], 3);
            assert_eq!(v["ignore_eos"], true);
            assert_eq!(v["stream_options"]["include_usage"], true);
            assert_eq!(v["model"], "m");
            if ep == Endpoint::Completions {
                assert_eq!(v["prompt"].as_array().unwrap().len(), 5);
            }
            let mut seen = std::collections::BTreeSet::new();
            for k in 0..BAD_KINDS.len() {
                let body = b.bad(0, k);
                assert_ne!(body, b.good(0));
                assert!(seen.insert(body));
            }
        }
    }

    #[test]
    fn stream_events_are_counted_and_checked() {
        let mut a = Answer::default();
        let ep = Endpoint::Completions;
        let chunk =
            |t: &str| format!(r#"{{"id":"x","choices":[{{"text":"{t}","finish_reason":null}}]}}"#);
        assert_eq!(on_event(&mut a, &chunk("a"), ep), Ok(true));
        assert_eq!(on_event(&mut a, &chunk("b"), ep), Ok(true));
        let fin = r#"{"id":"x","choices":[{"text":"","finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#;
        assert_eq!(on_event(&mut a, fin, ep), Ok(false));
        let u = r#"{"id":"x","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}"#;
        assert_eq!(on_event(&mut a, u, ep), Ok(false));
        assert!(a.usage_conflict);
        assert_eq!(on_event(&mut a, "[DONE]", ep), Ok(false));
        assert_eq!((a.chunks, a.finishes, a.text.as_str()), (2, 1, "ab"));
        assert!(a.done_marker);
        assert!(on_event(&mut a, &chunk("c"), ep).is_err());
        let mut b = Answer::default();
        on_event(&mut b, &chunk("a"), ep).unwrap();
        let other = chunk("b").replace("\"x\"", "\"y\"");
        assert!(on_event(&mut b, &other, ep).unwrap_err().contains("ids"));
        assert!(on_event(&mut Answer::default(), "{", ep).is_err());
    }
}

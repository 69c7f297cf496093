//! The HTTP side on axum: routes, the API key, the body limit, JSON and server-sent-event
//! responses in OpenAI's shapes. Handlers never touch the engine: they check the request,
//! queue a job for the worker and turn its events into a response.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::serve::api::{self, ApiError};
use crate::serve::worker::{Done, Event, Job, Shared};

pub struct AppState {
    pub jobs: SyncSender<Job>,
    pub shared: Arc<Shared>,
    /// The name `/v1/models` lists and responses carry.
    pub model: String,
    pub api_key: Option<String>,
    pub max_body: usize,
    pub max_queue: usize,
    pub context: usize,
    pub next_id: AtomicU64,
    /// Unix time the server started (`created` of the model).
    pub started: u64,
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/stats", get(stats))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .with_state(state)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = (status, Json(self.body())).into_response();
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

/// Equal in time independent of where the strings first differ.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn auth(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.strip_prefix("Bearer "))
            .map(str::trim);
        if !given.is_some_and(|g| same_key(g.as_bytes(), key.as_bytes())) {
            let what = if given.is_some() {
                "Incorrect API key"
            } else {
                "Missing API key"
            };
            return ApiError::status(
                401,
                "invalid_request_error",
                "invalid_api_key",
                format!("{what}: send the header `Authorization: Bearer KEY` with the key the server was started with (--api-key)"),
            )
            .into_response();
        }
    }
    next.run(req).await
}

async fn not_found(req: Request) -> ApiError {
    ApiError::status(
        404,
        "invalid_request_error",
        "not_found",
        format!(
            "no such endpoint: {} {} (POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, GET /stats)",
            req.method(),
            req.uri().path()
        ),
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::status(
        405,
        "invalid_request_error",
        "method_not_allowed",
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn models(State(st): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": st.model, "object": "model", "created": st.started, "owned_by": "wgmoe",
        "context_length": st.context,
    }]}))
}

async fn stats(State(st): State<Arc<AppState>>) -> Json<Value> {
    let s = st.shared.stats();
    Json(json!({
        "model": st.model,
        "context": st.context,
        "queue": {"waiting": st.shared.waiting.load(Ordering::SeqCst), "max": st.max_queue},
        "requests": {"served": s.served, "failed": s.failed, "cancelled": s.cancelled, "rejected_queue_full": s.rejected_queue_full},
        "cache_tokens": s.cache_tokens,
        "last": s.last,
        "totals": s.totals,
    }))
}

/// The body as JSON, refusing more than `max` bytes.
async fn read_json(req: Request, max: usize) -> Result<Value, ApiError> {
    let too_large = || {
        ApiError::status(
            413,
            "invalid_request_error",
            "request_too_large",
            format!("the request body exceeds {max} bytes (the server's --max-body)"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    let mut body = req.into_body().into_data_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk
            .map_err(|e| ApiError::invalid("", format!("cannot read the request body: {e}")))?;
        if buf.len() + chunk.len() > max {
            return Err(too_large());
        }
        buf.extend_from_slice(&chunk);
    }
    if buf.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid(
            "",
            "the request body is empty: send a JSON object",
        ));
    }
    serde_json::from_slice(&buf)
        .map_err(|e| ApiError::invalid("", format!("the request body is not valid JSON: {e}")))
}

async fn chat_completions(State(st): State<Arc<AppState>>, req: Request) -> Response {
    handle(st, req, Kind::Chat)
        .await
        .unwrap_or_else(|e| e.into_response())
}

async fn completions(State(st): State<Arc<AppState>>, req: Request) -> Response {
    handle(st, req, Kind::Completion)
        .await
        .unwrap_or_else(|e| e.into_response())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

/// Response pieces of one request, in the endpoint's format.
struct Format {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
}

fn usage(d: &Done) -> Value {
    let s = &d.stats;
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.generated_tokens,
        "total_tokens": s.prompt_tokens + s.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": s.cached_tokens},
        "cached_tokens": s.cached_tokens,
        "prefilled_tokens": s.prefilled_tokens,
    })
}

/// llama-server's `timings` object.
fn timings(d: &Done) -> Value {
    let s = &d.stats;
    json!({
        "cache_n": s.cached_tokens,
        "prompt_n": s.prefilled_tokens,
        "prompt_ms": s.ttft_s * 1e3,
        "prompt_per_second": s.prefill_tokens_per_s,
        "predicted_n": s.generated_tokens,
        "predicted_ms": s.decode_s * 1e3,
        "predicted_per_second": s.decode_tokens_per_s,
    })
}

impl Format {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id, "object": self.object(chunk), "created": self.created,
            "model": self.model, "choices": choices,
        })
    }

    /// A streamed piece of text (`role` on a chat stream's first chunk).
    fn delta(&self, text: &str, first: bool) -> String {
        let choice = match self.kind {
            Kind::Chat if first => {
                json!({"index": 0, "delta": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": null})
            }
            Kind::Chat => {
                json!({"index": 0, "delta": {"content": text}, "logprobs": null, "finish_reason": null})
            }
            Kind::Completion => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": null})
            }
        };
        self.envelope(true, json!([choice])).to_string()
    }

    /// The last chunks of a stream: the finish reason (with usage and timings), then with
    /// `include_usage` OpenAI's usage-only chunk.
    fn finish(&self, d: &Done) -> Vec<String> {
        let choice = match self.kind {
            Kind::Chat => {
                json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": d.finish_reason})
            }
            Kind::Completion => {
                json!({"index": 0, "text": "", "logprobs": null, "finish_reason": d.finish_reason})
            }
        };
        let mut last = self.envelope(true, json!([choice]));
        last["usage"] = usage(d);
        last["timings"] = timings(d);
        let mut out = vec![last.to_string()];
        if self.include_usage {
            let mut u = self.envelope(true, json!([]));
            u["usage"] = usage(d);
            out.push(u.to_string());
        }
        out
    }

    /// The whole response of a request that was not streamed.
    fn complete(&self, text: String, d: &Done) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": d.finish_reason})
            }
            Kind::Completion => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": d.finish_reason})
            }
        };
        let mut v = self.envelope(false, json!([choice]));
        v["usage"] = usage(d);
        v["timings"] = timings(d);
        v
    }
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

async fn handle(st: Arc<AppState>, req: Request, kind: Kind) -> Result<Response, ApiError> {
    let endpoint = match kind {
        Kind::Chat => "/v1/chat/completions",
        Kind::Completion => "/v1/completions",
    };
    let body = read_json(req, st.max_body).await?;
    let request = match kind {
        Kind::Chat => api::chat_request(&body)?,
        Kind::Completion => api::completion_request(&body)?,
    };
    let id = st.next_id.fetch_add(1, Ordering::SeqCst);
    let fmt = Format {
        kind,
        id: format!(
            "{}-{:x}{id:04x}",
            if kind == Kind::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            st.started
        ),
        created: now_unix(),
        model: st.model.clone(),
        include_usage: request.include_usage,
    };
    let stream = request.stream;
    let (tx, mut rx) = unbounded_channel();
    let job = Job {
        id,
        endpoint,
        request,
        events: tx,
        queued: Instant::now(),
    };
    // Admission counts the request being served too, so it does not depend on whether
    // the worker is already back waiting for the next job.
    let queue_full = || {
        st.shared.stats().rejected_queue_full += 1;
        eprintln!("request {id} {endpoint}: refused, the queue is full");
        ApiError::status(
            503,
            "server_error",
            "queue_full",
            format!(
                "the server is busy: one request is being served and {} are waiting (--max-queue); retry later",
                st.max_queue
            ),
        )
    };
    if st.shared.pending.fetch_add(1, Ordering::SeqCst) > st.max_queue {
        st.shared.pending.fetch_sub(1, Ordering::SeqCst);
        return Err(queue_full());
    }
    st.shared.waiting.fetch_add(1, Ordering::SeqCst);
    if let Err(e) = st.jobs.try_send(job) {
        st.shared.waiting.fetch_sub(1, Ordering::SeqCst);
        st.shared.pending.fetch_sub(1, Ordering::SeqCst);
        return Err(match e {
            TrySendError::Full(_) => queue_full(),
            TrySendError::Disconnected(_) => ApiError::status(
                500,
                "server_error",
                "worker_gone",
                "the model worker has stopped",
            ),
        });
    }
    // The first event says whether the request can run (a context error is a 400 even
    // for a stream).
    match rx.recv().await {
        Some(Event::Started) => {}
        Some(Event::Error(e)) => return Err(e),
        _ => {
            return Err(ApiError::status(
                500,
                "server_error",
                "worker_gone",
                "the model worker stopped before answering",
            ))
        }
    }
    if stream {
        return Ok(sse(fmt, rx).into_response());
    }
    let mut text = String::new();
    loop {
        match rx.recv().await {
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done(d)) => return Ok(Json(fmt.complete(text, &d)).into_response()),
            Some(Event::Error(e)) => return Err(e),
            Some(Event::Started) => {}
            None => {
                return Err(ApiError::status(
                    500,
                    "server_error",
                    "worker_gone",
                    "the model worker stopped mid-answer",
                ))
            }
        }
    }
}

struct SseState {
    rx: UnboundedReceiver<Event>,
    fmt: Format,
    queue: VecDeque<String>,
    first: bool,
    done: bool,
}

/// Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`. Dropping the
/// stream (the client went away) drops the receiver, which stops the generation.
fn sse(
    fmt: Format,
    rx: UnboundedReceiver<Event>,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let st = SseState {
        rx,
        fmt,
        queue: VecDeque::new(),
        first: true,
        done: false,
    };
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(data) = st.queue.pop_front() {
                return Some((Ok(SseEvent::default().data(data)), st));
            }
            if st.done {
                return None;
            }
            match st.rx.recv().await {
                Some(Event::Text(t)) => {
                    let d = st.fmt.delta(&t, st.first);
                    st.first = false;
                    st.queue.push_back(d);
                }
                Some(Event::Done(d)) => {
                    if st.first && st.fmt.kind == Kind::Chat {
                        st.queue.push_back(st.fmt.delta("", true));
                    }
                    st.queue.extend(st.fmt.finish(&d));
                    st.queue.push_back("[DONE]".into());
                    st.done = true;
                }
                Some(Event::Error(e)) => {
                    st.queue.push_back(e.body().to_string());
                    st.done = true;
                }
                Some(Event::Started) => {}
                None => st.done = true,
            }
        }
    });
    Sse::new(stream)
}

//! The HTTP side on axum: routes, the API key, the body limit, JSON and server-sent-event
//! responses in OpenAI's shapes. Handlers never touch the engine: they check the request,
//! queue a job for the worker and turn its events into a response. While the server drains
//! (`Shared::draining`) new requests get 503 `shutting_down`, `/health` 503 "draining",
//! and every response says `Connection: close`, so no connection stays open for more.

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
use crate::serve::logprobs::{self, Logprob};
use crate::serve::worker::{shutting_down, Done, Event, Job, Shared};

pub struct AppState {
    pub jobs: SyncSender<Job>,
    pub shared: Arc<Shared>,
    /// The name `/v1/models` lists and responses carry.
    pub model: String,
    /// Every name of the loaded model (`model` first), for `--strict-model` and
    /// `GET /v1/models/{id}`.
    pub names: Vec<String>,
    pub strict_model: bool,
    /// The served model's tokenizer (`/tokenize`, `/detokenize`).
    pub tokenizer: Arc<crate::tokenizer::Tokenizer>,
    pub api_key: Option<String>,
    pub max_body: usize,
    pub max_queue: usize,
    /// Slots (`--parallel`): requests served at once.
    pub slots: usize,
    /// Positions of each slot.
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
        .route("/v1/models/{*id}", get(model))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/stats", get(stats))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_failures,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            close_when_draining,
        ))
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

/// On an error response counted already (by the worker that refused the request, as a
/// queue-full rejection) or that is no failed request (`/health` while draining).
#[derive(Clone, Copy)]
struct Tallied;

fn tallied(r: impl IntoResponse) -> Response {
    let mut r = r.into_response();
    r.extensions_mut().insert(Tallied);
    r
}

/// Every error answer counts in `failed` (`wgmoe_requests_failed_total`): the refusals
/// before a request reaches the worker (bad JSON or fields, the API key, unknown paths,
/// the body limit, draining) as well as the worker's.
async fn count_failures(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let r = next.run(req).await;
    let error = r.status().is_client_error() || r.status().is_server_error();
    if error && r.extensions().get::<Tallied>().is_none() {
        st.shared.stats().failed += 1;
    }
    r
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

/// While draining, `Connection: close` on every response: hyper closes the connection once
/// the response is sent, so keep-alive clients reconnect (and find the server gone or
/// refusing) instead of holding a connection the shutdown waits for.
async fn close_when_draining(
    State(st): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let mut r = next.run(req).await;
    if st.shared.draining.load(Ordering::SeqCst) {
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

fn refuse_while_draining(endpoint: &str) -> ApiError {
    eprintln!("request to {endpoint}: refused, the server is shutting down");
    shutting_down("it takes no new requests")
}

async fn not_found(req: Request) -> ApiError {
    ApiError::status(
        404,
        "invalid_request_error",
        "not_found",
        format!(
            "no such endpoint: {} {} (POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /v1/models/ID, POST /tokenize, POST /detokenize, GET /health, GET /metrics, GET /stats)",
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

/// `{"status": "ok"}` with the slots in use (as llama-server's `slots_idle` and
/// `slots_processing`); while draining 503 `{"status": "draining"}` (a load balancer stops
/// sending requests here).
async fn health(State(st): State<Arc<AppState>>) -> Response {
    let busy = st.shared.slots_busy.load(Ordering::SeqCst).min(st.slots);
    let (code, status) = match st.shared.draining.load(Ordering::SeqCst) {
        true => (StatusCode::SERVICE_UNAVAILABLE, "draining"),
        false => (StatusCode::OK, "ok"),
    };
    let body = json!({
        "status": status,
        "slots_idle": st.slots - busy,
        "slots_processing": busy,
        "slots_total": st.slots,
    });
    tallied((code, Json(body)))
}

/// Prometheus text: slots, queue and request and token counters.
async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let s = st.shared.stats();
    let busy = st.shared.slots_busy.load(Ordering::SeqCst).min(st.slots);
    let waiting = st.shared.waiting.load(Ordering::SeqCst);
    let t = &s.totals;
    let rows: [(&str, &str, &str, u64); 14] = [
        (
            "wgmoe_slots_total",
            "gauge",
            "Slots (--parallel): requests served at once.",
            st.slots as u64,
        ),
        (
            "wgmoe_slots_processing",
            "gauge",
            "Slots serving a request now.",
            busy as u64,
        ),
        (
            "wgmoe_requests_waiting",
            "gauge",
            "Requests queued for a slot.",
            waiting as u64,
        ),
        (
            "wgmoe_cache_tokens",
            "gauge",
            "Tokens held in the slots' KV regions.",
            s.cache_tokens as u64,
        ),
        (
            "wgmoe_requests_served_total",
            "counter",
            "Requests answered in full.",
            s.served,
        ),
        (
            "wgmoe_requests_failed_total",
            "counter",
            "Requests answered with an error (every 4xx and 5xx but queue-full rejections).",
            s.failed,
        ),
        (
            "wgmoe_requests_cancelled_total",
            "counter",
            "Requests whose client went away.",
            s.cancelled,
        ),
        (
            "wgmoe_requests_rejected_total",
            "counter",
            "Requests refused with a full queue.",
            s.rejected_queue_full,
        ),
        (
            "wgmoe_prompt_tokens_total",
            "counter",
            "Prompt tokens of finished requests.",
            t.prompt_tokens,
        ),
        (
            "wgmoe_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens found in a slot's cache.",
            t.cached_tokens,
        ),
        (
            "wgmoe_generated_tokens_total",
            "counter",
            "Tokens generated.",
            t.generated_tokens,
        ),
        (
            "wgmoe_decode_steps_total",
            "counter",
            "Decode steps (one forward each).",
            s.decode_steps,
        ),
        (
            "wgmoe_decode_step_tokens_total",
            "counter",
            "Tokens the decode steps ran (one per request in a step).",
            s.decode_step_tokens,
        ),
        (
            "wgmoe_batched_steps_total",
            "counter",
            "Decode steps that ran several requests together.",
            s.batched_steps,
        ),
    ];
    drop(s);
    let mut out = String::new();
    for (name, kind, help, v) in rows {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
        ));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

fn model_object(st: &AppState) -> Value {
    json!({
        "id": st.model, "object": "model", "created": st.started, "owned_by": "wgmoe",
        "context_length": st.context,
    })
}

async fn models(State(st): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_object(&st)]}))
}

/// `GET /v1/models/{id}` (the OpenAI client's `models.retrieve`).
async fn model(
    State(st): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    if !st.names.contains(&id) {
        return Err(api::model_not_found(&id, &st.model));
    }
    Ok(Json(model_object(&st)))
}

async fn tokenize(State(st): State<Arc<AppState>>, req: Request) -> Result<Json<Value>, ApiError> {
    if st.shared.draining.load(Ordering::SeqCst) {
        return Err(refuse_while_draining("/tokenize"));
    }
    let body = read_json(req, st.max_body).await?;
    Ok(Json(crate::serve::tokenize::tokenize(
        &st.tokenizer,
        &body,
    )?))
}

async fn detokenize(
    State(st): State<Arc<AppState>>,
    req: Request,
) -> Result<Json<Value>, ApiError> {
    if st.shared.draining.load(Ordering::SeqCst) {
        return Err(refuse_while_draining("/detokenize"));
    }
    let body = read_json(req, st.max_body).await?;
    Ok(Json(crate::serve::tokenize::detokenize(
        &st.tokenizer,
        &body,
    )?))
}

async fn stats(State(st): State<Arc<AppState>>) -> Json<Value> {
    let s = st.shared.stats();
    Json(json!({
        "model": st.model,
        "context": st.context,
        "slots": {"total": st.slots, "processing": st.shared.slots_busy.load(Ordering::SeqCst).min(st.slots)},
        "queue": {"waiting": st.shared.waiting.load(Ordering::SeqCst), "max": st.max_queue},
        "requests": {"served": s.served, "failed": s.failed, "cancelled": s.cancelled, "rejected_queue_full": s.rejected_queue_full},
        "cache_tokens": s.cache_tokens,
        "decode": {"steps": s.decode_steps, "step_tokens": s.decode_step_tokens, "batched_steps": s.batched_steps, "step_seconds": s.step_costs},
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
    /// The request asked for log-probabilities.
    logprobs: bool,
    /// Completions' `echo`: the prompt's text, returned in front of the completion.
    echo: Option<String>,
    /// The echoed prompt's tokens are scored: the echo waits for their log-probabilities.
    scores_prompt: bool,
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

    /// The `logprobs` of `entries` (their text starting at character `*offset` of the
    /// completion, advanced past them); null when the request asked for none.
    fn logprobs(&self, entries: &[Logprob], offset: &mut usize) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        match self.kind {
            Kind::Chat => logprobs::chat(entries),
            Kind::Completion => {
                let (v, end) = logprobs::completion(entries, *offset);
                *offset = end;
                v
            }
        }
    }

    /// Where the completion's own text starts (after an echoed prompt), in characters.
    fn text_start(&self) -> usize {
        self.echo.as_deref().map_or(0, |e| e.chars().count())
    }

    /// A streamed piece of text (`role` on a chat stream's first chunk) with the
    /// log-probabilities of the tokens it carries.
    fn delta(&self, text: &str, first: bool, logprobs: Value) -> String {
        let mut choice = match self.kind {
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
        choice["logprobs"] = logprobs;
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
    fn complete(&self, text: String, d: &Done, logprobs: Value) -> Value {
        let text = match &self.echo {
            Some(e) => format!("{e}{text}"),
            None => text,
        };
        let mut choice = match self.kind {
            Kind::Chat => {
                json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": d.finish_reason})
            }
            Kind::Completion => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": d.finish_reason})
            }
        };
        choice["logprobs"] = logprobs;
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
    if st.shared.draining.load(Ordering::SeqCst) {
        return Err(refuse_while_draining(endpoint));
    }
    let body = read_json(req, st.max_body).await?;
    let request = match kind {
        Kind::Chat => api::chat_request(&body)?,
        Kind::Completion => api::completion_request(&body)?,
    };
    // Any name is answered by the loaded model unless --strict-model (many clients send a
    // fixed name); the response names the model that answered.
    if let Some(m) = request.model.as_deref() {
        if st.strict_model && !st.names.iter().any(|n| n == m) {
            return Err(api::model_not_found(m, &st.model));
        }
    }
    // The prompt as text, returned in front of the completion (`echo`).
    let echo = match (&request.prompt, request.echo) {
        (_, false) | (api::PromptInput::Chat(_), _) => None,
        (api::PromptInput::Text(s), true) => Some(s.clone()),
        (api::PromptInput::Ids(ids), true) => Some(
            st.tokenizer
                .decode_keeping_special(ids)
                .map_err(|e| ApiError::invalid("prompt", e.to_string()))?,
        ),
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
        logprobs: request.logprobs.is_some(),
        scores_prompt: request.scores_prompt(),
        echo,
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
                "the server is busy: its {} slots are serving requests and {} are waiting (--parallel, --max-queue); retry later",
                st.slots, st.max_queue
            ),
        )
    };
    let before = st.shared.pending.fetch_add(1, Ordering::SeqCst);
    // Read after counting in `pending` (the drain sets `draining`, then reads `pending`):
    // either this request is refused here or the drain waits for it.
    if st.shared.draining.load(Ordering::SeqCst) {
        st.shared.pending.fetch_sub(1, Ordering::SeqCst);
        return Err(refuse_while_draining(endpoint));
    }
    if before >= st.max_queue + st.slots {
        st.shared.pending.fetch_sub(1, Ordering::SeqCst);
        return Ok(tallied(queue_full()));
    }
    st.shared.waiting.fetch_add(1, Ordering::SeqCst);
    if let Err(e) = st.jobs.try_send(job) {
        st.shared.waiting.fetch_sub(1, Ordering::SeqCst);
        st.shared.pending.fetch_sub(1, Ordering::SeqCst);
        return match e {
            TrySendError::Full(_) => Ok(tallied(queue_full())),
            TrySendError::Disconnected(_) => Err(ApiError::status(
                500,
                "server_error",
                "worker_gone",
                "the model worker has stopped",
            )),
        };
    }
    // The first event says whether the request can run (a context error is a 400 even
    // for a stream).
    match rx.recv().await {
        Some(Event::Started) => {}
        Some(Event::Error(e)) => return Ok(tallied(e)),
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
    let mut entries = Vec::new();
    let mut prompt = Vec::new();
    loop {
        match rx.recv().await {
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Logprob(l)) => entries.push(l),
            Some(Event::Prompt(p)) => prompt = p,
            Some(Event::Done(d)) => {
                let lp = if fmt.scores_prompt {
                    let echo = fmt.echo.as_deref().unwrap_or_default();
                    logprobs::completion_scored(&prompt, &entries, echo, fmt.text_start())
                } else {
                    fmt.logprobs(&entries, &mut fmt.text_start())
                };
                return Ok(Json(fmt.complete(text, &d, lp)).into_response());
            }
            Some(Event::Error(e)) => return Ok(tallied(e)),
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
    /// Log-probabilities of tokens whose text has not been sent yet.
    pending: Vec<Logprob>,
    /// Where the next token's text starts in the completion, in characters.
    offset: usize,
}

/// Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`. Dropping the
/// stream (the client went away) drops the receiver, which stops the generation.
fn sse(
    fmt: Format,
    rx: UnboundedReceiver<Event>,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let mut st = SseState {
        rx,
        offset: fmt.text_start(),
        queue: VecDeque::new(),
        first: true,
        done: false,
        pending: Vec::new(),
        fmt,
    };
    // A scored prompt's echo goes out with its log-probabilities (`Event::Prompt`).
    if let (Some(e), false) = (st.fmt.echo.clone(), st.fmt.scores_prompt) {
        st.queue.push_back(st.fmt.delta(&e, true, Value::Null));
    }
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(data) = st.queue.pop_front() {
                return Some((Ok(SseEvent::default().data(data)), st));
            }
            if st.done {
                return None;
            }
            match st.rx.recv().await {
                Some(Event::Logprob(l)) => st.pending.push(l),
                Some(Event::Prompt(p)) => {
                    let echo = st.fmt.echo.clone().unwrap_or_default();
                    let lp = logprobs::prompt_completion(&p, &echo);
                    st.queue.push_back(st.fmt.delta(&echo, st.first, lp));
                    st.first = false;
                }
                Some(Event::Text(t)) => {
                    let lp = st
                        .fmt
                        .logprobs(&std::mem::take(&mut st.pending), &mut st.offset);
                    let d = st.fmt.delta(&t, st.first, lp);
                    st.first = false;
                    st.queue.push_back(d);
                }
                Some(Event::Done(d)) => {
                    // Tokens whose text never came (a stop string held it, EOS) keep
                    // their log-probabilities in a chunk of their own.
                    if (st.first && st.fmt.kind == Kind::Chat) || !st.pending.is_empty() {
                        let lp = st
                            .fmt
                            .logprobs(&std::mem::take(&mut st.pending), &mut st.offset);
                        st.queue.push_back(st.fmt.delta("", st.first, lp));
                        st.first = false;
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

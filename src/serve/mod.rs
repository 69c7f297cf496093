//! `wgmoe serve`: an OpenAI-compatible HTTP server over one loaded session. The GPU is
//! one stream, so one worker thread owns the engine and serves up to `--parallel`
//! requests at once by continuous batching (`scheduler`), the rest waiting in a bounded
//! queue (`worker` holds what both sides share); the HTTP side (`http`, axum on a
//! one-thread tokio runtime) only parses, queues and streams. Request bodies are checked
//! in `api`.
//!
//! Shutdown: the first SIGTERM, Ctrl-C or SIGHUP starts a drain (`drain`): new requests get
//! 503, what was admitted (generating or queued) is served for up to `--drain-timeout`
//! seconds, then the answer being generated ends with finish_reason "abort" and the queued
//! ones get 503. Then the listener closes, idle connections are closed, the last answers
//! are sent, and `serve` returns (exit status 0). A second signal exits at once (130).

pub mod api;
pub mod http;
pub mod logprobs;
pub mod scheduler;
pub mod tokenize;
pub mod worker;

use std::future::IntoFuture;
use std::net::{SocketAddr, TcpListener};
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::error::{Error, Result};
use crate::session::Session;

pub use worker::Defaults;

/// Prompt positions a scoring request (`echo` with `logprobs`) reads back at once: the
/// logits rows the server's engine holds (vocabulary x 4 bytes each: 19 MiB at Qwen3's
/// 151,936), at most a prefill chunk and one storage binding.
pub const SCORE_ROWS: usize = 32;

#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub api_key: Option<String>,
    /// Requests that may wait while one is served; more get 503.
    pub max_queue: usize,
    /// Largest request body in bytes; more gets 413.
    pub max_body: usize,
    /// The model's name in `/v1/models` and in responses.
    pub model_name: String,
    /// Other names of the same model a request may give under `strict_model` (the
    /// directory's or file's name when `--alias` renamed it).
    pub other_names: Vec<String>,
    /// Answer a request naming another model with 404 `model_not_found` (`--strict-model`);
    /// otherwise any name is answered by the loaded model, as llama-server does.
    pub strict_model: bool,
    pub defaults: Defaults,
    /// How long a shutdown waits for admitted requests before it ends them.
    pub drain_timeout: Duration,
    /// Slots (`--parallel`): requests served at once by continuous batching, each with
    /// `context / parallel` positions of the KV cache.
    pub parallel: usize,
    /// When a decode step of several requests runs as one batched forward.
    pub batching: crate::runtime::batch::Batching,
}

/// After the drain, how long the last answers may take to reach their clients before the
/// connections still open are dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(10);
/// After the drain timeout, how long the worker may take to stop before `serve` returns
/// without it.
const ABORT_GRACE: Duration = Duration::from_secs(10);
/// How long `serve` waits for the worker to drop the engine once the requests are over.
const WORKER_GRACE: Duration = Duration::from_secs(10);

/// Waits until `shared.pending` is 0 or `limit` has passed; whether it is 0.
async fn idle_within(shared: &worker::Shared, limit: Duration) -> bool {
    let t0 = Instant::now();
    loop {
        if shared.pending.load(Ordering::SeqCst) == 0 {
            return true;
        }
        if t0.elapsed() >= limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The shutdown: once `signal` is notified, set `draining`, wait up to `timeout` for the
/// admitted requests, then set `abort` and wait for the worker to end them. Returns when no
/// request is left (or the worker did not stop within `ABORT_GRACE`).
async fn drain(shared: Arc<worker::Shared>, timeout: Duration, signal: Arc<Notify>) {
    signal.notified().await;
    shared.draining.store(true, Ordering::SeqCst);
    let t0 = Instant::now();
    let n = shared.pending.load(Ordering::SeqCst);
    eprintln!(
        "shutting down: {} in flight, draining up to {}s",
        crate::units::count(n, "request"),
        timeout.as_secs_f64()
    );
    if idle_within(&shared, timeout).await {
        eprintln!("drained after {:.1}s", t0.elapsed().as_secs_f64());
        return;
    }
    shared.abort.store(true, Ordering::SeqCst);
    let stopped = idle_within(&shared, ABORT_GRACE).await;
    eprintln!(
        "aborted {} requests after {:.1}s",
        shared.aborted.load(Ordering::SeqCst),
        t0.elapsed().as_secs_f64()
    );
    if !stopped {
        eprintln!(
            "the worker did not stop within {}s of the abort; exiting without it",
            ABORT_GRACE.as_secs()
        );
    }
}

/// The listening socket, bound before the model loads: a port in use is reported at once,
/// and clients that connect during loading wait in the backlog. Port 0: the OS picks one.
pub fn bind(host: &str, port: u16) -> Result<TcpListener> {
    let l = TcpListener::bind((host, port)).map_err(|e| {
        Error::option(
            "--host/--port",
            format!("cannot listen on {host}:{port}: {e}"),
        )
    })?;
    l.set_nonblocking(true)
        .map_err(|e| Error::Other(format!("{host}:{port}: {e}")))?;
    Ok(l)
}

/// Serve on `listener` (from `bind`) until a SIGTERM, Ctrl-C or SIGHUP and its drain (see
/// the module's notes) have ended; then `Ok`. `on_listening` gets the address once requests
/// are accepted (the signal handler is installed just before).
pub fn serve(
    session: Session,
    listener: TcpListener,
    opts: ServeOptions,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<()> {
    let mut session = session;
    let Some(tokenizer) = session.engine.tokenizer.take().map(Arc::new) else {
        return Err(Error::bad_file(
            session.engine.dir.join("tokenizer.json"),
            "missing: the server needs the tokenizer to read and write text",
        ));
    };
    let parallel = opts.parallel.max(1);
    let batching = opts.batching;
    let context = session.max_context() / parallel;
    // Admission (`Shared::pending`) keeps at most this many jobs outstanding.
    let (jobs, rx) = std::sync::mpsc::sync_channel(opts.max_queue + parallel);
    let shared = Arc::new(worker::Shared::default());
    let worker_shared = shared.clone();
    let defaults = opts.defaults.clone();
    let worker_tok = tokenizer.clone();
    let worker = std::thread::Builder::new()
        .name("wgmoe-worker".into())
        .spawn(move || {
            scheduler::run(
                session,
                worker_tok,
                rx,
                worker_shared,
                defaults,
                parallel,
                batching,
            )
        })
        .map_err(|e| Error::Other(format!("cannot start the worker thread: {e}")))?;
    let drain_shared = shared.clone();
    let state = Arc::new(http::AppState {
        jobs,
        shared,
        model: opts.model_name.clone(),
        names: std::iter::once(opts.model_name.clone())
            .chain(opts.other_names.iter().cloned())
            .collect(),
        strict_model: opts.strict_model,
        tokenizer,
        api_key: opts.api_key.clone(),
        max_body: opts.max_body,
        max_queue: opts.max_queue,
        slots: parallel,
        context,
        next_id: AtomicU64::new(1),
        started: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| Error::Other(format!("cannot start the async runtime: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::Other(format!("the listening socket: {e}")))?;
    let signal = Arc::new(Notify::new());
    let on_signal = signal.clone();
    let drain_timeout = opts.drain_timeout;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| Error::Other(format!("{addr}: {e}")))?;
        // `notify_one` keeps the permit if the drain does not wait yet.
        crate::interrupt::install_shutdown(move || on_signal.notify_one())?;
        on_listening(addr);
        let (drained_tx, drained_rx) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async move {
            drain(drain_shared, drain_timeout, signal).await;
            let _ = drained_tx.send(());
        };
        // With the drain over, axum stops accepting, closes idle keep-alive connections and
        // waits for the responses still being written.
        let server = axum::serve(listener, http::router(state))
            .with_graceful_shutdown(shutdown)
            .into_future();
        let cut = async move {
            if drained_rx.await.is_ok() {
                tokio::time::sleep(CLOSE_GRACE).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        match futures_util::future::select(pin!(server), pin!(cut)).await {
            futures_util::future::Either::Left((r, _)) => {
                r.map_err(|e| Error::Other(format!("the server stopped: {e}")))
            }
            futures_util::future::Either::Right(_) => {
                eprintln!(
                    "closing the connections still open {}s after the drain",
                    CLOSE_GRACE.as_secs()
                );
                Ok(())
            }
        }
    })?;
    // Dropping the runtime drops every sender of the queue: the worker's loop ends and it
    // drops the engine. A worker stuck on the GPU is left to the process's exit.
    drop(rt);
    let t0 = Instant::now();
    while !worker.is_finished() && t0.elapsed() < WORKER_GRACE {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

//! `wgmoe serve`: an OpenAI-compatible HTTP server over one loaded session. The GPU is
//! one stream, so one worker thread owns the engine and serves the requests in order from
//! a bounded queue (`worker`); the HTTP side (`http`, axum on a one-thread tokio runtime)
//! only parses, queues and streams. Request bodies are checked in `api`.

pub mod api;
pub mod http;
pub mod worker;

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::session::Session;

pub use worker::Defaults;

#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub api_key: Option<String>,
    /// Requests that may wait while one is served; more get 503.
    pub max_queue: usize,
    /// Largest request body in bytes; more gets 413.
    pub max_body: usize,
    /// The model's name in `/v1/models` and in responses.
    pub model_name: String,
    pub defaults: Defaults,
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

/// Serve on `listener` (from `bind`) until the process ends. `on_listening` gets the
/// address once requests are accepted.
pub fn serve(
    session: Session,
    listener: TcpListener,
    opts: ServeOptions,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<()> {
    if session.engine.tokenizer.is_none() {
        return Err(Error::bad_file(
            session.engine.dir.join("tokenizer.json"),
            "missing: the server needs the tokenizer to read and write text",
        ));
    }
    let context = session.max_context();
    // Admission (`Shared::pending`) keeps at most this many jobs outstanding.
    let (jobs, rx) = std::sync::mpsc::sync_channel(opts.max_queue + 1);
    let shared = Arc::new(worker::Shared::default());
    let worker_shared = shared.clone();
    let defaults = opts.defaults.clone();
    std::thread::Builder::new()
        .name("wgmoe-worker".into())
        .spawn(move || worker::run(session, rx, worker_shared, defaults))
        .map_err(|e| Error::Other(format!("cannot start the worker thread: {e}")))?;
    let state = Arc::new(http::AppState {
        jobs,
        shared,
        model: opts.model_name.clone(),
        api_key: opts.api_key.clone(),
        max_body: opts.max_body,
        max_queue: opts.max_queue,
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
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| Error::Other(format!("{addr}: {e}")))?;
        on_listening(addr);
        axum::serve(listener, http::router(state))
            .await
            .map_err(|e| Error::Other(format!("the server stopped: {e}")))
    })
}

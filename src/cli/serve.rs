//! `wgmoe serve`: load the model once and serve the OpenAI API over HTTP (`wgmoe::serve`).

use wgmoe::error::{Error, Result};
use wgmoe::serve::{bind, serve as run_server, Defaults, ServeOptions};
use wgmoe::session::Session;

use super::run::sampling_options;
use crate::ServeArgs;

/// Most requests `--max-queue` lets wait (the queue's slots are allocated up front).
pub const MAX_QUEUE: usize = 4096;

/// Slots when `--parallel` is not given (wgpu backends).
pub const DEFAULT_PARALLEL: usize = 4;

/// `--parallel` against what the engine can hold, before anything loads.
fn check_parallel(parallel: usize, ctx: usize, chunk: usize) -> Result<()> {
    let max = wgmoe::backend::params::MAX_BATCH;
    if parallel == 0 || parallel > max {
        return Err(Error::option(
            "--parallel",
            format!("{parallel}: from 1 to {max} slots"),
        ));
    }
    if ctx / parallel < 2 {
        return Err(Error::option(
            "--parallel",
            format!("{parallel} slots over a context of {ctx} positions leave fewer than 2 each (raise --ctx-size or lower --parallel)"),
        ));
    }
    if parallel > chunk {
        return Err(Error::option(
            "--parallel",
            format!("{parallel} slots exceed --prefill-chunk {chunk}: a batched step's tokens must fit one chunk's workspace (raise --prefill-chunk)"),
        ));
    }
    Ok(())
}

pub fn serve(a: ServeArgs) -> Result<()> {
    let (cfg, gen, tok) = super::open_host(&a.model, a.load.tokenizer.as_deref())?;
    let Some(mut tok) = tok else {
        return Err(Error::bad_file(
            a.model.join("tokenizer.json"),
            "missing: the server needs the tokenizer",
        ));
    };
    let note =
        wgmoe::session::template::choose(&mut tok, a.load.chat_template.as_deref(), &a.model)?;
    if let Some(k) = &a.api_key {
        if k.trim().is_empty() || k.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Error::option(
                "--api-key",
                "must be non-empty, without spaces or control characters",
            ));
        }
    }
    if a.max_queue > MAX_QUEUE {
        return Err(Error::option(
            "--max-queue",
            format!("{}: at most {MAX_QUEUE}", a.max_queue),
        ));
    }
    let max_body = usize::try_from(a.max_body)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| Error::option("--max-body", "must be at least 1 byte"))?;
    // The seed here only resolves the default sampling; requests without `seed` get
    // a random one unless --seed is given.
    let sampling = sampling_options(&a.sampling, gen.as_ref(), a.sampling.seed.unwrap_or(0))?;
    let ctx = super::ctx_size(&a.load, &cfg, &a.model)?;
    // The directory's name (a GGUF file's, `.gguf` included): the model's own name, and
    // the one responses carry unless --alias renames it.
    let own_name = std::fs::canonicalize(&a.model)
        .ok()
        .as_deref()
        .unwrap_or(&a.model)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let model_name = a.alias.clone().unwrap_or_else(|| own_name.clone());
    let other_names = if own_name != model_name {
        vec![own_name]
    } else {
        Vec::new()
    };
    let cuda = a.load.gpu.request()?.backend == Some(wgmoe::backend::BackendChoice::Cuda);
    let parallel = a
        .parallel
        .unwrap_or(if cuda { 1 } else { DEFAULT_PARALLEL });
    check_parallel(parallel, ctx, a.load.prefill_chunk)?;
    let listener = bind(&a.host, a.port)?;
    let mut engine =
        super::load_engine(&a.model, &a.load, ctx, parallel, wgmoe::serve::SCORE_ROWS)?;
    // The tokenizer with the chat template chosen above.
    engine.tokenizer = Some(tok);
    if let Some(n) = note {
        eprintln!("{n}");
    }
    let opts = ServeOptions {
        api_key: a.api_key.clone(),
        max_queue: a.max_queue,
        max_body,
        model_name,
        other_names,
        strict_model: a.strict_model,
        defaults: Defaults {
            sampling,
            seed: a.sampling.seed,
            context_shift: a.load.context_shift,
        },
        drain_timeout: std::time::Duration::from_secs(a.drain_timeout),
        parallel,
        batching: a.batching,
    };
    let auth = a.api_key.is_some();
    run_server(Session::new(engine), listener, opts, |addr| {
        if !addr.ip().is_loopback() {
            eprintln!(
                "note: {} is reachable from other machines{}",
                addr.ip(),
                if auth {
                    ""
                } else {
                    "; anyone who can reach it can use the model (see --api-key)"
                }
            );
        }
        eprintln!(
            "listening on http://{addr} ({parallel} slot{} of {} positions, up to {} waiting)",
            if parallel == 1 { "" } else { "s" },
            ctx / parallel,
            a.max_queue
        );
    })
}

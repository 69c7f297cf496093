//! `wgmoe loadtest URL`: concurrent clients against a running server, every answer
//! checked (`wgmoe::loadtest`); a table or `--json`, and a failing exit status when a good
//! request failed or an answer was wrong.

use std::io::Write;
use std::time::Duration;

use clap::{Args, ValueEnum};

use wgmoe::error::{Error, Result};
use wgmoe::loadtest::{self, Endpoint, Options};

use crate::stdout_error;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum EndpointArg {
    /// /v1/completions with token-id prompts (exactly --prompt-tokens tokens).
    Completions,
    /// /v1/chat/completions with --prompt-tokens words in one user message.
    Chat,
}

#[derive(Args)]
pub struct LoadtestArgs {
    /// The server, e.g. http://127.0.0.1:8080 (a trailing /v1 is fine; plain HTTP only).
    pub url: String,
    /// Client threads, each sending its requests one after another.
    #[arg(short = 'c', long, default_value_t = 4)]
    pub clients: usize,
    /// Requests per client (clients x requests in all).
    #[arg(short = 'r', long, default_value_t = 4)]
    pub requests: usize,
    /// Prompt tokens per request: token ids in [10, 200), different for every request
    /// (from --seed).
    #[arg(long, default_value_t = 32)]
    pub prompt_tokens: usize,
    /// New tokens per request (`max_tokens`, with `ignore_eos` and temperature 0, so each
    /// good answer has exactly this many).
    #[arg(long, default_value_t = 16)]
    pub max_tokens: usize,
    /// Stream the answers (server-sent events, with usage) and measure time to first token.
    #[arg(long)]
    pub stream: bool,
    /// The endpoint: completions (exact prompt tokens) or chat.
    #[arg(long, value_enum, default_value = "completions")]
    pub endpoint: EndpointArg,
    /// Share of the requests sent malformed (each must get a 4xx JSON error), in [0, 1].
    #[arg(long, value_name = "F", default_value_t = 0.0)]
    pub bad_fraction: f64,
    /// Share of the requests whose stream the client drops after the first chunk(s), in
    /// [0, 1] (needs --stream).
    #[arg(long, value_name = "F", default_value_t = 0.0)]
    pub disconnect_fraction: f64,
    /// Content chunks a dropping client reads before it goes away.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub disconnect_after: usize,
    /// Seed of the prompts and of which requests are malformed or dropped.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Send `Authorization: Bearer KEY` (the server's --api-key).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Seconds a request may take, from sending to the end of its answer.
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0)]
    pub timeout: f64,
    /// Print the report as one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn loadtest(a: LoadtestArgs) -> Result<()> {
    let timeout = Duration::try_from_secs_f64(a.timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            Error::option(
                "--timeout",
                format!("{}: must be a number of seconds above 0", a.timeout),
            )
        })?;
    let o = Options {
        url: a.url,
        clients: a.clients,
        requests: a.requests,
        prompt_tokens: a.prompt_tokens,
        max_tokens: a.max_tokens,
        stream: a.stream,
        endpoint: match a.endpoint {
            EndpointArg::Completions => Endpoint::Completions,
            EndpointArg::Chat => Endpoint::Chat,
        },
        bad_fraction: a.bad_fraction,
        disconnect_fraction: a.disconnect_fraction,
        disconnect_after: a.disconnect_after,
        seed: a.seed,
        api_key: a.api_key,
        timeout,
    };
    let r = loadtest::run(&o)?;
    if a.json {
        let s = serde_json::to_string_pretty(&r).map_err(|e| Error::Other(e.to_string()))?;
        out!("{s}");
    } else {
        out!("{}", loadtest::report::text(&r).trim_end());
    }
    if r.passed {
        Ok(())
    } else {
        Err(Error::Other(format!(
            "loadtest failed: {}",
            r.failures.join("; ")
        )))
    }
}

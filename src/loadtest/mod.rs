//! `wgmoe loadtest`: a load generator and checker for a running OpenAI-compatible server
//! (`wgmoe serve` or another). C client threads send R requests each, one after another,
//! of exactly P prompt tokens (token-id prompts of `/v1/completions`) and T new tokens
//! (`ignore_eos`, greedy); a share of the requests is malformed (each must get a 4xx JSON
//! error) and a share of the streamed ones is dropped by the client after the first
//! content chunk. Every answer is checked: one per request, `usage` equal to P and T,
//! chunks of one stream under one id, no id shared by two requests. `report` turns the
//! records into numbers (tok/s, TTFT and latency percentiles) and the verdict.
//!
//! Which requests are malformed or dropped, and every prompt, follow from `--seed`, so a
//! run can be repeated exactly; prompts differ per request so a prefix cache does not make
//! the load trivial.

pub mod client;
pub mod report;

pub use crate::runtime::sampling::Rng;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

pub use report::Report;

/// Token ids of the prompts: `[TOKEN_LO, TOKEN_HI)`, inside every vocabulary wgmoe's
/// fixtures and real checkpoints have, and past the usual special tokens of small ids.
pub const TOKEN_LO: u32 = 10;
pub const TOKEN_HI: u32 = 200;

/// Most client threads.
pub const MAX_CLIENTS: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions` with token ids: the prompt is exactly P tokens.
    Completions,
    /// `/v1/chat/completions` with P words in one user message: the prompt's token count
    /// is the chat template's, so `usage.prompt_tokens` is not checked against P.
    Chat,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    /// The server as given (`http://127.0.0.1:8080`, with or without `/v1`).
    pub url: String,
    pub clients: usize,
    pub requests: usize,
    pub prompt_tokens: usize,
    pub max_tokens: usize,
    pub stream: bool,
    pub endpoint: Endpoint,
    /// Share of all requests sent malformed.
    pub bad_fraction: f64,
    /// Share of all requests (streamed) dropped by the client mid-stream.
    pub disconnect_fraction: f64,
    /// Content chunks a dropping client reads first.
    pub disconnect_after: usize,
    pub seed: u64,
    pub api_key: Option<String>,
    /// Per request, from sending to the last byte of the answer.
    pub timeout: Duration,
}

/// What a request of the plan is meant to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A well-formed request whose answer must be complete and exact.
    Good,
    /// A malformed request of the given kind (`client::BAD_KINDS`): it must get a 4xx.
    Bad(usize),
    /// A streamed request the client drops after `disconnect_after` content chunks.
    Disconnect,
}

/// The role of each request, indexed `client * requests + seq`: exactly
/// round(bad_fraction x N) malformed and round(disconnect_fraction x N) dropped ones
/// (fewer if both do not fit), spread by a shuffle from the seed.
pub fn plan(o: &Options) -> Vec<Role> {
    let n = o.clients * o.requests;
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = Rng::new(o.seed ^ 0x5EED_F1A4_E000);
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    let count = |f: f64| ((f * n as f64).round() as usize).min(n);
    let bad = count(o.bad_fraction);
    let disconnect = if o.stream {
        count(o.disconnect_fraction).min(n - bad)
    } else {
        0
    };
    let mut roles = vec![Role::Good; n];
    for (k, &i) in order.iter().enumerate() {
        roles[i] = if k < bad {
            Role::Bad(k)
        } else if k < bad + disconnect {
            Role::Disconnect
        } else {
            Role::Good
        };
    }
    roles
}

/// The prompt token ids of request `index`: P ids in `[TOKEN_LO, TOKEN_HI)`.
pub fn prompt_ids(seed: u64, index: usize, p: usize) -> Vec<u32> {
    let mut rng = Rng::new(seed ^ (index as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407));
    (0..p)
        .map(|_| TOKEN_LO + rng.below(u64::from(TOKEN_HI - TOKEN_LO)) as u32)
        .collect()
}

/// The server's base URL (`http://host:port` plus any path prefix, without `/v1` and the
/// trailing slash) from what the user wrote; `host:port` alone means plain HTTP.
pub fn base_url(url: &str) -> Result<String> {
    let bad = |msg: String| Error::option("URL", msg);
    let u = url.trim();
    if u.is_empty() {
        return Err(bad(
            "is empty: give the server's address, e.g. http://127.0.0.1:8080".into(),
        ));
    }
    let full = if u.contains("://") {
        u.to_string()
    } else {
        format!("http://{u}")
    };
    let uri: ureq::http::Uri = full.parse().map_err(|e| {
        bad(format!(
            "`{u}` is not a URL ({e}); e.g. http://127.0.0.1:8080"
        ))
    })?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(bad(format!(
                "`{u}`: https is not supported (plain HTTP only; wgmoe serve speaks HTTP)"
            )))
        }
        Some(s) => return Err(bad(format!("`{u}`: scheme `{s}` is not http"))),
        None => {
            return Err(bad(format!(
                "`{u}` has no scheme; e.g. http://127.0.0.1:8080"
            )))
        }
    }
    let Some(auth) = uri.authority().filter(|a| !a.host().is_empty()) else {
        return Err(bad(format!(
            "`{u}` has no host; e.g. http://127.0.0.1:8080"
        )));
    };
    if auth.as_str().contains('@') {
        return Err(bad(format!(
            "`{u}`: credentials in the URL are not supported (use --api-key)"
        )));
    }
    if uri.query().is_some() {
        return Err(bad(format!("`{u}`: a query string is not supported")));
    }
    let mut path = uri.path().trim_end_matches('/').to_string();
    if let Some(p) = path.strip_suffix("/v1") {
        path = p.to_string();
    }
    Ok(format!("http://{}{path}", auth.as_str()))
}

/// The options checked, each error naming its flag.
pub fn check(o: &Options) -> Result<()> {
    fn opt(flag: &str, msg: impl Into<String>) -> Error {
        Error::option(flag, msg)
    }
    if o.clients == 0 {
        return Err(opt("--clients", "must be at least 1"));
    }
    if o.clients > MAX_CLIENTS {
        return Err(opt(
            "--clients",
            format!("{}: at most {MAX_CLIENTS} (one thread each)", o.clients),
        ));
    }
    if o.requests == 0 {
        return Err(opt("--requests", "must be at least 1"));
    }
    if o.clients
        .checked_mul(o.requests)
        .is_none_or(|n| n > 10_000_000)
    {
        return Err(opt(
            "--requests",
            "--clients x --requests is more than 10000000 requests",
        ));
    }
    if o.prompt_tokens == 0 {
        return Err(opt("--prompt-tokens", "must be at least 1"));
    }
    if o.prompt_tokens > 1 << 20 {
        return Err(opt("--prompt-tokens", "at most 1048576"));
    }
    if o.max_tokens == 0 {
        return Err(opt("--max-tokens", "must be at least 1"));
    }
    for (flag, f) in [
        ("--bad-fraction", o.bad_fraction),
        ("--disconnect-fraction", o.disconnect_fraction),
    ] {
        if !(0.0..=1.0).contains(&f) {
            return Err(opt(flag, format!("{f} is not in [0, 1]")));
        }
    }
    if o.disconnect_fraction > 0.0 && !o.stream {
        return Err(opt(
            "--disconnect-fraction",
            "needs --stream (a client drops a stream after its first chunks)",
        ));
    }
    if o.bad_fraction + o.disconnect_fraction > 1.0 {
        return Err(opt(
            "--disconnect-fraction",
            format!(
                "--bad-fraction {} + --disconnect-fraction {} exceed 1",
                o.bad_fraction, o.disconnect_fraction
            ),
        ));
    }
    if o.disconnect_after == 0 {
        return Err(opt("--disconnect-after", "must be at least 1"));
    }
    if o.timeout.is_zero() {
        return Err(opt("--timeout", "must be more than 0 seconds"));
    }
    if let Some(k) = &o.api_key {
        if k.trim().is_empty() || k.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(opt(
                "--api-key",
                "must be non-empty, without spaces or control characters",
            ));
        }
    }
    Ok(())
}

/// One request as it went.
#[derive(Clone, Debug)]
pub struct Record {
    pub client: usize,
    pub seq: usize,
    pub role: Role,
    pub outcome: client::Outcome,
    /// From sending to the end of the answer (or of the failure).
    pub latency_s: f64,
    /// From sending to the first content chunk of a stream.
    pub ttft_s: Option<f64>,
}

/// What one client thread did.
#[derive(Clone, Debug)]
pub struct ClientRun {
    pub client: usize,
    pub records: Vec<Record>,
    /// From its first send to its last answer.
    pub busy_s: f64,
}

/// Where the client threads wait until all are started: `Some(true)` go, `Some(false)`
/// give up.
#[derive(Default)]
struct Gate {
    state: Mutex<Option<bool>>,
    cv: Condvar,
}

impl Gate {
    fn open(&self, go: bool) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = Some(go);
        self.cv.notify_all();
    }

    fn wait(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(go) = *s {
                return go;
            }
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Check the options, reach the server, run the load and check every answer.
pub fn run(o: &Options) -> Result<Report> {
    check(o)?;
    let base = base_url(&o.url)?;
    let model = client::preflight(&base, o)?;
    let roles = plan(o);
    let gate = Gate::default();
    let done = std::thread::scope(|s| -> Result<(Vec<ClientRun>, f64)> {
        let mut handles = Vec::with_capacity(o.clients);
        for c in 0..o.clients {
            let (roles, gate, base, model) = (&roles, &gate, &base, &model);
            let h = std::thread::Builder::new()
                .name(format!("loadtest-{c}"))
                .spawn_scoped(s, move || {
                    let agent = client::agent(o);
                    let body = client::Bodies::new(o, model.as_deref());
                    if !gate.wait() {
                        return None;
                    }
                    let t0 = Instant::now();
                    let records = (0..o.requests)
                        .map(|seq| {
                            let i = c * o.requests + seq;
                            client::send(&agent, base, o, &body, c, seq, roles[i])
                        })
                        .collect();
                    Some(ClientRun {
                        client: c,
                        records,
                        busy_s: t0.elapsed().as_secs_f64(),
                    })
                });
            match h {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // The started threads wait at the gate: send them home, then fail.
                    gate.open(false);
                    return Err(Error::option(
                        "--clients",
                        format!("cannot start client thread {c}: {e}"),
                    ));
                }
            }
        }
        gate.open(true);
        let t0 = Instant::now();
        let mut runs = Vec::with_capacity(o.clients);
        for h in handles {
            match h.join() {
                Ok(Some(r)) => runs.push(r),
                _ => return Err(Error::Other("a client thread stopped early".into())),
            }
        }
        Ok((runs, t0.elapsed().as_secs_f64()))
    });
    let (runs, wall_s) = done?;
    Ok(report::build(o, &base, model, runs, wall_s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> Options {
        Options {
            url: "http://127.0.0.1:1".into(),
            clients: 4,
            requests: 5,
            prompt_tokens: 8,
            max_tokens: 4,
            stream: true,
            endpoint: Endpoint::Completions,
            bad_fraction: 0.25,
            disconnect_fraction: 0.1,
            disconnect_after: 1,
            seed: 7,
            api_key: None,
            timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn the_plan_has_exact_counts_and_follows_the_seed() {
        let o = opts();
        let p = plan(&o);
        assert_eq!(p.len(), 20);
        assert_eq!(p.iter().filter(|r| matches!(r, Role::Bad(_))).count(), 5);
        assert_eq!(p.iter().filter(|r| **r == Role::Disconnect).count(), 2);
        assert_eq!(p, plan(&o));
        let other = plan(&Options {
            seed: 8,
            ..o.clone()
        });
        assert_ne!(p, other);
        let plain = plan(&Options {
            stream: false,
            disconnect_fraction: 0.0,
            ..o
        });
        assert!(!plain.contains(&Role::Disconnect));
    }

    #[test]
    fn prompts_have_p_ids_in_range_and_differ() {
        let a = prompt_ids(1, 0, 64);
        assert_eq!(a.len(), 64);
        assert!(a.iter().all(|&t| (TOKEN_LO..TOKEN_HI).contains(&t)));
        assert_ne!(a, prompt_ids(1, 1, 64));
        assert_ne!(a, prompt_ids(2, 0, 64));
        assert_eq!(a, prompt_ids(1, 0, 64));
    }

    #[test]
    fn urls_are_read_or_refused_by_name() {
        assert_eq!(
            base_url("http://127.0.0.1:8080/v1/").unwrap(),
            "http://127.0.0.1:8080"
        );
        assert_eq!(base_url("localhost:9").unwrap(), "http://localhost:9");
        assert_eq!(base_url("http://h/api").unwrap(), "http://h/api");
        for bad in [
            "",
            "https://x",
            "ftp://x",
            "http://",
            "http://a b",
            "http://u:p@h",
            "x?y",
        ] {
            let e = base_url(bad).unwrap_err().to_string();
            assert!(e.contains("URL"), "{bad}: {e}");
        }
    }

    #[test]
    fn options_are_checked_by_flag() {
        let o = opts();
        assert!(check(&o).is_ok());
        let cases: Vec<(Options, &str)> = vec![
            (
                Options {
                    clients: 0,
                    ..o.clone()
                },
                "--clients",
            ),
            (
                Options {
                    requests: 0,
                    ..o.clone()
                },
                "--requests",
            ),
            (
                Options {
                    prompt_tokens: 0,
                    ..o.clone()
                },
                "--prompt-tokens",
            ),
            (
                Options {
                    max_tokens: 0,
                    ..o.clone()
                },
                "--max-tokens",
            ),
            (
                Options {
                    bad_fraction: 1.5,
                    ..o.clone()
                },
                "--bad-fraction",
            ),
            (
                Options {
                    bad_fraction: f64::NAN,
                    ..o.clone()
                },
                "--bad-fraction",
            ),
            (
                Options {
                    stream: false,
                    ..o.clone()
                },
                "--disconnect-fraction",
            ),
            (
                Options {
                    bad_fraction: 0.95,
                    ..o.clone()
                },
                "--disconnect-fraction",
            ),
            (
                Options {
                    timeout: Duration::ZERO,
                    ..o.clone()
                },
                "--timeout",
            ),
            (
                Options {
                    api_key: Some("a b".into()),
                    ..o.clone()
                },
                "--api-key",
            ),
        ];
        for (c, flag) in cases {
            let e = check(&c).unwrap_err().to_string();
            assert!(e.contains(flag), "{flag}: {e}");
        }
    }
}

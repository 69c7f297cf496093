//! The records of a `loadtest` run turned into its numbers and verdict: every good
//! request must get exactly one complete answer with `usage` equal to the run's P and T,
//! no two requests may get the same answer, every malformed request must get a 4xx JSON
//! error. `Report` is what `--json` prints; `text` is the default table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::client::{bad_kind, Outcome};
use super::{ClientRun, Endpoint, Options, Record, Role};

/// Problems listed by request, at most.
const EXAMPLES: usize = 10;

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Spread {
    pub min: f64,
    pub mean: f64,
    pub max: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ClientSummary {
    pub client: usize,
    pub requests: usize,
    /// Its well-formed requests read to their end.
    pub good: usize,
    /// Good requests answered completely.
    pub ok: usize,
    pub errors: usize,
    pub completion_tokens: u64,
    /// From its first send to its last answer.
    pub busy_s: f64,
    pub tokens_per_s: f64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct BadKind {
    pub sent: usize,
    /// Answered 4xx with a JSON error.
    pub rejected: usize,
    /// The statuses they got (0: no answer).
    pub statuses: BTreeMap<u16, usize>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Report {
    pub url: String,
    pub endpoint: &'static str,
    pub model: Option<String>,
    pub stream: bool,
    pub clients: usize,
    pub requests_per_client: usize,
    /// Every request sent: clients x requests_per_client.
    pub requests: usize,
    pub prompt_tokens: usize,
    pub max_tokens: usize,
    pub seed: u64,
    /// Well-formed requests read to their end.
    pub good: usize,
    /// Good requests with exactly one complete answer.
    pub ok: usize,
    /// Good and dropping requests that failed: an HTTP status, no connection, a timeout,
    /// an answer that broke off, broke the protocol or carried an error event.
    pub errors: usize,
    pub errors_by_kind: BTreeMap<String, usize>,
    pub bad_sent: usize,
    pub bad_rejected: usize,
    pub bad_by_kind: BTreeMap<String, BadKind>,
    pub disconnects_planned: usize,
    /// Streams the client dropped after their first chunk(s).
    pub disconnects: usize,
    /// Planned drops whose answer ended before the drop.
    pub disconnects_completed: usize,
    /// Good answers whose usage is not P prompt and T completion tokens (or whose stream
    /// had more content chunks than tokens, or two usages that disagree).
    pub usage_mismatches: usize,
    /// Whether usage.prompt_tokens is compared with P (not for chat: the template adds).
    pub prompt_tokens_checked: bool,
    /// Good answers that ended without a finish.
    pub lost_answers: usize,
    /// Answers with more than one finish, and answers whose id another request's carries.
    pub duplicate_answers: usize,
    /// Sum of the good answers' usage.completion_tokens.
    pub completion_tokens: u64,
    pub wall_s: f64,
    /// completion_tokens / wall_s.
    pub aggregate_tokens_per_s: f64,
    /// Over the clients with good requests.
    pub per_client_tokens_per_s: Spread,
    /// Over good streamed answers: time from sending to the first content chunk.
    pub ttft_p50_s: Option<f64>,
    pub ttft_p95_s: Option<f64>,
    /// Over good answers: time from sending to the end of the answer.
    pub latency_p50_s: Option<f64>,
    pub latency_p95_s: Option<f64>,
    pub per_client: Vec<ClientSummary>,
    pub passed: bool,
    /// Why it did not pass, one reason a line.
    pub failures: Vec<String>,
    /// The first problems, by request.
    pub examples: Vec<String>,
}

/// Nearest-rank percentile of `v` (sorted in place); None when empty.
pub fn percentile(v: &mut [f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = (p * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

fn error_kind(o: &Outcome) -> String {
    match o {
        Outcome::Answer(_) => "stream_error".into(),
        Outcome::Status { status, .. } => format!("http_{status}"),
        Outcome::Connection(_) => "connection".into(),
        Outcome::Timeout(_) => "timeout".into(),
        Outcome::Broken(_) => "broken".into(),
        Outcome::Protocol(_) => "protocol".into(),
    }
}

fn describe(o: &Outcome) -> String {
    match o {
        Outcome::Answer(a) => match &a.error_event {
            Some(m) => format!("an error event in the answer: {m}"),
            None => format!(
                "answered: {} finish(es), {} chunk(s), usage {:?}/{:?}",
                a.finishes, a.chunks, a.prompt_tokens, a.completion_tokens
            ),
        },
        Outcome::Status {
            status, message, ..
        } => format!("HTTP {status}: {message}"),
        Outcome::Connection(m) => format!("no connection: {m}"),
        Outcome::Timeout(m) | Outcome::Broken(m) | Outcome::Protocol(m) => m.clone(),
    }
}

fn ratio(n: f64, d: f64) -> f64 {
    if d > 0.0 {
        n / d
    } else {
        0.0
    }
}

/// What each good answer must say.
fn usage_problem(r: &Record, o: &Options) -> Option<String> {
    let Outcome::Answer(a) = &r.outcome else {
        return None;
    };
    let t = o.max_tokens as u64;
    let p = o.prompt_tokens as u64;
    let mut why = Vec::new();
    if a.completion_tokens != Some(t) {
        why.push(format!(
            "usage.completion_tokens {:?}, not {t}",
            a.completion_tokens
        ));
    }
    if o.endpoint == Endpoint::Completions && a.prompt_tokens != Some(p) {
        why.push(format!(
            "usage.prompt_tokens {:?}, not {p}",
            a.prompt_tokens
        ));
    }
    if a.usage_conflict {
        why.push("the stream's two usage objects disagree".into());
    }
    if o.stream && a.chunks as u64 > a.completion_tokens.unwrap_or(0) {
        why.push(format!(
            "{} content chunks for {:?} tokens",
            a.chunks, a.completion_tokens
        ));
    }
    (!why.is_empty()).then(|| why.join(", "))
}

/// The verdict over every client's records; `wall_s` from the first send to the last
/// answer of all clients.
pub fn build(
    o: &Options,
    base: &str,
    model: Option<String>,
    runs: Vec<ClientRun>,
    wall_s: f64,
) -> Report {
    let mut r = Report {
        url: base.to_string(),
        endpoint: o.endpoint.path(),
        model,
        stream: o.stream,
        clients: o.clients,
        requests_per_client: o.requests,
        requests: 0,
        prompt_tokens: o.prompt_tokens,
        max_tokens: o.max_tokens,
        seed: o.seed,
        good: 0,
        ok: 0,
        errors: 0,
        errors_by_kind: BTreeMap::new(),
        bad_sent: 0,
        bad_rejected: 0,
        bad_by_kind: BTreeMap::new(),
        disconnects_planned: 0,
        disconnects: 0,
        disconnects_completed: 0,
        usage_mismatches: 0,
        prompt_tokens_checked: o.endpoint == Endpoint::Completions,
        lost_answers: 0,
        duplicate_answers: 0,
        completion_tokens: 0,
        wall_s,
        aggregate_tokens_per_s: 0.0,
        per_client_tokens_per_s: Spread::default(),
        ttft_p50_s: None,
        ttft_p95_s: None,
        latency_p50_s: None,
        latency_p95_s: None,
        per_client: Vec::new(),
        passed: false,
        failures: Vec::new(),
        examples: Vec::new(),
    };
    let (mut ttft, mut latency) = (Vec::new(), Vec::new());
    let mut ids: BTreeMap<String, usize> = BTreeMap::new();
    let mut examples = Vec::new();
    let mut note = |rec: &Record, what: String| {
        if examples.len() < EXAMPLES {
            examples.push(format!("client {} request {}: {what}", rec.client, rec.seq));
        }
    };
    for run in &runs {
        let mut cs = ClientSummary {
            client: run.client,
            requests: run.records.len(),
            good: 0,
            ok: 0,
            errors: 0,
            completion_tokens: 0,
            busy_s: run.busy_s,
            tokens_per_s: 0.0,
        };
        for rec in &run.records {
            r.requests += 1;
            if let Outcome::Answer(a) = &rec.outcome {
                if let Some(id) = &a.id {
                    *ids.entry(id.clone()).or_default() += 1;
                }
            }
            let mut error = |r: &mut Report, cs: &mut ClientSummary| {
                r.errors += 1;
                cs.errors += 1;
                *r.errors_by_kind
                    .entry(error_kind(&rec.outcome))
                    .or_default() += 1;
                note(rec, describe(&rec.outcome));
            };
            match rec.role {
                Role::Bad(k) => {
                    r.bad_sent += 1;
                    let kind = r
                        .bad_by_kind
                        .entry(bad_kind(o.endpoint, k).to_string())
                        .or_default();
                    kind.sent += 1;
                    let status = match &rec.outcome {
                        Outcome::Status { status, .. } => *status,
                        Outcome::Answer(_) => 200,
                        _ => 0,
                    };
                    *kind.statuses.entry(status).or_default() += 1;
                    if matches!(&rec.outcome, Outcome::Status { status, error_json: true, .. } if (400..500).contains(status))
                    {
                        kind.rejected += 1;
                        r.bad_rejected += 1;
                    } else {
                        note(
                            rec,
                            format!(
                                "malformed ({}) but {}",
                                bad_kind(o.endpoint, k),
                                describe(&rec.outcome)
                            ),
                        );
                    }
                }
                Role::Disconnect => {
                    r.disconnects_planned += 1;
                    match &rec.outcome {
                        Outcome::Answer(a) if a.error_event.is_none() && a.disconnected => {
                            r.disconnects += 1
                        }
                        Outcome::Answer(a) if a.error_event.is_none() && a.finishes == 1 => {
                            r.disconnects_completed += 1
                        }
                        Outcome::Answer(a) if a.error_event.is_none() => {
                            r.lost_answers += 1;
                            note(rec, format!("dropping stream: {}", describe(&rec.outcome)));
                        }
                        _ => error(&mut r, &mut cs),
                    }
                }
                Role::Good => {
                    r.good += 1;
                    cs.good += 1;
                    let a = match &rec.outcome {
                        Outcome::Answer(a) if a.error_event.is_none() => a,
                        _ => {
                            error(&mut r, &mut cs);
                            continue;
                        }
                    };
                    if a.finishes == 0 {
                        r.lost_answers += 1;
                        note(rec, "the answer ended without a finish_reason".into());
                        continue;
                    }
                    if a.finishes > 1 {
                        r.duplicate_answers += 1;
                        note(rec, format!("{} finishes in one answer", a.finishes));
                        continue;
                    }
                    if o.stream && !a.done_marker {
                        r.errors += 1;
                        cs.errors += 1;
                        *r.errors_by_kind.entry("protocol".into()).or_default() += 1;
                        note(rec, "the stream did not end with [DONE]".into());
                        continue;
                    }
                    r.ok += 1;
                    cs.ok += 1;
                    let tokens = a.completion_tokens.unwrap_or(0);
                    cs.completion_tokens += tokens;
                    latency.push(rec.latency_s);
                    if let Some(t) = rec.ttft_s {
                        ttft.push(t);
                    }
                    if let Some(why) = usage_problem(rec, o) {
                        r.usage_mismatches += 1;
                        note(rec, why);
                    }
                }
            }
        }
        cs.tokens_per_s = ratio(cs.completion_tokens as f64, cs.busy_s);
        r.completion_tokens += cs.completion_tokens;
        r.per_client.push(cs);
    }
    for (id, n) in &ids {
        if *n > 1 {
            r.duplicate_answers += n - 1;
            if examples.len() < EXAMPLES {
                examples.push(format!("{n} requests got the answer with id {id}"));
            }
        }
    }
    r.examples = examples;
    r.aggregate_tokens_per_s = ratio(r.completion_tokens as f64, wall_s);
    // Over the clients that had good requests (a client of only malformed or dropped
    // ones generates nothing by design).
    let tps: Vec<f64> = r
        .per_client
        .iter()
        .filter(|c| c.good > 0)
        .map(|c| c.tokens_per_s)
        .collect();
    if !tps.is_empty() {
        r.per_client_tokens_per_s = Spread {
            min: tps.iter().copied().fold(f64::INFINITY, f64::min),
            mean: tps.iter().sum::<f64>() / tps.len() as f64,
            max: tps.iter().copied().fold(0.0, f64::max),
        };
    }
    r.ttft_p50_s = percentile(&mut ttft, 0.50);
    r.ttft_p95_s = percentile(&mut ttft, 0.95);
    r.latency_p50_s = percentile(&mut latency, 0.50);
    r.latency_p95_s = percentile(&mut latency, 0.95);
    r.failures = failures(&r);
    r.passed = r.failures.is_empty();
    r
}

fn failures(r: &Report) -> Vec<String> {
    let mut f = Vec::new();
    if r.ok < r.good {
        f.push(format!(
            "{} of {} good requests did not get one complete answer",
            r.good - r.ok,
            r.good
        ));
    }
    if r.errors > 0 {
        let kinds: Vec<String> = r
            .errors_by_kind
            .iter()
            .map(|(k, n)| format!("{k} x{n}"))
            .collect();
        let mut s = format!("{} requests failed ({})", r.errors, kinds.join(", "));
        if r.errors_by_kind.contains_key("http_503") {
            s.push_str(
                "; 503: the server's queue was full (raise its --max-queue or lower --clients)",
            );
        }
        if r.errors_by_kind.contains_key("http_401") {
            s.push_str("; 401: give the server's key with --api-key");
        }
        f.push(s);
    }
    if r.lost_answers > 0 {
        f.push(format!(
            "{} answers lost (ended without a finish)",
            r.lost_answers
        ));
    }
    if r.duplicate_answers > 0 {
        f.push(format!("{} duplicated answers", r.duplicate_answers));
    }
    if r.usage_mismatches > 0 {
        f.push(format!(
            "{} answers with usage other than {} prompt + {} completion tokens",
            r.usage_mismatches, r.prompt_tokens, r.max_tokens
        ));
    }
    if r.bad_rejected < r.bad_sent {
        f.push(format!(
            "{} of {} malformed requests were not answered with a 4xx JSON error",
            r.bad_sent - r.bad_rejected,
            r.bad_sent
        ));
    }
    f
}

fn secs(v: Option<f64>) -> String {
    v.map(|s| format!("{s:.3} s")).unwrap_or_else(|| "-".into())
}

/// The default output: a table of the run and its verdict.
pub fn text(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "loadtest {}{} ({}{}): {} clients x {} requests, {} prompt tokens, {} new tokens",
        r.url,
        r.endpoint,
        if r.stream { "streamed" } else { "not streamed" },
        r.model
            .as_deref()
            .map(|m| format!(", model {m}"))
            .unwrap_or_default(),
        r.clients,
        r.requests_per_client,
        r.prompt_tokens,
        r.max_tokens
    );
    let row = |s: &mut String, k: &str, v: String| {
        let _ = writeln!(s, "  {k:<13} {v}");
    };
    row(
        &mut s,
        "requests",
        format!(
            "{} ({} good, {} malformed, {} dropped by the client)",
            r.requests, r.good, r.bad_sent, r.disconnects_planned
        ),
    );
    row(&mut s, "ok", format!("{} of {} good", r.ok, r.good));
    let kinds: Vec<String> = r
        .errors_by_kind
        .iter()
        .map(|(k, n)| format!("{k} x{n}"))
        .collect();
    row(
        &mut s,
        "errors",
        if kinds.is_empty() {
            "0".into()
        } else {
            format!("{} ({})", r.errors, kinds.join(", "))
        },
    );
    if r.bad_sent > 0 {
        let by: Vec<String> = r
            .bad_by_kind
            .iter()
            .map(|(k, b)| {
                let st: Vec<String> = b.statuses.keys().map(u16::to_string).collect();
                format!("{k} {}/{} ({})", b.rejected, b.sent, st.join(","))
            })
            .collect();
        row(
            &mut s,
            "malformed",
            format!(
                "{} of {} answered 4xx with a JSON error: {}",
                r.bad_rejected,
                r.bad_sent,
                by.join("; ")
            ),
        );
    }
    if r.disconnects_planned > 0 {
        row(
            &mut s,
            "dropped",
            format!(
                "{} of {} streams dropped after the first chunk(s){}",
                r.disconnects,
                r.disconnects_planned,
                if r.disconnects_completed > 0 {
                    format!(", {} ended first", r.disconnects_completed)
                } else {
                    String::new()
                }
            ),
        );
    }
    row(
        &mut s,
        "usage",
        format!(
            "{} mismatches (completion_tokens == {}{})",
            r.usage_mismatches,
            r.max_tokens,
            if r.prompt_tokens_checked {
                format!(", prompt_tokens == {}", r.prompt_tokens)
            } else {
                ", prompt_tokens not checked (chat template)".into()
            }
        ),
    );
    row(
        &mut s,
        "answers",
        format!(
            "{} lost, {} duplicated",
            r.lost_answers, r.duplicate_answers
        ),
    );
    row(
        &mut s,
        "throughput",
        format!(
            "{} tokens in {:.2} s: {:.1} tok/s aggregate",
            r.completion_tokens, r.wall_s, r.aggregate_tokens_per_s
        ),
    );
    let p = &r.per_client_tokens_per_s;
    row(
        &mut s,
        "per client",
        format!(
            "min {:.1}, mean {:.1}, max {:.1} tok/s",
            p.min, p.mean, p.max
        ),
    );
    if r.stream {
        row(
            &mut s,
            "TTFT",
            format!("p50 {}, p95 {}", secs(r.ttft_p50_s), secs(r.ttft_p95_s)),
        );
    }
    row(
        &mut s,
        "latency",
        format!(
            "p50 {}, p95 {}",
            secs(r.latency_p50_s),
            secs(r.latency_p95_s)
        ),
    );
    if r.per_client.len() <= 32 {
        for c in &r.per_client {
            let _ = writeln!(
                s,
                "    client {:<3} {} ok of {} good ({} requests), {} errors, {} tokens in {:.2} s: {:.1} tok/s",
                c.client,
                c.ok,
                c.good,
                c.requests,
                c.errors,
                c.completion_tokens,
                c.busy_s,
                c.tokens_per_s
            );
        }
    }
    for e in &r.examples {
        let _ = writeln!(s, "  problem: {e}");
    }
    let _ = writeln!(
        s,
        "  {:<13} {}",
        "result",
        if r.passed { "passed" } else { "FAILED" }
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loadtest::client::Answer;
    use std::time::Duration;

    fn opts() -> Options {
        Options {
            url: String::new(),
            clients: 1,
            requests: 4,
            prompt_tokens: 5,
            max_tokens: 3,
            stream: true,
            endpoint: Endpoint::Completions,
            bad_fraction: 0.0,
            disconnect_fraction: 0.0,
            disconnect_after: 1,
            seed: 0,
            api_key: None,
            timeout: Duration::from_secs(1),
        }
    }

    fn answer(id: &str, p: u64, c: u64) -> Outcome {
        Outcome::Answer(Answer {
            id: Some(id.into()),
            prompt_tokens: Some(p),
            completion_tokens: Some(c),
            chunks: c as usize,
            finishes: 1,
            done_marker: true,
            ..Answer::default()
        })
    }

    fn rec(seq: usize, role: Role, outcome: Outcome) -> Record {
        Record {
            client: 0,
            seq,
            role,
            outcome,
            latency_s: 0.1 * (seq + 1) as f64,
            ttft_s: Some(0.01),
        }
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut v = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(percentile(&mut v, 0.5), Some(3.0));
        assert_eq!(percentile(&mut v, 0.95), Some(5.0));
        assert_eq!(percentile(&mut [], 0.5), None);
    }

    #[test]
    fn a_clean_run_passes_and_each_problem_fails_it() {
        let o = opts();
        let run = |records: Vec<Record>| {
            build(
                &o,
                "http://x",
                None,
                vec![ClientRun {
                    client: 0,
                    records,
                    busy_s: 1.0,
                }],
                2.0,
            )
        };
        let good = |seq: usize, id: &str| rec(seq, Role::Good, answer(id, 5, 3));
        let bad = Outcome::Status {
            status: 400,
            error_json: true,
            message: "no".into(),
        };
        let r = run(vec![
            good(0, "a"),
            good(1, "b"),
            rec(2, Role::Bad(0), bad.clone()),
        ]);
        assert!(r.passed, "{r:?}");
        assert_eq!(
            (r.ok, r.good, r.bad_rejected, r.completion_tokens),
            (2, 2, 1, 6)
        );
        assert_eq!(r.aggregate_tokens_per_s, 3.0);
        assert_eq!(r.per_client[0].tokens_per_s, 6.0);
        assert!(text(&r).contains("passed"));
        let cases = vec![
            vec![good(0, "a"), good(1, "a")],
            vec![good(0, "a"), rec(1, Role::Good, answer("b", 5, 2))],
            vec![rec(0, Role::Good, Outcome::Connection("refused".into()))],
            vec![rec(
                0,
                Role::Bad(1),
                Outcome::Status {
                    status: 503,
                    error_json: true,
                    message: "busy".into(),
                },
            )],
            vec![rec(0, Role::Good, Outcome::Answer(Answer::default()))],
        ];
        for c in cases {
            let r = run(c);
            assert!(!r.passed && !r.failures.is_empty(), "{r:?}");
            assert!(text(&r).contains("FAILED"));
        }
    }
}

//! `wgmoe loadtest` against `wgmoe serve` on the OLMoE fixture, on a loopback port: 8
//! clients x 4 streamed requests with malformed ones and clients that drop their stream
//! mixed in; every good request answered once with exact usage, the malformed ones
//! refused with a 4xx, the server up afterwards, answering as before, and its memory
//! where it was after its first request. Plus the command's own errors (no server needed)
//! and a failing load's exit status. Nothing here depends on how fast the server is or
//! on how many requests it serves at once.

mod common;

use std::time::Instant;

use common::cli::*;
use common::fixture;
use common::server::*;
use serde_json::{json, Value};

const P: usize = 8;
const T: usize = 6;

/// VmRSS of a process in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status:\n{status}"))
}

/// The text and usage of one streamed completion of P fixed ids.
fn probe(srv: &Server) -> (String, Value) {
    let ids: Vec<u32> = (0..P as u32).map(|i| 20 + 7 * i).collect();
    let body = json!({"prompt": ids, "max_tokens": T, "ignore_eos": true, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true}});
    let data = srv.stream("/v1/completions", &body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let mut text = String::new();
    let mut usage = Value::Null;
    for d in &data[..data.len() - 1] {
        let c = json(d);
        if let Some(t) = c["choices"][0]["text"].as_str() {
            text.push_str(t);
        }
        if c["usage"].is_object() {
            usage = c["usage"].clone();
        }
    }
    assert_eq!(usage["completion_tokens"], T, "{data:?}");
    assert_eq!(usage["prompt_tokens"], P, "{data:?}");
    (text, usage)
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("`{k}` is not a count: {v}"))
}

#[test]
fn concurrent_clients_get_exact_answers_and_the_server_stays_up() {
    let t0 = Instant::now();
    // Room for every client's request and a dropped one still finishing; four slots,
    // batched decode steps; the default kernels. (llvmpipe, Mesa 22.3, recompiled some
    // pipelines at every dispatch, inlining their uniform parameters, and never freed the
    // old ones: llvmpipe's kernels now read their parameters from storage,
    // `shaders::params_in_storage`, and the server's memory stays flat on every plan.)
    let srv = Server::start(
        &fixture(OLMOE),
        &["--max-queue", "256", "--parallel", "4", "--batching", "on"],
    );
    let (text0, _) = probe(&srv);
    let rss0 = rss_kib(srv.pid());
    // The 32 clients x 8 requests, on the tiny fixture.
    let (c, r) = (32, 8);
    let load = wgmoe([
        "loadtest",
        &srv.url,
        "--clients",
        &c.to_string(),
        "--requests",
        &r.to_string(),
        "--prompt-tokens",
        &P.to_string(),
        "--max-tokens",
        &T.to_string(),
        "--stream",
        "--bad-fraction",
        "0.2",
        "--disconnect-fraction",
        "0.25",
        "--seed",
        "7",
        "--json",
    ]);
    let v = json_of(&load);
    let total = (c * r) as u64;
    // round(0.2 x 256) = 51 malformed, round(0.25 x 256) = 64 dropped, the rest good.
    let bad = (0.2 * total as f64).round() as u64;
    let drop = (0.25 * total as f64).round() as u64;
    let good = total - bad - drop;
    assert_eq!(n(&v, "requests"), total, "{v}");
    assert_eq!(n(&v, "clients"), c as u64, "{v}");
    assert_eq!(n(&v, "good"), good, "{v}");
    assert_eq!(n(&v, "ok"), good, "{v}");
    assert_eq!(n(&v, "errors"), 0, "{v}");
    assert_eq!(n(&v, "usage_mismatches"), 0, "{v}");
    assert_eq!(n(&v, "lost_answers"), 0, "{v}");
    assert_eq!(n(&v, "duplicate_answers"), 0, "{v}");
    assert_eq!(n(&v, "bad_sent"), bad, "{v}");
    assert_eq!(n(&v, "bad_rejected"), bad, "{v}");
    for (kind, b) in v["bad_by_kind"].as_object().unwrap() {
        let statuses: Vec<u16> = b["statuses"]
            .as_object()
            .unwrap()
            .keys()
            .map(|s| s.parse::<u16>().unwrap())
            .collect();
        assert!(
            statuses.iter().all(|s| (400..500).contains(s)),
            "{kind}: {b}"
        );
    }
    assert_eq!(n(&v, "disconnects_planned"), drop, "{v}");
    assert_eq!(
        n(&v, "disconnects") + n(&v, "disconnects_completed"),
        drop,
        "{v}"
    );
    assert_eq!(n(&v, "completion_tokens"), good * T as u64, "{v}");
    assert_eq!(v["passed"], true, "{v}");
    assert_eq!(v["per_client"].as_array().unwrap().len(), c, "{v}");
    for k in [
        "aggregate_tokens_per_s",
        "ttft_p50_s",
        "ttft_p95_s",
        "latency_p50_s",
        "latency_p95_s",
        "wall_s",
    ] {
        assert!(v[k].as_f64().is_some_and(|x| x > 0.0), "{k}: {v}");
    }
    assert!(
        v["ttft_p50_s"].as_f64() <= v["latency_p50_s"].as_f64(),
        "{v}"
    );

    // Still up, and the same answer as before the load (greedy, the same prompt).
    let (st, h) = srv.get("/health");
    assert_eq!(st, 200, "{h}");
    let (text1, _) = probe(&srv);
    assert_eq!(text1, text0, "the answer changed after the load");
    // Each request the worker took was answered once: the probes, the good and the
    // dropped ones (served or cancelled, as the drop came before or after its end); every
    // malformed one is counted failed, whether the parser refused it or the worker (a token
    // id outside the vocabulary) did (issue 39, 14).
    let taken = 2 + good + drop;
    let stats = srv.stats_until(|s| {
        let q = &s["requests"];
        n(q, "served") + n(q, "cancelled") + n(q, "failed") >= taken + bad
    });
    let q = &stats["requests"];
    assert_eq!(n(q, "served") + n(q, "cancelled"), taken, "{stats}");
    assert_eq!(n(q, "failed"), bad, "{stats}");
    assert_eq!(n(q, "rejected_queue_full"), 0, "{stats}");
    let rss1 = rss_kib(srv.pid());
    println!(
        "server RSS after the first request {rss0} KiB, after {total} requests {rss1} KiB ({:+.1}%); {:.1}s so far",
        (rss1 as f64 / rss0 as f64 - 1.0) * 100.0,
        t0.elapsed().as_secs_f64()
    );

    // Not streamed, the table: latency but no TTFT.
    let table = wgmoe([
        "loadtest",
        &srv.url,
        "--clients",
        "2",
        "--requests",
        "2",
        "--prompt-tokens",
        &P.to_string(),
        "--max-tokens",
        &T.to_string(),
    ]);
    assert_ok(&table);
    for want in [
        "ok            4 of 4 good",
        "latency",
        "result        passed",
    ] {
        assert!(table.stdout.contains(want), "{want}:\n{table}");
    }
    assert!(!table.stdout.contains("TTFT"), "{table}");

    // A load whose good requests fail (beyond the context): the report, then a failing
    // exit status with the reason.
    let fail = wgmoe([
        "loadtest",
        &srv.url,
        "--clients",
        "2",
        "--requests",
        "1",
        "--prompt-tokens",
        &P.to_string(),
        "--max-tokens",
        "100000",
        "--json",
    ]);
    assert_error(
        &fail,
        &["loadtest failed", "2 of 2 good requests", "http_400"],
    );
    let v: Value =
        serde_json::from_str(fail.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {fail}"));
    assert_eq!(v["passed"], false, "{v}");
    assert_eq!(n(&v["errors_by_kind"], "http_400"), 2, "{v}");
    println!("took {:.1}s", t0.elapsed().as_secs_f64());
    // Last, so the checks above run whatever the memory says.
    assert!(
        rss1 as f64 <= rss0 as f64 * 1.05,
        "the server's RSS grew from {rss0} KiB after its first request to {rss1} KiB after \
         {total} more ({:+.1}%, {} KiB per request taken)",
        (rss1 as f64 / rss0 as f64 - 1.0) * 100.0,
        rss1.saturating_sub(rss0) / taken
    );
}

#[test]
fn bad_options_and_unreachable_servers_are_named() {
    let url = "http://127.0.0.1:9";
    let cases: [(&[&str], &[&str]); 7] = [
        (&[url, "--clients", "0"], &["--clients"]),
        (&[url, "--requests", "0"], &["--requests"]),
        (&[url, "--prompt-tokens", "0"], &["--prompt-tokens"]),
        (&[url, "--bad-fraction", "1.5"], &["--bad-fraction"]),
        (
            &[url, "--disconnect-fraction", "0.5"],
            &["--disconnect-fraction", "--stream"],
        ),
        (&["ftp://127.0.0.1:9"], &["URL", "ftp"]),
        (&["https://127.0.0.1:9"], &["URL", "https"]),
    ];
    for (args, names) in cases {
        let mut a = vec!["loadtest"];
        a.extend_from_slice(args);
        assert_error(&wgmoe(&a), names);
    }
    // A port nobody listens on (bound, then freed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let r = wgmoe(["loadtest", &url]);
    assert_error(&r, &[&url, "connection refused"]);
}

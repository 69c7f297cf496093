//! `wgmoe serve`'s graceful shutdown, on the real binary: SIGTERM drains what was admitted
//! (the answer being generated and the queue) while refusing new requests and answering
//! `/health` with 503 "draining"; a drain timeout ends the answer with finish_reason
//! "abort" and refuses the queued with 503; Ctrl-C does the same; a second signal exits at
//! once. Every case checks the exit status and the shutdown's log lines.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use common::cli::*;
use common::fixture;
use common::server::*;
use serde_json::{json, Value};

/// A copy of the fixture with room for more tokens than any adapter makes within the
/// drain timeouts below, served with a 4096-position context in one slot (so a second
/// request waits in the queue) unless `args` say otherwise.
fn long_server(args: &[&str]) -> (tempfile::TempDir, Server) {
    let (t, dir) = copy_fixture(OLMOE);
    edit_config(&dir, |c| {
        c.insert("max_position_embeddings".into(), 8192.into());
    });
    let mut a = vec!["--ctx-size", "4096"];
    if !args.contains(&"--parallel") {
        a.extend_from_slice(&["--parallel", "1"]);
    }
    a.extend_from_slice(args);
    (t, Server::start(&dir, &a))
}

fn chat(n: usize, stream: bool) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Hello there"}],
        "max_tokens": n, "ignore_eos": true, "stream": stream,
        "stream_options": {"include_usage": true},
    })
}

fn next(rx: &Receiver<String>) -> String {
    rx.recv_timeout(TIMEOUT)
        .expect("the stream ended or stalled before its first events")
}

/// The rest of a stream: the finish chunk, the usage-only chunk, `[DONE]`.
fn rest(rx: &Receiver<String>) -> Vec<String> {
    let mut v = Vec::new();
    while let Ok(d) = rx.recv_timeout(TIMEOUT) {
        v.push(d);
    }
    assert_eq!(v.last().map(String::as_str), Some("[DONE]"), "{v:?}");
    assert!(v.len() >= 3, "{v:?}");
    v
}

/// The finish chunk (before the usage-only chunk and `[DONE]`).
fn finish_chunk(data: &[String]) -> Value {
    let last = json(&data[data.len() - 3]);
    let usage_only = json(&data[data.len() - 2]);
    assert_eq!(usage_only["choices"], json!([]), "{usage_only}");
    assert_eq!(usage_only["usage"], last["usage"], "{last}");
    last
}

/// A keep-alive connection that served one request and then sits idle.
fn idle_keep_alive(addr: &str) -> TcpStream {
    let mut sock = TcpStream::connect(addr).expect("connect");
    sock.set_read_timeout(Some(TIMEOUT)).unwrap();
    write!(sock, "GET /health HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    // The whole body: "status" first, the slot counts after it.
    while !{
        let s = String::from_utf8_lossy(&seen);
        s.contains("\"status\":\"ok\"") && s.ends_with('}')
    } {
        let n = sock.read(&mut buf).expect("read /health");
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    sock
}

/// While draining: new requests get 503 `shutting_down`, `/health` 503 "draining".
fn refuses_while_draining(srv: &Server) {
    let (st, v) = srv.get("/health");
    assert_eq!((st, &v["status"]), (503, &json!("draining")), "{v}");
    let (st, v) = srv.post("/v1/completions", &json!({"prompt": "hi", "max_tokens": 2}));
    assert_eq!(st, 503, "{v}");
    assert_eq!(v["error"]["code"], "shutting_down", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("takes no new requests"),
        "{v}"
    );
}

fn assert_gone(srv: &Server) {
    assert!(
        TcpStream::connect(&srv.addr).is_err(),
        "{} still accepts connections after the exit",
        srv.addr
    );
}

#[test]
fn sigterm_drains_the_admitted_requests_then_exits_0() {
    let srv = Server::start(
        &fixture(OLMOE),
        &["--drain-timeout", "60", "--parallel", "1"],
    );
    let idle = idle_keep_alive(&srv.addr);
    // Long enough to be still generating when the signal lands; short enough for the drain.
    let n = 300;
    let events = srv.stream_events("/v1/chat/completions", &chat(n, true));
    let first = next(&events);
    assert!(first.starts_with('{'), "{first}");
    next(&events);
    std::thread::scope(|s| {
        let queued = s.spawn(|| srv.post("/v1/chat/completions", &chat(5, false)));
        srv.stats_until(|v| v["queue"]["waiting"] == 1);
        srv.signal("TERM");
        let log = srv.log_until(|l| l.contains("shutting down:"));
        assert!(
            log.contains("shutting down: 2 requests in flight, draining up to 60s"),
            "{log}"
        );
        refuses_while_draining(&srv);
        // Both admitted requests are served in full.
        let data = rest(&events);
        let last = finish_chunk(&data);
        assert_eq!(last["choices"][0]["finish_reason"], "length", "{last}");
        assert_eq!(last["usage"]["completion_tokens"], n, "{last}");
        let (st, v) = queued.join().unwrap();
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 5, "{v}");
    });
    let status = srv.wait();
    let log = srv.stderr();
    assert_eq!(status.code(), Some(0), "{status}\n{log}");
    assert!(log.contains("\ndrained after "), "{log}");
    assert!(!log.contains("aborted"), "{log}");
    // The idle keep-alive connection was closed, not waited for until the cut.
    assert!(!log.contains("connections still open"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    drop(idle);
    assert_gone(&srv);
}

#[test]
fn a_drain_timeout_ends_the_stream_with_abort_and_refuses_the_queued() {
    let (_t, srv) = long_server(&["--drain-timeout", "1"]);
    let n = 4000;
    let events = srv.stream_events("/v1/chat/completions", &chat(n, true));
    next(&events);
    next(&events);
    std::thread::scope(|s| {
        // A queued stream is refused with a JSON error, as before it starts.
        let queued = s.spawn(|| srv.post("/v1/chat/completions", &chat(5, true)));
        srv.stats_until(|v| v["queue"]["waiting"] == 1);
        srv.signal("TERM");
        srv.log_until(|l| l.contains("shutting down: 2 requests in flight, draining up to 1s"));
        refuses_while_draining(&srv);
        let data = rest(&events);
        let last = finish_chunk(&data);
        assert_eq!(last["choices"][0]["finish_reason"], "abort", "{last}");
        let made = last["usage"]["completion_tokens"].as_u64().unwrap();
        assert!((2..n as u64).contains(&made), "{last}");
        let (st, v) = queued.join().unwrap();
        assert_eq!(st, 503, "{v}");
        assert_eq!(v["error"]["code"], "shutting_down", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("still queued when the drain timeout"),
            "{v}"
        );
    });
    let status = srv.wait();
    let log = srv.stderr();
    assert_eq!(status.code(), Some(0), "{status}\n{log}");
    assert!(log.contains("generated (abort)"), "{log}");
    assert!(log.contains("\naborted 2 requests after "), "{log}");
    assert!(!log.contains("drained"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert_gone(&srv);
}

#[test]
fn ctrl_c_ends_a_non_streamed_answer_with_abort_and_the_text_so_far() {
    let (_t, srv) = long_server(&["--drain-timeout", "1"]);
    let n = 4000;
    // The request runs once the stream before it goes away: then it is surely generating.
    let sock = start_stream(&srv.addr, "/v1/chat/completions", &chat(n, true), 2);
    std::thread::scope(|s| {
        let answer = s.spawn(|| srv.post("/v1/chat/completions", &chat(n, false)));
        srv.stats_until(|v| v["queue"]["waiting"] == 1);
        drop(sock);
        srv.stats_until(|v| v["requests"]["cancelled"] == 1 && v["queue"]["waiting"] == 0);
        srv.signal("INT");
        srv.log_until(|l| l.contains("shutting down: 1 request in flight, draining up to 1s"));
        let (st, v) = answer.join().unwrap();
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "abort", "{v}");
        let made = v["usage"]["completion_tokens"].as_u64().unwrap();
        assert!((1..n as u64).contains(&made), "{v}");
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(!text.is_empty(), "{v}");
    });
    let status = srv.wait();
    let log = srv.stderr();
    assert_eq!(status.code(), Some(0), "{status}\n{log}");
    assert!(log.contains("\naborted 1 requests after "), "{log}");
    assert_gone(&srv);
}

#[test]
fn a_second_signal_exits_at_once_with_130() {
    let (_t, srv) = long_server(&["--drain-timeout", "60"]);
    let events = srv.stream_events("/v1/chat/completions", &chat(4000, true));
    next(&events);
    srv.signal("TERM");
    srv.log_until(|l| l.contains("shutting down: 1 request in flight"));
    srv.signal("TERM");
    let status = srv.wait();
    let log = srv.stderr();
    assert_eq!(status.code(), Some(130), "{status}\n{log}");
    assert!(log.contains("second signal: exiting at once"), "{log}");
    assert!(!log.contains("drained"), "{log}");
    // The stream was cut: no `[DONE]`.
    let mut data = Vec::new();
    while let Ok(d) = events.recv_timeout(Duration::from_secs(10)) {
        data.push(d);
    }
    assert_ne!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
}

#[test]
fn a_drain_timeout_ends_every_busy_slot_with_abort() {
    let (_t, srv) = long_server(&["--drain-timeout", "1", "--parallel", "2"]);
    let n = 1500;
    let a = srv.stream_events("/v1/chat/completions", &chat(n, true));
    let b = srv.stream_events(
        "/v1/completions",
        &json!({
            "prompt": "Once upon a time", "max_tokens": n, "ignore_eos": true, "stream": true,
            "stream_options": {"include_usage": true},
        }),
    );
    next(&a);
    next(&b);
    // Both generate at once, one slot each.
    let s = srv.stats_until(|v| v["slots"]["processing"] == 2);
    assert_eq!(s["slots"]["total"], 2, "{s}");
    let (st, h) = srv.get("/health");
    assert_eq!(st, 200, "{h}");
    assert_eq!(
        (h["slots_processing"].clone(), h["slots_idle"].clone()),
        (json!(2), json!(0)),
        "{h}"
    );
    srv.signal("TERM");
    srv.log_until(|l| l.contains("shutting down: 2 requests in flight, draining up to 1s"));
    for events in [&a, &b] {
        let data = rest(events);
        let last = finish_chunk(&data);
        assert_eq!(last["choices"][0]["finish_reason"], "abort", "{last}");
        let made = last["usage"]["completion_tokens"].as_u64().unwrap();
        assert!((2..n as u64).contains(&made), "{last}");
    }
    let status = srv.wait();
    let log = srv.stderr();
    assert_eq!(status.code(), Some(0), "{status}\n{log}");
    assert!(log.contains("\naborted 2 requests after "), "{log}");
    assert_eq!(log.matches("generated (abort)").count(), 2, "{log}");
    assert_gone(&srv);
}

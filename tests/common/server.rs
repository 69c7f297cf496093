//! The server tests' side: `wgmoe serve` started on a loopback port the OS picks (the
//! address read from its `listening on` line), requests through a real HTTP client
//! (ureq), and a raw socket for a client that goes away mid-stream; signals by `kill` and
//! the exit status for the shutdown tests.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::cli::{command, s};

/// Every request and every wait of these tests ends within this.
pub const TIMEOUT: Duration = Duration::from_secs(60);

pub struct Server {
    child: Mutex<Child>,
    pid: u32,
    /// Reads stderr into `stderr` until the process ends.
    reader: Mutex<Option<JoinHandle<()>>>,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    pub addr: String,
    stderr: Arc<Mutex<String>>,
    agent: ureq::Agent,
}

impl Server {
    /// `wgmoe serve MODEL --port 0 ARGS...`, once it listens.
    pub fn start(model: &Path, args: &[&str]) -> Server {
        let mut child = command()
            .arg("serve")
            .arg(s(model))
            .args(["--port", "0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn wgmoe serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let err = child.stderr.take().unwrap();
        let log = stderr.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(|l| l.ok()) {
                if let Some(rest) = line.strip_prefix("listening on http://") {
                    let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                    let _ = tx.send(addr);
                }
                let mut l = log.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let addr = match rx.recv_timeout(TIMEOUT) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "wgmoe serve did not listen within {TIMEOUT:?}:\n{}",
                    stderr.lock().unwrap()
                );
            }
        };
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(TIMEOUT))
            .build()
            .into();
        Server {
            pid: child.id(),
            child: Mutex::new(child),
            reader: Mutex::new(Some(reader)),
            url: format!("http://{addr}"),
            addr,
            stderr,
            agent,
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `kill -SIG PID` (`sig`: "TERM", "INT").
    pub fn signal(&self, sig: &str) {
        let st = std::process::Command::new("kill")
            .args([format!("-{sig}"), self.pid.to_string()])
            .status()
            .expect("run kill");
        assert!(st.success(), "kill -{sig} {}: {st}", self.pid);
    }

    /// The exit status once the process ends (within `TIMEOUT`), with all of its stderr
    /// read.
    pub fn wait(&self) -> ExitStatus {
        let t0 = Instant::now();
        let status = loop {
            if let Some(st) = self.child.lock().unwrap().try_wait().expect("try_wait") {
                break st;
            }
            assert!(
                t0.elapsed() < TIMEOUT,
                "wgmoe serve did not exit within {TIMEOUT:?}:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        if let Some(r) = self.reader.lock().unwrap().take() {
            let _ = r.join();
        }
        status
    }

    /// A streamed POST read on its own thread: each `data:` payload as it arrives (the
    /// last is `[DONE]`), then the channel closes. A status other than 200 arrives as one
    /// item `HTTP STATUS: BODY`.
    pub fn stream_events(&self, path: &str, body: &Value) -> Receiver<String> {
        let (tx, rx) = std::sync::mpsc::channel();
        let req = self
            .agent
            .post(format!("{}{path}", self.url))
            .header("Content-Type", "application/json");
        let body = body.to_string();
        std::thread::spawn(move || {
            let mut r = match req.send(body) {
                Ok(r) => r,
                Err(e) => return drop(tx.send(format!("HTTP error: {e}"))),
            };
            let status = r.status().as_u16();
            if status != 200 {
                let text = r.body_mut().read_to_string().unwrap_or_default();
                let _ = tx.send(format!("HTTP {status}: {text}"));
                return;
            }
            for line in BufReader::new(r.body_mut().as_reader()).lines() {
                let Ok(line) = line else { return };
                if let Some(d) = line
                    .strip_prefix("data: ")
                    .or_else(|| line.strip_prefix("data:"))
                {
                    if tx.send(d.to_string()).is_err() {
                        return;
                    }
                }
            }
        });
        rx
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The log once `done` holds for it (the worker logs a request after answering it).
    pub fn log_until(&self, done: impl Fn(&str) -> bool) -> String {
        let t0 = Instant::now();
        loop {
            let log = self.stderr();
            if done(&log) {
                return log;
            }
            assert!(t0.elapsed() < TIMEOUT, "the log never got there:\n{log}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// (status, body) of a POST of `body` (any bytes) with optional bearer key.
    pub fn post_raw(&self, path: &str, body: &str, key: Option<&str>) -> (u16, String) {
        let mut req = self
            .agent
            .post(format!("{}{path}", self.url))
            .header("Content-Type", "application/json");
        if let Some(k) = key {
            req = req.header("Authorization", format!("Bearer {k}"));
        }
        let mut r = req
            .send(body)
            .unwrap_or_else(|e| panic!("POST {path}: {e}\n{}", self.stderr()));
        let status = r.status().as_u16();
        let text = r
            .body_mut()
            .read_to_string()
            .unwrap_or_else(|e| panic!("POST {path}: body: {e}"));
        (status, text)
    }

    /// (status, JSON body) of a POST of `body`.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_key(path, body, None)
    }

    pub fn post_key(&self, path: &str, body: &Value, key: Option<&str>) -> (u16, Value) {
        let (st, text) = self.post_raw(path, &body.to_string(), key);
        (st, json(&text))
    }

    /// (status, JSON body) of a request with any method.
    pub fn call(&self, method: &str, path: &str, key: Option<&str>) -> (u16, Value) {
        let uri = format!("{}{path}", self.url);
        let mut req = ureq::http::Request::builder().method(method).uri(&uri);
        if let Some(k) = key {
            req = req.header("Authorization", format!("Bearer {k}"));
        }
        let req = req.body(()).unwrap();
        let mut r = self
            .agent
            .run(req)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().unwrap();
        (status, json(&text))
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, None)
    }

    /// The body of a GET that answers 200 with text (`/metrics`).
    pub fn text(&self, path: &str) -> String {
        let mut r = self
            .agent
            .get(format!("{}{path}", self.url))
            .call()
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        assert_eq!(r.status().as_u16(), 200, "GET {path}");
        r.body_mut().read_to_string().unwrap()
    }

    /// The `data:` payloads of a streamed POST, in order (the last is `[DONE]`).
    pub fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let mut r = self
            .agent
            .post(format!("{}{path}", self.url))
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        assert_eq!(r.status().as_u16(), 200, "stream {body}");
        let ct = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        assert!(ct.starts_with("text/event-stream"), "content-type {ct}");
        let mut text = String::new();
        r.body_mut()
            .as_reader()
            .read_to_string(&mut text)
            .expect("read the stream");
        sse_data(&text)
    }

    /// GET /stats until `done` holds (the worker records a request after its answer).
    pub fn stats_until(&self, done: impl Fn(&Value) -> bool) -> Value {
        let t0 = Instant::now();
        loop {
            let (st, v) = self.get("/stats");
            assert_eq!(st, 200, "{v}");
            if done(&v) {
                return v;
            }
            assert!(t0.elapsed() < TIMEOUT, "stats never got there: {v}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

pub fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

/// The `data:` payloads of an event stream.
pub fn sse_data(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            e.lines()
                .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect()
}

/// A streaming POST on a raw socket: returns it once `events` data lines have arrived,
/// so the caller can drop it (a client that goes away mid-answer).
pub fn start_stream(addr: &str, path: &str, body: &Value, events: usize) -> TcpStream {
    let mut sock = TcpStream::connect(addr).expect("connect");
    sock.set_read_timeout(Some(TIMEOUT)).unwrap();
    let b = body.to_string();
    write!(
        sock,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    )
    .unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while seen.matches("data: ").count() < events {
        let n = sock.read(&mut buf).expect("read the stream");
        assert!(n > 0, "the stream ended early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    sock
}

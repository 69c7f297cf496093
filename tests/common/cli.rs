//! Helpers of the command-line tests (`tests/cli*.rs`, `tests/output_safety.rs`,
//! `tests/hostile_inputs.rs`): run the `wgmoe` binary, check its errors, and work on
//! temporary copies of the fixtures.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use safetensors::SafeTensors;
use serde_json::Value;
use tempfile::TempDir;

pub const OLMOE: &str = "olmoe-tiny";
pub const QWEN: &str = "qwen2moe-tiny";
pub const QWEN3: &str = "qwen3moe-tiny";
pub const MIXTRAL: &str = "mixtral-tiny";

pub struct Run {
    pub cmd: String,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "command: {}\nexit: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}\n--------------",
            self.cmd, self.code, self.stdout, self.stderr
        )
    }
}

pub fn command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_wgmoe"));
    // Keeps the Vulkan loader quiet (set per command: tests run on parallel threads).
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        c.env("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    // A panic must show up as its default one-line note, whatever the caller's setting.
    c.env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE");
    c.stdin(Stdio::null());
    c
}

pub fn wgmoe<I, S>(args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<std::ffi::OsString> = args
        .into_iter()
        .map(|a| a.as_ref().to_os_string())
        .collect();
    let cmd = format!(
        "wgmoe {}",
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out = command().args(&args).output().expect("spawn wgmoe");
    Run {
        cmd,
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub fn assert_no_panic(r: &Run) {
    for s in [&r.stdout, &r.stderr] {
        assert!(
            !s.contains("panicked")
                && !s.contains("RUST_BACKTRACE")
                && !s.contains("stack backtrace"),
            "panic text in output:\n{r}"
        );
    }
}

/// The command failed cleanly: non-zero exit (not a signal), no panic, and the last line
/// of stderr is the only `error` line and names every item of `names`.
pub fn assert_error(r: &Run, names: &[&str]) {
    assert_no_panic(r);
    assert!(r.code.is_some(), "killed by a signal:\n{r}");
    assert_ne!(r.code, Some(0), "expected failure:\n{r}");
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let last = *lines.last().unwrap_or_else(|| panic!("empty stderr:\n{r}"));
    assert!(
        last.starts_with("error: "),
        "last stderr line is not `error: ...`:\n{r}"
    );
    let error_lines = lines
        .iter()
        .filter(|l| l.trim_start().to_lowercase().starts_with("error"))
        .count();
    assert_eq!(error_lines, 1, "expected exactly one error line:\n{r}");
    for n in names {
        assert!(last.contains(n), "error line does not name `{n}`:\n{r}");
    }
}

pub fn assert_ok(r: &Run) {
    assert_no_panic(r);
    assert_eq!(r.code, Some(0), "expected success:\n{r}");
}

pub fn json_of(r: &Run) -> Value {
    assert_ok(r);
    serde_json::from_str(r.stdout.trim())
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{r}"))
}

pub fn ids(v: &Value, key: &str) -> Vec<u64> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("`{key}` is not an array: {v}"))
        .iter()
        .map(|x| {
            x.as_u64()
                .unwrap_or_else(|| panic!("`{key}` holds a non-integer: {v}"))
        })
        .collect()
}

/// A copy of a fixture directory at `<tmp>/<name>`.
pub fn copy_fixture(name: &str) -> (TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dst = tmp.path().join(name);
    std::fs::create_dir(&dst).unwrap();
    for e in std::fs::read_dir(super::fixture(name)).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
    }
    (tmp, dst)
}

/// File name -> (length, content hash) of every file under `dir`.
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u64, u64)> {
    let mut m = BTreeMap::new();
    if !dir.exists() {
        return m;
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                let mut h = std::collections::hash_map::DefaultHasher::new();
                bytes.hash(&mut h);
                m.insert(
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    (bytes.len() as u64, h.finish()),
                );
            }
        }
    }
    m
}

/// Runs `args` and checks the files under `dir` are the same before and after.
pub fn run_untouched<S: AsRef<OsStr>>(dir: &Path, args: &[S]) -> Run {
    let before = snapshot(dir);
    let r = wgmoe(args);
    let after = snapshot(dir);
    assert!(
        before == after,
        "files under {} changed:\n{r}\nbefore: {before:?}\nafter: {after:?}",
        dir.display()
    );
    r
}

pub fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(v.as_object_mut().unwrap());
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

pub fn vocab_size(dir: &Path) -> u64 {
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    v["vocab_size"].as_u64().unwrap()
}

/// Rewrites a safetensors file through the `safetensors` crate, keeping its metadata;
/// `edit` gets each tensor's (name, shape) and returns None to drop it or the shape to
/// declare (same byte count).
pub fn rewrite_safetensors(path: &Path, edit: impl Fn(&str, &[usize]) -> Option<Vec<usize>>) {
    let bytes = std::fs::read(path).unwrap();
    let (_, md) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = md.metadata().clone();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut views = Vec::new();
    for (name, t) in st.tensors() {
        if let Some(shape) = edit(&name, t.shape()) {
            let v = safetensors::tensor::TensorView::new(t.dtype(), shape, t.data()).unwrap();
            views.push((name, v));
        }
    }
    let out = safetensors::serialize(views, meta).unwrap();
    std::fs::write(path, out).unwrap();
}

pub fn s(p: &Path) -> String {
    p.display().to_string()
}

/// Runs `args` with `dir` as the working directory.
pub fn wgmoe_in<S: AsRef<OsStr>>(dir: &Path, args: &[S]) -> Run {
    let args: Vec<std::ffi::OsString> = args.iter().map(|a| a.as_ref().to_os_string()).collect();
    let cmd = format!(
        "(cd {} && wgmoe {})",
        dir.display(),
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out = command()
        .args(&args)
        .current_dir(dir)
        .output()
        .expect("spawn wgmoe");
    Run {
        cmd,
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Overwrites element `index` of tensor `name` in the safetensors file `path` with `value`,
/// in the tensor's own dtype (BF16 by truncation, F16, F32), in place.
pub fn set_element(path: &Path, name: &str, index: usize, value: f32) {
    let mut bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let t = &header[name];
    let start = t["data_offsets"][0]
        .as_u64()
        .unwrap_or_else(|| panic!("no tensor {name}"));
    let (size, le): (usize, Vec<u8>) = match t["dtype"].as_str().unwrap() {
        "BF16" => (2, ((value.to_bits() >> 16) as u16).to_le_bytes().to_vec()),
        "F16" => (2, half::f16::from_f32(value).to_le_bytes().to_vec()),
        "F32" => (4, value.to_le_bytes().to_vec()),
        other => panic!("{name}: dtype {other}"),
    };
    let at = 8 + n + start as usize + index * size;
    bytes[at..at + size].copy_from_slice(&le);
    std::fs::write(path, bytes).unwrap();
}

/// The names of the entries of `dir`, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Like `wgmoe`, but fails the test if the command has not finished within `secs` seconds
/// (it is killed): for inputs that once hung or allocated without bound.
pub fn wgmoe_within<S: AsRef<OsStr>>(secs: u64, args: &[S]) -> Run {
    let args: Vec<std::ffi::OsString> = args.iter().map(|a| a.as_ref().to_os_string()).collect();
    let cmd = format!(
        "wgmoe {}",
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut child = command()
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn wgmoe");
    let read = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = r.read_to_end(&mut s);
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out = read(Box::new(child.stdout.take().unwrap()));
    let err = read(Box::new(child.stderr.take().unwrap()));
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed().as_secs() >= secs {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd}: did not finish within {secs} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Run {
        cmd,
        code: status.code(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// `wgmoe bench DIR` with `extra`, on one prompt, one block and no warm-up unless `extra`
/// says otherwise.
pub fn quick_bench(dir: &Path, extra: &[&str]) -> Run {
    let mut args: Vec<String> = vec!["bench".into(), s(dir)];
    for (opt, value) in [("--prompts", "1"), ("--blocks", "1"), ("--warmup", "0")] {
        if !extra.contains(&opt) {
            args.extend([opt.to_string(), value.to_string()]);
        }
    }
    args.extend(extra.iter().map(|a| a.to_string()));
    wgmoe(args)
}

/// Per (layer, expert) of a trace's records (header left out): on the GPU when the trace
/// ends, replayed from the records alone (a hit was resident; `loaded` experts arrive,
/// `evicted` ones leave).
pub fn on_gpu_at_the_end(lines: &[Value]) -> BTreeMap<(u64, u64), bool> {
    let mut on: BTreeMap<(u64, u64), bool> = BTreeMap::new();
    for v in lines {
        let l = v["layer"].as_u64().unwrap();
        let list = |k: &str| -> Vec<u64> {
            v[k].as_array().map_or(Vec::new(), |a| {
                a.iter().map(|x| x.as_u64().unwrap()).collect()
            })
        };
        for (e, hit) in list("experts").iter().zip(v["hit"].as_array().unwrap()) {
            if hit == true {
                on.insert((l, *e), true);
            }
        }
        for e in list("loaded") {
            on.insert((l, e), true);
        }
        for e in list("evicted") {
            on.insert((l, e), false);
        }
    }
    on
}

/// The prompt of the CLI tests that run the fixtures.
pub const HELLO: &str = "Hello, world";

/// `wgmoe run DIR --json EXTRA...` on a directory that must stay untouched: the run and
/// its JSON object.
pub fn run_json(dir: &Path, extra: &[&str]) -> (Run, Value) {
    let mut args: Vec<String> = vec!["run".into(), s(dir), "--json".into()];
    args.extend(extra.iter().map(|a| a.to_string()));
    let r = run_untouched(dir, &args);
    let v = json_of(&r);
    (r, v)
}

/// `wgmoe plan ARGS...`'s JSON object.
pub fn plan_json(args: &[&str]) -> Value {
    let mut a = vec!["plan"];
    a.extend_from_slice(args);
    json_of(&wgmoe(&a))
}

/// Field `k` of `v` as an integer.
pub fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("`{k}` is not an integer: {v}"))
}

/// The published config `models/configs/NAME` as a path argument.
pub fn config(name: &str) -> String {
    crate::common::repo()
        .join("models/configs")
        .join(name)
        .display()
        .to_string()
}

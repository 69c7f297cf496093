//! The module graph reads bottom-up and has no cycle, and no code outside the wgpu backend
//! folder names wgpu: the seam is the only way to a device.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `src/model/forward.rs` -> ["model", "forward"]; `src/backend/mod.rs` -> ["backend"].
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut m: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().to_string())
        .collect();
    if m.last()
        .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
    {
        m.pop();
    }
    m
}

/// Strip `//` comments (doc comments mention other modules in prose).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module paths a file refers to through `crate::` and `super::`.
fn references(module: &[String], text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let t = code(text);
    let bytes = t.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    // Bytes, not str slices: `i` steps through non-ASCII text (string literals) too.
    while i < t.len() {
        let rest = &bytes[i..];
        let (base, skip): (Vec<String>, usize) =
            if rest.starts_with(b"crate::") && (i == 0 || !ident(bytes[i - 1])) {
                (Vec::new(), 7)
            } else if rest.starts_with(b"super::") && (i == 0 || !ident(bytes[i - 1])) {
                let mut b = module.to_vec();
                let mut s = 7;
                b.pop();
                while bytes[i + s..].starts_with(b"super::") {
                    b.pop();
                    s += 7;
                }
                (b, s)
            } else {
                i += 1;
                continue;
            };
        let mut path = base;
        let mut j = i + skip;
        loop {
            let start = j;
            while j < t.len() && ident(bytes[j]) {
                j += 1;
            }
            if j == start {
                break;
            }
            path.push(t[start..j].to_string());
            if bytes[j..].starts_with(b"::") {
                j += 2;
            } else {
                break;
            }
        }
        out.push(path);
        i = j.max(i + 1);
    }
    out
}

#[test]
fn the_module_graph_has_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_of(&src, f), f.clone()))
        .collect();
    // A reference names the longest module that exists along its path.
    let resolve = |path: &[String]| -> Option<Vec<String>> {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| modules.contains_key(p))
    };
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (m, f) in &modules {
        if m.is_empty() || m == &["main".to_string()] || m.first().is_some_and(|c| c == "cli") {
            continue; // the crate root and the binary sit above everything
        }
        let text = std::fs::read_to_string(f).unwrap();
        for r in references(m, &text) {
            if let Some(t) = resolve(&r) {
                // A module using its own children or parent's items is not a dependency
                // between concepts.
                if &t != m && !t.starts_with(m) && !m.starts_with(&t) {
                    edges.entry(m.clone()).or_default().insert(t);
                }
            }
        }
    }
    // Depth-first search for a cycle.
    fn visit(
        n: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        match state.get(n) {
            Some(1) => {
                let i = stack.iter().position(|s| s == n).unwrap_or(0);
                let mut c = stack[i..].to_vec();
                c.push(n.clone());
                return Some(c);
            }
            Some(2) => return None,
            _ => {}
        }
        state.insert(n.clone(), 1);
        stack.push(n.clone());
        for t in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(t, edges, state, stack) {
                return Some(c);
            }
        }
        stack.pop();
        state.insert(n.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if let Some(c) = visit(n, &edges, &mut state, &mut Vec::new()) {
            let names: Vec<String> = c.iter().map(|p| p.join("::")).collect();
            panic!("import cycle: {}", names.join(" -> "));
        }
    }
    // The same graph between top-level modules (a file's edges lifted to its folder):
    // no cycle there either, and every edge points down ARCHITECTURE.md's layer table.
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, ts) in &edges {
        for t in ts {
            if m[0] != t[0] {
                top.entry(m[0].clone()).or_default().insert(t[0].clone());
            }
        }
    }
    let top_edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = top
        .iter()
        .map(|(m, ts)| {
            (
                vec![m.clone()],
                ts.iter().map(|t| vec![t.clone()]).collect(),
            )
        })
        .collect();
    let mut state = BTreeMap::new();
    for n in top_edges.keys() {
        if let Some(c) = visit(n, &top_edges, &mut state, &mut Vec::new()) {
            let names: Vec<String> = c.iter().map(|p| p.join("::")).collect();
            panic!(
                "import cycle between top-level modules: {}",
                names.join(" -> ")
            );
        }
    }
    for (m, ts) in &top {
        let lm = layer_of(m);
        for t in ts {
            let lt = layer_of(t);
            assert!(
                lt <= lm,
                "{m} (layer {lm}, {}) uses {t} (layer {lt}, {}), a higher layer",
                LAYERS[lm].0,
                LAYERS[lt].0
            );
        }
    }
    // The backend seam: the backend knows no model and nothing above it.
    for (m, ts) in &edges {
        if within(m, "backend") {
            for t in ts {
                assert!(
                    !["model", "runtime", "insight", "bench", "synth"]
                        .iter()
                        .any(|p| within(t, p)),
                    "the backend uses {}",
                    t.join("::")
                );
            }
        }
    }
}

/// ARCHITECTURE.md's layer table, bottom first: a top-level module may use modules of its
/// own layer or below (never in a cycle), none above.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "foundations",
        &["error", "limits", "units", "interrupt", "cache_dir"],
    ),
    ("block formats and tokenizers", &["blocks", "tokenizer"]),
    ("configs", &["config"]),
    ("GGUF files", &["gguf"]),
    ("checkpoints and formats", &["format"]),
    ("residency", &["residency"]),
    ("the backend seam", &["backend"]),
    ("the model on a device", &["model"]),
    ("runtime", &["runtime"]),
    (
        "commands' helpers and sessions",
        &["session", "insight", "synth", "cpu_ref", "loadtest"],
    ),
    ("planner, bench and server", &["planner", "bench", "serve"]),
    ("the command line", &["cli", "main"]),
];

fn layer_of(m: &str) -> usize {
    LAYERS
        .iter()
        .position(|(_, ms)| ms.contains(&m))
        .unwrap_or_else(|| panic!("src/{m}: a top-level module with no layer in tests/layering.rs's LAYERS (and ARCHITECTURE.md's table)"))
}

#[test]
fn every_top_level_module_has_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        let p = e.path();
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        if name != "lib" && (p.is_dir() || p.extension().is_some_and(|x| x == "rs")) {
            layer_of(&name);
        }
    }
}

/// Whether module `m` is `prefix` or inside it: `within(["format", "quant"], "format")`.
fn within(m: &[String], prefix: &str) -> bool {
    let p: Vec<&str> = prefix.split("::").collect();
    m.len() >= p.len() && m.iter().zip(&p).all(|(a, b)| a == b)
}

#[test]
fn no_wgpu_outside_the_wgpu_backend() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let allowed = root.join("src/backend/wgpu");
    let mut files = Vec::new();
    for d in ["src", "tests", "benches"] {
        rust_files(&root.join(d), &mut files);
    }
    let this = root.join("tests/layering.rs");
    for f in files
        .iter()
        .filter(|f| !f.starts_with(&allowed) && **f != this)
    {
        let text = code(&std::fs::read_to_string(f).unwrap());
        for (n, line) in text.lines().enumerate() {
            let mut s = line;
            while let Some(i) = s.find("wgpu::") {
                let before = &s[..i];
                // `backend::wgpu::...` names our own backend module, not the crate.
                if !before.ends_with("backend::") && !before.ends_with("self::") {
                    panic!(
                        "{}:{}: `{}` names wgpu outside src/backend/wgpu",
                        f.display(),
                        n + 1,
                        line.trim()
                    );
                }
                s = &s[i + 6..];
            }
        }
    }
}

/// One concept per file: no Rust source, shader or CUDA kernel file past 850 lines (the
/// ~800-line guideline, with a margin), so a file that outgrows its concept is split.
#[test]
fn no_source_file_is_over_850_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for d in ["src", "tests", "benches"] {
        rust_files(&root.join(d), &mut files);
    }
    for d in ["shaders", "shaders/common", "kernels/cuda"] {
        for e in std::fs::read_dir(root.join(d)).unwrap().flatten() {
            if e.path().is_file() {
                files.push(e.path());
            }
        }
    }
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).ok()?.lines().count();
            (n > 850).then(|| format!("{} ({n} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "files past 850 lines: {long:?}");
}

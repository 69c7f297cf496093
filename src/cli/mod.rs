//! The commands of the `wgmoe` binary (their arguments are in main.rs, bench's and
//! synth's in `bench_args.rs`), and what several of them share: the prompt from
//! `-p`/`-f`/stdin, the seed, output paths checked before any work, the note on a software
//! adapter.

pub mod bench;
pub mod bench_args;
pub mod chat;
pub mod gpu_args;
pub mod insight;
pub mod loadtest;
pub mod plan;
pub mod residency_args;
pub mod run;
pub mod serve;
pub mod tools;

use std::io::Read;
use std::path::{Path, PathBuf};

use wgmoe::backend::{BackendChoice, Device, DeviceInfo, DeviceRequest, DeviceType};
use wgmoe::config::ModelConfig;
use wgmoe::error::{Error, Result};
use wgmoe::runtime::engine::{DensePrecision, Engine, EngineOptions, ExpertPrecision};

use crate::LoadArgs;

/// The context `chat` and `serve` allocate when `--ctx-size` is not given, at most.
pub const DEFAULT_CTX: usize = 4096;

/// The KV cache positions of `chat`'s and `serve`'s `--ctx-size` (checked against the
/// model), or the default.
pub fn ctx_size(load: &LoadArgs, cfg: &ModelConfig, model: &Path) -> Result<usize> {
    Ok(given_ctx_size(load.ctx_size, cfg, model)?
        .unwrap_or(cfg.max_position_embeddings.min(DEFAULT_CTX)))
}

/// A `--ctx-size` given (`run`, `chat`, `serve`): at least 1, at most the model's
/// max_position_embeddings.
pub fn given_ctx_size(
    given: Option<usize>,
    cfg: &ModelConfig,
    model: &Path,
) -> Result<Option<usize>> {
    let max = cfg.max_position_embeddings;
    match given {
        None => Ok(None),
        Some(0) => Err(Error::option("--ctx-size", "must be at least 1")),
        Some(n) if n > max => Err(Error::option(
            "--ctx-size",
            format!(
                "{n} exceeds max_position_embeddings = {max} of {}",
                model.join("config.json").display()
            ),
        )),
        Some(n) => Ok(Some(n)),
    }
}

/// `Engine::open_host` with `--tokenizer FILE` in place of the model's own tokenizer.
pub fn open_host(
    model: &Path,
    tokenizer: Option<&Path>,
) -> Result<(
    ModelConfig,
    Option<wgmoe::config::GenerationConfig>,
    Option<wgmoe::tokenizer::Tokenizer>,
)> {
    let Some(file) = tokenizer else {
        return Engine::open_host(model);
    };
    // The model's own tokenizer is not built: it may be one wgmoe cannot build.
    let (cfg, gen) = Engine::open_config(model)?;
    let t = tokenizer_override(model, file)?;
    // Ids beyond the embedding rows would index past the model.
    if let Some(max) = t.max_id().filter(|&m| m as usize >= cfg.vocab_size) {
        return Err(Error::option(
            "--tokenizer",
            format!(
                "{} has token ids up to {max}, beyond the model's vocabulary of {}",
                file.display(),
                cfg.vocab_size
            ),
        ));
    }
    Ok((cfg, gen, Some(t)))
}

/// The tokenizer of `--tokenizer FILE` for `model`.
pub fn tokenizer_override(model: &Path, file: &Path) -> Result<wgmoe::tokenizer::Tokenizer> {
    if !file.is_file() {
        return Err(Error::option(
            "--tokenizer",
            format!("{}: no such file", file.display()),
        ));
    }
    wgmoe::gguf::tokenizer::override_for(model, file)
}

/// The engine of `chat` and `serve`, with a KV cache of `ctx` positions; says what it
/// loaded on stderr.
/// `score_rows`: logits rows a step returns (the server's prompt scoring; 0 for chat).
pub fn load_engine(
    model: &Path,
    load: &LoadArgs,
    ctx: usize,
    batch: usize,
    score_rows: usize,
) -> Result<Engine> {
    if load.prefill_chunk == 0 {
        return Err(Error::option("--prefill-chunk", "must be at least 1"));
    }
    let adapter = load.gpu.request()?;
    let tokenizer = match &load.tokenizer {
        Some(f) => Some(tokenizer_override(model, f)?),
        None => None,
    };
    let engine = Engine::load_with(
        model,
        &EngineOptions {
            residency: load.residency.options()?,
            adapter: adapter.clone(),
            kernels: load.gpu.kernels(),
            expert_precision: load.expert_precision,
            dense_precision: load.dense_precision,
            kv_precision: load.kv_precision,
            executor: load.executor,
            max_context: ctx,
            prefill_chunk: load.prefill_chunk,
            all_logits: false,
            score_rows,
            batch,
        },
        tokenizer,
    )
    .map_err(|e| match e {
        // Engine::load names `run`'s option for a context beyond the model's.
        Error::Option { option, msg } if option == "--max-new-tokens" => {
            Error::option("--ctx-size", msg)
        }
        e => e,
    })?;
    eprintln!(
        "loaded {} in {:.2}s on {} ({}, {}); context {ctx} positions",
        model.display(),
        engine.load_s,
        engine.dev.info().name,
        engine.dev.info().backend,
        engine.dev.info().driver_string()
    );
    software_note(&engine.dev, &adapter);
    gguf_note(model, load.expert_precision, load.dense_precision);
    for n in load
        .residency
        .unused_notes(engine.resident_experts, engine.cfg.num_experts)
    {
        eprintln!("note: {n}");
    }
    Ok(engine)
}

/// The prompt text of `-p TEXT`, `-p -` (stdin) or `-f FILE`; None when neither is given.
/// From stdin or a file one trailing newline is dropped (as llama.cpp does), since editors
/// and `echo` add one.
pub fn prompt_text(prompt: Option<&str>, file: Option<&Path>) -> Result<Option<String>> {
    let (text, what) = match (prompt, file) {
        (Some("-"), _) => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .map_err(|e| Error::io("<stdin>", e))?;
            (buf, PathBuf::from("<stdin>"))
        }
        (Some(t), _) => return Ok(Some(t.to_string())),
        (None, Some(f)) => (
            std::fs::read(f)
                .map_err(|e| Error::option("-f/--file", format!("{}: {e}", f.display())))?,
            f.to_path_buf(),
        ),
        (None, None) => return Ok(None),
    };
    let mut text = String::from_utf8(text).map_err(|e| {
        Error::bad_file(
            &what,
            format!(
                "the prompt is not UTF-8 text (byte {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    Ok(Some(text))
}

pub use wgmoe::runtime::sampling::random_seed;

/// An output file an option names must be writable before the command does any work: its
/// directory must exist and accept a new file, and the path must not be a directory.
pub fn check_output_file(option: &str, path: &Path) -> Result<()> {
    if path.is_dir() {
        return Err(Error::option(
            option,
            format!("{} is a directory; give a file name", path.display()),
        ));
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(Error::option(
            option,
            format!(
                "{}: the directory {} does not exist",
                path.display(),
                dir.display()
            ),
        ));
    }
    // Probe with a new file rather than trusting permission bits (read-only mounts, ACLs).
    let probe = dir.join(format!(".wgmoe-write-test-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
        }
        Err(e) => {
            return Err(Error::option(
                option,
                format!("{}: cannot write in {}: {e}", path.display(), dir.display()),
            ))
        }
    }
    if path.exists() {
        let ro = std::fs::metadata(path).is_ok_and(|m| m.permissions().readonly());
        let writable = !ro && std::fs::OpenOptions::new().append(true).open(path).is_ok();
        if !writable {
            return Err(Error::option(
                option,
                format!("{} exists and is not writable", path.display()),
            ));
        }
    }
    Ok(())
}

/// Write `bytes` to `path` through a temporary file in the same directory renamed into
/// place, so a reader never sees a half-written file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.wgmoe-tmp-{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

/// A report on stdout: pretty JSON with `--json`, else its text.
pub fn print_report<T: serde::Serialize>(
    json: bool,
    report: &T,
    text: impl FnOnce(&T) -> String,
) -> Result<()> {
    use std::io::Write;
    let s = if json {
        serde_json::to_string_pretty(report).map_err(|e| Error::Other(e.to_string()))?
    } else {
        text(report).trim_end().to_string()
    };
    let mut o = std::io::stdout().lock();
    writeln!(o, "{s}")
        .and_then(|_| o.flush())
        .map_err(crate::stdout_error)
}

/// The hint for a machine whose only adapter is a software one (`wgmoe devices` says it).
pub const SOFTWARE_HINT: &str = "for a GPU, install its Vulkan (Linux, Windows), DX12 (Windows) or Metal (macOS) driver; `wgmoe devices` lists the adapters wgmoe sees";

/// The one-line note of a command that runs on a software adapter it fell back to.
pub fn software_line(adapter: &str) -> String {
    format!(
        "note: no GPU found: running on {adapter}, a software adapter (slow; see `wgmoe devices`)"
    )
}

/// For a GGUF model, which of its tensors were decoded and stored anew at load time (the
/// block types wgmoe does not compute as they are), on stderr.
pub fn gguf_note(model: &Path, experts: ExpertPrecision, dense: DensePrecision) {
    if !wgmoe::gguf::is_gguf_path(model) {
        checkpoint_beside_gguf_note(model);
        return;
    }
    let Ok(g) = wgmoe::gguf::GgufModel::open_header(model) else {
        return;
    };
    let Ok(cfg) = wgmoe::gguf::model_config(&g) else {
        return;
    };
    eprintln!(
        "note: {}",
        wgmoe::insight::inspect::gguf_load_note(
            &g,
            &experts.apply(cfg),
            experts.int4(),
            dense == DensePrecision::Q8_0
        )
    );
}

/// A checkpoint directory that also holds GGUF files loads the checkpoint (config.json
/// wins, as `is_gguf_path` says): said on stderr, with how to load a GGUF instead, so the
/// choice is never silent (issue 39, 15).
fn checkpoint_beside_gguf_note(dir: &Path) {
    if !dir.is_dir() {
        return;
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut ggufs: Vec<String> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
        })
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    if ggufs.is_empty() {
        return;
    }
    ggufs.sort();
    eprintln!(
        "note: {} holds a Hugging Face checkpoint (config.json) and GGUF {} ({}): loading the checkpoint; give a .gguf file's path to load it instead",
        dir.display(),
        if ggufs.len() == 1 { "file" } else { "files" },
        ggufs.join(", ")
    );
}

/// Say so on stderr when the adapter is a software one (lavapipe, WARP...) that was picked
/// because no GPU was found (not asked for with --adapter).
pub fn software_note(dev: &Device, req: &DeviceRequest) {
    if dev.info().device_type == DeviceType::Cpu && req.adapter.is_none() {
        eprintln!("{}", software_line(&dev.info().name));
    }
}

/// `[0] name (vulkan), [1] name (gl)`: the adapters as `wgmoe devices` numbers them.
fn adapter_list(list: &[DeviceInfo]) -> String {
    list.iter()
        .enumerate()
        .map(|(i, a)| format!("[{i}] {} ({})", a.name, a.backend))
        .collect::<Vec<_>>()
        .join(", ")
}

fn backend_choice(name: &str) -> Option<BackendChoice> {
    use clap::ValueEnum;
    BackendChoice::value_variants()
        .iter()
        .copied()
        .find(|b| b.to_possible_value().is_some_and(|v| v.get_name() == name))
}

/// `--adapter INDEX|NAME` checked against the adapters there are: an index (as
/// `wgmoe devices` numbers them) becomes that adapter's backend and name; a name no
/// adapter contains is refused with the numbered list. Also the index `open` picks.
pub fn resolve_adapter(req: DeviceRequest) -> Result<(DeviceRequest, Option<usize>)> {
    let Some(wanted) = req.adapter.clone() else {
        let (_, pick) = Device::list(&req)?;
        return Ok((req, pick));
    };
    let (list, _) = Device::list(&DeviceRequest {
        adapter: None,
        ..req.clone()
    })?;
    if let Ok(i) = wanted.trim().parse::<usize>() {
        let Some(a) = list.get(i) else {
            return Err(Error::option(
                "--adapter",
                format!(
                    "there is no adapter [{i}]; {}",
                    if list.is_empty() {
                        "wgmoe finds none".to_string()
                    } else {
                        format!("there are {}", adapter_list(&list))
                    }
                ),
            ));
        };
        // The backend and the name single it out unless an earlier adapter of the same
        // backend matches that name too (two identical cards).
        let name = a.name.to_lowercase();
        if let Some(j) = list[..i]
            .iter()
            .position(|b| b.backend == a.backend && b.name.to_lowercase().contains(&name))
        {
            return Err(Error::option(
                "--adapter",
                format!(
                    "[{i}] cannot be singled out: wgmoe picks an adapter by backend and name, and [{j}] ({}, {}) matches {} too",
                    list[j].name, list[j].backend, a.name
                ),
            ));
        }
        let backend = backend_choice(&a.backend).or(req.backend);
        return Ok((
            DeviceRequest {
                backend,
                adapter: Some(a.name.clone()),
                ..req
            },
            Some(i),
        ));
    }
    let low = wanted.to_lowercase();
    match list
        .iter()
        .position(|a| a.name.to_lowercase().contains(&low))
    {
        Some(i) => Ok((req, Some(i))),
        None => Err(Error::option(
            "--adapter",
            format!(
                "no adapter name contains `{wanted}`; {} (give an index or part of a name)",
                if list.is_empty() {
                    "wgmoe finds no adapter".to_string()
                } else {
                    format!("there are {}", adapter_list(&list))
                }
            ),
        )),
    }
}

/// The device request of `--backend`/`--adapter`, resolved (see [`resolve_adapter`]).
pub fn adapter_request(req: DeviceRequest) -> Result<DeviceRequest> {
    if req.adapter.is_none() {
        return Ok(req);
    }
    resolve_adapter(req).map(|r| r.0)
}

/// Peak resident set size of this process (Linux: VmHWM), if the OS tells.
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

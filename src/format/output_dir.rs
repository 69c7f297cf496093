//! Output directories of `wgmoe quantize` and `wgmoe synth`: never a user's checkpoint.
//!
//! - The output and (for `quantize`) the input are resolved to canonical paths, symlinks
//!   followed (an output that does not exist yet is resolved through its nearest existing
//!   ancestor); the same directory, or one inside the other, is refused.
//! - An existing, non-empty output directory is refused unless it holds an earlier wgmoe
//!   output (recognised from what wgmoe writes: the `wgmoe.format` metadata of a converted
//!   `model.safetensors`, `wgmoe.synthetic` / `"wgmoe_synthetic": true` of `synth`, the
//!   `wgmoe.synthetic` key of a `synth --format gguf` file), or `--force` is given.
//! - A GGUF file that wgmoe did not write is never replaced or removed, `--force` or not:
//!   a directory holding one is refused (a model written next to it would make the
//!   directory hold two models).
//! - Every file is written under a temporary name in the output directory
//!   (`.NAME.wgmoe-tmp-PID`) and renamed into place only when every file is complete
//!   ([`OutputDir::commit`]); model files of an earlier output that the new one does not
//!   replace (old shards, an old index, a `chat_template.jinja`...) are removed after that,
//!   so the directory loads as the new model. On failure (or when dropped uncommitted) the
//!   temporaries are removed, and so is the directory if this command created it.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};

/// The option that names the output directory, in error messages.
const OPTION: &str = "-o/--out";
const TMP_MARK: &str = ".wgmoe-tmp-";

/// Which wgmoe command wrote an existing output directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Earlier {
    /// `wgmoe quantize`: `model.safetensors` with `wgmoe.format` metadata.
    Quantize,
    /// `wgmoe synth --format converted`: the same plus `wgmoe.synthetic` metadata.
    SynthConverted,
    /// `wgmoe synth --format hf`: `config.json` with `"wgmoe_synthetic": true`.
    SynthHf,
    /// `wgmoe synth --format gguf`: `model.gguf` with the `wgmoe.synthetic` key.
    SynthGguf,
}

impl Earlier {
    pub fn describe(self) -> &'static str {
        match self {
            Earlier::Quantize => {
                "an earlier `wgmoe quantize` conversion (model.safetensors has wgmoe.format metadata)"
            }
            Earlier::SynthConverted => {
                "an earlier `wgmoe synth` model (model.safetensors has wgmoe.synthetic metadata)"
            }
            Earlier::SynthHf => {
                "an earlier `wgmoe synth --format hf` model (config.json has \"wgmoe_synthetic\": true)"
            }
            Earlier::SynthGguf => {
                "an earlier `wgmoe synth --format gguf` model (model.gguf has wgmoe.synthetic metadata)"
            }
        }
    }
}

/// What an existing output directory holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Contents {
    Empty,
    Earlier(Earlier),
    /// Anything else: what it holds, in words.
    Foreign(String),
    /// GGUF files wgmoe did not write (their names): refused even with `--force`.
    UserGguf(Vec<String>),
}

struct Staged {
    tmp: PathBuf,
    name: String,
}

/// An output directory being written. See the module documentation.
pub struct OutputDir {
    dir: PathBuf,
    /// Directories this command created, outermost first (removed on failure).
    created: Vec<PathBuf>,
    staged: Vec<Staged>,
    committed: bool,
    contents: Contents,
}

/// Whether `name` is one of the files that make up a model directory (what `Checkpoint`,
/// `ModelConfig`, `GenerationConfig` and `Tokenizer` read), so that a stale copy would
/// change what loads.
pub fn is_model_file(name: &str) -> bool {
    const NAMED: [&str; 8] = [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "model.safetensors",
        "model.safetensors.index.json",
    ];
    NAMED.contains(&name) || is_shard(name)
}

fn is_weight_file(name: &str) -> bool {
    name == "model.safetensors" || name == "model.safetensors.index.json" || is_shard(name)
}

/// `model-00001-of-00003.safetensors` (the hub's shard names).
fn is_shard(name: &str) -> bool {
    name.starts_with("model-") && name.ends_with(".safetensors") && name.contains("-of-")
}

fn is_gguf(name: &str) -> bool {
    Path::new(name)
        .extension()
        .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
}

/// The GGUF metadata key `wgmoe synth --format gguf` writes (the seed, as a u64).
pub const GGUF_SYNTHETIC_KEY: &str = "wgmoe.synthetic";

/// Whether `path` is a GGUF file `wgmoe synth` wrote: its header has the
/// [`GGUF_SYNTHETIC_KEY`] key, or (files written before that key) a `general.name` of
/// `wgmoe synth ...`. Anything unreadable is not.
pub fn is_synth_gguf(path: &Path) -> bool {
    let Ok(f) = crate::gguf::GgufFile::open_header(path) else {
        return false;
    };
    let m = f.metadata();
    m.get(GGUF_SYNTHETIC_KEY).is_some()
        || matches!(m.get("general.name"), Some(crate::gguf::MetaValue::Str(s)) if s.starts_with("wgmoe synth "))
}

/// Temporaries of a wgmoe writer (this module's, and the `.partial` files of the stream
/// writer), left behind by a killed run.
fn is_temporary(name: &str) -> bool {
    name.contains(TMP_MARK) || (name.ends_with(".safetensors.partial") && name.starts_with("model"))
}

/// `path` made absolute and resolved: the canonical path of its nearest existing ancestor
/// (symlinks followed) joined with the rest, `.` and `..` in the rest resolved lexically
/// (those components do not exist, so no symlink can be among them).
pub fn resolve(path: &Path) -> Result<PathBuf> {
    let abs = std::path::absolute(path).map_err(|e| Error::io(path, e))?;
    let mut rest: Vec<Component> = Vec::new();
    let mut base = abs.as_path();
    loop {
        if base.symlink_metadata().is_ok() {
            break;
        }
        match (base.components().next_back(), base.parent()) {
            (Some(c), Some(parent)) => {
                rest.push(c);
                base = parent;
            }
            _ => break,
        }
    }
    let mut out = base.canonicalize().map_err(|e| Error::io(base, e))?;
    for c in rest.into_iter().rev() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    Ok(out)
}

/// The `__metadata__` of a safetensors file, read from its header alone; None when the
/// file is missing or its header is not a safetensors header.
fn safetensors_metadata(path: &Path) -> Option<HashMap<String, String>> {
    let mut f = std::fs::File::open(path).ok()?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).ok()?;
    let n = u64::from_le_bytes(len);
    // safetensors caps headers at 100 MB.
    if n > 100_000_000 {
        return None;
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&header).ok()?;
    let m = v.get("__metadata__")?.as_object()?;
    Some(
        m.iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect(),
    )
}

fn synthetic_config(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v.get("wgmoe_synthetic").and_then(|b| b.as_bool()))
        .unwrap_or(false)
}

/// What the existing directory `dir` holds (wgmoe's own temporaries do not count).
pub fn contents(dir: &Path) -> Result<Contents> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let e = e.map_err(|e| Error::io(dir, e))?;
        let name = e.file_name().to_string_lossy().to_string();
        if !is_temporary(&name) {
            names.push(name);
        }
    }
    names.sort();
    if names.is_empty() {
        return Ok(Contents::Empty);
    }
    let ggufs: Vec<&String> = names.iter().filter(|n| is_gguf(n)).collect();
    if !ggufs.is_empty() {
        let users: Vec<&String> = ggufs
            .iter()
            .copied()
            .filter(|n| !is_synth_gguf(&dir.join(n)))
            .collect();
        if !users.is_empty() {
            return Ok(Contents::UserGguf(
                users.iter().map(|n| n.to_string()).collect(),
            ));
        }
        // Only synth's own `model.gguf`, alone with no other model next to it.
        if ggufs.len() == 1 && *ggufs[0] == "model.gguf" && !names.iter().any(|n| is_weight_file(n))
        {
            return Ok(Contents::Earlier(Earlier::SynthGguf));
        }
    }
    let foreign = |names: Vec<String>| {
        let weights: Vec<&String> = names.iter().filter(|n| is_weight_file(n)).collect();
        let shards = weights.iter().filter(|n| is_shard(n)).count();
        if !weights.is_empty() {
            let mut parts: Vec<String> = weights
                .iter()
                .filter(|n| !is_shard(n))
                .map(|n| n.to_string())
                .collect();
            if shards > 0 {
                parts.push(format!("{shards} shards model-*-of-*.safetensors"));
            }
            return Contents::Foreign(format!(
                "a model that is not a wgmoe output ({})",
                parts.join(", ")
            ));
        }
        let n = names.len();
        let mut shown: Vec<String> = names.into_iter().take(3).collect();
        if n > 3 {
            shown.push(format!("... {n} entries in all"));
        }
        Contents::Foreign(shown.join(", "))
    };
    let weights: Vec<&String> = names
        .iter()
        .filter(|n| {
            *n == "model.safetensors" || *n == "model.safetensors.index.json" || is_shard(n)
        })
        .collect();
    let meta = safetensors_metadata(&dir.join("model.safetensors"));
    let converted = meta
        .as_ref()
        .and_then(|m| m.get("wgmoe.format"))
        .is_some_and(|f| f == crate::format::identity::FORMAT);
    if converted {
        // A converted model is one file; shards or an index next to it are someone else's.
        if weights.len() != 1 {
            return Ok(foreign(names));
        }
        let synthetic = meta
            .as_ref()
            .is_some_and(|m| m.contains_key("wgmoe.synthetic"));
        return Ok(Contents::Earlier(if synthetic {
            Earlier::SynthConverted
        } else {
            Earlier::Quantize
        }));
    }
    if synthetic_config(dir) && !weights.is_empty() {
        return Ok(Contents::Earlier(Earlier::SynthHf));
    }
    Ok(foreign(names))
}

impl OutputDir {
    /// Check `out` (and its relation to `input`, the model directory a command reads) and
    /// create it if needed. Nothing is written into an existing directory yet.
    pub fn prepare(out: &Path, input: Option<&Path>, force: bool) -> Result<Self> {
        let dir = resolve(out)?;
        if let Some(input) = input {
            let inp = input.canonicalize().map_err(|e| Error::io(input, e))?;
            let clash = if dir == inp {
                Some("is the input model directory")
            } else if dir.starts_with(&inp) {
                Some("is inside the input model directory")
            } else if inp.starts_with(&dir) {
                Some("contains the input model directory")
            } else {
                None
            };
            if let Some(what) = clash {
                return Err(Error::option(
                    OPTION,
                    format!(
                        "{} ({}) {what} {}; the output must be a separate directory (the input is never written)",
                        out.display(),
                        dir.display(),
                        inp.display()
                    ),
                ));
            }
        }
        let mut created = Vec::new();
        let contents = match std::fs::metadata(&dir) {
            Ok(m) if !m.is_dir() => {
                return Err(Error::option(
                    OPTION,
                    format!("{} exists and is not a directory", out.display()),
                ))
            }
            Ok(_) => contents(&dir)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut missing: Vec<&Path> = dir
                    .ancestors()
                    .take_while(|p| p.symlink_metadata().is_err())
                    .collect();
                missing.reverse();
                for d in missing {
                    if let Err(e) = std::fs::create_dir(d) {
                        remove_dirs(&created);
                        return Err(Error::io(d, e));
                    }
                    created.push(d.to_path_buf());
                }
                Contents::Empty
            }
            Err(e) => return Err(Error::io(&dir, e)),
        };
        if let Contents::UserGguf(files) = &contents {
            return Err(Error::option(
                OPTION,
                format!(
                    "{} holds a GGUF model that wgmoe did not write ({}); wgmoe never replaces or removes a GGUF file, even with --force: choose a new or empty directory, or move the file",
                    out.display(),
                    files.join(", ")
                ),
            ));
        }
        if let Contents::Foreign(what) = &contents {
            if !force {
                return Err(Error::option(
                    OPTION,
                    format!(
                        "{} is not empty and holds no earlier wgmoe output (it has {what}); choose a new or empty directory, or pass --force to replace the model files there",
                        out.display(),
                    ),
                ));
            }
        }
        Ok(OutputDir {
            dir,
            created,
            staged: Vec::new(),
            committed: false,
            contents,
        })
    }

    /// The resolved output directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// What the directory held before this command.
    pub fn contents(&self) -> &Contents {
        &self.contents
    }

    /// The earlier wgmoe output this one replaces, if any.
    pub fn replaces(&self) -> Option<Earlier> {
        match self.contents {
            Contents::Earlier(e) => Some(e),
            _ => None,
        }
    }

    /// A temporary path in the directory for the file `name`, renamed to `name` by
    /// `commit`. Write it completely (a `.partial` next to it is cleaned up as well).
    pub fn stage(&mut self, name: &str) -> PathBuf {
        let tmp = self
            .dir
            .join(format!(".{name}{TMP_MARK}{}", std::process::id()));
        self.staged.retain(|s| s.name != name);
        self.staged.push(Staged {
            tmp: tmp.clone(),
            name: name.to_string(),
        });
        tmp
    }

    /// Stage `bytes` as the file `name`.
    pub fn write(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let tmp = self.stage(name);
        write_synced(&tmp, bytes)
    }

    /// Stage a copy of `src` as the file `name`.
    pub fn copy(&mut self, src: &Path, name: &str) -> Result<()> {
        let tmp = self.stage(name);
        std::fs::copy(src, &tmp).map_err(|e| Error::io(src, e))?;
        let f = std::fs::File::open(&tmp).map_err(|e| Error::io(&tmp, e))?;
        f.sync_all().map_err(|e| Error::io(&tmp, e))
    }

    /// Rename every staged file into place, then remove the model files an earlier output
    /// left that the new one does not replace, and wgmoe temporaries of earlier runs.
    pub fn commit(mut self) -> Result<()> {
        for s in &self.staged {
            if !s.tmp.is_file() {
                return Err(Error::Other(format!(
                    "internal: {} was staged but not written",
                    s.name
                )));
            }
        }
        let staged = std::mem::take(&mut self.staged);
        for (k, s) in staged.iter().enumerate() {
            let dst = self.dir.join(&s.name);
            if let Err(e) = std::fs::rename(&s.tmp, &dst) {
                // Keep the remaining temporaries' cleanup.
                self.staged = staged.into_iter().skip(k).collect();
                return Err(Error::io(dst, e));
            }
        }
        self.committed = true;
        let new: Vec<&str> = staged.iter().map(|s| s.name.as_str()).collect();
        let rd = std::fs::read_dir(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let replaced = !new.contains(&name.as_str());
            // A GGUF only when synth wrote it (prepare refused any other; checked again).
            let stale = (replaced && is_model_file(&name))
                || (replaced && is_gguf(&name) && is_synth_gguf(&e.path()))
                || is_temporary(&name);
            if stale && e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()) {
                std::fs::remove_file(e.path()).map_err(|err| Error::io(e.path(), err))?;
            }
        }
        if let Ok(d) = std::fs::File::open(&self.dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

impl Drop for OutputDir {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        for s in &self.staged {
            let _ = std::fs::remove_file(&s.tmp);
            let mut partial = s.tmp.as_os_str().to_owned();
            partial.push(".partial");
            let _ = std::fs::remove_file(PathBuf::from(partial));
        }
        remove_dirs(&self.created);
    }
}

/// Remove the directories this command created, innermost first, if empty.
fn remove_dirs(created: &[PathBuf]) {
    for d in created.iter().rev() {
        if std::fs::remove_dir(d).is_err() {
            break;
        }
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    f.write_all(bytes).map_err(|e| Error::io(path, e))?;
    f.sync_all().map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_goes_through_the_nearest_existing_ancestor() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().canonicalize().unwrap();
        std::fs::create_dir(base.join("a")).unwrap();
        assert_eq!(
            resolve(&base.join("a/x/../y/./z")).unwrap(),
            base.join("a/y/z")
        );
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(base.join("a"), base.join("link")).unwrap();
            assert_eq!(resolve(&base.join("link/new")).unwrap(), base.join("a/new"));
            assert_eq!(resolve(&base.join("link")).unwrap(), base.join("a"));
        }
    }

    #[test]
    fn model_files_and_temporaries() {
        for n in [
            "model.safetensors",
            "model-00002-of-00003.safetensors",
            "chat_template.jinja",
        ] {
            assert!(is_model_file(n), "{n}");
        }
        for n in ["notes.txt", "model.gguf", "model-a.safetensors"] {
            assert!(!is_model_file(n), "{n}");
        }
        assert!(is_temporary(".model.safetensors.wgmoe-tmp-12"));
        assert!(is_temporary("model.safetensors.partial"));
        assert!(!is_temporary("model.safetensors"));
    }

    #[test]
    fn failed_output_leaves_no_directory() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("new/deeper");
        {
            let mut o = OutputDir::prepare(&out, None, false).unwrap();
            o.write("config.json", b"{}").unwrap();
            assert!(out.is_dir());
        }
        assert!(!t.path().join("new").exists());
        let mut o = OutputDir::prepare(&out, None, false).unwrap();
        o.write("config.json", b"{}").unwrap();
        o.commit().unwrap();
        assert_eq!(std::fs::read(out.join("config.json")).unwrap(), b"{}");
        let names: Vec<_> = std::fs::read_dir(&out).unwrap().collect();
        assert_eq!(names.len(), 1, "only config.json remains");
    }
}

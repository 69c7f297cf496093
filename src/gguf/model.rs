//! A GGUF model: one file, the shards of a split (`NAME-00001-of-0000N.gguf`), or a
//! directory holding exactly one of those; tensors looked up by name across the shards.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::file::{Extent, GgufFile, TensorInfo};
use super::meta::Metadata;
use super::types::GgmlType;
use crate::error::{Error, Result};

/// A GGUF model's files, mapped and validated.
pub struct GgufModel {
    shards: Vec<GgufFile>,
    /// Tensor name -> (shard, index in that shard's infos).
    index: BTreeMap<String, (usize, usize)>,
}

/// One tensor of a GGUF model: its type, shape and bytes (borrowed from the mapping).
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub ggml_type: GgmlType,
    /// ggml `ne`, fastest-varying first.
    pub ne: &'a [u64],
    pub data: &'a [u8],
    /// The shard file holding it, and the data's absolute offset in that file.
    pub file: &'a Path,
    pub file_offset: u64,
}

impl<'a> TensorView<'a> {
    /// Elements per row (`ne[0]`).
    pub fn cols(&self) -> u64 {
        self.ne[0]
    }

    /// Rows of the matrix (`ne[1]`, 1 for a vector); for a 3-D tensor, rows per expert.
    pub fn rows(&self) -> u64 {
        self.ne.get(1).copied().unwrap_or(1)
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> u64 {
        // Whole blocks per row were checked when the file was opened.
        self.ggml_type.row_bytes(self.ne[0]).unwrap_or(0)
    }

    /// Refuses a type wgmoe cannot compute with, naming the type and the tensor.
    pub fn require_supported(&self) -> Result<()> {
        if self.ggml_type.is_supported() {
            return Ok(());
        }
        Err(Error::BadTensor {
            path: self.file.to_path_buf(),
            name: self.name.to_string(),
            msg: format!(
                "tensor type {} is not supported (supported: {})",
                self.ggml_type,
                GgmlType::SUPPORTED
                    .iter()
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
    }

    /// Number of experts of a 3-D expert tensor (`ne[2]`).
    pub fn n_experts(&self) -> u64 {
        self.ne.get(2).copied().unwrap_or(1)
    }

    /// Expert `e` of a 3-D tensor `{cols, rows, n_expert}`: its `rows x cols` matrix, one
    /// contiguous slice of the tensor's bytes.
    pub fn expert(&self, e: usize) -> Result<TensorView<'a>> {
        if self.ne.len() != 3 {
            return Err(self.bad(format!("is not a 3-D expert tensor (shape {:?})", self.ne)));
        }
        if e as u64 >= self.ne[2] {
            return Err(self.bad(format!(
                "expert {e} is out of range ({} experts)",
                self.ne[2]
            )));
        }
        let per = (self.data.len() as u64 / self.ne[2]) as usize;
        Ok(TensorView {
            name: self.name,
            ggml_type: self.ggml_type,
            ne: &self.ne[..2],
            data: &self.data[e * per..(e + 1) * per],
            file: self.file,
            file_offset: self.file_offset + (e * per) as u64,
        })
    }

    /// The tensor dequantised to f32, in ggml element order (row-major `[rows][cols]`).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        self.require_supported()?;
        super::dequant::dequantize(self.ggml_type, self.data).map_err(|msg| self.bad(msg))
    }

    pub(crate) fn bad(&self, msg: impl Into<String>) -> Error {
        Error::BadTensor {
            path: self.file.to_path_buf(),
            name: self.name.to_string(),
            msg: msg.into(),
        }
    }
}

const SPLIT_NO: &str = "split.no";
const SPLIT_COUNT: &str = "split.count";
const SPLIT_TENSORS: &str = "split.tensors.count";

impl GgufModel {
    /// Opens a `.gguf` file, a split (any shard's path; every shard is opened), or a
    /// directory holding exactly one GGUF model.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_as(path, Extent::Whole)
    }

    /// `open` for what reads only the headers (`plan`, `inspect`): each shard's metadata
    /// and tensor infos are validated, but its data need not be in the file
    /// (`GgufFile::open_header`). Such a model's tensors have empty data.
    pub fn open_header(path: &Path) -> Result<Self> {
        Self::open_as(path, Extent::HeaderOnly)
    }

    fn open_as(path: &Path, extent: Extent) -> Result<Self> {
        let file = if path.is_dir() {
            single_gguf_in_dir(path)?
        } else {
            path.to_path_buf()
        };
        let (first, count) = match split_name(&file) {
            Some((prefix, _, count)) => (shard_path(&prefix, 1, count), count),
            None => (file.clone(), 1),
        };
        let head = GgufFile::open_as(&first, extent)?;
        let declared = head.metadata().opt_u64(SPLIT_COUNT)?.unwrap_or(1);
        if declared != count as u64 && !(count == 1 && declared <= 1) {
            return Err(Error::field(
                &first,
                SPLIT_COUNT,
                format!("{declared} shards declared, but the file name says {count}"),
            ));
        }
        let mut shards = vec![head];
        if count > 1 {
            let (prefix, _, _) = split_name(&first).unwrap_or_default();
            for no in 2..=count {
                let p = shard_path(&prefix, no, count);
                if !p.is_file() {
                    return Err(Error::bad_file(
                        &p,
                        format!("shard {no} of {count} of the split is missing"),
                    ));
                }
                let shard = GgufFile::open_as(&p, extent)?;
                let m = shard.metadata();
                let got_no = m.opt_u64(SPLIT_NO)?;
                if got_no != Some(no as u64 - 1) {
                    return Err(Error::field(
                        &p,
                        SPLIT_NO,
                        format!(
                            "{got_no:?}: this is not shard {no} of the split (split.no counts from 0)"
                        ),
                    ));
                }
                if m.opt_u64(SPLIT_COUNT)? != Some(count as u64) {
                    return Err(Error::field(
                        &p,
                        SPLIT_COUNT,
                        format!("does not say {count} like the first shard"),
                    ));
                }
                shards.push(shard);
            }
        }
        let mut index = BTreeMap::new();
        for (s, shard) in shards.iter().enumerate() {
            for (i, t) in shard.tensors().iter().enumerate() {
                if let Some((prev, _)) = index.insert(t.name.clone(), (s, i)) {
                    return Err(Error::BadTensor {
                        path: shard.path().to_path_buf(),
                        name: t.name.clone(),
                        msg: format!("also in {}", shards[prev].path().display()),
                    });
                }
            }
        }
        if let Some(n) = shards[0].metadata().opt_u64(SPLIT_TENSORS)? {
            if n != index.len() as u64 {
                return Err(Error::field(
                    shards[0].path(),
                    SPLIT_TENSORS,
                    format!("{n} tensors declared, the shards hold {}", index.len()),
                ));
            }
        }
        Ok(GgufModel { shards, index })
    }

    /// Whether it was opened with `open_header` (its tensors' data may be absent).
    pub fn is_header_only(&self) -> bool {
        self.shards[0].is_header_only()
    }

    /// The first (or only) file.
    pub fn path(&self) -> &Path {
        self.shards[0].path()
    }

    pub fn shards(&self) -> &[GgufFile] {
        &self.shards
    }

    /// The model's metadata (the first shard's: later shards carry only the split keys).
    pub fn metadata(&self) -> &Metadata {
        self.shards[0].metadata()
    }

    /// Tensor names in name order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.index
            .get(name)
            .map(|&(s, i)| &self.shards[s].tensors()[i])
    }

    /// A tensor's type, shape and bytes; an error naming the tensor when it is absent.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        let &(s, i) = self.index.get(name).ok_or_else(|| Error::MissingTensor {
            dir: self.path().to_path_buf(),
            name: name.to_string(),
        })?;
        let shard = &self.shards[s];
        let t = &shard.tensors()[i];
        Ok(TensorView {
            name: &t.name,
            ggml_type: t.ggml_type,
            ne: &t.ne,
            data: shard.data(t),
            file: shard.path(),
            file_offset: shard.data_offset() + t.offset,
        })
    }

    /// Total bytes of the files.
    pub fn file_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.len()).sum()
    }
}

/// `NAME-00001-of-00003.gguf` -> ("DIR/NAME", 1, 3).
pub fn split_name(path: &Path) -> Option<(String, usize, usize)> {
    let s = path.to_str()?;
    let stem = s.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let five = |t: &str| t.len() == 5 && t.bytes().all(|b| b.is_ascii_digit());
    if !five(no) || !five(count) {
        return None;
    }
    let (no, count): (usize, usize) = (no.parse().ok()?, count.parse().ok()?);
    (no >= 1 && no <= count).then(|| (prefix.to_string(), no, count))
}

/// llama.cpp's `llama_split_path`: `%s-%05d-of-%05d.gguf` (shard numbers from 1).
pub fn shard_path(prefix: &str, no: usize, count: usize) -> PathBuf {
    PathBuf::from(format!("{prefix}-{no:05}-of-{count:05}.gguf"))
}

/// The one GGUF model in `dir`: a single `.gguf`, or the shards of one split.
fn single_gguf_in_dir(dir: &Path) -> Result<PathBuf> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut files = Vec::new();
    for e in rd {
        let e = e.map_err(|e| Error::io(dir, e))?;
        let p = e.path();
        if p.is_file()
            && p.extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
        {
            files.push(p);
        }
    }
    files.sort();
    let sets: std::collections::BTreeSet<String> = files
        .iter()
        .map(|p| match split_name(p) {
            Some((prefix, _, count)) => format!("{prefix} (split of {count})"),
            None => p.display().to_string(),
        })
        .collect();
    match (files.first(), sets.len()) {
        (None, _) => Err(Error::bad_file(dir, "no .gguf file in this directory")),
        (Some(first), 1) => Ok(first.clone()),
        _ => Err(Error::bad_file(
            dir,
            format!(
                "holds {} GGUF models ({}); give the file to use",
                sets.len(),
                sets.iter()
                    .map(|s| s.rsplit('/').next().unwrap_or(s).to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// Whether `path` names a GGUF model: a `.gguf` file, or a directory with a `.gguf` file
/// and no config.json (a Hugging Face checkpoint directory wins).
pub fn is_gguf_path(path: &Path) -> bool {
    if path.is_dir() {
        if path.join("config.json").is_file() {
            return false;
        }
        return std::fs::read_dir(path).is_ok_and(|rd| {
            rd.flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "gguf"))
        });
    }
    path.extension()
        .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
        || std::fs::File::open(path).is_ok_and(|mut f| {
            let mut m = [0u8; 4];
            std::io::Read::read_exact(&mut f, &mut m).is_ok() && &m == super::file::GGUF_MAGIC
        })
}

impl std::fmt::Debug for GgufModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufModel")
            .field("path", &self.path())
            .field("shards", &self.shards.len())
            .field("tensors", &self.index.len())
            .finish()
    }
}

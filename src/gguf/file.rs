//! One GGUF file, memory-mapped and validated before anything reads a tensor.
//!
//! Layout (ggml/src/gguf.cpp, versions 2 and 3; 3 only adds big-endian files, which are
//! refused): magic "GGUF", u32 version, u64 tensor count, u64 KV count, the KV pairs
//! (u64-length string key, u32 type, value), the tensor infos (name, u32 n_dims, n_dims u64
//! extents `ne` fastest first, u32 type, u64 offset), padding to `general.alignment`
//! (default 32), then the data; each tensor's offset is relative to the data start.
//!
//! Checked here, each failure naming the file and the key or tensor: magic, version, counts
//! against the bytes left, duplicate keys and tensor names, the alignment key's type and
//! value, every tensor's dimensions, type id, whole blocks per row, alignment, extent within
//! the file, and that no two tensors overlap.

use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::meta::{value_type as vt, MetaArray, MetaValue, Metadata};
use super::types::GgmlType;
use crate::error::{Error, Result};

pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's limits: `GGML_MAX_DIMS`, `GGML_MAX_NAME` (including the terminating NUL).
pub const MAX_DIMS: usize = 4;
pub const MAX_NAME: usize = 64;

/// A tensor as its info describes it, validated against the file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub ggml_type: GgmlType,
    /// ggml's `ne`: extents, fastest-varying first (a matrix of `rows` rows of `cols`
    /// elements is `[cols, rows]`).
    pub ne: Vec<u64>,
    /// Offset from the start of the data section.
    pub offset: u64,
    pub nbytes: u64,
}

impl TensorInfo {
    pub fn elements(&self) -> u64 {
        self.ne.iter().product()
    }
}

/// A parsed GGUF file and its mapping.
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_offset: u64,
    /// Bytes of the KV section (the identity of the model's metadata).
    kv_range: Range<usize>,
    /// Opened for its header only (`open_header`): the tensors' data need not be there.
    header_only: bool,
}

/// What `parse` checks the tensors' data extents against.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Extent {
    /// The data must lie in the file.
    Whole,
    /// Only the header is needed (and perhaps present): offsets, alignment and overlaps are
    /// checked, the file's length is not.
    HeaderOnly,
}

impl GgufFile {
    /// Maps and validates `path`.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_as(path, Extent::Whole)
    }

    /// Maps and validates `path`'s header (metadata and tensor infos) for what needs no
    /// weights (`plan`, `inspect`): a header-only file, such as the first bytes of a large
    /// download, is accepted. Its tensors' data reads as empty.
    pub fn open_header(path: &Path) -> Result<Self> {
        Self::open_as(path, Extent::HeaderOnly)
    }

    pub(super) fn open_as(path: &Path, extent: Extent) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the mapping is read-only; a file changed by another process while mapped
        // is outside the contract (as for safetensors checkpoints in checkpoint.rs).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let parsed = parse(path, &map, extent)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            map,
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            kv_range: parsed.kv_range,
            header_only: extent == Extent::HeaderOnly,
        })
    }

    /// Whether it was opened with `open_header`.
    pub fn is_header_only(&self) -> bool {
        self.header_only
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn version(&self) -> u32 {
        self.version
    }
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
    pub fn alignment(&self) -> u64 {
        self.alignment
    }
    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    /// The raw KV section.
    pub fn kv_bytes(&self) -> &[u8] {
        &self.map[self.kv_range.clone()]
    }

    /// The bytes of tensor `t` (validated at open: in bounds); empty for a header-only
    /// file when they are not all there.
    pub fn data(&self, t: &TensorInfo) -> &[u8] {
        // Checked: a header-only file's offsets are not bounded by its length.
        let start = usize::try_from(self.data_offset.saturating_add(t.offset)).ok();
        let end = start.and_then(|s| s.checked_add(usize::try_from(t.nbytes).ok()?));
        match (start, end) {
            (Some(s), Some(e)) => self.map.get(s..e).unwrap_or_default(),
            _ => &[],
        }
    }
}

pub(super) struct Parsed {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
    pub kv_range: Range<usize>,
}

/// A cursor over the file's bytes whose errors say what was being read.
struct Reader<'a> {
    path: &'a Path,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.left() {
            return Err(Error::bad_file(
                self.path,
                format!(
                    "truncated: {} needs {n} bytes at offset {} but the file ends at {}",
                    what(),
                    self.pos,
                    self.buf.len()
                ),
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let n = self.u64(what)?;
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.left())
            .ok_or_else(|| {
                Error::bad_file(
                    self.path,
                    format!(
                        "truncated or corrupt: {} has length {n} but only {} bytes are left",
                        what(),
                        self.left()
                    ),
                )
            })?;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| Error::bad_file(self.path, format!("{} is not valid UTF-8", what())))
    }

    /// One value of type `t`; `in_array` refuses nested arrays.
    fn value(&mut self, t: u32, key: &str, in_array: bool) -> Result<MetaValue> {
        let what = || format!("the value of key `{key}`");
        Ok(match t {
            vt::U8 => MetaValue::U8(self.take(1, &what)?[0]),
            vt::I8 => MetaValue::I8(self.take(1, &what)?[0] as i8),
            vt::U16 => {
                let b = self.take(2, &what)?;
                MetaValue::U16(u16::from_le_bytes([b[0], b[1]]))
            }
            vt::I16 => {
                let b = self.take(2, &what)?;
                MetaValue::I16(i16::from_le_bytes([b[0], b[1]]))
            }
            vt::U32 => MetaValue::U32(self.u32(&what)?),
            vt::I32 => MetaValue::I32(self.u32(&what)? as i32),
            vt::F32 => MetaValue::F32(f32::from_bits(self.u32(&what)?)),
            vt::BOOL => match self.take(1, &what)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => {
                    return Err(Error::field(
                        self.path,
                        key,
                        format!("bool value {b} is neither 0 nor 1"),
                    ))
                }
            },
            vt::STRING => MetaValue::Str(self.string(&what)?),
            vt::U64 => MetaValue::U64(self.u64(&what)?),
            vt::I64 => MetaValue::I64(self.u64(&what)? as i64),
            vt::F64 => MetaValue::F64(f64::from_bits(self.u64(&what)?)),
            vt::ARRAY if in_array => {
                return Err(Error::field(
                    self.path,
                    key,
                    "nested arrays are not valid GGUF",
                ))
            }
            vt::ARRAY => {
                let elem_type = self.u32(&what)?;
                let n = self.u64(&what)?;
                // Every element takes at least one byte: a count beyond the bytes left is a
                // corrupt file, refused before anything is allocated for it.
                if n > self.left() as u64 {
                    return Err(Error::field(
                        self.path,
                        key,
                        format!(
                            "array of {n} elements cannot fit in the {} bytes left (truncated or corrupt file)",
                            self.left()
                        ),
                    ));
                }
                if elem_type > vt::F64 {
                    return Err(Error::field(
                        self.path,
                        key,
                        format!("array element type {elem_type} is not a GGUF type"),
                    ));
                }
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem_type, key, true)?);
                }
                MetaValue::Array(MetaArray { elem_type, items })
            }
            other => {
                return Err(Error::field(
                    self.path,
                    key,
                    format!("value type {other} is not a GGUF type"),
                ))
            }
        })
    }
}

pub(super) fn parse(path: &Path, buf: &[u8], extent: Extent) -> Result<Parsed> {
    let mut r = Reader { path, buf, pos: 0 };
    let magic = r.take(4, &|| "the magic".into())?;
    if magic != GGUF_MAGIC {
        return Err(Error::bad_file(
            path,
            format!("not a GGUF file (magic {magic:02x?}, expected \"GGUF\")"),
        ));
    }
    let version = r.u32(&|| "the version".into())?;
    match version {
        2 | 3 => {}
        1 => return Err(Error::bad_file(
            path,
            "GGUF version 1 is not supported (convert the model again with a current llama.cpp)",
        )),
        v if v & 0xffff == 0 && v != 0 => {
            return Err(Error::bad_file(
                path,
                format!("GGUF version {v:#x}: a big-endian file, which is not supported"),
            ))
        }
        v => {
            return Err(Error::bad_file(
                path,
                format!("GGUF version {v} is not supported (versions 2 and 3 are)"),
            ))
        }
    }
    let n_tensors = r.u64(&|| "the tensor count".into())?;
    let n_kv = r.u64(&|| "the metadata count".into())?;
    // Every KV pair and tensor info takes more than a byte: counts beyond the bytes left are
    // a corrupt header, refused before anything is sized by them.
    if n_kv > r.left() as u64 || n_tensors > r.left() as u64 {
        return Err(Error::bad_file(
            path,
            format!(
                "{n_tensors} tensors and {n_kv} metadata keys cannot fit in a file of {} bytes (truncated or corrupt)",
                buf.len()
            ),
        ));
    }

    let kv_start = r.pos;
    let mut entries: Vec<(String, MetaValue)> = Vec::with_capacity(n_kv.min(4096) as usize);
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..n_kv {
        let key = r.string(&|| format!("metadata key {i}"))?;
        if key.is_empty() {
            return Err(Error::bad_file(path, format!("metadata key {i} is empty")));
        }
        if !seen.insert(key.clone()) {
            return Err(Error::field(path, &key, "appears twice in the metadata"));
        }
        let t = r.u32(&|| format!("the type of key `{key}`"))?;
        let v = r.value(t, &key, false)?;
        entries.push((key, v));
    }
    let kv_range = kv_start..r.pos;
    let metadata = Metadata::new(path, entries);

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(MetaValue::U32(a)) if *a != 0 && a.is_power_of_two() => u64::from(*a),
        Some(MetaValue::U32(a)) => {
            return Err(Error::field(
                path,
                "general.alignment",
                format!("{a} is not a power of two"),
            ))
        }
        Some(v) => {
            return Err(Error::field(
                path,
                "general.alignment",
                format!("must be a u32, found {}", v.type_name()),
            ))
        }
    };

    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors.min(4096) as usize);
    let mut names = std::collections::BTreeSet::new();
    for i in 0..n_tensors {
        let name = r.string(&|| format!("the name of tensor {i}"))?;
        if name.len() >= MAX_NAME {
            return Err(Error::bad_file(
                path,
                format!(
                    "tensor {i} `{name}`: name of {} bytes exceeds ggml's {} ",
                    name.len(),
                    MAX_NAME - 1
                ),
            ));
        }
        if !names.insert(name.clone()) {
            return Err(bad_tensor(path, &name, "appears twice in the file"));
        }
        let what_t = || format!("the info of tensor `{name}`");
        let n_dims = r.u32(&what_t)? as usize;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(bad_tensor(
                path,
                &name,
                format!("{n_dims} dimensions (ggml allows 1 to {MAX_DIMS})"),
            ));
        }
        let mut ne = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            let d = r.u64(&what_t)?;
            if d > i64::MAX as u64 {
                return Err(bad_tensor(path, &name, format!("extent {d} is negative")));
            }
            ne.push(d);
        }
        let type_id = r.u32(&what_t)?;
        let offset = r.u64(&what_t)?;
        let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| {
            bad_tensor(
                path,
                &name,
                format!("tensor type id {type_id} is not a ggml type"),
            )
        })?;
        let elems = ne
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| bad_tensor(path, &name, format!("shape {ne:?} overflows")))?;
        let row = ggml_type.row_bytes(ne[0]).ok_or_else(|| {
            bad_tensor(
                path,
                &name,
                format!(
                    "{} elements per row is not a whole number of {} blocks of {}",
                    ne[0],
                    ggml_type,
                    ggml_type.block_elems()
                ),
            )
        })?;
        let nbytes = match elems.checked_div(ne[0]) {
            None => 0,
            Some(rows) => row
                .checked_mul(rows)
                .ok_or_else(|| bad_tensor(path, &name, format!("shape {ne:?} overflows")))?,
        };
        tensors.push(TensorInfo {
            name,
            ggml_type,
            ne,
            offset,
            nbytes,
        });
    }

    let data_offset = align_up(r.pos as u64, alignment);
    let whole = extent == Extent::Whole;
    if whole && data_offset > buf.len() as u64 && !tensors.is_empty() {
        return Err(Error::bad_file(
            path,
            format!(
                "truncated: the data section would start at {data_offset} but the file ends at {}",
                buf.len()
            ),
        ));
    }
    let file_len = buf.len() as u64;
    for t in &tensors {
        if t.offset % alignment != 0 {
            return Err(bad_tensor(
                path,
                &t.name,
                format!(
                    "offset {} is not a multiple of the alignment {alignment}",
                    t.offset
                ),
            ));
        }
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.nbytes));
        match end {
            Some(end) if end <= file_len || !whole => {}
            _ => {
                return Err(bad_tensor(
                    path,
                    &t.name,
                    format!(
                        "data [{}, {}+{}) runs past the end of the file ({file_len} bytes): truncated file?",
                        data_offset.saturating_add(t.offset),
                        data_offset.saturating_add(t.offset),
                        t.nbytes
                    ),
                ))
            }
        }
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.nbytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    for w in order.windows(2) {
        if w[0].offset + w[0].nbytes > w[1].offset {
            return Err(bad_tensor(
                path,
                &w[1].name,
                format!(
                    "data at offset {} overlaps tensor `{}` (offset {}, {} bytes)",
                    w[1].offset, w[0].name, w[0].offset, w[0].nbytes
                ),
            ));
        }
    }
    Ok(Parsed {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
        kv_range,
    })
}

pub fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

fn bad_tensor(path: &Path, name: &str, msg: impl Into<String>) -> Error {
    Error::BadTensor {
        path: path.to_path_buf(),
        name: name.to_string(),
        msg: msg.into(),
    }
}

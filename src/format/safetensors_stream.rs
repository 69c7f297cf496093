//! A safetensors file written tensor by tensor in a fixed plan, streaming (`wgmoe quantize`
//! and `wgmoe synth`): no tensor, let alone the model, is held in memory whole.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use crate::error::{Error, Result};

/// One tensor of a safetensors file written by `SafetensorsStream`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedTensor {
    pub name: String,
    /// safetensors dtype name: "F16", "BF16", "F32", "U8".
    pub dtype: &'static str,
    pub shape: Vec<usize>,
    pub bytes: usize,
}

impl PlannedTensor {
    pub fn new(name: impl Into<String>, dtype: &'static str, shape: Vec<usize>) -> Self {
        let size = match dtype {
            "F32" | "I32" | "U32" => 4,
            "F16" | "BF16" | "I16" | "U16" => 2,
            "F64" | "I64" | "U64" => 8,
            _ => 1,
        };
        let bytes = shape.iter().product::<usize>() * size;
        PlannedTensor {
            name: name.into(),
            dtype,
            shape,
            bytes,
        }
    }
}

/// A safetensors file written tensor by tensor, in the order of a plan fixed up front, so
/// no tensor (let alone the model) needs to be held in memory whole: a tensor's bytes may
/// be given in any number of pieces. The file is written as `NAME.partial` and renamed when
/// complete. Metadata values may change before `finish` as long as the header keeps its
/// length (use fixed-width placeholders, e.g. for checksums known only at the end).
pub struct SafetensorsStream {
    pub(crate) out_file: std::path::PathBuf,
    tmp_file: std::path::PathBuf,
    plan: Vec<PlannedTensor>,
    meta: BTreeMap<String, String>,
    header_len: usize,
    file: std::io::BufWriter<File>,
    cur: usize,
    cur_written: usize,
    written: u64,
}

fn safetensors_header(meta: &BTreeMap<String, String>, plan: &[PlannedTensor]) -> Vec<u8> {
    let mut obj = serde_json::Map::new();
    if !meta.is_empty() {
        obj.insert(
            "__metadata__".into(),
            serde_json::to_value(meta).unwrap_or_default(),
        );
    }
    let mut off = 0usize;
    for p in plan {
        obj.insert(p.name.clone(), serde_json::json!({"dtype": p.dtype, "shape": p.shape, "data_offsets": [off, off + p.bytes]}));
        off += p.bytes;
    }
    let mut h = serde_json::Value::Object(obj).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    h
}

impl SafetensorsStream {
    pub fn create(
        out_file: &Path,
        plan: Vec<PlannedTensor>,
        meta: BTreeMap<String, String>,
    ) -> Result<Self> {
        let mut names = std::collections::HashSet::new();
        if let Some(p) = plan.iter().find(|p| !names.insert(p.name.as_str())) {
            return Err(Error::Other(format!(
                "internal: tensor `{}` planned twice",
                p.name
            )));
        }
        let mut tmp = out_file.as_os_str().to_owned();
        tmp.push(".partial");
        let tmp_file = std::path::PathBuf::from(tmp);
        let header = safetensors_header(&meta, &plan);
        let mut file = std::io::BufWriter::with_capacity(
            1 << 20,
            File::create(&tmp_file).map_err(|e| Error::io(&tmp_file, e))?,
        );
        let io = |e| Error::io(&tmp_file, e);
        file.write_all(&(header.len() as u64).to_le_bytes())
            .map_err(io)?;
        file.write_all(&header).map_err(io)?;
        let mut s = SafetensorsStream {
            out_file: out_file.to_path_buf(),
            tmp_file: tmp_file.clone(),
            plan,
            meta,
            header_len: header.len(),
            file,
            cur: 0,
            cur_written: 0,
            written: 0,
        };
        s.skip_empty();
        Ok(s)
    }

    fn skip_empty(&mut self) {
        while self.cur < self.plan.len() && self.plan[self.cur].bytes == 0 {
            self.cur += 1;
        }
    }

    pub fn plan(&self) -> &[PlannedTensor] {
        &self.plan
    }

    /// The tensor the next bytes belong to.
    pub fn current(&self) -> Option<&PlannedTensor> {
        self.plan.get(self.cur)
    }

    /// Bytes of tensor data written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Bytes of tensor data the plan holds.
    pub fn data_bytes(&self) -> u64 {
        self.plan.iter().map(|p| p.bytes as u64).sum()
    }

    /// Append `data` to tensor `name`, which must be the current tensor of the plan.
    pub fn write(&mut self, name: &str, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let Some(p) = self.plan.get(self.cur) else {
            return Err(Error::Other(format!(
                "internal: `{name}` written after the last planned tensor"
            )));
        };
        if p.name != name {
            return Err(Error::Other(format!(
                "internal: `{name}` written where `{}` is due",
                p.name
            )));
        }
        if self.cur_written + data.len() > p.bytes {
            return Err(Error::Other(format!(
                "internal: {} bytes written to `{name}`, which holds {}",
                self.cur_written + data.len(),
                p.bytes
            )));
        }
        self.file
            .write_all(data)
            .map_err(|e| Error::io(&self.tmp_file, e))?;
        self.cur_written += data.len();
        self.written += data.len() as u64;
        if self.cur_written == p.bytes {
            self.cur += 1;
            self.cur_written = 0;
            self.skip_empty();
        }
        Ok(())
    }

    pub fn set_metadata(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.meta.insert(key.into(), value.into());
    }

    /// Rewrite the header with the final metadata, sync and rename into place. Returns the
    /// file's size.
    pub fn finish(self) -> Result<u64> {
        if let Some(p) = self.plan.get(self.cur) {
            return Err(Error::Other(format!(
                "internal: `{}` is incomplete ({} of {} bytes)",
                p.name, self.cur_written, p.bytes
            )));
        }
        let header = safetensors_header(&self.meta, &self.plan);
        if header.len() != self.header_len {
            return Err(Error::Other(
                "internal: safetensors header changed length".into(),
            ));
        }
        let tmp_file = self.tmp_file;
        let io = |e| Error::io(&tmp_file, e);
        let mut file = self
            .file
            .into_inner()
            .map_err(|e| Error::io(&tmp_file, e.into_error()))?;
        file.seek(SeekFrom::Start(8)).map_err(io)?;
        file.write_all(&header).map_err(io)?;
        file.sync_all().map_err(io)?;
        drop(file);
        std::fs::rename(&tmp_file, &self.out_file).map_err(|e| Error::io(&self.out_file, e))?;
        Ok(8 + self.header_len as u64 + self.written)
    }
}

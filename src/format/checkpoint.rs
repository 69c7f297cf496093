//! Read-only access to a Hugging Face safetensors checkpoint: a single `model.safetensors`,
//! or `model.safetensors.index.json` plus the shards it names.
//!
//! Every shard is memory-mapped and its header parsed (and validated: the safetensors crate
//! checks that the data section is exactly as long as the header says) when the checkpoint is
//! opened, so a truncated or corrupt file fails at `open`, naming the file. Reading a tensor
//! then touches only that tensor's byte range of the mapping.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use half::f16;
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use crate::error::{Error, Result};

const SINGLE_FILE: &str = "model.safetensors";
const INDEX_FILE: &str = "model.safetensors.index.json";

/// Element types the runtime can read. Anything else is reported as a `BadTensor` error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    BF16,
    F16,
    F32,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::BF16 | DType::F16 => 2,
            DType::F32 => 4,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// The shard file holding the tensor.
    pub file: PathBuf,
}

struct Shard {
    path: PathBuf,
    mmap: Mmap,
}

/// Where one tensor lives: shard index and absolute byte range within that shard's mapping.
struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
    /// A GGUF tensor (`gguf::source`): its block type, decoded on read.
    ggml: Option<gguf::GgmlEntry>,
}

pub struct Checkpoint {
    dir: PathBuf,
    shards: Vec<Shard>,
    /// Ordered so that `names()` is deterministic.
    tensors: BTreeMap<String, Entry>,
    /// The `__metadata__` of the single file (or of the first shard).
    metadata: HashMap<String, String>,
    /// Opened from a GGUF file (`Checkpoint::open` of a `.gguf` path).
    gguf: bool,
}

#[path = "checkpoint_gguf.rs"]
mod gguf;
#[path = "checkpoint_values.rs"]
mod values;
pub use values::BadValue;
use values::{convert_f16, convert_f32};

/// How a layer stores its routed experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertLayout {
    /// Hub layout: `model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight`,
    /// [I, H], [I, H], [H, I].
    PerExpert,
    /// transformers 5 in-memory layout: `model.layers.{l}.mlp.experts.gate_up_proj` [E, 2I, H]
    /// (per expert, the I gate rows then the I up rows) and `model.layers.{l}.mlp.experts.down_proj`
    /// [E, H, I]. Each expert slice is an nn.Linear-style [out, in] matrix, used as
    /// `linear(x, gate_up_proj[e]).chunk(2, dim=-1)`.
    Fused,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertProj {
    Gate,
    Up,
    Down,
}

impl ExpertProj {
    fn hub_name(self) -> &'static str {
        match self {
            ExpertProj::Gate => "gate_proj",
            ExpertProj::Up => "up_proj",
            ExpertProj::Down => "down_proj",
        }
    }
}

impl Checkpoint {
    /// Opens `dir/model.safetensors` if present (transformers checks it first too), else
    /// `dir/model.safetensors.index.json` and its shards.
    pub fn open(dir: &Path) -> Result<Self> {
        if crate::gguf::is_gguf_path(dir) {
            return gguf::open(dir);
        }
        let single = dir.join(SINGLE_FILE);
        let index = dir.join(INDEX_FILE);
        if single.is_file() {
            let shard = map_shard(&single)?;
            let mut tensors = BTreeMap::new();
            for (name, entry) in shard_entries(&shard, 0)? {
                tensors.insert(name, entry);
            }
            let metadata = shard_metadata(&shard);
            return Ok(Checkpoint {
                dir: dir.to_path_buf(),
                shards: vec![shard],
                tensors,
                metadata,
                gguf: false,
            });
        }
        if index.is_file() {
            return Self::open_sharded(dir, &index);
        }
        Err(Error::bad_file(
            dir,
            format!("no {SINGLE_FILE} or {INDEX_FILE} in this directory"),
        ))
    }

    fn open_sharded(dir: &Path, index_path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(index_path).map_err(|e| Error::io(index_path, e))?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| Error::bad_file(index_path, format!("invalid JSON: {e}")))?;
        let weight_map = value
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| Error::field(index_path, "weight_map", "missing or not an object"))?;

        // Shard file name -> shard index, in first-seen order.
        let mut shard_ids: HashMap<&str, usize> = HashMap::new();
        let mut shards = Vec::new();
        let mut shard_tables: Vec<HashMap<String, Entry>> = Vec::new();
        let mut tensors = BTreeMap::new();
        for (name, file) in weight_map {
            let file = file.as_str().ok_or_else(|| {
                Error::field(
                    index_path,
                    format!("weight_map.{name}"),
                    format!("expected a file name, found {file}"),
                )
            })?;
            // The index must name files inside the checkpoint directory.
            let plain = Path::new(file)
                .components()
                .all(|c| matches!(c, Component::Normal(_)));
            if !plain || file.is_empty() {
                return Err(Error::field(
                    index_path,
                    format!("weight_map.{name}"),
                    format!("{file:?} is not a plain file name inside the checkpoint directory"),
                ));
            }
            let id = match shard_ids.get(file) {
                Some(&id) => id,
                None => {
                    let id = shards.len();
                    let path = dir.join(file);
                    if !path.is_file() {
                        return Err(Error::bad_file(
                            &path,
                            format!(
                                "shard named by {} (for tensor `{name}`) does not exist",
                                index_path.display()
                            ),
                        ));
                    }
                    let shard = map_shard(&path)?;
                    shard_tables.push(shard_entries(&shard, id)?.into_iter().collect());
                    shards.push(shard);
                    shard_ids.insert(file, id);
                    id
                }
            };
            // Tensors a shard holds but the index does not list are ignored, as transformers does.
            let entry = shard_tables[id]
                .remove(name)
                .ok_or_else(|| Error::BadTensor {
                    path: shards[id].path.clone(),
                    name: name.clone(),
                    msg: format!(
                        "listed in {} but not present in this shard",
                        index_path.display()
                    ),
                })?;
            tensors.insert(name.clone(), entry);
        }
        let metadata = shards.first().map(shard_metadata).unwrap_or_default();
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            shards,
            tensors,
            metadata,
            gguf: false,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the checkpoint holds the tensor (under its name, or Mixtral's hub name for it:
    /// see [`mixtral_name`]).
    pub fn contains(&self, name: &str) -> bool {
        self.lookup(name).is_some()
    }

    /// The tensor's entry: under `name`, or where Mixtral's hub checkpoints put it.
    fn lookup(&self, name: &str) -> Option<&Entry> {
        self.tensors
            .get(name)
            .or_else(|| mixtral_name(name).and_then(|m| self.tensors.get(&m)))
    }

    /// The shape of a tensor of any dtype, as its header declares it.
    pub fn shape_of(&self, name: &str) -> Option<&[usize]> {
        self.lookup(name).map(|e| e.shape.as_slice())
    }

    /// All tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// The shard files, in the order they were opened.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|s| s.path.as_path())
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        self.lookup(name).ok_or_else(|| Error::MissingTensor {
            dir: self.dir.clone(),
            name: match mixtral_name(name) {
                Some(m) => format!("{name}` (or Mixtral's `{m}"),
                None => name.to_string(),
            },
        })
    }

    fn bad(&self, e: &Entry, name: &str, msg: impl Into<String>) -> Error {
        Error::BadTensor {
            path: self.shards[e.shard].path.clone(),
            name: match &e.ggml {
                Some(g) => format!("{}` (read as `{name}", g.gguf_name),
                None => name.to_string(),
            },
            msg: msg.into(),
        }
    }

    fn dtype_of(&self, e: &Entry, name: &str) -> Result<DType> {
        if let Some(g) = &e.ggml {
            return Ok(g.decoded_dtype());
        }
        match e.dtype {
            Dtype::BF16 => Ok(DType::BF16),
            Dtype::F16 => Ok(DType::F16),
            Dtype::F32 => Ok(DType::F32),
            other => Err(self.bad(
                e,
                name,
                format!("unsupported dtype {other:?} (supported: BF16, F16, F32)"),
            )),
        }
    }

    /// The safetensors `__metadata__` of the file (the first shard when sharded).
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.metadata
    }

    /// The bytes of a U8 tensor of exactly `expected_shape`, borrowed from the mapping
    /// (read-only: the packed INT4 experts of a converted model are used in place).
    pub fn raw_u8(&self, name: &str, expected_shape: &[usize]) -> Result<&[u8]> {
        let e = self.entry(name)?;
        if e.dtype != Dtype::U8 {
            return Err(self.bad(e, name, format!("expected dtype U8, found {:?}", e.dtype)));
        }
        if e.shape != expected_shape {
            return Err(self.bad(
                e,
                name,
                format!("expected shape {expected_shape:?}, found {:?}", e.shape),
            ));
        }
        Ok(self.bytes(e))
    }

    /// Dtype, shape and file of a tensor. Fails for a missing tensor or an unsupported dtype.
    pub fn info(&self, name: &str) -> Result<TensorInfo> {
        let e = self.entry(name)?;
        Ok(TensorInfo {
            dtype: self.dtype_of(e, name)?,
            shape: e.shape.clone(),
            file: self.shards[e.shard].path.clone(),
        })
    }

    /// The tensor's entry after checking its shape is exactly `expected`, plus its dtype.
    fn checked(&self, name: &str, expected: &[usize]) -> Result<(&Entry, DType)> {
        let e = self.entry(name)?;
        if e.shape != expected {
            return Err(self.bad(
                e,
                name,
                format!("expected shape {expected:?}, found {:?}", e.shape),
            ));
        }
        let dt = self.dtype_of(e, name)?;
        Ok((e, dt))
    }

    fn bytes(&self, e: &Entry) -> &[u8] {
        // In range: shard_entries checked start <= end <= mmap.len() when the shard was opened.
        &self.shards[e.shard].mmap[e.start..e.end]
    }

    /// The whole tensor as f16 (BF16 and F32 rounded to nearest-even; F16 copied), after
    /// checking that its shape is exactly `expected_shape`. A NaN or infinite value, or
    /// one beyond the f16 range, is an error naming the tensor, the element and the value.
    pub fn read_f16(&self, name: &str, expected_shape: &[usize]) -> Result<Vec<f16>> {
        let (e, dt) = self.checked(name, expected_shape)?;
        if e.ggml.is_some() {
            return gguf::to_f16(self, e, name, 0, self.gguf_f32(e, name, None)?);
        }
        convert_f16(dt, self.bytes(e)).map_err(|b| self.bad(e, name, b.describe(0)))
    }

    /// The whole tensor as f32 (exact for BF16 and F16), after checking its shape. A NaN or
    /// infinite value is an error naming the tensor, the element and the value.
    pub fn read_f32(&self, name: &str, expected_shape: &[usize]) -> Result<Vec<f32>> {
        let (e, dt) = self.checked(name, expected_shape)?;
        if e.ggml.is_some() {
            return self.gguf_f32(e, name, None);
        }
        convert_f32(dt, self.bytes(e)).map_err(|b| self.bad(e, name, b.describe(0)))
    }

    /// Rows `[row_start, row_start + rows)` of the tensor viewed as 2-D
    /// [product of all dims but the last, last dim], as f32. The full shape must equal
    /// `expected_shape`. Only the requested rows' bytes are read, so one expert can be taken
    /// out of a fused [E, 2I, H] tensor (rows `e*2I ..`) without touching the rest.
    pub fn read_rows_f32(
        &self,
        name: &str,
        expected_shape: &[usize],
        row_start: usize,
        rows: usize,
    ) -> Result<Vec<f32>> {
        let (e, dt) = self.checked(name, expected_shape)?;
        if e.ggml.is_some() {
            return self.gguf_f32(e, name, Some((row_start, rows)));
        }
        let bytes = self.row_bytes(e, dt, name, row_start, rows)?;
        let at = row_start * e.shape.last().copied().unwrap_or(1);
        convert_f32(dt, bytes).map_err(|b| self.bad(e, name, b.describe(at)))
    }

    /// Like `read_rows_f32`, converted to f16.
    pub fn read_rows_f16(
        &self,
        name: &str,
        expected_shape: &[usize],
        row_start: usize,
        rows: usize,
    ) -> Result<Vec<f16>> {
        let (e, dt) = self.checked(name, expected_shape)?;
        let at = row_start * e.shape.last().copied().unwrap_or(1);
        if e.ggml.is_some() {
            let v = self.gguf_f32(e, name, Some((row_start, rows)))?;
            return gguf::to_f16(self, e, name, at, v);
        }
        let bytes = self.row_bytes(e, dt, name, row_start, rows)?;
        convert_f16(dt, bytes).map_err(|b| self.bad(e, name, b.describe(at)))
    }

    fn row_bytes(
        &self,
        e: &Entry,
        dt: DType,
        name: &str,
        row_start: usize,
        rows: usize,
    ) -> Result<&[u8]> {
        let (row_len, total_rows) = match e.shape.split_last() {
            Some((&last, rest)) => (last, rest.iter().product::<usize>()),
            None => (1, 1), // a scalar is one row of one element
        };
        let end_row = row_start.checked_add(rows).filter(|&r| r <= total_rows).ok_or_else(|| {
            self.bad(e, name, format!("rows {row_start}..{row_start}+{rows} out of range (2-D view has {total_rows} rows of {row_len})"))
        })?;
        let row_bytes = row_len * dt.size();
        let all = self.bytes(e);
        Ok(&all[row_start * row_bytes..end_row * row_bytes])
    }

    /// Which expert layout layer `layer` uses. Errors if it has neither, or both.
    pub fn expert_layout(&self, layer: usize) -> Result<ExpertLayout> {
        let hub = format!("model.layers.{layer}.mlp.experts.0.gate_proj.weight");
        let fused = fused_gate_up_name(layer);
        match (self.contains(&hub), self.contains(&fused)) {
            (true, false) => Ok(ExpertLayout::PerExpert),
            (false, true) => Ok(ExpertLayout::Fused),
            (false, false) => Err(Error::MissingTensor { dir: self.dir.clone(), name: format!("{hub}` or `{fused}") }),
            (true, true) => Err(Error::bad_file(
                &self.dir,
                format!("layer {layer} has both per-expert (`{hub}`) and fused (`{fused}`) expert tensors"),
            )),
        }
    }

    /// One routed expert's projection as a row-major [out, in] f32 matrix: gate/up [I, H],
    /// down [H, I]. Shapes are checked against (num_experts, hidden, inter) in either layout.
    pub fn read_expert_f32(
        &self,
        layer: usize,
        expert: usize,
        proj: ExpertProj,
        num_experts: usize,
        hidden: usize,
        inter: usize,
    ) -> Result<Vec<f32>> {
        let (name, shape, row_start, rows) =
            self.expert_location(layer, expert, proj, num_experts, hidden, inter)?;
        match row_start {
            None => self.read_f32(&name, &shape),
            Some(r) => self.read_rows_f32(&name, &shape, r, rows),
        }
    }

    /// One expert projection in the form wgmoe holds its block type in as it is, when the
    /// checkpoint is a GGUF file storing it as Q4_0 (affine 4-bit rows), Q4_K, Q5_K, Q6_K
    /// or Q5_0/Q5_1 (nibble planes); None otherwise (read it with `read_expert_f32`).
    pub fn read_expert_native(
        &self,
        layer: usize,
        expert: usize,
        proj: ExpertProj,
        num_experts: usize,
        hidden: usize,
        inter: usize,
    ) -> Result<Option<crate::blocks::quant::Q4Source>> {
        if !self.gguf {
            return Ok(None);
        }
        let (name, shape, row_start, rows) =
            self.expert_location(layer, expert, proj, num_experts, hidden, inter)?;
        match row_start {
            None => self.read_rows_native(&name, &shape, 0, shape[0]),
            Some(r) => self.read_rows_native(&name, &shape, r, rows),
        }
    }

    /// Check that one expert projection exists with the right shape and a readable dtype,
    /// without reading it.
    pub fn check_expert(
        &self,
        layer: usize,
        expert: usize,
        proj: ExpertProj,
        num_experts: usize,
        hidden: usize,
        inter: usize,
    ) -> Result<()> {
        let (name, shape, _, _) =
            self.expert_location(layer, expert, proj, num_experts, hidden, inter)?;
        self.checked(&name, &shape).map(|_| ())
    }

    /// The tensor holding one expert projection, and the flat index of the expert's first
    /// element in it (0 for per-expert tensors), for messages about its values.
    pub fn expert_source(
        &self,
        layer: usize,
        expert: usize,
        proj: ExpertProj,
        num_experts: usize,
        hidden: usize,
        inter: usize,
    ) -> Result<(String, PathBuf, usize)> {
        let (name, shape, row_start, _) =
            self.expert_location(layer, expert, proj, num_experts, hidden, inter)?;
        let e = self.entry(&name)?;
        let row_len = shape.last().copied().unwrap_or(1);
        Ok((
            name,
            self.shards[e.shard].path.clone(),
            row_start.unwrap_or(0) * row_len,
        ))
    }

    /// Like `read_expert_f32`, converted to f16.
    pub fn read_expert_f16(
        &self,
        layer: usize,
        expert: usize,
        proj: ExpertProj,
        num_experts: usize,
        hidden: usize,
        inter: usize,
    ) -> Result<Vec<f16>> {
        let (name, shape, row_start, rows) =
            self.expert_location(layer, expert, proj, num_experts, hidden, inter)?;
        match row_start {
            None => self.read_f16(&name, &shape),
            Some(r) => self.read_rows_f16(&name, &shape, r, rows),
        }
    }

    /// Tensor name, its full expected shape, and (for fused tensors) the row range of the
    /// expert's matrix in the 2-D view.
    fn expert_location(
        &self,
        layer: usize,
        expert: usize,
        proj: ExpertProj,
        num_experts: usize,
        hidden: usize,
        inter: usize,
    ) -> Result<(String, Vec<usize>, Option<usize>, usize)> {
        if expert >= num_experts {
            return Err(Error::Other(format!(
                "expert {expert} out of range: layer {layer} has {num_experts} experts"
            )));
        }
        Ok(match self.expert_layout(layer)? {
            ExpertLayout::PerExpert => {
                let name = format!(
                    "model.layers.{layer}.mlp.experts.{expert}.{}.weight",
                    proj.hub_name()
                );
                let shape = match proj {
                    ExpertProj::Gate | ExpertProj::Up => vec![inter, hidden],
                    ExpertProj::Down => vec![hidden, inter],
                };
                (name, shape, None, 0)
            }
            ExpertLayout::Fused => match proj {
                ExpertProj::Gate => (
                    fused_gate_up_name(layer),
                    vec![num_experts, 2 * inter, hidden],
                    Some(expert * 2 * inter),
                    inter,
                ),
                ExpertProj::Up => (
                    fused_gate_up_name(layer),
                    vec![num_experts, 2 * inter, hidden],
                    Some(expert * 2 * inter + inter),
                    inter,
                ),
                ExpertProj::Down => (
                    format!("model.layers.{layer}.mlp.experts.down_proj"),
                    vec![num_experts, hidden, inter],
                    Some(expert * hidden),
                    hidden,
                ),
            },
        })
    }
}

fn shard_metadata(shard: &Shard) -> HashMap<String, String> {
    SafeTensors::read_metadata(&shard.mmap)
        .ok()
        .and_then(|(_, m)| m.metadata().clone())
        .unwrap_or_default()
}

/// Mixtral's hub name for a tensor the loader names the OLMoE/Qwen way (transformers 5
/// writes the latter for every family): `model.layers.L.mlp.gate.weight` is
/// `model.layers.L.block_sparse_moe.gate.weight`, and expert E's
/// `mlp.experts.E.{gate,up,down}_proj.weight` is `block_sparse_moe.experts.E.{w1,w3,w2}.weight`
/// (MixtralBlockSparseTop2MLP: `w2(act_fn(w1(x)) * w3(x))`).
pub fn mixtral_name(name: &str) -> Option<String> {
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once(".mlp.")?;
    if rest == "gate.weight" {
        return Some(format!("model.layers.{layer}.block_sparse_moe.gate.weight"));
    }
    let (expert, proj) = rest.strip_prefix("experts.")?.split_once('.')?;
    expert.parse::<usize>().ok()?;
    let w = match proj {
        "gate_proj.weight" => "w1",
        "up_proj.weight" => "w3",
        "down_proj.weight" => "w2",
        _ => return None,
    };
    Some(format!(
        "model.layers.{layer}.block_sparse_moe.experts.{expert}.{w}.weight"
    ))
}

fn fused_gate_up_name(layer: usize) -> String {
    format!("model.layers.{layer}.mlp.experts.gate_up_proj")
}

fn map_shard(path: &Path) -> Result<Shard> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: the mapping is read-only; as with every mmap-based loader, modifying the file
    // while it is mapped is outside the contract (the user must not rewrite a checkpoint
    // while it is being loaded).
    let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    Ok(Shard {
        path: path.to_path_buf(),
        mmap,
    })
}

/// Parses and validates a shard header; returns its tensors with absolute byte ranges.
fn shard_entries(shard: &Shard, id: usize) -> Result<Vec<(String, Entry)>> {
    let buf: &[u8] = &shard.mmap;
    let (header_len, meta) = SafeTensors::read_metadata(buf).map_err(|e| {
        let what = match e {
            safetensors::SafeTensorError::MetadataIncompleteBuffer => {
                "data section length does not match the header (truncated or has trailing bytes)"
                    .to_string()
            }
            other => format!("invalid safetensors header: {other}"),
        };
        Error::bad_file(&shard.path, what)
    })?;
    let data_start = 8 + header_len;
    let mut out = Vec::new();
    for (name, info) in meta.tensors() {
        let (s, e) = info.data_offsets;
        let (start, end) = (data_start + s, data_start + e);
        // read_metadata already validated this; re-check so slicing can never panic.
        if start > end || end > buf.len() {
            return Err(Error::bad_file(
                &shard.path,
                format!("tensor `{name}` lies outside the file"),
            ));
        }
        out.push((
            name,
            Entry {
                shard: id,
                dtype: info.dtype,
                shape: info.shape.clone(),
                start,
                end,
                ggml: None,
            },
        ));
    }
    Ok(out)
}

/// A model path must be a directory with a config.json; say plainly what it is instead.
pub fn check_model_dir(dir: &Path) -> Result<()> {
    check_model_path(dir, false)
}

/// [`check_model_dir`] for a command that also runs GGUF files (a `.gguf` path never
/// reaches here): the message names both.
pub fn check_model_path(dir: &Path, gguf_too: bool) -> Result<()> {
    let what = if gguf_too {
        "wgmoe takes a Hugging Face model directory (config.json, tokenizer.json and *.safetensors weights) or a GGUF file (*.gguf)"
    } else {
        "wgmoe takes a Hugging Face model directory (config.json, tokenizer.json and *.safetensors weights)"
    };
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(Error::bad_file(dir, "model directory not found"))
        }
        Err(e) => Err(Error::io(dir, e)),
        Ok(m) if !m.is_dir() => {
            let gguf = dir
                .extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("gguf"));
            let hint = if gguf {
                "; a GGUF file runs as it is (`wgmoe run FILE.gguf`), but this command takes a Hugging Face checkpoint (safetensors)"
            } else {
                match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                    Some(p) if p.join("config.json").is_file() => {
                        return Err(Error::bad_file(
                            dir,
                            format!("is a file, not a model directory: {what}; pass the directory that holds it, {}", p.display()),
                        ))
                    }
                    _ => "",
                }
            };
            Err(Error::bad_file(
                dir,
                format!("is a file, not a model directory: {what}{hint}"),
            ))
        }
        Ok(_) => {
            let cfg = dir.join("config.json");
            if cfg.exists() {
                return Ok(());
            }
            let empty = std::fs::read_dir(dir)
                .map(|mut d| d.next().is_none())
                .unwrap_or(false);
            Err(Error::bad_file(
                cfg,
                format!(
                    "missing: {}{what}",
                    if empty {
                        "the directory is empty; "
                    } else {
                        ""
                    }
                ),
            ))
        }
    }
}

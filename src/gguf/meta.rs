//! GGUF metadata values and typed access to them, with errors naming the file and key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// One metadata value (`gguf_type`; nested arrays do not occur in GGUF files and are refused).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    U64(u64),
    I64(i64),
    F64(f64),
    Array(MetaArray),
}

/// An array value: its element type id (kept for empty arrays) and its elements.
#[derive(Debug, Clone, PartialEq)]
pub struct MetaArray {
    pub elem_type: u32,
    pub items: Vec<MetaValue>,
}

/// GGUF value type ids (`enum gguf_type`).
pub mod value_type {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

impl MetaValue {
    /// The GGUF type name, for messages ("u32", "string", "array of string").
    pub fn type_name(&self) -> String {
        match self {
            MetaValue::U8(_) => "u8".into(),
            MetaValue::I8(_) => "i8".into(),
            MetaValue::U16(_) => "u16".into(),
            MetaValue::I16(_) => "i16".into(),
            MetaValue::U32(_) => "u32".into(),
            MetaValue::I32(_) => "i32".into(),
            MetaValue::F32(_) => "f32".into(),
            MetaValue::Bool(_) => "bool".into(),
            MetaValue::Str(_) => "string".into(),
            MetaValue::U64(_) => "u64".into(),
            MetaValue::I64(_) => "i64".into(),
            MetaValue::F64(_) => "f64".into(),
            MetaValue::Array(a) => format!("array of {}", type_id_name(a.elem_type)),
        }
    }

    /// An integer of any width, if this is one.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => v.into(),
            MetaValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// A number as f64. An f32 is read through its shortest decimal form, the value the
    /// converter was given (`1e-5` written as f32 reads back as 1e-5, not 9.99999974e-6).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => v.to_string().parse().ok(),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    /// A short rendering for messages (arrays summarised).
    pub fn short(&self) -> String {
        match self {
            MetaValue::Str(s) if s.len() > 60 => format!("{:?}...", &s[..floor_char(s, 60)]),
            MetaValue::Str(s) => format!("{s:?}"),
            MetaValue::Array(a) => format!("[{} x {}]", a.items.len(), type_id_name(a.elem_type)),
            MetaValue::Bool(b) => b.to_string(),
            MetaValue::F32(v) => v.to_string(),
            MetaValue::F64(v) => v.to_string(),
            v => v.as_i128().map(|i| i.to_string()).unwrap_or_default(),
        }
    }
}

fn floor_char(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

pub fn type_id_name(t: u32) -> &'static str {
    match t {
        value_type::U8 => "u8",
        value_type::I8 => "i8",
        value_type::U16 => "u16",
        value_type::I16 => "i16",
        value_type::U32 => "u32",
        value_type::I32 => "i32",
        value_type::F32 => "f32",
        value_type::BOOL => "bool",
        value_type::STRING => "string",
        value_type::ARRAY => "array",
        value_type::U64 => "u64",
        value_type::I64 => "i64",
        value_type::F64 => "f64",
        _ => "unknown",
    }
}

/// The metadata of a GGUF file (of the first shard of a split), in file order, with typed
/// getters whose errors name the file and the key.
#[derive(Debug, Clone)]
pub struct Metadata {
    pub(super) path: PathBuf,
    pub(super) entries: Vec<(String, MetaValue)>,
    pub(super) index: BTreeMap<String, usize>,
}

impl Metadata {
    pub(super) fn new(path: &Path, entries: Vec<(String, MetaValue)>) -> Self {
        let index = entries
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        Metadata {
            path: path.to_path_buf(),
            entries,
            index,
        }
    }

    /// The file the metadata came from (named in errors).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// Keys and values in file order.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn error(&self, key: &str, msg: impl Into<String>) -> Error {
        Error::field(&self.path, key, msg)
    }

    fn wrong(&self, key: &str, want: &str, v: &MetaValue) -> Error {
        self.error(
            key,
            format!("expected {want}, found {} {}", v.type_name(), v.short()),
        )
    }

    pub fn missing(&self, key: &str) -> Error {
        self.error(key, "missing (required)")
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(MetaValue::Str(s)) => Ok(Some(s)),
            Some(v) => Err(self.wrong(key, "a string", v)),
        }
    }

    pub fn req_str(&self, key: &str) -> Result<&str> {
        self.opt_str(key)?.ok_or_else(|| self.missing(key))
    }

    /// A non-negative integer of any integer type that fits in u64.
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_i128() {
                Some(i) if i >= 0 && i <= u64::MAX as i128 => Ok(Some(i as u64)),
                _ => Err(self.wrong(key, "a non-negative integer", v)),
            },
        }
    }

    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        match self.opt_u64(key)? {
            None => Ok(None),
            Some(v) => u32::try_from(v)
                .map(Some)
                .map_err(|_| self.error(key, format!("{v} does not fit in 32 bits"))),
        }
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a number", v)),
        }
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(MetaValue::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong(key, "a bool", v)),
        }
    }

    /// An array; Ok(None) when the key is absent, an error when it is not an array of
    /// `elem_type`.
    pub fn opt_array(&self, key: &str, elem_type: u32) -> Result<Option<&[MetaValue]>> {
        match self.get(key) {
            None => Ok(None),
            Some(MetaValue::Array(a)) if a.elem_type == elem_type => Ok(Some(&a.items)),
            Some(v) => Err(self.wrong(key, &format!("an array of {}", type_id_name(elem_type)), v)),
        }
    }

    /// An array of strings, borrowed.
    pub fn opt_str_array(&self, key: &str) -> Result<Option<Vec<&str>>> {
        let Some(items) = self.opt_array(key, value_type::STRING)? else {
            return Ok(None);
        };
        Ok(Some(
            items
                .iter()
                .map(|v| match v {
                    MetaValue::Str(s) => s.as_str(),
                    _ => "",
                })
                .collect(),
        ))
    }
}

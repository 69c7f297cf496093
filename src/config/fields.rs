//! Typed access to the fields of a JSON object, with errors naming the file and field, and
//! the bounds every dimension field is held to.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Typed access to the fields of one JSON object, with errors naming file and field.
/// A JSON `null` is treated the same as an absent field.
pub(super) struct Fields<'a> {
    pub(super) obj: &'a Map<String, Value>,
    pub(super) path: &'a Path,
}

impl<'a> Fields<'a> {
    pub(super) fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    pub(super) fn missing(&self, key: &str) -> Error {
        Error::field(self.path, key, "missing (required)")
    }

    pub(super) fn wrong(&self, key: &str, want: &str, v: &Value) -> Error {
        Error::field(self.path, key, format!("expected {want}, found {v}"))
    }

    pub(super) fn req_str(&self, key: &str) -> Result<&'a str> {
        self.opt_str(key)?.ok_or_else(|| self.missing(key))
    }

    pub(super) fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.wrong(key, "a string", v)),
        }
    }

    pub(super) fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => as_usize(v)
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a non-negative integer", v)),
        }
    }

    /// A dimension: present, > 0, and within the bound `crate::limits` sets for it (so
    /// nothing sized by it can be absurd).
    pub(super) fn opt_pos(&self, key: &str) -> Result<Option<usize>> {
        match self.opt_usize(key)? {
            Some(0) => Err(Error::field(self.path, key, "must be greater than 0")),
            Some(v) => match crate::limits::max_of(key) {
                Some(max) if v > max => Err(Error::field(
                    self.path,
                    key,
                    format!("{v} is larger than wgmoe supports ({max}; published models are far below it)"),
                )),
                _ => Ok(Some(v)),
            },
            None => Ok(None),
        }
    }

    pub(super) fn req_pos(&self, key: &str) -> Result<usize> {
        self.opt_pos(key)?.ok_or_else(|| self.missing(key))
    }

    pub(super) fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => as_u32(v)
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a token id (u32)", v)),
        }
    }

    pub(super) fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a number", v)),
        }
    }

    pub(super) fn req_f64(&self, key: &str) -> Result<f64> {
        self.opt_f64(key)?.ok_or_else(|| self.missing(key))
    }

    pub(super) fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong(key, "true or false", v)),
        }
    }

    pub(super) fn req_bool(&self, key: &str) -> Result<bool> {
        self.opt_bool(key)?.ok_or_else(|| self.missing(key))
    }

    /// A token id given as an int or a list of ints; empty when absent.
    pub(super) fn id_list(&self, key: &str) -> Result<Vec<u32>> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| as_u32(v).ok_or_else(|| self.wrong(key, "a list of token ids", v)))
                .collect(),
            Some(v) => as_u32(v)
                .map(|id| vec![id])
                .ok_or_else(|| self.wrong(key, "a token id or a list of them", v)),
        }
    }

    pub(super) fn opt_usize_list(&self, key: &str) -> Result<Option<Vec<usize>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    as_usize(v).ok_or_else(|| self.wrong(key, "a list of non-negative integers", v))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(v) => Err(self.wrong(key, "a list of non-negative integers", v)),
        }
    }
}

/// Accepts integers, and floats with an integral value (some tools write `2048.0`).
pub(super) fn as_usize(v: &Value) -> Option<usize> {
    if let Some(u) = v.as_u64() {
        return usize::try_from(u).ok();
    }
    let f = v.as_f64()?;
    if f >= 0.0 && f.fract() == 0.0 && f <= u32::MAX as f64 {
        Some(f as usize)
    } else {
        None
    }
}

pub(super) fn as_u32(v: &Value) -> Option<u32> {
    as_usize(v).and_then(|u| u32::try_from(u).ok())
}

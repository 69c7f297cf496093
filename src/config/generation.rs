//! `generation_config.json`.

use std::path::Path;

use serde_json::Value;

use super::fields::Fields;
use crate::error::{Error, Result};

/// Settings from `generation_config.json` (all optional in the file).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub do_sample: Option<bool>,
}

impl GenerationConfig {
    /// Reads `dir/generation_config.json`; a missing file is `Ok(None)`.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join("generation_config.json");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(&path, e)),
        };
        Self::from_json(&text, &path).map(Some)
    }

    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| Error::bad_file(path, format!("invalid JSON: {e}")))?;
        let Value::Object(obj) = value else {
            return Err(Error::bad_file(path, "expected a JSON object at top level"));
        };
        let f = Fields { obj: &obj, path };
        let temperature = f.opt_f64("temperature")?.map(|t| t as f32);
        if let Some(t) = temperature {
            if !(t >= 0.0 && t.is_finite()) {
                return Err(Error::field(
                    path,
                    "temperature",
                    format!("{t} must be a non-negative finite number"),
                ));
            }
        }
        let top_p = f.opt_f64("top_p")?.map(|p| p as f32);
        if let Some(p) = top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(Error::field(
                    path,
                    "top_p",
                    format!("{p} must be in (0, 1]"),
                ));
            }
        }
        Ok(GenerationConfig {
            eos_token_ids: f.id_list("eos_token_id")?,
            bos_token_id: f.opt_u32("bos_token_id")?,
            pad_token_id: f.opt_u32("pad_token_id")?,
            temperature,
            // top_k = 0 means "disabled" in transformers; keep it as given.
            top_k: f.opt_usize("top_k")?,
            top_p,
            do_sample: f.opt_bool("do_sample")?,
        })
    }
}

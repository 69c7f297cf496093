//! The RoPE base: the published checkpoints' top-level `rope_theta` or transformers 5's
//! `rope_parameters`; every scaling scheme but plain default RoPE is refused.

use serde_json::{Map, Value};

use super::fields::Fields;
use crate::error::{Error, Result};

/// RoPE base, from either the classic top-level `rope_theta` (what the published checkpoints
/// carry) or transformers 5's `rope_parameters` object ({"rope_theta": .., "rope_type": "default"}).
/// Any scaling scheme other than plain default RoPE is rejected, since it is not implemented.
pub(super) fn parse_rope(f: &Fields) -> Result<f64> {
    // transformers 4 writes `rope_scaling: null`; a non-null value means a scaling scheme,
    // unless it only restates default RoPE (transformers 5 aliases rope_scaling to rope_parameters).
    let mut theta_from_objects = None;
    for key in ["rope_scaling", "rope_parameters"] {
        match f.obj.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                // transformers 5 may nest the parameters by layer type; all layers here use
                // full attention.
                let (key, m) = match m.get("full_attention") {
                    Some(Value::Object(inner)) => (format!("{key}.full_attention"), inner),
                    _ => (key.to_string(), m),
                };
                let key = key.as_str();
                check_default_rope(f, key, m)?;
                if let Some(v) = m.get("rope_theta") {
                    let field = format!("{key}.rope_theta");
                    let t = v.as_f64().ok_or_else(|| {
                        Error::field(f.path, &field, format!("expected a number, found {v}"))
                    })?;
                    if let Some((prev_field, prev)) = &theta_from_objects {
                        if *prev != t {
                            return Err(Error::field(
                                f.path,
                                &field,
                                format!("{t} disagrees with {prev_field} = {prev}"),
                            ));
                        }
                    }
                    theta_from_objects = Some((field, t));
                }
            }
            Some(v) => {
                return Err(Error::field(
                    f.path,
                    key,
                    format!("expected an object or null, found {v}"),
                ))
            }
        }
    }
    if let Some(p) = f.opt_f64("partial_rotary_factor")? {
        if p != 1.0 {
            return Err(Error::field(
                f.path,
                "partial_rotary_factor",
                format!("{p} is not supported (only 1.0)"),
            ));
        }
    }
    let top = f.opt_f64("rope_theta")?;
    let theta = match (top, theta_from_objects) {
        (Some(t), Some((field, o))) if t != o => {
            return Err(Error::field(
                f.path,
                "rope_theta",
                format!("{t} disagrees with {field} = {o}"),
            ));
        }
        (Some(t), _) => t,
        (None, Some((_, o))) => o,
        (None, None) => {
            return Err(Error::field(
                f.path,
                "rope_theta",
                "missing (neither rope_theta nor rope_parameters.rope_theta is present)",
            ));
        }
    };
    if !(theta > 0.0 && theta.is_finite()) {
        return Err(Error::field(
            f.path,
            "rope_theta",
            format!("{theta} must be a positive finite number"),
        ));
    }
    Ok(theta)
}

fn check_default_rope(f: &Fields, key: &str, m: &Map<String, Value>) -> Result<()> {
    // Older configs spell it "type", newer ones "rope_type".
    for tkey in ["rope_type", "type"] {
        match m.get(tkey) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "default" => {}
            Some(v) => {
                return Err(Error::field(
                    f.path,
                    format!("{key}.{tkey}"),
                    format!("RoPE type {v} is not supported (only \"default\")"),
                ));
            }
        }
    }
    if let Some(v) = m.get("partial_rotary_factor") {
        if v.as_f64() != Some(1.0) && !v.is_null() {
            return Err(Error::field(
                f.path,
                format!("{key}.partial_rotary_factor"),
                format!("{v} is not supported (only 1.0)"),
            ));
        }
    }
    Ok(())
}

//! Per-layer expert access frequencies, measured on a calibration run
//! (`wgmoe run ... --write-profile FILE`) and read by the static-profile policy.
//!
//! File format (JSON):
//! `{"model": "...", "num_layers": L, "num_experts": E, "counts": [[u64; E]; L]}`
//! where `counts[l][e]` is how many routed groups of layer `l` selected expert `e`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::ConfigError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    pub model: String,
    pub num_layers: usize,
    pub num_experts: usize,
    pub counts: Vec<Vec<u64>>,
}

impl Profile {
    /// An empty profile (all counts zero).
    pub fn new(model: impl Into<String>, num_layers: usize, num_experts: usize) -> Self {
        Self {
            model: model.into(),
            num_layers,
            num_experts,
            counts: vec![vec![0; num_experts]; num_layers],
        }
    }

    /// Counts one routed group of `layer` (repeated ids count once). Out-of-range layers or
    /// experts are ignored and reported by the return value (`false`).
    pub fn record_group(&mut self, layer: usize, experts: &[u32]) -> bool {
        let Some(row) = self.counts.get_mut(layer) else {
            return false;
        };
        let mut ok = true;
        for (i, &e) in experts.iter().enumerate() {
            if experts[..i].contains(&e) {
                continue;
            }
            match row.get_mut(e as usize) {
                Some(c) => *c += 1,
                None => ok = false,
            }
        }
        ok
    }

    /// The `n` most frequent experts of `layer`, most frequent first (ties: lower id first).
    /// `n` is clamped to the number of experts; an unknown layer yields nothing.
    pub fn top(&self, layer: usize, n: usize) -> Vec<u32> {
        let Some(row) = self.counts.get(layer) else {
            return Vec::new();
        };
        let mut ids: Vec<u32> = (0..row.len() as u32).collect();
        ids.sort_by(|&a, &b| row[b as usize].cmp(&row[a as usize]).then(a.cmp(&b)));
        ids.truncate(n);
        ids
    }

    /// The share of `layer`'s expert accesses that went to each expert (sums to 1; all zero
    /// when the layer has no recorded access). Input to [`super::frequency_ceiling`].
    pub fn probabilities(&self, layer: usize) -> Vec<f64> {
        let Some(row) = self.counts.get(layer) else {
            return Vec::new();
        };
        let total: u64 = row.iter().sum();
        row.iter()
            .map(|&c| {
                if total == 0 {
                    0.0
                } else {
                    c as f64 / total as f64
                }
            })
            .collect()
    }

    /// Checks that `counts` has the declared shape.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.counts.len() != self.num_layers {
            return Err(ConfigError::new(format!(
                "profile: `counts` has {} layers but `num_layers` is {}",
                self.counts.len(),
                self.num_layers
            )));
        }
        if let Some((l, row)) = self
            .counts
            .iter()
            .enumerate()
            .find(|(_, r)| r.len() != self.num_experts)
        {
            return Err(ConfigError::new(format!(
                "profile: `counts[{l}]` has {} experts but `num_experts` is {}",
                row.len(),
                self.num_experts
            )));
        }
        Ok(())
    }

    /// Checks the profile was measured on a model of this shape.
    pub fn check_matches(&self, num_layers: usize, num_experts: usize) -> Result<(), ConfigError> {
        if self.num_layers != num_layers || self.num_experts != num_experts {
            return Err(ConfigError::new(format!(
                "profile of `{}` has {} layers x {} experts but the model has {} x {}",
                self.model, self.num_layers, self.num_experts, num_layers, num_experts
            )));
        }
        Ok(())
    }

    pub fn from_json_str(s: &str) -> Result<Self, ConfigError> {
        let p: Profile =
            serde_json::from_str(s).map_err(|e| ConfigError::new(format!("profile: {e}")))?;
        p.validate()?;
        Ok(p)
    }

    pub fn to_json_string(&self) -> String {
        // Serialising plain strings, integers and vectors cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn load(path: &Path) -> crate::Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| crate::Error::io(path, e))?;
        Self::from_json_str(&text).map_err(|e| crate::Error::bad_file(path, e.0))
    }

    pub fn save(&self, path: &Path) -> crate::Result<()> {
        std::fs::write(path, self.to_json_string()).map_err(|e| crate::Error::io(path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_groups_and_ranks_experts() {
        let mut p = Profile::new("tiny", 2, 4);
        assert!(p.record_group(0, &[2, 2, 1]));
        assert!(p.record_group(0, &[2, 3]));
        assert!(!p.record_group(0, &[9]));
        assert!(!p.record_group(5, &[0]));
        assert_eq!(p.counts[0], vec![0, 1, 2, 1]);
        assert_eq!(p.top(0, 2), vec![2, 1]); // tie 1 vs 3 -> lower id
        assert_eq!(p.top(0, 99), vec![2, 1, 3, 0]);
        assert!(p.top(9, 2).is_empty());
        let probs = p.probabilities(0);
        assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert_eq!(probs[2], 0.5);
        assert_eq!(p.probabilities(1), vec![0.0; 4]);
    }

    #[test]
    fn json_round_trip_and_format() {
        let mut p = Profile::new("olmoe", 2, 3);
        p.counts = vec![vec![1, 2, 3], vec![4, 5, 6]];
        let s = p.to_json_string();
        assert_eq!(
            s,
            r#"{"model":"olmoe","num_layers":2,"num_experts":3,"counts":[[1,2,3],[4,5,6]]}"#
        );
        assert_eq!(Profile::from_json_str(&s).unwrap(), p);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profile.json");
        p.save(&path).unwrap();
        assert_eq!(Profile::load(&path).unwrap(), p);
        assert!(Profile::load(&dir.path().join("missing.json")).is_err());
    }

    #[test]
    fn rejects_bad_shapes() {
        let bad_layers = r#"{"model":"m","num_layers":3,"num_experts":2,"counts":[[1,2]]}"#;
        assert!(Profile::from_json_str(bad_layers)
            .unwrap_err()
            .0
            .contains("num_layers"));
        let bad_row = r#"{"model":"m","num_layers":1,"num_experts":3,"counts":[[1,2]]}"#;
        assert!(Profile::from_json_str(bad_row)
            .unwrap_err()
            .0
            .contains("counts[0]"));
        assert!(Profile::from_json_str("{").is_err());
        let p = Profile::new("m", 16, 64);
        assert!(p.check_matches(16, 64).is_ok());
        assert!(p.check_matches(24, 60).unwrap_err().0.contains("24 x 60"));
    }
}

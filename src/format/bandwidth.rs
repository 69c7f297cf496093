//! Measured bandwidths of an adapter (`wgmoe devices --measure`), kept in a small JSON file
//! so `wgmoe plan` can predict decode speed without a device: one entry per adapter, keyed
//! by its name, backend and driver.
//!
//! The file is `$XDG_CACHE_HOME/wgmoe/bandwidth.json`, else `$HOME/.cache/wgmoe/bandwidth.json`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Bandwidths measured on one adapter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    pub adapter: String,
    pub backend: String,
    pub driver: String,
    /// wgpu's device type (`Cpu` for a software adapter such as lavapipe).
    pub device_type: String,
    /// Device memory read by a kernel (the f16 matmul of one token over a large matrix).
    pub device_read_gbps: f64,
    /// Host to device through mapped staging buffers and a copy (the expert upload path).
    pub h2d_gbps: f64,
    /// Host to device through the queue's buffer write.
    pub write_buffer_gbps: f64,
    /// Packed INT4 expert bytes the CPU expert kernel reads per second (one token, top-8
    /// experts of an OLMoE-sized expert; `--miss-policy cpu`). Absent in older files.
    #[serde(default)]
    pub cpu_expert_gbps: Option<f64>,
    /// Threads and instruction set of that measurement.
    #[serde(default)]
    pub cpu_threads: Option<usize>,
    #[serde(default)]
    pub cpu_isa: Option<String>,
    /// One sync point of a segmented step (a submission and a mapped readback), in
    /// microseconds. Absent in older files.
    #[serde(default)]
    pub round_trip_us: Option<f64>,
    /// The same round trip in seconds (`round_trip_s`), and what one dependent dispatch
    /// adds to a chain of them in one submission (`dispatch_latency_s`). Absent in older
    /// files.
    #[serde(default)]
    pub round_trip_s: Option<f64>,
    #[serde(default)]
    pub dispatch_latency_s: Option<f64>,
    /// Bytes of the matrix read, and of one host-to-device transfer.
    pub read_bytes: u64,
    pub h2d_bytes: u64,
    pub repetitions: usize,
    pub date_utc: String,
}

impl Measured {
    /// The key an entry is stored under.
    pub fn key(&self) -> String {
        format!("{} | {} | {}", self.adapter, self.backend, self.driver)
    }
}

/// The file holding every adapter's measurements.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Store {
    pub entries: Vec<Measured>,
}

/// Where the store lives (None without `XDG_CACHE_HOME` and `HOME`).
pub fn store_path() -> Option<PathBuf> {
    Some(crate::cache_dir::cache_dir()?.join("bandwidth.json"))
}

impl Store {
    /// The store at `path`; an absent file is an empty store, a malformed one an error
    /// naming it.
    pub fn load(path: &Path) -> Result<Self> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Store::default()),
            Err(e) => return Err(Error::io(path, e)),
        };
        serde_json::from_str(&text).map_err(|e| {
            Error::bad_file(
                path,
                format!("not a wgmoe bandwidth file ({e}); delete it and run `wgmoe devices --measure` again"),
            )
        })
    }

    /// Replace (or add) the entry of `m`'s adapter.
    pub fn put(&mut self, m: Measured) {
        let key = m.key();
        self.entries.retain(|e| e.key() != key);
        self.entries.push(m);
    }

    /// Write the store to `path` (its directory is created), through a temporary file.
    pub fn save(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        }
        let text = serde_json::to_string_pretty(self).map_err(|e| Error::Other(e.to_string()))?;
        let tmp = path.with_extension(format!("json.tmp-{}", std::process::id()));
        std::fs::write(&tmp, text + "\n").map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::io(path, e)
        })
    }

    /// The entry for an adapter whose name contains `adapter` (case-insensitive), or with
    /// no name given, the only entry or else the latest measured. The string says why it
    /// was chosen.
    pub fn pick(&self, adapter: Option<&str>) -> Option<(&Measured, String)> {
        match adapter {
            Some(a) => {
                let a = a.to_lowercase();
                self.entries
                    .iter()
                    .rev()
                    .find(|e| e.adapter.to_lowercase().contains(&a))
                    .map(|e| (e, format!("the entry matching --adapter {a}")))
            }
            None if self.entries.len() == 1 => self
                .entries
                .first()
                .map(|e| (e, "the only adapter measured".to_string())),
            None => self
                .entries
                .iter()
                .max_by(|a, b| a.date_utc.cmp(&b.date_utc))
                .map(|e| {
                    (
                        e,
                        format!(
                            "the latest of {} adapters measured (--adapter picks another)",
                            self.entries.len()
                        ),
                    )
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(adapter: &str, date: &str, read: f64) -> Measured {
        Measured {
            adapter: adapter.into(),
            backend: "vulkan".into(),
            driver: "d 1".into(),
            device_type: "DiscreteGpu".into(),
            device_read_gbps: read,
            h2d_gbps: 1.0,
            write_buffer_gbps: 1.0,
            cpu_expert_gbps: Some(5.0),
            cpu_threads: Some(2),
            cpu_isa: Some("avx2+fma".into()),
            round_trip_us: Some(50.0),
            round_trip_s: Some(50e-6),
            dispatch_latency_s: None,
            read_bytes: 1,
            h2d_bytes: 1,
            repetitions: 1,
            date_utc: date.into(),
        }
    }

    #[test]
    fn entries_are_keyed_by_adapter_and_picked_by_name_or_date() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("bandwidth.json");
        assert!(Store::load(&path).unwrap().entries.is_empty());
        let mut s = Store::default();
        s.put(m("GPU A", "2025-01-02T00:00:00Z", 100.0));
        s.put(m("GPU B", "2025-01-01T00:00:00Z", 200.0));
        // A new measurement of the same adapter replaces the old one.
        s.put(m("GPU A", "2025-01-03T00:00:00Z", 150.0));
        s.save(&path).unwrap();
        let s = Store::load(&path).unwrap();
        assert_eq!(s.entries.len(), 2);
        assert_eq!(s.pick(Some("gpu b")).unwrap().0.device_read_gbps, 200.0);
        assert_eq!(s.pick(None).unwrap().0.device_read_gbps, 150.0);
        assert!(s.pick(Some("nothing")).is_none());
        std::fs::write(&path, "{not json").unwrap();
        let e = Store::load(&path).unwrap_err().to_string();
        assert!(
            e.contains("bandwidth.json") && e.contains("--measure"),
            "{e}"
        );
    }
}

//! The JSONL trace file: a header line, then one line per (token, layer).

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::{LayerRouting, RoutingSink, TraceHeader, TraceLine};
use crate::error::{Error, Result};

pub struct JsonlSink {
    path: PathBuf,
    out: BufWriter<std::fs::File>,
}

impl JsonlSink {
    /// Create (or truncate) `path` and write the header.
    pub fn create(path: &Path, header: &TraceHeader) -> Result<Self> {
        let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
        let mut s = JsonlSink {
            path: path.to_path_buf(),
            out: BufWriter::new(file),
        };
        s.write(header)?;
        Ok(s)
    }

    fn write(&mut self, v: &impl serde::Serialize) -> Result<()> {
        let line = serde_json::to_string(v).map_err(|e| Error::Other(e.to_string()))?;
        writeln!(self.out, "{line}").map_err(|e| Error::io(&self.path, e))
    }
}

impl RoutingSink for JsonlSink {
    fn layer(&mut self, r: &LayerRouting<'_>) -> Result<()> {
        let k = r.top_k.max(1);
        for (t, ids) in r.ids.chunks(k).enumerate() {
            let at = t * k..t * k + ids.len();
            let line = TraceLine {
                step: r.step,
                token: r.pos0 + t,
                phase: r.phase,
                layer: r.layer,
                experts: ids.to_vec(),
                weights: r.weights.get(at.clone()).unwrap_or_default().to_vec(),
                hit: r.hit.get(at.clone()).unwrap_or_default().to_vec(),
                cpu: r.cpu.get(at.clone()).unwrap_or_default().to_vec(),
                evicted: if t == 0 {
                    r.evicted.to_vec()
                } else {
                    Vec::new()
                },
                loaded: if t == 0 {
                    r.loaded.to_vec()
                } else {
                    Vec::new()
                },
                warmup: r.warmup,
                // The guess is of one token (one-token steps).
                predicted: if t == 0 {
                    r.predicted.to_vec()
                } else {
                    Vec::new()
                },
                prefetched: r.prefetched.get(at.clone()).unwrap_or_default().to_vec(),
                prefetch_issued: if t == 0 {
                    r.prefetch_issued.to_vec()
                } else {
                    Vec::new()
                },
                stall_s: if t == 0 { r.stall_s } else { 0.0 },
            };
            self.write(&line)?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        self.out.flush().map_err(|e| Error::io(&self.path, e))
    }
}

impl Drop for JsonlSink {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
}

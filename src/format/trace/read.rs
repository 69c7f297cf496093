//! Reading a trace back, checking every line against its header.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use super::{Phase, TraceHeader, TraceLine, TRACE_VERSION};
use crate::error::{Error, Result};

/// A trace file, read and checked.
#[derive(Clone, Debug)]
pub struct Trace {
    pub path: PathBuf,
    pub header: TraceHeader,
    pub lines: Vec<TraceLine>,
}

/// The trace as the cache saw it: per MoE layer, the ids each step wanted in token order.
#[derive(Clone, Debug, Default)]
pub struct StepGroups {
    /// The layers (model indices), as in the header.
    pub layers: Vec<usize>,
    /// `steps[i][s]`: the ids layer `layers[i]` routed to in step `s` (tokens x top_k).
    pub steps: Vec<Vec<Vec<u32>>>,
    /// Per step: counted (not warm-up), decode (one decoded token) or prefill.
    pub counted: Vec<bool>,
    pub phase: Vec<Phase>,
    /// Tokens per step.
    pub tokens: Vec<usize>,
    /// `guesses[i][s]`: the guess recorded for layer `layers[i]` in step `s` (the previous
    /// MoE layer's prediction of its experts; empty: none).
    pub guesses: Vec<Vec<Vec<u32>>>,
}

fn at(path: &Path, line: usize, msg: impl Into<String>) -> Error {
    Error::bad_file(format!("{}:{line}", path.display()), msg)
}

/// Read and check `path` (header first, then one record per line).
pub fn read_trace(path: &Path) -> Result<Trace> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut header: Option<TraceHeader> = None;
    let mut lines = Vec::new();
    let mut last_step = 0u64;
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let n = i + 1;
        let line = line.map_err(|e| at(path, n, format!("unreadable: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let Some(h) = &header else {
            let h: TraceHeader = serde_json::from_str(&line).map_err(|e| {
                at(path, n, format!("not a wgmoe trace header ({e}); traces are written by `wgmoe run/bench --trace FILE`"))
            })?;
            if !(1..=TRACE_VERSION).contains(&h.wgmoe_trace) {
                return Err(at(
                    path,
                    n,
                    format!(
                        "trace format {} (this wgmoe reads 1 to {TRACE_VERSION})",
                        h.wgmoe_trace
                    ),
                ));
            }
            if h.top_k == 0
                || h.top_k > h.num_experts
                || h.moe_layers.iter().any(|&l| l >= h.num_layers)
            {
                return Err(at(
                    path,
                    n,
                    "header: top_k, num_experts and moe_layers do not agree",
                ));
            }
            header = Some(h);
            continue;
        };
        let r: TraceLine = serde_json::from_str(&line)
            .map_err(|e| at(path, n, format!("not a trace record: {e}")))?;
        if !h.moe_layers.contains(&r.layer) {
            return Err(at(
                path,
                n,
                format!(
                    "layer {} is not an MoE layer of the header ({:?})",
                    r.layer, h.moe_layers
                ),
            ));
        }
        if !r.cpu.is_empty() && r.cpu.len() != h.top_k {
            return Err(at(
                path,
                n,
                format!(
                    "{} CPU flags; the header's top_k is {}",
                    r.cpu.len(),
                    h.top_k
                ),
            ));
        }
        if r.experts.len() != h.top_k || r.weights.len() != h.top_k || r.hit.len() != h.top_k {
            return Err(at(
                path,
                n,
                format!(
                    "{} experts, {} weights and {} hit flags; the header's top_k is {}",
                    r.experts.len(),
                    r.weights.len(),
                    r.hit.len(),
                    h.top_k
                ),
            ));
        }
        if let Some(&e) = r
            .experts
            .iter()
            .chain(&r.evicted)
            .chain(&r.loaded)
            .find(|&&e| e as usize >= h.num_experts)
        {
            return Err(at(
                path,
                n,
                format!(
                    "expert {e} is outside the header's {} experts",
                    h.num_experts
                ),
            ));
        }
        if let Some(w) = r.weights.iter().find(|w| !w.is_finite()) {
            return Err(at(path, n, format!("router weight {w} is not finite")));
        }
        if r.step < last_step {
            return Err(at(
                path,
                n,
                format!(
                    "step {} after step {last_step}: steps must not go back",
                    r.step
                ),
            ));
        }
        last_step = r.step;
        lines.push(r);
    }
    let header = header.ok_or_else(|| Error::bad_file(path, "empty: no trace header"))?;
    Ok(Trace {
        path: path.to_path_buf(),
        header,
        lines,
    })
}

impl Trace {
    /// Of the experts routed in (step, layer)s that carry a guess (`predicted`), the share
    /// the guess held (counted once per step and layer); None without guesses.
    pub fn prediction_accuracy(&self) -> Option<f64> {
        let (mut held, mut all) = (0u64, 0u64);
        let mut key: Option<(u64, usize)> = None;
        let mut seen: Vec<u32> = Vec::new();
        let mut guess: Vec<u32> = Vec::new();
        for r in self.lines.iter().filter(|r| !r.warmup) {
            if key != Some((r.step, r.layer)) {
                key = Some((r.step, r.layer));
                seen.clear();
                guess = r.predicted.clone();
            }
            if guess.is_empty() {
                continue;
            }
            for &e in &r.experts {
                if !seen.contains(&e) {
                    seen.push(e);
                    all += 1;
                    held += u64::from(guess.contains(&e));
                }
            }
        }
        (all > 0).then(|| held as f64 / all as f64)
    }

    /// The steps per MoE layer, in the order the cache served them.
    pub fn step_groups(&self) -> StepGroups {
        let layers = self.header.moe_layers.clone();
        let mut g = StepGroups {
            steps: vec![Vec::new(); layers.len()],
            guesses: vec![Vec::new(); layers.len()],
            layers,
            ..Default::default()
        };
        let mut current: Option<u64> = None;
        let mut first_layer: Option<usize> = None;
        for r in &self.lines {
            if current != Some(r.step) {
                current = Some(r.step);
                first_layer = Some(r.layer);
                g.counted.push(!r.warmup);
                g.phase.push(r.phase);
                g.tokens.push(0);
                for s in g.steps.iter_mut().chain(&mut g.guesses) {
                    s.push(Vec::new());
                }
            }
            if first_layer == Some(r.layer) {
                if let Some(t) = g.tokens.last_mut() {
                    *t += 1;
                }
            }
            if let Some(i) = g.layers.iter().position(|&l| l == r.layer) {
                if let Some(s) = g.steps[i].last_mut() {
                    s.extend_from_slice(&r.experts);
                }
                // The guess is on the layer's first line of the step.
                if let Some(s) = g.guesses[i].last_mut().filter(|s| s.is_empty()) {
                    s.extend_from_slice(&r.predicted);
                }
            }
        }
        g
    }
}

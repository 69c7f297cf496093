//! The CPU backend of the MoE op: routed INT4 experts computed on host threads, straight
//! from the packed layout the GPU kernels read (`crate::blocks::quant`) and the host source holds:
//! no repacking and no expanded copy. A missed expert's bytes are already in host memory;
//! at batch 1 reading them once on the CPU costs less than moving them over the bus.
//!
//! [`CpuExperts::run`] computes `out[t] += w · down(silu(gate · x_t) * (up · x_t))` for a
//! set of (token, expert, weight) pairs, in f32, the pairs of one expert sharing each read
//! of its weights. Rows are spread over a rayon pool; the inner loops are written for the
//! compiler's auto-vectorisation, built three times on x86-64 (baseline SSE2, AVX2 + FMA,
//! and AVX-512F, the best the CPU has chosen at run time).

mod kernel;

use std::collections::BTreeMap;
use std::time::Instant;

use rayon::prelude::*;

use crate::blocks::quant::{Q4Matrix, Q4SlotLayout};
use crate::error::{Error, Result};
use kernel::{Interleaved, Isa};

/// One routed (token, expert) pair and its router weight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExpertPair {
    pub token: u32,
    pub expert: u32,
    pub weight: f32,
}

/// One expert's packed slot and its (token, weight) pairs.
type Group<'a> = (&'a [u8], Vec<(usize, f32)>);

/// Rows per task: enough work per task to amortise scheduling, small enough that both
/// matrices of a decode step spread over every thread.
const ROWS_PER_TASK: usize = 32;

pub struct CpuExperts {
    pool: rayon::ThreadPool,
    isa: Isa,
}

/// Counters of the work done (metrics).
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuExpertStats {
    pub pairs: u64,
    pub experts: u64,
    pub seconds: f64,
    /// Packed expert bytes read (each expert's slot once per call that uses it).
    pub bytes: u64,
}

impl CpuExperts {
    /// `threads`: worker threads (None: one per available core).
    pub fn new(threads: Option<usize>) -> Result<Self> {
        let n = match threads {
            Some(0) => return Err(Error::option("--cpu-threads", "must be at least 1")),
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("wgmoe-cpu-experts-{i}"))
            .build()
            .map_err(|e| Error::Other(format!("CPU expert threads: {e}")))?;
        Ok(CpuExperts {
            pool,
            isa: Isa::detect(),
        })
    }

    /// The same kernel built for the target's baseline instruction set only (tests of the
    /// path CPUs without AVX2 + FMA take).
    pub fn with_baseline_isa(mut self) -> Self {
        self.isa = Isa::Baseline;
        self
    }

    /// At most the AVX2 + FMA loops, even where the CPU has AVX-512 (tests of the path
    /// CPUs without AVX-512 take).
    pub fn without_avx512(mut self) -> Self {
        self.isa = self.isa.at_most(Isa::Avx2Fma);
        self
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// The instruction set the kernel runs with ("avx2+fma", "sse2", "neon", ...).
    pub fn isa(&self) -> &'static str {
        self.isa.name()
    }

    /// `out[t * hidden ..][..hidden] += w · expert(x_t)` for every pair. `x` holds the
    /// tokens' expert inputs, `[T, hidden]`; `expert(e)` gives expert e's packed slot
    /// (`layout.bytes` bytes, in `layout`: a layer's). Returns what was done.
    pub fn run<'a>(
        &self,
        layout: &Q4SlotLayout,
        expert: &(dyn Fn(u32) -> Result<&'a [u8]> + Sync),
        x: &[f32],
        pairs: &[ExpertPair],
        out: &mut [f32],
    ) -> Result<CpuExpertStats> {
        let t0 = Instant::now();
        let l = layout;
        let (h, inter) = (l.hidden, l.inter);
        let tokens = x.len() / h.max(1);
        if x.len() != tokens * h || out.len() != x.len() {
            return Err(Error::Other(format!(
                "internal: CPU experts: x has {} floats and out {}, hidden {h}",
                x.len(),
                out.len()
            )));
        }
        if let Some(p) = pairs.iter().find(|p| p.token as usize >= tokens) {
            return Err(Error::Other(format!(
                "internal: CPU experts: pair for token {} of {tokens}",
                p.token
            )));
        }
        // Pairs grouped by expert, in expert order: each group reads its weights once.
        let mut groups: BTreeMap<u32, Vec<(usize, f32)>> = BTreeMap::new();
        for p in pairs {
            groups
                .entry(p.expert)
                .or_default()
                .push((p.token as usize, p.weight));
        }
        let groups: Vec<Group<'a>> = groups
            .into_iter()
            .map(|(e, toks)| {
                let s = expert(e)?;
                if s.len() != l.bytes {
                    return Err(Error::Other(format!(
                        "internal: expert {e} has {} packed bytes, the layout {}",
                        s.len(),
                        l.bytes
                    )));
                }
                Ok((s, toks))
            })
            .collect::<Result<_>>()?;
        let isa = self.isa;
        self.pool.install(|| {
            // Activations in the nibbles' column order, once per token.
            let used: Vec<usize> = {
                let mut u: Vec<usize> = pairs.iter().map(|p| p.token as usize).collect();
                u.sort_unstable();
                u.dedup();
                u
            };
            let mut xi: Vec<Option<Interleaved>> = (0..tokens).map(|_| None).collect();
            let built: Vec<(usize, Interleaved)> = used
                .par_iter()
                .map(|&t| (t, Interleaved::new(&x[t * h..(t + 1) * h], &l.gate)))
                .collect();
            for (t, v) in built {
                xi[t] = Some(v);
            }

            // Gate/up + SiLU: per group, rows [n][token] so a task's rows are contiguous.
            let mut hbuf: Vec<Vec<f32>> = groups
                .iter()
                .map(|(_, toks)| vec![0.0; inter * toks.len()])
                .collect();
            let mut tasks: Vec<(usize, usize, &mut [f32])> = Vec::new();
            for (g, buf) in hbuf.iter_mut().enumerate() {
                let nt = groups[g].1.len();
                for (c, chunk) in buf.chunks_mut(ROWS_PER_TASK * nt).enumerate() {
                    tasks.push((g, c * ROWS_PER_TASK, chunk));
                }
            }
            tasks.into_par_iter().for_each(|(g, n0, chunk)| {
                let (slot, toks) = &groups[g];
                let acts: Vec<&Interleaved> =
                    toks.iter().filter_map(|(t, _)| xi[*t].as_ref()).collect();
                kernel::swiglu_rows(isa, l, slot, n0, &acts, chunk);
            });

            // Down, weighted: rows [m][pair] into ybuf, then added into out per token.
            let hi: Vec<Vec<Interleaved>> = groups
                .iter()
                .zip(&hbuf)
                .map(|((_, toks), hb)| {
                    let nt = toks.len();
                    (0..nt)
                        .map(|ti| {
                            let col: Vec<f32> = (0..inter).map(|n| hb[n * nt + ti]).collect();
                            Interleaved::new(&col, &l.down)
                        })
                        .collect()
                })
                .collect();
            let mut ybuf = vec![0.0f32; h * tokens];
            ybuf.par_chunks_mut(ROWS_PER_TASK * tokens)
                .enumerate()
                .for_each(|(c, chunk)| {
                    let m0 = c * ROWS_PER_TASK;
                    for ((slot, toks), acts) in groups.iter().zip(&hi) {
                        kernel::down_rows(isa, l, slot, m0, toks, acts, tokens, chunk);
                    }
                });
            for (m, row) in ybuf.chunks_exact(tokens).enumerate() {
                for (t, &v) in row.iter().enumerate() {
                    out[t * h + m] += v;
                }
            }
        });
        Ok(CpuExpertStats {
            pairs: pairs.len() as u64,
            experts: groups.len() as u64,
            seconds: t0.elapsed().as_secs_f64(),
            bytes: (groups.len() * l.bytes) as u64,
        })
    }
}

/// The packed bytes of matrix `m` (a section of a slot) for row `n`.
fn row_bytes<'a>(m: &Q4Matrix, q: &'a [u8], n: usize) -> &'a [u8] {
    let len = m.vec4_per_row() * 16;
    &q[n * len..(n + 1) * len]
}

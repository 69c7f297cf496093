//! Running steps of the forward pass: one submission per step with every expert
//! resident, or one per layer (plus expert batches) when the routing must reach the host
//! (partial residency, profile recording, routing traces).

use crate::backend::{KernelTimes, Prepared, Work};
use crate::error::{Error, Result};
use std::time::Instant;

use crate::model::forward::{Forward, Head};
use crate::model::residency::ExpertPlacement;
use crate::model::residency::GpuState;
use crate::model::tensors::ExpertStore;
use crate::model::weights::Mlp;

/// The reads of one step's results on their way to the host (`Forward::start_token_read`).
pub struct StepRead {
    token: crate::backend::PendingRead,
    logits: Option<crate::backend::PendingRead>,
}

/// The programs after the layers for a head.
fn heads(f: &Forward, head: Head) -> Result<Vec<&Prepared>> {
    Ok(match head {
        Head::None => vec![],
        Head::Last => vec![&f.head_last],
        Head::LastArgmax => vec![&f.head_last, f.argmax()],
        Head::All => match &f.head_all {
            Some((h, a)) => vec![h, a],
            None => return Err(Error::Other("all-position logits were not enabled".into())),
        },
    })
}

impl Forward {
    /// Process tokens at positions [pos0, pos0 + n). `ids` (if given) are uploaded as the
    /// step's input; otherwise the input is what the previous argmax wrote.
    pub fn submit(&mut self, pos0: usize, n: usize, ids: Option<&[u32]>, head: Head) -> Result<()> {
        self.submit_at(pos0, n, ids, head, 0)
    }

    /// `submit` for a sequence whose KV rows start at row `kv0` of the cache (a `serve
    /// --parallel` slot's region: positions [pos0, pos0 + n) occupy rows kv0 + pos).
    pub fn submit_at(
        &mut self,
        pos0: usize,
        n: usize,
        ids: Option<&[u32]>,
        head: Head,
        kv0: usize,
    ) -> Result<()> {
        if kv0 > 0 && kv0 + pos0 + n > self.opts.max_context {
            return Err(Error::Other(format!(
                "internal: KV rows {}..{} beyond the cache's {}",
                kv0 + pos0,
                kv0 + pos0 + n,
                self.opts.max_context
            )));
        }
        if n == 0 || n > self.opts.prefill_chunk {
            return Err(Error::Other(format!(
                "step of {n} tokens (chunk {})",
                self.opts.prefill_chunk
            )));
        }
        if pos0 + n > self.opts.max_context {
            return Err(Error::option(
                "--max-new-tokens",
                format!(
                    "position {} exceeds the context of {} positions",
                    pos0 + n,
                    self.opts.max_context
                ),
            ));
        }
        if head == Head::All && n > self.logit_rows() {
            return Err(Error::Other(format!(
                "internal: logits of {n} positions asked of a step that holds {}",
                self.logit_rows()
            )));
        }
        if let Some(ids) = ids {
            self.dev.write(&self.ids, 0, bytemuck::cast_slice(ids))?;
        }
        self.dev.write_step_at(&self.step, pos0, n, kv0)?;
        self.batched = false;
        self.run_step(pos0, n, ids.is_some(), head)
    }

    /// A batched step: token t is `tokens[t] = (position, first KV row of its sequence,
    /// id)`, each sequence attending to its own rows; the logits of every token come back
    /// (`read_logits(tokens.len())`). Needs `opts.batch` >= tokens.len() >= 2 (one token
    /// runs as `submit_at`).
    pub fn submit_batch(&mut self, tokens: &[(usize, usize, u32)]) -> Result<()> {
        let b = tokens.len();
        if b < 2 || b > self.opts.batch {
            return Err(Error::Other(format!(
                "internal: a batched step of {b} sequences (2..={})",
                self.opts.batch
            )));
        }
        let v = self.cfg.vocab_size;
        for &(pos, kv0, id) in tokens {
            if pos + kv0 >= self.opts.max_context {
                return Err(Error::Other(format!(
                    "internal: KV row {} beyond the cache's {}",
                    pos + kv0,
                    self.opts.max_context
                )));
            }
            if id as usize >= v {
                return Err(Error::Other(format!(
                    "token id {id} is outside the vocabulary (vocab_size {v})"
                )));
            }
        }
        let ids: Vec<u32> = tokens.iter().map(|t| t.2).collect();
        self.dev.write(&self.ids, 0, bytemuck::cast_slice(&ids))?;
        let places: Vec<(usize, usize)> = tokens.iter().map(|t| (t.0, t.1)).collect();
        self.dev.write_step_batch(&self.step, &places)?;
        self.batched = true;
        let r = self.run_step(tokens[0].0, b, true, Head::All);
        self.batched = false;
        r
    }

    /// The programs of a step whose uniform is written.
    fn run_step(&mut self, pos0: usize, n: usize, new_ids: bool, head: Head) -> Result<()> {
        self.step_pos0 = u32::try_from(pos0).unwrap_or(crate::backend::LONGEST);
        if self.residency.is_some() || self.record_routing || self.tracing() {
            self.trace_begin(pos0, new_ids);
            return self.submit_segmented(n, head);
        }
        let heads = heads(self, head)?;
        let copy_token = matches!(head, Head::LastArgmax | Head::All);
        let profiled = match self.kernel_profile.is_some() {
            true => Some(self.profile_step(n, &heads)?),
            false => None,
        };
        // Every expert resident: the whole step is one submission.
        let t = n as u32;
        let solo = self.solo_mlp(n);
        let mut work: Vec<Work> = Vec::new();
        for l in &self.layers {
            let (pre, post) = l.step_programs(n, self.batched);
            work.push(Work::Run {
                program: pre,
                tokens: t,
                pos0: self.step_pos0,
            });
            if solo {
                self.push_solo_mlp(l, n, &mut work)?;
            } else {
                work.push(Work::Run {
                    program: post,
                    tokens: t,
                    pos0: self.step_pos0,
                });
            }
        }
        for p in &heads {
            work.push(Work::Run {
                program: p,
                tokens: t,
                pos0: self.step_pos0,
            });
        }
        if copy_token {
            work.push(self.token_copy());
        }
        if let Some(c) = self.logits_copy().filter(|_| head != Head::None) {
            work.push(c);
        }
        let s = self.dev.submit(&work)?;
        self.counters.dispatches += s.dispatches as u64;
        self.counters.submissions += 1;
        if let (Some(p), Some((times, clock, wall_s))) = (self.kernel_profile.as_mut(), profiled) {
            p.add(!new_ids, n, times, clock, wall_s);
        }
        Ok(())
    }

    fn token_copy(&self) -> Work<'_> {
        Work::Copy {
            src: &self.ids,
            src_offset: 0,
            dst: &self.token_ring[self.token_slot],
            dst_offset: 0,
            bytes: 4,
        }
    }

    /// The copy of the step's last logits row into its ring slot (`copy_logits`).
    fn logits_copy(&self) -> Option<Work<'_>> {
        let dst = self
            .logits_ring
            .get(self.token_slot)
            .filter(|_| self.copy_logits)?;
        Some(Work::Copy {
            src: &self.logits,
            src_offset: 0,
            dst,
            dst_offset: 0,
            bytes: (self.cfg.vocab_size * 4) as u64,
        })
    }

    /// Use ring slot `slot` for the next steps' token (and logits) copies; with
    /// `logits`, steps copy their last logits row too (the ring is made on first use).
    pub fn use_slot(&mut self, slot: usize, logits: bool) -> Result<()> {
        if slot >= self.token_ring.len() {
            return Err(Error::Other(format!(
                "internal: readback slot {slot} of {}",
                self.token_ring.len()
            )));
        }
        if logits {
            while self.logits_ring.len() <= slot {
                let b = self.dev.alloc(
                    "logits_ring",
                    (self.cfg.vocab_size * 4) as u64,
                    crate::backend::Usage::Readback,
                )?;
                self.logits_ring.push(b);
            }
        }
        self.token_slot = slot;
        self.copy_logits = logits;
        Ok(())
    }

    /// Start reading the token (and, with `copy_logits`, the logits row) the last
    /// submitted step copied into its slot; the host goes on while they land.
    pub fn start_token_read(&self) -> Result<StepRead> {
        let token = self.dev.start_read(&self.token_ring[self.token_slot], 4)?;
        let logits = match self.logits_ring.get(self.token_slot) {
            Some(b) if self.copy_logits => {
                Some(self.dev.start_read(b, (self.cfg.vocab_size * 4) as u64)?)
            }
            _ => None,
        };
        Ok(StepRead { token, logits })
    }

    /// The token and logits of a started read (waits for that step only).
    pub fn finish_token_read(&self, r: StepRead) -> Result<(u32, Option<Vec<f32>>)> {
        let b = self.dev.finish_read(r.token)?;
        let id = match b.as_slice() {
            [a, b, c, d, ..] => u32::from_le_bytes([*a, *b, *c, *d]),
            _ => return Err(Error::Gpu("token readback returned no data".into())),
        };
        let logits = match r.logits {
            Some(l) => Some(bytemuck::pod_collect_to_vec(&self.dev.finish_read(l)?)),
            None => None,
        };
        Ok((id, logits))
    }

    /// `--profile-kernels`: every dispatch of the step run once more, timed, before the
    /// step itself; its times, the clock, and the replay's wall seconds.
    fn profile_step(
        &self,
        n: usize,
        heads: &[&Prepared],
    ) -> Result<(KernelTimes, crate::backend::ProfileClock, f64)> {
        let t0 = std::time::Instant::now();
        // The replay is the step itself (every buffer it reads it writes first, or writes
        // again with the same values: the KV rows of its positions), except the token ids
        // its embedding reads and its argmax overwrites: kept and put back.
        let ids = self.dev.read(&self.ids, 0, self.ids.size())?;
        let mut times = KernelTimes::new();
        let t = n as u32;
        let mut clock = crate::backend::ProfileClock::GpuTimestamps;
        let programs = self
            .layers
            .iter()
            .flat_map(|l| {
                let (pre, post) = l.step_programs(n, self.batched);
                [pre, post]
            })
            .chain(heads.iter().copied());
        for p in programs {
            clock = self.dev.profile(p, t, self.step_pos0, &mut times)?;
        }
        self.dev.write(&self.ids, 0, &ids)?;
        Ok((times, clock, t0.elapsed().as_secs_f64()))
    }

    /// One step with the routing of every layer brought to the host: submission l holds
    /// layer l-1's MLP and layer l's attention and router, then the router's expert ids
    /// (k per token, a few bytes) are read back, the cache makes them resident (uploads,
    /// then one table publication), and the next submission reads them.
    ///
    /// In one-token steps with `--prefetch next-layer` (or a trace) submission l also
    /// applies the next MoE layer's router to layer l's hidden state; its guess comes back
    /// with the ids, and the guessed experts not resident are staged and copied into the
    /// next layer's prefetch slots while layer l's experts run (`model::residency::overlap`). A cached
    /// layer's hits run as soon as the routing is known while its misses are staged off
    /// this thread; their copies are submitted when the staging is full.
    ///
    /// A layer with CPU experts also reads back the router weights and the experts' input
    /// in the same copy; the miss policy splits its experts; the device's share is
    /// submitted on its own, and while it runs the CPU computes the rest from the host
    /// source; their weighted sum is written into `host_y`, which the layer's MLP block
    /// (in the next submission) adds.
    fn submit_segmented(&mut self, n: usize, head: Head) -> Result<()> {
        let r = self.submit_layers(n, head);
        if r.is_err() {
            // Prefetch copies staged and never submitted are returned (nothing published),
            // and a table left holding a step's partial mapping is the published one again.
            if let Some(res) = self.residency.as_mut() {
                res.abandon_prefetch(&self.dev);
                let w = &self.weights;
                let restored = res.after_submit(&self.dev, |l| match &w.layers.get(l)?.mlp {
                    Mlp::Moe { slot_of, .. } => Some(slot_of.clone()),
                    _ => None,
                });
                if let (Err(first), Err(e)) = (&r, restored) {
                    return Err(Error::Gpu(format!(
                        "{first}; then restoring the published expert tables failed: {e}"
                    )));
                }
            }
        }
        r
    }

    fn submit_layers(&mut self, n: usize, head: Head) -> Result<()> {
        let copy_token = matches!(head, Head::LastArgmax | Head::All);
        let head_programs = heads(self, head)?.len();
        let (k, h) = (self.cfg.top_k, self.cfg.hidden_size);
        let t = n as u32;
        let dev = self.dev.clone();
        let mut dispatches = 0;
        let mut submissions = 0;
        // Experts the previous submission's successor reads: (layer, wanted).
        let mut reads: Option<(usize, Vec<u32>)> = None;
        let layers = self.layers.len();
        let (ids_bytes, xn_bytes) = ((n * k * 4) as u64, (n * h * 4) as u64);
        // Traces read the router's weights back too, after the ids (as CPU experts do).
        let tracing = self.tracing();
        let prefetching = self
            .residency
            .as_ref()
            .is_some_and(|r| r.prefetch.guesses());
        // One-token steps guess each next MoE layer's routing (prefetch, traces).
        let guessing = n == 1 && (prefetching || tracing);
        let width = self.opts.predict_width;
        // Per layer, the guess the previous MoE layer's readback made for it.
        let mut guesses: Vec<Option<Vec<u32>>> = vec![None; layers];
        if let Some(r) = self.residency.as_mut() {
            r.begin_step();
        }
        for l in 0..=layers {
            let placement = self
                .residency
                .as_ref()
                .map_or(ExpertPlacement::Device, |r| r.placement(l));
            let routed = l < layers
                && self.cfg.sparse_layers[l]
                && (placement != ExpertPlacement::Device || self.record_routing || tracing);
            let host_term = routed && placement.host_term();
            let predict = match self.layers.get(l).and_then(|p| p.predict.as_ref()) {
                Some(p) if routed && guessing => Some(p),
                _ => None,
            };
            let mut work: Vec<Work> = Vec::new();
            if l > 0 {
                work.push(Work::Run {
                    program: self.layers[l - 1].post_for(n),
                    tokens: t,
                    pos0: self.step_pos0,
                });
            }
            if l < layers {
                work.push(Work::Run {
                    program: self.layers[l].pre_for(self.batched),
                    tokens: t,
                    pos0: self.step_pos0,
                });
                if let Some(p) = predict {
                    work.push(Work::Run {
                        program: p,
                        tokens: t,
                        pos0: self.step_pos0,
                    });
                }
            } else {
                let hp = [&self.head_last, self.argmax()];
                let all = self.head_all.as_ref().map(|(h, a)| [h, a]);
                let programs: &[&Prepared] = match head {
                    Head::All => all.as_ref().map_or(&[], |a| &a[..]),
                    _ => &hp[..head_programs],
                };
                for p in programs {
                    work.push(Work::Run {
                        program: p,
                        tokens: t,
                        pos0: self.step_pos0,
                    });
                }
            }
            if routed {
                work.push(Work::Copy {
                    src: &self.topk_ids,
                    src_offset: 0,
                    dst: &self.route_readback,
                    dst_offset: 0,
                    bytes: ids_bytes,
                });
            }
            if host_term || (routed && tracing) {
                work.push(Work::Copy {
                    src: &self.topk_weights,
                    src_offset: 0,
                    dst: &self.route_readback,
                    dst_offset: ids_bytes,
                    bytes: ids_bytes,
                });
            }
            if host_term {
                work.push(Work::Copy {
                    src: &self.xn,
                    src_offset: 0,
                    dst: &self.route_readback,
                    dst_offset: 2 * ids_bytes,
                    bytes: xn_bytes,
                });
            }
            let read_bytes = if host_term {
                2 * ids_bytes + xn_bytes
            } else if tracing {
                2 * ids_bytes
            } else {
                ids_bytes
            };
            if predict.is_some() {
                work.push(Work::Copy {
                    src: &self.predict_ids,
                    src_offset: 0,
                    dst: &self.route_readback,
                    dst_offset: read_bytes,
                    bytes: (width * 4) as u64,
                });
            }
            if l == layers && copy_token {
                work.push(self.token_copy());
            }
            if l == layers && head != Head::None {
                if let Some(c) = self.logits_copy() {
                    work.push(c);
                }
            }
            let s = dev.submit(&work)?;
            drop(work);
            dispatches += s.dispatches;
            submissions += 1;
            if let Some(r) = self.residency.as_mut() {
                if let Some((rl, wanted)) = reads.take() {
                    r.mark_read(rl, &wanted, s.token)?;
                }
                let w = &self.weights;
                r.after_submit(&dev, |l| match &w.layers.get(l)?.mlp {
                    Mlp::Moe { slot_of, .. } => Some(slot_of.clone()),
                    _ => None,
                })?;
                // The next layer's guessed experts, staged meanwhile, copied now.
                r.flush_prefetch(&dev, s.token, |l| match &w.layers.get(l)?.mlp {
                    Mlp::Moe {
                        experts: ExpertStore::Int4(p),
                        ..
                    } => Some(p),
                    _ => None,
                })?;
            }
            if !routed {
                continue;
            }
            let bytes = dev.map_read(
                &self.route_readback,
                read_bytes + predict.map_or(0, |_| (width * 4) as u64),
            )?;
            // The device has run out of work: from now it waits for this thread.
            let ready = Instant::now();
            let route: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
            if route.len() * 4 != bytes.len() || bytes.len() < read_bytes as usize {
                return Err(Error::Gpu(format!(
                    "routing readback returned {} of {read_bytes} bytes",
                    bytes.len()
                )));
            }
            if let Some(r) = self.residency.as_mut() {
                r.resolve_stalls()?;
            }
            let next = (l + 1..layers).find(|&m| self.cfg.sparse_layers[m]);
            let guess_next = match (predict, next) {
                (Some(_), Some(m)) => {
                    let g = route[read_bytes as usize / 4..].to_vec();
                    guesses[m] = Some(g.clone());
                    Some((m, g))
                }
                _ => None,
            };
            let ids = &route[..n * k];
            let wanted = crate::residency::distinct(ids);
            // Score the guess for this layer and release the prefetched experts it does
            // not want (before the trace reads the residency).
            let mut prefetched: Vec<u32> = Vec::new();
            if let Some(r) = self.residency.as_mut() {
                prefetched = r.settle_step(l, &wanted, guesses[l].as_deref())?;
            }
            if tracing {
                // A CPU-experts layer first publishes its previous step's admission, so the
                // trace's hit flags are the residency the layer is served with.
                if let (true, Some(r), Mlp::Moe { slot_of, .. }) = (
                    host_term,
                    self.residency.as_mut(),
                    &self.weights.layers[l].mlp,
                ) {
                    if r.caches.get(l).is_some_and(|c| c.is_some()) {
                        r.publish_pending(&dev, l, slot_of)?;
                    }
                }
                let weights: &[f32] = bytemuck::cast_slice(&route[n * k..2 * n * k]);
                self.trace_layer(l, ids, weights, guesses[l].as_deref(), &prefetched);
            }
            if let Some(p) = self.profile.as_mut() {
                for g in ids.chunks(k) {
                    p.record_group(l, g);
                }
            }
            if host_term {
                let weights: &[f32] = bytemuck::cast_slice(&route[n * k..2 * n * k]);
                let xn: &[f32] = bytemuck::cast_slice(&route[2 * n * k..2 * n * k + n * h]);
                let (ro, d) = self.serve_hybrid(l, n, ids, weights, xn, guess_next)?;
                dispatches += d;
                submissions += ro;
                continue;
            }
            let Some(r) = self.residency.as_mut() else {
                continue;
            };
            let Mlp::Moe {
                experts: ExpertStore::Int4(pool),
                slot_of,
                ..
            } = &self.weights.layers[l].mlp
            else {
                if let Some((m, g)) = &guess_next {
                    r.issue_prefetch(&dev, *m, g, 0)?;
                }
                continue;
            };
            let batches = match r.caches.get(l) {
                Some(Some(c)) => {
                    let cfg = c.config();
                    crate::residency::expert_batches(
                        &wanted,
                        |e| c.table().slot_of(e).is_some(),
                        cfg.capacity,
                        cfg.spares,
                    )
                }
                _ => {
                    if let Some((m, g)) = &guess_next {
                        r.issue_prefetch(&dev, *m, g, 0)?;
                    }
                    continue;
                }
            };
            // More than one plan's worth of experts: all but the last batch run here,
            // each in its own submission after its uploads; the next submission (this
            // layer's MLP block) serves the last batch and combines.
            let Some((last, earlier)) = batches.split_last() else {
                continue;
            };
            let mut gpu = GpuState::IdleSince(ready);
            if !earlier.is_empty() {
                let Some(routed) = self.layers[l].routed_only.as_ref() else {
                    return Err(Error::Other(format!(
                        "layer {l}: the {} experts routed in one step need {} cache plans, and expert batches were not built",
                        wanted.len(),
                        batches.len()
                    )));
                };
                for b in earlier {
                    r.serve_on(&dev, l, b, pool, slot_of, gpu)?;
                    let s = dev.submit(&[Work::Run {
                        program: routed,
                        tokens: t,
                        pos0: self.step_pos0,
                    }])?;
                    dispatches += s.dispatches;
                    submissions += 1;
                    gpu = GpuState::Busy(s.token);
                    r.mark_read(l, b, s.token)?;
                }
            }
            // The hits run now, while the misses are staged, then the next layer's guess
            // is queued behind them, then the misses' copies go as soon as they are full.
            let hits = self.layers[l].hits_for(n).map(|p| (p, t));
            let open = r.begin_serve(&dev, l, last, slot_of, hits, gpu)?;
            if open.hits_submitted() {
                submissions += 1;
            }
            if let Some((m, g)) = &guess_next {
                r.issue_prefetch(&dev, *m, g, 0)?;
            }
            r.finish_serve(&dev, open, pool, slot_of)?;
            reads = Some((l, last.clone()));
        }
        self.trace_end_step()?;
        self.counters.dispatches += dispatches as u64;
        self.counters.submissions += submissions;
        Ok(())
    }

    /// A layer with CPU experts, after its routing came back: the device's share is made
    /// resident and submitted, the CPU computes the rest meanwhile, and their sum goes to
    /// `host_y` before the layer's MLP block is submitted. Returns the submissions and
    /// dispatches made.
    fn serve_hybrid(
        &mut self,
        l: usize,
        n: usize,
        ids: &[u32],
        weights: &[f32],
        xn: &[f32],
        guess_next: Option<(usize, Vec<u32>)>,
    ) -> Result<(u64, usize)> {
        let (k, h) = (self.cfg.top_k, self.cfg.hidden_size);
        let dev = self.dev.clone();
        let Some(r) = self.residency.as_mut() else {
            return Err(Error::Other(
                "internal: CPU experts without a residency runtime".into(),
            ));
        };
        let Mlp::Moe {
            experts, slot_of, ..
        } = &self.weights.layers[l].mlp
        else {
            return Err(Error::Other(format!(
                "internal: layer {l} has no routed experts"
            )));
        };
        let pool = match experts {
            ExpertStore::Int4(p) => Some((p, slot_of)),
            _ => None,
        };
        let split = r.split(&dev, l, n, ids, weights, k, pool)?;
        let (mut subs, mut disp) = (0, 0);
        if !split.device.is_empty() {
            if let Some(routed) = self.layers[l].routed_for(n) {
                let s = dev.submit(&[Work::Run {
                    program: routed,
                    tokens: n as u32,
                    pos0: self.step_pos0,
                }])?;
                subs += 1;
                disp += s.dispatches;
                r.mark_read(l, &split.device, s.token)?;
            }
        }
        // The next layer's guesses worth copying are staged while the CPU computes.
        if let Some((m, g)) = &guess_next {
            r.issue_prefetch(&dev, *m, g, split.cpu.len())?;
        }
        // The CPU's share (and any admission's staging), while the device computes its own.
        let mut sum = vec![0.0f32; n * h];
        r.compute_and_admit(
            &dev,
            l,
            xn,
            &split.cpu,
            &mut sum,
            split.admission,
            pool.map(|(p, _)| p),
        )?;
        let Some(host_y) = self.host_y.as_ref() else {
            return Err(Error::Other("internal: no host_y buffer".into()));
        };
        dev.write(host_y, 0, bytemuck::cast_slice(&sum))?;
        Ok((subs, disp))
    }

    /// The token id written by the last argmax (blocks until the step finished).
    pub fn read_token(&self) -> Result<u32> {
        let b = self.dev.map_read(&self.token_ring[self.token_slot], 4)?;
        match b.as_slice() {
            [a, b, c, d, ..] => Ok(u32::from_le_bytes([*a, *b, *c, *d])),
            _ => Err(Error::Gpu("token readback returned no data".into())),
        }
    }

    /// Logits rows [0, rows) of the last step (row 0 = last token with `Head::Last*`).
    pub fn read_logits(&self, rows: usize) -> Result<Vec<f32>> {
        self.dev.read_f32(&self.logits, rows * self.cfg.vocab_size)
    }

    /// Overwrite the next step's input token (after host-side sampling).
    pub fn set_token(&self, id: u32) -> Result<()> {
        self.dev.write(&self.ids, 0, &id.to_le_bytes())
    }
}

//! Hiding the host-to-device copy of a cached layer's misses (`model::residency`'s upload
//! path, split in phases the forward pass interleaves with its submissions):
//!
//! 1. [`begin_serve`](Residency::begin_serve): the layer's plan; its misses' staging
//!    fills are queued on the fill threads; with a hits program the hits run at once, in
//!    a submission of their own, reading a table that maps only the experts already
//!    there (resident, or prefetched and now wanted).
//! 2. [`issue_prefetch`](Residency::issue_prefetch): the next MoE layer's guessed experts
//!    (from this layer's readback) are reserved in its prefetch slots and queued for
//!    staging behind this layer's misses.
//! 3. [`finish_serve`](Residency::finish_serve): as soon as the misses' staging is full
//!    their copies are submitted, the plan is published, and the table the layer's MLP
//!    block reads maps only the misses (the hits were summed already); the published
//!    table is written after that submission ([`after_submit`](Residency::after_submit)).
//! 4. [`flush_prefetch`](Residency::flush_prefetch), after the next submission: the
//!    prefetch copies are submitted (before the next layer's routing is read back).
//!
//! Nothing changes in the generation protocol: copies land in unpublished slots, a plan
//! is published only after its copies were submitted, a slot is written only once every
//! submission that read it completed, and a failure aborts what was not published.
//!
//! The device's wait for a copy (`upload_stall_seconds`) is counted from when it ran out
//! of submitted work (the routing readback, or the completion of the submission it ran
//! meanwhile, seen by the fence watcher) to when the staging of the copy was full.

use std::time::Instant;

use super::{ExpertPlacement, Residency};
use crate::backend::{Buffer, Device, Prepared, Work};
use crate::error::{Error, Result};
use crate::model::tensors::Q4Pool;
use crate::residency::{break_even_precision, CacheError, Placement, Plan, NO_SLOT};

/// What the device does while a layer's copies are staged.
#[derive(Clone, Copy, Debug)]
pub enum GpuState {
    /// Nothing since this moment (the routing readback returned).
    IdleSince(Instant),
    /// This submission (then nothing).
    Busy(u64),
}

/// A copy given a staging buffer: its fill's id once queued (None: queued when its copy
/// is submitted, the inline prefetch fills that must not delay the next submission), and
/// whether the test hook fails it.
#[derive(Clone, Copy, Debug)]
struct Staged {
    staging: usize,
    expert: u32,
    slot: u32,
    fill: Option<u64>,
    fail: Option<&'static str>,
}

/// A layer's plan being served (`begin_serve` .. `finish_serve`).
pub struct OpenServe {
    layer: usize,
    plan: Plan,
    /// Uploads given no staging buffer yet (more misses than free buffers).
    todo: Vec<Placement>,
    staged: Vec<Staged>,
    gpu: GpuState,
    /// The hits' own submission and the experts it read.
    hits: Option<(u64, Vec<u32>)>,
    /// The device table holds a partial mapping written for the hits' submission.
    partial_table: bool,
}

impl OpenServe {
    /// The hits ran in a submission of their own.
    pub fn hits_submitted(&self) -> bool {
        self.hits.is_some()
    }
}

/// Prefetch copies being staged for `layer`.
pub struct PrefetchFill {
    layer: usize,
    staged: Vec<Staged>,
}

impl Residency {
    /// The layer's routing is known (`wanted`: its distinct experts; `guess`: what the
    /// previous MoE layer's readback predicted for it, if anything): score the guess and
    /// release the prefetched experts the step does not want. Returns those it wants.
    pub fn settle_step(
        &mut self,
        layer: usize,
        wanted: &[u32],
        guess: Option<&[u32]>,
    ) -> Result<Vec<u32>> {
        if let Some(g) = guess {
            if let (Some(n), Some(p)) = (self.guessed.get_mut(layer), self.predicted.get_mut(layer))
            {
                *n += wanted.len() as u64;
                *p += wanted.iter().filter(|e| g.contains(e)).count() as u64;
            }
        }
        // The gate judges the guess's copy candidates, copied or held back.
        if let (Some(Some((cands, copied))), Some(gate)) = (
            self.judging.get_mut(layer).map(Option::take),
            self.gates.get_mut(layer),
        ) {
            let chosen = cands.iter().filter(|e| wanted.contains(e)).count();
            gate.record(cands.len(), chosen, copied);
        }
        match self.caches.get_mut(layer).and_then(|c| c.as_mut()) {
            Some(c) => Ok(c
                .settle_prefetch(wanted)
                .map_err(Error::from)?
                .used
                .iter()
                .map(|p| p.expert)
                .collect()),
            None => Ok(Vec::new()),
        }
    }

    /// Plan `wanted` in `layer`, queue its misses' staging fills and, with `hits` (the
    /// layer's routed experts alone, for `tokens` tokens) and fill threads, submit the
    /// hits now. `gpu`: what the device runs meanwhile.
    pub fn begin_serve(
        &mut self,
        dev: &Device,
        layer: usize,
        wanted: &[u32],
        slot_of: &Buffer,
        hits: Option<(&Prepared, u32)>,
        gpu: GpuState,
    ) -> Result<OpenServe> {
        let plan = loop {
            let Some(cache) = self.caches.get_mut(layer).and_then(|c| c.as_mut()) else {
                return Err(Error::Other(format!(
                    "internal: layer {layer} has no cache"
                )));
            };
            match cache.plan(wanted, self.policy.as_mut(), dev) {
                Ok(p) => break p,
                Err(CacheError::NotNow { wait_for, .. }) => dev.wait(wait_for)?,
                Err(e) => return Err(Error::DoesNotFit(e.to_string())),
            }
        };
        let mut open = OpenServe {
            layer,
            todo: plan.uploads().to_vec(),
            plan,
            staged: Vec::new(),
            gpu,
            hits: None,
            partial_table: false,
        };
        if open.todo.is_empty() {
            return Ok(open);
        }
        self.stage_ready(dev, &mut open, false)?;
        let ready: Vec<u32> = open
            .plan
            .hits()
            .iter()
            .chain(open.plan.prefetched())
            .map(|p| p.expert)
            .collect();
        if let (Some((program, tokens)), false, true) =
            (hits, ready.is_empty(), self.fills.threads() > 0)
        {
            let r = self.submit_hits(dev, &mut open, slot_of, program, tokens, ready);
            if let Err(e) = r {
                return Err(self.fail_serve(dev, open, slot_of, e));
            }
        }
        Ok(open)
    }

    /// The hits' submission, reading a table with the prefetched experts the plan
    /// publishes (their copies were submitted earlier) added to the published ones.
    fn submit_hits(
        &mut self,
        dev: &Device,
        open: &mut OpenServe,
        slot_of: &Buffer,
        program: &Prepared,
        tokens: u32,
        ready: Vec<u32>,
    ) -> Result<()> {
        if !open.plan.prefetched().is_empty() {
            let mut words = self.table_words(open.layer)?;
            for p in open.plan.prefetched() {
                words[p.expert as usize] = p.slot;
            }
            dev.write(slot_of, 0, bytemuck::cast_slice(&words))?;
            open.partial_table = true;
        }
        // The routed experts only: no position-sized grid.
        let s = dev.submit(&[Work::Run {
            program,
            tokens,
            pos0: crate::backend::LONGEST,
        }])?;
        open.gpu = GpuState::Busy(s.token);
        open.hits = Some((s.token, ready));
        Ok(())
    }

    fn table_words(&self, layer: usize) -> Result<Vec<u32>> {
        match self.caches.get(layer).and_then(|c| c.as_ref()) {
            Some(c) => Ok(c.table().words().to_vec()),
            None => Err(Error::Other(format!(
                "internal: layer {layer} has no cache"
            ))),
        }
    }

    /// Give staging buffers to the uploads still without one (waiting for a buffer's
    /// copy to complete only if `wait` and none is free) and queue their fills.
    fn stage_ready(&mut self, dev: &Device, open: &mut OpenServe, wait: bool) -> Result<()> {
        while let Some(&u) = open.todo.first() {
            let idx = match self.staging.acquire(dev) {
                Some(i) => i,
                None if wait && open.staged.is_empty() => self.acquire_staging(dev)?,
                None => break,
            };
            open.todo.remove(0);
            self.uploads_done += 1;
            let fail = (self.inject.fail_upload == Some(self.uploads_done)).then_some("a miss");
            let fill = self.fills.fill(open.layer, u.expert, idx, fail);
            open.staged.push(Staged {
                staging: idx,
                expert: u.expert,
                slot: u.slot,
                fill: Some(fill),
                fail,
            });
        }
        Ok(())
    }

    /// Submit the plan's copies as their staging fills, then publish it. The table the
    /// layer's MLP block reads next maps only the misses when the hits ran on their own.
    pub fn finish_serve(
        &mut self,
        dev: &Device,
        mut open: OpenServe,
        pool: &Q4Pool,
        slot_of: &Buffer,
    ) -> Result<()> {
        let t0 = Instant::now();
        let mut token = None;
        while !open.staged.is_empty() || !open.todo.is_empty() {
            if open.staged.is_empty() {
                if let Err(e) = self.stage_ready(dev, &mut open, true) {
                    return Err(self.fail_serve(dev, open, slot_of, e));
                }
            }
            let mut staged = std::mem::take(&mut open.staged);
            match self.submit_staged(dev, open.layer, &mut staged, pool, open.gpu) {
                Ok(t) => {
                    token = Some(t);
                    open.gpu = GpuState::Busy(t);
                }
                Err(e) => {
                    // Its fills are done (submit_staged waits for every one).
                    self.unstage(dev, &staged);
                    return Err(self.fail_serve(dev, open, slot_of, e));
                }
            }
            if let Err(e) = self.stage_ready(dev, &mut open, false) {
                return Err(self.fail_serve(dev, open, slot_of, e));
            }
        }
        let layer = open.layer;
        let Some(cache) = self.caches.get_mut(layer).and_then(|c| c.as_mut()) else {
            return Err(Error::Other(format!(
                "internal: layer {layer} has no cache"
            )));
        };
        let copies = open.plan.uploads().len();
        if let Some(t) = token {
            cache.complete_uploads(&open.plan, t).map_err(Error::from)?;
            self.h2d_bytes += (copies * self.host.slot_bytes) as u64;
            self.upload_seconds += t0.elapsed().as_secs_f64();
        }
        let before = cache.generation();
        cache
            .publish(&open.plan, self.policy.as_mut())
            .map_err(Error::from)?;
        if let Some((t, read)) = &open.hits {
            cache.mark_read(read, *t).map_err(Error::from)?;
            // The hits were summed: the MLP block computes the misses alone.
            let mut words = vec![NO_SLOT; cache.table().words().len()];
            for u in open.plan.uploads() {
                words[u.expert as usize] = u.slot;
            }
            dev.write(slot_of, 0, bytemuck::cast_slice(&words))?;
            self.deferred_tables.push(layer);
        } else if cache.generation() != before || open.partial_table {
            // Lands before the next submission, which is the first to read this layer.
            dev.write(slot_of, 0, bytemuck::cast_slice(cache.table().words()))?;
        }
        Ok(())
    }

    /// Wait for `staged`'s fills (queueing those not queued yet), submit their copies into
    /// `pool` (releasing their staging with the copy's token) and count the device's wait
    /// for them. Every fill has finished when this returns, even with an error.
    fn submit_staged(
        &mut self,
        dev: &Device,
        layer: usize,
        staged: &mut [Staged],
        pool: &Q4Pool,
        gpu: GpuState,
    ) -> Result<u64> {
        let queued: Vec<u64> = staged.iter().filter_map(|s| s.fill).collect();
        let pending = queued.len() < staged.len() || !self.fills.all_done(&queued);
        let ticket = match gpu {
            GpuState::Busy(t) if pending => Some(self.fills.watch(t)),
            _ => None,
        };
        for s in staged.iter_mut().filter(|s| s.fill.is_none()) {
            s.fill = Some(self.fills.fill(layer, s.expert, s.staging, s.fail));
        }
        let ids: Vec<u64> = staged.iter().filter_map(|s| s.fill).collect();
        let full = self.fills.wait(&ids);
        let ticket = ticket.transpose()?;
        let full = full?;
        let mut pending: Vec<(usize, usize, u64, u64)> = staged
            .iter()
            .map(|s| {
                let (chunk, off) = pool.locate(s.slot as usize);
                (s.staging, chunk, off, self.host.slot_bytes as u64)
            })
            .collect();
        let token = self.submit_uploads(dev, pool, &mut pending)?;
        match (gpu, ticket) {
            (GpuState::IdleSince(t), _) => {
                self.add_stall(layer, full.saturating_duration_since(t).as_secs_f64());
            }
            (GpuState::Busy(_), Some(ticket)) => self.stalls.push((ticket, full, layer)),
            (GpuState::Busy(_), None) => {}
        }
        Ok(token)
    }

    /// Return the staging buffers of copies never submitted (their fills finished).
    fn unstage(&mut self, dev: &Device, staged: &[Staged]) {
        for s in staged {
            dev.unstage(&self.staging_bufs[s.staging]);
            let _ = self.staging.cancel(s.staging);
        }
    }

    /// Undo a plan after a failure: the fills still queued finish first, their staging is
    /// returned, the plan aborted and the device table set back to the published one.
    fn fail_serve(&mut self, dev: &Device, open: OpenServe, slot_of: &Buffer, e: Error) -> Error {
        let ids: Vec<u64> = open.staged.iter().filter_map(|s| s.fill).collect();
        let _ = self.fills.wait(&ids);
        self.unstage(dev, &open.staged);
        if let Some(cache) = self.caches.get_mut(open.layer).and_then(|c| c.as_mut()) {
            let _ = cache.abort(&open.plan);
            if open.partial_table {
                let _ = dev.write(slot_of, 0, bytemuck::cast_slice(cache.table().words()));
            }
        }
        e
    }

    /// Reserve `layer`'s prefetch slots for `guess` and queue their staging fills behind
    /// what is queued already. Never waits: a guess finding no free slot or staging buffer
    /// is not prefetched. With CPU misses the cost model keeps only the guesses whose copy
    /// pays and finishes within the layer's device time.
    /// `cpu_pairs`: the (token, expert) pairs the CPU computes in the current layer (its
    /// time is part of the window a copy has).
    pub fn issue_prefetch(
        &mut self,
        dev: &Device,
        layer: usize,
        guess: &[u32],
        cpu_pairs: usize,
    ) -> Result<()> {
        let guess: Vec<u32> = match self.placement(layer) {
            ExpertPlacement::Cached => guess.to_vec(),
            ExpertPlacement::Hybrid => self.worth_prefetching(layer, guess, cpu_pairs),
            _ => return Ok(()),
        };
        let Some(cache) = self.caches.get_mut(layer).and_then(|c| c.as_mut()) else {
            return Ok(());
        };
        if cache.config().prefetch == 0 || guess.is_empty() {
            return Ok(());
        }
        if self.prefetch.gated() {
            // What a copy would move: the guesses not resident, as many as the slots.
            let cands = cache.prefetch_candidates(&guess);
            let threshold =
                self.figures
                    .as_ref()
                    .map_or(crate::residency::HIDDEN_COPY_BREAK_EVEN, |f| {
                        let slot = f.slot_bytes as f64;
                        let copy = slot / f.h2d_bytes_per_s;
                        let hidden = cache.config().top_k as f64 * slot / f.gpu_bytes_per_s;
                        break_even_precision(copy, hidden)
                    });
            let open = match self.gates.get_mut(layer) {
                Some(g) => {
                    g.set_threshold(threshold);
                    g.is_open()
                }
                None => true,
            };
            if let Some(j) = self.judging.get_mut(layer) {
                *j = Some((cands, open));
            }
            if !open {
                return Ok(());
            }
        }
        let placed = cache.prefetch(&guess, dev).map_err(Error::from)?;
        let mut staged = Vec::with_capacity(placed.len());
        for (i, p) in placed.iter().enumerate() {
            let Some(idx) = self.staging.acquire(dev) else {
                if let Some(c) = self.caches.get_mut(layer).and_then(|c| c.as_mut()) {
                    c.cancel_prefetch(&placed[i..]).map_err(Error::from)?;
                }
                break;
            };
            self.uploads_done += 1;
            let fail = (self.inject.fail_upload == Some(self.uploads_done))
                .then_some("a guess copied ahead");
            // Without fill threads the fill runs at flush, after the next submission.
            let fill =
                (self.fills.threads() > 0).then(|| self.fills.fill(layer, p.expert, idx, fail));
            staged.push(Staged {
                staging: idx,
                expert: p.expert,
                slot: p.slot,
                fill,
                fail,
            });
        }
        if !staged.is_empty() {
            self.inflight.push(PrefetchFill { layer, staged });
        }
        Ok(())
    }

    /// The guesses of a layer beside CPU experts worth copying: those not resident whose
    /// copy pays (the cost model's upload choice for one use plus the expected reuse), as
    /// many as finish within the current layer's expert time (the device's top_k experts
    /// or the CPU's `cpu_pairs`, whichever is longer), from the start-up figures.
    fn worth_prefetching(&self, layer: usize, guess: &[u32], cpu_pairs: usize) -> Vec<u32> {
        let (Some(f), Some(cache)) = (
            self.figures.as_ref(),
            self.caches.get(layer).and_then(|c| c.as_ref()),
        ) else {
            return Vec::new();
        };
        let cfg = *cache.config();
        let slot = f.slot_bytes as f64;
        let copy = slot / f.h2d_bytes_per_s;
        let window = (cfg.top_k as f64 * slot / f.gpu_bytes_per_s)
            .max(cpu_pairs as f64 * slot / f.cpu_bytes_per_s);
        let fit = if copy > 0.0 && copy.is_finite() {
            (window / copy).floor() as usize
        } else {
            0
        };
        guess
            .iter()
            .copied()
            .filter(|&e| cache.table().slot_of(e).is_none())
            .filter(|&e| f.upload_pays(1.0 + self.reuse_expected(layer, e, cfg.capacity)))
            .take(fit)
            .collect()
    }

    /// Submit the prefetch copies whose staging was queued (waiting for their fills; the
    /// device meanwhile runs submission `busy`). `pool_of(layer)`: the layer's pool.
    pub fn flush_prefetch<'p>(
        &mut self,
        dev: &Device,
        busy: u64,
        pool_of: impl Fn(usize) -> Option<&'p Q4Pool>,
    ) -> Result<()> {
        let fills = std::mem::take(&mut self.inflight);
        let mut failure = None;
        for pf in fills {
            let placed: Vec<Placement> = pf
                .staged
                .iter()
                .map(|s| Placement {
                    expert: s.expert,
                    slot: s.slot,
                })
                .collect();
            let mut staged = pf.staged;
            // Whether every queued fill was waited for (submit_staged always does).
            let mut waited = false;
            let r = match (failure.is_some(), pool_of(pf.layer)) {
                (false, Some(pool)) => {
                    waited = true;
                    self.submit_staged(dev, pf.layer, &mut staged, pool, GpuState::Busy(busy))
                }
                (false, None) => Err(Error::Other(format!(
                    "internal: layer {} has no INT4 pool",
                    pf.layer
                ))),
                (true, _) => Err(Error::Other("an earlier prefetch failed".into())),
            };
            let Some(cache) = self.caches.get_mut(pf.layer).and_then(|c| c.as_mut()) else {
                continue;
            };
            match r {
                Ok(t) => {
                    cache.complete_prefetch(&placed, t).map_err(Error::from)?;
                    self.h2d_bytes += (placed.len() * self.host.slot_bytes) as u64;
                    if let Some(v) = self.step_issued.get_mut(pf.layer) {
                        v.extend(placed.iter().map(|p| p.expert));
                    }
                }
                Err(e) => {
                    let _ = cache.cancel_prefetch(&placed);
                    // Nothing was submitted: every fill finishes before its staging returns.
                    if !waited {
                        let ids: Vec<u64> = staged.iter().filter_map(|s| s.fill).collect();
                        let _ = self.fills.wait(&ids);
                    }
                    self.unstage(dev, &staged);
                    failure.get_or_insert(e);
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// After a failed step: prefetch copies staged and not submitted are given up (their
    /// fills finish first, their staging and prefetch slots are returned).
    pub fn abandon_prefetch(&mut self, dev: &Device) {
        for pf in std::mem::take(&mut self.inflight) {
            let ids: Vec<u64> = pf.staged.iter().filter_map(|s| s.fill).collect();
            let _ = self.fills.wait(&ids);
            self.unstage(dev, &pf.staged);
            let placed: Vec<Placement> = pf
                .staged
                .iter()
                .map(|s| Placement {
                    expert: s.expert,
                    slot: s.slot,
                })
                .collect();
            if let Some(c) = self.caches.get_mut(pf.layer).and_then(|c| c.as_mut()) {
                let _ = c.cancel_prefetch(&placed);
            }
        }
    }

    /// After a submission: the published tables of layers whose device table held a
    /// step's partial mapping for it (that submission read them; the next reads the
    /// published one).
    pub fn after_submit(
        &mut self,
        dev: &Device,
        slot_of: impl Fn(usize) -> Option<Buffer>,
    ) -> Result<()> {
        for l in std::mem::take(&mut self.deferred_tables) {
            let (Some(c), Some(buf)) = (self.caches.get(l).and_then(|c| c.as_ref()), slot_of(l))
            else {
                continue;
            };
            dev.write(&buf, 0, bytemuck::cast_slice(c.table().words()))?;
        }
        Ok(())
    }

    /// Count the device's waits whose watched submission has completed (after a routing
    /// readback every earlier submission has).
    pub fn resolve_stalls(&mut self) -> Result<()> {
        for (ticket, full, layer) in std::mem::take(&mut self.stalls) {
            let done = ticket.completed_at()?;
            self.add_stall(layer, full.saturating_duration_since(done).as_secs_f64());
        }
        Ok(())
    }

    fn add_stall(&mut self, layer: usize, s: f64) {
        self.stall_seconds += s;
        if let Some(x) = self.step_stall.get_mut(layer) {
            *x += s;
        }
    }

    /// A step starts: the per-step accumulators the trace reads are cleared.
    pub fn begin_step(&mut self) {
        self.step_stall.iter_mut().for_each(|x| *x = 0.0);
        self.step_issued.iter_mut().for_each(Vec::clear);
    }

    /// This step's copies ahead and wait for copies of `layer` (for the trace).
    pub fn step_copies(&self, layer: usize) -> (Vec<u32>, f64) {
        (
            self.step_issued.get(layer).cloned().unwrap_or_default(),
            self.step_stall.get(layer).copied().unwrap_or(0.0),
        )
    }
}

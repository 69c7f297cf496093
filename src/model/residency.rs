//! Partial expert residency on a device: the residency state machine of `crate::residency`
//! (cache, staging pool, policies) driven through the backend seam, whose submission tokens
//! are its fence.
//!
//! Per routed layer of a step: the layer's router output (k expert ids per token) is read
//! back (one small readback), the cache plans hits and misses, each miss is filled from the
//! host source into a staging buffer on the CPU and copied into an unpublished slot, and
//! once the group's copies are submitted the new expert->slot table is published with one
//! write that lands before the submission that reads it.
//!
//! With CPU experts (`ExpertPlacement::Hybrid`, `Host`), the readback also carries the
//! router weights and the experts' input; the miss policy splits the layer's experts into
//! those served by the device (hits, plus the misses it chooses to upload) and those
//! computed on the CPU from the host source (`backend::cpu`), whose weighted sum the
//! layer's combine adds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use crate::backend::cpu::{CpuExperts, ExpertPair};
use crate::backend::{Buffer, Device, Staging, Work};
use crate::error::{Error, Result};
use crate::model::fills::{FillPool, Ticket};
use crate::model::tensors::Q4Pool;
use crate::residency::{
    choose_uploads, CacheConfig, CacheError, CostFigures, ExpertCache, HostSource, MissPolicy,
    Policy, Prefetch, PrefetchGate, Reuse, StagingPool,
};

mod overlap;
mod stats;
pub use overlap::GpuState;
pub use stats::ResidencyStats;

/// Where one layer's routed experts live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExpertPlacement {
    /// Every expert resident on the device (or a dense layer).
    Device,
    /// A device cache fed from the host source; every miss is uploaded.
    Cached,
    /// A device cache fed from the host source; the miss policy computes misses on the
    /// CPU or uploads them.
    Hybrid,
    /// No device slots: every routed expert is computed on the CPU.
    Host,
}

impl ExpertPlacement {
    /// The layer's combine adds a CPU-computed term.
    pub fn host_term(self) -> bool {
        matches!(self, ExpertPlacement::Hybrid | ExpertPlacement::Host)
    }

    pub fn has_cache(self) -> bool {
        matches!(self, ExpertPlacement::Cached | ExpertPlacement::Hybrid)
    }
}

/// How one routed layer's step is served with CPU experts.
#[derive(Debug, Default)]
pub struct HybridStep {
    /// Experts the device computes (resident when the step's routed program runs).
    pub device: Vec<u32>,
    /// Pairs the CPU computes.
    pub cpu: Vec<ExpertPair>,
    /// Misses admitted into the cache: computed on the CPU this step, copied to the
    /// device meanwhile, published at the layer's next step.
    pub admission: Option<Admission>,
}

/// An open cache plan whose uploads are staged in the background.
#[derive(Debug)]
pub struct Admission {
    plan: crate::residency::Plan,
    /// (staging buffer, expert, pool chunk, byte offset in it).
    uploads: Vec<(usize, u32, usize, u64)>,
}

/// Test hook: fail the n-th upload (counting from 1) as if mapping its staging buffer had
/// failed, before the group is published.
#[derive(Clone, Copy, Debug, Default)]
pub struct FailureInjection {
    pub fail_upload: Option<u64>,
}

pub struct Residency {
    pub caches: Vec<Option<ExpertCache<Device>>>,
    /// `--prefetch` in effect (off where no layer has prefetch slots) and its width.
    pub prefetch: Prefetch,
    pub prefetch_width: usize,
    /// Per layer: distinct experts routed where a guess was made, and those it held.
    pub(crate) guessed: Vec<u64>,
    pub(crate) predicted: Vec<u64>,
    /// Per layer: `--prefetch next-layer`'s gate, and the copy candidates of the guess made
    /// for the layer's current step, with whether the gate let them be copied.
    pub(crate) gates: Vec<PrefetchGate>,
    pub(crate) judging: Vec<Option<(Vec<u32>, bool)>>,
    /// Prefetch copies staged and not yet submitted (`flush_prefetch`).
    pub(crate) inflight: Vec<overlap::PrefetchFill>,
    /// Staging fills off the submitting thread, and the fence watcher.
    pub(crate) fills: FillPool,
    pub(crate) stall_seconds: f64,
    /// Waits for staging whose device idle time is known once the watched submission
    /// completed: (its ticket, when the staging was full, the layer).
    pub(crate) stalls: Vec<(Ticket, Instant, usize)>,
    /// Per layer, this step's wait for copies and the experts copied ahead (traces).
    pub(crate) step_stall: Vec<f64>,
    pub(crate) step_issued: Vec<Vec<u32>>,
    /// Layers whose device table holds a step's partial mapping (the hits, or the misses)
    /// until the published table is written after the next submission.
    pub(crate) deferred_tables: Vec<usize>,
    pub placement: Vec<ExpertPlacement>,
    pub miss: MissPolicy,
    /// The CPU expert kernel (with CPU experts).
    pub cpu: Option<CpuExperts>,
    /// Measured at start-up (`auto`).
    pub figures: Option<CostFigures>,
    reuse: Reuse,
    /// Per layer: an admission whose copies are submitted, published at its next step.
    pending: Vec<Option<crate::residency::Plan>>,
    /// Misses copied to the device by admissions (counted when submitted).
    admitted: u64,
    cpu_pairs: u64,
    cpu_seconds: f64,
    cpu_misses: Vec<u64>,
    pub policy: Box<dyn Policy>,
    pub host: Arc<HostSource>,
    pub(crate) staging: StagingPool<Device>,
    pub(crate) staging_bufs: Arc<[Staging]>,
    pub h2d_bytes: u64,
    pub upload_seconds: f64,
    pub(crate) uploads_done: u64,
    pub inject: FailureInjection,
}

/// An upload staged but not yet submitted: (staging index, chunk, byte offset, bytes).
type Pending = (usize, usize, u64, u64);

/// What `Residency::new` is built from.
pub struct ResidencyConfig<'a> {
    pub placement: &'a [ExpertPlacement],
    pub top_k: usize,
    /// Resident experts per layer with a cache.
    pub capacity: usize,
    pub staging_buffers: usize,
    pub miss: MissPolicy,
    /// CPU expert threads (None: one per core).
    pub cpu_threads: Option<usize>,
    /// `--prefetch`, its width (prefetch slots per cached layer), `--fill-threads`.
    pub prefetch: Prefetch,
    pub prefetch_width: usize,
    pub fill_threads: usize,
}

impl Residency {
    pub fn new(
        dev: &Device,
        host: HostSource,
        rc: &ResidencyConfig,
        policy: Box<dyn Policy>,
    ) -> Result<Self> {
        let e = host.num_experts;
        let width = match rc.prefetch {
            Prefetch::Off => 0,
            Prefetch::NextLayer | Prefetch::NextLayerUngated => rc.prefetch_width,
        };
        let mut caches = Vec::new();
        for (l, &p) in rc.placement.iter().enumerate() {
            let config = match p {
                ExpertPlacement::Cached => Some(CacheConfig::partial(l, e, rc.top_k, rc.capacity)),
                ExpertPlacement::Hybrid => Some(CacheConfig::hybrid(l, e, rc.top_k, rc.capacity)),
                ExpertPlacement::Device | ExpertPlacement::Host => None,
            }
            .map(|c| c.with_prefetch(width));
            caches.push(match config {
                Some(c) => Some(
                    ExpertCache::new(c).map_err(|er| Error::option("--resident-experts", er.0))?,
                ),
                None => None,
            });
        }
        let uploads = rc.placement.iter().any(|p| p.has_cache());
        let staging_buffers = if uploads { rc.staging_buffers } else { 0 };
        let staging = StagingPool::new(staging_buffers.max(1))
            .map_err(|er| Error::option("--staging-buffers", er.0))?;
        let staging_bufs: Arc<[Staging]> = (0..staging_buffers)
            .map(|_| dev.staging(host.slot_bytes as u64))
            .collect::<Result<Vec<_>>>()?
            .into();
        let host = Arc::new(host);
        let fills = FillPool::new(dev, host.clone(), staging_bufs.clone(), rc.fill_threads)?;
        let prefetching = caches
            .iter()
            .flatten()
            .any(|c: &ExpertCache<Device>| c.config().prefetch > 0);
        let layers = rc.placement.len();
        let cpu = if rc.placement.iter().any(|p| p.host_term()) {
            Some(CpuExperts::new(rc.cpu_threads)?)
        } else {
            None
        };
        Ok(Residency {
            caches,
            prefetch: if prefetching {
                rc.prefetch
            } else {
                Prefetch::Off
            },
            prefetch_width: if prefetching { width } else { 0 },
            guessed: vec![0; layers],
            predicted: vec![0; layers],
            gates: vec![PrefetchGate::new(crate::residency::HIDDEN_COPY_BREAK_EVEN); layers],
            judging: vec![None; layers],
            inflight: Vec::new(),
            fills,
            stall_seconds: 0.0,
            stalls: Vec::new(),
            step_stall: vec![0.0; layers],
            step_issued: vec![Vec::new(); layers],
            deferred_tables: Vec::new(),
            placement: rc.placement.to_vec(),
            miss: rc.miss,
            cpu,
            figures: None,
            reuse: Reuse::new(rc.placement.len(), e),
            pending: (0..rc.placement.len()).map(|_| None).collect(),
            admitted: 0,
            cpu_pairs: 0,
            cpu_seconds: 0.0,
            cpu_misses: vec![0; rc.placement.len()],
            policy,
            host,
            staging,
            staging_bufs,
            h2d_bytes: 0,
            upload_seconds: 0.0,
            uploads_done: 0,
            inject: FailureInjection::default(),
        })
    }

    /// Uses of `expert` expected while resident in `layer`'s cache of `capacity` slots.
    pub(crate) fn reuse_expected(&self, layer: usize, expert: u32, capacity: usize) -> f64 {
        self.reuse.expected(layer, expert, capacity)
    }

    pub fn placement(&self, layer: usize) -> ExpertPlacement {
        self.placement
            .get(layer)
            .copied()
            .unwrap_or(ExpertPlacement::Device)
    }

    /// Split one routed layer's step (`ids`, `weights`: k per token) between the device
    /// and the CPU as the miss policy says. The device computes the experts resident now
    /// (hits); the misses the policy admits are planned into spare slots, to be staged
    /// while the CPU computes this step's misses (`compute_and_admit`) and published at
    /// the layer's next step, so no step waits for a copy.
    #[allow(clippy::too_many_arguments)]
    pub fn split(
        &mut self,
        dev: &Device,
        layer: usize,
        tokens: usize,
        ids: &[u32],
        weights: &[f32],
        top_k: usize,
        pool: Option<(&Q4Pool, &Buffer)>,
    ) -> Result<HybridStep> {
        let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
        for &e in ids {
            *counts.entry(e).or_default() += 1;
        }
        let mut step = HybridStep::default();
        if let (true, Some((pool, slot_of))) = (self.has_cache(layer), pool) {
            self.publish_pending(dev, layer, slot_of)?;
            self.adopt_prefetched(dev, layer, &counts, pool, slot_of)?;
            let Some(cache) = self.caches.get(layer).and_then(|c| c.as_ref()) else {
                return Err(Error::Other(format!(
                    "internal: layer {layer} has no cache"
                )));
            };
            let cfg = *cache.config();
            let hits: Vec<u32> = counts
                .keys()
                .copied()
                .filter(|&e| cache.table().slot_of(e).is_some())
                .collect();
            let misses: Vec<(u32, usize)> = counts
                .iter()
                .filter(|(e, _)| cache.table().slot_of(**e).is_none())
                .map(|(&e, &n)| (e, n))
                .collect();
            // Room: the spares (and the capacity), one staging buffer per copy. An
            // admission may evict an expert this step hits: the device reads it from the
            // old table now, and its slot is reused only after that read completes.
            let room = cfg.spares.min(cfg.capacity).min(self.staging_bufs.len());
            let reuse = &self.reuse;
            let admit = choose_uploads(
                self.miss,
                &misses,
                room,
                tokens,
                |e| reuse.expected(layer, e, cfg.capacity),
                self.figures.as_ref(),
            );
            let counted: Vec<(u32, usize)> = counts.iter().map(|(&e, &n)| (e, n)).collect();
            self.reuse.observe(layer, &counted, admit.len());
            if admit.is_empty() {
                if !hits.is_empty() {
                    // All hits: the policy sees the accesses; nothing is copied.
                    self.serve(dev, layer, &hits, pool, slot_of)?;
                }
            } else {
                // The admitted experts, then the step's most used hits as capacity allows
                // (kept, and seen by the eviction policy).
                let mut kept: Vec<(u32, usize)> = hits.iter().map(|&e| (e, counts[&e])).collect();
                kept.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                let mut wanted = admit.clone();
                wanted.extend(
                    kept.iter()
                        .map(|&(e, _)| e)
                        .take(cfg.capacity.saturating_sub(admit.len())),
                );
                step.admission = Some(self.plan_admission(dev, layer, &wanted, pool)?);
            }
            step.device = hits;
        }
        for (i, (&e, &w)) in ids.iter().zip(weights).enumerate() {
            if !step.device.contains(&e) {
                step.cpu.push(ExpertPair {
                    token: (i / top_k.max(1)) as u32,
                    expert: e,
                    weight: w,
                });
            }
        }
        self.cpu_misses[layer] += counts.keys().filter(|e| !step.device.contains(e)).count() as u64;
        Ok(step)
    }

    /// Publish the prefetched experts this step wants (their copies were submitted in an
    /// earlier submission), with the step's most used hits kept, so they serve as hits.
    fn adopt_prefetched(
        &mut self,
        dev: &Device,
        layer: usize,
        counts: &BTreeMap<u32, usize>,
        pool: &Q4Pool,
        slot_of: &Buffer,
    ) -> Result<()> {
        let Some(cache) = self.caches.get(layer).and_then(|c| c.as_ref()) else {
            return Ok(());
        };
        let cap = cache.config().capacity;
        let mut wanted: Vec<u32> = cache
            .prefetched()
            .iter()
            .map(|p| p.expert)
            .filter(|e| counts.contains_key(e))
            .take(cap)
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let mut hits: Vec<(u32, usize)> = counts
            .iter()
            .filter(|(e, _)| cache.table().slot_of(**e).is_some())
            .map(|(&e, &n)| (e, n))
            .collect();
        hits.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let room = cap - wanted.len();
        wanted.extend(hits.iter().map(|&(e, _)| e).take(room));
        self.serve(dev, layer, &wanted, pool, slot_of)
    }

    fn has_cache(&self, layer: usize) -> bool {
        matches!(self.caches.get(layer), Some(Some(_)))
    }

    /// Publish the layer's admission of its previous step (its copies were submitted then,
    /// so every later submission sees the data); the table write lands before the next
    /// submission. Idempotent: a second call in the same step finds nothing pending.
    pub(crate) fn publish_pending(
        &mut self,
        dev: &Device,
        layer: usize,
        slot_of: &Buffer,
    ) -> Result<()> {
        let Some(plan) = self.pending.get_mut(layer).and_then(Option::take) else {
            return Ok(());
        };
        let Some(cache) = self.caches.get_mut(layer).and_then(|c| c.as_mut()) else {
            return Ok(());
        };
        cache
            .publish(&plan, self.policy.as_mut())
            .map_err(Error::from)?;
        dev.write(slot_of, 0, bytemuck::cast_slice(cache.table().words()))
    }

    /// Open the plan for `wanted` (the hits and the admitted misses) and reserve a staging
    /// buffer per copy.
    fn plan_admission(
        &mut self,
        dev: &Device,
        layer: usize,
        wanted: &[u32],
        pool: &Q4Pool,
    ) -> Result<Admission> {
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
        let mut uploads = Vec::with_capacity(plan.uploads().len());
        for u in plan.uploads() {
            match self.acquire_staging(dev) {
                Ok(idx) => {
                    let (chunk, off) = pool.locate(u.slot as usize);
                    uploads.push((idx, u.expert, chunk, off));
                }
                Err(e) => {
                    self.abort_admission(layer, &plan, &uploads);
                    return Err(e);
                }
            }
        }
        Ok(Admission { plan, uploads })
    }

    fn abort_admission(
        &mut self,
        layer: usize,
        plan: &crate::residency::Plan,
        staged: &[(usize, u32, usize, u64)],
    ) {
        for &(idx, ..) in staged {
            let _ = self.staging.cancel(idx);
        }
        if let Some(cache) = self.caches.get_mut(layer).and_then(|c| c.as_mut()) {
            let _ = cache.abort(plan);
        }
    }

    /// The CPU's share of a step into `out`, and meanwhile, on a worker thread, the
    /// admission's staging fills; then the admission's copies are submitted (published at
    /// the layer's next step).
    #[allow(clippy::too_many_arguments)]
    pub fn compute_and_admit(
        &mut self,
        dev: &Device,
        layer: usize,
        x: &[f32],
        pairs: &[ExpertPair],
        out: &mut [f32],
        admission: Option<Admission>,
        pool: Option<&Q4Pool>,
    ) -> Result<()> {
        let Some(cpu) = self.cpu.as_ref() else {
            return Err(Error::Other(
                "internal: CPU experts requested without the CPU kernel".into(),
            ));
        };
        let first = self.uploads_done + 1;
        self.uploads_done += admission.as_ref().map_or(0, |a| a.uploads.len() as u64);
        let inject = self.inject.fail_upload;
        let (host, bufs) = (&self.host, &self.staging_bufs);
        let t0 = Instant::now();
        let (computed, filled) = std::thread::scope(|s| {
            let fills = admission.as_ref().map(|a| {
                s.spawn(move || -> Result<()> {
                    for (i, &(idx, expert, ..)) in a.uploads.iter().enumerate() {
                        if inject == Some(first + i as u64) {
                            return Err(Error::Gpu(format!(
                                "injected failure: staging map for expert {expert} of layer {layer}"
                            )));
                        }
                        dev.fill_staging(&bufs[idx], host.expert(layer, expert)?)?;
                    }
                    Ok(())
                })
            });
            let computed = if pairs.is_empty() {
                Ok(Default::default())
            } else {
                host.layout(layer)
                    .and_then(|l| cpu.run(l, &|e| host.expert(layer, e), x, pairs, out))
            };
            let filled = fills.map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Other("the staging thread panicked".into())))
            });
            (computed, filled)
        });
        let fill_s = t0.elapsed().as_secs_f64();
        let st = match computed {
            Ok(st) => st,
            Err(e) => {
                if let Some(a) = &admission {
                    for &(idx, ..) in &a.uploads {
                        dev.unstage(&self.staging_bufs[idx]);
                    }
                    self.abort_admission(layer, &a.plan, &a.uploads);
                }
                return Err(e);
            }
        };
        self.cpu_pairs += st.pairs;
        self.cpu_seconds += st.seconds;
        let (Some(a), Some(pool)) = (admission, pool) else {
            return Ok(());
        };
        if let Some(Err(e)) = filled {
            // Nothing of this admission was published: the previous generation stays.
            for &(idx, ..) in &a.uploads {
                dev.unstage(&self.staging_bufs[idx]);
            }
            self.abort_admission(layer, &a.plan, &a.uploads);
            return Err(e);
        }
        let mut pending: Vec<Pending> = a
            .uploads
            .iter()
            .map(|&(idx, _, chunk, off)| (idx, chunk, off, self.host.slot_bytes as u64))
            .collect();
        let token = self.submit_uploads(dev, pool, &mut pending)?;
        self.h2d_bytes += (a.uploads.len() * self.host.slot_bytes) as u64;
        self.admitted += a.uploads.len() as u64;
        self.upload_seconds += fill_s;
        let Some(cache) = self.caches.get_mut(layer).and_then(|c| c.as_mut()) else {
            return Err(Error::Other(format!(
                "internal: layer {layer} has no cache"
            )));
        };
        cache
            .complete_uploads(&a.plan, token)
            .map_err(Error::from)?;
        if let Some(p) = self.pending.get_mut(layer) {
            *p = Some(a.plan);
        }
        Ok(())
    }

    /// `out` = the weighted sum of `pairs` of `layer` computed on the CPU from the host
    /// source (`x`: the experts' input, [T, hidden]).
    pub fn compute_on_cpu(
        &mut self,
        layer: usize,
        x: &[f32],
        pairs: &[ExpertPair],
        out: &mut [f32],
    ) -> Result<()> {
        let Some(cpu) = self.cpu.as_ref() else {
            return Err(Error::Other(
                "internal: CPU experts requested without the CPU kernel".into(),
            ));
        };
        let host = &self.host;
        let st = cpu.run(
            host.layout(layer)?,
            &|e| host.expert(layer, e),
            x,
            pairs,
            out,
        )?;
        self.cpu_pairs += st.pairs;
        self.cpu_seconds += st.seconds;
        Ok(())
    }

    /// A staging buffer whose previous copy has completed.
    pub(crate) fn acquire_staging(&mut self, dev: &Device) -> Result<usize> {
        loop {
            if let Some(i) = self.staging.acquire(dev) {
                return Ok(i);
            }
            match self.staging.wait_token(dev) {
                Some(t) => dev.wait(t)?,
                None => return Err(Error::Other("staging pool: no buffer to wait for".into())),
            }
        }
    }

    /// Submit the staged uploads; their staging buffers are released with the token.
    pub(crate) fn submit_uploads(
        &mut self,
        dev: &Device,
        pool: &Q4Pool,
        pending: &mut Vec<Pending>,
    ) -> Result<u64> {
        let work: Vec<Work> = pending
            .iter()
            .map(|&(idx, chunk, off, bytes)| Work::Upload {
                staging: &self.staging_bufs[idx],
                dst: &pool.chunks[chunk],
                dst_offset: off,
                bytes,
            })
            .collect();
        let token = dev.submit(&work)?.token;
        for (idx, ..) in pending.drain(..) {
            self.staging
                .release(idx, token)
                .map_err(|e| Error::Other(e.to_string()))?;
        }
        Ok(token)
    }

    /// Make every expert of `wanted` resident in `layer` and publish the new table into
    /// `slot_of`, before the next submission (the first to read it). The device is idle
    /// from `idle_since` (or runs submission `busy`) while the copies are staged.
    pub fn serve(
        &mut self,
        dev: &Device,
        layer: usize,
        wanted: &[u32],
        pool: &Q4Pool,
        slot_of: &Buffer,
    ) -> Result<()> {
        let gpu = GpuState::IdleSince(Instant::now());
        self.serve_on(dev, layer, wanted, pool, slot_of, gpu)
    }

    /// [`serve`](Self::serve) while the device does `gpu` (for the count of its wait).
    pub fn serve_on(
        &mut self,
        dev: &Device,
        layer: usize,
        wanted: &[u32],
        pool: &Q4Pool,
        slot_of: &Buffer,
        gpu: GpuState,
    ) -> Result<()> {
        let open = self.begin_serve(dev, layer, wanted, slot_of, None, gpu)?;
        self.finish_serve(dev, open, pool, slot_of)
    }

    /// Seconds to stage expert `expert` of `layer` and copy it into pool slot `slot`
    /// (waited for), through the runtime's own staging buffers. The slot must not be
    /// published (start-up measurement).
    pub fn time_upload(
        &mut self,
        dev: &Device,
        layer: usize,
        expert: u32,
        pool: &Q4Pool,
        slot: usize,
    ) -> Result<f64> {
        let t0 = Instant::now();
        let idx = self.acquire_staging(dev)?;
        let src = self.host.expert(layer, expert)?;
        if let Err(e) = dev.fill_staging(&self.staging_bufs[idx], src) {
            let _ = self.staging.cancel(idx);
            return Err(e);
        }
        let (chunk, off) = pool.locate(slot);
        let mut pending = vec![(idx, chunk, off, src.len() as u64)];
        let token = self.submit_uploads(dev, pool, &mut pending)?;
        dev.wait(token)?;
        Ok(t0.elapsed().as_secs_f64())
    }

    /// Uploads attempted so far (the failure injection counts them).
    pub fn uploads_attempted(&self) -> u64 {
        self.uploads_done
    }

    /// Record that submission `token` read these experts of `layer`.
    pub fn mark_read(&mut self, layer: usize, wanted: &[u32], token: u64) -> Result<()> {
        if let Some(cache) = self.caches.get_mut(layer).and_then(|c| c.as_mut()) {
            cache.mark_read(wanted, token).map_err(Error::from)?;
        }
        Ok(())
    }
}

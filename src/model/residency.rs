//! Partial expert residency on the GPU: the immutable host source of packed INT4 experts,
//! a bounded pool of mapped staging buffers, and per layer a generation-published cache of
//! expert slots (the state machine in `crate::residency`, here driven by a wgpu fence).
//!
//! Per routed layer of a step: the layer's router output (k expert ids per token) is read
//! back (one small readback), the cache plans hits and misses, each miss is filled from
//! the host source into a staging buffer on the CPU and copied into an unpublished slot,
//! and once the group's copies are submitted the new expert->slot table is published with
//! one write that lands before the submission that reads it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::gpu::tensor::Q4Pool;
use crate::gpu::{GpuBuffer, GpuContext};
use crate::residency::{CacheConfig, CacheError, ExpertCache, Fence, Policy, StagingPool};

/// Completion of our own submission counter, advanced by `on_submitted_work_done`.
pub struct GpuFence {
    completed: Arc<AtomicU64>,
    submitted: u64,
}

impl Fence for GpuFence {
    type Token = u64;
    fn is_complete(&self, t: u64) -> bool {
        self.completed.load(Ordering::Acquire) >= t
    }
}

impl GpuFence {
    fn new() -> Self {
        GpuFence {
            completed: Arc::new(AtomicU64::new(0)),
            submitted: 0,
        }
    }

    /// Submit `cmd` and return its token.
    pub fn submit(&mut self, ctx: &GpuContext, cmd: wgpu::CommandBuffer) -> u64 {
        ctx.queue.submit([cmd]);
        self.submitted += 1;
        let n = self.submitted;
        let done = self.completed.clone();
        ctx.queue.on_submitted_work_done(move || {
            done.fetch_max(n, Ordering::AcqRel);
        });
        n
    }

    /// Block until submission `t` has completed.
    pub fn wait(&self, ctx: &GpuContext, t: u64) -> Result<()> {
        while !self.is_complete(t) {
            ctx.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Gpu(format!("device poll failed: {e}")))?;
        }
        Ok(())
    }
}

/// Where one layer's packed experts live in host memory. Never written after load.
pub enum HostLayer {
    /// A `model.layers.{l}.mlp.experts.int4` tensor of a converted file, memory-mapped
    /// read-only.
    Mapped(String),
    /// Quantised on load, then frozen (a boxed slice is never resized or rewritten).
    Owned(Box<[u8]>),
}

/// The complete, immutable, already-quantised expert set.
pub struct HostSource {
    pub ckpt: Arc<Checkpoint>,
    pub layers: Vec<Option<HostLayer>>,
    pub num_experts: usize,
    pub slot_bytes: usize,
}

impl HostSource {
    pub fn layer_bytes(&self, layer: usize) -> Result<&[u8]> {
        match self.layers.get(layer).and_then(|l| l.as_ref()) {
            Some(HostLayer::Owned(b)) => Ok(b),
            Some(HostLayer::Mapped(name)) => {
                self.ckpt.raw_u8(name, &[self.num_experts, self.slot_bytes])
            }
            None => Err(Error::Other(format!("layer {layer} has no routed experts"))),
        }
    }

    pub fn expert(&self, layer: usize, expert: u32) -> Result<&[u8]> {
        let b = self.layer_bytes(layer)?;
        let s = expert as usize * self.slot_bytes;
        b.get(s..s + self.slot_bytes).ok_or_else(|| {
            Error::Other(format!(
                "expert {expert} of layer {layer} is outside the host source"
            ))
        })
    }

    /// Checksum of every layer's packed experts (tests show it unchanged after a run).
    pub fn checksum(&self) -> Result<u64> {
        let mut h = 0u64;
        for l in 0..self.layers.len() {
            if self.layers[l].is_some() {
                h = h.rotate_left(7) ^ crate::convert::fast_hash(self.layer_bytes(l)?);
            }
        }
        Ok(h)
    }
}

/// Counters reported in `--json` metrics and by the bench.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ResidencyStats {
    pub expert_hits: u64,
    pub expert_misses: u64,
    pub expert_evictions: u64,
    pub h2d_bytes: u64,
    pub upload_seconds: f64,
    pub hits_per_layer: Vec<u64>,
    pub misses_per_layer: Vec<u64>,
    pub evictions_per_layer: Vec<u64>,
    pub staging_buffers: usize,
    pub staging_peak_in_use: usize,
}

/// Test hook: fail the n-th upload (counting from 1) as if mapping its staging buffer had
/// failed, before the group is published.
#[derive(Clone, Copy, Debug, Default)]
pub struct FailureInjection {
    pub fail_upload: Option<u64>,
}

pub struct Residency {
    pub caches: Vec<Option<ExpertCache<GpuFence>>>,
    pub policy: Box<dyn Policy>,
    pub fence: GpuFence,
    pub host: HostSource,
    staging: StagingPool<GpuFence>,
    staging_bufs: Vec<GpuBuffer>,
    mapped: Vec<Arc<AtomicBool>>,
    pub h2d_bytes: u64,
    pub upload_seconds: f64,
    uploads_done: u64,
    pub inject: FailureInjection,
}

impl Residency {
    pub fn new(
        ctx: &GpuContext,
        host: HostSource,
        sparse: &[bool],
        top_k: usize,
        capacity: usize,
        staging_buffers: usize,
        policy: Box<dyn Policy>,
    ) -> Result<Self> {
        let e = host.num_experts;
        let mut caches = Vec::new();
        for (l, &s) in sparse.iter().enumerate() {
            caches.push(if s {
                Some(
                    ExpertCache::new(CacheConfig::partial(l, e, top_k, capacity))
                        .map_err(|er| Error::option("--resident-experts", er.0))?,
                )
            } else {
                None
            });
        }
        let staging = StagingPool::new(staging_buffers)
            .map_err(|er| Error::option("--staging-buffers", er.0))?;
        let mut staging_bufs = Vec::new();
        let mut mapped = Vec::new();
        for _ in 0..staging_buffers {
            // Created mapped: the first fill needs no wait.
            let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("staging"),
                size: (host.slot_bytes as u64).div_ceil(16) * 16,
                usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: true,
            });
            staging_bufs.push(ctx.track(buffer));
            mapped.push(Arc::new(AtomicBool::new(true)));
        }
        Ok(Residency {
            caches,
            policy,
            fence: GpuFence::new(),
            host,
            staging,
            staging_bufs,
            mapped,
            h2d_bytes: 0,
            upload_seconds: 0.0,
            uploads_done: 0,
            inject: FailureInjection::default(),
        })
    }

    pub fn stats(&self) -> ResidencyStats {
        let mut s = ResidencyStats {
            h2d_bytes: self.h2d_bytes,
            upload_seconds: self.upload_seconds,
            staging_buffers: self.staging_bufs.len(),
            staging_peak_in_use: self.staging.stats().peak_in_use,
            ..Default::default()
        };
        for c in &self.caches {
            let st = c.as_ref().map(|c| c.stats()).unwrap_or_default();
            s.expert_hits += st.hits;
            s.expert_misses += st.misses;
            s.expert_evictions += st.evictions;
            s.hits_per_layer.push(st.hits);
            s.misses_per_layer.push(st.misses);
            s.evictions_per_layer.push(st.evictions);
        }
        s
    }

    /// Zero every counter (after warm-up).
    pub fn reset_stats(&mut self) {
        for c in self.caches.iter_mut().flatten() {
            c.reset_stats();
        }
        self.h2d_bytes = 0;
        self.upload_seconds = 0.0;
    }

    /// A staging buffer whose previous copy has completed, mapped for writing.
    fn acquire_staging(&mut self, ctx: &GpuContext) -> Result<usize> {
        let idx = loop {
            if let Some(i) = self.staging.acquire(&self.fence) {
                break i;
            }
            match self.staging.wait_token(&self.fence) {
                Some(t) => self.fence.wait(ctx, t)?,
                None => return Err(Error::Other("staging pool: no buffer to wait for".into())),
            }
        };
        while !self.mapped[idx].load(Ordering::Acquire) {
            ctx.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Gpu(format!("device poll failed: {e}")))?;
        }
        Ok(idx)
    }

    /// Make every expert of `wanted` resident in `layer`, publish the new table into
    /// `slot_of`, and return the experts the next submission reads (for `after_submit`).
    pub fn serve(
        &mut self,
        ctx: &GpuContext,
        layer: usize,
        wanted: &[u32],
        pool: &Q4Pool,
        slot_of: &wgpu::Buffer,
    ) -> Result<()> {
        let Some(cache) = self.caches.get_mut(layer).and_then(|c| c.as_mut()) else {
            return Ok(());
        };
        let plan = loop {
            match cache.plan(wanted, self.policy.as_mut(), &self.fence) {
                Ok(p) => break p,
                Err(CacheError::NotNow { wait_for, .. }) => self.fence.wait(ctx, wait_for)?,
                Err(e) => return Err(Error::DoesNotFit(e.to_string())),
            }
        };
        if !plan.is_all_hits() {
            let t0 = Instant::now();
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            let mut used = Vec::new();
            let mut failure = None;
            for u in plan.uploads() {
                self.uploads_done += 1;
                if self.inject.fail_upload == Some(self.uploads_done) {
                    failure = Some(Error::Gpu(format!(
                        "injected failure: staging map for expert {} of layer {layer}",
                        u.expert
                    )));
                    break;
                }
                if !used.is_empty() && self.staging.in_use() == self.staging_bufs.len() {
                    // Every staging buffer holds a copy not yet submitted: submit those
                    // copies now so the buffers can be reused once they complete.
                    let done = std::mem::replace(
                        &mut enc,
                        ctx.device.create_command_encoder(&Default::default()),
                    );
                    let token = self.fence.submit(ctx, done.finish());
                    for idx in used.drain(..) {
                        self.staging
                            .release(idx, token)
                            .map_err(|e| Error::Other(e.to_string()))?;
                        self.remap(idx);
                    }
                }
                let idx = match self.acquire_staging(ctx) {
                    Ok(i) => i,
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                };
                let src = match self.host.expert(layer, u.expert) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = self.staging.cancel(idx);
                        failure = Some(e);
                        break;
                    }
                };
                let buf = &self.staging_bufs[idx];
                match buf.slice(..src.len() as u64).get_mapped_range_mut() {
                    Ok(mut view) => view.copy_from_slice(src),
                    Err(e) => {
                        let _ = self.staging.cancel(idx);
                        failure = Some(Error::Gpu(format!("staging buffer map: {e}")));
                        break;
                    }
                }
                buf.unmap();
                self.mapped[idx].store(false, Ordering::Release);
                let (chunk, off) = pool.locate(u.slot as usize);
                enc.copy_buffer_to_buffer(buf, 0, &pool.chunks[chunk], off, src.len() as u64);
                used.push(idx);
            }
            if let Some(e) = failure {
                // Nothing of this group was submitted: the previous generation stays.
                for idx in used {
                    let _ = self.staging.cancel(idx);
                    self.remap(idx);
                }
                if let Some(cache) = self.caches.get_mut(layer).and_then(|c| c.as_mut()) {
                    cache.abort(&plan).map_err(Error::from)?;
                }
                return Err(e);
            }
            let token = self.fence.submit(ctx, enc.finish());
            for &idx in &used {
                self.staging
                    .release(idx, token)
                    .map_err(|e| Error::Other(e.to_string()))?;
                self.remap(idx);
            }
            self.h2d_bytes += (plan.uploads().len() * self.host.slot_bytes) as u64;
            self.upload_seconds += t0.elapsed().as_secs_f64();
            if let Some(cache) = self.caches.get_mut(layer).and_then(|c| c.as_mut()) {
                cache.complete_uploads(&plan, token).map_err(Error::from)?;
            }
        }
        let Some(cache) = self.caches.get_mut(layer).and_then(|c| c.as_mut()) else {
            return Ok(());
        };
        let before = cache.generation();
        cache
            .publish(&plan, self.policy.as_mut())
            .map_err(Error::from)?;
        if cache.generation() != before {
            // Lands before the next submission, which is the first to read this layer.
            ctx.write(slot_of, 0, bytemuck::cast_slice(cache.table().words()));
        }
        Ok(())
    }

    /// Ask for a staging buffer to be mapped again once its copy has completed.
    fn remap(&self, idx: usize) {
        let flag = self.mapped[idx].clone();
        self.staging_bufs[idx]
            .slice(..)
            .map_async(wgpu::MapMode::Write, move |r| {
                if r.is_ok() {
                    flag.store(true, Ordering::Release);
                }
            });
    }

    /// Record that submission `token` read these experts of `layer`.
    pub fn mark_read(&mut self, layer: usize, wanted: &[u32], token: u64) -> Result<()> {
        if let Some(cache) = self.caches.get_mut(layer).and_then(|c| c.as_mut()) {
            cache.mark_read(wanted, token).map_err(Error::from)?;
        }
        Ok(())
    }
}

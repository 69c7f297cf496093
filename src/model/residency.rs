//! Partial expert residency on a device: the residency state machine of `crate::residency`
//! (cache, staging pool, policies) driven through the backend seam, whose submission tokens
//! are its fence.
//!
//! Per routed layer of a step: the layer's router output (k expert ids per token) is read
//! back (one small readback), the cache plans hits and misses, each miss is filled from the
//! host source into a staging buffer on the CPU and copied into an unpublished slot, and
//! once the group's copies are submitted the new expert->slot table is published with one
//! write that lands before the submission that reads it.

use std::time::Instant;

use crate::backend::{Buffer, Device, Staging, Work};
use crate::error::{Error, Result};
use crate::model::tensors::Q4Pool;
use crate::residency::{CacheConfig, CacheError, ExpertCache, HostSource, Policy, StagingPool};

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
    pub caches: Vec<Option<ExpertCache<Device>>>,
    pub policy: Box<dyn Policy>,
    pub host: HostSource,
    staging: StagingPool<Device>,
    staging_bufs: Vec<Staging>,
    pub h2d_bytes: u64,
    pub upload_seconds: f64,
    uploads_done: u64,
    pub inject: FailureInjection,
}

/// An upload staged but not yet submitted: (staging index, chunk, byte offset, bytes).
type Pending = (usize, usize, u64, u64);

impl Residency {
    pub fn new(
        dev: &Device,
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
        let staging_bufs = (0..staging_buffers)
            .map(|_| dev.staging(host.slot_bytes as u64))
            .collect::<Result<Vec<_>>>()?;
        Ok(Residency {
            caches,
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

    /// A staging buffer whose previous copy has completed.
    fn acquire_staging(&mut self, dev: &Device) -> Result<usize> {
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
    fn submit_uploads(
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
    /// `slot_of`, before the next submission (the first to read it).
    pub fn serve(
        &mut self,
        dev: &Device,
        layer: usize,
        wanted: &[u32],
        pool: &Q4Pool,
        slot_of: &Buffer,
    ) -> Result<()> {
        let Some(cache) = self.caches.get_mut(layer).and_then(|c| c.as_mut()) else {
            return Ok(());
        };
        let plan = loop {
            match cache.plan(wanted, self.policy.as_mut(), dev) {
                Ok(p) => break p,
                Err(CacheError::NotNow { wait_for, .. }) => dev.wait(wait_for)?,
                Err(e) => return Err(Error::DoesNotFit(e.to_string())),
            }
        };
        if !plan.is_all_hits() {
            let t0 = Instant::now();
            let mut pending: Vec<Pending> = Vec::new();
            let mut failure = None;
            let mut token = None;
            for u in plan.uploads() {
                self.uploads_done += 1;
                if self.inject.fail_upload == Some(self.uploads_done) {
                    failure = Some(Error::Gpu(format!(
                        "injected failure: staging map for expert {} of layer {layer}",
                        u.expert
                    )));
                    break;
                }
                if !pending.is_empty() && self.staging.in_use() == self.staging_bufs.len() {
                    // Every staging buffer holds a copy not yet submitted: submit those
                    // copies now so the buffers can be reused once they complete.
                    token = Some(self.submit_uploads(dev, pool, &mut pending)?);
                }
                let idx = match self.acquire_staging(dev) {
                    Ok(i) => i,
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                };
                let filled = self.host.expert(layer, u.expert).and_then(|src| {
                    dev.fill_staging(&self.staging_bufs[idx], src)
                        .map(|_| src.len())
                });
                match filled {
                    Ok(len) => {
                        let (chunk, off) = pool.locate(u.slot as usize);
                        pending.push((idx, chunk, off, len as u64));
                    }
                    Err(e) => {
                        let _ = self.staging.cancel(idx);
                        failure = Some(e);
                        break;
                    }
                }
            }
            if let Some(e) = failure {
                // Nothing of this group was published: the previous generation stays.
                for (idx, ..) in pending {
                    let _ = self.staging.cancel(idx);
                    dev.unstage(&self.staging_bufs[idx]);
                }
                if let Some(cache) = self.caches.get_mut(layer).and_then(|c| c.as_mut()) {
                    cache.abort(&plan).map_err(Error::from)?;
                }
                return Err(e);
            }
            if !pending.is_empty() {
                token = Some(self.submit_uploads(dev, pool, &mut pending)?);
            }
            self.h2d_bytes += (plan.uploads().len() * self.host.slot_bytes) as u64;
            self.upload_seconds += t0.elapsed().as_secs_f64();
            if let (Some(cache), Some(token)) =
                (self.caches.get_mut(layer).and_then(|c| c.as_mut()), token)
            {
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
            dev.write(slot_of, 0, bytemuck::cast_slice(cache.table().words()))?;
        }
        Ok(())
    }

    /// Record that submission `token` read these experts of `layer`.
    pub fn mark_read(&mut self, layer: usize, wanted: &[u32], token: u64) -> Result<()> {
        if let Some(cache) = self.caches.get_mut(layer).and_then(|c| c.as_mut()) {
            cache.mark_read(wanted, token).map_err(Error::from)?;
        }
        Ok(())
    }
}

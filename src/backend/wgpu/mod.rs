//! The wgpu backend (Vulkan, DX12, Metal; lavapipe in CI): the only place that speaks wgpu.

pub mod adapter;
mod pipeline_cache;
mod record;
pub mod shaders;
mod timestamps;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use crate::backend::{
    Backend, Buffer, DeviceInfo, DeviceRequest, Kernel, KernelTimes, MemTracker,
    NativeBuffer as SeamBuffer, NativePendingRead as SeamPendingRead,
    NativePrepared as SeamPrepared, NativeStaging as SeamStaging, Prepared, Program, Staging,
    Submitted, Usage, Work,
};
use crate::error::{Error, Result};

pub use record::NativePrepared;

pub type NativeBuffer = ::wgpu::Buffer;

/// A staging buffer and where it is in its map/unmap cycle.
pub struct NativeStaging {
    buffer: ::wgpu::Buffer,
    state: Arc<AtomicU8>,
    /// Counts the buffer in the memory tracker while it lives.
    _tracked: Buffer,
}

const MAPPED: u8 = 0;
const UNMAPPED: u8 = 1;
const MAPPING: u8 = 2;

/// A readback buffer being mapped for reading (`Device::start_read`): its map callback's
/// state and the submission it waits for.
pub struct PendingMap {
    buffer: ::wgpu::Buffer,
    /// MAPPING until the callback ran, then MAPPED or UNMAPPED (failed).
    state: Arc<AtomicU8>,
    /// The last submission when the read started; None when nothing was submitted yet.
    index: Option<::wgpu::SubmissionIndex>,
    done: bool,
}

impl Drop for PendingMap {
    fn drop(&mut self) {
        // An abandoned read: unmapping a pending map cancels it, so the buffer can take
        // the next copy (a pipelined step discarded after a stop).
        if !self.done {
            self.buffer.unmap();
        }
    }
}

/// Every adapter wgpu finds for the request, and the one `open` would pick.
pub fn list_adapters(req: &DeviceRequest) -> (Vec<DeviceInfo>, Option<usize>) {
    adapter::list(req)
}

pub struct WgpuDevice {
    device: ::wgpu::Device,
    queue: ::wgpu::Queue,
    info: DeviceInfo,
    tracker: Arc<MemTracker>,
    binding_cap: Option<u64>,
    errors: Arc<Mutex<Vec<String>>>,
    pipelines: Mutex<HashMap<Kernel, ::wgpu::ComputePipeline>>,
    submitted: AtomicU64,
    completed: Arc<AtomicU64>,
    /// wgpu's index of the latest submission (reads wait for it, not for later work).
    last_index: Mutex<Option<::wgpu::SubmissionIndex>>,
    /// A probe build (`DeviceRequest::probe`): the probed kernels count their global loads
    /// into this buffer (binding 14; `backend::probe`).
    probe: Option<Buffer>,
    /// CPU time spent recording and submitting work, in nanoseconds.
    encode_ns: AtomicU64,
    /// Compiled pipelines kept on disk (`pipeline_cache`), and what became of its file.
    disk_cache: Option<pipeline_cache::DiskCache>,
    cache_state: pipeline_cache::CacheState,
    /// Time spent creating shader modules and pipelines, in nanoseconds.
    compile_ns: AtomicU64,
}

fn no_probe() -> Error {
    Error::Other("internal: the device is not a probe build".into())
}

fn poll_error(e: impl std::fmt::Display) -> Error {
    Error::Gpu(format!("device poll failed: {e}"))
}

impl WgpuDevice {
    pub fn open(req: &DeviceRequest) -> Result<Self> {
        let adapter = adapter::select(req)?;
        let features = adapter::wanted_features(&adapter);
        let info = adapter::describe(&adapter, features);
        let (device, queue) =
            pollster::block_on(adapter.request_device(&::wgpu::DeviceDescriptor {
                label: Some("wgmoe"),
                required_features: features,
                // The adapter's real limits: the defaults reject a 300 MiB buffer.
                required_limits: adapter.limits(),
                ..Default::default()
            }))
            .map_err(|e| Error::Gpu(format!("cannot open device on `{}`: {e}", info.name)))?;
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = errors.clone();
        // Validation or out-of-memory errors are collected and reported by `check`, not
        // turned into a panic.
        device.on_uncaptured_error(Arc::new(move |e: ::wgpu::Error| {
            // Display gives only the kind ("Validation Error"); the description says what.
            let msg = match &e {
                ::wgpu::Error::Validation { description, .. } => {
                    format!("validation: {description}")
                }
                ::wgpu::Error::OutOfMemory { .. } => "out of GPU memory".to_string(),
                other => other.to_string(),
            };
            if let Ok(mut v) = sink.lock() {
                v.push(msg);
            }
        }));
        let (disk_cache, cache_state) = pipeline_cache::open(
            &device,
            &adapter.get_info(),
            features,
            req.no_pipeline_cache || req.probe,
        );
        if req.probe && !info.subgroup {
            return Err(Error::Gpu(format!(
                "the memory-access probe counts loads with subgroup operations, which `{}` does not offer",
                info.name
            )));
        }
        let mut dev = WgpuDevice {
            device,
            queue,
            info,
            tracker: Arc::default(),
            binding_cap: req.max_binding,
            errors,
            pipelines: Mutex::default(),
            submitted: AtomicU64::new(0),
            completed: Arc::new(AtomicU64::new(0)),
            last_index: Mutex::new(None),
            probe: None,
            encode_ns: AtomicU64::new(0),
            disk_cache,
            cache_state,
            compile_ns: AtomicU64::new(0),
        };
        if req.probe {
            let bytes = (crate::backend::probe::SITES * 16) as u64;
            dev.probe = Some(dev.alloc("probe counters", bytes, Usage::Storage)?);
            dev.probe_reset()?;
        }
        Ok(dev)
    }

    /// The probe counters' buffer, in a probe build.
    pub(crate) fn probe_buffer(&self) -> Option<&Buffer> {
        self.probe.as_ref()
    }

    /// Zero the probe counters (a probe build).
    pub fn probe_reset(&self) -> Result<()> {
        let b = self.probe.as_ref().ok_or_else(no_probe)?;
        self.write(b, 0, &vec![0u8; b.size() as usize])
    }

    /// The probe counters per site: [requests, sectors, bytes used, 0] (waits for the
    /// work submitted so far).
    pub fn probe_counts(&self) -> Result<Vec<[u64; 4]>> {
        let b = self.probe.as_ref().ok_or_else(no_probe)?;
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&self.read(b, 0, b.size())?);
        Ok(words
            .chunks_exact(4)
            .map(|c| [c[0] as u64, c[1] as u64, c[2] as u64, c[3] as u64])
            .collect())
    }

    /// A program's dispatches one at a time with their probe counts (a probe build).
    pub fn probe_program(
        &self,
        p: &Prepared,
        tokens: u32,
        pos0: u32,
    ) -> Result<Vec<crate::backend::probe::ProbedOp>> {
        self.probe.as_ref().ok_or_else(no_probe)?;
        record::probe_ops(self, p, tokens, pos0)
    }

    /// Seconds spent compiling shader modules and pipelines, and the pipeline cache's
    /// state and file.
    pub fn pipeline_report(&self) -> crate::backend::PipelineReport {
        crate::backend::PipelineReport {
            compile_s: self.compile_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            cache: self.cache_state.name(),
            cache_file: self
                .disk_cache
                .as_ref()
                .map(|c| c.path.display().to_string()),
            cache_note: match &self.cache_state {
                pipeline_cache::CacheState::Replaced(why) => Some(why.clone()),
                _ => None,
            },
        }
    }

    /// Write the compiled pipelines to the cache file (nothing without a cache).
    pub fn save_pipeline_cache(&self) -> Result<()> {
        match &self.disk_cache {
            Some(c) => pipeline_cache::save(c).map_err(|e| {
                Error::Other(format!(
                    "writing the pipeline cache {}: {e}",
                    c.path.display()
                ))
            }),
            None => Ok(()),
        }
    }

    /// CPU seconds spent recording and submitting work since the device opened.
    pub fn encode_seconds(&self) -> f64 {
        self.encode_ns.load(Ordering::Relaxed) as f64 * 1e-9
    }

    pub fn binding_cap(&self) -> Option<u64> {
        self.binding_cap
    }

    fn native<'b>(&self, b: &'b Buffer) -> Result<&'b ::wgpu::Buffer> {
        record::native(b)
    }

    fn staging_of<'s>(&self, s: &'s Staging) -> Result<&'s NativeStaging> {
        // Unreachable without the `cuda` feature (the other variant is uninhabited).
        #[allow(unreachable_patterns)]
        match &s.0 {
            SeamStaging::Wgpu(n) => Ok(n),
            _ => Err(crate::backend::foreign("staging buffer", "wgpu")),
        }
    }

    /// The pipeline of a kernel variant, built on first use.
    fn pipeline(&self, k: Kernel) -> Result<::wgpu::ComputePipeline> {
        let lanes = k.min_subgroup_size();
        if k.needs_subgroups() && !(self.info.subgroup && self.info.subgroup_min_size >= lanes) {
            return Err(Error::Gpu(format!(
                "kernel {k} needs subgroups of at least {lanes} lanes, which `{}` does not have",
                self.info.name
            )));
        }
        if k.needs_f16() && !self.info.shader_f16 {
            return Err(Error::Gpu(format!(
                "kernel {k} needs SHADER_F16, which `{}` does not have",
                self.info.name
            )));
        }
        let mut cache = self
            .pipelines
            .lock()
            .map_err(|_| Error::Gpu("pipeline cache poisoned".into()))?;
        if let Some(p) = cache.get(&k) {
            return Ok(p.clone());
        }
        let label = k.name();
        let t0 = std::time::Instant::now();
        let module = self
            .device
            .create_shader_module(::wgpu::ShaderModuleDescriptor {
                label: Some(&label),
                source: ::wgpu::ShaderSource::Wgsl({
                    let src = shaders::source_for(k, self.probe.is_some());
                    if shaders::inlines_uniforms(&self.info) {
                        shaders::params_in_storage(&src).into()
                    } else {
                        src.into()
                    }
                }),
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&::wgpu::ComputePipelineDescriptor {
                label: Some(&label),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: self.disk_cache.as_ref().map(|c| &c.cache),
            });
        self.compile_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        cache.insert(k, pipeline.clone());
        Ok(pipeline)
    }

    /// Submit recorded commands; the token completes when the GPU has run them.
    fn submit_commands(&self, cmd: ::wgpu::CommandBuffer) -> u64 {
        let index = self.queue.submit([cmd]);
        if let Ok(mut l) = self.last_index.lock() {
            *l = Some(index);
        }
        let n = self.submitted.fetch_add(1, Ordering::AcqRel) + 1;
        let done = self.completed.clone();
        self.queue.on_submitted_work_done(move || {
            done.fetch_max(n, Ordering::AcqRel);
        });
        n
    }

    fn poll_wait(&self) -> Result<()> {
        self.device
            .poll(::wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(poll_error)
    }

    fn remap(&self, s: &NativeStaging) {
        s.state.store(MAPPING, Ordering::Release);
        let flag = s.state.clone();
        s.buffer
            .slice(..)
            .map_async(::wgpu::MapMode::Write, move |r| {
                flag.store(if r.is_ok() { MAPPED } else { UNMAPPED }, Ordering::Release);
            });
    }
}

impl Backend for WgpuDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn tracker(&self) -> &Arc<MemTracker> {
        &self.tracker
    }

    fn alloc(&self, label: &str, bytes: u64, usage: Usage) -> Result<Buffer> {
        use ::wgpu::BufferUsages as U;
        // wgpu rejects zero-sized bindings, and any buffer may be viewed as vec4s.
        let size = bytes.max(16).div_ceil(16) * 16;
        if size > self.info.limits.max_buffer_size {
            return Err(Error::DoesNotFit(format!(
                "{label}: a buffer of {size} bytes exceeds the adapter's max_buffer_size of {}",
                self.info.limits.max_buffer_size
            )));
        }
        let u = match usage {
            Usage::Storage => U::STORAGE | U::COPY_DST | U::COPY_SRC,
            Usage::Window => U::STORAGE | U::UNIFORM | U::COPY_DST | U::COPY_SRC,
            // Storage too: llvmpipe's kernels read parameters from storage
            // (`shaders::params_in_storage`).
            Usage::Uniform => U::UNIFORM | U::STORAGE | U::COPY_DST,
            Usage::Readback => U::MAP_READ | U::COPY_DST,
            Usage::Staging => {
                return Err(Error::Other(format!(
                    "internal: {label}: staging buffers come from `staging`"
                )))
            }
        };
        let buffer = self.device.create_buffer(&::wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: u,
            mapped_at_creation: false,
        });
        Ok(Buffer::new(
            size,
            usage,
            SeamBuffer::Wgpu(buffer),
            self.tracker.clone(),
        ))
    }

    fn write(&self, buf: &Buffer, offset: u64, data: &[u8]) -> Result<()> {
        let end = offset.checked_add(data.len() as u64);
        if end.is_none_or(|e| e > buf.size()) {
            return Err(Error::Other(format!(
                "internal: write of {} bytes at {offset} into a buffer of {}",
                data.len(),
                buf.size()
            )));
        }
        let b = self.native(buf)?;
        // queue.write_buffer needs a multiple of 4 bytes.
        if data.len().is_multiple_of(4) {
            self.queue.write_buffer(b, offset, data);
        } else {
            let mut v = data.to_vec();
            v.resize(data.len().div_ceil(4) * 4, 0);
            self.queue.write_buffer(b, offset, &v);
        }
        Ok(())
    }

    fn read(&self, buf: &Buffer, offset: u64, len: u64) -> Result<Vec<u8>> {
        let size4 = len.div_ceil(4) * 4;
        let rb = self.alloc("readback", size4, Usage::Readback)?;
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(self.native(buf)?, offset, self.native(&rb)?, 0, size4);
        self.submit_commands(enc.finish());
        self.map_read(&rb, len)
    }

    fn map_read(&self, buf: &Buffer, len: u64) -> Result<Vec<u8>> {
        let native = self.start_read(buf, len)?;
        self.finish_read(crate::backend::PendingRead::new(len, native))
    }

    fn start_read(&self, buf: &Buffer, _len: u64) -> Result<SeamPendingRead> {
        let buffer = self.native(buf)?.clone();
        let state = Arc::new(AtomicU8::new(MAPPING));
        let flag = state.clone();
        buffer.slice(..).map_async(::wgpu::MapMode::Read, move |r| {
            flag.store(if r.is_ok() { MAPPED } else { UNMAPPED }, Ordering::Release);
        });
        let index = self.last_index.lock().ok().and_then(|l| l.clone());
        Ok(SeamPendingRead::Wgpu(PendingMap {
            buffer,
            state,
            index,
            done: false,
        }))
    }

    fn read_ready(&self, read: &crate::backend::PendingRead) -> bool {
        #[allow(unreachable_patterns)]
        match &read.native {
            SeamPendingRead::Wgpu(p) => {
                // Callbacks run inside poll: a non-blocking one lets a landed map report.
                if p.state.load(Ordering::Acquire) == MAPPING {
                    let _ = self.device.poll(::wgpu::PollType::Poll);
                }
                p.state.load(Ordering::Acquire) != MAPPING
            }
            _ => false,
        }
    }

    fn finish_read(&self, read: crate::backend::PendingRead) -> Result<Vec<u8>> {
        let len = read.len();
        #[allow(unreachable_patterns)]
        let mut p = match read.native {
            SeamPendingRead::Wgpu(p) => p,
            _ => return Err(crate::backend::foreign("pending read", "wgpu")),
        };
        while p.state.load(Ordering::Acquire) == MAPPING {
            let wait = match &p.index {
                Some(i) => ::wgpu::PollType::Wait {
                    submission_index: Some(i.clone()),
                    timeout: None,
                },
                None => ::wgpu::PollType::wait_indefinitely(),
            };
            self.device.poll(wait).map_err(poll_error)?;
            if p.state.load(Ordering::Acquire) == MAPPING {
                // The submission is done but the callback waits for its map: poll again.
                self.poll_wait()?;
            }
        }
        self.check()?;
        if p.state.load(Ordering::Acquire) != MAPPED {
            return Err(Error::Gpu("mapping a readback buffer failed".into()));
        }
        let out = {
            let view = p
                .buffer
                .slice(..)
                .get_mapped_range()
                .map_err(|e| Error::Gpu(format!("readback: {e}")))?;
            view[..(len as usize).min(view.len())].to_vec()
        };
        p.buffer.unmap();
        p.done = true;
        Ok(out)
    }

    fn prepare(&self, program: &Program, step: &Buffer) -> Result<SeamPrepared> {
        Ok(SeamPrepared::Wgpu(record::prepare(self, program, step)?))
    }

    fn submit(&self, work: &[Work<'_>]) -> Result<Submitted> {
        let started = std::time::Instant::now();
        let r = self.submit_work(work);
        self.encode_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }

    fn is_complete(&self, token: u64) -> bool {
        self.completed.load(Ordering::Acquire) >= token
    }

    fn wait(&self, token: u64) -> Result<()> {
        while !self.is_complete(token) {
            self.poll_wait()?;
        }
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.poll_wait()?;
        self.check()
    }

    fn check(&self) -> Result<()> {
        super::drain_errors(&self.errors, "wgpu")
    }

    fn staging(&self, bytes: u64) -> Result<Staging> {
        self.new_staging(bytes)
    }

    fn fill_staging(&self, staging: &Staging, data: &[u8]) -> Result<()> {
        self.fill(staging, data)
    }

    fn unstage(&self, staging: &Staging) {
        self.unfill(staging)
    }

    fn profile(
        &self,
        program: &Prepared,
        tokens: u32,
        pos0: u32,
        times: &mut KernelTimes,
    ) -> Result<crate::backend::ProfileClock> {
        if self.info.timestamp_query {
            timestamps::profile(self, program, tokens, pos0, times)?;
            Ok(crate::backend::ProfileClock::GpuTimestamps)
        } else {
            record::profile_wall(self, program, tokens, pos0, times)?;
            Ok(crate::backend::ProfileClock::WallClock)
        }
    }
}

impl WgpuDevice {
    /// Record `work` into one command buffer and submit it.
    fn submit_work(&self, work: &[Work<'_>]) -> Result<Submitted> {
        let mut enc = self.device.create_command_encoder(&Default::default());
        let mut dispatches = 0;
        let mut i = 0;
        let mut staged = Vec::new();
        while i < work.len() {
            match &work[i] {
                Work::Run { .. } => {
                    // Consecutive programs share one compute pass.
                    let mut pass = enc.begin_compute_pass(&Default::default());
                    while let Some(Work::Run {
                        program,
                        tokens,
                        pos0,
                    }) = work.get(i)
                    {
                        dispatches += record::record(program, &mut pass, *tokens, *pos0)?;
                        i += 1;
                    }
                }
                Work::Copy {
                    src,
                    src_offset,
                    dst,
                    dst_offset,
                    bytes,
                } => {
                    enc.copy_buffer_to_buffer(
                        self.native(src)?,
                        *src_offset,
                        self.native(dst)?,
                        *dst_offset,
                        bytes.div_ceil(4) * 4,
                    );
                    i += 1;
                }
                Work::Upload {
                    staging,
                    dst,
                    dst_offset,
                    bytes,
                } => {
                    let s = self.staging_of(staging)?;
                    enc.copy_buffer_to_buffer(
                        &s.buffer,
                        0,
                        self.native(dst)?,
                        *dst_offset,
                        bytes.div_ceil(4) * 4,
                    );
                    staged.push(s);
                    i += 1;
                }
            }
        }
        let token = self.submit_commands(enc.finish());
        // The copies read the staging buffers; they map again once those completed.
        for s in staged {
            self.remap(s);
        }
        Ok(Submitted { token, dispatches })
    }

    fn new_staging(&self, bytes: u64) -> Result<Staging> {
        let size = bytes.max(16).div_ceil(16) * 16;
        // Created mapped: the first fill needs no wait.
        let buffer = self.device.create_buffer(&::wgpu::BufferDescriptor {
            label: Some("staging"),
            size,
            usage: ::wgpu::BufferUsages::MAP_WRITE | ::wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        });
        // Staging counts as runtime GPU memory (device-visible) while it lives.
        let tracked = Buffer::new(
            size,
            Usage::Staging,
            SeamBuffer::Wgpu(buffer.clone()),
            self.tracker.clone(),
        );
        Ok(Staging(SeamStaging::Wgpu(NativeStaging {
            buffer,
            state: Arc::new(AtomicU8::new(MAPPED)),
            _tracked: tracked,
        })))
    }

    fn fill(&self, staging: &Staging, data: &[u8]) -> Result<()> {
        let s = self.staging_of(staging)?;
        loop {
            match s.state.load(Ordering::Acquire) {
                MAPPED => break,
                MAPPING => self.poll_wait()?,
                _ => {
                    return Err(Error::Gpu(
                        "a staging buffer could not be mapped for writing".into(),
                    ))
                }
            }
        }
        if data.len() as u64 > s.buffer.size() {
            return Err(Error::Other(format!(
                "internal: {} bytes staged into a buffer of {}",
                data.len(),
                s.buffer.size()
            )));
        }
        s.buffer
            .slice(..data.len() as u64)
            .get_mapped_range_mut()
            .map_err(|e| Error::Gpu(format!("staging buffer map: {e}")))?
            .copy_from_slice(data);
        s.buffer.unmap();
        s.state.store(UNMAPPED, Ordering::Release);
        Ok(())
    }

    fn unfill(&self, staging: &Staging) {
        let Ok(s) = self.staging_of(staging) else {
            return;
        };
        if s.state.load(Ordering::Acquire) == UNMAPPED {
            self.remap(s);
        }
    }
}

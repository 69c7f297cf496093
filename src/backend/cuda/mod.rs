//! The CUDA backend (`--features cuda`): the driver API and NVRTC through cudarc, both
//! loaded at run time. One primary context and one stream per device; work runs in
//! submission order on that stream, and each submission records an event: its fence token
//! completes when the event has. Buffers are device allocations; staging buffers are
//! pinned host memory copied with async copies on the same stream; readback buffers are
//! device memory copied to the host once the stream reaches them.
//!
//! The kernels are CUDA C ports of the WGSL kernels (`kernels/cuda/`, [`kernels`]),
//! compiled by NVRTC on first use. The device reports a GPU with warps as subgroups but no
//! SHADER_F16 and no uniform windows, so the kernel plan picks the GPU-shaped kernels
//! (coalesced decode, tiled prefill; dense weights in f16 or Q8_0) and the storage kernels
//! with f32 arithmetic, over an f32 or f16 KV cache, which are the ones ported.

mod info;
pub mod kernels;
mod launch;
pub mod load;

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys as cu;

use crate::backend::{
    Backend, Buffer, DeviceInfo, DeviceRequest, Kernel, KernelTimes, MemTracker,
    NativeBuffer as SeamBuffer, NativePendingRead as SeamPendingRead,
    NativePrepared as SeamPrepared, NativeStaging as SeamStaging, Prepared, Program, Staging,
    Submitted, Usage, Work,
};
use crate::error::{Error, Result};
use load::cu_err;

use info::{describe, device_count};
pub use info::{device_info, Properties};
pub use launch::NativePrepared;

/// A device allocation (or, for a staging buffer's accounting, none). A readback buffer
/// also has a pinned host mirror that its asynchronous reads land in.
pub struct NativeBuffer {
    ptr: cu::CUdeviceptr,
    ctx: Ctx,
    mirror: *mut u8,
}

// SAFETY: the device pointer is a number; the pinned mirror is owned by this value and
// written only by copies a `PendingCopy` waits for before reading it.
unsafe impl Send for NativeBuffer {}
unsafe impl Sync for NativeBuffer {}

impl Drop for NativeBuffer {
    fn drop(&mut self) {
        if (self.ptr != 0 || !self.mirror.is_null()) && self.ctx.current().is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc and `mirror` from cuMemHostAlloc in this
            // context; each is freed once, after the context's work (which may still use
            // them) has finished.
            unsafe {
                cu::cuCtxSynchronize();
                if self.ptr != 0 {
                    cu::cuMemFree_v2(self.ptr);
                }
                if !self.mirror.is_null() {
                    cu::cuMemFreeHost(self.mirror.cast());
                }
            }
        }
    }
}

/// A readback copy into a buffer's pinned mirror and the event recorded after it.
pub struct PendingCopy {
    buffer: Buffer,
    event: Event,
}

impl Drop for PendingCopy {
    fn drop(&mut self) {
        // Read or abandoned (a pipelined step discarded): an abandoned copy may still be
        // running, so it is waited for (at most the steps in flight) before its event goes;
        // the mirror it writes then holds no copy in flight when the buffer is freed.
        // SAFETY: an event created for this copy, waited for and destroyed once.
        unsafe {
            cu::cuEventSynchronize(self.event.0);
            cu::cuEventDestroy_v2(self.event.0);
        }
    }
}

/// A pinned host buffer for uploads and the token of the last submission copying it.
pub struct NativeStaging {
    ptr: *mut u8,
    size: usize,
    last_use: Mutex<u64>,
    ctx: Ctx,
    /// Counts the buffer in the memory tracker while it lives (as wgpu's staging).
    _tracked: Buffer,
}

// SAFETY: the pinned pointer is owned by this value; writes go through `fill_staging`
// after the copies reading it completed.
unsafe impl Send for NativeStaging {}
unsafe impl Sync for NativeStaging {}

impl Drop for NativeStaging {
    fn drop(&mut self) {
        if self.ctx.current().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc, freed once, after any copy from it.
            unsafe {
                cu::cuCtxSynchronize();
                cu::cuMemFreeHost(self.ptr.cast());
            }
        }
    }
}

/// The device's primary context (made current on the calling thread before each call).
#[derive(Clone, Copy)]
struct Ctx(cu::CUcontext);

// SAFETY: a CUDA context may be used from any thread once made current there.
unsafe impl Send for Ctx {}
unsafe impl Sync for Ctx {}

impl Ctx {
    fn current(&self) -> Result<()> {
        // SAFETY: a retained primary context.
        unsafe { cu::cuCtxSetCurrent(self.0) }
            .result()
            .map_err(|e| cu_err("cuCtxSetCurrent", e))
    }
}

struct Stream(cu::CUstream);
// SAFETY: the stream is used under the submit lock or for queries the driver makes
// thread-safe.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

struct Event(cu::CUevent);
// SAFETY: as Stream.
unsafe impl Send for Event {}

/// A loaded module (one source file; kept loaded for the process).
struct Module(cu::CUmodule);
// SAFETY: module handles may be used from any thread of the context.
unsafe impl Send for Module {}

/// A compiled kernel: its entry point in a loaded module.
#[derive(Clone, Copy)]
struct Function {
    func: cu::CUfunction,
    block: u32,
}
// SAFETY: CUDA function handles may be launched from any thread of the context.
unsafe impl Send for Function {}

pub struct CudaDevice {
    ctx: Ctx,
    stream: Stream,
    info: DeviceInfo,
    /// Compute capability (9, 0) -> NVRTC's targets sm_90 (CUBIN) and compute_90 (PTX).
    arch: (i32, i32),
    tracker: Arc<MemTracker>,
    binding_cap: Option<u64>,
    modules: Mutex<HashMap<&'static str, Module>>,
    functions: Mutex<HashMap<Kernel, Function>>,
    /// Serialises submissions: tokens are handed out in stream order.
    submit_lock: Mutex<()>,
    submitted: AtomicU64,
    completed: AtomicU64,
    /// Events of submissions not yet seen complete, oldest first.
    pending: Mutex<VecDeque<(u64, Event)>>,
    errors: Mutex<Vec<String>>,
}

fn ok(what: &str, r: cu::CUresult) -> Result<()> {
    r.result().map_err(|e| cu_err(what, e))
}

impl CudaDevice {
    pub fn open(req: &DeviceRequest) -> Result<Self> {
        let n = device_count()?;
        let mut chosen = None;
        for i in 0..n {
            let d = describe(i)?;
            let wanted = req
                .adapter
                .as_ref()
                .is_none_or(|a| d.1.name.to_lowercase().contains(&a.to_lowercase()));
            if wanted {
                chosen = Some(d);
                break;
            }
        }
        let Some((dev, info, arch)) = chosen else {
            return Err(Error::option(
                "--adapter",
                format!(
                    "{}: no CUDA device has that in its name",
                    req.adapter.clone().unwrap_or_default()
                ),
            ));
        };
        let mut ctx = std::ptr::null_mut();
        // SAFETY: out-pointer to a live handle.
        ok("cuDevicePrimaryCtxRetain", unsafe {
            cu::cuDevicePrimaryCtxRetain(&mut ctx, dev)
        })?;
        let ctx = Ctx(ctx);
        ctx.current()?;
        let mut stream = std::ptr::null_mut();
        // A non-blocking stream: the legacy default stream never serialises with it.
        // SAFETY: out-pointer to a live handle.
        ok("cuStreamCreate", unsafe {
            cu::cuStreamCreate(
                &mut stream,
                cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            )
        })?;
        Ok(CudaDevice {
            ctx,
            stream: Stream(stream),
            info,
            arch,
            tracker: Arc::default(),
            binding_cap: req.max_binding,
            modules: Mutex::default(),
            functions: Mutex::default(),
            submit_lock: Mutex::new(()),
            submitted: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            pending: Mutex::default(),
            errors: Mutex::default(),
        })
    }

    pub fn list(_req: &DeviceRequest) -> Result<(Vec<DeviceInfo>, Option<usize>)> {
        let n = device_count()?;
        let infos = (0..n)
            .map(|i| describe(i).map(|d| d.1))
            .collect::<Result<Vec<_>>>()?;
        Ok((infos, Some(0)))
    }

    pub fn binding_cap(&self) -> Option<u64> {
        self.binding_cap
    }

    fn ptr(&self, b: &Buffer) -> cu::CUdeviceptr {
        match b.native() {
            SeamBuffer::Cuda(n) => n.ptr,
            SeamBuffer::Wgpu(_) => 0,
        }
    }

    fn staging_of<'s>(&self, s: &'s Staging) -> Result<&'s NativeStaging> {
        match &s.0 {
            SeamStaging::Cuda(n) => Ok(n),
            SeamStaging::Wgpu(_) => Err(Error::Other(
                "internal: a wgpu staging buffer given to the CUDA device".into(),
            )),
        }
    }

    /// The loaded module of a kernel's source file, compiled and loaded on first use.
    fn module(&self, k: Kernel) -> Result<cu::CUmodule> {
        let ck = kernels::cuda_kernel(k).ok_or_else(|| kernels::no_cuda_version(k))?;
        let mut modules = self
            .modules
            .lock()
            .map_err(|_| Error::Gpu("cuda: module cache poisoned".into()))?;
        if let Some(m) = modules.get(ck.file) {
            return Ok(m.0);
        }
        let (major, minor) = self.arch;
        // A CUBIN for this device; PTX (JIT-compiled by the driver) only where this NVRTC
        // cannot target the device's architecture.
        let (image, what) = match kernels::binary(k, Some(&format!("sm_{major}{minor}"))) {
            Ok(cubin) => (cubin, "CUBIN"),
            Err(cubin_err) => {
                let mut ptx = kernels::binary(k, Some(&format!("compute_{major}{minor}")))
                    .map_err(|e| Error::Gpu(format!("{cubin_err}; PTX: {e}")))?;
                ptx.push(0);
                (ptx, "PTX")
            }
        };
        self.ctx.current()?;
        let mut module = std::ptr::null_mut();
        // SAFETY: a complete CUBIN, or PTX text with its NUL; the module stays loaded for
        // the process.
        let r = unsafe { cu::cuModuleLoadData(&mut module, image.as_ptr().cast()) };
        if r == cu::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION {
            return Err(Error::Gpu(format!(
                "cuda: the driver cannot load the {what} of {}: NVRTC {}.{} is newer than the driver ({}); use an NVRTC no newer than the driver ({})",
                ck.file,
                load::nvrtc().map_or(0, |v| v.0),
                load::nvrtc().map_or(0, |v| v.1),
                self.info.driver_info,
                load::NVRTC_ENV
            )));
        }
        ok(&format!("loading the {what} of {}", ck.file), r)?;
        modules.insert(ck.file, Module(module));
        Ok(module)
    }

    /// The launchable function of a kernel, compiled and loaded on first use.
    fn function(&self, k: Kernel) -> Result<Function> {
        let ck = kernels::cuda_kernel(k).ok_or_else(|| kernels::no_cuda_version(k))?;
        let mut cache = self
            .functions
            .lock()
            .map_err(|_| Error::Gpu("cuda: function cache poisoned".into()))?;
        if let Some(f) = cache.get(&k) {
            return Ok(*f);
        }
        let module = self.module(k)?;
        let entry = std::ffi::CString::new(ck.entry)
            .map_err(|_| Error::Other(format!("internal: entry of {k}")))?;
        let mut func = std::ptr::null_mut();
        // SAFETY: a loaded module and a NUL-terminated name.
        ok(&format!("kernel {} of {k}", ck.entry), unsafe {
            cu::cuModuleGetFunction(&mut func, module, entry.as_ptr())
        })?;
        let f = Function {
            func,
            block: ck.block,
        };
        cache.insert(k, f);
        Ok(f)
    }

    /// Record the fence event of a submission just enqueued; returns its token.
    fn fence(&self) -> Result<u64> {
        let mut ev = std::ptr::null_mut();
        // SAFETY: out-pointer to a live handle.
        ok("cuEventCreate", unsafe {
            cu::cuEventCreate(&mut ev, cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
        })?;
        // SAFETY: a live event and this device's stream.
        ok("cuEventRecord", unsafe {
            cu::cuEventRecord(ev, self.stream.0)
        })?;
        let token = self.submitted.fetch_add(1, Ordering::AcqRel) + 1;
        self.pending
            .lock()
            .map_err(|_| Error::Gpu("cuda: fence list poisoned".into()))?
            .push_back((token, Event(ev)));
        Ok(token)
    }

    /// Retire the events that completed (all of them up to `token` when `block`).
    fn retire(&self, block_until: Option<u64>) -> Result<()> {
        let mut pending = self
            .pending
            .lock()
            .map_err(|_| Error::Gpu("cuda: fence list poisoned".into()))?;
        while let Some((token, ev)) = pending.front() {
            let r = match block_until {
                // SAFETY: a live event recorded on this device's stream.
                Some(t) if *token <= t => unsafe { cu::cuEventSynchronize(ev.0) },
                // SAFETY: as above.
                _ => unsafe { cu::cuEventQuery(ev.0) },
            };
            match r {
                cu::CUresult::CUDA_SUCCESS => {}
                cu::CUresult::CUDA_ERROR_NOT_READY => break,
                e => {
                    return Err(Error::Gpu(format!(
                        "cuda: submission {token} failed: {e:?}"
                    )))
                }
            }
            self.completed.fetch_max(*token, Ordering::AcqRel);
            // SAFETY: completed, destroyed once.
            unsafe { cu::cuEventDestroy_v2(ev.0) };
            pending.pop_front();
        }
        Ok(())
    }

    fn stream_sync(&self) -> Result<()> {
        self.ctx.current()?;
        // SAFETY: this device's stream.
        ok("cuStreamSynchronize", unsafe {
            cu::cuStreamSynchronize(self.stream.0)
        })?;
        self.retire(None)
    }

    fn note(&self, e: Error) -> Error {
        if let Ok(mut v) = self.errors.lock() {
            v.push(e.to_string());
        }
        e
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        let _ = self.stream_sync();
        // The primary context stays retained: buffers may outlive the device and free
        // their memory in it.
        // SAFETY: this device's stream, destroyed once.
        unsafe { cu::cuStreamDestroy_v2(self.stream.0) };
    }
}

fn bounds(what: &str, offset: u64, len: u64, size: u64) -> Result<()> {
    if offset.checked_add(len).is_none_or(|e| e > size) {
        return Err(Error::Other(format!(
            "internal: {what} of {len} bytes at {offset} in a buffer of {size}"
        )));
    }
    Ok(())
}

impl Backend for CudaDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn tracker(&self) -> &Arc<MemTracker> {
        &self.tracker
    }

    fn alloc(&self, label: &str, bytes: u64, usage: Usage) -> Result<Buffer> {
        if usage == Usage::Staging {
            return Err(Error::Other(format!(
                "internal: {label}: staging buffers come from `staging`"
            )));
        }
        // As on wgpu: whole 16-byte units, never empty.
        let size = bytes.max(16).div_ceil(16) * 16;
        if size > self.info.limits.max_buffer_size {
            return Err(Error::DoesNotFit(format!(
                "{label}: a buffer of {size} bytes exceeds the device's memory of {}",
                self.info.limits.max_buffer_size
            )));
        }
        self.ctx.current()?;
        let mut ptr = 0;
        // SAFETY: out-pointer to a live handle.
        let r = unsafe { cu::cuMemAlloc_v2(&mut ptr, size as usize) };
        if r == cu::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Err(Error::Gpu(format!(
                "{label}: out of GPU memory allocating {size} bytes"
            )));
        }
        ok(&format!("allocating {label}"), r)?;
        let mut mirror = std::ptr::null_mut();
        if usage == Usage::Readback {
            // SAFETY: out-pointer to a live pointer; freed with the buffer.
            let r = unsafe {
                cu::cuMemHostAlloc(&mut mirror, size as usize, cu::CU_MEMHOSTALLOC_PORTABLE)
            };
            if let Err(e) = ok(&format!("pinned mirror of {label}"), r) {
                // SAFETY: allocated above, not yet shared.
                unsafe { cu::cuMemFree_v2(ptr) };
                return Err(e);
            }
        }
        let native = NativeBuffer {
            ptr,
            ctx: self.ctx,
            mirror: mirror.cast(),
        };
        // Zeroed like wgpu's buffers, in stream order.
        // SAFETY: `size` bytes were just allocated at `ptr`.
        ok("cuMemsetD8Async", unsafe {
            cu::cuMemsetD8Async(ptr, 0, size as usize, self.stream.0)
        })?;
        Ok(Buffer::new(
            size,
            usage,
            SeamBuffer::Cuda(native),
            self.tracker.clone(),
        ))
    }

    fn write(&self, buf: &Buffer, offset: u64, data: &[u8]) -> Result<()> {
        bounds("write", offset, data.len() as u64, buf.size())?;
        if data.is_empty() {
            return Ok(());
        }
        self.ctx.current()?;
        // From pageable memory the driver copies `data` into its own staging before it
        // returns, and the copy is ordered on the stream: before the next submission.
        // SAFETY: the destination range was checked above.
        ok("write (cuMemcpyHtoDAsync)", unsafe {
            cu::cuMemcpyHtoDAsync_v2(
                self.ptr(buf) + offset,
                data.as_ptr().cast(),
                data.len(),
                self.stream.0,
            )
        })
    }

    fn read(&self, buf: &Buffer, offset: u64, len: u64) -> Result<Vec<u8>> {
        bounds("read", offset, len, buf.size())?;
        self.stream_sync()?;
        let mut out = vec![0u8; len as usize];
        if len > 0 {
            // SAFETY: `out` holds `len` bytes; the source range was checked above; the
            // stream is idle, so the synchronous copy sees every earlier submission.
            ok("read (cuMemcpyDtoH)", unsafe {
                cu::cuMemcpyDtoH_v2(
                    out.as_mut_ptr().cast(),
                    self.ptr(buf) + offset,
                    len as usize,
                )
            })?;
        }
        Ok(out)
    }

    fn map_read(&self, buf: &Buffer, len: u64) -> Result<Vec<u8>> {
        self.read(buf, 0, len.min(buf.size()))
    }

    fn start_read(&self, buf: &Buffer, len: u64) -> Result<SeamPendingRead> {
        let SeamBuffer::Cuda(n) = buf.native() else {
            return Err(crate::backend::foreign("buffer", "cuda"));
        };
        if n.mirror.is_null() {
            return Err(Error::Other(format!(
                "internal: an asynchronous read of {buf:?}, which has no host mirror"
            )));
        }
        bounds("read", 0, len, buf.size())?;
        let _order = self
            .submit_lock
            .lock()
            .map_err(|_| Error::Gpu("cuda: submit lock poisoned".into()))?;
        self.ctx.current()?;
        if len > 0 {
            // SAFETY: the mirror is pinned and as large as the buffer; the range was
            // checked above; it is read only after the event below completed.
            ok("read (cuMemcpyDtoHAsync)", unsafe {
                cu::cuMemcpyDtoHAsync_v2(n.mirror.cast(), n.ptr, len as usize, self.stream.0)
            })?;
        }
        let mut ev = std::ptr::null_mut();
        // SAFETY: out-pointer to a live handle; this device's stream.
        ok("cuEventCreate", unsafe {
            cu::cuEventCreate(&mut ev, cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
        })?;
        let event = Event(ev);
        // SAFETY: as above.
        ok("cuEventRecord", unsafe {
            cu::cuEventRecord(event.0, self.stream.0)
        })?;
        Ok(SeamPendingRead::Cuda(PendingCopy {
            buffer: buf.clone(),
            event,
        }))
    }

    fn read_ready(&self, read: &crate::backend::PendingRead) -> bool {
        let SeamPendingRead::Cuda(p) = &read.native else {
            return false;
        };
        if self.ctx.current().is_err() {
            return false;
        }
        // SAFETY: a live event of this device's stream.
        let r = unsafe { cu::cuEventQuery(p.event.0) };
        r != cu::CUresult::CUDA_ERROR_NOT_READY
    }

    fn finish_read(&self, read: crate::backend::PendingRead) -> Result<Vec<u8>> {
        let len = read.len() as usize;
        let SeamPendingRead::Cuda(p) = read.native else {
            return Err(crate::backend::foreign("pending read", "cuda"));
        };
        self.ctx.current()?;
        // SAFETY: a live event of this device's stream.
        ok("readback (cuEventSynchronize)", unsafe {
            cu::cuEventSynchronize(p.event.0)
        })?;
        let SeamBuffer::Cuda(n) = p.buffer.native() else {
            return Err(crate::backend::foreign("buffer", "cuda"));
        };
        let mut out = vec![0u8; len];
        // SAFETY: the copy into the mirror completed (the event above); `len` was checked
        // against the buffer's size when the read started.
        unsafe { std::ptr::copy_nonoverlapping(n.mirror, out.as_mut_ptr(), len) };
        self.retire(None)?;
        Ok(out)
    }

    fn prepare(&self, program: &Program, step: &Buffer) -> Result<SeamPrepared> {
        Ok(SeamPrepared::Cuda(launch::prepare(self, program, step)?))
    }

    fn submit(&self, work: &[Work<'_>]) -> Result<Submitted> {
        let _order = self
            .submit_lock
            .lock()
            .map_err(|_| Error::Gpu("cuda: submit lock poisoned".into()))?;
        self.ctx.current()?;
        let mut dispatches = 0;
        let mut staged = Vec::new();
        for w in work {
            match w {
                Work::Run {
                    program,
                    tokens,
                    pos0,
                } => {
                    dispatches +=
                        launch::run(self, program, *tokens, *pos0).map_err(|e| self.note(e))?;
                }
                Work::Copy {
                    src,
                    src_offset,
                    dst,
                    dst_offset,
                    bytes,
                } => {
                    // As on wgpu: whole 4-byte words.
                    let n = bytes.div_ceil(4) * 4;
                    bounds("copy source", *src_offset, n, src.size())?;
                    bounds("copy destination", *dst_offset, n, dst.size())?;
                    // SAFETY: both ranges were checked above.
                    ok("cuMemcpyDtoDAsync", unsafe {
                        cu::cuMemcpyDtoDAsync_v2(
                            self.ptr(dst) + dst_offset,
                            self.ptr(src) + src_offset,
                            n as usize,
                            self.stream.0,
                        )
                    })?;
                }
                Work::Upload {
                    staging,
                    dst,
                    dst_offset,
                    bytes,
                } => {
                    let s = self.staging_of(staging)?;
                    bounds("upload source", 0, *bytes, s.size as u64)?;
                    bounds("upload destination", *dst_offset, *bytes, dst.size())?;
                    // SAFETY: pinned memory of `s.size` bytes, the ranges checked above;
                    // the staging buffer is not written again before this completes.
                    ok("upload (cuMemcpyHtoDAsync)", unsafe {
                        cu::cuMemcpyHtoDAsync_v2(
                            self.ptr(dst) + dst_offset,
                            s.ptr.cast::<c_void>(),
                            *bytes as usize,
                            self.stream.0,
                        )
                    })?;
                    staged.push(s);
                }
            }
        }
        let token = self.fence()?;
        for s in staged {
            if let Ok(mut l) = s.last_use.lock() {
                *l = token;
            }
        }
        Ok(Submitted { token, dispatches })
    }

    fn is_complete(&self, token: u64) -> bool {
        if self.completed.load(Ordering::Acquire) >= token {
            return true;
        }
        if self.ctx.current().is_err() {
            return false;
        }
        if let Err(e) = self.retire(None) {
            self.note(e);
        }
        self.completed.load(Ordering::Acquire) >= token
    }

    fn wait(&self, token: u64) -> Result<()> {
        if self.completed.load(Ordering::Acquire) >= token {
            return Ok(());
        }
        self.ctx.current()?;
        self.retire(Some(token))
    }

    fn sync(&self) -> Result<()> {
        self.stream_sync()?;
        self.check()
    }

    fn check(&self) -> Result<()> {
        super::drain_errors(&self.errors, "cuda")
    }

    fn staging(&self, bytes: u64) -> Result<Staging> {
        let size = bytes.max(16).div_ceil(16) * 16;
        self.ctx.current()?;
        let mut p = std::ptr::null_mut();
        // Pinned, so the async upload copies straight from it (portable: any context).
        // SAFETY: out-pointer to a live pointer.
        ok("cuMemHostAlloc (pinned staging)", unsafe {
            cu::cuMemHostAlloc(&mut p, size as usize, cu::CU_MEMHOSTALLOC_PORTABLE)
        })?;
        let tracked = Buffer::new(
            size,
            Usage::Staging,
            SeamBuffer::Cuda(NativeBuffer {
                ptr: 0,
                ctx: self.ctx,
                mirror: std::ptr::null_mut(),
            }),
            self.tracker.clone(),
        );
        Ok(Staging(SeamStaging::Cuda(NativeStaging {
            ptr: p.cast(),
            size: size as usize,
            last_use: Mutex::new(0),
            ctx: self.ctx,
            _tracked: tracked,
        })))
    }

    fn fill_staging(&self, staging: &Staging, data: &[u8]) -> Result<()> {
        let s = self.staging_of(staging)?;
        if data.len() > s.size {
            return Err(Error::Other(format!(
                "internal: {} bytes staged into a buffer of {}",
                data.len(),
                s.size
            )));
        }
        let last = s.last_use.lock().map(|l| *l).unwrap_or(0);
        // Writable once the copy reading it completed.
        self.wait(last)?;
        // SAFETY: `s.ptr` holds `s.size >= data.len()` bytes no copy is reading now.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), s.ptr, data.len()) };
        Ok(())
    }

    fn unstage(&self, _staging: &Staging) {
        // Nothing to undo: a filled buffer whose copy was never submitted is writable.
    }

    fn profile(
        &self,
        program: &Prepared,
        tokens: u32,
        pos0: u32,
        times: &mut KernelTimes,
    ) -> Result<crate::backend::ProfileClock> {
        let _order = self
            .submit_lock
            .lock()
            .map_err(|_| Error::Gpu("cuda: submit lock poisoned".into()))?;
        self.ctx.current()?;
        launch::profile(self, program, tokens, pos0, times)
    }
}

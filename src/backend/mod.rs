//! The backend seam: everything the model needs from a compute device, and nothing of any
//! graphics API. A backend allocates, writes and reads buffers, turns backend-neutral
//! [`Program`]s into its own objects once ([`Device::prepare`]), submits work
//! ([`Work`]: programs, copies, staged uploads) and reports when a submission has
//! completed (the [`Fence`] of the residency state machine).
//!
//! [`Device`] is an enum over the backends: wgpu (Vulkan, DX12, Metal; the engine), and CUDA
//! (a stub returning "not compiled" unless the `cuda` feature is on). The model, the
//! residency runtime and the generation loop speak only this module; `wgpu::` appears only
//! under `backend/wgpu/`, and `cfg(feature = "cuda")` only here.

pub mod cpu;
pub mod kernel;
pub mod kernel_profile;
pub mod params;
pub mod plan;
pub mod probe;
pub mod program;
pub mod wgpu;

// The CUDA backend with the `cuda` feature, else a stub that refuses to open.
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
mod cuda_stub;
#[cfg(not(feature = "cuda"))]
use cuda_stub as cuda;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::residency::Fence;
pub use kernel::Kernel;
pub use plan::{KernelOverrides, KernelPlan};
pub use program::{binds, groups64, Bind, Dim, Op, Program, Resource, LONGEST};

/// The error of one backend's object handed to another backend's device (a bug: each
/// device only ever sees the objects it made).
/// Errors a backend collected asynchronously (validation, out of memory, failed launches),
/// reported once by `check` as one error and cleared.
pub(crate) fn drain_errors(errors: &std::sync::Mutex<Vec<String>>, backend: &str) -> Result<()> {
    let mut errs = errors
        .lock()
        .map_err(|_| Error::Gpu(format!("{backend}: error list poisoned")))?;
    if errs.is_empty() {
        return Ok(());
    }
    let msg = errs.join("; ");
    errs.clear();
    Err(Error::Gpu(msg))
}

pub(crate) fn foreign(what: &str, backend: &str) -> Error {
    Error::Other(format!(
        "internal: a {what} of another backend given to the {backend} device"
    ))
}

/// Which API to run on; `None` in [`DeviceRequest`] means the best adapter available.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    Vulkan,
    Dx12,
    Metal,
    Gl,
    /// NVIDIA CUDA (needs a build with `--features cuda`).
    Cuda,
}

/// What device to open.
#[derive(Clone, Debug, Default)]
pub struct DeviceRequest {
    pub backend: Option<BackendChoice>,
    /// Case-insensitive substring of the adapter name.
    pub adapter: Option<String>,
    /// Cap on the storage binding size used to split tensors (bytes). Lets tests and users
    /// exercise the split paths on small models; never raises the adapter's limit.
    pub max_binding: Option<u64>,
    /// A probe build: the kernels count their global loads (`backend::probe`; wgpu with
    /// subgroups only).
    pub probe: bool,
    /// `--no-pipeline-cache`: compile every pipeline, read and write no cache file.
    pub no_pipeline_cache: bool,
}

/// Pipeline compilation of a device so far (`run --json`'s `pipeline_compile_s`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct PipelineReport {
    /// Seconds spent creating shader modules and pipelines (on drivers that compile at
    /// first dispatch, such as llvmpipe, part of the compilation comes later).
    pub compile_s: f64,
    /// The on-disk cache: `loaded`, `created`, `replaced` (a damaged or refused file
    /// ignored), `off` (`--no-pipeline-cache`) or `unsupported`.
    pub cache: &'static str,
    pub cache_file: Option<String>,
    /// Why a file was ignored.
    pub cache_note: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum DeviceType {
    DiscreteGpu,
    IntegratedGpu,
    VirtualGpu,
    /// A software implementation on the CPU (lavapipe, WARP, SwiftShader).
    Cpu,
    Other,
}

/// The limits of a device that sizes and kernel choices depend on.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Limits {
    pub max_buffer_size: u64,
    pub max_storage_buffer_binding_size: u64,
    pub max_uniform_buffer_binding_size: u64,
    pub min_uniform_buffer_offset_alignment: u32,
    pub min_storage_buffer_offset_alignment: u32,
    pub max_storage_buffers_per_shader_stage: u32,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_invocations_per_workgroup: u32,
}

/// What a device is and can do (`wgmoe devices` prints it).
#[derive(Clone, Debug, serde::Serialize)]
pub struct DeviceInfo {
    pub name: String,
    /// "vulkan", "dx12", "metal", "gl", "cuda".
    pub backend: String,
    pub device_type: DeviceType,
    pub driver: String,
    pub driver_info: String,
    pub shader_f16: bool,
    pub subgroup: bool,
    /// Subgroup sizes the device reports (0 when it has no subgroups).
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    pub timestamp_query: bool,
    #[serde(flatten)]
    pub limits: Limits,
}

impl DeviceInfo {
    /// Driver name and version.
    pub fn driver_string(&self) -> String {
        format!("{} {}", self.driver, self.driver_info)
            .trim()
            .to_string()
    }
}

/// Bytes currently allocated by the runtime on the device, and the peak.
#[derive(Debug, Default)]
pub struct MemTracker {
    current: AtomicU64,
    peak: AtomicU64,
}

impl MemTracker {
    fn add(&self, n: u64) {
        let now = self.current.fetch_add(n, Ordering::Relaxed) + n;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }
    fn sub(&self, n: u64) {
        self.current.fetch_sub(n, Ordering::Relaxed);
    }
    pub fn current(&self) -> u64 {
        self.current.load(Ordering::Relaxed)
    }
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

/// How a buffer is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// Kernel storage, copy source and destination.
    Storage,
    /// Storage that may also be bound as a 64 KiB uniform window (allocate the window's
    /// size past the last row a window may start at).
    Window,
    /// A small uniform (parameters, the step).
    Uniform,
    /// The destination of a copy that the host then maps and reads.
    Readback,
    /// A host-written upload source ([`Device::staging`]).
    Staging,
}

/// A device buffer; clones share it. Its bytes count in the device's [`MemTracker`] while
/// any clone lives. Sizes are whole 16-byte units (any buffer may be read as vec4s).
#[derive(Clone)]
pub struct Buffer(Arc<BufferInner>);

struct BufferInner {
    size: u64,
    usage: Usage,
    native: NativeBuffer,
    tracker: Arc<MemTracker>,
}

#[doc(hidden)]
pub enum NativeBuffer {
    Wgpu(self::wgpu::NativeBuffer),
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Cuda(cuda::NativeBuffer),
}

impl Buffer {
    pub(crate) fn new(
        size: u64,
        usage: Usage,
        native: NativeBuffer,
        tracker: Arc<MemTracker>,
    ) -> Self {
        tracker.add(size);
        Buffer(Arc::new(BufferInner {
            size,
            usage,
            native,
            tracker,
        }))
    }
    pub fn size(&self) -> u64 {
        self.0.size
    }
    pub fn usage(&self) -> Usage {
        self.0.usage
    }
    /// Whether the buffer may be bound as a uniform window.
    pub fn window_capable(&self) -> bool {
        self.0.usage == Usage::Window
    }
    pub(crate) fn native(&self) -> &NativeBuffer {
        &self.0.native
    }
    /// Whether two handles are the same buffer.
    pub fn same(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        self.tracker.sub(self.size);
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({} bytes, {:?})", self.0.size, self.0.usage)
    }
}

/// A host-writable staging buffer for uploads (wgpu: `MAP_WRITE | COPY_SRC`). Filled by
/// [`Device::fill_staging`], copied by [`Work::Upload`], writable again once that
/// submission has completed (the residency code's `StagingPool` tracks when).
pub struct Staging(pub(crate) NativeStaging);

#[doc(hidden)]
pub enum NativeStaging {
    Wgpu(self::wgpu::NativeStaging),
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Cuda(cuda::NativeStaging),
}

/// A program made ready on one device: its native objects and, for counting, its grids.
pub struct Prepared {
    program: Program,
    pub(crate) native: NativePrepared,
}

#[doc(hidden)]
pub enum NativePrepared {
    Wgpu(self::wgpu::NativePrepared),
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Cuda(cuda::NativePrepared),
}

impl Prepared {
    /// Dispatches a step of `tokens` tokens at position `pos0` makes.
    pub fn dispatches(&self, tokens: u32, pos0: u32) -> usize {
        self.program.dispatches(tokens, pos0)
    }
    pub fn program(&self) -> &Program {
        &self.program
    }
    pub fn is_empty(&self) -> bool {
        self.program.is_empty()
    }
}

/// A copy of a readback buffer on its way to the host ([`Device::start_read`]): the host
/// goes on recording while it lands, and [`Device::finish_read`] waits for it. Dropped
/// unread, the read is abandoned and the buffer may be copied into again (a pipelined
/// step discarded after a stop).
pub struct PendingRead {
    len: u64,
    pub(crate) native: NativePendingRead,
}

#[doc(hidden)]
pub enum NativePendingRead {
    Wgpu(self::wgpu::PendingMap),
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Cuda(cuda::PendingCopy),
}

impl PendingRead {
    pub(crate) fn new(len: u64, native: NativePendingRead) -> Self {
        PendingRead { len, native }
    }
    pub fn len(&self) -> u64 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One item of a submission, executed in order.
pub enum Work<'a> {
    /// A program's dispatches for a step of `tokens` tokens from position `pos0` (which
    /// the grids of position-sized dispatches follow: the step uniform holds the same).
    Run {
        program: &'a Prepared,
        tokens: u32,
        pos0: u32,
    },
    Copy {
        src: &'a Buffer,
        src_offset: u64,
        dst: &'a Buffer,
        dst_offset: u64,
        bytes: u64,
    },
    /// Copy a filled staging buffer into `dst`.
    Upload {
        staging: &'a Staging,
        dst: &'a Buffer,
        dst_offset: u64,
        bytes: u64,
    },
}

/// What a submission was.
#[derive(Clone, Copy, Debug, Default)]
pub struct Submitted {
    /// Its fence token (submissions complete in token order).
    pub token: u64,
    /// Dispatches it made.
    pub dispatches: usize,
}

/// Time per (stage, kernel name) of profiled dispatches: (seconds, dispatches), from
/// [`Device::profile`].
pub type KernelTimes = BTreeMap<(String, String), (f64, usize)>;

/// What [`Device::profile`] timed the dispatches with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProfileClock {
    /// GPU timestamps at the start and the end of each dispatch (wgpu: timestamp queries
    /// around each dispatch's compute pass; CUDA: timing events around each launch), all
    /// of a program's dispatches in one submission: kernel time, no submission or wait.
    GpuTimestamps,
    /// The wall time of each dispatch submitted alone and waited for (the adapter has no
    /// timestamp queries): submission and wait included.
    WallClock,
}

impl ProfileClock {
    pub fn describe(self) -> &'static str {
        match self {
            ProfileClock::GpuTimestamps => "GPU timestamps",
            ProfileClock::WallClock => {
                "wall clock, one dispatch per submission (the adapter has no timestamp queries)"
            }
        }
    }
}

/// What every backend implements.
pub trait Backend {
    fn info(&self) -> &DeviceInfo;
    fn tracker(&self) -> &Arc<MemTracker>;
    fn alloc(&self, label: &str, bytes: u64, usage: Usage) -> Result<Buffer>;
    /// Write `data` at `offset`; ordered before the next submission.
    fn write(&self, buf: &Buffer, offset: u64, data: &[u8]) -> Result<()>;
    /// Copy `len` bytes back to the host (blocks until every earlier submission is done).
    fn read(&self, buf: &Buffer, offset: u64, len: u64) -> Result<Vec<u8>>;
    /// Map the first `len` bytes of a [`Usage::Readback`] buffer after the copies into it
    /// were submitted (blocks until they complete).
    fn map_read(&self, buf: &Buffer, len: u64) -> Result<Vec<u8>>;
    /// Start bringing the first `len` bytes of a [`Usage::Readback`] buffer to the host once
    /// the submissions made so far have run; returns at once.
    fn start_read(&self, buf: &Buffer, len: u64) -> Result<NativePendingRead>;
    /// Whether a started read has landed (never blocks).
    fn read_ready(&self, read: &PendingRead) -> bool;
    /// The bytes of a started read (blocks until they landed, not for later submissions).
    fn finish_read(&self, read: PendingRead) -> Result<Vec<u8>>;
    fn prepare(&self, program: &Program, step: &Buffer) -> Result<NativePrepared>;
    fn submit(&self, work: &[Work<'_>]) -> Result<Submitted>;
    fn is_complete(&self, token: u64) -> bool;
    fn wait(&self, token: u64) -> Result<()>;
    /// Wait for all submitted work, then report any device error raised since last asked.
    fn sync(&self) -> Result<()>;
    /// Report (and clear) device errors raised so far, without waiting.
    fn check(&self) -> Result<()>;
    fn staging(&self, bytes: u64) -> Result<Staging>;
    /// Fill a staging buffer whose last copy has completed (waits for it to be writable).
    fn fill_staging(&self, staging: &Staging, data: &[u8]) -> Result<()>;
    /// Make a filled staging buffer whose copy was never submitted writable again.
    fn unstage(&self, staging: &Staging);
    /// Run each dispatch of a step once more, timed, adding its time per stage and kernel
    /// to `times`; says which clock timed it.
    fn profile(
        &self,
        program: &Prepared,
        tokens: u32,
        pos0: u32,
        times: &mut KernelTimes,
    ) -> Result<ProfileClock>;
}

/// A compute device of one of the backends. Cheap to clone (shared).
#[derive(Clone)]
pub enum Device {
    Wgpu(Arc<self::wgpu::WgpuDevice>),
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Cuda(Arc<cuda::CudaDevice>),
}

macro_rules! with_backend {
    ($self:expr, $d:ident => $e:expr) => {
        match $self {
            Device::Wgpu($d) => $e,
            Device::Cuda($d) => $e,
        }
    };
}

impl Device {
    /// Open the device the request names (the best one available by default).
    pub fn open(req: &DeviceRequest) -> Result<Self> {
        match req.backend {
            Some(BackendChoice::Cuda) => Ok(Device::Cuda(Arc::new(cuda::CudaDevice::open(req)?))),
            _ => Ok(Device::Wgpu(Arc::new(self::wgpu::WgpuDevice::open(req)?))),
        }
    }

    /// Every adapter of the requested API(s), and which one `open` would pick.
    pub fn list(req: &DeviceRequest) -> Result<(Vec<DeviceInfo>, Option<usize>)> {
        match req.backend {
            Some(BackendChoice::Cuda) => cuda::CudaDevice::list(req),
            _ => Ok(self::wgpu::list_adapters(req)),
        }
    }

    pub fn info(&self) -> &DeviceInfo {
        with_backend!(self, d => d.info())
    }

    pub fn tracker(&self) -> &Arc<MemTracker> {
        with_backend!(self, d => d.tracker())
    }

    /// The device's largest storage binding (a multiple of 16 bytes).
    pub fn binding_limit(&self) -> u64 {
        let l = &self.info().limits;
        l.max_storage_buffer_binding_size.min(l.max_buffer_size) / 16 * 16
    }

    /// The unit in which weight tensors are split: the binding limit, or the user's cap.
    pub fn max_binding(&self) -> u64 {
        let cap = with_backend!(self, d => d.binding_cap());
        cap.map_or(self.binding_limit(), |c| c.min(self.binding_limit())) / 16 * 16
    }

    pub fn alloc(&self, label: &str, bytes: u64, usage: Usage) -> Result<Buffer> {
        with_backend!(self, d => d.alloc(label, bytes, usage))
    }

    /// A buffer initialised with `data`.
    pub fn upload(&self, label: &str, data: &[u8], usage: Usage) -> Result<Buffer> {
        let b = self.alloc(label, data.len() as u64, usage)?;
        if !data.is_empty() {
            self.write(&b, 0, data)?;
        }
        Ok(b)
    }

    pub fn write(&self, buf: &Buffer, offset: u64, data: &[u8]) -> Result<()> {
        with_backend!(self, d => d.write(buf, offset, data))
    }

    pub fn read(&self, buf: &Buffer, offset: u64, len: u64) -> Result<Vec<u8>> {
        with_backend!(self, d => d.read(buf, offset, len))
    }

    pub fn read_f32(&self, buf: &Buffer, n: usize) -> Result<Vec<f32>> {
        Ok(bytemuck::pod_collect_to_vec(&self.read(
            buf,
            0,
            (n * 4) as u64,
        )?))
    }

    pub fn read_u32(&self, buf: &Buffer, n: usize) -> Result<Vec<u32>> {
        Ok(bytemuck::pod_collect_to_vec(&self.read(
            buf,
            0,
            (n * 4) as u64,
        )?))
    }

    pub fn map_read(&self, buf: &Buffer, len: u64) -> Result<Vec<u8>> {
        with_backend!(self, d => d.map_read(buf, len))
    }

    /// Start reading a readback buffer whose copies were submitted (see [`PendingRead`]).
    pub fn start_read(&self, buf: &Buffer, len: u64) -> Result<PendingRead> {
        if buf.usage() != Usage::Readback || len > buf.size() {
            return Err(Error::Other(format!(
                "internal: a read of {len} bytes from {buf:?}"
            )));
        }
        let native = with_backend!(self, d => d.start_read(buf, len))?;
        Ok(PendingRead::new(len, native))
    }

    /// Whether a started read has landed (never blocks).
    pub fn read_ready(&self, read: &PendingRead) -> bool {
        with_backend!(self, d => d.read_ready(read))
    }

    /// The bytes of a started read, waiting only for the submissions before it.
    pub fn finish_read(&self, read: PendingRead) -> Result<Vec<u8>> {
        with_backend!(self, d => d.finish_read(read))
    }

    /// Make `program` ready to run with `step` as its step uniform.
    pub fn prepare(&self, program: Program, step: &Buffer) -> Result<Prepared> {
        let native = with_backend!(self, d => d.prepare(&program, step))?;
        Ok(Prepared { program, native })
    }

    pub fn submit(&self, work: &[Work<'_>]) -> Result<Submitted> {
        with_backend!(self, d => d.submit(work))
    }

    pub fn wait(&self, token: u64) -> Result<()> {
        with_backend!(self, d => d.wait(token))
    }

    pub fn sync(&self) -> Result<()> {
        with_backend!(self, d => d.sync())
    }

    pub fn check(&self) -> Result<()> {
        with_backend!(self, d => d.check())
    }

    pub fn staging(&self, bytes: u64) -> Result<Staging> {
        with_backend!(self, d => d.staging(bytes))
    }

    pub fn fill_staging(&self, staging: &Staging, data: &[u8]) -> Result<()> {
        with_backend!(self, d => d.fill_staging(staging, data))
    }

    pub fn unstage(&self, staging: &Staging) {
        with_backend!(self, d => d.unstage(staging))
    }

    pub fn profile(
        &self,
        program: &Prepared,
        tokens: u32,
        pos0: u32,
        times: &mut KernelTimes,
    ) -> Result<ProfileClock> {
        with_backend!(self, d => d.profile(program, tokens, pos0, times))
    }

    /// Zero the memory-access probe's counters (a probe build).
    pub fn probe_reset(&self) -> Result<()> {
        match self {
            Device::Wgpu(d) => d.probe_reset(),
            Device::Cuda(_) => Err(probe::not_here()),
        }
    }

    /// The memory-access probe's counters per site (a probe build; waits for the work
    /// submitted so far).
    pub fn probe_counts(&self) -> Result<Vec<[u64; 4]>> {
        match self {
            Device::Wgpu(d) => d.probe_counts(),
            Device::Cuda(_) => Err(probe::not_here()),
        }
    }

    /// Run a program's dispatches for a step of `tokens` tokens at position `pos0` one at
    /// a time, in order, and what each one's loads did (a probe build).
    pub fn probe_program(
        &self,
        p: &Prepared,
        tokens: u32,
        pos0: u32,
    ) -> Result<Vec<probe::ProbedOp>> {
        match self {
            Device::Wgpu(d) => d.probe_program(p, tokens, pos0),
            Device::Cuda(_) => Err(probe::not_here()),
        }
    }

    /// Pipeline compilation so far and the pipeline cache (CUDA: NVRTC's work is cached
    /// per process; reported as unsupported).
    pub fn pipeline_report(&self) -> PipelineReport {
        match self {
            Device::Wgpu(d) => d.pipeline_report(),
            Device::Cuda(_) => PipelineReport {
                compile_s: 0.0,
                cache: "unsupported",
                cache_file: None,
                cache_note: None,
            },
        }
    }

    /// Write the compiled pipelines to the pipeline cache file, where there is one.
    pub fn save_pipeline_cache(&self) -> Result<()> {
        match self {
            Device::Wgpu(d) => d.save_pipeline_cache(),
            Device::Cuda(_) => Ok(()),
        }
    }

    /// CPU seconds spent recording and submitting work since the device opened (None where
    /// the backend does not measure it).
    pub fn encode_seconds(&self) -> Option<f64> {
        match self {
            Device::Wgpu(d) => Some(d.encode_seconds()),
            Device::Cuda(_) => None,
        }
    }

    /// Write a step uniform.
    pub fn write_step(&self, step: &Buffer, pos0: usize, n_tokens: usize) -> Result<()> {
        self.write_step_at(step, pos0, n_tokens, 0)
    }

    /// A step of one sequence whose KV rows start at row `kv0` of the cache.
    pub fn write_step_at(
        &self,
        step: &Buffer,
        pos0: usize,
        n_tokens: usize,
        kv0: usize,
    ) -> Result<()> {
        let s = params::Step {
            pos0: u32::try_from(pos0)
                .map_err(|_| Error::Other(format!("position {pos0} too large")))?,
            n_tokens: n_tokens as u32,
            kv0: u32::try_from(kv0).map_err(|_| Error::Other(format!("KV row {kv0} too large")))?,
            batched: 0,
        };
        self.write(step, 0, bytemuck::bytes_of(&s))
    }

    /// A batched step: token t at position `tokens[t].0` of the sequence whose KV rows
    /// start at row `tokens[t].1`.
    pub fn write_step_batch(&self, step: &Buffer, tokens: &[(usize, usize)]) -> Result<()> {
        if tokens.is_empty() || tokens.len() > params::MAX_BATCH {
            return Err(Error::Other(format!(
                "internal: a batched step of {} sequences (1..={})",
                tokens.len(),
                params::MAX_BATCH
            )));
        }
        let mut u = params::StepUniform {
            step: params::Step {
                pos0: 0,
                n_tokens: tokens.len() as u32,
                kv0: 0,
                batched: 1,
            },
            tok: [[0; 4]; params::MAX_BATCH],
        };
        for (slot, &(pos, kv0)) in u.tok.iter_mut().zip(tokens) {
            let big = || Error::Other(format!("position {pos} (KV row {kv0}) too large"));
            slot[0] = u32::try_from(pos).map_err(|_| big())?;
            slot[1] = u32::try_from(kv0).map_err(|_| big())?;
        }
        self.write(step, 0, bytemuck::bytes_of(&u))
    }

    /// A step uniform holding (pos0, n_tokens).
    pub fn step_buffer(&self, pos0: usize, n_tokens: usize) -> Result<Buffer> {
        let b = self.alloc("step", params::STEP_BYTES, Usage::Uniform)?;
        self.write_step(&b, pos0, n_tokens)?;
        Ok(b)
    }

    /// Prepare and run a program once for a step of `tokens` tokens at position `pos0`
    /// (what `step` holds; `LONGEST` runs position-sized grids at their largest, which is
    /// correct at any position), and wait for it.
    pub fn run_once(
        &self,
        program: Program,
        step: &Buffer,
        tokens: usize,
        pos0: u32,
    ) -> Result<()> {
        let p = self.prepare(program, step)?;
        self.submit(&[Work::Run {
            program: &p,
            tokens: tokens as u32,
            pos0,
        }])?;
        self.sync()
    }
}

impl Fence for Device {
    type Token = u64;
    fn is_complete(&self, token: u64) -> bool {
        with_backend!(self, d => d.is_complete(token))
    }
}

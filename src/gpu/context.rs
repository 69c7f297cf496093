//! Adapter selection, device creation with the adapter's real limits, and runtime-tracked
//! GPU allocations (the "peak GPU bytes" every benchmark reports).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// Which graphics API to use; `None` in [`AdapterRequest`] means "best available".
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    Vulkan,
    Dx12,
    Metal,
    Gl,
}

impl BackendChoice {
    fn backends(self) -> wgpu::Backends {
        match self {
            BackendChoice::Vulkan => wgpu::Backends::VULKAN,
            BackendChoice::Dx12 => wgpu::Backends::DX12,
            BackendChoice::Metal => wgpu::Backends::METAL,
            BackendChoice::Gl => wgpu::Backends::GL,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct AdapterRequest {
    pub backend: Option<BackendChoice>,
    /// Case-insensitive substring of the adapter name.
    pub adapter: Option<String>,
    /// Cap on the storage binding size used to split tensors (bytes). Lets tests and
    /// users exercise the split paths on small models; never raises the adapter's limit.
    pub max_binding: Option<u64>,
    /// Force the portable kernels even where subgroup operations exist (tests, A/B).
    pub portable_kernels: bool,
    /// One-token steps read activations from a uniform window (`*_u.wgsl` kernels).
    /// None: on CPU adapters (lavapipe, where lane-uniform loads are the win), not on GPUs
    /// (where the coalesced storage/subgroup kernels suit the memory system).
    pub uniform_decode: Option<bool>,
    /// Multi-token (prefill) steps run the window kernels (`*_w.wgsl`: activations in
    /// 64 KiB uniform windows, experts grouped by expert). None: on CPU adapters only, as
    /// `uniform_decode`.
    pub window_prefill: Option<bool>,
    /// f16 arithmetic in the W4A16 kernels where SHADER_F16 and subgroups exist. None: on
    /// GPUs (where f16 ALUs are faster), not on CPU adapters (llvmpipe emulates f16).
    pub f16_arithmetic: Option<bool>,
}

/// Bytes currently allocated by the runtime on the GPU, and the peak.
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

/// A buffer whose size is counted in the context's [`MemTracker`] while it lives.
#[derive(Debug)]
pub struct GpuBuffer {
    pub buffer: wgpu::Buffer,
    tracker: Arc<MemTracker>,
}

impl GpuBuffer {
    pub fn size(&self) -> u64 {
        self.buffer.size()
    }
}

impl std::ops::Deref for GpuBuffer {
    type Target = wgpu::Buffer;
    fn deref(&self) -> &wgpu::Buffer {
        &self.buffer
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        self.tracker.sub(self.buffer.size());
    }
}

/// What `wgmoe devices` prints for one adapter.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AdapterSummary {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub driver_info: String,
    pub shader_f16: bool,
    pub subgroup: bool,
    pub timestamp_query: bool,
    pub max_buffer_size: u64,
    pub max_storage_buffer_binding_size: u64,
    pub max_storage_buffers_per_shader_stage: u32,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub min_storage_buffer_offset_alignment: u32,
}

fn summarize(adapter: &wgpu::Adapter) -> AdapterSummary {
    let info = adapter.get_info();
    let f = adapter.features();
    let l = adapter.limits();
    AdapterSummary {
        name: info.name,
        backend: format!("{:?}", info.backend).to_lowercase(),
        device_type: format!("{:?}", info.device_type),
        driver: info.driver,
        driver_info: info.driver_info,
        shader_f16: f.contains(wgpu::Features::SHADER_F16),
        subgroup: f.contains(wgpu::Features::SUBGROUP),
        timestamp_query: f.contains(wgpu::Features::TIMESTAMP_QUERY),
        max_buffer_size: l.max_buffer_size,
        max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
        max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
        max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
        max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
        min_storage_buffer_offset_alignment: l.min_storage_buffer_offset_alignment,
    }
}

const NO_ADAPTER_HELP: &str = "no GPU adapter found. wgmoe needs a Vulkan, DX12 or Metal driver; \
on Debian/Ubuntu without a GPU install Mesa's software Vulkan driver with \
`apt-get install mesa-vulkan-drivers libvulkan1` (and set XDG_RUNTIME_DIR, e.g. to /tmp)";

fn instance(backends: wgpu::Backends) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    wgpu::Instance::new(desc)
}

fn requested_backends(req: &AdapterRequest) -> wgpu::Backends {
    match req.backend {
        Some(b) => b.backends(),
        None => wgpu::Backends::all(),
    }
}

/// All adapters of the requested backends.
pub fn list_adapters(req: &AdapterRequest) -> Vec<AdapterSummary> {
    let backends = requested_backends(req);
    let adapters = pollster::block_on(instance(backends).enumerate_adapters(backends));
    adapters.iter().map(summarize).collect()
}

/// Lower is better: real GPUs first, then software; GL last (no f16, no subgroups).
fn preference(info: &wgpu::AdapterInfo) -> (u8, u8) {
    let ty = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let backend = match info.backend {
        wgpu::Backend::Vulkan | wgpu::Backend::Dx12 | wgpu::Backend::Metal => 0,
        _ => 1,
    };
    (backend, ty)
}

/// Index in `infos` of the adapter `GpuContext::new(req)` picks: the most preferred of
/// those whose name contains `req.adapter`, the first of equals.
pub fn pick(infos: &[wgpu::AdapterInfo], req: &AdapterRequest) -> Option<usize> {
    let sub = req.adapter.as_ref().map(|s| s.to_lowercase());
    infos
        .iter()
        .enumerate()
        .filter(|(_, i)| {
            sub.as_ref()
                .is_none_or(|s| i.name.to_lowercase().contains(s.as_str()))
        })
        .min_by_key(|(_, i)| preference(i))
        .map(|(k, _)| k)
}

/// Index in `list_adapters(req)` of the adapter `GpuContext::new(req)` picks.
pub fn default_adapter(req: &AdapterRequest) -> Option<usize> {
    let backends = requested_backends(req);
    let adapters = pollster::block_on(instance(backends).enumerate_adapters(backends));
    let infos: Vec<wgpu::AdapterInfo> = adapters.iter().map(|a| a.get_info()).collect();
    pick(&infos, req)
}

pub struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub features: wgpu::Features,
    pub limits: wgpu::Limits,
    pub tracker: Arc<MemTracker>,
    max_binding_cap: Option<u64>,
    /// Whether one-token steps use the uniform-activation kernels.
    pub uniform_decode: bool,
    /// Whether multi-token steps use the window kernels.
    pub window_prefill: bool,
    errors: Arc<Mutex<Vec<String>>>,
    pub kernels: super::kernels::Kernels,
}

impl GpuContext {
    pub fn new(req: &AdapterRequest) -> Result<Self> {
        let backends = requested_backends(req);
        let inst = instance(backends);
        let mut adapters = pollster::block_on(inst.enumerate_adapters(backends));
        let infos: Vec<wgpu::AdapterInfo> = adapters.iter().map(|a| a.get_info()).collect();
        let chosen = pick(&infos, req);
        if let (Some(sub), None, false) = (&req.adapter, chosen, adapters.is_empty()) {
            let names: Vec<String> = infos.iter().map(|i| i.name.clone()).collect();
            return Err(Error::option(
                "--adapter",
                format!("no adapter name contains `{sub}`; available: {names:?}"),
            ));
        }
        let adapter = chosen.map(|k| adapters.swap_remove(k)).ok_or_else(|| match req.backend {
            Some(b) if !list_adapters(&AdapterRequest::default()).is_empty() => Error::option(
                "--backend",
                format!("no {b:?} adapter on this machine; `wgmoe devices` lists the adapters there are"),
            ),
            _ => Error::Gpu(NO_ADAPTER_HELP.to_string()),
        })?;
        let info = adapter.get_info();
        let wanted =
            wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP | wgpu::Features::TIMESTAMP_QUERY;
        let features = adapter.features() & wanted;
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("wgmoe"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| Error::Gpu(format!("cannot open device on `{}`: {e}", info.name)))?;
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = errors.clone();
        // Validation or out-of-memory errors are collected and reported by `check`, not
        // turned into a panic.
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            // Display gives only the kind ("Validation Error"); the description says what.
            let msg = match &e {
                wgpu::Error::Validation { description, .. } => format!("validation: {description}"),
                wgpu::Error::OutOfMemory { .. } => "out of GPU memory".to_string(),
                other => other.to_string(),
            };
            if let Ok(mut v) = sink.lock() {
                v.push(msg);
            }
        }));
        // Subgroup kernels give each row to 8 lanes of one subgroup.
        let subgroups = features.contains(wgpu::Features::SUBGROUP)
            && info.subgroup_min_size >= 8
            && !req.portable_kernels;
        let f16 = features.contains(wgpu::Features::SHADER_F16)
            && req
                .f16_arithmetic
                .unwrap_or(info.device_type != wgpu::DeviceType::Cpu);
        let kernels = super::kernels::Kernels::new(&device, subgroups, f16);
        let uniform_decode = req
            .uniform_decode
            .unwrap_or(info.device_type == wgpu::DeviceType::Cpu);
        let window_prefill = req
            .window_prefill
            .unwrap_or(info.device_type == wgpu::DeviceType::Cpu);
        Ok(GpuContext {
            device,
            queue,
            info,
            features,
            limits,
            tracker: Arc::default(),
            max_binding_cap: req.max_binding,
            uniform_decode,
            window_prefill,
            errors,
            kernels,
        })
    }

    pub fn adapter_name(&self) -> &str {
        &self.info.name
    }

    pub fn backend_name(&self) -> String {
        format!("{:?}", self.info.backend).to_lowercase()
    }

    /// Driver name and version as the adapter reports them.
    pub fn driver(&self) -> String {
        format!("{} {}", self.info.driver, self.info.driver_info)
            .trim()
            .to_string()
    }

    /// The adapter's largest storage binding (activations, caches).
    pub fn binding_limit(&self) -> u64 {
        self.limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size)
            / 16
            * 16
    }

    /// The unit in which weight tensors are split: the binding limit, or the user's cap.
    pub fn max_binding(&self) -> u64 {
        let adapter = self.binding_limit();
        // Bindings stay multiples of 16 bytes (one vec4<u32>).
        self.max_binding_cap.map_or(adapter, |c| c.min(adapter)) / 16 * 16
    }

    pub fn buffer(&self, label: &str, size: u64, usage: wgpu::BufferUsages) -> GpuBuffer {
        // wgpu rejects zero-sized bindings, and any buffer may be viewed as vec4s: sizes
        // are whole vec4s.
        let size = size.max(16).div_ceil(16) * 16;
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation: false,
        });
        self.tracker.add(size);
        GpuBuffer {
            buffer,
            tracker: self.tracker.clone(),
        }
    }

    /// Count a buffer created elsewhere (e.g. mapped at creation) in the tracker.
    pub fn track(&self, buffer: wgpu::Buffer) -> GpuBuffer {
        self.tracker.add(buffer.size());
        GpuBuffer {
            buffer,
            tracker: self.tracker.clone(),
        }
    }

    /// A storage buffer initialised with `data`.
    pub fn storage_with(&self, label: &str, data: &[u8]) -> GpuBuffer {
        let b = self.buffer(
            label,
            data.len() as u64,
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
        );
        if !data.is_empty() {
            self.write(&b, 0, data);
        }
        b
    }

    pub fn uniform_with(&self, label: &str, data: &[u8]) -> GpuBuffer {
        let b = self.buffer(
            label,
            data.len() as u64,
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        );
        self.write(&b, 0, data);
        b
    }

    /// queue.write_buffer for data of any length (padded to the 4-byte copy alignment).
    pub fn write(&self, buf: &wgpu::Buffer, offset: u64, data: &[u8]) {
        if data.len() % 4 == 0 {
            self.queue.write_buffer(buf, offset, data);
        } else {
            let mut v = data.to_vec();
            v.resize(data.len().div_ceil(4) * 4, 0);
            self.queue.write_buffer(buf, offset, &v);
        }
    }

    /// Wait for all submitted work, then report any GPU error raised since the last check.
    pub fn sync(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu(format!("device poll failed: {e}")))?;
        self.check()
    }

    pub fn check(&self) -> Result<()> {
        let mut errs = self
            .errors
            .lock()
            .map_err(|_| Error::Gpu("error sink poisoned".into()))?;
        if errs.is_empty() {
            return Ok(());
        }
        let msg = errs.join("; ");
        errs.clear();
        Err(Error::Gpu(msg))
    }

    /// Copy `size` bytes of `src` back to the host (blocking).
    pub fn read_back(&self, src: &wgpu::Buffer, offset: u64, size: u64) -> Result<Vec<u8>> {
        let size4 = size.div_ceil(4) * 4;
        let staging = self.buffer(
            "readback",
            size4,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        );
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(src, offset, &staging, 0, size4);
        self.queue.submit([enc.finish()]);
        map_read(self, &staging, size)
    }
}

/// Map a MAP_READ buffer after its copy was submitted, and return its first `size` bytes.
pub fn map_read(ctx: &GpuContext, staging: &wgpu::Buffer, size: u64) -> Result<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let slice = staging.slice(..);
    slice.map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| Error::Gpu(format!("device poll failed: {e}")))?;
    ctx.check()?;
    match rx.recv() {
        Ok(Ok(())) => {}
        _ => return Err(Error::Gpu("mapping a readback buffer failed".into())),
    }
    let out = {
        let view = slice
            .get_mapped_range()
            .map_err(|e| Error::Gpu(format!("readback: {e}")))?;
        view[..size as usize].to_vec()
    };
    staging.unmap();
    Ok(out)
}

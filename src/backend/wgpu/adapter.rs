//! Finding adapters: the instance (every API wgpu offers here), the user's filters, the
//! order of preference, and what an adapter reports, in the seam's terms.

use crate::backend::{BackendChoice, DeviceInfo, DeviceRequest, DeviceType, Limits};
use crate::error::{Error, Result};

pub const NO_ADAPTER_HELP: &str =
    "no GPU adapter found. wgmoe needs a Vulkan, DX12 or Metal driver; \
on Debian/Ubuntu without a GPU install Mesa's software Vulkan driver with \
`apt-get install mesa-vulkan-drivers libvulkan1` (and set XDG_RUNTIME_DIR, e.g. to /tmp)";

fn backends(choice: Option<BackendChoice>) -> ::wgpu::Backends {
    match choice {
        Some(BackendChoice::Vulkan) => ::wgpu::Backends::VULKAN,
        Some(BackendChoice::Dx12) => ::wgpu::Backends::DX12,
        Some(BackendChoice::Metal) => ::wgpu::Backends::METAL,
        Some(BackendChoice::Gl) => ::wgpu::Backends::GL,
        Some(BackendChoice::Cuda) => ::wgpu::Backends::empty(),
        None => ::wgpu::Backends::all(),
    }
}

pub fn instance(choice: Option<BackendChoice>) -> ::wgpu::Instance {
    let mut desc = ::wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends(choice);
    // DX12: DXC where the user has it (f16 and wave operations, so the subgroup and f16
    // kernels), FXC otherwise (the kernel plan then picks the portable kernels).
    desc.backend_options.dx12.shader_compiler = ::wgpu::Dx12Compiler::Auto;
    ::wgpu::Instance::new(desc)
}

/// Lower is better: real GPUs first, then software; GL last (no f16, no subgroups).
fn preference(info: &::wgpu::AdapterInfo) -> (u8, u8) {
    let ty = match info.device_type {
        ::wgpu::DeviceType::DiscreteGpu => 0,
        ::wgpu::DeviceType::IntegratedGpu => 1,
        ::wgpu::DeviceType::VirtualGpu => 2,
        ::wgpu::DeviceType::Other => 3,
        ::wgpu::DeviceType::Cpu => 4,
    };
    let backend = match info.backend {
        ::wgpu::Backend::Vulkan | ::wgpu::Backend::Dx12 | ::wgpu::Backend::Metal => 0,
        _ => 1,
    };
    (backend, ty)
}

pub fn device_type(t: ::wgpu::DeviceType) -> DeviceType {
    match t {
        ::wgpu::DeviceType::DiscreteGpu => DeviceType::DiscreteGpu,
        ::wgpu::DeviceType::IntegratedGpu => DeviceType::IntegratedGpu,
        ::wgpu::DeviceType::VirtualGpu => DeviceType::VirtualGpu,
        ::wgpu::DeviceType::Cpu => DeviceType::Cpu,
        ::wgpu::DeviceType::Other => DeviceType::Other,
    }
}

/// What the seam knows of an adapter, given the features the device will have.
pub fn describe(adapter: &::wgpu::Adapter, features: ::wgpu::Features) -> DeviceInfo {
    let info = adapter.get_info();
    let l = adapter.limits();
    let subgroup = features.contains(::wgpu::Features::SUBGROUP);
    DeviceInfo {
        name: info.name.clone(),
        backend: format!("{:?}", info.backend).to_lowercase(),
        device_type: device_type(info.device_type),
        driver: info.driver.clone(),
        driver_info: info.driver_info.clone(),
        shader_f16: features.contains(::wgpu::Features::SHADER_F16),
        subgroup,
        subgroup_min_size: if subgroup { info.subgroup_min_size } else { 0 },
        subgroup_max_size: if subgroup { info.subgroup_max_size } else { 0 },
        timestamp_query: features.contains(::wgpu::Features::TIMESTAMP_QUERY),
        limits: Limits {
            max_buffer_size: l.max_buffer_size,
            max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
            max_uniform_buffer_binding_size: l.max_uniform_buffer_binding_size,
            min_uniform_buffer_offset_alignment: l.min_uniform_buffer_offset_alignment,
            min_storage_buffer_offset_alignment: l.min_storage_buffer_offset_alignment,
            max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
            max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
            max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
        },
    }
}

/// The features wgmoe asks a device for (where the adapter has them).
pub fn wanted_features(adapter: &::wgpu::Adapter) -> ::wgpu::Features {
    adapter.features()
        & (::wgpu::Features::SHADER_F16
            | ::wgpu::Features::SUBGROUP
            | ::wgpu::Features::TIMESTAMP_QUERY
            | ::wgpu::Features::PIPELINE_CACHE)
}

fn adapters(req: &DeviceRequest) -> Vec<::wgpu::Adapter> {
    let b = backends(req.backend);
    let mut v = pollster::block_on(instance(req.backend).enumerate_adapters(b));
    v.sort_by_key(|a| preference(&a.get_info()));
    v
}

/// Every adapter of the requested APIs in order of preference, and the index `select`
/// picks (none when no adapter matches the request).
pub fn list(req: &DeviceRequest) -> (Vec<DeviceInfo>, Option<usize>) {
    let all = adapters(req);
    let pick = all.iter().position(|a| name_matches(req, a));
    (
        all.iter()
            .map(|a| describe(a, wanted_features(a)))
            .collect(),
        pick,
    )
}

fn name_matches(req: &DeviceRequest, a: &::wgpu::Adapter) -> bool {
    req.adapter
        .as_ref()
        .is_none_or(|s| a.get_info().name.to_lowercase().contains(&s.to_lowercase()))
}

/// The adapter a request names: the most preferred one whose name contains the filter.
pub fn select(req: &DeviceRequest) -> Result<::wgpu::Adapter> {
    let all = adapters(req);
    if let Some(sub) = &req.adapter {
        let names: Vec<String> = all.iter().map(|a| a.get_info().name).collect();
        return all
            .into_iter()
            .find(|a| name_matches(req, a))
            .ok_or_else(|| {
                Error::option(
                    "--adapter",
                    format!("no adapter name contains `{sub}`; available: {names:?}"),
                )
            });
    }
    all.into_iter().next().ok_or_else(|| match req.backend {
        Some(b) if !adapters(&DeviceRequest::default()).is_empty() => Error::option(
            "--backend",
            format!(
                "no {b:?} adapter on this machine; `wgmoe devices` lists the adapters there are"
            ),
        ),
        _ => Error::Gpu(NO_ADAPTER_HELP.to_string()),
    })
}

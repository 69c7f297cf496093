//! What a CUDA device is, as the driver describes it: its properties read through the
//! driver API, and the `DeviceInfo` the kernel plan decides from.

use cudarc::driver::sys as cu;

use super::{load, ok};
use crate::backend::{DeviceInfo, DeviceType, Limits};
use crate::error::{Error, Result};

fn attribute(dev: cu::CUdevice, a: cu::CUdevice_attribute) -> Result<i32> {
    let mut v = 0;
    // SAFETY: out-pointer to a live integer.
    ok("cuDeviceGetAttribute", unsafe {
        cu::cuDeviceGetAttribute(&mut v, a, dev)
    })?;
    Ok(v)
}

/// The properties of a CUDA device that wgmoe reads from the driver.
#[derive(Clone, Debug)]
pub struct Properties {
    pub name: String,
    /// Total memory in bytes.
    pub mem: u64,
    /// cuDriverGetVersion: 1000 * major + 10 * minor.
    pub driver_version: i32,
    /// Compute capability (major, minor).
    pub capability: (i32, i32),
    pub integrated: bool,
    /// Shared memory per block, bytes.
    pub shared: u32,
    /// Threads per block.
    pub threads: u32,
    pub warp: u32,
}

/// What a CUDA device of these properties reports to the rest of wgmoe (public so the
/// plan's choice on CUDA can be tested without a device).
pub fn device_info(d: Properties) -> DeviceInfo {
    let Properties {
        name,
        mem,
        driver_version,
        capability: (major, minor),
        integrated,
        shared,
        threads,
        warp,
    } = d;
    DeviceInfo {
        name,
        backend: "cuda".into(),
        device_type: if integrated {
            DeviceType::IntegratedGpu
        } else {
            DeviceType::DiscreteGpu
        },
        driver: "CUDA".into(),
        driver_info: format!(
            "driver API {}.{}, compute capability {major}.{minor}",
            driver_version / 1000,
            driver_version % 1000 / 10
        ),
        // Warps are subgroups (the 8-lane W4A16 kernels and the GPU-shaped kernels'
        // reductions use warp shuffles); no f16-arithmetic or uniform-window kernels exist
        // for CUDA, so it reports neither SHADER_F16 nor uniform bindings and the plan
        // picks only the ported kernels.
        shader_f16: false,
        subgroup: warp >= 8,
        subgroup_min_size: warp,
        subgroup_max_size: warp,
        timestamp_query: false,
        limits: Limits {
            max_buffer_size: mem,
            // The kernels index u32 words of a binding: stay below 4 GiB per tensor chunk.
            max_storage_buffer_binding_size: mem.min(1 << 31),
            max_uniform_buffer_binding_size: 0,
            min_uniform_buffer_offset_alignment: 256,
            min_storage_buffer_offset_alignment: 256,
            max_storage_buffers_per_shader_stage: 16,
            max_compute_workgroup_storage_size: shared,
            max_compute_invocations_per_workgroup: threads,
        },
    }
}

/// A device's handle, info and NVRTC architecture.
pub(super) fn describe(ordinal: i32) -> Result<(cu::CUdevice, DeviceInfo, (i32, i32))> {
    let mut dev = 0;
    // SAFETY: out-pointer to a live handle.
    ok("cuDeviceGet", unsafe { cu::cuDeviceGet(&mut dev, ordinal) })?;
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: the buffer holds 256 bytes.
    ok("cuDeviceGetName", unsafe {
        cu::cuDeviceGetName(name.as_mut_ptr(), 256, dev)
    })?;
    // SAFETY: NUL-terminated by the driver within the buffer.
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let mut mem = 0usize;
    // SAFETY: out-pointer to a live usize.
    ok("cuDeviceTotalMem", unsafe {
        cu::cuDeviceTotalMem_v2(&mut mem, dev)
    })?;
    let mut version = 0;
    // SAFETY: out-pointer to a live integer.
    ok("cuDriverGetVersion", unsafe {
        cu::cuDriverGetVersion(&mut version)
    })?;
    use cu::CUdevice_attribute as A;
    let major = attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let integrated = attribute(dev, A::CU_DEVICE_ATTRIBUTE_INTEGRATED)? != 0;
    let shared = attribute(dev, A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?;
    let threads = attribute(dev, A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?;
    let warp = attribute(dev, A::CU_DEVICE_ATTRIBUTE_WARP_SIZE)?;
    let info = device_info(Properties {
        name,
        mem: mem as u64,
        driver_version: version,
        capability: (major, minor),
        integrated,
        shared: shared.max(0) as u32,
        threads: threads.max(0) as u32,
        warp: warp.max(0) as u32,
    });
    Ok((dev, info, (major, minor)))
}

pub(super) fn device_count() -> Result<i32> {
    load::driver()?;
    let mut n = 0;
    // SAFETY: out-pointer to a live integer.
    ok("cuDeviceGetCount", unsafe { cu::cuDeviceGetCount(&mut n) })?;
    if n == 0 {
        return Err(Error::Gpu(
            "--backend cuda: the NVIDIA driver reports no CUDA device".into(),
        ));
    }
    Ok(n)
}

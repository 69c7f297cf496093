//! The GPU options every command that opens a device takes (`--backend`, `--adapter`, the
//! kernel plan's overrides, `--pipeline-depth`).

use clap::Args;

use wgmoe::backend::plan::{DecodeKernels, PrefillKernels, Switch};
use wgmoe::backend::{BackendChoice, DeviceRequest, KernelOverrides};
use wgmoe::error::Result;

#[derive(Args, Clone)]
pub(crate) struct GpuArgs {
    /// Graphics API to use (default: the best available).
    #[arg(long, value_enum)]
    pub(crate) backend: Option<BackendChoice>,
    /// The adapter at this index of `wgmoe devices`, or the first whose name contains
    /// this text (case-insensitive).
    #[arg(long, value_name = "INDEX|NAME")]
    pub(crate) adapter: Option<String>,
    /// Cap the storage-binding size used to split large tensors (bytes), below the
    /// adapter's own limit; exercises the split paths.
    #[arg(long, hide = true)]
    pub(crate) max_binding: Option<u64>,
    /// Use the portable kernels even where subgroup operations exist.
    #[arg(long)]
    pub(crate) portable_kernels: bool,
    /// One-token steps: activations in a uniform window (default on CPU adapters such as
    /// lavapipe), the storage kernels of a row per invocation (or 8 lanes), or the
    /// coalesced GPU kernels (default on GPUs: a workgroup per 4 weight rows, flash
    /// attention split over the keys).
    #[arg(long, value_enum)]
    pub(crate) decode_kernels: Option<DecodeKernels>,
    /// Multi-token (prefill) steps: window kernels (activations in 64 KiB uniform windows,
    /// routed experts grouped by expert; default on CPU adapters), the storage kernels, or
    /// the tiled GPU kernels (default on GPUs).
    #[arg(long, value_enum)]
    pub(crate) prefill_kernels: Option<PrefillKernels>,
    /// f16 arithmetic in the W4A16 kernels (needs SHADER_F16 and subgroups; default on
    /// GPUs, off on CPU adapters).
    #[arg(long, value_enum)]
    pub(crate) f16_arithmetic: Option<Switch>,
    /// Decode steps kept in flight: step n + 1 is submitted before token n is read, so
    /// the device never waits on the host (1: each step recorded after the last token
    /// was read). Sampled tokens, partial residency and routing traces run at 1.
    #[arg(long, value_name = "N", default_value_t = wgmoe::runtime::generate::DEFAULT_PIPELINE_DEPTH,
          value_parser = parse_pipeline_depth)]
    pub(crate) pipeline_depth: usize,
    /// Compile every pipeline and leave the on-disk pipeline cache alone (by default
    /// compiled pipelines are kept under the cache directory, per adapter and wgmoe
    /// version, where the driver supports it: Vulkan).
    #[arg(long)]
    pub(crate) no_pipeline_cache: bool,
}

pub(crate) fn parse_pipeline_depth(s: &str) -> std::result::Result<usize, String> {
    let n: usize = s
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number"))?;
    wgmoe::runtime::generate::check_depth(n).map_err(|e| e.to_string())?;
    Ok(n)
}

impl GpuArgs {
    /// The device request, with `--adapter` resolved against the adapters there are.
    pub(crate) fn request(&self) -> Result<DeviceRequest> {
        super::adapter_request(self.request_unresolved())
    }

    pub(crate) fn request_unresolved(&self) -> DeviceRequest {
        DeviceRequest {
            backend: self.backend,
            adapter: self.adapter.clone(),
            max_binding: self.max_binding,
            probe: false,
            no_pipeline_cache: self.no_pipeline_cache,
        }
    }

    pub(crate) fn kernels(&self) -> KernelOverrides {
        KernelOverrides {
            portable: self.portable_kernels,
            decode: self.decode_kernels,
            prefill: self.prefill_kernels,
            f16_arithmetic: self.f16_arithmetic,
        }
    }
}

//! Finding the CUDA libraries at run time. cudarc loads libcuda and libnvrtc on first use
//! and panics when one is missing, so both are probed here first and a missing one is an
//! error naming the library and how to provide it.
//!
//! NVRTC: `WGMOE_NVRTC_LIB` may name the library file (e.g. the one in PyPI's
//! `nvidia-cuda-nvrtc-cu12` wheel, `site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12`).
//! It is loaded globally before cudarc looks, so cudarc's lookup by soname finds it. When
//! the variable is set and the file cannot be loaded, that is an error, never a fallback.

use std::sync::OnceLock;

use cudarc::driver::sys as cu;
use cudarc::nvrtc::sys as nv;

use crate::error::{Error, Result};

/// The variable naming the NVRTC library file.
pub const NVRTC_ENV: &str = "WGMOE_NVRTC_LIB";

/// Run a cudarc call that may panic (a missing library or symbol) as a `Result`.
pub fn guard<T>(what: &str, f: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Error::Gpu(format!("cuda: {what}: {msg}"))
    })
}

/// A CUDA driver call's error as ours.
pub fn cu_err(what: &str, e: cudarc::driver::DriverError) -> Error {
    Error::Gpu(format!("cuda: {what}: {e:?}"))
}

/// The driver API, initialised once (cuInit); the error says which library is missing.
pub fn driver() -> Result<()> {
    static INIT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: probes dlopen of the driver's library names; loads nothing else.
        if !unsafe { cu::is_culib_present() } {
            return Err("--backend cuda: the NVIDIA driver library (libcuda.so / nvcuda.dll) was not found: this machine has no NVIDIA driver, or its library is not on the loader path (LD_LIBRARY_PATH)".to_string());
        }
        // SAFETY: cuInit takes no pointers.
        let r = guard("cuInit", || unsafe { cu::cuInit(0) }).map_err(|e| e.to_string())?;
        match r {
            cu::CUresult::CUDA_SUCCESS => Ok(()),
            cu::CUresult::CUDA_ERROR_NO_DEVICE => Err(
                "--backend cuda: the NVIDIA driver is installed but reports no CUDA device".into(),
            ),
            other => Err(format!(
                "--backend cuda: the NVIDIA driver failed to initialise: {other:?}"
            )),
        }
    })
    .clone()
    .map_err(Error::Gpu)
}

/// NVRTC, loaded once; returns its version (major, minor).
pub fn nvrtc() -> Result<(i32, i32)> {
    static INIT: OnceLock<std::result::Result<(i32, i32), String>> = OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: probes dlopen of NVRTC's library names.
        let found = || unsafe { nv::is_culib_present() };
        if let Some(path) = std::env::var_os(NVRTC_ENV) {
            preload(&path)?;
        } else if !found() {
            // Not on the loader path: a CUDA 12 toolkit where toolkits usually are.
            if let Some(p) = toolkit_nvrtc() {
                preload(p.as_os_str())?;
            }
        }
        if !found() {
            return Err(format!(
                "--backend cuda: the NVRTC library (libnvrtc.so.12) was not found; install the CUDA 12 runtime compiler (e.g. `pip install nvidia-cuda-nvrtc-cu12`) and set {NVRTC_ENV} to its libnvrtc.so.12 file, or put its folder on LD_LIBRARY_PATH"
            ));
        }
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two out-pointers to live integers.
        let r = guard("nvrtcVersion", || unsafe { nv::nvrtcVersion(&mut major, &mut minor) })
            .map_err(|e| e.to_string())?;
        if r != nv::nvrtcResult::NVRTC_SUCCESS {
            return Err(format!("--backend cuda: nvrtcVersion failed: {r:?}"));
        }
        Ok((major, minor))
    })
    .clone()
    .map_err(Error::Gpu)
}

/// NVRTC 12 of a CUDA toolkit under `CUDA_HOME`, `CUDA_PATH` or /usr/local/cuda (cudarc
/// looks libraries up by name, and 12 is the soname its CUDA 12 bindings know).
fn toolkit_nvrtc() -> Option<std::path::PathBuf> {
    let roots = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .map(std::path::PathBuf::from)
        .chain([std::path::PathBuf::from("/usr/local/cuda")]);
    roots
        .map(|r| r.join("lib64").join("libnvrtc.so.12"))
        .find(|p| p.is_file())
}

/// Load the NVRTC file the variable names, globally and for the life of the process.
fn preload(path: &std::ffi::OsStr) -> std::result::Result<(), String> {
    #[cfg(unix)]
    {
        use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
        // SAFETY: loading NVRTC runs its initialisers, which have no preconditions.
        match unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) } {
            Ok(lib) => {
                // Kept loaded: cudarc's handle refers to the same object by soname.
                std::mem::forget(lib);
                Ok(())
            }
            Err(e) => Err(format!(
                "{NVRTC_ENV}={}: cannot load NVRTC from it: {e}",
                path.to_string_lossy()
            )),
        }
    }
    #[cfg(not(unix))]
    {
        // SAFETY: as above.
        match unsafe { libloading::Library::new(path) } {
            Ok(lib) => {
                std::mem::forget(lib);
                Ok(())
            }
            Err(e) => Err(format!(
                "{NVRTC_ENV}={}: cannot load NVRTC from it: {e}",
                path.to_string_lossy()
            )),
        }
    }
}

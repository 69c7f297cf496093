//! `--backend cuda` without a usable CUDA: built without the `cuda` feature, the error says
//! how to build it; built with it on a machine without the NVIDIA driver, the error names
//! the missing library; exit code 1 and never a panic either way (cudarc panics when it
//! cannot load libcuda; the backend probes for it first). On a machine with a driver the
//! latter print "not run: a CUDA driver is present" (tests/cuda_kernels.rs and
//! tests/cuda_parity.rs run there).

mod common;

use common::cli::{assert_error, wgmoe};
#[cfg(feature = "cuda")]
use common::fixture;

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_without_the_feature_says_how_to_build_it() {
    let r = wgmoe(["devices", "--backend", "cuda"]);
    assert_error(&r, &["--backend", "--features cuda"]);
    assert_eq!(r.code, Some(1), "{r}");
}

#[cfg(feature = "cuda")]
fn driver_absent(test: &str) -> bool {
    let absent = wgmoe::backend::cuda::load::driver().is_err();
    if !absent {
        println!("{test}: not run: a CUDA driver is present");
    }
    absent
}

#[cfg(feature = "cuda")]
#[test]
fn devices_on_cuda_without_a_driver_names_libcuda() {
    if !driver_absent("devices_on_cuda_without_a_driver_names_libcuda") {
        return;
    }
    let r = wgmoe(["devices", "--backend", "cuda"]);
    assert_error(&r, &["--backend cuda", "libcuda", "NVIDIA driver"]);
    assert_eq!(r.code, Some(1), "{r}");
}

#[cfg(feature = "cuda")]
#[test]
fn run_on_cuda_without_a_driver_names_libcuda() {
    if !driver_absent("run_on_cuda_without_a_driver_names_libcuda") {
        return;
    }
    let model = fixture("olmoe-tiny");
    let r = wgmoe([
        "run".as_ref(),
        model.as_os_str(),
        "--backend".as_ref(),
        "cuda".as_ref(),
        "--prompt".as_ref(),
        "Hello".as_ref(),
        "-n".as_ref(),
        "2".as_ref(),
    ]);
    assert_error(&r, &["--backend cuda", "libcuda"]);
    assert_eq!(r.code, Some(1), "{r}");
}

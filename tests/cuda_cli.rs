//! `--backend cuda` in a build with the `cuda` feature on a machine without the NVIDIA
//! driver: a clear error naming the missing library and exit code 1, never a panic (cudarc
//! panics when it cannot load libcuda; the backend probes for it first). On a machine with
//! a driver these print "not run: a CUDA driver is present" (tests/cuda_kernels.rs and
//! tests/cuda_parity.rs run there).
#![cfg(feature = "cuda")]

mod common;

use common::cli::{assert_error, wgmoe};
use common::fixture;

fn driver_absent(test: &str) -> bool {
    let absent = wgmoe::backend::cuda::load::driver().is_err();
    if !absent {
        println!("{test}: not run: a CUDA driver is present");
    }
    absent
}

#[test]
fn devices_on_cuda_without_a_driver_names_libcuda() {
    if !driver_absent("devices_on_cuda_without_a_driver_names_libcuda") {
        return;
    }
    let r = wgmoe(["devices", "--backend", "cuda"]);
    assert_error(&r, &["--backend cuda", "libcuda", "NVIDIA driver"]);
    assert_eq!(r.code, Some(1), "{r}");
}

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

//! The CUDA backend when the crate is built without the `cuda` feature: it cannot be
//! constructed, so every `Device::Cuda` arm is unreachable and no call site needs a `cfg`.

use std::sync::Arc;

use super::{
    Backend, Buffer, DeviceInfo, DeviceRequest, KernelTimes, MemTracker, Prepared, ProfileClock,
    Program, Staging, Submitted, Usage, Work,
};
use crate::error::{Error, Result};

pub enum CudaDevice {}
pub enum NativeBuffer {}
pub enum NativeStaging {}
pub enum NativePrepared {}
pub enum PendingCopy {}

fn not_compiled() -> Error {
    Error::option(
        "--backend",
        "cuda: this wgmoe was built without CUDA support; rebuild with `cargo build --release --features cuda` (needs no CUDA toolkit: the driver and NVRTC are loaded at run time)",
    )
}

impl CudaDevice {
    pub fn open(_req: &DeviceRequest) -> Result<Self> {
        Err(not_compiled())
    }
    pub fn list(_req: &DeviceRequest) -> Result<(Vec<DeviceInfo>, Option<usize>)> {
        Err(not_compiled())
    }
    pub fn binding_cap(&self) -> Option<u64> {
        match *self {}
    }
}

impl Backend for CudaDevice {
    fn info(&self) -> &DeviceInfo {
        match *self {}
    }
    fn tracker(&self) -> &Arc<MemTracker> {
        match *self {}
    }
    fn alloc(&self, _: &str, _: u64, _: Usage) -> Result<Buffer> {
        match *self {}
    }
    fn write(&self, _: &Buffer, _: u64, _: &[u8]) -> Result<()> {
        match *self {}
    }
    fn read(&self, _: &Buffer, _: u64, _: u64) -> Result<Vec<u8>> {
        match *self {}
    }
    fn map_read(&self, _: &Buffer, _: u64) -> Result<Vec<u8>> {
        match *self {}
    }
    fn start_read(&self, _: &Buffer, _: u64) -> Result<super::NativePendingRead> {
        match *self {}
    }
    fn read_ready(&self, _: &super::PendingRead) -> bool {
        match *self {}
    }
    fn finish_read(&self, _: super::PendingRead) -> Result<Vec<u8>> {
        match *self {}
    }
    fn prepare(&self, _: &Program, _: &Buffer) -> Result<super::NativePrepared> {
        match *self {}
    }
    fn submit(&self, _: &[Work<'_>]) -> Result<Submitted> {
        match *self {}
    }
    fn is_complete(&self, _: u64) -> bool {
        match *self {}
    }
    fn wait(&self, _: u64) -> Result<()> {
        match *self {}
    }
    fn sync(&self) -> Result<()> {
        match *self {}
    }
    fn check(&self) -> Result<()> {
        match *self {}
    }
    fn staging(&self, _: u64) -> Result<Staging> {
        match *self {}
    }
    fn fill_staging(&self, _: &Staging, _: &[u8]) -> Result<()> {
        match *self {}
    }
    fn unstage(&self, _: &Staging) {
        match *self {}
    }
    fn profile(&self, _: &Prepared, _: u32, _: u32, _: &mut KernelTimes) -> Result<ProfileClock> {
        match *self {}
    }
}

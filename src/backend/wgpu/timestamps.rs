//! `--profile-kernels` on an adapter with timestamp queries: a program's dispatches each in
//! its own compute pass with a timestamp at the start and the end, all in one submission,
//! the timestamps resolved and read back once. What it measures is each kernel's time on
//! the GPU (pass boundaries add a barrier each, as the dispatches of a step have anyway),
//! not the submission and the wait the wall-clock table is mostly made of.

use super::record::dispatches;
use super::WgpuDevice;
use crate::backend::{Backend, KernelTimes, Prepared};
use crate::error::{Error, Result};

/// Dispatches timed per submission: two timestamps each, within a query set's 4096.
const PER_SET: usize = (::wgpu::QUERY_SET_MAX_QUERIES / 2) as usize;

/// Time each dispatch of `p` with GPU timestamps, adding to `times`.
pub fn profile(
    dev: &WgpuDevice,
    p: &Prepared,
    tokens: u32,
    pos0: u32,
    times: &mut KernelTimes,
) -> Result<()> {
    let all = dispatches(p, tokens, pos0)?;
    // Nanoseconds per timestamp tick.
    let period = f64::from(dev.queue.get_timestamp_period());
    for chunk in all.chunks(PER_SET) {
        let n = chunk.len() as u32;
        let bytes = u64::from(2 * n) * u64::from(::wgpu::QUERY_SIZE);
        let set = dev.device.create_query_set(&::wgpu::QuerySetDescriptor {
            label: Some("profile timestamps"),
            ty: ::wgpu::QueryType::Timestamp,
            count: 2 * n,
        });
        let resolve = dev.device.create_buffer(&::wgpu::BufferDescriptor {
            label: Some("profile resolve"),
            size: bytes,
            usage: ::wgpu::BufferUsages::QUERY_RESOLVE | ::wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let read = dev.device.create_buffer(&::wgpu::BufferDescriptor {
            label: Some("profile readback"),
            size: bytes,
            usage: ::wgpu::BufferUsages::MAP_READ | ::wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = dev.device.create_command_encoder(&Default::default());
        for (i, (_, _, pipeline, bind_group, [x, y, z])) in chunk.iter().enumerate() {
            let i = i as u32;
            let mut pass = enc.begin_compute_pass(&::wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: Some(::wgpu::ComputePassTimestampWrites {
                    query_set: &set,
                    beginning_of_pass_write_index: Some(2 * i),
                    end_of_pass_write_index: Some(2 * i + 1),
                }),
            });
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, *bind_group, &[]);
            pass.dispatch_workgroups(*x, *y, *z);
        }
        enc.resolve_query_set(&set, 0..2 * n, &resolve, 0);
        enc.copy_buffer_to_buffer(&resolve, 0, &read, 0, bytes);
        let token = dev.submit_commands(enc.finish());
        dev.wait(token)?;
        let (tx, rx) = std::sync::mpsc::channel();
        read.slice(..).map_async(::wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        dev.device
            .poll(::wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu(format!("profile: device poll failed: {e}")))?;
        rx.recv()
            .map_err(|_| Error::Gpu("profile: the timestamp readback was dropped".into()))?
            .map_err(|e| Error::Gpu(format!("profile: mapping the timestamps failed: {e}")))?;
        let ticks: Vec<u64> = read
            .slice(..)
            .get_mapped_range()
            .map_err(|e| Error::Gpu(format!("profile: timestamps: {e}")))?
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .collect();
        read.unmap();
        for (i, (stage, kernel, ..)) in chunk.iter().enumerate() {
            // A pass whose end precedes its start (a driver's clock reset) counts as zero.
            let dt = ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * period * 1e-9;
            let e = times
                .entry((stage.to_string(), kernel.clone()))
                .or_default();
            e.0 += dt;
            e.1 += 1;
        }
    }
    dev.check()
}

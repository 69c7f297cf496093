//! `wgmoe devices --measure`: the two bandwidths `wgmoe plan` predicts with, measured on an
//! adapter through the backend seam.
//!
//! - Device read: the f16 matmul of one token (the kernel a decode step runs, as the kernel
//!   plan picks it for this device) over a matrix of [`READ_BYTES`], several runs per
//!   submission; bytes of the matrix over the wall time of the submission.
//! - Host to device: [`H2D_BYTES`] through a mapped staging buffer and a copy (what an
//!   expert upload does), and through the queue's buffer write.
//! - The CPU expert kernel (`--miss-policy cpu`): one token through [`CPU_EXPERTS`] distinct
//!   INT4 experts of OLMoE's shape (hidden 2048, intermediate 1024), packed bytes read over
//!   the wall time, on every core; each call takes the next experts of a pool of
//!   [`CPU_POOL`] (over 200 MB, more than a CPU cache holds), as decode steps do.
//! - The round trip of a segmented step's sync point: a submission of a small copy, then
//!   its readback mapped (what each MoE layer below full residency waits for).
//!
//! - The latency of a dependent dispatch: a chain of [`CHAIN`] tiny matmuls each writing
//!   what the next reads, in one submission, against a chain of one; the difference per
//!   dispatch is what each link of a decode step's chain costs when its bytes are few.
//!
//! Each figure is the median of [`REPETITIONS`] timed repetitions after one untimed.

use std::time::Instant;

use half::f16;

use crate::backend::cpu::{CpuExperts, ExpertPair};
use crate::backend::{Device, KernelOverrides, KernelPlan, Program, Usage, Work};
use crate::error::Result;
use crate::format::bandwidth::Measured;
use crate::model::ops::{matmul, OpEnv};
use crate::model::tensors::F16Matrix;

/// Bytes of the matrix the read measurement streams.
pub const READ_BYTES: u64 = 256 << 20;
/// Matmul runs per timed submission.
pub const READ_RUNS: usize = 4;
/// Bytes of one host-to-device transfer.
pub const H2D_BYTES: u64 = 64 << 20;
pub const REPETITIONS: usize = 5;
/// Experts of the CPU measurement (a decode step's top-8 of one layer).
pub const CPU_EXPERTS: usize = 8;
/// Distinct experts the CPU measurement cycles through (64 x 3.2 MB).
pub const CPU_POOL: usize = 64;
/// Timed round trips (the median is kept).
pub const ROUND_TRIPS: usize = 21;
/// Dispatches of the dependent chain `dispatch_latency_s` times.
pub const CHAIN: usize = 128;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// GB/s of `bytes` moved by `f`, median of the timed repetitions.
fn rate(bytes: u64, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut v = Vec::with_capacity(REPETITIONS);
    for _ in 0..REPETITIONS {
        let t = Instant::now();
        f()?;
        v.push(bytes as f64 / t.elapsed().as_secs_f64().max(1e-9) / 1e9);
    }
    Ok(median(v))
}

/// Device memory read by the one-token f16 matmul, GB/s.
pub fn device_read_gbps(dev: &Device, overrides: &KernelOverrides) -> Result<f64> {
    let cols = 4096usize;
    let rows = (READ_BYTES / (cols as u64 * 2)) as usize;
    let data: Vec<f16> = (0..rows * cols)
        .map(|i| f16::from_f32(((i % 17) as f32 - 8.0) * 1e-3))
        .collect();
    let m = F16Matrix::upload(dev, "bandwidth_matrix", rows, cols, &data)?;
    drop(data);
    let plan = KernelPlan::decide(dev.info(), overrides)?;
    // Window-capable like the activations a decode step reads.
    let x = dev.alloc(
        "bandwidth_x",
        (cols * 4 + crate::backend::params::UNIFORM_WINDOW_BYTES) as u64,
        Usage::Window,
    )?;
    dev.write(&x, 0, bytemuck::cast_slice(&vec![1.0f32; cols]))?;
    let out = dev.alloc("bandwidth_out", rows as u64 * 4, Usage::Storage)?;
    let dummy = dev.alloc("bandwidth_dummy", 16, Usage::Storage)?;
    let step = dev.step_buffer(0, 1)?;
    let env = OpEnv {
        plan: &plan,
        chunk: 1,
        dummy: &dummy,
    };
    let mut prog = Program::default();
    matmul(&mut prog, &env, &m, &x, None, &out, rows, 0);
    let p = dev.prepare(prog, &step)?;
    let work: Vec<Work> = (0..READ_RUNS)
        .map(|_| Work::Run {
            program: &p,
            tokens: 1,
            pos0: crate::backend::LONGEST,
        })
        .collect();
    let bytes = m.chunks.iter().map(|c| c.buffer.size()).sum::<u64>() * READ_RUNS as u64;
    rate(bytes, || {
        dev.submit(&work)?;
        dev.sync()
    })
}

/// Host to device through a mapped staging buffer and a copy, and through the queue's
/// write: GB/s each.
pub fn h2d_gbps(dev: &Device) -> Result<(f64, f64)> {
    let data: Vec<u8> = (0..H2D_BYTES).map(|i| (i % 251) as u8).collect();
    let dst = dev.alloc("bandwidth_dst", H2D_BYTES, Usage::Storage)?;
    let staging = dev.staging(H2D_BYTES)?;
    let staged = rate(H2D_BYTES, || {
        dev.fill_staging(&staging, &data)?;
        let s = dev.submit(&[Work::Upload {
            staging: &staging,
            dst: &dst,
            dst_offset: 0,
            bytes: H2D_BYTES,
        }])?;
        dev.wait(s.token)
    })?;
    let written = rate(H2D_BYTES, || {
        dev.write(&dst, 0, &data)?;
        dev.sync()
    })?;
    Ok((staged, written))
}

/// The CPU expert kernel's packed-weight read rate, GB/s, with its threads and ISA.
pub fn cpu_expert_gbps(threads: Option<usize>) -> Result<(f64, usize, &'static str)> {
    let layout = crate::blocks::quant::Q4SlotLayout::new(2048, 1024);
    let cpu = CpuExperts::new(threads)?;
    // Zero weights and scales: the kernel's work does not depend on the values. Written,
    // so every page is resident before timing.
    let slots: Vec<Vec<u8>> = (0..CPU_POOL).map(|_| vec![0u8; layout.bytes]).collect();
    let expert = |e: u32| -> Result<&[u8]> {
        slots
            .get(e as usize)
            .map(|v| v.as_slice())
            .ok_or_else(|| crate::error::Error::Other(format!("internal: expert {e}")))
    };
    let x = vec![0.01f32; layout.hidden];
    let mut out = vec![0.0f32; layout.hidden];
    let bytes = (CPU_EXPERTS * layout.bytes) as u64;
    let mut call = 0usize;
    let gbps = rate(bytes, || {
        // The next CPU_EXPERTS of the pool: never the experts the last calls read.
        let first = (call * CPU_EXPERTS) % CPU_POOL;
        call += 1;
        let pairs: Vec<ExpertPair> = (0..CPU_EXPERTS)
            .map(|i| ExpertPair {
                token: 0,
                expert: ((first + i) % CPU_POOL) as u32,
                weight: 0.125,
            })
            .collect();
        cpu.run(&layout, &expert, &x, &pairs, &mut out).map(|_| ())
    })?;
    Ok((gbps, cpu.threads(), cpu.isa()))
}

/// Seconds of one sync point of a segmented step: submit a 64-byte copy into a readback
/// buffer and map it (median of [`ROUND_TRIPS`] after one untimed).
pub fn round_trip_s(dev: &Device) -> Result<f64> {
    let src = dev.alloc("round_trip_src", 64, Usage::Storage)?;
    let dst = dev.alloc("round_trip_dst", 64, Usage::Readback)?;
    let once = || -> Result<()> {
        dev.submit(&[Work::Copy {
            src: &src,
            src_offset: 0,
            dst: &dst,
            dst_offset: 0,
            bytes: 64,
        }])?;
        dev.map_read(&dst, 64).map(|_| ())
    };
    once()?;
    let mut v = Vec::with_capacity(ROUND_TRIPS);
    for _ in 0..ROUND_TRIPS {
        let t = Instant::now();
        once()?;
        v.push(t.elapsed().as_secs_f64());
    }
    Ok(median(v))
}

/// Seconds one dependent dispatch adds to a chain: [`CHAIN`] one-token matmuls of a 64 x 64
/// f16 matrix ping-ponging between two vectors (each reads what the last wrote), one
/// submission, against the same with one matmul; (t_chain - t_one) / (CHAIN - 1), each the
/// median of [`ROUND_TRIPS`] after one untimed.
pub fn dispatch_latency_s(dev: &Device, overrides: &KernelOverrides) -> Result<f64> {
    let n = 64usize;
    let data: Vec<f16> = (0..n * n)
        .map(|i| f16::from_f32(if i % (n + 1) == 0 { 1.0 } else { 0.0 }))
        .collect();
    let m = F16Matrix::upload(dev, "latency_matrix", n, n, &data)?;
    let plan = KernelPlan::decide(dev.info(), overrides)?;
    let vec = |label: &str| {
        dev.alloc(
            label,
            (n * 4 + crate::backend::params::UNIFORM_WINDOW_BYTES) as u64,
            Usage::Window,
        )
    };
    let (a, b) = (vec("latency_a")?, vec("latency_b")?);
    dev.write(&a, 0, bytemuck::cast_slice(&vec![1.0f32; n]))?;
    let dummy = dev.alloc("latency_dummy", 16, Usage::Storage)?;
    let step = dev.step_buffer(0, 1)?;
    let env = OpEnv {
        plan: &plan,
        chunk: 1,
        dummy: &dummy,
    };
    let chain = |len: usize| -> Result<crate::backend::Prepared> {
        let mut prog = Program::default();
        for i in 0..len {
            let (x, out) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
            matmul(&mut prog, &env, &m, x, None, out, n, 0);
        }
        dev.prepare(prog, &step)
    };
    let time = |p: &crate::backend::Prepared| -> Result<f64> {
        let once = || -> Result<()> {
            dev.submit(&[Work::Run {
                program: p,
                tokens: 1,
                pos0: crate::backend::LONGEST,
            }])?;
            dev.sync()
        };
        once()?;
        let mut v = Vec::with_capacity(ROUND_TRIPS);
        for _ in 0..ROUND_TRIPS {
            let t = Instant::now();
            once()?;
            v.push(t.elapsed().as_secs_f64());
        }
        Ok(median(v))
    };
    let (one, long) = (chain(1)?, chain(CHAIN)?);
    let t1 = time(&one)?;
    let tn = time(&long)?;
    Ok(((tn - t1) / (CHAIN - 1) as f64).max(0.0))
}

/// Every measurement on `dev` (and this machine's CPU), as the bandwidth file stores them.
pub fn measure(dev: &Device, overrides: &KernelOverrides, date_utc: String) -> Result<Measured> {
    let read = device_read_gbps(dev, overrides)?;
    let (h2d, write) = h2d_gbps(dev)?;
    let (cpu, cpu_threads, cpu_isa) = cpu_expert_gbps(None)?;
    let round_trip = round_trip_s(dev)?;
    let latency = dispatch_latency_s(dev, overrides)?;
    let info = dev.info();
    Ok(Measured {
        adapter: info.name.clone(),
        backend: info.backend.clone(),
        driver: info.driver_string(),
        device_type: format!("{:?}", info.device_type),
        device_read_gbps: read,
        h2d_gbps: h2d,
        write_buffer_gbps: write,
        cpu_expert_gbps: Some(cpu),
        cpu_threads: Some(cpu_threads),
        cpu_isa: Some(cpu_isa.to_string()),
        round_trip_us: Some(round_trip * 1e6),
        round_trip_s: Some(round_trip),
        dispatch_latency_s: Some(latency),
        read_bytes: READ_BYTES,
        h2d_bytes: H2D_BYTES,
        repetitions: REPETITIONS,
        date_utc,
    })
}

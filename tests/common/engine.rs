//! Engines on the fixtures and greedy decoding through `generate`, for the GPU tests.

use wgmoe::backend::{DeviceRequest, KernelOverrides};
use wgmoe::model::Executor;
use wgmoe::runtime::engine::{Engine, EngineOptions, ExpertPrecision, ResidencyOptions};
use wgmoe::runtime::generate::{generate, GenerateOptions};
use wgmoe::runtime::sampling::SamplingOptions;

use super::{fixture, init_env};

pub fn load(
    name: &str,
    max_context: usize,
    residency: ResidencyOptions,
    executor: Executor,
) -> wgmoe::Result<Engine> {
    load_on(
        name,
        max_context,
        residency,
        executor,
        KernelOverrides::default(),
    )
}

pub fn load_on(
    name: &str,
    max_context: usize,
    residency: ResidencyOptions,
    executor: Executor,
    kernels: KernelOverrides,
) -> wgmoe::Result<Engine> {
    load_batched(name, max_context, residency, executor, kernels, 1)
}

/// `load_on` with batched steps of up to `batch` sequences (`serve --parallel`).
pub fn load_batched(
    name: &str,
    max_context: usize,
    residency: ResidencyOptions,
    executor: Executor,
    kernels: KernelOverrides,
    batch: usize,
) -> wgmoe::Result<Engine> {
    init_env();
    Engine::load(
        &fixture(name),
        &EngineOptions {
            residency,
            adapter: DeviceRequest {
                backend: super::test_backend(),
                ..Default::default()
            },
            kernels,
            expert_precision: ExpertPrecision::Int4,
            dense_precision: wgmoe::runtime::engine::DensePrecision::F16,
            kv_precision: wgmoe::runtime::engine::KvPrecision::F32,
            executor,
            max_context,
            prefill_chunk: 64,
            all_logits: false,
            score_rows: 0,
            batch,
        },
    )
}

pub fn greedy(e: &mut Engine, prompt: &[u32], n: usize) -> wgmoe::Result<Vec<u32>> {
    let g = generate(
        &mut e.fwd,
        prompt,
        &GenerateOptions {
            max_new_tokens: n,
            sampling: SamplingOptions::greedy(),
            eos_ids: vec![],
            ignore_eos: true,
            record_logits: false,
            pipeline_depth: wgmoe::runtime::generate::DEFAULT_PIPELINE_DEPTH,
        },
        &mut |_| Ok(()),
    )?;
    Ok(g.generated_ids)
}

/// Residency options of the classic path: every miss uploaded (the tests of the cache
/// itself; `--miss-policy` defaults to auto below full residency).
pub fn upload() -> ResidencyOptions {
    ResidencyOptions {
        miss_policy: Some(wgmoe::residency::MissPolicy::Upload),
        ..Default::default()
    }
}

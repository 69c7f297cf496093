//! `wgmoe bench`.

use std::io::Write;

use wgmoe::bench::BenchRecord;
use wgmoe::error::{Error, Result};

use super::{check_output_file, write_atomic};
use crate::{stdout_error, BenchArgs};

pub fn bench(a: BenchArgs) -> Result<()> {
    // Every output path and option is checked before the first measurement (the sweep
    // itself checks every configuration against the model before measuring any).
    if let Some(p) = &a.json_out {
        check_output_file("--json-out", p)?;
    }
    if let Some(p) = &a.plot {
        wgmoe::format::render::format_of("--plot", p)?;
        check_output_file("--plot", p)?;
    }
    if let Some(p) = &a.trace {
        check_output_file("--trace", p)?;
    }
    if let Some(f) = &a.tokenizer {
        // Checked (and its ids against the vocabulary) before anything is measured.
        super::open_host(&a.model, Some(f))?;
    }
    let opts = wgmoe::bench::BenchOptions {
        model: a.model.clone(),
        tokenizer: a.tokenizer.clone(),
        prompts: a.prompts,
        blocks: a.blocks,
        new_tokens: a.max_new_tokens,
        warmup: a.warmup,
        executors: a.executor.clone(),
        expert_precisions: a.expert_precision.clone(),
        dense_precisions: a.dense_precision.clone(),
        kv_precisions: a.kv_precision.clone(),
        prefill_chunk: a.prefill_chunk,
        adapter: a.gpu.request()?,
        kernels: a.gpu.kernels(),
        resident_experts: if a.cpu_experts {
            vec![Some(0)]
        } else {
            a.resident_experts.iter().map(|&n| Some(n)).collect()
        },
        vram_budget: a.vram_budget,
        cache_policies: a
            .cache_policy
            .iter()
            .map(|p| {
                p.parse().map_err(|e: wgmoe::residency::ConfigError| {
                    Error::option("--cache-policy", e.0)
                })
            })
            .collect::<Result<Vec<_>>>()?,
        decay: a.decay,
        profile: a.profile.clone(),
        staging_buffers: super::residency_args::staging_buffers(a.staging_buffers)?,
        miss_policies: a.miss_policy.clone(),
        n_cpu_moe: a.n_cpu_moe,
        cpu_threads: a.cpu_threads,
        prefetches: a.prefetch.clone(),
        fill_threads: a.fill_threads.clone(),
        prefetch_width: a.prefetch_width,
        trace: a.trace.clone(),
        profile_kernels: a.profile_kernels,
        pipeline_depths: if a.pipeline_depths.is_empty() {
            vec![a.gpu.pipeline_depth]
        } else {
            a.pipeline_depths.clone()
        },
    };
    let write = |records: &[BenchRecord]| -> Result<()> {
        if let Some(path) = &a.json_out {
            let text =
                serde_json::to_string_pretty(records).map_err(|e| Error::Other(e.to_string()))?;
            write_atomic(path, (text + "\n").as_bytes())?;
        }
        if let Some(path) = &a.plot {
            let svg = wgmoe::bench::plot_svg(records);
            write_atomic(
                path,
                &wgmoe::format::render::image_bytes("--plot", path, &svg)?,
            )?;
        }
        Ok(())
    };
    // Ctrl-C ends the sweep after the response being measured: the finished
    // configurations are printed and kept (exit status 130).
    wgmoe::interrupt::install()?;
    let mut done: Vec<BenchRecord> = Vec::new();
    let mut write_err = None;
    let mut noted = false;
    let result = wgmoe::bench::run_bench(&opts, &mut |r| {
        if !noted && r.adapter_type == "Cpu" && a.gpu.adapter.is_none() {
            eprintln!("{}", super::software_line(&r.adapter));
            noted = true;
        }
        eprintln!(
            "{}: decode {:.2} tok/s, TTFT {:.3}s, prefill {:.1} tok/s",
            wgmoe::bench::config_label(r),
            r.decode_tokens_per_s,
            r.ttft_s_mean,
            r.prefill_tokens_per_s
        );
        done.push(r.clone());
        // Keep what is measured if a later configuration fails.
        if let Err(e) = write(&done) {
            write_err.get_or_insert(e);
        }
    });
    let records = match result {
        Ok(r) => r,
        Err(e) => {
            // The table of the configurations that finished, where they were written, then
            // the error.
            let why = match e {
                Error::Interrupted => "Ctrl-C",
                _ => "this error",
            };
            if done.is_empty() {
                eprintln!("no configuration finished before {why}: nothing was written");
            } else {
                out!("{}", wgmoe::bench::table(&done).trim_end());
                let files: Vec<String> = [&a.json_out, &a.plot]
                    .into_iter()
                    .flatten()
                    .map(|p| p.display().to_string())
                    .collect();
                eprintln!(
                    "{} finished before {why}; {} above{}",
                    wgmoe::units::count(done.len(), "configuration"),
                    if done.len() == 1 {
                        "its record is"
                    } else {
                        "their records are"
                    },
                    if files.is_empty() {
                        String::new()
                    } else {
                        format!(" and in {}", files.join(" and "))
                    }
                );
            }
            return Err(e);
        }
    };
    if let Some(e) = write_err {
        return Err(e);
    }
    write(&records)?;
    out!("{}", wgmoe::bench::table(&records).trim_end());
    if let Some(p) = &a.json_out {
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &a.plot {
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &a.trace {
        for i in 0..records.len() {
            let path = wgmoe::bench::trace_path(p, i, records.len());
            eprintln!("wrote routing trace {}", path.display());
        }
    }
    Ok(())
}

//! `wgmoe plan`.

use std::path::{Path, PathBuf};

use wgmoe::config::ModelConfig;
use wgmoe::error::{Error, Result};
use wgmoe::format::bandwidth::{store_path, Store};
use wgmoe::planner::{plan as make_plan, render, Bandwidths, PlanOptions};
use wgmoe::runtime::engine::ExpertPrecision;

use crate::{KernelsArgs, PlanArgs};

/// The config.json of a model directory or the file itself, and the directory `run` takes.
fn config_path(model: &Path) -> Result<(PathBuf, PathBuf)> {
    match std::fs::metadata(model) {
        Err(e) => Err(Error::io(model, e)),
        Ok(m) if m.is_dir() => {
            let c = model.join("config.json");
            if !c.is_file() {
                return Err(Error::bad_file(
                    model,
                    "holds no config.json: give a model directory or a config.json file",
                ));
            }
            Ok((c, model.to_path_buf()))
        }
        Ok(_) => {
            let dir = match model.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            // A config.json beside its weights is a model directory; a config alone is not.
            let weights = model.file_name().is_some_and(|n| n == "config.json")
                && std::fs::read_dir(&dir).is_ok_and(|mut d| {
                    d.any(|e| {
                        e.is_ok_and(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
                    })
                });
            let dir = if weights {
                dir
            } else {
                PathBuf::from("MODEL_DIR")
            };
            Ok((model.to_path_buf(), dir))
        }
    }
}

/// The model's config and the path `run` takes: a GGUF's from its header (metadata and
/// tensor infos; a header-only file is enough), else a config.json's.
pub(crate) fn model_config(model: &Path) -> Result<(ModelConfig, PathBuf)> {
    if wgmoe::gguf::is_gguf_path(model) {
        let gguf = wgmoe::gguf::GgufModel::open_header(model)?;
        return Ok((wgmoe::gguf::model_config(&gguf)?, model.to_path_buf()));
    }
    let (config, dir) = config_path(model)?;
    let text = std::fs::read_to_string(&config).map_err(|e| Error::io(&config, e))?;
    Ok((ModelConfig::from_json(&text, &config)?, dir))
}

/// This machine's memory (Linux: MemTotal).
fn mem_total() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn check_gbps(option: &str, v: Option<f64>) -> Result<Option<f64>> {
    match v {
        Some(x) if !(x.is_finite() && x > 0.0) => Err(Error::option(
            option,
            format!("{x} is not a bandwidth in GB/s (> 0)"),
        )),
        other => Ok(other),
    }
}

/// The bandwidths of the prediction: the options, else the stored measurements, and
/// which of them each figure is.
/// `--adapter INDEX|NAME` as the name stored measurements are looked up by: an index (as
/// `wgmoe devices` numbers the adapters, and as `run --adapter` takes it) becomes that
/// adapter's name; a name is taken as it is (the stored entry need not be on this machine).
fn stored_adapter_name(given: Option<&str>) -> Result<Option<String>> {
    let Some(g) = given else { return Ok(None) };
    if g.trim().parse::<usize>().is_err() {
        return Ok(Some(g.to_string()));
    }
    let req = super::adapter_request(wgmoe::backend::DeviceRequest {
        adapter: Some(g.to_string()),
        ..Default::default()
    })?;
    Ok(req.adapter)
}

fn bandwidths(a: &PlanArgs) -> Result<Option<Bandwidths>> {
    let dev = check_gbps("--device-gbps", a.device_gbps)?;
    let h2d = check_gbps("--h2d-gbps", a.h2d_gbps)?;
    let cpu = check_gbps("--cpu-gbps", a.cpu_gbps)?;
    let round_trip = match a.round_trip_us {
        Some(x) if !(x.is_finite() && x >= 0.0) => {
            return Err(Error::option(
                "--round-trip-us",
                format!("{x} is not a time in microseconds (>= 0)"),
            ))
        }
        other => other.map(|us| us * 1e-6),
    };
    if let (Some(d), Some(h)) = (dev, h2d) {
        return Ok(Some(Bandwidths {
            device_read_gbps: d,
            h2d_gbps: h,
            cpu_expert_gbps: cpu,
            round_trip_s: round_trip,
            source: format!(
                "given as --device-gbps and --h2d-gbps{}",
                if cpu.is_some() { " and --cpu-gbps" } else { "" }
            ),
            software_adapter: false,
        }));
    }
    let Some(path) = store_path() else {
        return Ok(None);
    };
    let store = Store::load(&path)?;
    let wanted = stored_adapter_name(a.adapter.as_deref())?;
    let Some((m, why)) = store.pick(wanted.as_deref()) else {
        if let Some(ad) = &wanted {
            if !store.entries.is_empty() {
                return Err(Error::option(
                    "--adapter",
                    format!("no adapter measured in {} matches `{ad}`", path.display()),
                ));
            }
        }
        return Ok(None);
    };
    let measured = format!(
        "measured by `wgmoe devices --measure` on {} ({}, {}) at {}; {why}; {}",
        m.adapter,
        m.backend,
        m.driver,
        m.date_utc,
        path.display()
    );
    let source = match (dev, h2d) {
        (Some(_), None) => format!("device read from --device-gbps; host->device {measured}"),
        (None, Some(_)) => format!("host->device from --h2d-gbps; device read {measured}"),
        _ => measured,
    };
    let source = if cpu.is_some() {
        format!("CPU experts from --cpu-gbps; {source}")
    } else {
        source
    };
    Ok(Some(Bandwidths {
        device_read_gbps: dev.unwrap_or(m.device_read_gbps),
        h2d_gbps: h2d.unwrap_or(m.h2d_gbps),
        cpu_expert_gbps: cpu.or(m.cpu_expert_gbps),
        round_trip_s: round_trip.or(m.round_trip_us.map(|us| us * 1e-6)),
        source,
        software_adapter: m.device_type == "Cpu",
    }))
}

pub fn plan(a: PlanArgs) -> Result<()> {
    let (cfg, dir) = model_config(&a.model)?;
    let strict = match a.expert_precision {
        ExpertPrecision::F16 => {
            return Err(Error::option(
                "--expert-precision",
                "f16: plan counts INT4 experts (partial residency needs them); the f16 bytes are in its table for comparison",
            ))
        }
        p => a.int4_strict || p == ExpertPrecision::Int4Strict,
    };
    let cfg = if strict {
        wgmoe::runtime::engine::ExpertPrecision::Int4Strict.apply(cfg)
    } else {
        cfg
    };
    let ram = match a.ram {
        Some(r) => Some((r, "--ram".to_string())),
        None => mem_total().map(|r| (r, "this machine's MemTotal".to_string())),
    };
    // The residency options `run` would take with these flags: prefetch and staging
    // resolve as they do there.
    let res = wgmoe::runtime::engine::ResidencyOptions {
        miss_policy: Some(a.miss_policy),
        staging_buffers: super::residency_args::staging_buffers(a.staging_buffers)?,
        prefetch: a.prefetch,
        prefetch_width: a.prefetch_width,
        ..Default::default()
    };
    let prefetch_accuracy = match &a.prefetch_trace {
        Some(p) => {
            let t = wgmoe::format::trace::read_trace(p)?;
            let acc = t.prediction_accuracy().ok_or_else(|| {
                Error::option(
                    "--prefetch-trace",
                    format!(
                        "{} records no guesses (traces of decode steps from a wgmoe that guesses the next layer's experts do)",
                        p.display()
                    ),
                )
            })?;
            Some((acc, format!("measured in {}", p.display())))
        }
        None => None,
    };
    let report = make_plan(
        &cfg,
        &PlanOptions {
            model: a.model.display().to_string(),
            model_dir: dir.display().to_string(),
            vram: a.vram,
            context: a
                .context
                .unwrap_or(cfg.max_position_embeddings.min(super::DEFAULT_CTX)),
            prefill_chunk: a.prefill_chunk,
            staging_buffers: res.staging_buffers(&cfg)?,
            ram,
            gpu_memory: a.gpu_memory,
            bandwidths: bandwidths(&a)?,
            hit_rate: a.hit_rate,
            miss_policy: a.miss_policy,
            prefetch_width: res.prefetch_width(&cfg)?,
            prefetch_accuracy,
            dense: a.dense_precision.format(),
            kv: a.kv_precision.format(),
        },
    )?;
    super::print_report(a.json, &report, render)?;
    // A header-only GGUF (an interrupted download) plans as its header says, but cannot
    // run: say so after the "Run it" line (issue 39, friction), as `inspect` does.
    if wgmoe::gguf::is_gguf_path(&a.model) {
        if let Err(e) = wgmoe::gguf::GgufModel::open(&a.model) {
            eprintln!(
                "warning: the plan is of the file's header; the file cannot run as it is: {e}"
            );
        }
    }
    Ok(())
}

/// `wgmoe kernels`.
pub fn kernels(a: KernelsArgs) -> Result<()> {
    use wgmoe::insight::kernel_report::{render, report_with_progress, KernelsOptions};
    let (cfg, _) = model_config(&a.model)?;
    // lavapipe with 32-lane subgroups: a warp's width, so its sector counts are a GPU's.
    // Set before any Vulkan instance exists (it configures llvmpipe only).
    std::env::set_var("LP_NATIVE_VECTOR_WIDTH", "1024");
    let t0 = std::time::Instant::now();
    let r = report_with_progress(
        &a.model.display().to_string(),
        &cfg,
        &KernelsOptions {
            class: a.device_class,
            stages: a.stages,
            context: a.context,
            prefill_chunk: a.prefill_chunk,
            bandwidth_gbps: a.bandwidth,
            overrides: wgmoe::backend::KernelOverrides {
                portable: a.portable_kernels,
                decode: a.decode_kernels,
                prefill: a.prefill_kernels,
                f16_arithmetic: None,
            },
            int4: !(a.f16_experts || a.expert_precision == ExpertPrecision::F16),
            dense: a.dense_precision.format(),
            latency: wgmoe::insight::kernel_report::LatencyModel {
                dispatch_latency_s: finite_us("--dispatch-latency-us", a.dispatch_latency_us)?,
                round_trip_s: finite_us("--round-trip-us", a.round_trip_us)?,
                pipeline_depth: a.pipeline_depth,
            },
            kv: a.kv_precision.format(),
        },
        // Minutes on a software adapter: say what is running (stderr, so --json stays clean).
        &mut |m| eprintln!("kernels: {m} ({:.1} s)", t0.elapsed().as_secs_f64()),
    )?;
    super::print_report(a.json, &r, render)
}

/// Microseconds of an option as seconds (finite, not negative).
fn finite_us(option: &str, us: f64) -> Result<f64> {
    if us.is_finite() && us >= 0.0 {
        Ok(us * 1e-6)
    } else {
        Err(Error::option(
            option,
            format!("{us} is not a time in microseconds (0 or more)"),
        ))
    }
}

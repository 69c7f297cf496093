//! `wgmoe run`.

use std::io::Write;

use serde_json::json;

use wgmoe::error::{Error, Result};
use wgmoe::runtime::engine::{Engine, EngineOptions};
use wgmoe::runtime::generate::{generate, GenerateOptions};
use wgmoe::runtime::sampling::SamplingOptions;
use wgmoe::session::chat::{chat_prompt, Message, Role};
use wgmoe::tokenizer::TextStream;

use super::{peak_rss_bytes, prompt_text, software_note};
use crate::{stdout_error, RunArgs, SamplingArgs};

/// The sampling of `--greedy`/`--temperature`/`--top-k`/`--top-p`, with
/// generation_config.json's temperature when sampling without `--temperature`.
pub fn sampling_options(
    a: &SamplingArgs,
    gen: Option<&wgmoe::config::GenerationConfig>,
    seed: u64,
) -> Result<SamplingOptions> {
    let sampled = a.temperature.is_some() || a.top_k.is_some() || a.top_p.is_some();
    if a.greedy && sampled {
        return Err(Error::option(
            "--greedy",
            "conflicts with --temperature/--top-k/--top-p",
        ));
    }
    if !sampled {
        return Ok(SamplingOptions {
            seed,
            ..SamplingOptions::greedy()
        });
    }
    let temperature = a
        .temperature
        .or(gen.and_then(|g| g.temperature))
        .unwrap_or(1.0);
    if !(temperature >= 0.0 && temperature.is_finite()) {
        return Err(Error::option(
            "--temperature",
            format!("{temperature} is not a finite value >= 0"),
        ));
    }
    let top_p = a.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(Error::option(
            "--top-p",
            format!("{top_p} is not in (0, 1]"),
        ));
    }
    Ok(SamplingOptions {
        temperature,
        top_k: a.top_k.unwrap_or(0),
        top_p,
        seed,
    })
}

/// The live grid of `--live`, when stdout is a terminal (and not `--json`).
fn live_view(a: &RunArgs, engine: &Engine) -> Option<wgmoe::insight::live::LiveView> {
    use std::io::IsTerminal;
    if !a.live {
        return None;
    }
    if a.json || !std::io::stdout().is_terminal() {
        eprintln!(
            "note: --live is off: {}",
            if a.json {
                "--json prints one object"
            } else {
                "stdout is not a terminal"
            }
        );
        return None;
    }
    let cfg = &engine.cfg;
    let partial = engine.resident_experts < cfg.num_experts;
    let layers = (0..cfg.num_layers)
        .filter(|&l| cfg.sparse_layers[l])
        .collect();
    let mut grid = wgmoe::format::trace::Grid::new(layers, cfg.num_experts, partial);
    grid.set_host_layers(&engine.cpu_layers());
    let title = format!(
        "wgmoe live: {} ({} of {} expert slots per layer{})",
        a.model.display(),
        engine.resident_experts,
        cfg.num_experts,
        if partial {
            format!(", {}", a.residency.policy_name())
        } else {
            String::new()
        }
    );
    Some(wgmoe::insight::live::LiveView::new(grid, title))
}

pub fn run(a: RunArgs) -> Result<()> {
    let (cfg, gen, mut tok) = super::open_host(&a.model, a.tokenizer.as_deref())?;
    let seed = a.sampling.seed.unwrap_or_else(super::random_seed);
    let sampling = sampling_options(&a.sampling, gen.as_ref(), seed)?;
    let text = prompt_text(a.prompt.as_deref(), a.file.as_deref())?;
    let prompt_ids: Vec<u32> = match (&text, &a.prompt_ids) {
        (_, Some(ids)) => ids.clone(),
        (Some(text), None) => {
            let tok = tok.as_mut().ok_or_else(|| {
                Error::bad_file(
                    a.model.join("tokenizer.json"),
                    "missing: needed to encode --prompt (or pass --prompt-ids)",
                )
            })?;
            if a.chat {
                if let Some(n) =
                    wgmoe::session::template::choose(tok, a.chat_template.as_deref(), &a.model)?
                {
                    eprintln!("{n}");
                }
                let user = Message::new(Role::User, text.clone());
                chat_prompt(tok, &[user])?
            } else {
                tok.encode(text, true)?
            }
        }
        (None, None) => {
            return Err(Error::option(
                "--prompt",
                "give a prompt with -p TEXT, -p - (stdin), -f FILE or --prompt-ids 1,2,3",
            ))
        }
    };
    if prompt_ids.is_empty() {
        return Err(Error::option("--prompt", "the prompt encodes to no tokens"));
    }
    if let Some(&bad) = prompt_ids.iter().find(|&&t| t as usize >= cfg.vocab_size) {
        return Err(Error::option(
            "--prompt-ids",
            format!(
                "token id {bad} is outside the vocabulary (vocab_size {})",
                cfg.vocab_size
            ),
        ));
    }
    if prompt_ids.len() > cfg.max_position_embeddings {
        return Err(Error::option(
            if a.prompt_ids.is_some() {
                "--prompt-ids"
            } else {
                "--prompt"
            },
            format!(
                "{} prompt tokens exceed max_position_embeddings = {} of {}",
                prompt_ids.len(),
                cfg.max_position_embeddings,
                a.model.join("config.json").display()
            ),
        ));
    }
    if a.prefill_chunk == 0 {
        return Err(Error::option("--prefill-chunk", "must be at least 1"));
    }
    // The KV cache: --ctx-size positions, else what the prompt and -n need (saturating:
    // `-n 18446744073709551615` means "as many as fit"), at most max_position_embeddings.
    let given_ctx = super::given_ctx_size(a.ctx_size, &cfg, &a.model)?;
    if let Some(ctx) = given_ctx {
        if prompt_ids.len() > ctx {
            return Err(Error::option(
                "--ctx-size",
                format!(
                    "{} prompt tokens do not fit in a context of {ctx} positions",
                    prompt_ids.len()
                ),
            ));
        }
    }
    let limit = given_ctx.unwrap_or(cfg.max_position_embeddings);
    let max_context = prompt_ids.len().saturating_add(a.max_new_tokens).min(limit);
    let max_new = max_context - prompt_ids.len();
    if max_new < a.max_new_tokens {
        match given_ctx {
            Some(ctx) => {
                eprintln!("note: generating at most {max_new} tokens: --ctx-size is {ctx}")
            }
            None => eprintln!(
                "note: generating at most {max_new} tokens: max_position_embeddings is {}",
                cfg.max_position_embeddings
            ),
        }
    }
    if let Some(p) = &a.write_profile {
        super::check_output_file("--write-profile", p)?;
    }
    if let Some(p) = &a.trace {
        super::check_output_file("--trace", p)?;
    }
    let adapter = a.gpu.request()?;
    let mut residency = a.residency.options()?;
    residency.record_profile = a.write_profile.is_some();
    // With --tokenizer, the engine takes that tokenizer instead of building the model's.
    let given = if a.tokenizer.is_some() {
        tok.take()
    } else {
        None
    };
    let mut engine = Engine::load_with(
        &a.model,
        &EngineOptions {
            residency,
            adapter: adapter.clone(),
            kernels: a.gpu.kernels(),
            expert_precision: a.expert_precision,
            dense_precision: a.dense_precision,
            kv_precision: a.kv_precision,
            executor: a.executor,
            max_context,
            prefill_chunk: a.prefill_chunk,
            all_logits: false,
            score_rows: 0,
            batch: 1,
        },
        given,
    )?;
    eprintln!(
        "loaded {} in {:.2}s on {} ({}, {})",
        a.model.display(),
        engine.load_s,
        engine.dev.info().name,
        engine.dev.info().backend,
        engine.dev.info().driver_string()
    );
    software_note(&engine.dev, &adapter);
    super::gguf_note(&a.model, a.expert_precision, a.dense_precision);
    for n in a
        .residency
        .unused_notes(engine.resident_experts, cfg.num_experts)
    {
        eprintln!("note: {n}");
    }
    let live = live_view(&a, &engine);
    if a.trace.is_some() || live.is_some() {
        engine.start_trace(
            a.trace.as_deref(),
            a.residency.policy_name(),
            a.residency.decay_value(),
            live.iter().map(|v| v.sink()).collect(),
        )?;
    }
    if a.profile_kernels {
        if engine.fwd.residency.is_some() || engine.fwd.trace.is_some() {
            return Err(Error::option(
                "--profile-kernels",
                "profiles steps with every expert resident and no routing trace (partial residency and --trace/--live submit a step per layer)",
            ));
        }
        engine.fwd.kernel_profile = Some(Default::default());
    }
    let opts = GenerateOptions {
        max_new_tokens: max_new,
        sampling,
        eos_ids: engine.eos_ids(),
        ignore_eos: a.ignore_eos,
        record_logits: false,
        pipeline_depth: a.gpu.pipeline_depth,
    };
    let mut stream = TextStream::new();
    let stdout = std::io::stdout();
    let json_mode = a.json;
    let tokr = tok.take().or_else(|| engine.tokenizer.take());
    let tokr = tokr.as_ref();
    let mut on_token = |id: u32| -> Result<()> {
        if json_mode {
            return Ok(());
        }
        if let Some(v) = &live {
            let s = match tokr {
                Some(t) => stream.push(t, id)?,
                None => format!("{id} "),
            };
            return v.push_text(&s);
        }
        let mut out = stdout.lock();
        match tokr {
            Some(t) => {
                let s = stream.push(t, id)?;
                out.write_all(s.as_bytes())
                    .and_then(|_| out.flush())
                    .map_err(stdout_error)?;
            }
            None => writeln!(out, "{id}").map_err(stdout_error)?,
        }
        Ok(())
    };
    // From here on, Ctrl-C stops generating: what was generated is printed with the
    // summary, and the exit status is 130.
    wgmoe::interrupt::install()?;
    let g = if max_new == 0 {
        wgmoe::runtime::generate::prefill_only(&mut engine.fwd, &prompt_ids)?
    } else {
        generate(&mut engine.fwd, &prompt_ids, &opts, &mut on_token)?
    };
    let text = match tokr {
        Some(t) => t.decode(&g.generated_ids)?,
        None => String::new(),
    };
    let n = g.generated_ids.len().max(1) as f64;
    let (rs, host_sum) = match engine.fwd.residency.as_ref() {
        Some(r) => (r.stats(), Some(r.host.checksum()?)),
        None => (Default::default(), None),
    };
    engine.finish_trace()?;
    let profile = engine
        .fwd
        .kernel_profile
        .as_ref()
        .and_then(|p| wgmoe::insight::kernel_profile::report(p, g.decode_s, g.decode_encode_s));
    if let Some(p) = &a.trace {
        eprintln!("wrote routing trace {}", p.display());
    }
    if let (Some(path), Some(p)) = (&a.write_profile, engine.fwd.profile.as_ref()) {
        p.save(path)?;
        eprintln!("wrote expert profile {}", path.display());
    }
    if json_mode {
        let mut obj = json!({
            "model": a.model.display().to_string(),
            "prompt_ids": prompt_ids,
            "generated_ids": g.generated_ids,
            "text": text,
            "stopped_by_eos": g.stopped_by_eos,
            "interrupted": g.interrupted,
            "seed": seed,
            "metrics": {
                "ttft_s": g.ttft_s,
                "decode_tokens_per_s": g.decode_tokens_per_s(),
                "decode_s": g.decode_s,
                "prompt_tokens": prompt_ids.len(),
                "generated_tokens": g.generated_ids.len(),
                "prefill_tokens_per_s": prompt_ids.len() as f64 / g.prefill_s.max(1e-9),
                "load_s": engine.load_s,
                "adapter": engine.dev.info().name,
                "backend": engine.dev.info().backend,
                "driver": engine.dev.info().driver_string(),
                "expert_precision": a.expert_precision,
                "dense_precision": a.dense_precision,
                "executor": a.executor,
                // The most a decode step makes (attention split over the most keys), and
                // what the last decode step made at its position.
                "dispatches_per_decode_step": engine.fwd.dispatches_per_decode_step(wgmoe::backend::LONGEST),
                "dispatches_last_decode_step": engine.fwd.dispatches_per_decode_step(
                    (prompt_ids.len() + g.generated_ids.len()).saturating_sub(2) as u32,
                ),
                "encode_seconds_per_token": g.encode_seconds_per_token(),
                "submissions_per_token": g.submissions as f64 / n,
                "dispatches_per_token": g.dispatches as f64 / n,
                "peak_gpu_bytes": engine.dev.tracker().peak(),
                "peak_rss_bytes": peak_rss_bytes(),
                "resident_experts_per_layer": engine.resident_experts,
                "cache_policy": if engine.resident_experts < engine.cfg.num_experts { Some(a.residency.policy_name()) } else { None },
                "expert_hits": rs.expert_hits,
                "expert_misses": rs.expert_misses,
                "expert_evictions": rs.expert_evictions,
                "h2d_bytes": rs.h2d_bytes,
                "upload_seconds": rs.upload_seconds,
                "expert_hits_per_layer": rs.hits_per_layer,
                "expert_misses_per_layer": rs.misses_per_layer,
                "expert_evictions_per_layer": rs.evictions_per_layer,
                "host_source_checksum": host_sum.map(|h| format!("{h:016x}")),
            }
        });
        // Bytes a decode step reads at batch 1 at the context this run ended with, and the
        // rate it read them at.
        let positions = prompt_ids.len() + g.generated_ids.len();
        let bpt = wgmoe::planner::decode_bytes_per_token(
            &engine.cfg,
            a.dense_precision.format(),
            a.expert_precision.int4(),
            a.kv_precision.format(),
            positions,
        )?;
        obj["metrics"]["kv_precision"] = json!(a.kv_precision);
        obj["metrics"]["bytes_per_token"] = json!(bpt);
        obj["metrics"]["effective_gb_per_s"] = json!(bpt as f64 * g.decode_tokens_per_s() / 1e9);
        // CPU experts (the json! macro's recursion limit keeps them apart).
        obj["metrics"]["miss_policy"] =
            json!(engine.fwd.residency.as_ref().map(|_| rs.miss_policy));
        obj["metrics"]["cpu_expert_pairs"] = json!(rs.cpu_expert_pairs);
        obj["metrics"]["cpu_expert_seconds"] = json!(rs.cpu_expert_seconds);
        obj["metrics"]["uploaded_misses"] = json!(rs.uploaded_misses);
        obj["metrics"]["cpu_misses"] = json!(rs.cpu_misses);
        obj["metrics"]["cpu_threads"] = json!(rs.cpu_threads);
        obj["metrics"]["cpu_isa"] = json!(rs.cpu_isa);
        obj["metrics"]["cost_figures"] = json!(rs.cost_figures);
        obj["metrics"]["expert_placement"] = json!(engine.fwd.opts.placement);
        // Hiding the copies: overlapped fills and next-layer prefetch.
        let res = engine.fwd.residency.as_ref().map(|_| &rs);
        let m = &mut obj["metrics"];
        m["prefetch"] = json!(res.map(|r| r.prefetch));
        m["prefetch_width"] = json!(res.map(|r| r.prefetch_width));
        m["fill_threads"] = json!(res.map(|r| r.fill_threads));
        m["upload_stall_seconds"] = json!(res.map(|r| r.upload_stall_seconds));
        m["prefetch_issued"] = json!(res.map(|r| r.prefetch_issued));
        m["prefetch_used"] = json!(res.map(|r| r.prefetch_used));
        m["prefetch_wasted_bytes"] = json!(res.map(|r| r.prefetch_wasted_bytes));
        m["prefetch_accuracy"] = json!(rs.prefetch_accuracy);
        m["prefetch_issued_per_layer"] = json!(res.map(|r| &r.prefetch_issued_per_layer));
        m["prefetch_used_per_layer"] = json!(res.map(|r| &r.prefetch_used_per_layer));
        m["prefetch_wasted_bytes_per_layer"] =
            json!(res.map(|r| &r.prefetch_wasted_bytes_per_layer));
        m["prefetch_accuracy_per_layer"] = json!(res.map(|r| &r.prefetch_accuracy_per_layer));
        // The gate of --prefetch next-layer: layers held back at the end, guesses held back.
        m["prefetch_gated_layers"] = json!(res.map(|r| &r.prefetch_gated_layers));
        m["prefetch_held_back"] = json!(res.map(|r| r.prefetch_held_back));
        m["prefetch_break_even_per_layer"] = json!(res.map(|r| &r.prefetch_break_even_per_layer));
        // The pipelined loop: the depth it ran at, steps in flight, the host's waits.
        m["pipeline_depth"] = json!(g.pipeline_depth);
        m["decode_steps_in_flight_max"] = json!(g.decode_steps_in_flight_max);
        m["decode_host_wait_s"] = json!(g.decode_host_wait_s);
        m["decode_steps_discarded"] = json!(g.decode_steps_discarded);
        // Pipelines: compile time at load and the on-disk cache.
        let pr = engine.dev.pipeline_report();
        m["pipeline_compile_s"] = json!(pr.compile_s);
        m["pipeline_cache"] = json!(pr.cache);
        // --profile-kernels (null without it).
        let p = profile.as_ref();
        m["profile_clock"] = json!(p.map(|p| p.clock));
        m["profile"] = json!(p.map(|p| &p.profile));
        m["prefill_profile"] = json!(p.map(|p| &p.prefill_profile));
        m["gpu_s_per_token"] = json!(p.map(|p| p.gpu_s_per_token));
        m["gpu_busy_fraction"] = json!(p.and_then(|p| p.gpu_busy_fraction));
        m["host_s_per_token"] = json!(p.and_then(|p| p.host_s_per_token));
        out!("{obj}");
    } else if let Some(v) = &live {
        v.finish()?;
        out!("{text}");
    } else if max_new == 0 {
        eprintln!(
            "{} prefilled in {:.3}s ({:.1} tok/s); -n 0: no token generated",
            wgmoe::units::count(prompt_ids.len(), "prompt token"),
            g.prefill_s,
            prompt_ids.len() as f64 / g.prefill_s.max(1e-9)
        );
    } else {
        if let Some(t) = tokr {
            let tail = stream.finish(t)?;
            out!("{tail}");
        }
        eprintln!(
            "{}, {} generated{}; TTFT {:.3}s, decode {:.2} tok/s{}",
            wgmoe::units::count(prompt_ids.len(), "prompt token"),
            g.generated_ids.len(),
            if g.interrupted {
                " (stopped by Ctrl-C)"
            } else {
                ""
            },
            g.ttft_s,
            g.decode_tokens_per_s(),
            if opts.sampling.is_greedy() {
                String::new()
            } else {
                format!("; seed {seed} (--seed {seed} repeats this run)")
            }
        );
    }
    if let Some(r) = &profile {
        eprint!("{}", wgmoe::insight::kernel_profile::render(r));
    }
    if g.interrupted {
        return Err(Error::Interrupted);
    }
    Ok(())
}

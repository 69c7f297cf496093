//! The generation loop: chunked prefill, then one submission per decoded token.

use std::collections::VecDeque;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::model::{Forward, Head, StepRead, MAX_PIPELINE_DEPTH};
use crate::runtime::sampling::{sample, Rng, SamplingOptions};

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: SamplingOptions,
    /// Token ids that end the response (unless `ignore_eos`).
    pub eos_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Keep the logits row each generated token was chosen from (tests, evaluation).
    pub record_logits: bool,
    /// Decode steps kept in flight ahead of the host (`--pipeline-depth`; 1: the next
    /// step is recorded after the last token was read).
    pub pipeline_depth: usize,
}

/// `--pipeline-depth`'s default: one step recorded while the previous one runs.
pub const DEFAULT_PIPELINE_DEPTH: usize = 2;

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: 0,
            sampling: SamplingOptions::greedy(),
            eos_ids: Vec::new(),
            ignore_eos: false,
            record_logits: false,
            pipeline_depth: DEFAULT_PIPELINE_DEPTH,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Generation {
    pub generated_ids: Vec<u32>,
    /// Per generated token, the logits it was chosen from (with `record_logits`).
    pub step_logits: Vec<Vec<f32>>,
    pub ttft_s: f64,
    /// Time from the first token to the last.
    pub decode_s: f64,
    pub prefill_s: f64,
    pub stopped_by_eos: bool,
    /// Ctrl-C stopped the generation (what was generated until then is kept).
    pub interrupted: bool,
    /// The caller's `on_token` asked to stop (a stop string, a client that went away).
    pub cancelled: bool,
    pub dispatches: u64,
    pub submissions: u64,
    /// CPU seconds spent recording and submitting the decode steps (after the first token;
    /// None where the backend does not measure it).
    pub decode_encode_s: Option<f64>,
    /// The depth the decode ran at (see `effective_depth`).
    pub pipeline_depth: usize,
    /// Most steps submitted and not yet read at once (the one being read included).
    pub decode_steps_in_flight_max: usize,
    /// Seconds the host waited for decode steps' tokens (after the first token).
    pub decode_host_wait_s: f64,
    /// Steps in flight when the generation stopped, dropped unread.
    pub decode_steps_discarded: usize,
    /// Expert misses of the decode steps (after the first token; the prompt's are not
    /// counted); 0 without a residency runtime.
    pub decode_expert_misses: u64,
}

impl Generation {
    /// Tokens after the first, per second of decoding after the first token.
    pub fn decode_tokens_per_s(&self) -> f64 {
        let n = self.generated_ids.len().saturating_sub(1);
        if n == 0 || self.decode_s <= 0.0 {
            0.0
        } else {
            n as f64 / self.decode_s
        }
    }

    /// CPU seconds to record and submit one decode step, averaged over the decode steps.
    pub fn encode_seconds_per_token(&self) -> Option<f64> {
        let n = self.generated_ids.len().saturating_sub(1);
        self.decode_encode_s.filter(|_| n > 0).map(|e| e / n as f64)
    }
}

/// What `argmax.wgsl` writes for a row holding NaN or ±inf.
pub const NON_FINITE_TOKEN: u32 = u32::MAX;

/// The error for a non-finite logits row: `step` 0 is the prefill (the first token), k > 0
/// the k-th decode step; `pos` the position whose logits they are.
pub fn non_finite_error(step: usize, pos: usize) -> Error {
    let at = if step == 0 {
        format!("the prefill step (first generated token, position {pos})")
    } else {
        format!(
            "decode step {step} (generated token {}, position {pos})",
            step + 1
        )
    };
    Error::Other(format!(
        "non-finite logits (NaN or infinite) at {at}: the model's numbers broke down (overflow in the activations, or broken weights); no token was chosen"
    ))
}

/// What `on_token` tells the loop after a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// End the generation after this token (it is kept).
    Stop,
}

/// Generate from `prompt` with the KV cache starting empty. `on_token` sees each token as
/// soon as it is known (to stream text).
pub fn generate(
    fwd: &mut Forward,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32) -> Result<()>,
) -> Result<Generation> {
    generate_from(fwd, prompt, 0, opts, &mut |id| {
        on_token(id).map(|_| Flow::Continue)
    })
}

/// Generate from `prompt` when the KV cache already holds `prompt[..start]` at positions
/// 0..start (an earlier turn's): only `prompt[start..]` is prefilled. `start` must leave at
/// least one token to run, whose logits choose the first new token. `on_token` may end
/// the generation early.
///
/// Pipelined: decode step k + 1 is submitted before token k is read (its input is the id
/// step k chose on the device), keeping up to `pipeline_depth` steps in flight, so the
/// device never idles through a round trip and recording overlaps the device's work. A
/// stop (EOS, `on_token`, `max_new_tokens`, Ctrl-C) drops the steps still in flight:
/// they only wrote KV rows past the last kept token, which the next turn overwrites, so
/// the tokens, the counts and the cache's known contents are those of depth 1.
pub fn generate_from(
    fwd: &mut Forward,
    prompt: &[u32],
    start: usize,
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32) -> Result<Flow>,
) -> Result<Generation> {
    if prompt.is_empty() {
        return Err(Error::option("--prompt", "the prompt has no tokens"));
    }
    if start >= prompt.len() {
        return Err(Error::Other(format!(
            "internal: a prefill from position {start} of a {}-token prompt runs no token",
            prompt.len()
        )));
    }
    let v = fwd.cfg.vocab_size;
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= v) {
        return Err(Error::option(
            "--prompt-ids",
            format!("token id {bad} is outside the vocabulary (vocab_size {v})"),
        ));
    }
    check_depth(opts.pipeline_depth)?;
    let c0 = fwd.counters;
    let greedy = opts.sampling.is_greedy();
    // Greedy decoding keeps the sampled id on the GPU; sampling needs the logits row.
    let head = if greedy { Head::LastArgmax } else { Head::Last };
    // EOS may end the response unless the caller ignores it (then it is never chosen).
    fwd.suppress_eos = opts.ignore_eos;
    let suppress: Vec<u32> = if opts.ignore_eos {
        fwd.opts.suppress.clone()
    } else {
        Vec::new()
    };
    let mut rng = Rng::new(opts.sampling.seed);
    let mut out = Generation::default();
    let depth = effective_depth(fwd, opts);
    out.pipeline_depth = depth;
    if opts.max_new_tokens == 0 {
        return Ok(out);
    }
    let want_logits = opts.record_logits || !greedy;

    let t0 = Instant::now();
    let chunk = fwd.opts.prefill_chunk;
    let mut pos = start;
    fwd.use_slot(0, want_logits)?;
    while pos < prompt.len() {
        let n = chunk.min(prompt.len() - pos);
        let last = pos + n == prompt.len();
        fwd.submit(
            pos,
            n,
            Some(&prompt[pos..pos + n]),
            if last { head } else { Head::None },
        )?;
        pos += n;
    }
    // Steps submitted and not yet read, oldest first: (step, its reads). Step 0 is the
    // prefill's last chunk; step k > 0 runs token k - 1 at position prompt.len() + k - 1.
    let mut in_flight: VecDeque<(usize, StepRead)> = VecDeque::new();
    in_flight.push_back((0, fwd.start_token_read()?));
    let mut submitted = 1;
    let mut t1 = Instant::now();
    let mut e1 = None;
    let misses = |fwd: &Forward| {
        fwd.residency
            .as_ref()
            .map_or(0, |r| r.stats().expert_misses)
    };
    let mut m1 = 0;
    let mut stop = false;
    while let Some((step, read)) = in_flight.pop_front() {
        // Keep the device fed before waiting: the next steps read the id this one chose.
        while !stop && in_flight.len() + 1 < depth && submitted < opts.max_new_tokens {
            fwd.use_slot(submitted % depth, want_logits)?;
            fwd.submit(prompt.len() + submitted - 1, 1, None, head)?;
            in_flight.push_back((submitted, fwd.start_token_read()?));
            submitted += 1;
        }
        out.decode_steps_in_flight_max = out.decode_steps_in_flight_max.max(in_flight.len() + 1);
        let waited = Instant::now();
        let (chosen, logits) = fwd.finish_token_read(read)?;
        if step > 0 {
            out.decode_host_wait_s += waited.elapsed().as_secs_f64();
        }
        let pos = prompt.len() + step - 1;
        if let Some(l) = &logits {
            if l.iter().any(|x| !x.is_finite()) {
                return Err(non_finite_error(step, pos));
            }
        }
        let id = if greedy {
            if chosen == NON_FINITE_TOKEN {
                return Err(non_finite_error(step, pos));
            }
            chosen
        } else {
            // Host sampling chose nothing on the device: depth 1, the next step's input is
            // written here.
            let id = sample(
                logits.as_deref().unwrap_or(&[]),
                &opts.sampling,
                &suppress,
                &mut rng,
            );
            fwd.set_token(id)?;
            id
        };
        if opts.record_logits {
            out.step_logits.push(logits.unwrap_or_default());
        }
        if step == 0 {
            fwd.dev.check()?;
            out.ttft_s = t0.elapsed().as_secs_f64();
            out.prefill_s = out.ttft_s;
            t1 = Instant::now();
            e1 = fwd.dev.encode_seconds();
            m1 = misses(fwd);
        }
        out.generated_ids.push(id);
        let flow = on_token(id)?;
        if !opts.ignore_eos && opts.eos_ids.contains(&id) {
            out.stopped_by_eos = true;
            stop = true;
        } else if flow == Flow::Stop {
            out.cancelled = true;
            stop = true;
        } else if out.generated_ids.len() >= opts.max_new_tokens {
            stop = true;
        } else if crate::interrupt::requested() {
            out.interrupted = true;
            stop = true;
        }
        if stop {
            // The steps still in flight are dropped unread (their reads abandoned).
            break;
        }
        if in_flight.is_empty() && submitted < opts.max_new_tokens {
            // Depth 1: the next step is recorded only now.
            fwd.use_slot(submitted % depth, want_logits)?;
            fwd.submit(prompt.len() + submitted - 1, 1, None, head)?;
            in_flight.push_back((submitted, fwd.start_token_read()?));
            submitted += 1;
        }
    }
    out.decode_steps_discarded = in_flight.len();
    drop(in_flight);
    fwd.use_slot(0, false)?;
    fwd.dev.check()?;
    out.decode_s = t1.elapsed().as_secs_f64();
    out.decode_expert_misses = misses(fwd).saturating_sub(m1);
    out.decode_encode_s = fwd.dev.encode_seconds().zip(e1).map(|(e, e1)| e - e1);
    out.dispatches = fwd.counters.dispatches - c0.dispatches;
    out.submissions = fwd.counters.submissions - c0.submissions;
    Ok(out)
}

/// The depth a generation runs at: the one asked for, or 1 where the host must see each
/// step before the next is recorded (a sampled token chosen on the host; partial
/// residency, routing traces and profiles, whose steps already wait on the host per
/// layer and whose counters must not count a discarded step).
pub fn effective_depth(fwd: &Forward, opts: &GenerateOptions) -> usize {
    let host_in_loop = !opts.sampling.is_greedy()
        || fwd.residency.is_some()
        || fwd.record_routing
        || fwd.trace.is_some()
        || fwd.kernel_profile.is_some();
    if host_in_loop {
        1
    } else {
        opts.pipeline_depth.clamp(1, MAX_PIPELINE_DEPTH)
    }
}

/// `--pipeline-depth`: 1 (no step ahead) up to [`MAX_PIPELINE_DEPTH`].
pub fn check_depth(depth: usize) -> Result<()> {
    if (1..=MAX_PIPELINE_DEPTH).contains(&depth) {
        Ok(())
    } else {
        Err(Error::option(
            "--pipeline-depth",
            format!(
                "{depth}: the depth is the number of decode steps in flight, 1 (none ahead) to {MAX_PIPELINE_DEPTH}"
            ),
        ))
    }
}

/// Run the prompt and choose no token (`run -n 0`): the prefill, timed up to the device's
/// last result (the argmax of the last row, read back and dropped).
pub fn prefill_only(fwd: &mut Forward, prompt: &[u32]) -> Result<Generation> {
    if prompt.is_empty() {
        return Err(Error::option("--prompt", "the prompt has no tokens"));
    }
    let c0 = fwd.counters;
    let t0 = Instant::now();
    let chunk = fwd.opts.prefill_chunk;
    let mut pos = 0;
    while pos < prompt.len() {
        let n = chunk.min(prompt.len() - pos);
        let last = pos + n == prompt.len();
        fwd.submit(
            pos,
            n,
            Some(&prompt[pos..pos + n]),
            if last { Head::LastArgmax } else { Head::None },
        )?;
        pos += n;
    }
    if fwd.read_token()? == NON_FINITE_TOKEN {
        return Err(non_finite_error(0, prompt.len() - 1));
    }
    fwd.dev.check()?;
    Ok(Generation {
        prefill_s: t0.elapsed().as_secs_f64(),
        dispatches: fwd.counters.dispatches - c0.dispatches,
        submissions: fwd.counters.submissions - c0.submissions,
        ..Default::default()
    })
}

/// Logits at every prompt position (one row per token), for parity tests and evaluation.
pub fn prompt_logits(fwd: &mut Forward, prompt: &[u32]) -> Result<Vec<Vec<f32>>> {
    let chunk = fwd.opts.prefill_chunk.min(fwd.logit_rows()).max(1);
    let v = fwd.cfg.vocab_size;
    let mut rows = Vec::with_capacity(prompt.len());
    let mut pos = 0;
    while pos < prompt.len() {
        let n = chunk.min(prompt.len() - pos);
        fwd.submit(pos, n, Some(&prompt[pos..pos + n]), Head::All)?;
        let l = fwd.read_logits(n)?;
        if let Some(bad) = l.iter().position(|x| !x.is_finite()) {
            return Err(Error::Other(format!(
                "non-finite logits (NaN or infinite) at prompt position {}: the model's numbers broke down",
                pos + bad / v.max(1)
            )));
        }
        rows.extend(l.chunks(v).map(|r| r.to_vec()));
        pos += n;
    }
    fwd.dev.check()?;
    Ok(rows)
}

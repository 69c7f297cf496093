//! The generation loop: chunked prefill, then one submission per decoded token.

use std::time::Instant;

use crate::error::{Error, Result};
use crate::model::{Forward, Head};
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
    if opts.max_new_tokens == 0 {
        return Ok(out);
    }

    let t0 = Instant::now();
    let chunk = fwd.opts.prefill_chunk;
    let mut pos = start;
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
    // `step` 0: the token chosen from the prefill's last row; k: the k-th decode step.
    let mut next = |fwd: &mut Forward, out: &mut Generation, step: usize| -> Result<u32> {
        let pos = prompt.len() + step - 1;
        let logits = if opts.record_logits || !greedy {
            let l = fwd.read_logits(1)?;
            if l.iter().any(|x| !x.is_finite()) {
                return Err(non_finite_error(step, pos));
            }
            Some(l)
        } else {
            None
        };
        let id = if greedy {
            let id = fwd.read_token()?;
            if id == NON_FINITE_TOKEN {
                return Err(non_finite_error(step, pos));
            }
            id
        } else {
            let l = logits.as_deref().unwrap_or(&[]);
            let id = sample(l, &opts.sampling, &suppress, &mut rng);
            fwd.set_token(id)?;
            id
        };
        if opts.record_logits {
            out.step_logits.push(logits.unwrap_or_default());
        }
        Ok(id)
    };
    let mut id = next(fwd, &mut out, 0)?;
    fwd.dev.check()?;
    out.ttft_s = t0.elapsed().as_secs_f64();
    out.prefill_s = out.ttft_s;
    let t1 = Instant::now();
    let e1 = fwd.dev.encode_seconds();
    loop {
        out.generated_ids.push(id);
        let flow = on_token(id)?;
        if !opts.ignore_eos && opts.eos_ids.contains(&id) {
            out.stopped_by_eos = true;
            break;
        }
        if flow == Flow::Stop {
            out.cancelled = true;
            break;
        }
        if out.generated_ids.len() >= opts.max_new_tokens {
            break;
        }
        if crate::interrupt::requested() {
            out.interrupted = true;
            break;
        }
        fwd.submit(pos, 1, None, head)?;
        pos += 1;
        let step = out.generated_ids.len();
        id = next(fwd, &mut out, step)?;
    }
    fwd.dev.check()?;
    out.decode_s = t1.elapsed().as_secs_f64();
    out.decode_encode_s = fwd.dev.encode_seconds().zip(e1).map(|(e, e1)| e - e1);
    out.dispatches = fwd.counters.dispatches - c0.dispatches;
    out.submissions = fwd.counters.submissions - c0.submissions;
    Ok(out)
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
    let chunk = fwd.opts.prefill_chunk;
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

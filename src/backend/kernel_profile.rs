//! `--profile-kernels`: each step's dispatches run once more, timed (`Device::profile`), and
//! their times gathered here per stage and kernel, decode steps apart from prefill chunks.
//! The replays' own wall time is kept so the run's rates can leave it out.

use super::{KernelTimes, ProfileClock};

#[derive(Clone, Debug, Default)]
pub struct KernelProfile {
    /// The clock of the last profiled step (None: nothing profiled yet).
    pub clock: Option<ProfileClock>,
    /// One-token decode steps: their times, how many steps, the replays' wall seconds.
    pub decode: KernelTimes,
    pub decode_steps: usize,
    pub decode_replay_s: f64,
    /// Prefill chunks: their times, the prompt tokens they ran, the replays' wall seconds.
    pub prefill: KernelTimes,
    pub prefill_tokens: usize,
    pub prefill_replay_s: f64,
}

impl KernelProfile {
    /// Add one step's times: a decode step (`decode`) or a prefill chunk of `tokens`.
    pub fn add(
        &mut self,
        decode: bool,
        tokens: usize,
        times: KernelTimes,
        clock: ProfileClock,
        wall_s: f64,
    ) {
        let (into, replay) = if decode {
            self.decode_steps += 1;
            (&mut self.decode, &mut self.decode_replay_s)
        } else {
            self.prefill_tokens += tokens;
            (&mut self.prefill, &mut self.prefill_replay_s)
        };
        *replay += wall_s;
        for (k, (s, n)) in times {
            let e = into.entry(k).or_default();
            e.0 += s;
            e.1 += n;
        }
        self.clock = Some(clock);
    }
}

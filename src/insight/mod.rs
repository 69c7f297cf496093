//! What a checkpoint, a device or a run looks like, the commands' logic above `runtime`:
//! `inspect` (a checkpoint's tensors and costs), `kernel_report` (the kernels a plan picks),
//! `kernel_profile` (`--profile-kernels`: GPU time per stage and kernel),
//! `eval` (fidelity of one precision against another), `measure` (an adapter's bandwidths),
//! `simulate` (a trace replayed through the cache policies), `heatmap` and `live` (a
//! trace's layer x expert grid as a picture and in the terminal).

pub mod eval;
pub mod heatmap;
pub mod inspect;
pub mod kernel_profile;
pub mod kernel_report;
pub mod live;
pub mod measure;
pub mod simulate;

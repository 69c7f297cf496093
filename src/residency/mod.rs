//! Expert residency, the device-independent core.
//!
//! - [`Fence`]: has a submission retired? ([`MockFence`] for tests and simulation.)
//! - [`ExpertCache`]: one layer's slots and its generation-versioned expert -> slot table;
//!   plan / upload / publish-or-abort for each routed group.
//! - [`StagingPool`]: the bounded pool of staging buffers, reused only after their copy's fence.
//! - [`Policy`]: [`Lru`], [`LfuDecay`], [`StaticProfile`] (from a [`Profile`]).
//! - [`HostSource`]: the immutable, already-quantised expert set in host memory.
//! - [`MissPolicy`] and the cost model: where a miss runs (uploaded, or on the CPU).
//! - [`Prefetch`]: experts guessed for a layer's next step copied ahead into its prefetch
//!   slots, published only if the real routing wants them; [`PrefetchGate`] stops a
//!   layer's copies while its guesses do not pay.
//! - Ceilings: [`belady`], [`frequency_ceiling`], and [`simulate`] to compare policies;
//!   [`replay`] and [`belady_steps`] over recorded steps served as the runtime serves them.
//!
//! Nothing here touches a device; the backend seam supplies a `Fence` over its submission
//! tokens, and `model::residency` performs the copies a [`Plan`] lists and uploads
//! [`SlotTable::words`] at publication.

mod batches;
mod cache;
mod ceiling;
mod error;
mod fence;
mod host_source;
mod miss;
mod policy;
mod prefetch;
mod prefetch_gate;
mod profile;
mod replay;
mod staging;

#[cfg(test)]
mod cache_tests;
#[cfg(test)]
mod prefetch_tests;
#[cfg(test)]
mod testutil;

pub use batches::expert_batches;
pub use cache::{
    AbortReport, CacheConfig, CacheStats, ExpertCache, Placement, Plan, SlotInfo, SlotState,
    SlotTable, NO_SLOT,
};
pub use ceiling::{belady, belady_hit_rate, expected_experts_touched, frequency_ceiling, simulate};
pub use error::{CacheError, ConfigError, StagingError};
pub use fence::{Fence, MockFence};
pub use host_source::{HostLayer, HostSource};
pub use miss::{choose_uploads, CostFigures, MissPolicy, Reuse};
pub use policy::{build_policy, LfuDecay, Lru, Policy, PolicyKind, StaticProfile};
pub use prefetch::{Prefetch, Settled};
pub use prefetch_gate::{break_even_precision, PrefetchGate, HIDDEN_COPY_BREAK_EVEN};
pub use profile::Profile;
pub use replay::{
    belady_steps, distinct, replay, replay_prefetch, total, PrefetchSimStats, SimStats,
};
pub use staging::{StagingPool, StagingStats};

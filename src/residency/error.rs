//! Errors of the residency core. Each message names the layer and the numbers at fault.

use std::fmt::Debug;

/// A residency configuration (cache geometry, staging pool, policy parameter, profile) that
/// is invalid. Raised before any request is served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl ConfigError {
    pub fn new(msg: impl Into<String>) -> Self {
        ConfigError(msg.into())
    }
}

/// A failure of one cache operation. `T` is the fence token type.
///
/// Two refusals matter to the caller and are kept apart:
/// - [`CacheError::NotNow`]: the group fits, but the slots it must write are still read by a
///   submission in flight; retry once `wait_for` has completed.
/// - [`CacheError::NeverFits`] / [`CacheError::GroupTooLarge`]: retrying can never help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError<T: Debug> {
    #[error(
        "layer {layer}: expert {expert} is out of range (the layer has {num_experts} experts)"
    )]
    UnknownExpert {
        layer: usize,
        expert: u32,
        num_experts: usize,
    },
    #[error(
        "layer {layer}: {distinct} distinct experts wanted at once but the cache holds {capacity} \
         per layer; this group can never fit"
    )]
    NeverFits {
        layer: usize,
        distinct: usize,
        capacity: usize,
    },
    #[error(
        "layer {layer}: {misses} misses in one group but only {free} unpublished slots exist; \
         it can never fit as one group (split it, or configure more spare slots)"
    )]
    GroupTooLarge {
        layer: usize,
        misses: usize,
        free: usize,
    },
    #[error(
        "layer {layer}: no slot is reusable yet; retry after submission {wait_for:?} completes"
    )]
    NotNow { layer: usize, wait_for: T },
    #[error("layer {layer}: plan {open} is still open; publish or abort it first")]
    PlanInFlight { layer: usize, open: u64 },
    #[error("layer {layer}: plan {plan} is not this layer's open plan")]
    StalePlan { layer: usize, plan: u64 },
    #[error("layer {layer}: plan {plan} has uploads not yet marked complete")]
    UploadsIncomplete { layer: usize, plan: u64 },
    #[error("layer {layer}: the prefetch copy of expert {expert} was never submitted")]
    PrefetchNotCopied { layer: usize, expert: u32 },
    #[error("layer {layer}: expert {expert} is not resident in generation {generation}")]
    NotResident {
        layer: usize,
        expert: u32,
        generation: u64,
    },
}

impl<T: Debug> CacheError<T> {
    /// `true` for the retryable refusal: wait for the fence, then plan again.
    pub fn is_not_now(&self) -> bool {
        matches!(self, CacheError::NotNow { .. })
    }

    /// `true` when retrying the same group can never succeed.
    pub fn is_never_fits(&self) -> bool {
        matches!(
            self,
            CacheError::NeverFits { .. } | CacheError::GroupTooLarge { .. }
        )
    }
}

/// A misuse of the staging pool (a bug in the caller, reported rather than hidden).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StagingError {
    #[error("staging buffer {idx} does not exist (the pool has {len})")]
    OutOfRange { idx: usize, len: usize },
    #[error("staging buffer {idx} was not acquired")]
    NotAcquired { idx: usize },
}

impl From<ConfigError> for crate::Error {
    fn from(e: ConfigError) -> Self {
        crate::Error::Other(e.0)
    }
}

impl<T: Debug> From<CacheError<T>> for crate::Error {
    fn from(e: CacheError<T>) -> Self {
        if e.is_never_fits() {
            crate::Error::DoesNotFit(e.to_string())
        } else {
            crate::Error::Other(e.to_string())
        }
    }
}

impl From<StagingError> for crate::Error {
    fn from(e: StagingError) -> Self {
        crate::Error::Other(e.to_string())
    }
}

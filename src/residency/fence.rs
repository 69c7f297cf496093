//! Completion fences: "has the GPU finished the submission identified by this token?".
//!
//! The residency core never talks to a GPU. It records, for every slot and staging buffer,
//! the token of the last submission that touched it and asks a [`Fence`] whether that
//! submission has retired. The wgpu implementation maps a token to a submission index
//! (polled with `device.poll`); tests use [`MockFence`], whose completion they advance by hand.

use std::fmt::Debug;

/// Answers whether a submission has completed on the GPU.
///
/// Tokens are ordered: on one queue, submissions retire in order, so waiting for the largest
/// token a resource was used by is enough to know every earlier use has retired too.
pub trait Fence {
    /// Identifies one submission (a submission index, a monotonically increasing counter).
    type Token: Copy + Ord + Debug;

    /// `true` once every GPU command of submission `token` has finished.
    fn is_complete(&self, token: Self::Token) -> bool;
}

/// A fence for tests and simulation: submissions are numbered 1, 2, 3, ... and complete in
/// order only when the owner says so ([`complete_through`](Self::complete_through)).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MockFence {
    submitted: u64,
    completed: u64,
}

impl MockFence {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a new submission and returns its token (1 for the first one).
    pub fn submit(&mut self) -> u64 {
        self.submitted += 1;
        self.submitted
    }

    /// Completes every submission up to and including `token` (never one not yet submitted;
    /// completion never goes backwards).
    pub fn complete_through(&mut self, token: u64) {
        self.completed = self.completed.max(token.min(self.submitted));
    }

    /// Completes everything submitted so far.
    pub fn complete_all(&mut self) {
        self.completed = self.submitted;
    }

    /// The token of the last submission (0 before the first).
    pub fn last_submitted(&self) -> u64 {
        self.submitted
    }

    /// The token of the last completed submission (0 when none has completed).
    pub fn last_completed(&self) -> u64 {
        self.completed
    }
}

impl Fence for MockFence {
    type Token = u64;

    fn is_complete(&self, token: u64) -> bool {
        token <= self.completed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mock_fence_completes_in_order_and_never_ahead_of_submission() {
        let mut f = MockFence::new();
        let a = f.submit();
        let b = f.submit();
        assert!(!f.is_complete(a) && !f.is_complete(b));
        f.complete_through(a);
        assert!(f.is_complete(a) && !f.is_complete(b));
        f.complete_through(100); // clamps to what was submitted
        assert_eq!(f.last_completed(), b);
        let c = f.submit();
        assert!(!f.is_complete(c));
        f.complete_through(1); // never goes backwards
        assert!(f.is_complete(b));
        f.complete_all();
        assert!(f.is_complete(c));
    }
}

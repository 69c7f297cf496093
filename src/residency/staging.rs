//! The bounded pool of staging buffers (on the GPU: `MAP_WRITE | COPY_SRC`).
//!
//! A buffer is [`acquire`](StagingPool::acquire)d, filled from the host source, copied into
//! its slot by a submission, then [`release`](StagingPool::release)d with that submission's
//! token. It is handed out again only once that submission has completed. The pool never grows.

use std::fmt;

use super::error::{ConfigError, StagingError};
use super::fence::Fence;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BufState {
    Idle,
    Acquired,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Buf<T> {
    state: BufState,
    /// The submission of the last copy that read this buffer.
    last_copy: Option<T>,
}

/// Counters of the staging pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StagingStats {
    pub acquires: u64,
    pub releases: u64,
    /// Buffers returned without a copy (a fill that failed).
    pub cancels: u64,
    /// `acquire` calls that found no buffer whose fence had completed.
    pub stalls: u64,
    pub peak_in_use: usize,
}

pub struct StagingPool<F: Fence> {
    bufs: Vec<Buf<F::Token>>,
    stats: StagingStats,
}

impl<F: Fence> fmt::Debug for StagingPool<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StagingPool")
            .field("bufs", &self.bufs)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<F: Fence> StagingPool<F> {
    /// A pool of `k >= 1` buffers, all idle.
    pub fn new(k: usize) -> Result<Self, ConfigError> {
        if k == 0 {
            return Err(ConfigError::new(
                "the staging pool needs at least 1 buffer (--staging-buffers)",
            ));
        }
        Ok(Self {
            bufs: vec![
                Buf {
                    state: BufState::Idle,
                    last_copy: None,
                };
                k
            ],
            stats: StagingStats::default(),
        })
    }

    /// The number of buffers (fixed at construction).
    pub fn len(&self) -> usize {
        self.bufs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bufs.is_empty()
    }

    pub fn in_use(&self) -> usize {
        self.bufs
            .iter()
            .filter(|b| b.state == BufState::Acquired)
            .count()
    }

    pub fn stats(&self) -> StagingStats {
        self.stats
    }

    /// An idle buffer whose last copy has completed (lowest index first), now acquired;
    /// `None` when every buffer is acquired or still read by a copy in flight (then wait for
    /// [`wait_token`](Self::wait_token)).
    pub fn acquire(&mut self, fence: &F) -> Option<usize> {
        let found = self.bufs.iter().position(|b| {
            b.state == BufState::Idle && b.last_copy.is_none_or(|t| fence.is_complete(t))
        });
        match found {
            Some(idx) => {
                self.bufs[idx].state = BufState::Acquired;
                self.stats.acquires += 1;
                self.stats.peak_in_use = self.stats.peak_in_use.max(self.in_use());
            }
            None => self.stats.stalls += 1,
        }
        found
    }

    /// Returns buffer `idx` after the copy that reads it was submitted as `copy_token`.
    pub fn release(&mut self, idx: usize, copy_token: F::Token) -> Result<(), StagingError> {
        let buf = self.acquired_mut(idx)?;
        buf.state = BufState::Idle;
        buf.last_copy = Some(buf.last_copy.map_or(copy_token, |t| t.max(copy_token)));
        self.stats.releases += 1;
        Ok(())
    }

    /// Returns buffer `idx` without a copy having been submitted (a failed fill); its
    /// previous fence still applies.
    pub fn cancel(&mut self, idx: usize) -> Result<(), StagingError> {
        self.acquired_mut(idx)?.state = BufState::Idle;
        self.stats.cancels += 1;
        Ok(())
    }

    /// The smallest fence token an idle buffer waits for, if no idle buffer is free already.
    pub fn wait_token(&self, fence: &F) -> Option<F::Token> {
        let idle = self.bufs.iter().filter(|b| b.state == BufState::Idle);
        if idle
            .clone()
            .any(|b| b.last_copy.is_none_or(|t| fence.is_complete(t)))
        {
            return None;
        }
        idle.filter_map(|b| b.last_copy).min()
    }

    fn acquired_mut(&mut self, idx: usize) -> Result<&mut Buf<F::Token>, StagingError> {
        let len = self.bufs.len();
        let buf = self
            .bufs
            .get_mut(idx)
            .ok_or(StagingError::OutOfRange { idx, len })?;
        if buf.state != BufState::Acquired {
            return Err(StagingError::NotAcquired { idx });
        }
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::super::fence::MockFence;
    use super::super::testutil::Rng;
    use super::*;

    #[test]
    fn rejects_empty_pool() {
        assert!(StagingPool::<MockFence>::new(0).is_err());
    }

    #[test]
    fn buffer_not_reused_before_its_copy_completes() {
        let mut fence = MockFence::new();
        let mut pool = StagingPool::<MockFence>::new(2).unwrap();
        let a = pool.acquire(&fence).unwrap();
        let b = pool.acquire(&fence).unwrap();
        assert_ne!(a, b);
        assert_eq!(pool.acquire(&fence), None); // all acquired
        let t1 = fence.submit();
        pool.release(a, t1).unwrap();
        assert_eq!(pool.acquire(&fence), None); // a is idle but its copy is in flight
        assert_eq!(pool.wait_token(&fence), Some(t1));
        fence.complete_through(t1);
        assert_eq!(pool.wait_token(&fence), None);
        assert_eq!(pool.acquire(&fence), Some(a));
        // A failed fill returns the buffer; its old (completed) fence still applies.
        pool.cancel(a).unwrap();
        assert_eq!(pool.acquire(&fence), Some(a));
        assert_eq!(pool.stats().stalls, 2);
        assert_eq!(pool.stats().cancels, 1);
        assert_eq!(pool.stats().peak_in_use, 2);
    }

    #[test]
    fn misuse_is_reported() {
        let fence = MockFence::new();
        let mut pool = StagingPool::<MockFence>::new(2).unwrap();
        assert_eq!(
            pool.release(0, 1),
            Err(StagingError::NotAcquired { idx: 0 })
        );
        assert_eq!(
            pool.cancel(5),
            Err(StagingError::OutOfRange { idx: 5, len: 2 })
        );
        let a = pool.acquire(&fence).unwrap();
        pool.release(a, 1).unwrap();
        assert_eq!(
            pool.release(a, 2),
            Err(StagingError::NotAcquired { idx: a })
        );
    }

    #[test]
    fn random_use_never_grows_nor_hands_out_unfenced_buffers() {
        let mut rng = Rng::new(7);
        let mut fence = MockFence::new();
        let k = 3;
        let mut pool = StagingPool::<MockFence>::new(k).unwrap();
        let mut held: Vec<usize> = Vec::new();
        // Shadow model: last copy token per buffer.
        let mut shadow: Vec<Option<u64>> = vec![None; k];
        for _ in 0..20_000 {
            match rng.below(4) {
                0 | 1 => {
                    if let Some(i) = pool.acquire(&fence) {
                        assert!(!held.contains(&i), "buffer {i} handed out twice");
                        assert!(shadow[i].is_none_or(|t| fence.is_complete(t)), "unfenced");
                        held.push(i);
                    } else {
                        let free = (0..k).any(|i| {
                            !held.contains(&i) && shadow[i].is_none_or(|t| fence.is_complete(t))
                        });
                        assert!(!free, "a usable buffer was refused");
                    }
                }
                2 if !held.is_empty() => {
                    let i = held.swap_remove(rng.below(held.len()));
                    if rng.below(8) == 0 {
                        pool.cancel(i).unwrap();
                    } else {
                        let t = fence.submit();
                        pool.release(i, t).unwrap();
                        shadow[i] = Some(t);
                    }
                }
                _ => {
                    let target = fence.last_completed() + rng.below(3) as u64;
                    fence.complete_through(target);
                }
            }
            assert_eq!(pool.len(), k);
            assert_eq!(pool.in_use(), held.len());
        }
        assert!(pool.stats().peak_in_use <= k);
        assert!(pool.stats().stalls > 0 && pool.stats().releases > 0);
    }
}

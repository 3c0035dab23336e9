//! A job-wide cancellation flag. Every blocking wait in the data plane waits
//! in short slices and re-checks it, so a failing task can stop all others
//! without a hang.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long a blocked thread sleeps before it re-checks cancellation.
pub const CANCEL_POLL: Duration = Duration::from_millis(20);

/// How many times a consumer yields, watching for data, before it blocks.
/// Blocking and waking cost a system call on each side (several
/// microseconds in a VM); a producer that is about to hand over a buffer
/// usually does so within a few yields.
pub(crate) const SPINS_BEFORE_BLOCKING: usize = 16;

#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

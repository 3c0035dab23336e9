//! Whether the consumers of a pipelined partition stopped reading it, and
//! whether any asked for data yet: shared, lock-free state a producer checks
//! as it runs (to end early, or to wait for demand before it starts).

use crate::buffer::lock_state;
use fluvia_core::{FluviaError, Result};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// How many subpartitions of one pipelined partition their consumers
/// released, whether any consumer asked for data yet, and who to tell once
/// all were released or the first asked.
pub(crate) struct ReleaseState {
    pub(crate) count: AtomicUsize,
    pub(crate) total: usize,
    pub(crate) demanded: AtomicBool,
    pub(crate) watchers: Mutex<Vec<Arc<dyn Fn() + Send + Sync>>>,
}

impl ReleaseState {
    pub(crate) fn one_released(&self) {
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.total {
            self.wake_watchers();
        }
    }

    pub(crate) fn demanded(&self) {
        if !self.demanded.swap(true, Ordering::AcqRel) {
            self.wake_watchers();
        }
    }

    fn wake_watchers(&self) {
        let watchers = lock_state(&self.watchers).clone();
        for w in watchers {
            w();
        }
    }

    fn all(&self) -> bool {
        // A partition nobody was ever to read (none such is built) is not
        // "released": its producer must not take it as a reason to stop.
        self.total > 0 && self.count.load(Ordering::Acquire) >= self.total
    }
}

/// Whether every consumer of some pipelined partitions stopped reading
/// (all of them, for a task with several outputs), readable from any thread
/// without a lock: a producer checks it as it runs and stops early. It also
/// tells whether any consumer asked for data yet, so a producer may wait for
/// that before it starts.
#[derive(Clone, Default)]
pub struct ConsumersReleased {
    pub(crate) partitions: Vec<Arc<ReleaseState>>,
}

debug_fields!(ConsumersReleased, |this| { all: this.all() });

impl ConsumersReleased {
    /// True once every subpartition of every partition was released.
    pub fn all(&self) -> bool {
        !self.partitions.is_empty() && self.partitions.iter().all(|p| p.all())
    }

    /// True once a consumer of any of the partitions polled it for data.
    pub fn demanded(&self) -> bool {
        self.partitions
            .iter()
            .any(|p| p.demanded.load(Ordering::Acquire))
    }

    /// Blocks until a consumer demands data (true) or every consumer
    /// released its input without reading (false): a producer whose
    /// consumers may never need it (a build side behind an empty join) starts
    /// its work only then. Cancellation is checked every
    /// [`CANCEL_POLL`](crate::cancel::CANCEL_POLL).
    pub fn wait_for_demand(&self, cancel: &crate::CancelToken) -> Result<bool> {
        let signal = Arc::new((Mutex::new(()), std::sync::Condvar::new()));
        let s = Arc::clone(&signal);
        self.watch(Arc::new(move || {
            let _held = lock_state(&s.0);
            s.1.notify_all();
        }));
        let mut held = lock_state(&signal.0);
        loop {
            // Checked under the lock a waker takes: no wake-up is lost.
            if self.demanded() {
                return Ok(true);
            }
            if self.all() {
                return Ok(false);
            }
            if cancel.is_cancelled() {
                return Err(FluviaError::Cancelled);
            }
            held = signal
                .1
                .wait_timeout(held, crate::cancel::CANCEL_POLL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Both sets: released when both are.
    pub fn and(mut self, other: ConsumersReleased) -> ConsumersReleased {
        self.partitions.extend(other.partitions);
        self
    }

    /// Calls `wake` whenever one of the partitions becomes all released or
    /// is first demanded (and at once if one already is), so a thread
    /// blocked on something else (its own inputs, or waiting for demand) can
    /// check [`all`](Self::all) and [`demanded`](Self::demanded).
    pub fn watch(&self, wake: Arc<dyn Fn() + Send + Sync>) {
        for p in &self.partitions {
            lock_state(&p.watchers).push(Arc::clone(&wake));
            if p.all() || p.demanded.load(Ordering::Acquire) {
                wake();
            }
        }
    }
}

//! I/O counters of one task, shared between the task thread (which updates
//! them once per buffer, not per record) and whoever reports them.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct IoCounters {
    pub records_in: AtomicU64,
    pub bytes_in: AtomicU64,
    pub buffers_in: AtomicU64,
    pub records_out: AtomicU64,
    pub bytes_out: AtomicU64,
    pub buffers_out: AtomicU64,
    /// Nanoseconds spent waiting for input.
    pub idle_nanos: AtomicU64,
}

impl IoCounters {
    pub fn add(counter: &AtomicU64, n: u64) {
        if n > 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

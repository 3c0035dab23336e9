//! Network buffers and the pools that bound them.
//!
//! A [`NetworkBufferPool`] is the budget of one TaskManager: `total` segments of
//! `segment_size` bytes. A [`LocalBufferPool`] reserves a fixed number of those
//! segments for one result partition; it allocates them lazily and recycles
//! them when the consumer drops a [`Buffer`], so a partition never holds more
//! than its reservation. [`LocalBufferPool::request`] blocks while every
//! segment is in flight: the producer waits for its consumer.

use crate::cancel::{CANCEL_POLL, CancelToken};
use fluvia_core::{FluviaError, Result};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

pub(crate) fn lock_state<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock means another thread panicked while holding it; the
    // state is plain counters and queues, still consistent, and the panic is
    // reported through the task that caused it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The TaskManager-wide budget of network memory.
#[derive(Debug)]
pub struct NetworkBufferPool {
    segment_size: usize,
    total: usize,
    reserved: Mutex<usize>,
    /// Signalled when a local pool gives its reservation back.
    released: Condvar,
    /// How long a reservation that does not fit waits for others to be
    /// given back before it fails (Flink's
    /// `taskmanager.network.memory.exclusive-buffers-request-timeout-ms`).
    request_timeout: std::time::Duration,
}

impl NetworkBufferPool {
    /// A budget where a reservation that does not fit fails at once.
    pub fn new(total_bytes: u64, segment_size: usize) -> Result<Arc<Self>> {
        Self::with_request_timeout(total_bytes, segment_size, std::time::Duration::ZERO)
    }

    /// A budget where a reservation that does not fit waits up to
    /// `timeout` for running tasks to give theirs back (a wave of tasks
    /// deployed at once may need what the tasks before it still hold for a
    /// moment).
    pub fn with_request_timeout(
        total_bytes: u64,
        segment_size: usize,
        timeout: std::time::Duration,
    ) -> Result<Arc<Self>> {
        if segment_size < 64 {
            return Err(FluviaError::Config(format!(
                "taskmanager.memory.segment-size must be at least 64 bytes, got {segment_size}"
            )));
        }
        Ok(Arc::new(NetworkBufferPool {
            segment_size,
            total: (total_bytes / segment_size as u64) as usize,
            reserved: Mutex::new(0),
            released: Condvar::new(),
            request_timeout: timeout,
        }))
    }

    pub fn segment_size(&self) -> usize {
        self.segment_size
    }

    pub fn total_segments(&self) -> usize {
        self.total
    }

    pub fn reserved_segments(&self) -> usize {
        *lock_state(&self.reserved)
    }

    /// Reserves `size` segments for a new local pool, or fails with Flink's
    /// advice on which key to raise.
    pub fn create_local_pool(self: &Arc<Self>, size: usize) -> Result<Arc<LocalBufferPool>> {
        let mut reserved = lock_state(&self.reserved);
        let deadline = std::time::Instant::now() + self.request_timeout;
        while *reserved + size > self.total && size <= self.total {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            reserved = self
                .released
                .wait_timeout(reserved, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        if *reserved + size > self.total {
            return Err(FluviaError::Config(format!(
                "insufficient number of network buffers: required {}, but only {} available. \
                 The total number of network buffers is currently set to {} of {} bytes each. \
                 You can increase this number by setting taskmanager.memory.network.size.",
                size,
                self.total - *reserved,
                self.total,
                self.segment_size
            )));
        }
        *reserved += size;
        drop(reserved);
        Ok(Arc::new(LocalBufferPool {
            global: Arc::clone(self),
            segment_size: self.segment_size,
            max: size,
            state: Mutex::new(PoolState::default()),
            available: Condvar::new(),
            free_hint: Default::default(),
        }))
    }

    fn release(&self, size: usize) {
        let mut reserved = lock_state(&self.reserved);
        *reserved = reserved.saturating_sub(size);
        drop(reserved);
        self.released.notify_all();
    }
}

#[derive(Debug, Default)]
struct PoolState {
    free: Vec<Vec<u8>>,
    /// Segments allocated so far (free or in use), at most `max`.
    allocated: usize,
    in_use: usize,
    max_in_use: usize,
    /// Number of requests that had to wait for a segment.
    waits: u64,
    /// Threads blocked in `request`: recycling wakes one only then (a
    /// condition variable signal is a system call even with no waiter).
    waiting: usize,
    /// Total time requests spent waiting (back-pressure).
    waited: std::time::Duration,
}

/// A bounded pool of segments for one result partition.
#[derive(Debug)]
pub struct LocalBufferPool {
    global: Arc<NetworkBufferPool>,
    segment_size: usize,
    max: usize,
    state: Mutex<PoolState>,
    available: Condvar,
    /// Free segments, readable without the lock (for the brief spin).
    free_hint: std::sync::atomic::AtomicUsize,
}

impl LocalBufferPool {
    /// Takes a segment, waiting while all are in use; fails only on cancellation.
    pub fn request(self: &Arc<Self>, cancel: &CancelToken) -> Result<BufferBuilder> {
        let mut st = lock_state(&self.state);
        let mut waited: Option<std::time::Instant> = None;
        loop {
            let seg = match st.free.pop() {
                Some(seg) => Some(seg),
                None if st.allocated < self.max => {
                    st.allocated += 1;
                    Some(Vec::with_capacity(self.segment_size))
                }
                None => None,
            };
            if let Some(seg) = seg {
                if let Some(since) = waited {
                    st.waited += since.elapsed();
                }
                return Ok(self.hand_out(&mut st, seg));
            }
            if cancel.is_cancelled() {
                return Err(FluviaError::Cancelled);
            }
            if waited.is_none() {
                st.waits += 1;
                waited = Some(std::time::Instant::now());
                // A segment usually comes back within a few yields.
                drop(st);
                for _ in 0..crate::cancel::SPINS_BEFORE_BLOCKING {
                    std::thread::yield_now();
                    if self.free_hint.load(std::sync::atomic::Ordering::Acquire) > 0 {
                        break;
                    }
                }
                st = lock_state(&self.state);
                continue;
            }
            st.waiting += 1;
            st = self
                .available
                .wait_timeout(st, CANCEL_POLL)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
            st.waiting -= 1;
        }
    }

    /// Takes a segment if one is free right now.
    pub fn try_request(self: &Arc<Self>) -> Option<BufferBuilder> {
        let mut st = lock_state(&self.state);
        if let Some(seg) = st.free.pop() {
            return Some(self.hand_out(&mut st, seg));
        }
        if st.allocated < self.max {
            st.allocated += 1;
            return Some(self.hand_out(&mut st, Vec::with_capacity(self.segment_size)));
        }
        None
    }

    fn hand_out(self: &Arc<Self>, st: &mut PoolState, seg: Vec<u8>) -> BufferBuilder {
        st.in_use += 1;
        st.max_in_use = st.max_in_use.max(st.in_use);
        self.free_hint
            .store(st.free.len(), std::sync::atomic::Ordering::Release);
        let recycler: Arc<dyn BufferRecycler> = Arc::clone(self) as Arc<dyn BufferRecycler>;
        BufferBuilder::with_recycler(seg, self.segment_size, recycler)
    }

    fn recycle(&self, seg: Vec<u8>) {
        let mut st = lock_state(&self.state);
        st.in_use -= 1;
        st.free.push(seg);
        self.free_hint
            .store(st.free.len(), std::sync::atomic::Ordering::Release);
        let wake = st.waiting > 0;
        drop(st);
        if wake {
            self.available.notify_one();
        }
    }

    pub fn max_buffers(&self) -> usize {
        self.max
    }

    pub fn segment_size(&self) -> usize {
        self.segment_size
    }

    /// Segments handed out and not yet recycled.
    pub fn in_use(&self) -> usize {
        lock_state(&self.state).in_use
    }

    /// The most segments that were ever in use at once.
    pub fn max_in_use(&self) -> usize {
        lock_state(&self.state).max_in_use
    }

    /// Segments ever allocated (never more than [`max_buffers`](Self::max_buffers)).
    pub fn allocated(&self) -> usize {
        lock_state(&self.state).allocated
    }

    /// How many requests found the pool empty and waited (back-pressure).
    pub fn waits(&self) -> u64 {
        lock_state(&self.state).waits
    }

    /// Total time spent waiting for a segment (back-pressured time).
    pub fn waited(&self) -> std::time::Duration {
        lock_state(&self.state).waited
    }
}

impl Drop for LocalBufferPool {
    fn drop(&mut self) {
        self.global.release(self.max);
    }
}

/// Where a segment goes back when the last reader of its buffer drops it.
pub trait BufferRecycler: Send + Sync + std::fmt::Debug {
    fn recycle(&self, segment: Vec<u8>);
}

impl BufferRecycler for LocalBufferPool {
    fn recycle(&self, segment: Vec<u8>) {
        LocalBufferPool::recycle(self, segment)
    }
}

/// A segment being filled by a producer.
#[derive(Debug)]
pub struct BufferBuilder {
    data: Vec<u8>,
    capacity: usize,
    recycler: Option<Arc<dyn BufferRecycler>>,
}

impl BufferBuilder {
    /// A builder outside any pool.
    pub fn unpooled(capacity: usize) -> Self {
        BufferBuilder {
            data: Vec::with_capacity(capacity),
            capacity,
            recycler: None,
        }
    }

    /// A builder over `segment` that returns to `recycler` when done with.
    pub fn with_recycler(
        mut segment: Vec<u8>,
        capacity: usize,
        recycler: Arc<dyn BufferRecycler>,
    ) -> Self {
        segment.clear();
        BufferBuilder {
            data: segment,
            capacity,
            recycler: Some(recycler),
        }
    }

    pub fn remaining(&self) -> usize {
        self.capacity - self.data.len()
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Appends as much of `bytes` as fits; returns how many were written.
    pub fn append(&mut self, bytes: &[u8]) -> usize {
        let n = bytes.len().min(self.remaining());
        self.data.extend_from_slice(&bytes[..n]);
        n
    }

    /// The bytes written so far.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The filled bytes, for writers that fill the segment directly (up to
    /// [`capacity`](Self::capacity)).
    pub fn data_mut(&mut self) -> &mut Vec<u8> {
        &mut self.data
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Seals the builder into a readable buffer.
    pub fn finish(mut self) -> Buffer {
        let data = std::mem::take(&mut self.data);
        Buffer(Arc::new(BufferInner {
            range: 0..data.len(),
            data,
            recycler: self.recycler.take(),
        }))
    }
}

impl Drop for BufferBuilder {
    fn drop(&mut self) {
        if let Some(r) = self.recycler.take() {
            r.recycle(std::mem::take(&mut self.data));
        }
    }
}

#[derive(Debug)]
struct BufferInner {
    data: Vec<u8>,
    /// The readable bytes of `data` (a reader may fill a segment with a
    /// header before the payload).
    range: std::ops::Range<usize>,
    recycler: Option<Arc<dyn BufferRecycler>>,
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        if let Some(r) = self.recycler.take() {
            r.recycle(std::mem::take(&mut self.data));
        }
    }
}

/// A filled, read-only buffer. Cloning shares it (a broadcast buffer is one
/// segment read by every subpartition); when the last clone is dropped the
/// segment returns to where it came from, which is what lets a producer, or
/// a sender waiting for credit, continue.
#[derive(Debug, Clone)]
pub struct Buffer(Arc<BufferInner>);

impl Buffer {
    pub fn as_slice(&self) -> &[u8] {
        &self.0.data[self.0.range.clone()]
    }

    pub fn len(&self) -> usize {
        self.0.range.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.range.is_empty()
    }

    /// The bytes `range` of `segment`, returning the whole segment to
    /// `recycler` when the last clone is dropped. `range` must lie in it.
    pub fn slice_of(
        segment: Vec<u8>,
        range: std::ops::Range<usize>,
        recycler: Arc<dyn BufferRecycler>,
    ) -> Self {
        let end = range.end.min(segment.len());
        let range = range.start.min(end)..end;
        Buffer(Arc::new(BufferInner {
            data: segment,
            range,
            recycler: Some(recycler),
        }))
    }

    /// A buffer not owned by any pool.
    pub fn from_vec(data: Vec<u8>) -> Self {
        Buffer(Arc::new(BufferInner {
            range: 0..data.len(),
            data,
            recycler: None,
        }))
    }

    /// How many holders share this buffer.
    pub fn ref_count(&self) -> usize {
        Arc::strong_count(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_pools_are_bounded_by_the_global_budget() {
        let global = NetworkBufferPool::new(10 * 1024, 1024).unwrap();
        let a = global.create_local_pool(6).unwrap();
        let err = global.create_local_pool(5).unwrap_err().to_string();
        assert!(err.contains("taskmanager.memory.network.size"), "{err}");
        drop(a);
        assert!(global.create_local_pool(10).is_ok());
    }

    #[test]
    fn a_reservation_that_does_not_fit_waits_for_one_given_back_then_fails() {
        let timeout = std::time::Duration::from_millis(300);
        let global = NetworkBufferPool::with_request_timeout(10 * 1024, 1024, timeout).unwrap();
        let a = global.create_local_pool(6).unwrap();
        let g2 = Arc::clone(&global);
        let waiter = std::thread::spawn(move || g2.create_local_pool(5).map(|p| p.max_buffers()));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished(), "waits while the budget is taken");
        drop(a);
        assert_eq!(waiter.join().unwrap().unwrap(), 5);
        let _b = global.create_local_pool(8).unwrap();
        let started = std::time::Instant::now();
        let err = global.create_local_pool(5).unwrap_err().to_string();
        assert!(
            started.elapsed() >= timeout,
            "gave up only after the timeout"
        );
        assert!(err.contains("taskmanager.memory.network.size"), "{err}");
        let err = global.create_local_pool(11).unwrap_err().to_string();
        assert!(
            err.contains("required 11"),
            "more than the whole budget fails at once: {err}"
        );
    }

    #[test]
    fn a_full_pool_blocks_until_a_buffer_is_recycled() {
        let global = NetworkBufferPool::new(2 * 1024, 1024).unwrap();
        let pool = global.create_local_pool(2).unwrap();
        let cancel = CancelToken::new();
        let a = pool.request(&cancel).unwrap().finish();
        let _b = pool.request(&cancel).unwrap();
        assert!(pool.try_request().is_none());
        let p2 = Arc::clone(&pool);
        let c2 = cancel.clone();
        let waiter = std::thread::spawn(move || p2.request(&c2).map(|b| b.remaining()));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished());
        drop(a);
        assert_eq!(waiter.join().unwrap().unwrap(), 1024);
        assert_eq!(pool.max_in_use(), 2);
        assert_eq!(pool.allocated(), 2);
        assert!(pool.waits() >= 1);
    }

    #[test]
    fn cancellation_releases_a_blocked_request() {
        let global = NetworkBufferPool::new(1024, 1024).unwrap();
        let pool = global.create_local_pool(1).unwrap();
        let cancel = CancelToken::new();
        let _held = pool.request(&cancel).unwrap();
        let (p2, c2) = (Arc::clone(&pool), cancel.clone());
        let waiter = std::thread::spawn(move || p2.request(&c2).is_err());
        cancel.cancel();
        assert!(waiter.join().unwrap());
    }
}

//! Result partitions: what one producing subtask writes for one data set, with
//! one subpartition per consuming channel.
//!
//! - *Pipelined* subpartitions queue buffers in memory; the consumer reads as
//!   the producer writes. The queue is bounded only by the partition's
//!   [`LocalBufferPool`](crate::LocalBufferPool): buffers return to it when the
//!   consumer drops them.
//! - *Sort-merge* partitions ([`crate::sortmerge`]) write all subpartitions
//!   into one data file with an index; the default for blocking exchanges.
//! - *Hash-blocking* subpartitions append every buffer to a spill file of
//!   their own and recycle it at once; the consumer sees data only after the
//!   producer finished, and then reads the file back buffer by buffer. One
//!   consumer reads a subpartition at a time (a new one starts over).
//!
//! Consumers read through a [`SubpartitionView`] of a subpartition range.
//!
//! A subpartition tells its consumer about new data through an
//! [`AvailabilityListener`], registered by the input gate.

use crate::buffer::{Buffer, lock_state};
use crate::sortmerge::SortMergePartition;
use crate::view::{SubpartitionRangeView, SubpartitionView};
use fluvia_core::{FluviaError, Result};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Control events that travel with the data (they need no buffer budget).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The producer finished this subpartition; nothing follows.
    EndOfPartition,
}

#[derive(Debug)]
pub enum BufferOrEvent {
    Buffer(Buffer),
    Event(Event),
}

/// What comes after the element just taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextKind {
    Nothing,
    Data,
    Event,
}

/// The outcome of [`Subpartition::poll_with_credit`].
#[derive(Debug)]
pub enum CreditPoll {
    /// Nothing readable now.
    Nothing,
    /// The next element is data and there is no credit for it.
    NeedsCredit,
    Item {
        item: BufferOrEvent,
        next: NextKind,
    },
}

/// Told when a subpartition goes from "nothing to read" to "something to read".
pub trait AvailabilityListener: Send + Sync {
    fn notify_available(&self, channel: usize);
}

struct Listener {
    target: Arc<dyn AvailabilityListener>,
    channel: usize,
}

enum Storage {
    Pipelined {
        queue: VecDeque<BufferOrEvent>,
    },
    Blocking {
        path: PathBuf,
        writer: Option<BufWriter<File>>,
        reader: Option<BufReader<File>>,
        /// Set once the producer finished: only then may the consumer read.
        finished: bool,
        end_delivered: bool,
        bytes_written: u64,
        buffers_written: usize,
    },
}

struct SubpartitionState {
    storage: Storage,
    listener: Option<Listener>,
    /// Incremented when a consumer attaches. A blocking subpartition is
    /// re-readable (a restarted consumer reads it again from the start);
    /// polls from an earlier consumer are ignored.
    generation: u64,
    /// Data (not counting a trailing event) written and not yet read.
    buffers_backlog: usize,
    /// A pipelined subpartition whose consumer stopped reading (its join
    /// found an empty build side, its LIMIT was satisfied): what is written
    /// is dropped at once, so the producer never waits for this consumer.
    released: bool,
}

/// One subpartition, shared between the producer and its consumer.
pub struct Subpartition {
    index: usize,
    segment_size: usize,
    state: Mutex<SubpartitionState>,
    /// Mirror of the backlog, readable without the lock (the load-aware
    /// partitioner reads it per record).
    backlog_hint: std::sync::atomic::AtomicUsize,
    /// The partition's record of released and demanded subpartitions
    /// (pipelined only).
    release_state: Option<Arc<ReleaseState>>,
}

impl std::fmt::Debug for Subpartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subpartition")
            .field("index", &self.index)
            .finish()
    }
}

impl Subpartition {
    fn pipelined(index: usize, segment_size: usize, release_state: Arc<ReleaseState>) -> Self {
        Subpartition {
            index,
            segment_size,
            state: Mutex::new(SubpartitionState {
                storage: Storage::Pipelined {
                    queue: VecDeque::new(),
                },
                listener: None,
                generation: 0,
                buffers_backlog: 0,
                released: false,
            }),
            backlog_hint: Default::default(),
            release_state: Some(release_state),
        }
    }

    fn blocking(index: usize, segment_size: usize, path: PathBuf) -> Result<Self> {
        let file = File::create(&path)
            .map_err(|e| FluviaError::io(format!("creating spill file {}", path.display()), e))?;
        Ok(Subpartition {
            index,
            segment_size,
            state: Mutex::new(SubpartitionState {
                storage: Storage::Blocking {
                    path,
                    writer: Some(BufWriter::with_capacity(64 * 1024, file)),
                    reader: None,
                    finished: false,
                    end_delivered: false,
                    bytes_written: 0,
                    buffers_written: 0,
                },
                listener: None,
                generation: 0,
                buffers_backlog: 0,
                released: false,
            }),
            backlog_hint: Default::default(),
            release_state: None,
        })
    }

    pub fn index(&self) -> usize {
        self.index
    }

    /// Registers the consumer and returns its generation. If data is
    /// already readable it is told at once. A new consumer of a blocking
    /// subpartition reads it from the start.
    pub fn set_listener(&self, target: Arc<dyn AvailabilityListener>, channel: usize) -> u64 {
        let mut st = lock_state(&self.state);
        st.generation += 1;
        let generation = st.generation;
        let mut reset_backlog = None;
        let readable = match &mut st.storage {
            Storage::Pipelined { queue } => !queue.is_empty(),
            Storage::Blocking {
                finished,
                reader,
                end_delivered,
                buffers_written,
                ..
            } => {
                *reader = None;
                *end_delivered = false;
                reset_backlog = Some(*buffers_written);
                *finished
            }
        };
        if let Some(b) = reset_backlog {
            st.buffers_backlog = b;
        }
        st.listener = Some(Listener {
            target: Arc::clone(&target),
            channel,
        });
        drop(st);
        if readable {
            target.notify_available(channel);
        }
        generation
    }

    /// The consumer of `generation` will read no more. A pipelined
    /// subpartition drops what it holds and everything written from now on;
    /// a blocking one keeps its data for other readers (a restarted or
    /// speculative consumer reads it from the start).
    pub fn release_consumer(&self, generation: u64) {
        let mut st = lock_state(&self.state);
        if st.generation != generation || st.released {
            return;
        }
        let dropped = match &mut st.storage {
            Storage::Pipelined { queue } => std::mem::take(queue),
            Storage::Blocking { .. } => return,
        };
        st.released = true;
        st.listener = None;
        st.buffers_backlog = 0;
        self.backlog_hint.store(0, Ordering::Relaxed);
        drop(st);
        if let Some(c) = &self.release_state {
            c.one_released();
        }
        // The buffers go back to the producer's pool here, outside the lock.
        drop(dropped);
    }

    /// A consumer is about to read (its first poll): a producer that waits
    /// for demand before it starts may go. Blocking subpartitions ignore it
    /// (their consumers start only once the producer finished).
    pub fn demand(&self) {
        if let Some(c) = &self.release_state {
            c.demanded();
        }
    }

    /// Adds a filled buffer (producer side).
    pub fn add_buffer(&self, buffer: Buffer) -> Result<()> {
        let mut st = lock_state(&self.state);
        if st.released {
            return Ok(());
        }
        let notify = match &mut st.storage {
            Storage::Pipelined { queue } => {
                queue.push_back(BufferOrEvent::Buffer(buffer));
                queue.len() == 1
            }
            Storage::Blocking {
                path,
                writer,
                bytes_written,
                buffers_written,
                ..
            } => {
                let Some(w) = writer.as_mut() else {
                    return Err(FluviaError::Internal(format!(
                        "write to finished blocking subpartition {}",
                        path.display()
                    )));
                };
                let len = buffer.len() as u32;
                w.write_all(&len.to_le_bytes())
                    .and_then(|_| w.write_all(buffer.as_slice()))
                    .map_err(|e| {
                        FluviaError::io(format!("writing spill file {}", path.display()), e)
                    })?;
                *bytes_written += 4 + len as u64;
                *buffers_written += 1;
                // The buffer is recycled here, when it goes out of scope.
                false
            }
        };
        st.buffers_backlog += 1;
        self.backlog_hint
            .store(st.buffers_backlog, std::sync::atomic::Ordering::Relaxed);
        Self::maybe_notify(st, notify);
        Ok(())
    }

    /// Marks the end of data (producer side).
    pub fn finish(&self) -> Result<()> {
        let mut st = lock_state(&self.state);
        if st.released {
            return Ok(());
        }
        let notify = match &mut st.storage {
            Storage::Pipelined { queue } => {
                queue.push_back(BufferOrEvent::Event(Event::EndOfPartition));
                queue.len() == 1
            }
            Storage::Blocking {
                path,
                writer,
                finished,
                ..
            } => {
                if let Some(mut w) = writer.take() {
                    w.flush().map_err(|e| {
                        FluviaError::io(format!("flushing spill file {}", path.display()), e)
                    })?;
                }
                *finished = true;
                true
            }
        };
        Self::maybe_notify(st, notify);
        Ok(())
    }

    fn maybe_notify(st: std::sync::MutexGuard<'_, SubpartitionState>, notify: bool) {
        if notify && let Some(l) = &st.listener {
            let (target, channel) = (Arc::clone(&l.target), l.channel);
            drop(st);
            target.notify_available(channel);
        }
    }

    /// Takes the next buffer or event (consumer side). The flag says whether
    /// more is readable right now.
    pub fn poll(&self) -> Result<Option<(BufferOrEvent, bool)>> {
        Ok(match self.poll_with_credit(true)? {
            CreditPoll::Item { item, next } => Some((item, next != NextKind::Nothing)),
            CreditPoll::Nothing | CreditPoll::NeedsCredit => None,
        })
    }

    /// Like [`poll`](Self::poll) for a sender serving a remote consumer:
    /// without credit only an event may be taken. Reports what comes next,
    /// so the sender knows whether to keep this reader in its queue.
    pub fn poll_with_credit(&self, has_credit: bool) -> Result<CreditPoll> {
        self.poll_as(has_credit, None)
    }

    /// [`poll_with_credit`](Self::poll_with_credit) for the consumer of
    /// `generation`; an earlier consumer gets nothing.
    pub fn poll_as(&self, has_credit: bool, generation: Option<u64>) -> Result<CreditPoll> {
        let mut st = lock_state(&self.state);
        if generation.is_some_and(|g| g != st.generation) {
            return Ok(CreditPoll::Nothing);
        }
        let segment_size = self.segment_size;
        let st = &mut *st;
        match &mut st.storage {
            Storage::Pipelined { queue } => {
                let kind = |b: Option<&BufferOrEvent>| match b {
                    None => NextKind::Nothing,
                    Some(BufferOrEvent::Buffer(_)) => NextKind::Data,
                    Some(BufferOrEvent::Event(_)) => NextKind::Event,
                };
                match kind(queue.front()) {
                    NextKind::Nothing => return Ok(CreditPoll::Nothing),
                    NextKind::Data if !has_credit => return Ok(CreditPoll::NeedsCredit),
                    _ => {}
                }
                let Some(item) = queue.pop_front() else {
                    return Ok(CreditPoll::Nothing);
                };
                if matches!(item, BufferOrEvent::Buffer(_)) {
                    st.buffers_backlog -= 1;
                    self.backlog_hint
                        .store(st.buffers_backlog, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(CreditPoll::Item {
                    item,
                    next: kind(queue.front()),
                })
            }
            Storage::Blocking {
                path,
                reader,
                finished,
                end_delivered,
                ..
            } => {
                if !*finished || *end_delivered {
                    return Ok(CreditPoll::Nothing);
                }
                if !has_credit && st.buffers_backlog > 0 {
                    return Ok(CreditPoll::NeedsCredit);
                }
                if reader.is_none() {
                    let f = File::open(&*path).map_err(|e| {
                        FluviaError::io(format!("opening spill file {}", path.display()), e)
                    })?;
                    *reader = Some(BufReader::with_capacity(segment_size.max(64 * 1024), f));
                }
                let Some(r) = reader.as_mut() else {
                    return Ok(CreditPoll::Nothing);
                };
                match read_spilled_buffer(r, path, segment_size)? {
                    Some(buf) => {
                        st.buffers_backlog = st.buffers_backlog.saturating_sub(1);
                        let next = if st.buffers_backlog > 0 {
                            NextKind::Data
                        } else {
                            NextKind::Event
                        };
                        Ok(CreditPoll::Item {
                            item: BufferOrEvent::Buffer(buf),
                            next,
                        })
                    }
                    None => {
                        *end_delivered = true;
                        *reader = None;
                        Ok(CreditPoll::Item {
                            item: BufferOrEvent::Event(Event::EndOfPartition),
                            next: NextKind::Nothing,
                        })
                    }
                }
            }
        }
    }

    /// The backlog as of the last change, without taking the lock.
    pub fn backlog_hint(&self) -> usize {
        self.backlog_hint.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Buffers written and not yet consumed (Flink's backlog).
    pub fn backlog(&self) -> usize {
        lock_state(&self.state).buffers_backlog
    }
}

fn read_spilled_buffer(
    r: &mut BufReader<File>,
    path: &Path,
    segment_size: usize,
) -> Result<Option<Buffer>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => {
            return Err(FluviaError::io(
                format!("reading spill file {}", path.display()),
                e,
            ));
        }
    }
    let len = u32::from_le_bytes(len) as usize;
    // A buffer is at most a segment: a larger length is corruption, not
    // something to allocate.
    if len > segment_size {
        return Err(FluviaError::Execution(format!(
            "spill file {} is corrupt: a buffer of {len} bytes, more than a segment ({segment_size})",
            path.display()
        )));
    }
    let mut data = vec![0u8; len];
    r.read_exact(&mut data).map_err(|e| {
        FluviaError::io(
            format!("reading spill file {} (truncated buffer)", path.display()),
            e,
        )
    })?;
    Ok(Some(Buffer::from_vec(data)))
}

/// How a partition stores its data.
enum PartitionKind {
    Pipelined,
    /// One spill file per subpartition (the baseline sort-merge replaces;
    /// kept for partitions below `taskmanager.network.sort-shuffle.min-parallelism`).
    HashBlocking {
        spill_files: Vec<PathBuf>,
    },
    SortMerge(Arc<SortMergePartition>),
}

/// How many subpartitions of one pipelined partition their consumers
/// released, whether any consumer asked for data yet, and who to tell once
/// all were released or the first asked.
struct ReleaseState {
    count: AtomicUsize,
    total: usize,
    demanded: AtomicBool,
    watchers: Mutex<Vec<Arc<dyn Fn() + Send + Sync>>>,
}

impl ReleaseState {
    fn one_released(&self) {
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.total {
            self.wake_watchers();
        }
    }

    fn demanded(&self) {
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
    partitions: Vec<Arc<ReleaseState>>,
}

impl std::fmt::Debug for ConsumersReleased {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumersReleased")
            .field("all", &self.all())
            .finish()
    }
}

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

/// What one producing subtask writes for one data set.
pub struct ResultPartition {
    name: String,
    num_subpartitions: usize,
    /// Empty for a sort-merge partition.
    subpartitions: Vec<Arc<Subpartition>>,
    kind: PartitionKind,
    /// Subpartitions whose consumer released them (pipelined only).
    release_state: Option<Arc<ReleaseState>>,
}

impl std::fmt::Debug for ResultPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResultPartition")
            .field("name", &self.name)
            .field("blocking", &self.is_blocking())
            .field("subpartitions", &self.num_subpartitions)
            .finish()
    }
}

impl ResultPartition {
    pub fn pipelined(
        name: impl Into<String>,
        num_subpartitions: usize,
        segment_size: usize,
    ) -> Self {
        let release_state = Arc::new(ReleaseState {
            count: AtomicUsize::new(0),
            total: num_subpartitions,
            demanded: AtomicBool::new(false),
            watchers: Mutex::new(Vec::new()),
        });
        ResultPartition {
            name: name.into(),
            num_subpartitions,
            subpartitions: (0..num_subpartitions)
                .map(|i| {
                    Arc::new(Subpartition::pipelined(
                        i,
                        segment_size,
                        Arc::clone(&release_state),
                    ))
                })
                .collect(),
            kind: PartitionKind::Pipelined,
            release_state: Some(release_state),
        }
    }

    /// A blocking partition with one spill file per subpartition,
    /// `dir/<file_prefix>-<subpartition>.spill`.
    pub fn blocking(
        name: impl Into<String>,
        num_subpartitions: usize,
        segment_size: usize,
        dir: &Path,
        file_prefix: &str,
    ) -> Result<Self> {
        let mut subpartitions = Vec::with_capacity(num_subpartitions);
        let mut spill_files = Vec::with_capacity(num_subpartitions);
        for i in 0..num_subpartitions {
            let path = dir.join(format!("{file_prefix}-{i}.spill"));
            subpartitions.push(Arc::new(Subpartition::blocking(
                i,
                segment_size,
                path.clone(),
            )?));
            spill_files.push(path);
        }
        Ok(ResultPartition {
            name: name.into(),
            num_subpartitions,
            subpartitions,
            kind: PartitionKind::HashBlocking { spill_files },
            release_state: None,
        })
    }

    /// A sort-merge blocking partition (one data and one index file).
    pub fn sort_merge(partition: Arc<SortMergePartition>) -> Self {
        ResultPartition {
            name: partition.name().to_string(),
            num_subpartitions: partition.num_subpartitions(),
            subpartitions: Vec::new(),
            kind: PartitionKind::SortMerge(partition),
            release_state: None,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn is_blocking(&self) -> bool {
        !matches!(self.kind, PartitionKind::Pipelined)
    }

    pub fn num_subpartitions(&self) -> usize {
        self.num_subpartitions
    }

    /// The sort-merge storage, if this partition is one.
    pub fn as_sort_merge(&self) -> Option<&Arc<SortMergePartition>> {
        match &self.kind {
            PartitionKind::SortMerge(p) => Some(p),
            _ => None,
        }
    }

    /// Subpartition `i` of a pipelined or hash-blocking partition.
    pub fn subpartition(&self, i: usize) -> &Arc<Subpartition> {
        &self.subpartitions[i]
    }

    /// Subpartition `i`, or `None` if out of range or stored sort-merge.
    pub fn get_subpartition(&self, i: usize) -> Option<&Arc<Subpartition>> {
        self.subpartitions.get(i)
    }

    /// Checks a requested range `first..=last` (from the network or a
    /// descriptor) against this partition.
    pub fn check_range(&self, first: u32, last: u32) -> Result<()> {
        if first > last || last as usize >= self.num_subpartitions {
            return Err(FluviaError::Execution(format!(
                "subpartitions {first}..={last} requested from partition {}, which has {}",
                self.name, self.num_subpartitions
            )));
        }
        Ok(())
    }

    /// A new consumer's view of `first..=last`; `listener` hears of data as
    /// `channel`.
    pub fn create_view(
        &self,
        first: u32,
        last: u32,
        listener: Arc<dyn AvailabilityListener>,
        channel: usize,
    ) -> Result<Arc<dyn SubpartitionView>> {
        self.check_range(first, last)?;
        Ok(match &self.kind {
            PartitionKind::SortMerge(p) => p.create_view(first, last, listener, channel),
            _ => SubpartitionRangeView::attach(
                first,
                self.subpartitions[first as usize..=last as usize].to_vec(),
                listener,
                channel,
            ),
        })
    }

    /// Whether every consumer of this pipelined partition stopped reading,
    /// readable from any thread: whatever the producer writes from now on
    /// reaches nobody, so it may stop early. `None` for a blocking
    /// partition, whose data outlives its readers.
    pub fn consumers_released(&self) -> Option<ConsumersReleased> {
        self.release_state.as_ref().map(|c| ConsumersReleased {
            partitions: vec![Arc::clone(c)],
        })
    }

    /// Ends every subpartition (a sort-merge partition is finished by its
    /// writer).
    pub fn finish(&self) -> Result<()> {
        for s in &self.subpartitions {
            s.finish()?;
        }
        Ok(())
    }
}

impl Drop for ResultPartition {
    fn drop(&mut self) {
        if let PartitionKind::HashBlocking { spill_files } = &self.kind {
            for f in spill_files {
                let _ = std::fs::remove_file(f);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Count(std::sync::atomic::AtomicUsize);
    impl AvailabilityListener for Count {
        fn notify_available(&self, _channel: usize) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn bytes(b: &BufferOrEvent) -> Vec<u8> {
        match b {
            BufferOrEvent::Buffer(b) => b.as_slice().to_vec(),
            BufferOrEvent::Event(_) => vec![],
        }
    }

    #[test]
    fn pipelined_notifies_on_first_buffer_and_keeps_order() {
        let p = ResultPartition::pipelined("p", 1, 1024);
        let l = Arc::new(Count(Default::default()));
        p.subpartition(0).set_listener(l.clone(), 0);
        p.subpartition(0)
            .add_buffer(Buffer::from_vec(vec![1]))
            .unwrap();
        p.subpartition(0)
            .add_buffer(Buffer::from_vec(vec![2]))
            .unwrap();
        assert_eq!(l.0.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(p.subpartition(0).backlog(), 2);
        p.finish().unwrap();
        let (a, more) = p.subpartition(0).poll().unwrap().unwrap();
        assert!(more);
        assert_eq!(bytes(&a), vec![1]);
        let (b, _) = p.subpartition(0).poll().unwrap().unwrap();
        assert_eq!(bytes(&b), vec![2]);
        let (e, more) = p.subpartition(0).poll().unwrap().unwrap();
        assert!(matches!(e, BufferOrEvent::Event(Event::EndOfPartition)) && !more);
    }

    #[test]
    fn a_blocking_subpartition_can_be_read_again_by_a_new_consumer() {
        let dir = tempfile::tempdir().unwrap();
        let p = ResultPartition::blocking("p", 1, 1024, dir.path(), "ds").unwrap();
        for i in 0..3u8 {
            p.subpartition(0)
                .add_buffer(Buffer::from_vec(vec![i]))
                .unwrap();
        }
        p.finish().unwrap();
        let l = Arc::new(Count(Default::default()));
        let first = p.subpartition(0).set_listener(l.clone(), 0);
        let (a, _) = p.subpartition(0).poll().unwrap().unwrap();
        assert_eq!(bytes(&a), vec![0]);
        // A restarted consumer attaches: it reads from the start, and the
        // earlier one gets nothing more.
        let second = p.subpartition(0).set_listener(l, 0);
        assert!(matches!(
            p.subpartition(0).poll_as(true, Some(first)).unwrap(),
            CreditPoll::Nothing
        ));
        let mut got = Vec::new();
        while let CreditPoll::Item { item, .. } =
            p.subpartition(0).poll_as(true, Some(second)).unwrap()
        {
            got.push(bytes(&item));
        }
        assert_eq!(got, vec![vec![0], vec![1], vec![2], vec![]]);
    }

    #[test]
    fn a_spill_file_claiming_a_huge_buffer_is_an_error_not_an_allocation() {
        let dir = tempfile::tempdir().unwrap();
        let p = ResultPartition::blocking("p", 1, 1024, dir.path(), "ds").unwrap();
        p.subpartition(0)
            .add_buffer(Buffer::from_vec(vec![1, 2, 3]))
            .unwrap();
        p.finish().unwrap();
        // 4 GiB - 1 claimed by the first length prefix.
        let path = dir.path().join("ds-0.spill");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(&path, bytes).unwrap();
        let l = Arc::new(Count(Default::default()));
        p.subpartition(0).set_listener(l, 0);
        let err = p.subpartition(0).poll().unwrap_err().to_string();
        assert!(err.contains("ds-0.spill is corrupt"), "{err}");
    }

    #[test]
    fn blocking_is_unreadable_until_finished_and_spills_to_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = ResultPartition::blocking("p", 2, 1024, dir.path(), "ds").unwrap();
        let l = Arc::new(Count(Default::default()));
        p.subpartition(1).set_listener(l.clone(), 7);
        p.subpartition(1)
            .add_buffer(Buffer::from_vec(vec![9, 9]))
            .unwrap();
        assert!(p.subpartition(1).poll().unwrap().is_none());
        assert_eq!(l.0.load(std::sync::atomic::Ordering::SeqCst), 0);
        p.finish().unwrap();
        assert_eq!(l.0.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(
            std::fs::metadata(dir.path().join("ds-1.spill"))
                .unwrap()
                .len()
                >= 6
        );
        let (a, _) = p.subpartition(1).poll().unwrap().unwrap();
        assert_eq!(bytes(&a), vec![9, 9]);
        let (e, _) = p.subpartition(1).poll().unwrap().unwrap();
        assert!(matches!(e, BufferOrEvent::Event(Event::EndOfPartition)));
        drop(p);
        assert!(!dir.path().join("ds-1.spill").exists());
    }

    #[test]
    fn releasing_drops_pipelined_data_but_a_blocking_partition_keeps_its_own() {
        let p = ResultPartition::pipelined("p", 1, 1024);
        let l = Arc::new(Count(Default::default()));
        let generation = p.subpartition(0).set_listener(l.clone(), 0);
        let b = Buffer::from_vec(vec![1]);
        let held = b.clone();
        p.subpartition(0).add_buffer(b).unwrap();
        assert_eq!(held.ref_count(), 2);
        // An earlier consumer's release changes nothing.
        p.subpartition(0).release_consumer(generation + 1);
        assert!(!p.consumers_released().unwrap().all());
        p.subpartition(0).release_consumer(generation);
        assert!(p.consumers_released().unwrap().all());
        assert_eq!(held.ref_count(), 1, "the queued buffer was dropped");
        assert_eq!(p.subpartition(0).backlog(), 0);
        p.subpartition(0)
            .add_buffer(Buffer::from_vec(vec![2]))
            .unwrap();
        p.finish().unwrap();
        assert!(p.subpartition(0).poll().unwrap().is_none());

        let dir = tempfile::tempdir().unwrap();
        let b = ResultPartition::blocking("b", 1, 1024, dir.path(), "ds").unwrap();
        let generation = b.subpartition(0).set_listener(l.clone(), 0);
        b.subpartition(0)
            .add_buffer(Buffer::from_vec(vec![3]))
            .unwrap();
        b.finish().unwrap();
        b.subpartition(0).release_consumer(generation);
        assert!(b.consumers_released().is_none());
        b.subpartition(0).set_listener(l, 0);
        let (a, _) = b.subpartition(0).poll().unwrap().unwrap();
        assert_eq!(bytes(&a), vec![3], "a new reader still reads it");
    }
}

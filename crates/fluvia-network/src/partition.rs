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

use crate::availability::AvailabilityListener;
use crate::release::ReleaseState;
use crate::sortmerge::SortMergePartition;
use crate::view::{SubpartitionRangeView, SubpartitionView};
use fluvia_core::{FluviaError, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};

pub use crate::event::{BufferOrEvent, Event, NextKind};
pub use crate::release::ConsumersReleased;
pub use crate::subpartition::{CreditPoll, Subpartition};

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

debug_fields!(ResultPartition, |this| {
    name: this.name,
    blocking: this.is_blocking(),
    subpartitions: this.num_subpartitions,
});

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
    /// Adds a buffer of `bytes` to subpartition `index` (tests).
    #[cfg(test)]
    pub(crate) fn add_test_buffer(&self, index: usize, bytes: Vec<u8>) {
        self.subpartition(index)
            .add_buffer(crate::buffer::Buffer::from_vec(bytes))
            .unwrap();
    }

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

    /// Writes `event` into every subpartition (Flink's `broadcastEvent`).
    /// The caller hands over its partly filled buffers first when the event
    /// must follow them ([`PartitionWriter::broadcast_event`](crate::PartitionWriter::broadcast_event)
    /// does). Only pipelined partitions carry events.
    pub fn broadcast_event(&self, event: &Event) -> Result<()> {
        if !matches!(self.kind, PartitionKind::Pipelined) {
            return Err(FluviaError::Internal(format!(
                "event {event:?} written to blocking partition {}: blocking exchanges carry no events",
                self.name
            )));
        }
        for sp in &self.subpartitions {
            sp.add_event(event.clone())?;
        }
        Ok(())
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
    use crate::buffer::Buffer;

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
        p.add_test_buffer(0, vec![1]);
        p.add_test_buffer(0, vec![2]);
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
            p.add_test_buffer(0, vec![i]);
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
        p.add_test_buffer(0, vec![1, 2, 3]);
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
        p.add_test_buffer(1, vec![9, 9]);
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
        p.add_test_buffer(0, vec![2]);
        p.finish().unwrap();
        assert!(p.subpartition(0).poll().unwrap().is_none());

        let dir = tempfile::tempdir().unwrap();
        let b = ResultPartition::blocking("b", 1, 1024, dir.path(), "ds").unwrap();
        let generation = b.subpartition(0).set_listener(l.clone(), 0);
        b.add_test_buffer(0, vec![3]);
        b.finish().unwrap();
        b.subpartition(0).release_consumer(generation);
        assert!(b.consumers_released().is_none());
        b.subpartition(0).set_listener(l, 0);
        let (a, _) = b.subpartition(0).poll().unwrap().unwrap();
        assert_eq!(bytes(&a), vec![3], "a new reader still reads it");
    }
}

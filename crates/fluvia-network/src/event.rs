//! Events in the data plane: what travels between a producer and its
//! consumers besides buffers of records (Flink's `AbstractEvent`s and the
//! in-band stream elements a task's input processor must see).
//!
//! Events cost no credit: a consumer that has no buffer to spare still
//! receives them. An event is either in order with the data around it, or a
//! *priority* event ([`Event::is_priority`], an unaligned checkpoint barrier)
//! that overtakes the buffers queued before it in a subpartition, on the
//! wire and in the receiving channel.
//!
//! This module knows nothing of subpartitions, gates or sockets; it only
//! defines the events and their byte form ([`Event::encode`] /
//! [`Event::decode`], total on any input).

use crate::buffer::Buffer;
use crate::byte_reader::{ByteReader, Truncation, decode_error};

/// Whether a snapshot is a checkpoint (owned and subsumed by the system) or
/// a savepoint (owned by the user).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SnapshotType {
    Checkpoint,
    Savepoint,
}

/// How a barrier is to be aligned at a task with several input channels
/// (Flink's `CheckpointOptions.AlignmentType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlignmentType {
    /// Exactly-once with alignment: a channel whose barrier arrived is
    /// blocked until all channels delivered theirs.
    Aligned,
    /// Exactly-once without alignment: the barrier overtakes buffered data
    /// (a priority event), which becomes part of the snapshot.
    Unaligned,
    /// Unaligned checkpoints are enabled but this barrier must be aligned
    /// (a savepoint).
    ForcedAligned,
    /// At-least-once: no channel is blocked; the snapshot is taken when the
    /// last barrier arrives.
    AtLeastOnce,
}

/// What a checkpoint barrier asks of the tasks it passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CheckpointOptions {
    pub snapshot_type: SnapshotType,
    pub alignment: AlignmentType,
}

impl CheckpointOptions {
    /// An aligned, exactly-once checkpoint (Flink's default).
    pub fn aligned() -> Self {
        CheckpointOptions {
            snapshot_type: SnapshotType::Checkpoint,
            alignment: AlignmentType::Aligned,
        }
    }

    /// An unaligned checkpoint.
    pub fn unaligned() -> Self {
        CheckpointOptions {
            snapshot_type: SnapshotType::Checkpoint,
            alignment: AlignmentType::Unaligned,
        }
    }
}

/// A checkpoint barrier: every record before it belongs to checkpoint
/// `id`, every record after it to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CheckpointBarrier {
    pub id: u64,
    /// When the checkpoint coordinator triggered it (ms since the epoch).
    pub timestamp: i64,
    pub options: CheckpointOptions,
}

/// Whether a stream is idle (its watermark does not hold back the
/// minimum over the inputs of a consumer) or active.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WatermarkStatus {
    Idle,
    Active,
}

/// Why a producer ends its data (Flink's `StopMode` on `EndOfData`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopMode {
    /// All data was produced; event-time operators flush (a bounded end,
    /// or stop-with-savepoint with `--drain`).
    Drain,
    /// The job is stopped for a savepoint and resumes later: nothing flushes.
    NoDrain,
}

/// One event, as it travels with the buffers of a subpartition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The producer finished this subpartition; nothing follows.
    EndOfPartition,
    /// The producer will send no more records (it may still send
    /// barriers until its partition ends).
    EndOfData(StopMode),
    CheckpointBarrier(CheckpointBarrier),
    /// Checkpoint `id` was abandoned upstream: a task aligning for it
    /// stops and unblocks its channels.
    CancelCheckpointMarker {
        checkpoint_id: u64,
    },
    /// Event time: no record with a smaller timestamp follows (ms).
    Watermark(i64),
    WatermarkStatus(WatermarkStatus),
    /// An event the runtime does not interpret, for operators and
    /// connectors (`kind` says which).
    User {
        kind: u32,
        payload: Vec<u8>,
    },
}

impl Event {
    /// Whether the event overtakes data queued before it: an unaligned
    /// checkpoint barrier.
    pub fn is_priority(&self) -> bool {
        matches!(
            self,
            Event::CheckpointBarrier(CheckpointBarrier {
                options: CheckpointOptions {
                    alignment: AlignmentType::Unaligned,
                    ..
                },
                ..
            })
        )
    }

    /// Appends the event's byte form to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Event::EndOfPartition => out.push(0),
            Event::EndOfData(mode) => {
                out.push(1);
                out.push(match mode {
                    StopMode::Drain => 0,
                    StopMode::NoDrain => 1,
                });
            }
            Event::CheckpointBarrier(b) => {
                out.push(2);
                out.extend_from_slice(&b.id.to_be_bytes());
                out.extend_from_slice(&b.timestamp.to_be_bytes());
                out.push(match b.options.snapshot_type {
                    SnapshotType::Checkpoint => 0,
                    SnapshotType::Savepoint => 1,
                });
                out.push(match b.options.alignment {
                    AlignmentType::Aligned => 0,
                    AlignmentType::Unaligned => 1,
                    AlignmentType::ForcedAligned => 2,
                    AlignmentType::AtLeastOnce => 3,
                });
            }
            Event::CancelCheckpointMarker { checkpoint_id } => {
                out.push(3);
                out.extend_from_slice(&checkpoint_id.to_be_bytes());
            }
            Event::Watermark(ts) => {
                out.push(4);
                out.extend_from_slice(&ts.to_be_bytes());
            }
            Event::WatermarkStatus(s) => {
                out.push(5);
                out.push(match s {
                    WatermarkStatus::Idle => 0,
                    WatermarkStatus::Active => 1,
                });
            }
            Event::User { kind, payload } => {
                out.push(6);
                out.extend_from_slice(&kind.to_be_bytes());
                out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
                out.extend_from_slice(payload);
            }
        }
    }

    /// The byte form of the event, as a vector.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24);
        self.encode(&mut out);
        out
    }

    /// Reads an event written by [`encode`](Self::encode); any other input
    /// is an error naming what is wrong, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Event, EventDecodeError> {
        let mut r = Cursor::new(bytes, EventBytes);
        let event = match r.u8()? {
            0 => Event::EndOfPartition,
            1 => Event::EndOfData(
                r.one_of(&[StopMode::Drain, StopMode::NoDrain], "unknown stop mode")?,
            ),
            2 => {
                let id = r.u64()?;
                let timestamp = r.u64()? as i64;
                let snapshot_type = r.one_of(
                    &[SnapshotType::Checkpoint, SnapshotType::Savepoint],
                    "unknown snapshot type",
                )?;
                let alignment = r.one_of(
                    &[
                        AlignmentType::Aligned,
                        AlignmentType::Unaligned,
                        AlignmentType::ForcedAligned,
                        AlignmentType::AtLeastOnce,
                    ],
                    "unknown alignment type",
                )?;
                Event::CheckpointBarrier(CheckpointBarrier {
                    id,
                    timestamp,
                    options: CheckpointOptions {
                        snapshot_type,
                        alignment,
                    },
                })
            }
            3 => Event::CancelCheckpointMarker {
                checkpoint_id: r.u64()?,
            },
            4 => Event::Watermark(r.u64()? as i64),
            5 => Event::WatermarkStatus(r.one_of(
                &[WatermarkStatus::Idle, WatermarkStatus::Active],
                "unknown watermark status",
            )?),
            6 => {
                let kind = r.u32()?;
                let len = r.u32()? as usize;
                Event::User {
                    kind,
                    payload: r.take(len)?.to_vec(),
                }
            }
            t => return Err(r.error(format!("unknown event tag {t}"))),
        };
        if r.remaining() != 0 {
            return Err(r.error(format!("{} trailing bytes", r.remaining())));
        }
        Ok(event)
    }
}

decode_error!(
    /// An event's bytes could not be read.
    EventDecodeError,
    "malformed event"
);

/// Event decoding errors say at which byte they arose.
struct EventBytes;

impl Truncation for EventBytes {
    type Error = EventDecodeError;
    fn truncated(&self, needed: usize, at: usize, has: usize) -> EventDecodeError {
        at_byte(format!("truncated: needs {needed} bytes, has {has}"), at)
    }
    fn invalid(&self, message: String, at: usize) -> EventDecodeError {
        at_byte(message, at)
    }
}

fn at_byte(what: String, pos: usize) -> EventDecodeError {
    EventDecodeError(format!("{what} (at byte {pos})"))
}

type Cursor<'a> = ByteReader<'a, EventBytes>;

impl Cursor<'_> {
    fn error(&self, what: String) -> EventDecodeError {
        at_byte(what, self.pos)
    }
}

/// One element of a subpartition's queue.
#[derive(Debug)]
pub enum BufferOrEvent {
    Buffer(Buffer),
    Event(Event),
}

impl BufferOrEvent {
    /// Whether this is a priority event (it overtakes queued data).
    pub fn is_priority(&self) -> bool {
        matches!(self, BufferOrEvent::Event(e) if e.is_priority())
    }
}

/// Adds `item` to a queue of elements not yet handed out: a priority one
/// (`priority`) ahead of all queued data, behind earlier priority events
/// (`is_priority`); anything else at the end.
pub(crate) fn push_in_priority_order<T>(
    queue: &mut std::collections::VecDeque<T>,
    item: T,
    priority: bool,
    is_priority: impl Fn(&T) -> bool,
) {
    if priority {
        let at = queue.iter().take_while(|e| is_priority(e)).count();
        queue.insert(at, item);
    } else {
        queue.push_back(item);
    }
}

/// What comes after the element just taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextKind {
    Nothing,
    Data,
    Event,
}

impl NextKind {
    /// The kind of `next`, the element that follows.
    pub fn of(next: Option<&BufferOrEvent>) -> NextKind {
        match next {
            None => NextKind::Nothing,
            Some(BufferOrEvent::Buffer(_)) => NextKind::Data,
            Some(BufferOrEvent::Event(_)) => NextKind::Event,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_kinds() -> Vec<Event> {
        vec![
            Event::EndOfPartition,
            Event::EndOfData(StopMode::Drain),
            Event::EndOfData(StopMode::NoDrain),
            Event::CheckpointBarrier(CheckpointBarrier {
                id: 7,
                timestamp: -3,
                options: CheckpointOptions::aligned(),
            }),
            Event::CheckpointBarrier(CheckpointBarrier {
                id: u64::MAX,
                timestamp: i64::MAX,
                options: CheckpointOptions {
                    snapshot_type: SnapshotType::Savepoint,
                    alignment: AlignmentType::ForcedAligned,
                },
            }),
            Event::CheckpointBarrier(CheckpointBarrier {
                id: 1,
                timestamp: 0,
                options: CheckpointOptions::unaligned(),
            }),
            Event::CancelCheckpointMarker { checkpoint_id: 9 },
            Event::Watermark(i64::MIN),
            Event::Watermark(1_700_000_000_000),
            Event::WatermarkStatus(WatermarkStatus::Idle),
            Event::WatermarkStatus(WatermarkStatus::Active),
            Event::User {
                kind: 3,
                payload: b"split-request".to_vec(),
            },
        ]
    }

    #[test]
    fn every_event_round_trips() {
        for e in all_kinds() {
            assert_eq!(Event::decode(&e.to_bytes()), Ok(e.clone()), "{e:?}");
        }
    }

    #[test]
    fn only_unaligned_barriers_are_priority() {
        let priority: Vec<bool> = all_kinds().iter().map(Event::is_priority).collect();
        assert_eq!(priority.iter().filter(|p| **p).count(), 1);
        assert!(all_kinds()[5].is_priority());
    }

    #[test]
    fn truncated_or_trailing_or_unknown_bytes_are_errors() {
        for e in all_kinds() {
            let bytes = e.to_bytes();
            for cut in 0..bytes.len() {
                assert!(Event::decode(&bytes[..cut]).is_err(), "{e:?} cut at {cut}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(Event::decode(&longer).is_err());
        }
        let err = Event::decode(&[42]).unwrap_err();
        assert!(err.to_string().contains("unknown event tag 42"), "{err}");
        // A user event claiming more payload than there is.
        let err = Event::decode(&[6, 0, 0, 0, 1, 255, 255, 255, 255]).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
    }
}

//! Sources as Flink's FLIP-27 splits them: a [`SplitEnumerator`] on the
//! JobManager (inside a [`SourceCoordinator`]) hands splits to the readers
//! that ask for them, and the readers in the tasks read them.
//!
//! - A reader asks for a split when it has none left
//!   ([`SourceEvent::RequestSplit`]); a fast reader therefore takes more.
//! - Splits are assigned to a *subtask*: every attempt of it (a speculative
//!   one, or one started while another runs) is sent the same splits, in
//!   the same order, so all attempts produce the same data.
//! - A new attempt of a subtask (a restart without a checkpoint to restore)
//!   is sent, at its first request, every split the subtask was given: it
//!   reads what its subtask owns. With a checkpoint to restore, a subtask
//!   that starts over is *reset* instead: the splits given since go back to
//!   the enumerator, for whichever reader asks next.
//!
//! The protocol's events travel as bytes ([`SourceEvent::encode`]). Split
//! types are the enumerator's business: here a split is its bytes.

/// `encode` and `decode` of a message between a source's coordinator and
/// its readers (bincode; a malformed one is a serialization error naming
/// `$what`).
macro_rules! wire_codec {
    ($ty:ident, $what:literal) => {
        impl $ty {
            pub fn encode(&self) -> Vec<u8> {
                bincode::serialize(self).unwrap_or_default()
            }

            pub fn decode(bytes: &[u8]) -> Result<$ty> {
                bincode::deserialize(bytes).map_err(|e| {
                    FluviaError::Serialization(format!(concat!("malformed ", $what, ": {}"), e))
                })
            }
        }
    };
}

pub mod file;

use crate::coordinator::{CoordinatorRegistry, OperatorCoordinator, Outbox};
use fluvia_core::{FluviaError, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The coordinator kinds every JobManager knows: the built-in sources'.
pub fn builtin_coordinators() -> CoordinatorRegistry {
    let mut r = CoordinatorRegistry::default();
    r.register(
        file::FILE_SOURCE_COORDINATOR,
        std::sync::Arc::new(|config: &[u8], parallelism: usize| {
            file::file_source_coordinator(config, parallelism)
        }),
    );
    r
}

/// Operator events between a source reader and its coordinator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SourceEvent {
    /// Reader → coordinator: give me a split.
    RequestSplit,
    /// Coordinator → reader: splits to read, in order.
    AddSplits(Vec<Vec<u8>>),
    /// Coordinator → reader: no split will come any more.
    NoMoreSplits,
}

wire_codec!(SourceEvent, "source event");

/// What an enumerator decides for a request: a split, or that none is left.
pub trait SplitEnumerator: Send {
    /// The next split for `subtask`, or `None` when none is left.
    fn next_split(&mut self, subtask: usize) -> Option<Vec<u8>>;
    /// Splits given to `subtask` that must be read again (it starts over).
    fn add_splits_back(&mut self, splits: Vec<Vec<u8>>, subtask: usize);
    /// The splits not handed out yet, for a checkpoint (taken with the
    /// coordinator's, before the checkpoint's barriers start).
    fn snapshot(&self) -> Vec<Vec<u8>>;
    /// Become what [`snapshot`](Self::snapshot) returned.
    fn restore(&mut self, splits: Vec<Vec<u8>>);
}

#[derive(Debug, Default)]
struct SubtaskSplits {
    /// Every split assigned to the subtask, in order.
    assigned: Vec<Vec<u8>>,
    no_more: bool,
    /// Live attempts.
    attempts: Vec<u32>,
}

/// The coordinator of a FLIP-27 source: runs its enumerator and keeps
/// every attempt of a subtask on the same splits.
pub struct SourceCoordinator<E> {
    enumerator: E,
    subtasks: BTreeMap<usize, SubtaskSplits>,
    parallelism: usize,
}

impl<E: SplitEnumerator> SourceCoordinator<E> {
    pub fn new(enumerator: E, parallelism: usize) -> Self {
        SourceCoordinator {
            enumerator,
            subtasks: BTreeMap::new(),
            parallelism,
        }
    }

    pub fn enumerator(&self) -> &E {
        &self.enumerator
    }

    /// The splits assigned to `subtask` so far.
    pub fn assigned(&self, subtask: usize) -> &[Vec<u8>] {
        self.subtasks
            .get(&subtask)
            .map_or(&[], |s| s.assigned.as_slice())
    }

    fn check(&self, subtask: usize) -> Result<()> {
        if subtask >= self.parallelism {
            return Err(FluviaError::Execution(format!(
                "source subtask {subtask} does not exist (parallelism {})",
                self.parallelism
            )));
        }
        Ok(())
    }
}

impl<E: SplitEnumerator> OperatorCoordinator for SourceCoordinator<E> {
    fn attempt_ready(&mut self, subtask: usize, attempt: u32, out: &mut Outbox) -> Result<()> {
        self.check(subtask)?;
        let s = self.subtasks.entry(subtask).or_default();
        if !s.attempts.contains(&attempt) {
            s.attempts.push(attempt);
        }
        // A later attempt replays what the subtask was given.
        if !s.assigned.is_empty() {
            out.send(
                subtask,
                attempt,
                SourceEvent::AddSplits(s.assigned.clone()).encode(),
            );
        }
        if s.no_more {
            out.send(subtask, attempt, SourceEvent::NoMoreSplits.encode());
        }
        Ok(())
    }

    fn handle_event(
        &mut self,
        subtask: usize,
        attempt: u32,
        event: &[u8],
        out: &mut Outbox,
    ) -> Result<()> {
        self.check(subtask)?;
        match SourceEvent::decode(event)? {
            SourceEvent::RequestSplit => {
                let known = self
                    .subtasks
                    .get(&subtask)
                    .is_some_and(|s| s.attempts.contains(&attempt));
                if !known {
                    // A new attempt (speculative, or a restart): it is sent
                    // what its subtask was given, which answers its request
                    // unless the subtask was given nothing yet.
                    self.attempt_ready(subtask, attempt, out)?;
                    if !out.is_empty() {
                        return Ok(());
                    }
                }
                let s = self.subtasks.entry(subtask).or_default();
                if s.no_more {
                    out.send(subtask, attempt, SourceEvent::NoMoreSplits.encode());
                    return Ok(());
                }
                let event = match self.enumerator.next_split(subtask) {
                    Some(split) => {
                        s.assigned.push(split.clone());
                        SourceEvent::AddSplits(vec![split])
                    }
                    None => {
                        s.no_more = true;
                        SourceEvent::NoMoreSplits
                    }
                };
                let bytes = event.encode();
                for &a in &s.attempts {
                    out.send(subtask, a, bytes.clone());
                }
                Ok(())
            }
            other => Err(FluviaError::Execution(format!(
                "source subtask {subtask} sent its coordinator {other:?}"
            ))),
        }
    }

    fn attempt_failed(&mut self, subtask: usize, attempt: u32, _out: &mut Outbox) -> Result<()> {
        if let Some(s) = self.subtasks.get_mut(&subtask) {
            s.attempts.retain(|a| *a != attempt);
        }
        Ok(())
    }

    fn subtask_reset(&mut self, subtask: usize, _out: &mut Outbox) -> Result<()> {
        if let Some(s) = self.subtasks.remove(&subtask)
            && !s.assigned.is_empty()
        {
            self.enumerator.add_splits_back(s.assigned, subtask);
        }
        Ok(())
    }

    /// The splits not handed out yet. What readers hold is in their own
    /// state; events sent before this snapshot reach them before the
    /// checkpoint's trigger does (one ordered queue per TaskManager).
    fn checkpoint(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>> {
        bincode::serialize(&self.enumerator.snapshot()).map_err(|e| {
            FluviaError::Serialization(format!("encoding the split enumerator's state: {e}"))
        })
    }

    fn reset_to_checkpoint(&mut self, checkpoint_id: u64, state: &[u8]) -> Result<()> {
        let splits: Vec<Vec<u8>> = bincode::deserialize(state).map_err(|e| {
            FluviaError::Serialization(format!(
                "the split enumerator's state in checkpoint {checkpoint_id} is corrupt: {e}"
            ))
        })?;
        self.enumerator.restore(splits);
        self.subtasks.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests;

//! What a checkpoint moves between a task and the JobManager's checkpoint
//! coordinator, in one shape on both sides: handles of the state a subtask
//! wrote ([`StateHandle`], [`OperatorSubtaskState`], Flink's names), what a
//! task acknowledges ([`TaskCheckpointAck`]: its [`TaskStateSnapshot`] with
//! [`SubtaskCheckpointMetrics`]) or declines, one operator's state in a
//! completed checkpoint ([`OperatorState`]) and what a redeployed subtask
//! restores from ([`TaskRestore`], Flink's `JobManagerTaskRestore`).
//!
//! Handles only name where state lives (a path, or a few inline bytes);
//! nothing here reads or writes it (the state crate does), and nothing here
//! knows the coordinator's bookkeeping.

use crate::ids::ExecutionAttemptId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// A subtask of the job: vertex index (topological order, as in the
/// ExecutionGraph) and subtask index — Flink's `ExecutionVertexID`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TaskId {
    pub vertex: usize,
    pub subtask: usize,
}

impl TaskId {
    pub fn new(vertex: usize, subtask: usize) -> Self {
        TaskId { vertex, subtask }
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.vertex, self.subtask)
    }
}

/// One attempt of a subtask (the `attempt` of an `ExecutionAttemptId`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TaskAttempt {
    pub task: TaskId,
    pub attempt: u32,
}

/// An operator's stable identity across runs: its uid (or the hash Flink
/// derives from its position when it has none). State is matched by it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OperatorId(pub String);

impl OperatorId {
    pub fn new(uid: impl Into<String>) -> Self {
        OperatorId(uid.into())
    }
}

impl fmt::Display for OperatorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Key groups `start..=end` (Flink's `KeyGroupRange`, both ends included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyGroupRange {
    pub start: u32,
    pub end: u32,
}

impl KeyGroupRange {
    pub fn len(&self) -> u32 {
        if self.end < self.start {
            0
        } else {
            self.end - self.start + 1
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key groups subtask `index` of `parallelism` owns under
    /// `max_parallelism` (Flink's
    /// `computeKeyGroupRangeForOperatorIndex`).
    pub fn for_subtask(max_parallelism: u32, parallelism: u32, index: u32) -> Self {
        let (maxp, p, i) = (
            u64::from(max_parallelism),
            u64::from(parallelism.max(1)),
            u64::from(index),
        );
        let start = (i * maxp).div_ceil(p);
        let end = ((i + 1) * maxp).div_ceil(p);
        KeyGroupRange {
            start: start as u32,
            end: (end as u32).saturating_sub(1),
        }
    }
}

/// What kind of state a handle holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateKind {
    ManagedKeyed,
    ManagedOperator,
    RawKeyed,
    RawOperator,
    /// In-flight data of an input channel (unaligned checkpoints).
    InputChannel,
    /// In-flight data of an output subpartition (unaligned checkpoints).
    ResultSubpartition,
}

/// Where a handle's bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateLocation {
    /// A file (or object) under the checkpoint directory.
    File { path: String },
    /// Small state carried in the metadata itself (Flink's
    /// `ByteStreamStateHandle`, below `state.storage.fs.memory-threshold`).
    Inline { bytes: Vec<u8> },
}

/// One piece of an operator subtask's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StateHandle {
    pub kind: StateKind,
    pub location: StateLocation,
    /// The key groups the handle covers (keyed state only).
    pub key_groups: Option<KeyGroupRange>,
    /// Offset of each key group of `key_groups` in the handle (Flink's
    /// `KeyGroupRangeOffsets`); empty when unknown.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key_group_offsets: Vec<u64>,
    /// Full size in bytes of the state the handle stands for.
    pub state_size: u64,
}

impl StateHandle {
    /// The file it names, if any (what a discard deletes).
    pub fn path(&self) -> Option<&str> {
        match &self.location {
            StateLocation::File { path } => Some(path),
            StateLocation::Inline { .. } => None,
        }
    }
}

/// One operator's state in one subtask.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorSubtaskState {
    pub handles: Vec<StateHandle>,
}

impl OperatorSubtaskState {
    pub fn state_size(&self) -> u64 {
        self.handles.iter().map(|h| h.state_size).sum()
    }
}

/// What a subtask measured while taking its snapshot (Flink's
/// `CheckpointMetrics`), in bytes and milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubtaskCheckpointMetrics {
    /// Bytes written by this checkpoint (the increment, for incremental
    /// checkpoints). The full size is the handles' sum.
    pub checkpointed_size: u64,
    /// Bytes buffered while aligning.
    pub alignment_buffered: u64,
    /// Bytes processed between the first and the last barrier.
    pub processed_data: u64,
    /// In-flight bytes persisted (unaligned checkpoints).
    pub persisted_data: u64,
    pub sync_duration_ms: u64,
    pub async_duration_ms: u64,
    pub alignment_duration_ms: u64,
    /// From the trigger to the first barrier reaching the subtask.
    pub start_delay_ms: u64,
    /// Whether the subtask took it unaligned.
    pub unaligned: bool,
}

/// A subtask's acknowledgement payload: its operators' state by uid.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskStateSnapshot {
    pub operators: BTreeMap<OperatorId, OperatorSubtaskState>,
    pub metrics: SubtaskCheckpointMetrics,
}

impl TaskStateSnapshot {
    /// Full state size: the sum over its handles.
    pub fn state_size(&self) -> u64 {
        self.operators.values().map(|o| o.state_size()).sum()
    }

    /// Every handle it carries (what discarding it deletes).
    pub fn handles(&self) -> impl Iterator<Item = &StateHandle> {
        self.operators.values().flat_map(|o| o.handles.iter())
    }
}

/// A task's acknowledgement of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCheckpointAck {
    pub checkpoint_id: u64,
    pub attempt: ExecutionAttemptId,
    pub state: TaskStateSnapshot,
}

/// A task could not take its part of a checkpoint (Flink's
/// `declineCheckpoint`): the coordinator aborts it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCheckpointDecline {
    pub checkpoint_id: u64,
    pub attempt: ExecutionAttemptId,
    pub reason: String,
}

/// One operator's state in a completed checkpoint (Flink's
/// `OperatorState`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorState {
    pub operator_id: OperatorId,
    pub parallelism: u32,
    pub max_parallelism: u32,
    /// Per subtask index, the state it acknowledged. A subtask that was
    /// finished at trigger time has no entry.
    pub subtasks: BTreeMap<u32, OperatorSubtaskState>,
    /// Every subtask was finished when the checkpoint was triggered
    /// (FLIP-147): a restore must not run the operator again.
    pub fully_finished: bool,
    /// The state of the operator's coordinator (a source's split
    /// enumerator), taken when the checkpoint was triggered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator_state: Option<Vec<u8>>,
}

impl OperatorState {
    pub fn state_size(&self) -> u64 {
        self.subtasks.values().map(|s| s.state_size()).sum()
    }
}

/// The snapshot a subtask starts from: the state of its chain's operators
/// in a completed checkpoint or savepoint, every subtask's (the task keeps
/// its own key groups and its share of the list state; the parallelism may
/// have changed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRestore {
    pub checkpoint_id: u64,
    pub operators: Vec<OperatorState>,
}

impl TaskRestore {
    /// The state of operator `operator_id`, if the snapshot has any.
    pub fn operator(&self, operator_id: &str) -> Option<&OperatorState> {
        self.operators
            .iter()
            .find(|o| o.operator_id.0 == operator_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_group_ranges_cover_all_groups_once() {
        for p in 1..=7u32 {
            let mut next = 0;
            for i in 0..p {
                let r = KeyGroupRange::for_subtask(128, p, i);
                assert_eq!(r.start, next);
                next = r.end + 1;
            }
            assert_eq!(next, 128);
        }
    }
}

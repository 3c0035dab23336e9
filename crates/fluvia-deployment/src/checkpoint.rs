//! What a checkpoint moves between a task and the JobManager's checkpoint
//! coordinator, in one shape on both sides: the handle of the state one
//! operator of one subtask wrote ([`OperatorSubtaskStateHandle`], Flink's
//! `OperatorSubtaskState`), a task's acknowledgement with its metrics
//! ([`TaskCheckpointAck`], Flink's `TaskStateSnapshot` + `CheckpointMetrics`),
//! and what a redeployed subtask restores from ([`TaskRestore`], Flink's
//! `JobManagerTaskRestore`).
//!
//! Handles name files; this module does not read or write them (the state
//! crate does), and knows nothing of the coordinator's bookkeeping.

use crate::ids::ExecutionAttemptId;
use serde::{Deserialize, Serialize};

/// The state one operator of one subtask wrote for one checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorSubtaskStateHandle {
    /// The operator's stable id (its uid's hash, or its position's).
    pub operator_id: String,
    pub subtask: usize,
    /// Where the snapshot file is (a location of the checkpoint storage).
    pub location: String,
    /// Bytes of the file.
    pub state_size: u64,
    /// The key groups the subtask owned, inclusive (keyed operators).
    pub key_group_range: Option<(usize, usize)>,
}

/// Timings and volumes of one subtask's part of a checkpoint (Flink's
/// `CheckpointMetrics`, shown per subtask in the checkpoint details).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointMetrics {
    /// From the first barrier to the last one of the alignment.
    pub alignment_duration_ms: u64,
    /// Bytes read while the alignment was going on.
    pub bytes_processed_during_alignment: u64,
    /// In-flight bytes persisted as channel state (unaligned checkpoints).
    pub bytes_persisted_during_alignment: u64,
    /// The synchronous part: operators snapshot their state.
    pub sync_duration_ms: u64,
    /// The asynchronous part: writing the snapshot files.
    pub async_duration_ms: u64,
    /// From the trigger (checkpoint timestamp) to the task starting it.
    pub checkpoint_start_delay_ms: u64,
    /// Whether the barrier overtook in-flight data.
    pub unaligned: bool,
}

/// A task's acknowledgement of a checkpoint: its operators' state handles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCheckpointAck {
    pub checkpoint_id: u64,
    pub attempt: ExecutionAttemptId,
    /// One per operator of the chain that has state.
    pub operators: Vec<OperatorSubtaskStateHandle>,
    pub metrics: CheckpointMetrics,
}

/// A task could not take its part of a checkpoint (Flink's
/// `declineCheckpoint`): the coordinator aborts it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCheckpointDecline {
    pub checkpoint_id: u64,
    pub attempt: ExecutionAttemptId,
    pub reason: String,
}

/// What one operator of a redeployed subtask restores: the handles of
/// every subtask of the snapshot it restores from (the task keeps its own
/// key groups and its share of the list state; the parallelism may differ).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorRestore {
    pub operator_id: String,
    /// The parallelism the operator had when the snapshot was taken.
    pub parallelism: usize,
    pub handles: Vec<OperatorSubtaskStateHandle>,
}

/// The snapshot a subtask starts from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRestore {
    pub checkpoint_id: u64,
    pub operators: Vec<OperatorRestore>,
}

impl TaskRestore {
    /// The handles of operator `operator_id`, if the snapshot has state of it.
    pub fn operator(&self, operator_id: &str) -> Option<&OperatorRestore> {
        self.operators.iter().find(|o| o.operator_id == operator_id)
    }
}

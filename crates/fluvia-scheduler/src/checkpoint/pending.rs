//! A checkpoint in flight (Flink's `PendingCheckpoint`): whose
//! acknowledgement it still waits for, the state collected so far, and the
//! [`CompletedCheckpoint`] it becomes once every task acknowledged.
//!
//! It judges one acknowledgement at a time; it does not know the other
//! checkpoints, the clock or the configuration.

use super::metadata::{CheckpointType, CompletedCheckpoint};
use super::plan::{CheckpointPlan, TasksPlan};
use super::state::{OperatorId, OperatorState};
use super::state::{StateHandle, TaskAttempt, TaskId, TaskStateSnapshot};
use fluvia_core::JobId;
use std::collections::{BTreeMap, BTreeSet};

/// What an acknowledgement did (Flink's `TaskAcknowledgeResult`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckResult {
    Success,
    /// The task already acknowledged: ignored, its state kept once.
    Duplicate,
    /// Not a task (or attempt) this checkpoint waits for: its state must
    /// be discarded.
    Unknown,
}

/// One acknowledged task.
#[derive(Debug, Clone, PartialEq)]
pub struct Acked {
    pub attempt: u32,
    pub state: TaskStateSnapshot,
    pub ack_timestamp: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PendingCheckpoint {
    pub checkpoint_id: u64,
    pub checkpoint_type: CheckpointType,
    pub trigger_timestamp: u64,
    /// Where the metadata goes (`None`: JobManager memory only).
    pub target_location: Option<String>,
    /// The savepoint request it answers.
    pub savepoint_request: Option<String>,
    pub plan: CheckpointPlan,
    not_yet_acked: BTreeMap<TaskId, u32>,
    acked: BTreeMap<TaskId, Acked>,
    /// The operator coordinators' state, taken at the trigger.
    coordinator_states: BTreeMap<OperatorId, Vec<u8>>,
    /// Every task acknowledged: what it becomes once `_metadata` is
    /// written.
    pub finalized: Option<Box<CompletedCheckpoint>>,
}

impl PendingCheckpoint {
    pub fn new(
        checkpoint_id: u64,
        checkpoint_type: CheckpointType,
        trigger_timestamp: u64,
        plan: CheckpointPlan,
        target_location: Option<String>,
        savepoint_request: Option<String>,
    ) -> Self {
        PendingCheckpoint {
            checkpoint_id,
            checkpoint_type,
            trigger_timestamp,
            target_location,
            savepoint_request,
            not_yet_acked: plan.to_wait.clone(),
            acked: BTreeMap::new(),
            coordinator_states: BTreeMap::new(),
            plan,
            finalized: None,
        }
    }

    /// The state of operator `operator`'s coordinator for this checkpoint.
    pub fn add_coordinator_state(&mut self, operator: OperatorId, state: Vec<u8>) {
        self.coordinator_states.insert(operator, state);
    }

    pub fn acknowledge(
        &mut self,
        task: TaskId,
        attempt: u32,
        state: TaskStateSnapshot,
        now_ms: u64,
    ) -> (AckResult, Option<TaskStateSnapshot>) {
        match self.not_yet_acked.get(&task) {
            Some(&a) if a == attempt => {
                self.not_yet_acked.remove(&task);
                self.acked.insert(
                    task,
                    Acked {
                        attempt,
                        state,
                        ack_timestamp: now_ms,
                    },
                );
                (AckResult::Success, None)
            }
            Some(_) => (AckResult::Unknown, Some(state)),
            None => match self.acked.get(&task) {
                Some(a) if a.attempt == attempt => (AckResult::Duplicate, None),
                _ => (AckResult::Unknown, Some(state)),
            },
        }
    }

    /// Whether `attempt` of `task` is one this checkpoint involves.
    pub fn involves(&self, task: TaskId, attempt: u32) -> bool {
        self.plan.to_wait.get(&task) == Some(&attempt)
    }

    /// Every task acknowledged and `_metadata` is being written.
    pub fn is_finalizing(&self) -> bool {
        self.finalized.is_some()
    }

    pub fn is_fully_acknowledged(&self) -> bool {
        self.not_yet_acked.is_empty()
    }

    pub fn num_subtasks(&self) -> usize {
        self.plan.to_wait.len()
    }

    pub fn num_acknowledged(&self) -> usize {
        self.acked.len()
    }

    pub fn acknowledged(&self) -> &BTreeMap<TaskId, Acked> {
        &self.acked
    }

    /// The tasks notified of its fate: every task running at trigger time.
    pub fn tasks_to_commit(&self) -> Vec<TaskAttempt> {
        self.plan
            .to_wait
            .iter()
            .map(|(&task, &attempt)| TaskAttempt { task, attempt })
            .collect()
    }

    /// The handles collected so far (what an abort discards).
    pub fn into_handles(self) -> Vec<StateHandle> {
        self.acked
            .into_values()
            .flat_map(|a| a.state.operators.into_values())
            .flat_map(|o| o.handles)
            .collect()
    }

    /// The completed checkpoint (call once fully acknowledged). Per operator
    /// of the plan: one entry per acknowledged subtask (empty when the task
    /// sent none for it), `fully_finished` when its vertex was entirely
    /// finished at trigger time. Handles for operators the plan does not
    /// know are returned apart, to be discarded.
    pub fn to_completed(
        &self,
        job_id: JobId,
        tasks: &TasksPlan,
        now_ms: u64,
    ) -> (CompletedCheckpoint, Vec<StateHandle>) {
        let mut operators = BTreeMap::new();
        let mut unmatched = Vec::new();
        let mut known = BTreeSet::new();
        for (v, vp) in tasks.vertices.iter().enumerate() {
            let fully_finished =
                (0..vp.parallelism).all(|s| self.plan.finished.contains(&TaskId::new(v, s)));
            for op in &vp.operators {
                known.insert(op.clone());
                let subtasks = self
                    .acked
                    .iter()
                    .filter(|(t, _)| t.vertex == v)
                    .map(|(t, a)| {
                        (
                            t.subtask as u32,
                            a.state.operators.get(op).cloned().unwrap_or_default(),
                        )
                    })
                    .collect();
                operators.insert(
                    op.clone(),
                    OperatorState {
                        operator_id: op.clone(),
                        parallelism: vp.parallelism as u32,
                        max_parallelism: vp.max_parallelism,
                        subtasks,
                        fully_finished,
                        coordinator_state: self.coordinator_states.get(op).cloned(),
                    },
                );
            }
        }
        for a in self.acked.values() {
            for (op, s) in &a.state.operators {
                if !known.contains(op) {
                    unmatched.extend(s.handles.iter().cloned());
                }
            }
        }
        (
            CompletedCheckpoint {
                job_id,
                checkpoint_id: self.checkpoint_id,
                checkpoint_type: self.checkpoint_type,
                trigger_timestamp: self.trigger_timestamp,
                completion_timestamp: now_ms,
                operators,
                external_path: self.target_location.clone(),
            },
            unmatched,
        )
    }
}

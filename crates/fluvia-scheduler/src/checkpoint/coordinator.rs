//! The [`CheckpointCoordinator`] (Flink's `CheckpointCoordinator` with its
//! `CompletedCheckpointStore` and `CheckpointFailureManager`): fed
//! [`CheckpointEvent`]s with the time, it returns [`CheckpointAction`]s —
//! trigger, write metadata, notify, discard, fail the job.
//!
//! It owns the pending and the retained checkpoints and the tasks' states
//! as far as checkpointing cares. It performs no I/O and reads no clock:
//! the shell writes `_metadata`, deletes files and sends RPCs, and feeds the
//! outcome back. It does not know the scheduler nor the ExecutionGraph.

use super::config::{
    CheckpointConfig, CheckpointConfigError, CheckpointingMode, TerminalJobStatus,
};
use super::failure::{CheckpointFailureReason, FailureManager};
use super::metadata::{CheckpointType, CompletedCheckpoint, SavepointKind};
use super::pending::{AckResult, PendingCheckpoint};
use super::plan::{TaskStatus, TasksPlan, calculate};
use super::state::{OperatorId, StateHandle, TaskAttempt, TaskId, TaskStateSnapshot};
use super::stats::{CheckpointStatsTracker, CheckpointingStatistics};
use fluvia_core::JobId;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// How the barriers of a checkpoint travel (Flink's
/// `CheckpointOptions.AlignmentType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AlignmentType {
    AtLeastOnce,
    Aligned,
    Unaligned,
    /// Savepoints: always aligned, whatever the configuration.
    ForcedAligned,
}

/// What the barriers carry besides the id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointOptions {
    pub alignment: AlignmentType,
    /// Aligned barriers that turn unaligned after this long
    /// (`aligned-checkpoint-timeout` with unaligned checkpoints on).
    pub aligned_checkpoint_timeout_ms: Option<u64>,
}

/// Something that happened.
#[derive(Debug, Clone, PartialEq)]
pub enum CheckpointEvent {
    /// Time passed: expire overdue checkpoints, trigger a due one.
    Tick,
    /// The attempt runs (RUNNING reported). An older attempt's news is
    /// ignored from then on.
    TaskRunning { task: TaskId, attempt: u32 },
    /// The attempt finished (FLIP-147: it is neither triggered nor awaited
    /// any more).
    TaskFinished { task: TaskId, attempt: u32 },
    /// The attempt failed: the job (or its region) restarts from the latest
    /// completed checkpoint; every pending checkpoint is aborted.
    TaskFailed {
        task: TaskId,
        attempt: u32,
        reason: String,
    },
    /// The whole job restarts: every task stops; pending checkpoints are
    /// aborted.
    JobRestarting { reason: String },
    /// The shell snapshotted an operator coordinator for a checkpoint it
    /// triggers, before the trigger goes out (Flink's coordinator
    /// checkpoint): it becomes part of the checkpoint.
    CoordinatorState {
        checkpoint_id: u64,
        operator: OperatorId,
        state: Vec<u8>,
    },
    /// A task's snapshot is done (`acknowledgeCheckpoint`).
    Acknowledge {
        checkpoint_id: u64,
        task: TaskId,
        attempt: u32,
        state: TaskStateSnapshot,
    },
    /// A task could not take its snapshot (`declineCheckpoint`).
    Decline {
        checkpoint_id: u64,
        task: TaskId,
        attempt: u32,
        reason: CheckpointFailureReason,
        message: String,
    },
    /// `POST /jobs/:id/savepoints` (kind Savepoint) or `POST /jobs/:id/stop`
    /// (Suspend, or Terminate with drain). Without `target_dir` it goes to
    /// `execution.checkpointing.savepoint-dir`.
    TriggerSavepoint {
        request_id: String,
        target_dir: Option<String>,
        kind: SavepointKind,
    },
    /// The shell wrote the `_metadata` asked by
    /// [`CheckpointAction::WriteMetadata`] (`path`: where; `None` when the
    /// metadata stays in JobManager memory).
    MetadataWritten {
        checkpoint_id: u64,
        path: Option<String>,
    },
    /// Writing it failed.
    MetadataFailed { checkpoint_id: u64, reason: String },
    /// The job reached a terminal state (or was suspended): pending
    /// checkpoints are aborted, retained ones discarded as the retention
    /// says, nothing is triggered any more.
    JobTerminated { status: TerminalJobStatus },
}

/// Something the shell must do.
#[derive(Debug, Clone, PartialEq)]
pub enum CheckpointAction {
    /// Send `triggerCheckpoint` to these attempts (the barriers' origins).
    TriggerCheckpoint {
        checkpoint_id: u64,
        timestamp: u64,
        checkpoint_type: CheckpointType,
        options: CheckpointOptions,
        tasks: Vec<TaskAttempt>,
    },
    /// Every task acknowledged: write the checkpoint's `_metadata` (see
    /// [`super::metadata::serialize`]) under its `external_path` and answer
    /// [`CheckpointEvent::MetadataWritten`] or
    /// [`CheckpointEvent::MetadataFailed`].
    WriteMetadata {
        checkpoint: Box<CompletedCheckpoint>,
    },
    /// `notifyCheckpointComplete` to every task that took part (sinks
    /// commit now).
    NotifyCheckpointComplete {
        checkpoint_id: u64,
        tasks: Vec<TaskAttempt>,
    },
    /// `notifyCheckpointAborted` to every task that took part.
    NotifyCheckpointAborted {
        checkpoint_id: u64,
        tasks: Vec<TaskAttempt>,
        reason: String,
    },
    /// A retained checkpoint was subsumed (or the job ended): delete its
    /// state and its metadata directory.
    DiscardCheckpoint {
        checkpoint_id: u64,
        external_path: Option<String>,
        handles: Vec<StateHandle>,
    },
    /// State that belongs to no completed checkpoint (an aborted
    /// checkpoint's acknowledgements, a late or stale acknowledgement):
    /// delete it.
    DiscardState {
        checkpoint_id: u64,
        handles: Vec<StateHandle>,
    },
    /// `_metadata` written for a checkpoint that was aborted meanwhile.
    DiscardMetadata {
        checkpoint_id: u64,
        path: String,
    },
    SavepointCompleted {
        request_id: String,
        checkpoint_id: u64,
        path: Option<String>,
    },
    SavepointFailed {
        request_id: String,
        reason: String,
    },
    /// Checkpoints failed beyond `tolerable-failed-checkpoints`.
    FailJob {
        reason: String,
    },
}

/// Why a checkpoint could not be restored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    #[error(
        "the max parallelism of operator '{operator}' changed from {old} to {new}; \
         state cannot be restored"
    )]
    MaxParallelismChanged {
        operator: OperatorId,
        old: u32,
        new: u32,
    },
    #[error(
        "checkpoint {checkpoint_id} has state for operators the job does not have: {operators:?} \
         (allow non-restored state to skip them)"
    )]
    NonRestoredState {
        checkpoint_id: u64,
        operators: Vec<OperatorId>,
    },
}

/// A checkpoint kept for recovery.
#[derive(Debug, Clone, PartialEq)]
struct Retained {
    checkpoint: CompletedCheckpoint,
    /// Taken by this job (its files are ours to delete). A checkpoint or
    /// savepoint restored from is never deleted (Flink's NO_CLAIM).
    owned: bool,
}

/// The sans-IO checkpoint coordinator of one job.
#[derive(Debug, Clone)]
pub struct CheckpointCoordinator {
    config: CheckpointConfig,
    job_id: JobId,
    plan: TasksPlan,
    status: BTreeMap<TaskId, TaskStatus>,
    /// Highest attempt number seen per task.
    latest_attempt: BTreeMap<TaskId, u32>,
    pending: BTreeMap<u64, PendingCheckpoint>,
    /// Oldest first; the back is the recovery point.
    retained: VecDeque<Retained>,
    /// Every checkpoint or savepoint that completed (late messages about
    /// them are ignored, never discarded).
    completed_ids: BTreeSet<u64>,
    latest_savepoint: Option<CompletedCheckpoint>,
    next_checkpoint_id: u64,
    last_completion_ms: Option<u64>,
    /// When the next periodic checkpoint is due (`None`: not every task
    /// runs, or periodic checkpoints are off).
    next_periodic_ms: Option<u64>,
    failures: FailureManager,
    stats: CheckpointStatsTracker,
    shut_down: bool,
}

impl CheckpointCoordinator {
    pub fn new(
        config: CheckpointConfig,
        job_id: JobId,
        plan: TasksPlan,
    ) -> Result<Self, CheckpointConfigError> {
        config.validate()?;
        plan.validate()?;
        let status = plan.tasks().map(|t| (t, TaskStatus::NotRunning)).collect();
        Ok(CheckpointCoordinator {
            failures: FailureManager::new(config.tolerable()),
            stats: CheckpointStatsTracker::new(config.history_size),
            config,
            job_id,
            plan,
            status,
            latest_attempt: BTreeMap::new(),
            pending: BTreeMap::new(),
            retained: VecDeque::new(),
            completed_ids: BTreeSet::new(),
            latest_savepoint: None,
            next_checkpoint_id: 1,
            last_completion_ms: None,
            next_periodic_ms: None,
            shut_down: false,
        })
    }

    // ------------------------------------------------------------ queries

    pub fn config(&self) -> &CheckpointConfig {
        &self.config
    }

    pub fn job_id(&self) -> JobId {
        self.job_id
    }

    pub fn plan(&self) -> &TasksPlan {
        &self.plan
    }

    pub fn task_status(&self, task: TaskId) -> Option<TaskStatus> {
        self.status.get(&task).copied()
    }

    /// The checkpoint a restart restores: always the latest completed
    /// (or the one restored from, until a newer one completes).
    pub fn latest_completed(&self) -> Option<&CompletedCheckpoint> {
        self.retained.back().map(|r| &r.checkpoint)
    }

    /// The retained checkpoints, oldest first.
    pub fn retained(&self) -> impl Iterator<Item = &CompletedCheckpoint> {
        self.retained.iter().map(|r| &r.checkpoint)
    }

    pub fn latest_savepoint(&self) -> Option<&CompletedCheckpoint> {
        self.latest_savepoint.as_ref()
    }

    pub fn pending(&self) -> impl Iterator<Item = &PendingCheckpoint> {
        self.pending.values()
    }

    pub fn num_pending(&self) -> usize {
        self.pending.len()
    }

    /// Counted checkpoint failures in a row.
    pub fn continuous_failures(&self) -> u32 {
        self.failures.continuous_failures()
    }

    /// The body of `GET /jobs/:id/checkpoints`.
    pub fn statistics(&self) -> CheckpointingStatistics {
        self.stats.snapshot()
    }

    pub fn is_shut_down(&self) -> bool {
        self.shut_down
    }

    /// When the next [`CheckpointEvent::Tick`] has something to do: the
    /// earliest expiry, or when a periodic checkpoint becomes allowed.
    pub fn next_deadline(&self) -> Option<u64> {
        let timeout = self.config.timeout.as_millis() as u64;
        let expiry = self
            .pending
            .values()
            .filter(|p| !p.is_finalizing())
            .map(|p| p.trigger_timestamp.saturating_add(timeout))
            .min();
        let periodic = self.next_periodic_ms.filter(|_| {
            !self.shut_down
                && self.pending.len() < self.config.effective_max_concurrent()
                && !self.sync_savepoint_pending()
        });
        let periodic = periodic.map(|due| {
            let pause = self
                .last_completion_ms
                .map(|l| l.saturating_add(self.config.min_pause.as_millis() as u64))
                .unwrap_or(0);
            due.max(pause)
        });
        match (expiry, periodic) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    // ---------------------------------------------------------- restoring

    /// Start from a savepoint or a retained checkpoint (before the tasks
    /// run): it becomes the recovery point, checkpoint ids continue after
    /// it, and it is never deleted by this job. Operators are matched by
    /// uid; their max parallelism must not change; state of operators the
    /// job lacks is an error unless `allow_non_restored_state`.
    pub fn restore_from(
        &mut self,
        now_ms: u64,
        checkpoint: CompletedCheckpoint,
        allow_non_restored_state: bool,
    ) -> Result<(), RestoreError> {
        let mut missing = Vec::new();
        for (op, st) in &checkpoint.operators {
            match self.plan.vertices.iter().find(|v| v.operators.contains(op)) {
                Some(v) if v.max_parallelism != st.max_parallelism => {
                    return Err(RestoreError::MaxParallelismChanged {
                        operator: op.clone(),
                        old: st.max_parallelism,
                        new: v.max_parallelism,
                    });
                }
                Some(_) => {}
                None if st.subtasks.values().all(|s| s.handles.is_empty()) => {}
                None => missing.push(op.clone()),
            }
        }
        if !missing.is_empty() && !allow_non_restored_state {
            return Err(RestoreError::NonRestoredState {
                checkpoint_id: checkpoint.checkpoint_id,
                operators: missing,
            });
        }
        self.next_checkpoint_id = self
            .next_checkpoint_id
            .max(checkpoint.checkpoint_id.saturating_add(1));
        self.stats.report_restored(
            checkpoint.checkpoint_id,
            now_ms,
            checkpoint.is_savepoint(),
            checkpoint.external_path.clone(),
        );
        self.completed_ids.insert(checkpoint.checkpoint_id);
        self.retained.push_back(Retained {
            checkpoint,
            owned: false,
        });
        Ok(())
    }

    /// The checkpoint a restart restores (the latest completed), counted
    /// as restored in the statistics.
    pub fn restore_latest(&mut self, now_ms: u64) -> Option<CompletedCheckpoint> {
        let latest = self.latest_completed()?.clone();
        self.stats.report_restored(
            latest.checkpoint_id,
            now_ms,
            latest.is_savepoint(),
            latest.external_path.clone(),
        );
        Some(latest)
    }

    // ------------------------------------------------------------- events

    pub fn handle(&mut self, now_ms: u64, event: CheckpointEvent) -> Vec<CheckpointAction> {
        let mut out = Vec::new();
        match event {
            CheckpointEvent::Tick => self.on_tick(now_ms, &mut out),
            CheckpointEvent::TaskRunning { task, attempt } => {
                self.on_task_running(now_ms, task, attempt, &mut out)
            }
            CheckpointEvent::TaskFinished { task, attempt } => {
                if self.is_current(task, attempt) && self.plan.contains(task) {
                    self.status.insert(task, TaskStatus::Finished);
                    self.update_activation(now_ms);
                }
            }
            CheckpointEvent::TaskFailed {
                task,
                attempt,
                reason,
            } => {
                if self.is_current(task, attempt) && self.plan.contains(task) {
                    self.status.insert(task, TaskStatus::NotRunning);
                    let msg = format!("Task {task}#{attempt} failed: {reason}");
                    self.abort_all(now_ms, CheckpointFailureReason::TaskFailure, &msg, &mut out);
                    self.update_activation(now_ms);
                }
            }
            CheckpointEvent::JobRestarting { reason } => {
                for s in self.status.values_mut() {
                    *s = TaskStatus::NotRunning;
                }
                let msg = format!("The job restarts: {reason}");
                self.abort_all(now_ms, CheckpointFailureReason::JobFailover, &msg, &mut out);
                self.update_activation(now_ms);
            }
            CheckpointEvent::CoordinatorState {
                checkpoint_id,
                operator,
                state,
            } => {
                if let Some(p) = self.pending.get_mut(&checkpoint_id)
                    && !p.is_finalizing()
                {
                    p.add_coordinator_state(operator, state);
                }
            }
            CheckpointEvent::Acknowledge {
                checkpoint_id,
                task,
                attempt,
                state,
            } => self.on_ack(now_ms, checkpoint_id, task, attempt, state, &mut out),
            CheckpointEvent::Decline {
                checkpoint_id,
                task,
                attempt,
                reason,
                message,
            } => {
                let declines = self
                    .pending
                    .get(&checkpoint_id)
                    .is_some_and(|p| !p.is_finalizing() && p.involves(task, attempt));
                if declines {
                    let msg = format!(
                        "Checkpoint {checkpoint_id} was declined by task {task}#{attempt}: {message}"
                    );
                    self.abort(now_ms, checkpoint_id, reason, &msg, true, &mut out);
                }
            }
            CheckpointEvent::TriggerSavepoint {
                request_id,
                target_dir,
                kind,
            } => self.on_trigger_savepoint(now_ms, request_id, target_dir, kind, &mut out),
            CheckpointEvent::MetadataWritten {
                checkpoint_id,
                path,
            } => self.on_metadata_written(now_ms, checkpoint_id, path, &mut out),
            CheckpointEvent::MetadataFailed {
                checkpoint_id,
                reason,
            } => {
                if self
                    .pending
                    .get(&checkpoint_id)
                    .is_some_and(|p| p.is_finalizing())
                {
                    let msg = format!(
                        "Checkpoint {checkpoint_id}: writing its metadata failed: {reason}"
                    );
                    self.abort(
                        now_ms,
                        checkpoint_id,
                        CheckpointFailureReason::FinalizeCheckpointFailure,
                        &msg,
                        true,
                        &mut out,
                    );
                }
            }
            CheckpointEvent::JobTerminated { status } => {
                self.on_terminated(now_ms, status, &mut out)
            }
        }
        out
    }

    /// Whether `attempt` is the task's newest (older attempts' news is
    /// stale).
    fn is_current(&self, task: TaskId, attempt: u32) -> bool {
        self.latest_attempt.get(&task).is_none_or(|&a| attempt >= a)
    }

    fn sync_savepoint_pending(&self) -> bool {
        self.pending
            .values()
            .any(|p| p.checkpoint_type.is_synchronous())
    }

    /// Periodic checkpoints run while every task runs or finished (and one
    /// still runs): the first is due an interval after that state is
    /// reached (Flink: a random delay in `[min-pause, interval]`).
    fn update_activation(&mut self, now_ms: u64) {
        let Some(interval) = self.config.interval else {
            self.next_periodic_ms = None;
            return;
        };
        if self.shut_down || calculate(&self.plan, &self.status).is_err() {
            self.next_periodic_ms = None;
        } else if self.next_periodic_ms.is_none() {
            self.next_periodic_ms = Some(now_ms.saturating_add(interval.as_millis() as u64));
        }
    }

    fn on_task_running(
        &mut self,
        now_ms: u64,
        task: TaskId,
        attempt: u32,
        out: &mut Vec<CheckpointAction>,
    ) {
        if !self.plan.contains(task) || !self.is_current(task, attempt) {
            return;
        }
        self.latest_attempt.insert(task, attempt);
        self.status.insert(task, TaskStatus::Running { attempt });
        // A checkpoint waiting on an older attempt can never complete: that
        // attempt is gone.
        self.abort_where(
            now_ms,
            |p| p.plan.to_wait.get(&task).is_some_and(|&a| a != attempt),
            CheckpointFailureReason::TaskFailure,
            |id| format!("Checkpoint {id}: task {task} restarted as attempt {attempt}"),
            false,
            out,
        );
        self.update_activation(now_ms);
    }

    fn on_tick(&mut self, now_ms: u64, out: &mut Vec<CheckpointAction>) {
        let timeout = self.config.timeout.as_millis() as u64;
        self.abort_where(
            now_ms,
            |p| !p.is_finalizing() && now_ms >= p.trigger_timestamp.saturating_add(timeout),
            CheckpointFailureReason::CheckpointExpired,
            |id| format!("Checkpoint {id} expired before completing."),
            true,
            out,
        );
        // The job is about to fail: no new checkpoint for it.
        if !out
            .iter()
            .any(|a| matches!(a, CheckpointAction::FailJob { .. }))
        {
            self.maybe_trigger_periodic(now_ms, out);
        }
    }

    fn maybe_trigger_periodic(&mut self, now_ms: u64, out: &mut Vec<CheckpointAction>) {
        let (Some(due), Some(interval)) = (self.next_periodic_ms, self.config.interval) else {
            return;
        };
        if self.shut_down || now_ms < due || self.sync_savepoint_pending() {
            return;
        }
        // Too many in flight, or the pause since the last completion is
        // not over: the request waits (it stays due).
        if self.pending.len() >= self.config.effective_max_concurrent() {
            return;
        }
        if let Some(last) = self.last_completion_ms
            && now_ms < last.saturating_add(self.config.min_pause.as_millis() as u64)
        {
            return;
        }
        if self
            .trigger(now_ms, CheckpointType::Checkpoint, None, None, out)
            .is_ok()
        {
            self.next_periodic_ms = Some(now_ms.saturating_add(interval.as_millis() as u64));
        } else {
            self.next_periodic_ms = None;
        }
    }

    fn options(&self, checkpoint_type: CheckpointType) -> CheckpointOptions {
        if checkpoint_type.is_savepoint() {
            return CheckpointOptions {
                alignment: AlignmentType::ForcedAligned,
                aligned_checkpoint_timeout_ms: None,
            };
        }
        match self.config.mode {
            CheckpointingMode::AtLeastOnce => CheckpointOptions {
                alignment: AlignmentType::AtLeastOnce,
                aligned_checkpoint_timeout_ms: None,
            },
            CheckpointingMode::ExactlyOnce if !self.config.unaligned => CheckpointOptions {
                alignment: AlignmentType::Aligned,
                aligned_checkpoint_timeout_ms: None,
            },
            CheckpointingMode::ExactlyOnce if self.config.aligned_checkpoint_timeout.is_zero() => {
                CheckpointOptions {
                    alignment: AlignmentType::Unaligned,
                    aligned_checkpoint_timeout_ms: None,
                }
            }
            CheckpointingMode::ExactlyOnce => CheckpointOptions {
                alignment: AlignmentType::Aligned,
                aligned_checkpoint_timeout_ms: Some(
                    self.config.aligned_checkpoint_timeout.as_millis() as u64,
                ),
            },
        }
    }

    /// Starts a checkpoint or savepoint now.
    fn trigger(
        &mut self,
        now_ms: u64,
        checkpoint_type: CheckpointType,
        savepoint_request: Option<String>,
        savepoint_dir: Option<String>,
        out: &mut Vec<CheckpointAction>,
    ) -> Result<u64, CheckpointFailureReason> {
        if self.shut_down {
            return Err(CheckpointFailureReason::CheckpointCoordinatorShutdown);
        }
        let plan = calculate(&self.plan, &self.status)?;
        let id = self.next_checkpoint_id;
        self.next_checkpoint_id += 1;
        let location = match checkpoint_type {
            CheckpointType::Checkpoint => self
                .config
                .checkpoint_dir
                .as_ref()
                .map(|d| format!("{}/{}/chk-{id}", d.trim_end_matches('/'), self.job_id)),
            CheckpointType::Savepoint(_) => savepoint_dir.map(|d| {
                let job = self.job_id.to_string();
                format!(
                    "{}/savepoint-{}-{id:012x}",
                    d.trim_end_matches('/'),
                    job.get(..6).unwrap_or(&job)
                )
            }),
        };
        let options = self.options(checkpoint_type);
        let mut per_vertex: BTreeMap<usize, u64> = BTreeMap::new();
        for t in plan.to_wait.keys() {
            *per_vertex.entry(t.vertex).or_default() += 1;
        }
        self.stats.report_pending(
            id,
            now_ms,
            checkpoint_type,
            options.alignment == AlignmentType::Unaligned,
            &per_vertex,
        );
        out.push(CheckpointAction::TriggerCheckpoint {
            checkpoint_id: id,
            timestamp: now_ms,
            checkpoint_type,
            options,
            tasks: plan.to_trigger.clone(),
        });
        self.pending.insert(
            id,
            PendingCheckpoint::new(
                id,
                checkpoint_type,
                now_ms,
                plan,
                location,
                savepoint_request,
            ),
        );
        Ok(id)
    }

    fn on_trigger_savepoint(
        &mut self,
        now_ms: u64,
        request_id: String,
        target_dir: Option<String>,
        kind: SavepointKind,
        out: &mut Vec<CheckpointAction>,
    ) {
        let Some(dir) = target_dir.or_else(|| self.config.savepoint_dir.clone()) else {
            out.push(CheckpointAction::SavepointFailed {
                request_id,
                reason: CheckpointFailureReason::NoSavepointDirectory
                    .message()
                    .into(),
            });
            return;
        };
        // Savepoints are forced: neither max-concurrent nor min-pause holds
        // them back.
        if let Err(reason) = self.trigger(
            now_ms,
            CheckpointType::Savepoint(kind),
            Some(request_id.clone()),
            Some(dir),
            out,
        ) {
            out.push(CheckpointAction::SavepointFailed {
                request_id,
                reason: reason.message().into(),
            });
        }
    }

    fn on_ack(
        &mut self,
        now_ms: u64,
        id: u64,
        task: TaskId,
        attempt: u32,
        state: TaskStateSnapshot,
        out: &mut Vec<CheckpointAction>,
    ) {
        let discard = |state: TaskStateSnapshot, out: &mut Vec<CheckpointAction>| {
            let handles: Vec<StateHandle> = state
                .operators
                .into_values()
                .flat_map(|o| o.handles)
                .collect();
            if !handles.is_empty() {
                out.push(CheckpointAction::DiscardState {
                    checkpoint_id: id,
                    handles,
                });
            }
        };
        let Some(p) = self.pending.get_mut(&id) else {
            // Completed: a duplicate, whose handles the checkpoint holds.
            // Aborted or unknown: nobody will use the state.
            if !self.completed_ids.contains(&id) {
                discard(state, out);
            }
            return;
        };
        let size = state.state_size();
        let metrics = state.metrics;
        match p.acknowledge(task, attempt, state, now_ms) {
            (AckResult::Success, _) => {
                self.stats.report_ack(id, task, size, &metrics, now_ms);
                if p.is_fully_acknowledged() {
                    let (completed, unmatched) = p.to_completed(self.job_id, &self.plan, now_ms);
                    p.finalized = Some(Box::new(completed.clone()));
                    if !unmatched.is_empty() {
                        out.push(CheckpointAction::DiscardState {
                            checkpoint_id: id,
                            handles: unmatched,
                        });
                    }
                    out.push(CheckpointAction::WriteMetadata {
                        checkpoint: Box::new(completed),
                    });
                }
            }
            (AckResult::Duplicate, _) => {}
            (AckResult::Unknown, state) => {
                if let Some(state) = state {
                    discard(state, out);
                }
            }
        }
    }

    fn on_metadata_written(
        &mut self,
        now_ms: u64,
        id: u64,
        path: Option<String>,
        out: &mut Vec<CheckpointAction>,
    ) {
        let finalizing = self.pending.get(&id).is_some_and(|p| p.is_finalizing());
        if !finalizing {
            // Aborted meanwhile (or never asked): the file is garbage.
            if !self.completed_ids.contains(&id)
                && let Some(path) = path
            {
                out.push(CheckpointAction::DiscardMetadata {
                    checkpoint_id: id,
                    path,
                });
            }
            return;
        }
        let Some(mut p) = self.pending.remove(&id) else {
            return;
        };
        let Some(mut completed) = p.finalized.take() else {
            return;
        };
        completed.external_path = path.clone();
        let completed = *completed;
        self.completed_ids.insert(id);
        self.stats.report_completed(id, path.clone());
        self.failures.on_success(id);
        self.last_completion_ms = Some(now_ms);
        let tasks = p.tasks_to_commit();
        if completed.is_savepoint() {
            // Savepoints belong to the user: not retained for recovery,
            // never subsumed nor deleted.
            if let Some(request_id) = p.savepoint_request.take() {
                out.push(CheckpointAction::SavepointCompleted {
                    request_id,
                    checkpoint_id: id,
                    path,
                });
            }
            self.latest_savepoint = Some(completed);
        } else {
            self.retained.push_back(Retained {
                checkpoint: completed,
                owned: true,
            });
            while self.retained.len() > self.config.num_retained {
                let Some(old) = self.retained.pop_front() else {
                    break;
                };
                if old.owned {
                    self.discard_retained(old.checkpoint, out);
                }
            }
            // Older checkpoints still in flight are subsumed (savepoints
            // are not).
            self.abort_where(
                now_ms,
                |p| p.checkpoint_id < id && !p.checkpoint_type.is_savepoint(),
                CheckpointFailureReason::CheckpointSubsumed,
                |old| format!("Checkpoint {old} was subsumed by checkpoint {id}."),
                true,
                out,
            );
        }
        out.push(CheckpointAction::NotifyCheckpointComplete {
            checkpoint_id: id,
            tasks,
        });
    }

    fn discard_retained(&mut self, cp: CompletedCheckpoint, out: &mut Vec<CheckpointAction>) {
        self.stats.report_discarded(cp.checkpoint_id);
        let handles = cp.handles().cloned().collect();
        out.push(CheckpointAction::DiscardCheckpoint {
            checkpoint_id: cp.checkpoint_id,
            external_path: cp.external_path,
            handles,
        });
    }

    /// Aborts one pending checkpoint: its collected state is discarded,
    /// its savepoint request answered, the tasks told (when `notify`; not
    /// when they are being restarted anyway) and the failure counted.
    fn abort(
        &mut self,
        now_ms: u64,
        id: u64,
        reason: CheckpointFailureReason,
        message: &str,
        notify: bool,
        out: &mut Vec<CheckpointAction>,
    ) {
        let Some(mut p) = self.pending.remove(&id) else {
            return;
        };
        self.stats.report_failed(id, now_ms, message);
        if notify {
            out.push(CheckpointAction::NotifyCheckpointAborted {
                checkpoint_id: id,
                tasks: p.tasks_to_commit(),
                reason: message.to_string(),
            });
        }
        if let Some(request_id) = p.savepoint_request.take() {
            out.push(CheckpointAction::SavepointFailed {
                request_id,
                reason: message.to_string(),
            });
        }
        let is_savepoint = p.checkpoint_type.is_savepoint();
        let handles = p.into_handles();
        if !handles.is_empty() {
            out.push(CheckpointAction::DiscardState {
                checkpoint_id: id,
                handles,
            });
        }
        if self.failures.on_failure(id, is_savepoint, reason) {
            out.push(CheckpointAction::FailJob {
                reason: format!(
                    "Exceeded checkpoint tolerable failure threshold ({}). The latest checkpoint \
                     failed due to: {message}",
                    self.config.tolerable()
                ),
            });
        }
    }

    fn abort_all(
        &mut self,
        now_ms: u64,
        reason: CheckpointFailureReason,
        message: &str,
        out: &mut Vec<CheckpointAction>,
    ) {
        self.abort_where(
            now_ms,
            |_| true,
            reason,
            |_| message.to_string(),
            false,
            out,
        );
    }

    /// Aborts every pending checkpoint `which` selects, in id order, with
    /// the message `message(id)`; `notify` as in [`Self::abort`].
    fn abort_where(
        &mut self,
        now_ms: u64,
        which: impl Fn(&PendingCheckpoint) -> bool,
        reason: CheckpointFailureReason,
        message: impl Fn(u64) -> String,
        notify: bool,
        out: &mut Vec<CheckpointAction>,
    ) {
        let ids: Vec<u64> = self
            .pending
            .values()
            .filter(|p| which(p))
            .map(|p| p.checkpoint_id)
            .collect();
        for id in ids {
            self.abort(now_ms, id, reason, &message(id), notify, out);
        }
    }

    fn on_terminated(
        &mut self,
        now_ms: u64,
        status: TerminalJobStatus,
        out: &mut Vec<CheckpointAction>,
    ) {
        if self.shut_down {
            return;
        }
        self.abort_all(
            now_ms,
            CheckpointFailureReason::CheckpointCoordinatorShutdown,
            CheckpointFailureReason::CheckpointCoordinatorShutdown.message(),
            out,
        );
        self.shut_down = true;
        self.next_periodic_ms = None;
        if self.config.externalized_retention.discard_on(status) {
            for r in std::mem::take(&mut self.retained) {
                if r.owned {
                    self.discard_retained(r.checkpoint, out);
                }
            }
        }
    }
}

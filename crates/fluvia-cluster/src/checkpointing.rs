//! The JobManager's checkpointing: one sans-IO
//! [`CheckpointCoordinator`](fluvia_scheduler::checkpoint::CheckpointCoordinator)
//! per streaming job, fed what the JobManager learns (attempts running,
//! finished or failed, the tasks' reports, the clock), and the I/O its
//! actions ask for: `_metadata` files written and read through the
//! checkpoint storage, discarded state deleted off the JobManager's
//! threads, and calls to TaskManagers ([`CheckpointCall`]) that the shell
//! queues. It also decides what a deployed attempt restores.
//!
//! No RPC here, and nothing of the scheduler's internals: the JobManager
//! shell sends the calls and tells it about attempts.

use crate::coordinators::JobCoordinators;
use crate::rpc::{AttemptRef, NotifyCheckpointRequest, TriggerCheckpointRequest};
use fluvia_core::config::options;
use fluvia_core::{Configuration, FluviaError, JobId, Result};
use fluvia_deployment::checkpoint::{OperatorId, StateHandle, TaskAttempt, TaskId};
use fluvia_deployment::{
    ExecutionAttemptId, ExecutionState, TaskCheckpointAck, TaskCheckpointDecline,
    TaskDeploymentDescriptor, TaskRestore,
};
use fluvia_graph::{JobGraph, JobType};
use fluvia_scheduler::checkpoint::metadata;
use fluvia_scheduler::checkpoint::{
    AlignmentType, CheckpointAction, CheckpointConfig, CheckpointCoordinator, CheckpointEvent,
    CheckpointFailureReason, CheckpointType, CheckpointingMode, CheckpointingStatistics,
    CompletedCheckpoint, ExternalizedCheckpointRetention, SavepointKind, TaskStatus, TasksPlan,
    TerminalJobStatus, VertexPlan,
};
use fluvia_state::CheckpointStorage;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A call to a TaskManager, or to the job, that checkpointing asks for.
#[derive(Debug)]
pub(crate) enum CheckpointCall {
    Trigger {
        task_manager: String,
        request: TriggerCheckpointRequest,
    },
    Notify {
        task_manager: String,
        request: NotifyCheckpointRequest,
    },
    /// Checkpoints failed beyond the tolerable count: the job fails over
    /// as if `attempt` (one of its running attempts) had failed, under its
    /// restart strategy (Flink fails the job's execution the same way).
    FailJob {
        attempt: ExecutionAttemptId,
        reason: String,
    },
}

/// The checkpoint directory a job's configuration names: `execution.checkpointing.dir`
/// (or the older `state.checkpoints.dir`), else one under the system's
/// temporary directory (shared by the processes of one host).
pub fn checkpoint_directory(config: &Configuration) -> Result<String> {
    let dir = config.get(&options::CHECKPOINTS_DIRECTORY)?;
    Ok(if dir.is_empty() {
        std::env::temp_dir()
            .join("fluvia-checkpoints")
            .display()
            .to_string()
    } else {
        dir.to_string()
    })
}

/// The checkpointing settings of a job's configuration (Flink's keys).
pub fn checkpoint_config(config: &Configuration) -> Result<CheckpointConfig> {
    let bad = |key: &str, value: &str, expected: &str| {
        FluviaError::Config(format!(
            "configuration key '{key}': '{value}' is not one of {expected}"
        ))
    };
    let interval = config.get(&options::CHECKPOINTING_INTERVAL)?;
    let mode = config.get(&options::CHECKPOINTING_MODE)?;
    let mode = match mode.to_ascii_uppercase().as_str() {
        "EXACTLY_ONCE" => CheckpointingMode::ExactlyOnce,
        "AT_LEAST_ONCE" => CheckpointingMode::AtLeastOnce,
        _ => {
            return Err(bad(
                options::CHECKPOINTING_MODE.key,
                mode,
                "EXACTLY_ONCE, AT_LEAST_ONCE",
            ));
        }
    };
    let retention = config.get(&options::CHECKPOINTING_RETENTION)?;
    let retention = match retention.to_ascii_uppercase().as_str() {
        "DELETE_ON_CANCELLATION" => ExternalizedCheckpointRetention::DeleteOnCancellation,
        "RETAIN_ON_CANCELLATION" => ExternalizedCheckpointRetention::RetainOnCancellation,
        "NO_EXTERNALIZED_CHECKPOINTS" => ExternalizedCheckpointRetention::NoExternalizedCheckpoints,
        _ => {
            return Err(bad(
                options::CHECKPOINTING_RETENTION.key,
                retention,
                "DELETE_ON_CANCELLATION, RETAIN_ON_CANCELLATION, NO_EXTERNALIZED_CHECKPOINTS",
            ));
        }
    };
    if config.get(&options::CHECKPOINTING_UNALIGNED)? {
        // Barriers would overtake data that no snapshot records: refuse
        // rather than lose it on a restore.
        return Err(FluviaError::Config(format!(
            "{} is not supported yet: in-flight data is not stored as channel state, so \
             checkpoints are aligned",
            options::CHECKPOINTING_UNALIGNED.key
        )));
    }
    let savepoint_dir = config.get(&options::SAVEPOINT_DIRECTORY)?;
    let c = CheckpointConfig {
        interval: (!interval.is_zero()).then_some(interval),
        mode,
        timeout: config.get(&options::CHECKPOINTING_TIMEOUT)?,
        min_pause: config.get(&options::CHECKPOINTING_MIN_PAUSE)?,
        max_concurrent: config.get(&options::CHECKPOINTING_MAX_CONCURRENT)?,
        tolerable_failed: Some(config.get(&options::CHECKPOINTING_TOLERABLE_FAILURES)? as u32),
        num_retained: config.get(&options::CHECKPOINTING_NUM_RETAINED)?.max(1),
        unaligned: config.get(&options::CHECKPOINTING_UNALIGNED)?,
        aligned_checkpoint_timeout: config.get(&options::CHECKPOINTING_ALIGNED_TIMEOUT)?,
        externalized_retention: retention,
        checkpoint_dir: Some(checkpoint_directory(config)?),
        savepoint_dir: (!savepoint_dir.is_empty()).then(|| savepoint_dir.to_string()),
        ..CheckpointConfig::default()
    };
    c.validate()
        .map_err(|e| FluviaError::Config(format!("checkpointing: {e}")))?;
    Ok(c)
}

/// The coordinator's view of a job graph: vertices, operators, inputs.
fn tasks_plan(graph: &JobGraph) -> TasksPlan {
    let index: HashMap<_, _> = graph
        .vertices
        .iter()
        .enumerate()
        .map(|(i, v)| (v.id, i))
        .collect();
    TasksPlan {
        vertices: graph
            .vertices
            .iter()
            .map(|v| VertexPlan {
                name: v.name.clone(),
                parallelism: v.parallelism,
                max_parallelism: v.max_parallelism as u32,
                operators: v
                    .operators
                    .iter()
                    .map(|o| OperatorId(o.operator_id.clone()))
                    .collect(),
                inputs: v
                    .inputs
                    .iter()
                    .filter_map(|e| index.get(&e.source_vertex).copied())
                    .collect(),
            })
            .collect(),
    }
}

/// 128 bits unlikely to repeat (trigger ids): the process's randomly keyed
/// hasher over the time and a counter.
fn rand_id() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let s = std::collections::hash_map::RandomState::new();
    let mut words = [0u64; 2];
    for w in &mut words {
        let mut h = s.build_hasher();
        h.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        *w = h.finish();
    }
    (u128::from(words[0]) << 64) | u128::from(words[1])
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Reads a snapshot's `_metadata` (a savepoint, or a retained checkpoint's
/// directory or metadata file): the checkpoint it describes.
pub fn read_metadata(path: &str) -> Result<CompletedCheckpoint> {
    let p = std::path::Path::new(path);
    let file = if p.is_dir() {
        p.join("_metadata")
    } else {
        p.to_path_buf()
    };
    let bytes = std::fs::read(&file).map_err(|e| {
        FluviaError::Config(format!(
            "cannot read the snapshot metadata {}: {e}",
            file.display()
        ))
    })?;
    metadata::deserialize(&bytes, &file.display().to_string(), None)
        .map_err(|e| FluviaError::Config(e.to_string()))
}

struct JobCheckpoints {
    coordinator: CheckpointCoordinator,
    graph: Arc<JobGraph>,
    storage: Arc<CheckpointStorage>,
    job_id: String,
    /// The TaskManager of every attempt deployed.
    locations: HashMap<(usize, usize, u32), String>,
    /// The highest attempt number a restore was counted for: a restart
    /// deploys every task again with a higher one.
    restored_attempt: u32,
}

/// Where a savepoint request stands (`GET /jobs/:id/savepoints/:trigger`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SavepointOutcome {
    InProgress,
    Completed { location: String },
    Failed { reason: String },
}

/// Every streaming job's checkpointing.
#[derive(Default)]
pub(crate) struct Checkpointing {
    jobs: BTreeMap<JobId, JobCheckpoints>,
    /// Savepoint requests by trigger id (kept after their job ends, for
    /// the clients that poll them).
    savepoints: HashMap<String, (JobId, SavepointOutcome)>,
    /// The statistics of jobs that ended (REST shows them, as Flink's
    /// history server does).
    ended: BTreeMap<JobId, (CheckpointingStatistics, CheckpointConfig)>,
}

impl Checkpointing {
    /// A job was submitted: a streaming job gets a coordinator (savepoints
    /// work without periodic checkpoints); one started from a snapshot
    /// (`execution.state-recovery.path`) restores it.
    pub fn job_submitted(&mut self, graph: &Arc<JobGraph>) -> Result<()> {
        if graph.job_type != JobType::Streaming {
            return Ok(());
        }
        let config = checkpoint_config(&graph.config)?;
        let storage = Arc::new(
            CheckpointStorage::for_directory(&checkpoint_directory(&graph.config)?)
                .map_err(|e| FluviaError::Config(e.to_string()))?,
        );
        let mut coordinator = CheckpointCoordinator::new(config, graph.job_id, tasks_plan(graph))
            .map_err(|e| FluviaError::Plan(format!("checkpointing: {e}")))?;
        let recovery = graph.config.get(&options::STATE_RECOVERY_PATH)?;
        if !recovery.is_empty() {
            let snapshot = read_metadata(recovery)?;
            let allow = graph
                .config
                .get(&options::STATE_RECOVERY_IGNORE_UNCLAIMED)?;
            coordinator
                .restore_from(now_millis(), snapshot, allow)
                .map_err(|e| FluviaError::Plan(format!("restoring {recovery}: {e}")))?;
        }
        self.jobs.insert(
            graph.job_id,
            JobCheckpoints {
                coordinator,
                graph: Arc::clone(graph),
                storage,
                job_id: graph.job_id.to_string(),
                locations: HashMap::new(),
                restored_attempt: 0,
            },
        );
        Ok(())
    }

    /// The job ended: its coordinator decides what of its checkpoints stays.
    pub fn job_ended(
        &mut self,
        coordinators: &mut JobCoordinators,
        job: JobId,
        status: TerminalJobStatus,
    ) -> Vec<CheckpointCall> {
        let calls = self.handle(coordinators, job, CheckpointEvent::JobTerminated { status });
        if let Some(j) = self.jobs.remove(&job) {
            self.ended.insert(
                job,
                (j.coordinator.statistics(), j.coordinator.config().clone()),
            );
        }
        calls
    }

    /// An attempt is deployed on `task_manager`: it restores the latest
    /// completed checkpoint (or the snapshot the job started from).
    pub fn deployed(&mut self, d: &mut TaskDeploymentDescriptor, task_manager: &str) {
        let Some(j) = self.jobs.get_mut(&d.attempt.job) else {
            return;
        };
        let a = d.attempt;
        j.locations
            .insert((a.vertex, a.subtask, a.attempt), task_manager.to_string());
        if j.coordinator.latest_completed().is_none() {
            return;
        }
        if a.attempt > j.restored_attempt {
            // The first task of a restart: the restore is counted once.
            j.restored_attempt = a.attempt;
            j.coordinator.restore_latest(now_millis());
        }
        let Some(latest) = j.coordinator.latest_completed() else {
            return;
        };
        let operators = j
            .coordinator
            .plan()
            .vertices
            .get(a.vertex)
            .map(|v| {
                v.operators
                    .iter()
                    .filter_map(|op| latest.operators.get(op).cloned())
                    .collect()
            })
            .unwrap_or_default();
        d.restore = Some(TaskRestore {
            checkpoint_id: latest.checkpoint_id,
            operators,
        });
    }

    /// An attempt's state changed.
    pub fn attempt_state(
        &mut self,
        coordinators: &mut JobCoordinators,
        attempt: &ExecutionAttemptId,
        state: ExecutionState,
        failure: Option<&str>,
    ) -> Vec<CheckpointCall> {
        let task = TaskId::new(attempt.vertex, attempt.subtask);
        let event = match state {
            ExecutionState::Running => CheckpointEvent::TaskRunning {
                task,
                attempt: attempt.attempt,
            },
            ExecutionState::Finished => CheckpointEvent::TaskFinished {
                task,
                attempt: attempt.attempt,
            },
            ExecutionState::Failed | ExecutionState::Canceled => CheckpointEvent::TaskFailed {
                task,
                attempt: attempt.attempt,
                reason: failure.unwrap_or("the task was cancelled").to_string(),
            },
            _ => return Vec::new(),
        };
        self.handle(coordinators, attempt.job, event)
    }

    /// A task's report (an acknowledgement or a refusal).
    pub fn report(
        &mut self,
        coordinators: &mut JobCoordinators,
        declined: bool,
        json: &str,
    ) -> Result<Vec<CheckpointCall>> {
        let bad = |e: serde_json::Error| {
            FluviaError::Execution(format!("an unreadable checkpoint report: {e}"))
        };
        let (job, event) = if declined {
            let d: TaskCheckpointDecline = serde_json::from_str(json).map_err(bad)?;
            (
                d.attempt.job,
                CheckpointEvent::Decline {
                    checkpoint_id: d.checkpoint_id,
                    task: TaskId::new(d.attempt.vertex, d.attempt.subtask),
                    attempt: d.attempt.attempt,
                    reason: CheckpointFailureReason::CheckpointDeclined,
                    message: d.reason,
                },
            )
        } else {
            let a: TaskCheckpointAck = serde_json::from_str(json).map_err(bad)?;
            (
                a.attempt.job,
                CheckpointEvent::Acknowledge {
                    checkpoint_id: a.checkpoint_id,
                    task: TaskId::new(a.attempt.vertex, a.attempt.subtask),
                    attempt: a.attempt.attempt,
                    state: a.state,
                },
            )
        };
        Ok(self.handle(coordinators, job, event))
    }

    /// Time passed: every job's coordinator expires and triggers.
    pub fn tick(&mut self, coordinators: &mut JobCoordinators) -> Vec<CheckpointCall> {
        let jobs: Vec<JobId> = self.jobs.keys().copied().collect();
        jobs.into_iter()
            .flat_map(|job| self.handle(coordinators, job, CheckpointEvent::Tick))
            .collect()
    }

    /// Triggers a savepoint of `job` into a new directory under `target`
    /// (else `execution.checkpointing.savepoint-dir`); with `stop`, the
    /// job's sources end after it (stop-with-savepoint; `drain` is
    /// Flink's `--drain`). Returns the trigger id to poll.
    pub fn trigger_savepoint(
        &mut self,
        coordinators: &mut JobCoordinators,
        job: JobId,
        target: Option<String>,
        stop: bool,
        drain: bool,
    ) -> Result<(String, Vec<CheckpointCall>)> {
        let j = self.jobs.get(&job).ok_or_else(|| {
            FluviaError::Execution(format!(
                "job {job} takes no savepoints: it is not a running streaming job"
            ))
        })?;
        let parent = target
            .filter(|t| !t.is_empty())
            .or_else(|| j.coordinator.config().savepoint_dir.clone())
            .ok_or_else(|| {
                FluviaError::Config(format!(
                    "no savepoint directory: give one, or set {}",
                    options::SAVEPOINT_DIRECTORY.key
                ))
            })?;
        let dir = format!(
            "{}/{}",
            parent.trim_end_matches('/'),
            fluvia_state::storage::savepoint_dir(&j.job_id)
        );
        let request_id = format!("{:032x}", rand_id());
        let kind = match (stop, drain) {
            (false, _) => SavepointKind::Savepoint,
            (true, false) => SavepointKind::Suspend,
            (true, true) => SavepointKind::Terminate,
        };
        self.savepoints
            .insert(request_id.clone(), (job, SavepointOutcome::InProgress));
        let calls = self.handle(
            coordinators,
            job,
            CheckpointEvent::TriggerSavepoint {
                request_id: request_id.clone(),
                target_dir: Some(dir),
                kind,
            },
        );
        Ok((request_id, calls))
    }

    /// Where savepoint request `request_id` of `job` stands.
    pub fn savepoint(&self, job: JobId, request_id: &str) -> Option<&SavepointOutcome> {
        self.savepoints
            .get(request_id)
            .filter(|(j, _)| *j == job)
            .map(|(_, o)| o)
    }

    /// The job's checkpoint statistics (REST).
    pub fn statistics(&self, job: JobId) -> Option<CheckpointingStatistics> {
        match self.jobs.get(&job) {
            Some(j) => Some(j.coordinator.statistics()),
            None => self.ended.get(&job).map(|(s, _)| s.clone()),
        }
    }

    /// What a client is told of a job's checkpoints with its status.
    pub fn summary(&self, job: JobId) -> Option<fluvia_runtime::result::CheckpointSummary> {
        let s = self.statistics(job)?;
        let d = &s.summary.end_to_end_duration;
        Some(fluvia_runtime::result::CheckpointSummary {
            completed: s.counts.completed,
            failed: s.counts.failed,
            restored: s.counts.restored,
            duration_ms: (d.min, d.avg, d.max),
            last_state_size: s.latest.completed.as_ref().map_or(0, |c| c.state_size),
            last_checkpointed_size: s
                .latest
                .completed
                .as_ref()
                .map_or(0, |c| c.checkpointed_size),
        })
    }

    /// The job's checkpointing settings (REST).
    pub fn config(&self, job: JobId) -> Option<&CheckpointConfig> {
        match self.jobs.get(&job) {
            Some(j) => Some(j.coordinator.config()),
            None => self.ended.get(&job).map(|(_, c)| c),
        }
    }

    fn handle(
        &mut self,
        coordinators: &mut JobCoordinators,
        job: JobId,
        event: CheckpointEvent,
    ) -> Vec<CheckpointCall> {
        let Some(j) = self.jobs.get_mut(&job) else {
            return Vec::new();
        };
        let mut actions = j.coordinator.handle(now_millis(), event);
        let mut calls = Vec::new();
        // Writing `_metadata` answers at once, which may lead to more.
        while !actions.is_empty() {
            let mut next = Vec::new();
            for action in actions {
                match &action {
                    CheckpointAction::SavepointCompleted {
                        request_id, path, ..
                    } => {
                        let location = path
                            .as_deref()
                            .map(|p| p.trim_end_matches("/_metadata").to_string())
                            .unwrap_or_default();
                        self.savepoints.insert(
                            request_id.clone(),
                            (job, SavepointOutcome::Completed { location }),
                        );
                    }
                    CheckpointAction::SavepointFailed { request_id, reason } => {
                        self.savepoints.insert(
                            request_id.clone(),
                            (
                                job,
                                SavepointOutcome::Failed {
                                    reason: reason.clone(),
                                },
                            ),
                        );
                    }
                    _ => {}
                }
                for event in perform(j, coordinators, job, action, &mut calls) {
                    next.extend(j.coordinator.handle(now_millis(), event));
                }
            }
            actions = next;
        }
        calls
    }
}

fn attempt_ref(job_id: &str, t: &TaskAttempt) -> AttemptRef {
    AttemptRef {
        job_id: job_id.to_string(),
        vertex_index: t.task.vertex as u32,
        subtask: t.task.subtask as u32,
        attempt: t.attempt,
    }
}

/// Carries out one action; returns the events that answer it.
fn perform(
    j: &mut JobCheckpoints,
    coordinators: &mut JobCoordinators,
    job: JobId,
    action: CheckpointAction,
    calls: &mut Vec<CheckpointCall>,
) -> Vec<CheckpointEvent> {
    let location = |j: &JobCheckpoints, t: &TaskAttempt| {
        j.locations
            .get(&(t.task.vertex, t.task.subtask, t.attempt))
            .cloned()
    };
    match action {
        CheckpointAction::TriggerCheckpoint {
            checkpoint_id,
            timestamp,
            checkpoint_type,
            options,
            tasks,
        } => {
            // The operator coordinators' state first: events they send
            // from now on queue behind the trigger, events sent before
            // reach their subtasks before it (one ordered queue per
            // TaskManager), so readers and enumerator agree.
            let states = coordinators.checkpoint(&j.graph, job, checkpoint_id);
            for t in &tasks {
                let Some(task_manager) = location(j, t) else {
                    continue;
                };
                calls.push(CheckpointCall::Trigger {
                    task_manager,
                    request: TriggerCheckpointRequest {
                        attempt: Some(attempt_ref(&j.job_id, t)),
                        checkpoint_id,
                        timestamp: timestamp as i64,
                        alignment: match options.alignment {
                            AlignmentType::Aligned => 0,
                            AlignmentType::Unaligned => 1,
                            AlignmentType::ForcedAligned => 2,
                            AlignmentType::AtLeastOnce => 3,
                        },
                        snapshot_type: match checkpoint_type {
                            CheckpointType::Checkpoint => 0,
                            CheckpointType::Savepoint(SavepointKind::Savepoint) => 1,
                            // The sources stop after it.
                            CheckpointType::Savepoint(_) => 2,
                        },
                    },
                });
            }
            states
                .into_iter()
                .map(|(operator, state)| CheckpointEvent::CoordinatorState {
                    checkpoint_id,
                    operator: OperatorId(operator),
                    state,
                })
                .collect()
        }
        CheckpointAction::WriteMetadata { checkpoint } => {
            let id = checkpoint.checkpoint_id;
            let written = metadata::serialize(&checkpoint)
                .map_err(|e| e.to_string())
                .and_then(|bytes| match &checkpoint.external_path {
                    // A savepoint's directory may lie outside the
                    // checkpoint storage.
                    Some(dir) => CheckpointStorage::for_directory(dir)
                        .and_then(|s| s.put("_metadata", bytes))
                        .map_err(|e| e.to_string()),
                    None => j
                        .storage
                        .put(&fluvia_state::storage::metadata_file(&j.job_id, id), bytes)
                        .map_err(|e| e.to_string()),
                });
            vec![match written {
                Ok(path) => CheckpointEvent::MetadataWritten {
                    checkpoint_id: id,
                    path: Some(path),
                },
                Err(reason) => CheckpointEvent::MetadataFailed {
                    checkpoint_id: id,
                    reason,
                },
            }]
        }
        CheckpointAction::NotifyCheckpointComplete {
            checkpoint_id,
            tasks,
        } => {
            notify(j, &tasks, checkpoint_id, true, calls);
            Vec::new()
        }
        CheckpointAction::NotifyCheckpointAborted {
            checkpoint_id,
            tasks,
            reason,
        } => {
            tracing::info!("checkpoint {checkpoint_id} of job {job} aborted: {reason}");
            notify(j, &tasks, checkpoint_id, false, calls);
            Vec::new()
        }
        CheckpointAction::DiscardCheckpoint {
            external_path,
            handles,
            ..
        } => {
            discard(&j.storage, handles, external_path);
            Vec::new()
        }
        CheckpointAction::DiscardState { handles, .. } => {
            discard(&j.storage, handles, None);
            Vec::new()
        }
        CheckpointAction::DiscardMetadata { path, .. } => {
            discard(&j.storage, Vec::new(), Some(path));
            Vec::new()
        }
        CheckpointAction::SavepointCompleted {
            request_id, path, ..
        } => {
            tracing::info!("savepoint {request_id} of job {job} written to {path:?}");
            Vec::new()
        }
        CheckpointAction::SavepointFailed { request_id, reason } => {
            tracing::warn!("savepoint {request_id} of job {job} failed: {reason}");
            Vec::new()
        }
        CheckpointAction::FailJob { reason } => {
            let running = j.coordinator.plan().tasks().find_map(|task| {
                match j.coordinator.task_status(task) {
                    Some(TaskStatus::Running { attempt }) => Some(ExecutionAttemptId {
                        job,
                        vertex: task.vertex,
                        subtask: task.subtask,
                        attempt,
                    }),
                    _ => None,
                }
            });
            if let Some(attempt) = running {
                calls.push(CheckpointCall::FailJob { attempt, reason });
            }
            Vec::new()
        }
    }
}

fn notify(
    j: &JobCheckpoints,
    tasks: &[TaskAttempt],
    checkpoint_id: u64,
    complete: bool,
    calls: &mut Vec<CheckpointCall>,
) {
    let mut by_tm: BTreeMap<String, Vec<AttemptRef>> = BTreeMap::new();
    for t in tasks {
        if let Some(tm) = j.locations.get(&(t.task.vertex, t.task.subtask, t.attempt)) {
            by_tm
                .entry(tm.clone())
                .or_default()
                .push(attempt_ref(&j.job_id, t));
        }
    }
    for (task_manager, attempts) in by_tm {
        calls.push(CheckpointCall::Notify {
            task_manager,
            request: NotifyCheckpointRequest {
                job_id: j.job_id.clone(),
                attempts,
                checkpoint_id,
                complete,
            },
        });
    }
}

/// Deletes state files (and a checkpoint's directory) on a thread of its
/// own: a slow disk does not hold the JobManager.
fn discard(storage: &Arc<CheckpointStorage>, handles: Vec<StateHandle>, dir: Option<String>) {
    let storage = Arc::clone(storage);
    let spawned = std::thread::Builder::new()
        .name("checkpoint discard".into())
        .spawn(move || {
            for h in &handles {
                if let Some(path) = h.path()
                    && let Err(e) = storage.delete(path)
                {
                    tracing::debug!("discarding {path}: {e}");
                }
            }
            if let Some(dir) = dir {
                let dir = dir.trim_end_matches("/_metadata").to_string();
                if let Err(e) = storage.delete_dir(&dir) {
                    tracing::debug!("discarding {dir}: {e}");
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start a thread to discard checkpoint state: {e}");
    }
}

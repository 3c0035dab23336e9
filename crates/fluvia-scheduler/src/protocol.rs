//! What goes into the scheduler ([`Event`]s) and what comes out of it
//! ([`Action`]s): plain data the JobManager (or a simulation) translates
//! from and into RPCs.

use crate::deployment::{ExecutionAttemptId, PartitionRef, TaskDeploymentDescriptor};
use crate::execution_graph::{AttemptMetrics, ExecutionState};
use crate::job::JobState;
use crate::shuffle::ShuffleServiceSpec;
use crate::slot_pool::TaskManagerSpec;
use fluvia_core::JobId;
use fluvia_graph::JobGraph;
use std::sync::Arc;

/// Something that happened.
#[derive(Debug, Clone)]
pub enum Event {
    SubmitJob {
        job: JobId,
        graph: Arc<JobGraph>,
        /// The program's name, for messages.
        program: String,
        fingerprint: String,
    },
    CancelJob {
        job: JobId,
    },
    RegisterTaskManager(TaskManagerSpec),
    RegisterShuffleService(ShuffleServiceSpec),
    /// The shuffle service is alive (it is lost after `heartbeat.timeout`
    /// of silence).
    ShuffleServiceHeartbeat {
        service: String,
    },
    /// The service stopped answering: the partitions it held are lost.
    ShuffleServiceLost {
        service: String,
        reason: String,
    },
    /// A shuffle service's answer to [`Action::ProbeShuffleService`] (one
    /// that does not answer is lost).
    ShuffleServiceProbeAnswered {
        service: String,
        alive: bool,
    },
    /// The attempts the TaskManager runs right now.
    Heartbeat {
        task_manager: String,
        running: Vec<ExecutionAttemptId>,
    },
    TaskManagerLost {
        task_manager: String,
        reason: String,
    },
    ProbeAnswered {
        task_manager: String,
        alive: bool,
    },
    DeployAcknowledged {
        attempt: ExecutionAttemptId,
    },
    DeployFailed {
        attempt: ExecutionAttemptId,
        reason: String,
    },
    /// A state report from the TaskManager running the attempt.
    AttemptState {
        attempt: ExecutionAttemptId,
        state: ExecutionState,
        failure: Option<String>,
        metrics: Option<AttemptMetrics>,
    },
    /// Partitions could not be read (a consumer's typed partition error, or
    /// the shuffle service holding them was lost): their producers run
    /// again where a consumer still needs them.
    PartitionsLost {
        job: JobId,
        partitions: Vec<PartitionRef>,
        reason: String,
    },
    /// Start one more concurrent attempt of a subtask (speculation).
    AddAttempt {
        job: JobId,
        vertex: usize,
        subtask: usize,
    },
    /// A TaskManager's answer to [`Action::CommitFiles`].
    FilesCommitted {
        job: JobId,
        task_manager: String,
        failure: Option<String>,
    },
    /// Time passed.
    Tick,
}

/// Something the caller must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Deploy(Box<TaskDeploymentDescriptor>),
    CancelAttempt {
        task_manager: String,
        attempt: ExecutionAttemptId,
    },
    /// Partitions of an attempt that lost (or failed): drop them.
    ReleasePartitions {
        task_manager: String,
        job: JobId,
        partitions: Vec<PartitionRef>,
    },
    /// The job ended: cancel whatever of it still runs there and drop its
    /// partitions.
    ReleaseJob {
        task_manager: String,
        job: JobId,
    },
    /// Partitions a shuffle service holds that nobody will read.
    ReleaseShufflePartitions {
        service: String,
        job: JobId,
        partitions: Vec<PartitionRef>,
    },
    /// The job ended: the service drops all of its partitions.
    ReleaseShuffleJob {
        service: String,
        job: JobId,
    },
    /// Ask whether the TaskManager still answers (feed back
    /// [`Event::ProbeAnswered`]).
    Probe {
        task_manager: String,
    },
    /// Ask whether the shuffle service still answers (feed back
    /// [`Event::ShuffleServiceProbeAnswered`]): a consumer could not read
    /// partitions of a job whose data went to it.
    ProbeShuffleService {
        service: String,
    },
    /// Every subtask finished: give the files these winning attempts staged
    /// their final names (feed back [`Event::FilesCommitted`]). Files other
    /// attempts staged go when the job is released.
    CommitFiles {
        task_manager: String,
        job: JobId,
        attempts: Vec<ExecutionAttemptId>,
    },
    JobEnded {
        job: JobId,
        state: JobState,
    },
}

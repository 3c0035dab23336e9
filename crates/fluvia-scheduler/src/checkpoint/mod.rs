//! Checkpointing's coordinator, a sans-IO state machine beside the
//! [`Scheduler`](crate::Scheduler) (Flink's `CheckpointCoordinator`): it
//! decides when to trigger checkpoints and savepoints, collects the tasks'
//! acknowledgements, completes, retains, subsumes and aborts checkpoints,
//! counts failures, and keeps the statistics the REST API shows.
//!
//! It takes [`CheckpointEvent`]s with the time and returns
//! [`CheckpointAction`]s; it never touches files, sockets or clocks, and it
//! does not know the scheduler — the JobManager drives both.
//!
//! - [`config`]: the settings (Flink's keys and defaults).
//! - [`plan`]: the job's vertices and operators, whom a checkpoint
//!   triggers and awaits (FLIP-147).
//! - [`state`]: what an acknowledgement carries.
//! - [`pending`]: one checkpoint in flight.
//! - [`failure`]: failure reasons and the tolerable-failure count.
//! - [`metadata`]: a completed checkpoint and its `_metadata` bytes.
//! - [`stats`]: the REST statistics.
//! - [`coordinator`]: the state machine.

pub mod config;
pub mod coordinator;
pub mod failure;
pub mod metadata;
pub mod pending;
pub mod plan;
pub mod state;
pub mod stats;

pub use config::{
    CheckpointConfig, CheckpointConfigError, CheckpointingMode, ExternalizedCheckpointRetention,
    TerminalJobStatus,
};
pub use coordinator::{
    AlignmentType, CheckpointAction, CheckpointCoordinator, CheckpointEvent, CheckpointOptions,
    RestoreError,
};
pub use failure::CheckpointFailureReason;
pub use metadata::{CheckpointType, CompletedCheckpoint, MetadataError, SavepointKind};
pub use plan::{TaskStatus, TasksPlan, VertexPlan};
pub use state::{
    KeyGroupRange, OperatorId, OperatorState, OperatorSubtaskState, StateHandle, StateKind,
    StateLocation, SubtaskCheckpointMetrics, TaskAttempt, TaskId, TaskStateSnapshot,
};
pub use stats::CheckpointingStatistics;

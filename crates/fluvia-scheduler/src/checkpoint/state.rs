//! What a task reports when it acknowledges a checkpoint: per operator the
//! handles of the state it wrote, and the numbers the statistics show
//! (Flink's `TaskStateSnapshot`, `OperatorSubtaskState`,
//! `CheckpointMetrics`). They are the contract between the task and the
//! coordinator, so they live in `fluvia-deployment`; this module names them
//! where the coordinator's readers look.

pub use fluvia_deployment::checkpoint::{
    KeyGroupRange, OperatorId, OperatorState, OperatorSubtaskState, StateHandle, StateKind,
    StateLocation, SubtaskCheckpointMetrics, TaskAttempt, TaskId, TaskStateSnapshot,
};

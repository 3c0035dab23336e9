//! The contract between the scheduler and the task: what crosses from the
//! decision plane (`fluvia-scheduler`, in the JobManager) to the execution
//! plane (`fluvia-cluster`'s TaskManager and `fluvia-runtime`'s task) and
//! back, in one shape on both sides.
//!
//! It owns:
//! - the [`TaskDeploymentDescriptor`] (Flink's name): one attempt of one
//!   subtask, with the partitions it reads ([`InputDescriptor`]) and writes
//!   ([`OutputDescriptor`]). The scheduler's deploy action carries it, the
//!   JobManager ships it, the TaskManager and the task read it;
//! - the ids both sides name attempts and partitions by
//!   ([`ExecutionAttemptId`], [`PartitionRef`]);
//! - what a task reports back: its [`ExecutionState`] and, when it ends, its
//!   [`AttemptMetrics`] with the [`StagedFile`]s it wrote;
//! - what a checkpoint moves ([`checkpoint`]): a task's acknowledgement with
//!   its state handles, and the state a redeployed subtask restores.
//!
//! It must not know about scheduling (the ExecutionGraph, slots, failover),
//! the wire (protobuf and gRPC conversions live at the boundary in
//! `fluvia-cluster`), the network stack, threads or operators. It is plain,
//! serialisable data: a TaskManager links it without linking the scheduler.

pub mod checkpoint;
pub mod descriptor;
pub mod ids;
pub mod metrics;
pub mod state;

pub use checkpoint::{
    OperatorState, StateHandle, SubtaskCheckpointMetrics, TaskCheckpointAck, TaskCheckpointDecline,
    TaskRestore, TaskStateSnapshot,
};
pub use descriptor::{
    InputDescriptor, OutputDescriptor, ShuffleServiceTarget, SubpartitionRange,
    TaskDeploymentDescriptor,
};
pub use ids::{ExecutionAttemptId, PartitionRef};
pub use metrics::{AttemptMetrics, StagedFile};
pub use state::ExecutionState;

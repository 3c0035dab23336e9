//! Scheduling: the [`ExecutionGraph`] (the JobGraph expanded by parallelism
//! into execution vertices with their attempts, the result partitions each
//! subtask produces and the subpartition *ranges* each consumer reads) and
//! the [`Scheduler`], a deterministic state machine that decides where and
//! when attempts run, fails over and ends jobs (Flink's SchedulerNG). The
//! [`adaptive`] decider picks the parallelism of a vertex left undecided,
//! and the subpartitions each subtask reads, from the bytes its inputs wrote.
//!
//! This crate decides; it does not run anything. It knows nothing of gRPC,
//! tokio, sockets, threads or real clocks: the JobManager feeds it events
//! and performs the actions it returns, and the simulation tests drive it
//! with a virtual clock.
//!
//! # Layout
//!
//! [`Scheduler`] ([`scheduler`]) is the state machine's shell: it takes an
//! [`Event`], asks its components and queues the [`Action`]s
//! ([`protocol`]). The components own their state and take and return
//! plain data; none of them knows the others or the scheduler:
//! - [`slot_pool`]: the registered TaskManagers, their slots and the
//!   blocklist; chooses and frees a job's shared slots.
//! - `failover`: restart decisions under the restart strategy, the pending
//!   restart and its probes.
//! - `reconciliation`: heartbeats against what the scheduler believes runs.
//! - `deployment_factory`: a scheduled attempt's
//!   [`TaskDeploymentDescriptor`] (the contract of `fluvia-deployment`).
//! - `adaptive_setup`: the adaptive batch set-up of a job and the
//!   initialization of its vertices, over the [`adaptive`], [`skew`]
//!   deciders; [`speculative`] finds slow attempts.
//! - [`job`]: one job's data (graph, regions, slots, per-job component state)
//!   and the queries on it.
//!
//! A sibling state machine sits beside the scheduler, not inside it: the
//! [`checkpoint`] coordinator (Flink's `CheckpointCoordinator`). It is fed
//! its own events (attempts running, finished or failed, acknowledgements
//! and declines, savepoint requests, the outcome of writing `_metadata`,
//! ticks) and returns its own actions (trigger a checkpoint, write its
//! metadata, notify completion or abortion, discard subsumed checkpoints
//! and orphaned state, fail the job past the tolerable failures); it names
//! the checkpoint a restart restores from and keeps the REST statistics.
//! The JobManager drives both; a deployment will carry its restore handles
//! in the fields `fluvia-deployment` and the wire reserve for them. Same
//! rules: no I/O, an injected clock, plain data in and out.

pub mod adaptive;
mod adaptive_setup;
pub mod checkpoint;
pub mod deployment;
mod deployment_factory;
pub mod execution_graph;
pub mod failover;
pub mod job;
pub mod protocol;
mod reconciliation;
pub mod scheduler;
pub mod shuffle;
pub mod skew;
pub mod slot_pool;
pub mod speculative;
pub mod validate;

pub use adaptive::{
    BlockingResultInfo, DeciderConfig, ExecutionVertexInputInfo, IndexRange, JobVertexInputInfo,
    ParallelismAndInputInfos,
};
pub use deployment::{
    ExecutionAttemptId, InputDescriptor, OutputDescriptor, PartitionRef, ShuffleServiceTarget,
    TaskDeploymentDescriptor,
};
pub use execution_graph::{
    AttemptMetrics, ConsumedPartition, Execution, ExecutionGraph, ExecutionJobVertex,
    ExecutionState, ExecutionVertex, IntermediateResult, StagedFile, SubpartitionRange,
    SubtaskInput,
};
pub use failover::RestartStrategy;
pub use job::{AdaptiveJob, Job, JobState, SharedSlot};
pub use protocol::{Action, Event};
pub use scheduler::{Scheduler, SchedulerConfig};
pub use shuffle::{PartitionLocation, ShuffleMaster, ShuffleServiceSpec, ShuffleServiceType};
pub use slot_pool::TaskManagerSpec;
pub use validate::validate_job_graph;

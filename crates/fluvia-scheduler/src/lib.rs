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

pub mod adaptive;
mod adaptive_setup;
pub mod deployment;
mod deployment_factory;
pub mod execution_graph;
mod failover;
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
pub use job::{AdaptiveJob, Job, JobState, SharedSlot};
pub use protocol::{Action, Event};
pub use scheduler::{Scheduler, SchedulerConfig};
pub use shuffle::{PartitionLocation, ShuffleMaster, ShuffleServiceSpec, ShuffleServiceType};
pub use slot_pool::TaskManagerSpec;
pub use validate::validate_job_graph;

//! Scheduling data structures. For now: the [`ExecutionGraph`], the JobGraph
//! expanded by parallelism into execution vertices with their attempts, the
//! result partitions each subtask produces and the subpartition *ranges* each
//! consumer reads (ranges, not single indices, because the adaptive batch
//! scheduler will hand one consumer several subpartitions).
//!
//! This crate decides who reads what; it does not run anything and knows
//! nothing of buffers or threads.

pub mod execution_graph;

pub use execution_graph::{
    ConsumedPartition, Execution, ExecutionGraph, ExecutionJobVertex, ExecutionState,
    ExecutionVertex, IntermediateResult, SubpartitionRange,
};

//! The first two of Fluvia's four graphs.
//!
//! - [`StreamGraph`]: one node per operator as the API (or the SQL planner)
//!   wrote it, edges with partitioners and exchange modes. Built through a
//!   [`StreamGraphBuilder`], which resolves defaults the way Flink does (default
//!   partitioner, slot sharing group inheritance, max parallelism) and rejects
//!   illegal jobs before anything runs.
//! - [`JobGraph`]: the StreamGraph after operator chaining
//!   ([`JobGraphGenerator`]), one [`JobVertex`] per chain. It is closure-free and
//!   serialisable; operators are referenced by stream node id and a stable
//!   operator id. This is what is shipped to TaskManagers and what the plan
//!   JSON, the DOT output and the Web UI show ([`plan`]).
//!
//! This crate knows nothing of record types, user functions, threads or
//! buffers.

pub mod chaining;
pub mod job_graph;
pub mod plan;
pub mod stream_graph;

pub use chaining::JobGraphGenerator;
pub use job_graph::{
    ChainedOperator, IntermediateDataSet, JobEdge, JobGraph, JobType, JobVertex, NetworkOutput,
    SideOutputEdges, components,
};
pub use stream_graph::{
    CoordinatorSpec, StreamEdge, StreamGraph, StreamGraphBuilder, StreamNode, StreamNodeId,
};

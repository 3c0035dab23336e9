//! Fluvia as a distributed system: the JobManager and TaskManager processes.
//!
//! - [`jobmanager`]: accepts TaskManagers and jobs over gRPC, keeps the
//!   ExecutionGraph of every job, assigns subtasks to slots, deploys tasks
//!   (all at once for streaming, vertex by vertex as blocking inputs finish
//!   for batch), detects lost TaskManagers by heartbeat, restarts jobs, and
//!   serves the REST API ([`rest`]).
//! - [`taskmanager`]: registers its slots and data port, runs deployed tasks
//!   with the same task code as the embedded runtime, exchanges data with
//!   other TaskManagers over the TCP data plane, and reports task states.
//! - [`client`]: what `fluvia run --jobmanager`, `list` and `cancel` use.
//!
//! User code is shipped by *application mode*: every role runs the same
//! binary, which carries the programs ([`program::ProgramCatalog`]); a job
//! names a program and its arguments, every process rebuilds the same
//! JobGraph from them, and fingerprints are compared so a process with
//! different code is refused. This crate knows no concrete program.

pub mod client;
pub mod config;
pub mod deployment;
pub mod jobmanager;
pub mod minicluster;
pub mod program;
pub mod rest;
pub mod security;
pub mod taskmanager;

/// Generated gRPC code for `proto/cluster.proto`.
pub mod rpc {
    #![allow(clippy::all, missing_docs, clippy::unwrap_used)]
    tonic::include_proto!("fluvia.cluster");
}

//! What the scheduler tells a TaskManager to run: the contract types of
//! `fluvia-deployment`, re-exported so the scheduler's callers name them
//! from one place.

pub use fluvia_deployment::{
    ExecutionAttemptId, InputDescriptor, OutputDescriptor, PartitionRef, ShuffleServiceTarget,
    TaskDeploymentDescriptor,
};

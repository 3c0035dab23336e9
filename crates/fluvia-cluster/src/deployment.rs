//! What the JobManager sends a TaskManager to start one subtask: everything
//! needed to rebuild the task's chain and wire its inputs and outputs.

use crate::program::ProgramSpec;
use fluvia_core::{Configuration, PartitionerKind};
use fluvia_network::net::protocol::ResultPartitionId;
use serde::{Deserialize, Serialize};

/// A produced partition, by data set (hex), producing subtask and attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRef {
    pub data_set: u128,
    pub producer_subtask: u32,
    pub attempt: u32,
}

impl From<PartitionRef> for ResultPartitionId {
    fn from(p: PartitionRef) -> Self {
        ResultPartitionId {
            data_set: p.data_set,
            producer_subtask: p.producer_subtask,
            attempt: p.attempt,
        }
    }
}

/// One input channel of the task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputDescriptor {
    /// The consuming operator's input (0, or 1/2).
    pub type_number: u8,
    pub partition: PartitionRef,
    pub subpartition: u32,
    /// The producing TaskManager's data address.
    pub producer_address: String,
    /// The producer runs on the same TaskManager: read it in place.
    pub local: bool,
}

/// One produced data set of the task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputDescriptor {
    pub data_set: u128,
    pub num_subpartitions: usize,
    pub partitioner: PartitionerKind,
    pub consumer_max_parallelism: usize,
    pub blocking: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskDeploymentDescriptor {
    pub job_id: String,
    pub program: ProgramSpec,
    /// Fingerprint of the JobGraph the JobManager schedules.
    pub job_fingerprint: String,
    pub config: Configuration,
    pub vertex_index: usize,
    pub subtask: usize,
    pub attempt: u32,
    pub inputs: Vec<InputDescriptor>,
    pub outputs: Vec<OutputDescriptor>,
}

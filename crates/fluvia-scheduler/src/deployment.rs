//! What the scheduler tells a TaskManager to run: one attempt of one
//! subtask, with the partitions it reads (which attempt, where) and the ones
//! it writes. Plain data; the JobManager adds the program and configuration.

use fluvia_core::{JobId, PartitionerKind};
use serde::{Deserialize, Serialize};

/// One attempt of one subtask of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ExecutionAttemptId {
    pub job: JobId,
    /// Index of the JobVertex (topological order).
    pub vertex: usize,
    pub subtask: usize,
    pub attempt: u32,
}

impl std::fmt::Display for ExecutionAttemptId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}#{}",
            self.job, self.vertex, self.subtask, self.attempt
        )
    }
}

/// A produced partition: data set, producing subtask and its attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PartitionRef {
    pub data_set: u128,
    pub producer_subtask: u32,
    pub attempt: u32,
}

/// One input channel of the task: a range of subpartitions of one
/// producer's partition, read as one channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputDescriptor {
    /// The consuming operator's input (0, or 1/2).
    pub type_number: u8,
    pub partition: PartitionRef,
    pub first_subpartition: u32,
    pub last_subpartition: u32,
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
    /// Set when the partition goes to an external shuffle service: the
    /// producer writes it into the service's directory and hands it over.
    pub shuffle_service: Option<ShuffleServiceTarget>,
}

/// The shuffle service a blocking partition is handed over to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShuffleServiceTarget {
    pub id: String,
    /// Its directory, on the producer's host.
    pub dir: String,
    pub rpc_address: String,
}

/// A deployment decided by the scheduler.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deployment {
    pub attempt: ExecutionAttemptId,
    pub task_manager: String,
    /// The vertex's parallelism (decided at runtime under the adaptive
    /// batch scheduler) and max parallelism.
    pub parallelism: usize,
    pub max_parallelism: usize,
    /// The key groups this subtask owns when its keyed input was written
    /// per key group (else derived from the parallelism, as in Flink).
    pub key_group_range: Option<crate::SubpartitionRange>,
    pub inputs: Vec<InputDescriptor>,
    pub outputs: Vec<OutputDescriptor>,
}

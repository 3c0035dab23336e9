//! How both sides name an attempt and a produced partition.

use fluvia_core::JobId;
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

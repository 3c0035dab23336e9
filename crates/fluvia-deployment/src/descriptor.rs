//! What the scheduler tells a TaskManager to run: one attempt of one
//! subtask, with the partitions it reads (which attempt, where) and the ones
//! it writes. The JobManager ships it with the job's program and
//! configuration; the task reads its identity and parallelism from it.

use crate::ids::{ExecutionAttemptId, PartitionRef};
use fluvia_core::PartitionerKind;
use serde::{Deserialize, Serialize};

/// An inclusive range of indices: of subpartitions a consumer reads, or of
/// key groups a subtask owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubpartitionRange {
    pub start: usize,
    pub end: usize,
}

impl SubpartitionRange {
    pub fn single(i: usize) -> Self {
        SubpartitionRange { start: i, end: i }
    }

    pub fn iter(self) -> std::ops::RangeInclusive<usize> {
        self.start..=self.end
    }
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

/// One attempt of one subtask, as the scheduler decided it (Flink's
/// `TaskDeploymentDescriptor`, without the job information the JobManager
/// adds on the wire).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskDeploymentDescriptor {
    pub attempt: ExecutionAttemptId,
    pub task_manager: String,
    /// The vertex's parallelism (decided at runtime under the adaptive
    /// batch scheduler; the JobGraph's is only a default) and max
    /// parallelism.
    pub parallelism: usize,
    pub max_parallelism: usize,
    /// The key groups this subtask owns when its keyed input was written
    /// per key group (else derived from the parallelism, as in Flink).
    pub key_group_range: Option<SubpartitionRange>,
    pub inputs: Vec<InputDescriptor>,
    pub outputs: Vec<OutputDescriptor>,
    /// The checkpoint or savepoint the subtask's operators restore their
    /// state from (none: a fresh start).
    #[serde(default)]
    pub restore: Option<crate::checkpoint::TaskRestore>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use fluvia_core::JobId;

    #[test]
    fn a_descriptor_survives_json() {
        let d = TaskDeploymentDescriptor {
            attempt: ExecutionAttemptId {
                job: JobId(7),
                vertex: 1,
                subtask: 2,
                attempt: 3,
            },
            task_manager: "tm-1".into(),
            parallelism: 4,
            max_parallelism: 128,
            key_group_range: Some(SubpartitionRange { start: 32, end: 63 }),
            inputs: vec![InputDescriptor {
                type_number: 0,
                partition: PartitionRef {
                    data_set: 9,
                    producer_subtask: 0,
                    attempt: 1,
                },
                first_subpartition: 2,
                last_subpartition: 2,
                producer_address: "host:1".into(),
                local: false,
            }],
            outputs: vec![OutputDescriptor {
                data_set: 10,
                num_subpartitions: 4,
                partitioner: PartitionerKind::Hash,
                consumer_max_parallelism: 128,
                blocking: true,
                shuffle_service: Some(ShuffleServiceTarget {
                    id: "ss".into(),
                    dir: "/d".into(),
                    rpc_address: "host:2".into(),
                }),
            }],
            restore: None,
        };
        let json = serde_json::to_string(&d).unwrap();
        let back: TaskDeploymentDescriptor = serde_json::from_str(&json).unwrap();
        assert_eq!(back, d);
    }
}

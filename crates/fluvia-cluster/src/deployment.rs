//! The wire boundary of a deployment: what the JobManager sends a
//! TaskManager to start one attempt — the scheduler's
//! [`TaskDeploymentDescriptor`] as it is, plus the [`JobInformation`] every
//! process needs to rebuild the task's chain (program, fingerprint,
//! configuration) — and the conversions between the contract types of
//! `fluvia-deployment` (attempt ids, states, metrics) and their protobuf form.

use crate::program::ProgramSpec;
use crate::rpc;
use fluvia_core::{Configuration, IntermediateDataSetId, JobId};
pub use fluvia_deployment::{
    AttemptMetrics, ExecutionAttemptId, ExecutionState, InputDescriptor, OutputDescriptor,
    PartitionRef, StagedFile, TaskDeploymentDescriptor,
};
use fluvia_network::net::protocol::ResultPartitionId;
use serde::{Deserialize, Serialize};

pub fn partition_id(p: PartitionRef) -> ResultPartitionId {
    ResultPartitionId {
        data_set: p.data_set,
        producer_subtask: p.producer_subtask,
        attempt: p.attempt,
    }
}

/// What rebuilds a deployed task's job on a TaskManager (Flink's
/// `JobInformation`): shipped beside each [`TaskDeploymentDescriptor`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobInformation {
    pub program: ProgramSpec,
    /// Fingerprint of the JobGraph the JobManager schedules.
    pub job_fingerprint: String,
    pub config: Configuration,
    /// `program` is left empty: an earlier deployment of the same
    /// `DeployTasks` call carries the job's (a SQL job's program holds
    /// every fragment, a few hundred KB, once per call instead of once
    /// per task).
    #[serde(default)]
    pub program_in_call: bool,
}

pub fn state_to_proto(s: ExecutionState) -> rpc::AttemptState {
    match s {
        ExecutionState::Created => rpc::AttemptState::Created,
        ExecutionState::Scheduled => rpc::AttemptState::Scheduled,
        ExecutionState::Deploying => rpc::AttemptState::Deploying,
        ExecutionState::Initializing => rpc::AttemptState::Initializing,
        ExecutionState::Running => rpc::AttemptState::Running,
        ExecutionState::Finished => rpc::AttemptState::Finished,
        ExecutionState::Canceling => rpc::AttemptState::Canceling,
        ExecutionState::Canceled => rpc::AttemptState::Canceled,
        ExecutionState::Failed => rpc::AttemptState::Failed,
    }
}

/// The state of a report; `None` for an unknown or unset value.
pub fn state_from_proto(s: i32) -> Option<ExecutionState> {
    Some(match rpc::AttemptState::try_from(s).ok()? {
        rpc::AttemptState::Unspecified => return None,
        rpc::AttemptState::Created => ExecutionState::Created,
        rpc::AttemptState::Scheduled => ExecutionState::Scheduled,
        rpc::AttemptState::Deploying => ExecutionState::Deploying,
        rpc::AttemptState::Initializing => ExecutionState::Initializing,
        rpc::AttemptState::Running => ExecutionState::Running,
        rpc::AttemptState::Finished => ExecutionState::Finished,
        rpc::AttemptState::Canceling => ExecutionState::Canceling,
        rpc::AttemptState::Canceled => ExecutionState::Canceled,
        rpc::AttemptState::Failed => ExecutionState::Failed,
    })
}

pub fn attempt_ref(a: &ExecutionAttemptId) -> rpc::AttemptRef {
    rpc::AttemptRef {
        job_id: a.job.to_string(),
        vertex_index: a.vertex as u32,
        subtask: a.subtask as u32,
        attempt: a.attempt,
    }
}

pub fn attempt_id(r: &rpc::AttemptRef) -> Option<ExecutionAttemptId> {
    Some(ExecutionAttemptId {
        job: JobId::try_from(r.job_id.clone()).ok()?,
        vertex: r.vertex_index as usize,
        subtask: r.subtask as usize,
        attempt: r.attempt,
    })
}

/// A partition as the control plane names it (data set in hex).
pub fn partition_to_proto(p: &PartitionRef) -> rpc::PartitionId {
    rpc::PartitionId {
        data_set: IntermediateDataSetId(p.data_set).to_string(),
        producer_subtask: p.producer_subtask,
        attempt: p.attempt,
    }
}

pub fn partition_from_proto(p: &rpc::PartitionId) -> Option<PartitionRef> {
    Some(PartitionRef {
        data_set: IntermediateDataSetId::try_from(p.data_set.clone()).ok()?.0,
        producer_subtask: p.producer_subtask,
        attempt: p.attempt,
    })
}

/// A `$ty` struct literal whose counters, named alike in [`AttemptMetrics`]
/// and [`rpc::TaskMetrics`], are `$m`'s; `$rest` are its other fields.
macro_rules! with_metric_counters {
    ($($ty:ident)::+, $m:ident, { $($rest:tt)* }) => {
        $($ty)::+ {
            records_in: $m.records_in,
            records_out: $m.records_out,
            bytes_in: $m.bytes_in,
            bytes_out: $m.bytes_out,
            buffers_in: $m.buffers_in,
            buffers_out: $m.buffers_out,
            operator_records: $m.operator_records.clone(),
            output_buffers_max_in_use: $m.output_buffers_max_in_use,
            output_buffers_limit: $m.output_buffers_limit,
            backpressure_waits: $m.backpressure_waits,
            busy_ms_per_second: $m.busy_ms_per_second,
            idle_ms_per_second: $m.idle_ms_per_second,
            back_pressured_ms_per_second: $m.back_pressured_ms_per_second,
            $($rest)*
        }
    };
}

pub fn metrics_to_proto(m: &AttemptMetrics) -> rpc::TaskMetrics {
    with_metric_counters!(rpc::TaskMetrics, m, {
        outputs: m
            .subpartition_bytes
            .iter()
            .enumerate()
            .map(|(i, bytes)| rpc::OutputStats {
                subpartition_bytes: bytes.clone(),
                subpartition_records: m.subpartition_records.get(i).cloned().unwrap_or_default(),
            })
            .collect(),
        accumulators: m
            .accumulators
            .iter()
            .map(|(name, value)| rpc::Accumulator {
                name: name.clone(),
                value: value.clone(),
            })
            .collect(),
        staged_files: m
            .staged_files
            .iter()
            .map(|f| rpc::StagedFile {
                pending: f.pending.clone(),
                target: f.target.clone(),
            })
            .collect(),
    })
}

pub fn metrics_from_proto(m: &rpc::TaskMetrics) -> AttemptMetrics {
    with_metric_counters!(AttemptMetrics, m, {
        subpartition_bytes: m.outputs.iter().map(|o| o.subpartition_bytes.clone()).collect(),
        subpartition_records: m.outputs.iter().map(|o| o.subpartition_records.clone()).collect(),
        accumulators: m
            .accumulators
            .iter()
            .map(|a| (a.name.clone(), a.value.clone()))
            .collect(),
        staged_files: m
            .staged_files
            .iter()
            .map(|f| StagedFile {
                pending: f.pending.clone(),
                target: f.target.clone(),
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_metrics_cross_the_wire_as_themselves() {
        let m = AttemptMetrics {
            records_in: 1,
            records_out: 2,
            bytes_in: 3,
            bytes_out: 4,
            buffers_in: 5,
            buffers_out: 6,
            operator_records: vec![7, 8],
            subpartition_bytes: vec![vec![9, 10], vec![11]],
            subpartition_records: vec![vec![12, 13], vec![14]],
            output_buffers_max_in_use: 15,
            output_buffers_limit: 16,
            backpressure_waits: 17,
            busy_ms_per_second: 18.5,
            idle_ms_per_second: 19.5,
            back_pressured_ms_per_second: 20.5,
            accumulators: vec![("rows".into(), vec![21])],
            staged_files: vec![StagedFile {
                pending: "p".into(),
                target: "t".into(),
            }],
        };
        assert_eq!(metrics_from_proto(&metrics_to_proto(&m)), m);
    }

    #[test]
    fn every_attempt_state_crosses_the_wire_as_itself() {
        for s in ExecutionState::ALL {
            assert_eq!(state_from_proto(state_to_proto(s).into()), Some(s), "{s:?}");
        }
        assert_eq!(state_from_proto(0), None, "unset");
        assert_eq!(state_from_proto(99), None, "unknown");
    }
}

//! The deployment factory: turns a scheduled attempt into its
//! [`TaskDeploymentDescriptor`] (Flink's `TaskDeploymentDescriptorFactory`):
//! which producer attempt each input reads and where (its TaskManager or
//! shuffle service), the subpartitions of each output and where blocking
//! ones go, and the key groups the subtask owns. It reads the job, the slot
//! pool and the shuffle master and changes nothing.

use crate::deployment::{
    InputDescriptor, OutputDescriptor, PartitionRef, ShuffleServiceTarget, TaskDeploymentDescriptor,
};
use crate::execution_graph::ExecutionState;
use crate::job::Job;
use crate::shuffle::{PartitionLocation, ShuffleMaster, ShuffleServiceType};
use crate::slot_pool::SlotPool;
use fluvia_core::{PartitionerKind, Result, ResultPartitionType};

/// Builds descriptors from what the scheduler knows now.
pub(crate) struct DeploymentFactory<'a> {
    pub pool: &'a SlotPool,
    pub shuffle: &'a ShuffleMaster,
}

impl DeploymentFactory<'_> {
    /// Whether the partitions of subtask `(v, i)`'s winner can be read: it
    /// finished on a TaskManager that has not been lost since.
    pub(crate) fn results_available(&self, job: &Job, v: usize, i: usize) -> bool {
        job.eg.vertices[v].subtasks[i].winner().is_some_and(|w| {
            let key = (v, i, w.attempt_number);
            !job.lost_partitions.contains(&key)
                && match job.shuffle_locations.get(&key) {
                    Some(service) => self.shuffle.service(service).is_some(),
                    None => w
                        .task_manager
                        .as_deref()
                        .is_some_and(|t| self.pool.contains(t)),
                }
        })
    }

    /// Whether every blocking partition `(v, i)` reads can be read (see
    /// [`Self::results_available`]).
    pub(crate) fn blocking_inputs_ready(&self, job: &Job, v: usize, i: usize) -> bool {
        job.eg.vertices[v].subtasks[i].consumed.iter().all(|cp| {
            let r = &job.eg.results[cp.result];
            r.result_partition_type != ResultPartitionType::Blocking
                || self.results_available(job, r.producer, cp.producer_subtask)
        })
    }

    /// The deployment of attempt `n` of subtask `(v, i)`, if its inputs are
    /// available; an error
    /// if its partitions have nowhere to go.
    pub(crate) fn build(
        &self,
        job: &Job,
        v: usize,
        i: usize,
        n: u32,
    ) -> Result<Option<TaskDeploymentDescriptor>> {
        let sub = &job.eg.vertices[v].subtasks[i];
        let Some(tm) = sub.attempt(n).and_then(|e| e.task_manager.clone()) else {
            return Ok(None);
        };
        let Some(tm_spec) = self.pool.spec(&tm) else {
            return Ok(None);
        };
        let produces_blocking = job.graph.vertices[v].produced_data_sets.iter().any(|ds| {
            job.eg.results.iter().any(|r| {
                r.data_set == ds.id && r.result_partition_type == ResultPartitionType::Blocking
            })
        });
        let target = match (produces_blocking, job.shuffle_service_type) {
            (true, ShuffleServiceType::External) => {
                match self.shuffle.register_partition_with_producer(
                    ShuffleServiceType::External,
                    &tm,
                    &tm_spec.data_address,
                )? {
                    PartitionLocation::ShuffleService(id) => {
                        self.shuffle.service(&id).map(|s| ShuffleServiceTarget {
                            id: s.id.clone(),
                            dir: s.dir.clone(),
                            rpc_address: s.rpc_address.clone(),
                        })
                    }
                    PartitionLocation::TaskManager(_) => None,
                }
            }
            _ => None,
        };
        Ok(self.build_with(job, v, i, n, tm, target))
    }

    fn build_with(
        &self,
        job: &Job,
        v: usize,
        i: usize,
        n: u32,
        tm: String,
        target: Option<ShuffleServiceTarget>,
    ) -> Option<TaskDeploymentDescriptor> {
        let sub = &job.eg.vertices[v].subtasks[i];
        let mut inputs = Vec::new();
        for cp in &sub.consumed {
            let r = &job.eg.results[cp.result];
            let producer = &job.eg.vertices[r.producer].subtasks[cp.producer_subtask];
            let source = match r.result_partition_type {
                ResultPartitionType::Blocking => {
                    if !self.results_available(job, r.producer, cp.producer_subtask) {
                        return None;
                    }
                    producer.winner()?
                }
                ResultPartitionType::PipelinedBounded => producer.winner().or_else(|| {
                    producer.attempts.iter().rev().find(|e| match e.state {
                        ExecutionState::Initializing | ExecutionState::Running => true,
                        // Its deployment goes to the same TaskManager ahead
                        // of this one: the partition is there when asked.
                        ExecutionState::Deploying => e.task_manager.as_deref() == Some(&tm),
                        _ => false,
                    })
                })?,
            };
            let ptm = source.task_manager.as_deref()?;
            let at_service = (r.result_partition_type == ResultPartitionType::Blocking)
                .then(|| {
                    job.shuffle_locations.get(&(
                        r.producer,
                        cp.producer_subtask,
                        source.attempt_number,
                    ))
                })
                .flatten();
            let (address, local) = match at_service {
                Some(service) => (self.shuffle.service(service)?.data_address.clone(), false),
                None => (self.pool.spec(ptm)?.data_address.clone(), ptm == tm),
            };
            inputs.push(InputDescriptor {
                type_number: cp.type_number,
                partition: PartitionRef {
                    data_set: r.data_set.0,
                    producer_subtask: cp.producer_subtask as u32,
                    attempt: source.attempt_number,
                },
                first_subpartition: cp.subpartitions.start as u32,
                last_subpartition: cp.subpartitions.end as u32,
                producer_address: address,
                local,
            });
        }
        let mut outputs = Vec::new();
        for ds in &job.graph.vertices[v].produced_data_sets {
            let r = job.eg.results.iter().find(|r| r.data_set == ds.id)?;
            outputs.push(OutputDescriptor {
                data_set: ds.id.0,
                num_subpartitions: r.num_subpartitions[i],
                partitioner: r.partitioner,
                consumer_max_parallelism: r.consumer_max_parallelism,
                blocking: r.result_partition_type == ResultPartitionType::Blocking,
                shuffle_service: target
                    .clone()
                    .filter(|_| r.result_partition_type == ResultPartitionType::Blocking),
            });
        }
        // A keyed consumer of a result written per key group reads exactly
        // the key groups of its subpartition range.
        let key_group_range = sub
            .consumed
            .iter()
            .find(|cp| {
                let r = &job.eg.results[cp.result];
                r.dynamic && r.partitioner == PartitionerKind::Hash
            })
            .map(|cp| cp.subpartitions);
        let ejv = &job.eg.vertices[v];
        Some(TaskDeploymentDescriptor {
            attempt: job.attempt_id(v, i, n),
            task_manager: tm,
            parallelism: ejv.parallelism,
            max_parallelism: ejv.max_parallelism,
            key_group_range,
            inputs,
            outputs,
            // The JobManager adds the restore handles of its latest
            // completed checkpoint.
            restore: None,
        })
    }
}

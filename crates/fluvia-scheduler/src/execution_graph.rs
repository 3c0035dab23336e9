//! The JobGraph expanded by parallelism.
//!
//! Connection patterns follow Flink's `EdgeManagerBuildUtil`:
//! - all-to-all: every producer subtask has one subpartition per consumer
//!   subtask; consumer `j` reads subpartition `j` of every producer.
//! - pointwise with equal parallelism: producer `i` has one subpartition, read
//!   by consumer `i`.
//! - pointwise, more producers than consumers: consumer `i` reads producers
//!   `[i*P/C, (i+1)*P/C)`, each with one subpartition.
//! - pointwise, fewer producers: producer `p` feeds consumers
//!   `[ceil(p*C/P), ceil((p+1)*C/P))`, one subpartition each.

use fluvia_core::{
    DistributionPattern, IntermediateDataSetId, JobId, JobVertexId, PartitionerKind, Result,
    ResultPartitionType, internal_err,
};
use fluvia_graph::JobGraph;
use serde::{Deserialize, Serialize};

/// Flink's `ExecutionState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecutionState {
    Created,
    Scheduled,
    Deploying,
    Initializing,
    Running,
    Finished,
    Canceling,
    Canceled,
    Failed,
}

impl ExecutionState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            ExecutionState::Finished | ExecutionState::Canceled | ExecutionState::Failed
        )
    }
}

/// One attempt to run a subtask.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Execution {
    pub attempt_number: u32,
    pub state: ExecutionState,
}

/// An inclusive range of subpartition indices.
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

/// One producer partition a consumer reads, and which of its subpartitions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumedPartition {
    /// Index into [`ExecutionGraph::results`].
    pub result: usize,
    pub producer_subtask: usize,
    pub subpartitions: SubpartitionRange,
    /// The consuming operator's input (0, or 1/2 for two inputs).
    pub type_number: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionVertex {
    pub subtask_index: usize,
    pub attempts: Vec<Execution>,
    /// Indices into [`ExecutionGraph::results`] this subtask produces.
    pub produced_results: Vec<usize>,
    pub consumed: Vec<ConsumedPartition>,
}

impl ExecutionVertex {
    pub fn current_attempt(&self) -> &Execution {
        // Invariant: every vertex is created with attempt 0.
        &self.attempts[self.attempts.len() - 1]
    }

    pub fn current_attempt_mut(&mut self) -> &mut Execution {
        let last = self.attempts.len() - 1;
        &mut self.attempts[last]
    }

    /// Starts a new attempt (failover, speculation) and returns its number.
    pub fn new_attempt(&mut self) -> u32 {
        let n = self.attempts.len() as u32;
        self.attempts.push(Execution {
            attempt_number: n,
            state: ExecutionState::Created,
        });
        n
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionJobVertex {
    pub job_vertex: JobVertexId,
    pub name: String,
    pub parallelism: usize,
    pub max_parallelism: usize,
    pub subtasks: Vec<ExecutionVertex>,
}

/// A data set expanded: one partition per producer subtask.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntermediateResult {
    pub data_set: IntermediateDataSetId,
    /// Index into [`ExecutionGraph::vertices`].
    pub producer: usize,
    pub consumer: usize,
    pub partitioner: PartitionerKind,
    pub result_partition_type: ResultPartitionType,
    /// Subpartitions of each producer subtask's partition.
    pub num_subpartitions: Vec<usize>,
    /// The consumer's max parallelism: the key groups of a HASH edge.
    pub consumer_max_parallelism: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionGraph {
    pub job_id: JobId,
    pub job_name: String,
    /// Same order as the JobGraph's vertices (topological).
    pub vertices: Vec<ExecutionJobVertex>,
    pub results: Vec<IntermediateResult>,
}

impl ExecutionGraph {
    pub fn from_job_graph(jg: &JobGraph) -> Result<Self> {
        let mut vertices: Vec<ExecutionJobVertex> = jg
            .vertices
            .iter()
            .map(|v| ExecutionJobVertex {
                job_vertex: v.id,
                name: v.name.clone(),
                parallelism: v.parallelism,
                max_parallelism: v.max_parallelism,
                subtasks: (0..v.parallelism)
                    .map(|i| ExecutionVertex {
                        subtask_index: i,
                        attempts: vec![Execution {
                            attempt_number: 0,
                            state: ExecutionState::Created,
                        }],
                        produced_results: Vec::new(),
                        consumed: Vec::new(),
                    })
                    .collect(),
            })
            .collect();
        let mut results = Vec::new();

        for (consumer_idx, v) in jg.vertices.iter().enumerate() {
            for edge in &v.inputs {
                let Some(producer_idx) = jg.vertex_index(edge.source_vertex) else {
                    return internal_err!("edge into '{}' from an unknown vertex", v.name);
                };
                let p = jg.vertices[producer_idx].parallelism;
                let c = v.parallelism;
                let result_idx = results.len();
                let mut num_subpartitions = vec![0usize; p];
                let mut consumed: Vec<Vec<ConsumedPartition>> = vec![Vec::new(); c];
                let mut connect = |producer: usize, consumer: usize, sp: usize| {
                    consumed[consumer].push(ConsumedPartition {
                        result: result_idx,
                        producer_subtask: producer,
                        subpartitions: SubpartitionRange::single(sp),
                        type_number: edge.type_number,
                    });
                };
                match edge.distribution_pattern {
                    DistributionPattern::AllToAll => {
                        for (producer, n) in num_subpartitions.iter_mut().enumerate() {
                            *n = c;
                            for consumer in 0..c {
                                connect(producer, consumer, consumer);
                            }
                        }
                    }
                    DistributionPattern::Pointwise if p == c => {
                        for (i, n) in num_subpartitions.iter_mut().enumerate() {
                            *n = 1;
                            connect(i, i, 0);
                        }
                    }
                    DistributionPattern::Pointwise if p > c => {
                        // Every producer has one subpartition; consumer
                        // `producer * c / p` reads it (the inverse of the
                        // range [i*P/C, (i+1)*P/C)).
                        for (producer, n) in num_subpartitions.iter_mut().enumerate() {
                            *n = 1;
                            let consumer = (0..c)
                                .find(|&j| producer < (j + 1) * p / c)
                                .unwrap_or(c - 1);
                            connect(producer, consumer, 0);
                        }
                    }
                    DistributionPattern::Pointwise => {
                        for (producer, n) in num_subpartitions.iter_mut().enumerate() {
                            let start = (producer * c).div_ceil(p);
                            let end = ((producer + 1) * c).div_ceil(p);
                            *n = end - start;
                            for (sp, consumer) in (start..end).enumerate() {
                                connect(producer, consumer, sp);
                            }
                        }
                    }
                }
                for (consumer, list) in consumed.into_iter().enumerate() {
                    vertices[consumer_idx].subtasks[consumer]
                        .consumed
                        .extend(list);
                }
                for sub in &mut vertices[producer_idx].subtasks {
                    sub.produced_results.push(result_idx);
                }
                results.push(IntermediateResult {
                    data_set: edge.source_data_set,
                    producer: producer_idx,
                    consumer: consumer_idx,
                    partitioner: edge.partitioner,
                    result_partition_type: edge.result_partition_type,
                    num_subpartitions,
                    consumer_max_parallelism: v.max_parallelism,
                });
            }
        }
        Ok(ExecutionGraph {
            job_id: jg.job_id,
            job_name: jg.name.clone(),
            vertices,
            results,
        })
    }

    /// The result a vertex writes for one of its produced data sets.
    pub fn result_for_data_set(&self, data_set: IntermediateDataSetId) -> Option<usize> {
        self.results.iter().position(|r| r.data_set == data_set)
    }

    pub fn num_subtasks(&self) -> usize {
        self.vertices.iter().map(|v| v.subtasks.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fluvia_core::{Configuration, ExchangeMode};
    use fluvia_graph::{JobGraphGenerator, StreamGraphBuilder};

    fn graph(p: usize, c: usize, part: PartitionerKind) -> ExecutionGraph {
        let mut b = StreamGraphBuilder::new("t");
        let s = b.add_source("Source: s", true);
        let m = b.add_operator("Map", 1);
        b.set_parallelism(s, p);
        b.set_parallelism(m, c);
        b.add_edge(s, m, Some(part), ExchangeMode::Undefined, 0);
        let jg = JobGraphGenerator::new(&b.build().unwrap())
            .create_job_graph(Configuration::new(), false)
            .unwrap();
        ExecutionGraph::from_job_graph(&jg).unwrap()
    }

    /// Every subpartition of every producer is read by exactly one consumer.
    fn assert_each_subpartition_read_once(eg: &ExecutionGraph) {
        let r = &eg.results[0];
        let mut reads: Vec<Vec<usize>> = r.num_subpartitions.iter().map(|&n| vec![0; n]).collect();
        for sub in &eg.vertices[1].subtasks {
            for cp in &sub.consumed {
                for sp in cp.subpartitions.iter() {
                    reads[cp.producer_subtask][sp] += 1;
                }
            }
        }
        assert!(reads.iter().flatten().all(|&n| n == 1), "{reads:?}");
    }

    #[test]
    fn all_to_all_reads_subpartition_j_from_every_producer() {
        let eg = graph(3, 2, PartitionerKind::Hash);
        assert_eq!(eg.results[0].num_subpartitions, vec![2, 2, 2]);
        let c1 = &eg.vertices[1].subtasks[1].consumed;
        assert_eq!(c1.len(), 3);
        assert!(
            c1.iter()
                .all(|cp| cp.subpartitions == SubpartitionRange::single(1))
        );
        assert_each_subpartition_read_once(&eg);
    }

    #[test]
    fn pointwise_patterns_cover_every_subpartition_once() {
        for (p, c) in [(2, 2), (4, 2), (5, 3), (2, 5), (3, 7), (1, 4), (4, 1)] {
            let eg = graph(p, c, PartitionerKind::Rescale);
            assert_each_subpartition_read_once(&eg);
            assert!(
                eg.vertices[1]
                    .subtasks
                    .iter()
                    .all(|s| !s.consumed.is_empty()),
                "{p}->{c}"
            );
        }
    }

    #[test]
    fn attempts_start_at_zero_and_grow() {
        let mut eg = graph(1, 1, PartitionerKind::Forward);
        let v = &mut eg.vertices[0].subtasks[0];
        assert_eq!(v.current_attempt().attempt_number, 0);
        assert_eq!(v.new_attempt(), 1);
        assert_eq!(v.current_attempt().state, ExecutionState::Created);
    }
}

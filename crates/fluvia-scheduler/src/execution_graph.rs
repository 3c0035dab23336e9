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
pub use fluvia_deployment::{AttemptMetrics, ExecutionState, StagedFile, SubpartitionRange};
use fluvia_graph::JobGraph;
use serde::{Deserialize, Serialize};

/// One attempt to run a subtask.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Execution {
    pub attempt_number: u32,
    pub state: ExecutionState,
    /// Scheduler-clock milliseconds at which each state was entered
    /// (indexed like [`ExecutionState::ALL`]).
    pub state_timestamps: [Option<u64>; 9],
    /// Where it runs (or ran).
    pub task_manager: Option<String>,
    /// The job's shared slot hosting it.
    pub slot: Option<u64>,
    pub failure_cause: Option<String>,
    /// What it reported when it ended.
    pub metrics: Option<AttemptMetrics>,
}

impl Execution {
    pub fn new(attempt_number: u32, now_ms: u64) -> Self {
        let mut e = Execution {
            attempt_number,
            state: ExecutionState::Created,
            state_timestamps: [None; 9],
            task_manager: None,
            slot: None,
            failure_cause: None,
            metrics: None,
        };
        e.state_timestamps[0] = Some(now_ms);
        e
    }

    /// Moves to `state`, stamping the time it was entered.
    pub fn transition(&mut self, state: ExecutionState, now_ms: u64) {
        self.state = state;
        // A task that finished ran, even when its RUNNING report came after
        // (or with) its end: as in Flink, FINISHED follows RUNNING.
        if state == ExecutionState::Finished {
            let running = ExecutionState::ALL
                .iter()
                .position(|s| *s == ExecutionState::Running)
                .unwrap_or(0);
            self.state_timestamps[running].get_or_insert(now_ms);
        }
        let i = ExecutionState::ALL
            .iter()
            .position(|s| *s == state)
            .unwrap_or(0);
        self.state_timestamps[i].get_or_insert(now_ms);
    }

    pub fn timestamp(&self, state: ExecutionState) -> Option<u64> {
        ExecutionState::ALL
            .iter()
            .position(|s| *s == state)
            .and_then(|i| self.state_timestamps[i])
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionVertex {
    pub subtask_index: usize,
    /// Every attempt so far, by attempt number; several may be live at once
    /// (speculative execution).
    pub attempts: Vec<Execution>,
    /// The first attempt that finished: the one whose partitions consumers
    /// read. Cleared when its results are lost.
    pub finished_attempt: Option<u32>,
    /// Indices into [`ExecutionGraph::results`] this subtask produces.
    pub produced_results: Vec<usize>,
    pub consumed: Vec<ConsumedPartition>,
}

impl ExecutionVertex {
    /// The newest attempt.
    pub fn latest_attempt(&self) -> &Execution {
        // Invariant: every vertex is created with attempt 0.
        &self.attempts[self.attempts.len() - 1]
    }

    pub fn attempt(&self, n: u32) -> Option<&Execution> {
        self.attempts.get(n as usize)
    }

    pub fn attempt_mut(&mut self, n: u32) -> Option<&mut Execution> {
        self.attempts.get_mut(n as usize)
    }

    /// The attempt consumers read, if one finished.
    pub fn winner(&self) -> Option<&Execution> {
        self.finished_attempt.and_then(|n| self.attempt(n))
    }

    /// Attempts deployed and not ended.
    pub fn live_attempts(&self) -> impl Iterator<Item = &Execution> {
        self.attempts.iter().filter(|a| a.state.is_live())
    }

    /// Flink's rule: the state of the attempt closest to FINISHED.
    pub fn state(&self) -> ExecutionState {
        if self.finished_attempt.is_some() {
            return ExecutionState::Finished;
        }
        self.attempts
            .iter()
            .map(|a| a.state)
            .filter(|s| *s != ExecutionState::Finished)
            .max_by_key(|s| s.progress())
            .unwrap_or(ExecutionState::Created)
    }

    /// Starts a new attempt (failover, speculation) and returns its number.
    pub fn new_attempt(&mut self, now_ms: u64) -> u32 {
        let n = self.attempts.len() as u32;
        self.attempts.push(Execution::new(n, now_ms));
        n
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionJobVertex {
    pub job_vertex: JobVertexId,
    pub name: String,
    /// Final once `parallelism_decided`; before that the JobGraph's default.
    pub parallelism: usize,
    pub max_parallelism: usize,
    /// Set by the user, or decided by the adaptive batch scheduler.
    pub parallelism_decided: bool,
    /// Left to the adaptive batch scheduler at submission: its producers
    /// write per key group even once it is decided (by its forward group).
    pub started_undecided: bool,
    /// Whether its subtasks exist (Flink's initialized ExecutionJobVertex):
    /// the parallelism is decided and every producer is initialized.
    pub initialized: bool,
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
    pub distribution_pattern: DistributionPattern,
    pub result_partition_type: ResultPartitionType,
    /// The consuming operator's input (0, or 1/2 for two inputs).
    pub type_number: u8,
    /// Whether a skewed subpartition must stay with one subtask (see the
    /// JobEdge's flag).
    pub intra_input_key_correlated: bool,
    /// Subpartitions of each producer subtask's partition (empty until the
    /// producer is initialized).
    pub num_subpartitions: Vec<usize>,
    /// The consumer's max parallelism: the key groups of a HASH edge.
    pub consumer_max_parallelism: usize,
    /// Written before the consumer's parallelism was decided: subpartitions
    /// follow the consumer's max parallelism (one per key group on a HASH
    /// edge, one in all for a broadcast), and consumers read ranges of them.
    pub dynamic: bool,
}

/// What each subtask of a vertex reads of one dynamic result: a partition
/// range and the subpartition range read from each of those partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubtaskInput {
    pub partitions: SubpartitionRange,
    pub subpartitions: SubpartitionRange,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionGraph {
    pub job_id: JobId,
    pub job_name: String,
    /// Same order as the JobGraph's vertices (topological).
    pub vertices: Vec<ExecutionJobVertex>,
    pub results: Vec<IntermediateResult>,
}

impl ExecutionGraph {
    /// Every vertex with the JobGraph's parallelism, initialized.
    pub fn from_job_graph(jg: &JobGraph) -> Result<Self> {
        let mut eg = Self::with_undecided(jg, &vec![false; jg.vertices.len()])?;
        for v in 0..eg.vertices.len() {
            eg.initialize(v, &[], 0)?;
        }
        Ok(eg)
    }

    /// No vertex initialized; those flagged `undecided` wait for a decided
    /// parallelism ([`Self::decide_parallelism`]).
    pub fn with_undecided(jg: &JobGraph, undecided: &[bool]) -> Result<Self> {
        let vertices: Vec<ExecutionJobVertex> = jg
            .vertices
            .iter()
            .enumerate()
            .map(|(i, v)| ExecutionJobVertex {
                job_vertex: v.id,
                name: v.name.clone(),
                parallelism: v.parallelism,
                max_parallelism: v.max_parallelism,
                parallelism_decided: !undecided.get(i).copied().unwrap_or(false),
                started_undecided: undecided.get(i).copied().unwrap_or(false),
                initialized: false,
                subtasks: Vec::new(),
            })
            .collect();
        let mut results = Vec::new();
        for (consumer, v) in jg.vertices.iter().enumerate() {
            for edge in &v.inputs {
                let Some(producer) = jg.vertex_index(edge.source_vertex) else {
                    return internal_err!("edge into '{}' from an unknown vertex", v.name);
                };
                if producer >= consumer {
                    return internal_err!(
                        "the vertices of '{}' are not in topological order",
                        jg.name
                    );
                }
                results.push(IntermediateResult {
                    data_set: edge.source_data_set,
                    producer,
                    consumer,
                    partitioner: edge.partitioner,
                    distribution_pattern: edge.distribution_pattern,
                    result_partition_type: edge.result_partition_type,
                    type_number: edge.type_number,
                    intra_input_key_correlated: edge.intra_input_key_correlated,
                    num_subpartitions: Vec::new(),
                    consumer_max_parallelism: v.max_parallelism,
                    dynamic: false,
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

    /// Results vertex `v` consumes, in the order of its inputs.
    pub fn inputs_of(&self, v: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.results.len()).filter(move |&r| self.results[r].consumer == v)
    }

    /// Whether every producer of `v` is initialized.
    pub fn producers_initialized(&self, v: usize) -> bool {
        self.inputs_of(v)
            .all(|r| self.vertices[self.results[r].producer].initialized)
    }

    pub fn decide_parallelism(&mut self, v: usize, parallelism: usize) -> Result<()> {
        let ejv = &mut self.vertices[v];
        if ejv.initialized {
            return internal_err!("vertex '{}' is initialized already", ejv.name);
        }
        if parallelism == 0 || parallelism > ejv.max_parallelism {
            return internal_err!(
                "parallelism {parallelism} of '{}' is outside 1..={}",
                ejv.name,
                ejv.max_parallelism
            );
        }
        ejv.parallelism = parallelism;
        ejv.parallelism_decided = true;
        Ok(())
    }

    /// Creates the subtasks of `v` (parallelism decided, producers
    /// initialized) and connects them: static results by Flink's patterns,
    /// dynamic ones by `dynamic_inputs` (one list per dynamic result, in
    /// input order, with the slices each subtask reads). Its own results get their
    /// subpartition counts from their consumers as they stand now.
    pub fn initialize(
        &mut self,
        v: usize,
        dynamic_inputs: &[Vec<Vec<SubtaskInput>>],
        now_ms: u64,
    ) -> Result<()> {
        let name = self.vertices[v].name.clone();
        if self.vertices[v].initialized || !self.vertices[v].parallelism_decided {
            return internal_err!("vertex '{name}' cannot be initialized now");
        }
        if !self.producers_initialized(v) {
            return internal_err!("a producer of '{name}' is not initialized");
        }
        let c = self.vertices[v].parallelism;
        let mut consumed: Vec<Vec<ConsumedPartition>> = vec![Vec::new(); c];
        let mut dynamic = dynamic_inputs.iter();
        let inputs: Vec<usize> = self.inputs_of(v).collect();
        for r in inputs {
            let res = &self.results[r];
            let p = self.vertices[res.producer].parallelism;
            let mut connect = |producer: usize, consumer: usize, sp: SubpartitionRange| {
                consumed[consumer].push(ConsumedPartition {
                    result: r,
                    producer_subtask: producer,
                    subpartitions: sp,
                    type_number: res.type_number,
                });
            };
            if res.dynamic {
                let Some(infos) = dynamic.next() else {
                    return internal_err!("no input ranges for a dynamic input of '{name}'");
                };
                if infos.len() != c {
                    return internal_err!(
                        "{} input ranges for the {c} subtasks of '{name}'",
                        infos.len()
                    );
                }
                for (consumer, slices) in infos.iter().enumerate() {
                    for info in slices {
                        let last = info.subpartitions.end;
                        for producer in info.partitions.iter() {
                            if producer >= p || last >= res.num_subpartitions[producer] {
                                return internal_err!(
                                    "input range of '{name}' subtask {consumer} outside the result"
                                );
                            }
                            connect(producer, consumer, info.subpartitions);
                        }
                    }
                }
                continue;
            }
            match res.distribution_pattern {
                DistributionPattern::AllToAll => {
                    for producer in 0..p {
                        for consumer in 0..c {
                            connect(producer, consumer, SubpartitionRange::single(consumer));
                        }
                    }
                }
                DistributionPattern::Pointwise if p == c => {
                    for i in 0..p {
                        connect(i, i, SubpartitionRange::single(0));
                    }
                }
                DistributionPattern::Pointwise if p > c => {
                    // Every producer has one subpartition; consumer
                    // `producer * c / p` reads it (the inverse of the
                    // range [i*P/C, (i+1)*P/C)).
                    for producer in 0..p {
                        let consumer = (0..c)
                            .find(|&j| producer < (j + 1) * p / c)
                            .unwrap_or(c - 1);
                        connect(producer, consumer, SubpartitionRange::single(0));
                    }
                }
                DistributionPattern::Pointwise => {
                    for producer in 0..p {
                        let start = (producer * c).div_ceil(p);
                        let end = ((producer + 1) * c).div_ceil(p);
                        for (sp, consumer) in (start..end).enumerate() {
                            connect(producer, consumer, SubpartitionRange::single(sp));
                        }
                    }
                }
            }
        }
        // A decision at runtime can give more channels than the JobGraph's
        // defaults the submission was checked with.
        let channels: usize = consumed.iter().map(Vec::len).sum::<usize>()
            + self
                .vertices
                .iter()
                .flat_map(|u| &u.subtasks)
                .map(|s| s.consumed.len())
                .sum::<usize>();
        if channels > crate::validate::MAX_CHANNELS {
            return internal_err!(
                "'{name}' at parallelism {c} would bring the job to {channels} input channels, \
                 more than the {} allowed",
                crate::validate::MAX_CHANNELS
            );
        }
        // Outputs: subpartitions per producer subtask, from the consumer's
        // parallelism if decided, else from its max parallelism.
        let outputs: Vec<usize> = (0..self.results.len())
            .filter(|&r| self.results[r].producer == v)
            .collect();
        for &r in &outputs {
            let consumer = &self.vertices[self.results[r].consumer];
            let res = &self.results[r];
            // One-to-one inside a forward group stays one-to-one; any other
            // edge into a vertex that started undecided is written per key
            // group, so its members agree on the keys each subtask holds.
            let one_to_one = res.partitioner == PartitionerKind::Forward;
            let (n, is_dynamic) =
                if consumer.parallelism_decided && (!consumer.started_undecided || one_to_one) {
                    let cp = consumer.parallelism;
                    let counts = match res.distribution_pattern {
                        DistributionPattern::AllToAll => vec![cp; c],
                        DistributionPattern::Pointwise if c >= cp => vec![1; c],
                        DistributionPattern::Pointwise => (0..c)
                            .map(|i| ((i + 1) * cp).div_ceil(c) - (i * cp).div_ceil(c))
                            .collect(),
                    };
                    (counts, false)
                } else {
                    let max = consumer.max_parallelism;
                    let n = match res.distribution_pattern {
                        _ if res.partitioner == PartitionerKind::Broadcast => 1,
                        DistributionPattern::AllToAll => max,
                        DistributionPattern::Pointwise => max.div_ceil(c).max(1),
                    };
                    (vec![n; c], true)
                };
            let res = &mut self.results[r];
            res.num_subpartitions = n;
            res.dynamic = is_dynamic;
        }
        let ejv = &mut self.vertices[v];
        ejv.subtasks = consumed
            .into_iter()
            .enumerate()
            .map(|(i, consumed)| ExecutionVertex {
                subtask_index: i,
                attempts: vec![Execution::new(0, now_ms)],
                finished_attempt: None,
                produced_results: outputs.clone(),
                consumed,
            })
            .collect();
        ejv.initialized = true;
        Ok(())
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
        assert_eq!(v.latest_attempt().attempt_number, 0);
        assert_eq!(v.new_attempt(5), 1);
        assert_eq!(v.latest_attempt().state, ExecutionState::Created);
        assert_eq!(
            v.latest_attempt().timestamp(ExecutionState::Created),
            Some(5)
        );
    }

    #[test]
    fn a_vertex_shows_the_attempt_closest_to_finished() {
        let mut eg = graph(1, 1, PartitionerKind::Forward);
        let v = &mut eg.vertices[0].subtasks[0];
        v.attempts[0].transition(ExecutionState::Failed, 1);
        assert_eq!(v.state(), ExecutionState::Failed);
        v.new_attempt(2);
        v.attempts[1].transition(ExecutionState::Running, 3);
        v.new_attempt(4);
        v.attempts[2].transition(ExecutionState::Deploying, 5);
        assert_eq!(v.state(), ExecutionState::Running);
        v.attempts[2].transition(ExecutionState::Finished, 6);
        v.finished_attempt = Some(2);
        assert_eq!(v.state(), ExecutionState::Finished);
        assert_eq!(v.winner().map(|a| a.attempt_number), Some(2));
    }
}

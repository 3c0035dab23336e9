//! One job as the scheduler sees it: its ExecutionGraph, pipelined regions,
//! shared slots and the per-job state of the scheduler's components
//! (failover, reconciliation, adaptive and speculative execution), with the
//! queries over them that need no other job and no TaskManager.

use crate::adaptive::{BlockingResultInfo, DeciderConfig};
use crate::deployment::{ExecutionAttemptId, PartitionRef};
use crate::execution_graph::{ExecutionGraph, ExecutionState, SubpartitionRange};
use crate::failover::Failover;
use crate::reconciliation::Reconciliation;
use crate::shuffle::ShuffleServiceType;
use crate::skew::{SkewConfig, SkewSplit};
use crate::speculative::SpeculativeConfig;
use fluvia_core::{DistributionPattern, JobId, PartitionerKind, Result, ResultPartitionType};
use fluvia_graph::JobGraph;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// Flink's job states (the ones Fluvia uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum JobState {
    Created,
    Running,
    Restarting,
    Finished,
    Failed,
    Canceled,
}

impl JobState {
    pub fn name(self) -> &'static str {
        match self {
            JobState::Created => "CREATED",
            JobState::Running => "RUNNING",
            JobState::Restarting => "RESTARTING",
            JobState::Finished => "FINISHED",
            JobState::Failed => "FAILED",
            JobState::Canceled => "CANCELED",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Finished | JobState::Failed | JobState::Canceled
        )
    }
}

/// A slot of one job on one TaskManager, hosting at most one attempt of
/// each vertex of its slot sharing group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedSlot {
    pub task_manager: String,
    pub group: String,
    pub index: usize,
    /// (vertex, attempt) of the attempts it hosts (scheduled or live).
    pub hosted: BTreeSet<(usize, usize, u32)>,
}

/// One job as the scheduler sees it.
pub struct Job {
    pub id: JobId,
    pub graph: Arc<JobGraph>,
    pub program: String,
    pub fingerprint: String,
    pub eg: ExecutionGraph,
    pub state: JobState,
    pub failure_cause: Option<String>,
    pub submitted_at: Duration,
    pub ended_at: Option<Duration>,
    /// Failovers so far (each may re-run several subtasks).
    pub restarts: usize,
    /// The strategy its failures restart it under.
    pub restart_strategy: crate::failover::RestartStrategy,
    /// Shared slots by id.
    pub slots: BTreeMap<u64, SharedSlot>,
    pub(crate) next_slot: u64,
    /// Pipelined region of each vertex, and whether it spans pipelined edges.
    pub(crate) region_of: Vec<usize>,
    pub(crate) region_pipelined: Vec<bool>,
    /// Restart decisions and the pending restart.
    pub(crate) failover: Failover,
    pub(crate) preferred: BTreeMap<(String, usize), String>,
    pub(crate) waiting_since: Option<Duration>,
    pub(crate) touched: BTreeSet<String>,
    /// Heartbeats each acknowledged attempt was missing from.
    pub(crate) reconciliation: Reconciliation,
    /// TaskManagers an added attempt should avoid (where its siblings run).
    pub(crate) avoid: BTreeMap<(usize, usize, u32), BTreeSet<String>>,
    /// (vertex, subtask, attempt) of finished attempts whose TaskManager was
    /// lost: their partitions are gone, even once a TaskManager of the same
    /// id registers again.
    pub(crate) lost_partitions: BTreeSet<(usize, usize, u32)>,
    /// `shuffle-service.type` of this job.
    pub shuffle_service_type: ShuffleServiceType,
    /// Attempts whose blocking partitions went to a shuffle service.
    pub shuffle_locations: BTreeMap<(usize, usize, u32), String>,
    /// Since when a producer waits for a shuffle service on its host.
    pub(crate) service_wait_since: Option<Duration>,
    /// The adaptive batch scheduler's settings, when some vertex's
    /// parallelism is decided at runtime.
    pub adaptive: Option<AdaptiveJob>,
    /// Vertices whose skewed subpartitions were split: (vertex, [(subpartition,
    /// input, pieces)]).
    pub skew_splits: Vec<(usize, Vec<SkewSplit>)>,
    /// Join vertices turned into broadcast joins at runtime: (vertex, input
    /// read whole by every subtask).
    pub adaptive_broadcasts: Vec<(usize, usize)>,
    /// Speculative execution's settings (`None`: off).
    pub speculative: Option<SpeculativeConfig>,
    pub(crate) next_slow_check: Duration,
    /// Attempts started because their subtask was slow.
    pub speculative_attempts: BTreeSet<(usize, usize, u32)>,
    /// Flink's `numSlowExecutionVertices` (at the last check) and
    /// `numEffectiveSpeculativeExecutions` (speculative attempts that won).
    pub num_slow_execution_vertices: usize,
    pub num_effective_speculative_executions: usize,
    /// Every subtask finished; these TaskManagers are committing the staged
    /// files of the winning attempts they ran (the job finishes when all
    /// answered).
    pub committing: BTreeSet<String>,
    /// The commit began: every subtask finished for good, nothing runs again.
    pub commit_started: bool,
    /// Winners whose staged files their TaskManager dropped (it
    /// re-registered): they run again before the commit.
    pub(crate) lost_staged: BTreeSet<(usize, usize, u32)>,
}

/// A batch job whose undecided vertices get their parallelism from the data.
#[derive(Debug, Clone)]
pub struct AdaptiveJob {
    pub config: DeciderConfig,
    /// Forward group of each vertex: vertices joined by forward edges share
    /// one parallelism (decided once for all of them).
    pub forward_group: Vec<usize>,
    /// Skew splitting of join sides (`None`: strategy NONE).
    pub skew: Option<SkewConfig>,
    /// Runtime broadcast of a join side below this many bytes (`None`:
    /// strategy NONE).
    pub broadcast_threshold: Option<u64>,
    /// Per forward group, once decided: the number of subpartitions of its
    /// keyed inputs and the range each subtask reads.
    pub group_ranges: BTreeMap<usize, (usize, Vec<SubpartitionRange>)>,
}

/// What the scheduler decided about a job when it was submitted.
pub(crate) struct JobSettings {
    pub program: String,
    pub fingerprint: String,
    pub shuffle_service_type: ShuffleServiceType,
    pub adaptive: Option<AdaptiveJob>,
    pub speculative: Option<SpeculativeConfig>,
}

impl Job {
    /// A submitted job: its ExecutionGraph (`undecided` vertices wait for
    /// the adaptive batch scheduler) and its pipelined regions.
    pub(crate) fn new(
        id: JobId,
        graph: Arc<JobGraph>,
        settings: JobSettings,
        undecided: &[bool],
        now: Duration,
    ) -> Result<Job> {
        let eg = ExecutionGraph::with_undecided(&graph, undecided)?;
        // Pipelined regions: vertices joined by pipelined edges.
        let n = graph.vertices.len();
        let pipelined_edges: Vec<(usize, usize)> = eg
            .results
            .iter()
            .filter(|r| r.result_partition_type == ResultPartitionType::PipelinedBounded)
            .map(|r| (r.producer, r.consumer))
            .collect();
        let mut pipelined = vec![false; n];
        for &(p, c) in &pipelined_edges {
            pipelined[p] = true;
            pipelined[c] = true;
        }
        let region_of = fluvia_graph::components(n, pipelined_edges);
        let mut region_pipelined = vec![false; n];
        for v in 0..n {
            if pipelined[v] {
                region_pipelined[region_of[v]] = true;
            }
        }
        Ok(Job {
            id,
            graph,
            program: settings.program,
            fingerprint: settings.fingerprint,
            eg,
            state: JobState::Created,
            failure_cause: None,
            submitted_at: now,
            ended_at: None,
            restarts: 0,
            restart_strategy: crate::failover::RestartStrategy::None,
            slots: BTreeMap::new(),
            next_slot: 0,
            region_of,
            region_pipelined,
            failover: Failover::default(),
            preferred: BTreeMap::new(),
            waiting_since: None,
            touched: BTreeSet::new(),
            reconciliation: Reconciliation::default(),
            avoid: BTreeMap::new(),
            lost_partitions: BTreeSet::new(),
            shuffle_service_type: settings.shuffle_service_type,
            shuffle_locations: BTreeMap::new(),
            service_wait_since: None,
            adaptive: settings.adaptive,
            skew_splits: Vec::new(),
            adaptive_broadcasts: Vec::new(),
            speculative: settings.speculative,
            next_slow_check: now,
            speculative_attempts: BTreeSet::new(),
            num_slow_execution_vertices: 0,
            num_effective_speculative_executions: 0,
            committing: BTreeSet::new(),
            commit_started: false,
            lost_staged: BTreeSet::new(),
        })
    }

    pub(crate) fn attempt_id(
        &self,
        vertex: usize,
        subtask: usize,
        attempt: u32,
    ) -> ExecutionAttemptId {
        ExecutionAttemptId {
            job: self.id,
            vertex,
            subtask,
            attempt,
        }
    }

    /// Subtasks of vertex `c` that read partition `producer` of result `r`.
    pub(crate) fn consumers_of(&self, r: usize, producer: usize) -> Vec<(usize, usize)> {
        let c = self.eg.results[r].consumer;
        self.eg.vertices[c]
            .subtasks
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.consumed
                    .iter()
                    .any(|cp| cp.result == r && cp.producer_subtask == producer)
            })
            .map(|(i, _)| (c, i))
            .collect()
    }

    pub(crate) fn all_finished(&self) -> bool {
        self.eg
            .vertices
            .iter()
            .all(|v| v.initialized && v.subtasks.iter().all(|s| s.finished_attempt.is_some()))
    }

    /// Whether every subtask of vertex `v` finished (its results are
    /// complete, so their bytes are known).
    pub(crate) fn vertex_finished(&self, v: usize) -> bool {
        let ejv = &self.eg.vertices[v];
        ejv.initialized && ejv.subtasks.iter().all(|s| s.finished_attempt.is_some())
    }

    /// Bytes subtask `i` of vertex `v` reads: the subpartitions it consumes
    /// as their producers reported them (`None` for a source).
    pub(crate) fn input_bytes(&self, v: usize, i: usize) -> Option<u64> {
        let sub = self.eg.vertices.get(v)?.subtasks.get(i)?;
        if sub.consumed.is_empty() {
            return None;
        }
        let mut total = 0u64;
        for cp in &sub.consumed {
            if let Some(b) = self.winner_subpartition_bytes(cp.result, cp.producer_subtask) {
                for s in cp.subpartitions.iter() {
                    total = total.saturating_add(b.get(s).copied().unwrap_or(0));
                }
            }
        }
        Some(total)
    }

    /// What the winner of producer subtask `producer` of result `r` reported
    /// per subpartition of it, if it did.
    pub(crate) fn winner_subpartition_bytes(&self, r: usize, producer: usize) -> Option<&Vec<u64>> {
        let res = &self.eg.results[r];
        let index = self.graph.vertices[res.producer]
            .produced_data_sets
            .iter()
            .position(|d| d.id == res.data_set)?;
        self.eg.vertices[res.producer]
            .subtasks
            .get(producer)?
            .winner()?
            .metrics
            .as_ref()?
            .subpartition_bytes
            .get(index)
    }

    /// Result `r` as the decider sees it: per producer subtask, the bytes
    /// its winner wrote to each subpartition (zeros when not reported).
    pub(crate) fn result_info(&self, r: usize) -> BlockingResultInfo {
        let res = &self.eg.results[r];
        let bytes = res
            .num_subpartitions
            .iter()
            .enumerate()
            .map(|(p, &n)| {
                self.winner_subpartition_bytes(r, p)
                    .filter(|b| b.len() == n)
                    .cloned()
                    .unwrap_or_else(|| vec![0; n])
            })
            .collect();
        if res.partitioner == PartitionerKind::Broadcast {
            BlockingResultInfo::broadcast(bytes)
        } else if res.distribution_pattern == DistributionPattern::Pointwise {
            BlockingResultInfo::pointwise(bytes)
        } else {
            BlockingResultInfo::all_to_all(bytes)
        }
    }

    /// The job ended in `state`: every attempt not ended is cancelled and
    /// leaves its slot, and nothing of it restarts.
    pub(crate) fn end(&mut self, state: JobState, cause: Option<String>, now: Duration) {
        self.state = state;
        self.ended_at = Some(now);
        if cause.is_some() {
            self.failure_cause = cause;
        } else if state == JobState::Finished {
            self.failure_cause = None;
        }
        self.waiting_since = None;
        self.committing.clear();
        self.failover.clear();
        self.reconciliation.clear();
        let now_ms = now.as_millis() as u64;
        for ejv in &mut self.eg.vertices {
            for s in &mut ejv.subtasks {
                for e in &mut s.attempts {
                    if !e.state.is_terminal() {
                        e.transition(ExecutionState::Canceled, now_ms);
                    }
                    e.slot = None;
                }
            }
        }
    }

    /// (vertex, subtask, attempt) of the winners that ran on `tm` and staged
    /// output files there.
    pub(crate) fn winners_with_staged_files_on(&self, tm: &str) -> Vec<(usize, usize, u32)> {
        let mut out = Vec::new();
        for (v, ejv) in self.eg.vertices.iter().enumerate() {
            for (i, sub) in ejv.subtasks.iter().enumerate() {
                if let Some(e) = sub.winner()
                    && e.task_manager.as_deref() == Some(tm)
                    && e.metrics
                        .as_ref()
                        .is_some_and(|m| !m.staged_files.is_empty())
                {
                    out.push((v, i, e.attempt_number));
                }
            }
        }
        out
    }

    /// The partitions attempt `a` produces: the shuffle service its
    /// blocking ones went to (if any), the ones its TaskManager holds and
    /// the ones the service holds.
    pub(crate) fn partitions_of(
        &self,
        a: ExecutionAttemptId,
    ) -> (Option<String>, Vec<PartitionRef>, Vec<PartitionRef>) {
        let service = self
            .shuffle_locations
            .get(&(a.vertex, a.subtask, a.attempt))
            .cloned();
        let mut at_tm = Vec::new();
        let mut at_service = Vec::new();
        for ds in &self.graph.vertices[a.vertex].produced_data_sets {
            let p = PartitionRef {
                data_set: ds.id.0,
                producer_subtask: a.subtask as u32,
                attempt: a.attempt,
            };
            let blocking = self.eg.results.iter().any(|r| {
                r.data_set == ds.id && r.result_partition_type == ResultPartitionType::Blocking
            });
            if blocking && service.is_some() {
                at_service.push(p);
            } else {
                at_tm.push(p);
            }
        }
        (service, at_tm, at_service)
    }

    /// The first finished subtask whose results are lost and still needed:
    /// its output files were staged on a TaskManager that is gone, or its
    /// partitions cannot be read (`results_available`) while a consumer
    /// still needs them (one not initialized yet needs every partition).
    pub(crate) fn first_lost_result(
        &self,
        results_available: impl Fn(usize, usize) -> bool,
        task_manager_alive: impl Fn(&str) -> bool,
    ) -> Option<(usize, usize)> {
        for (v, ejv) in self.eg.vertices.iter().enumerate() {
            for (i, s) in ejv.subtasks.iter().enumerate() {
                if s.finished_attempt.is_none() {
                    continue;
                }
                // Output files staged on a TaskManager that is gone are
                // written again.
                let staged_lost = s.winner().is_some_and(|e| {
                    e.metrics
                        .as_ref()
                        .is_some_and(|m| !m.staged_files.is_empty())
                        && (self.lost_staged.contains(&(v, i, e.attempt_number))
                            || !e
                                .task_manager
                                .as_ref()
                                .is_some_and(|t| task_manager_alive(t)))
                });
                if staged_lost {
                    return Some((v, i));
                }
                if results_available(v, i) {
                    continue;
                }
                // A consumer not initialized yet needs every partition
                // (its decision waits for all of them).
                let needed = s.produced_results.iter().any(|&r| {
                    let res = &self.eg.results[r];
                    res.result_partition_type == ResultPartitionType::Blocking
                        && (!self.eg.vertices[res.consumer].initialized
                            || self.consumers_of(r, i).iter().any(|&(c, j)| {
                                self.eg.vertices[c].subtasks[j].finished_attempt.is_none()
                            }))
                });
                if needed {
                    return Some((v, i));
                }
            }
        }
        None
    }

    pub(crate) fn has_live_attempts(&self) -> bool {
        self.eg.vertices.iter().any(|v| {
            v.subtasks
                .iter()
                .any(|s| s.attempts.iter().any(|a| a.state.is_live()))
        })
    }

    /// Slots the job holds per TaskManager.
    pub fn slots_per_task_manager(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for s in self.slots.values() {
            *m.entry(s.task_manager.clone()).or_insert(0) += 1;
        }
        m
    }

    /// Subtasks in the same pipelined region as `(v, i)`.
    pub(crate) fn region_members(&self, v: usize, i: usize) -> Vec<(usize, usize)> {
        let r = self.region_of[v];
        if !self.region_pipelined[r] {
            return vec![(v, i)];
        }
        let mut out = Vec::new();
        for (u, ejv) in self.eg.vertices.iter().enumerate() {
            if self.region_of[u] == r {
                out.extend((0..ejv.subtasks.len()).map(|j| (u, j)));
            }
        }
        out
    }
}

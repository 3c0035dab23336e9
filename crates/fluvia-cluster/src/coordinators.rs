//! The JobManager's operator coordinators: one per operator of a running job
//! that declares one (a FLIP-27 source's split enumerator), built from its
//! [`CoordinatorSpec`](fluvia_graph::CoordinatorSpec) the first time one of
//! its subtasks is deployed, fed the operator events that tasks send, told
//! of failed attempts, and dropped with the job. What a coordinator answers
//! goes to the TaskManager that runs the addressed attempt.
//!
//! No RPC here: the JobManager shell sends what [`JobCoordinators`] returns.

use crate::rpc::OperatorEventRequest;
use fluvia_core::{FluviaError, JobId, Result};
use fluvia_graph::JobGraph;
use fluvia_runtime::coordinator::{CoordinatorRegistry, OperatorCoordinator, Outbox};
use fluvia_scheduler::ExecutionAttemptId;
use std::collections::{BTreeMap, HashMap};

/// (job, vertex, operator index in the vertex's chain).
type OperatorKey = (JobId, usize, usize);

/// Every coordinator of the JobManager's jobs.
#[derive(Default)]
pub(crate) struct JobCoordinators {
    registry: CoordinatorRegistry,
    coordinators: BTreeMap<OperatorKey, Box<dyn OperatorCoordinator>>,
    /// The TaskManager each deployed attempt runs on.
    locations: HashMap<ExecutionAttemptId, String>,
    /// The parallelism each vertex was deployed with.
    parallelism: BTreeMap<(JobId, usize), usize>,
    /// Streaming jobs: the subtasks of each vertex deployed since its
    /// coordinators were last made (a subtask deployed again is a restart).
    incarnation: BTreeMap<(JobId, usize), std::collections::BTreeSet<usize>>,
}

impl JobCoordinators {
    pub fn new() -> Self {
        JobCoordinators {
            registry: fluvia_runtime::source::builtin_coordinators(),
            ..Default::default()
        }
    }

    /// An attempt is deployed on `task_manager` with `parallelism`; only
    /// attempts of vertices with a coordinator are remembered.
    pub fn deployed(
        &mut self,
        graph: &JobGraph,
        attempt: &ExecutionAttemptId,
        task_manager: &str,
        parallelism: usize,
    ) {
        let coordinated = graph
            .vertices
            .get(attempt.vertex)
            .is_some_and(|v| v.operators.iter().any(|o| o.coordinator.is_some()));
        if !coordinated {
            return;
        }
        self.locations.insert(*attempt, task_manager.to_string());
        self.parallelism
            .insert((attempt.job, attempt.vertex), parallelism);
    }

    /// An event from a task's operator: what to send to which TaskManager.
    pub fn handle_event(
        &mut self,
        graph: &JobGraph,
        job_id: &str,
        attempt: &ExecutionAttemptId,
        operator: usize,
        event: &[u8],
    ) -> Result<Vec<(String, OperatorEventRequest)>> {
        let key = (attempt.job, attempt.vertex, operator);
        if !self.coordinators.contains_key(&key) {
            let spec = graph
                .vertices
                .get(attempt.vertex)
                .and_then(|v| v.operators.get(operator))
                .and_then(|o| o.coordinator.as_ref())
                .ok_or_else(|| {
                    FluviaError::Execution(format!(
                        "operator {operator} of vertex {} has no coordinator",
                        attempt.vertex
                    ))
                })?;
            let parallelism = self
                .parallelism
                .get(&(attempt.job, attempt.vertex))
                .copied()
                .ok_or_else(|| {
                    FluviaError::Execution(format!(
                        "an operator event from vertex {} before it was deployed",
                        attempt.vertex
                    ))
                })?;
            let created = self.registry.create(spec, parallelism)?;
            self.coordinators.insert(key, created);
        }
        let mut out = Outbox::default();
        if let Some(c) = self.coordinators.get_mut(&key) {
            c.handle_event(attempt.subtask, attempt.attempt, event, &mut out)?;
        }
        Ok(self.route(job_id, attempt, operator, out))
    }

    /// Snapshots every coordinator of `job` for checkpoint `checkpoint_id`,
    /// before its trigger goes out: (operator id, state). A coordinator not
    /// made yet has its initial state, which a restore makes anew.
    pub fn checkpoint(
        &mut self,
        graph: &JobGraph,
        job: JobId,
        checkpoint_id: u64,
    ) -> Vec<(String, Vec<u8>)> {
        let mut states = Vec::new();
        for ((j, vertex, operator), c) in self.coordinators.iter_mut() {
            if *j != job {
                continue;
            }
            let Some(op) = graph
                .vertices
                .get(*vertex)
                .and_then(|v| v.operators.get(*operator))
            else {
                continue;
            };
            match c.checkpoint(checkpoint_id) {
                Ok(state) => states.push((op.operator_id.clone(), state)),
                Err(e) => tracing::warn!(
                    "the coordinator of '{}' could not take checkpoint {checkpoint_id}: {e}",
                    op.name
                ),
            }
        }
        states
    }

    /// A streaming job's attempt is deployed. A subtask deployed again means
    /// the job restarts: the vertex's coordinators return to what the
    /// restored checkpoint recorded (Flink's `resetToCheckpoint`), or are
    /// made anew when it restarts from the beginning; their readers restore
    /// the splits they held from their own state.
    pub fn restore_for_deployment(
        &mut self,
        graph: &JobGraph,
        attempt: &ExecutionAttemptId,
        restore: Option<&fluvia_deployment::TaskRestore>,
    ) -> Result<()> {
        let Some(v) = graph.vertices.get(attempt.vertex) else {
            return Ok(());
        };
        if v.operators.iter().all(|o| o.coordinator.is_none()) {
            return Ok(());
        }
        let seen = self
            .incarnation
            .entry((attempt.job, attempt.vertex))
            .or_default();
        let restart = seen.contains(&attempt.subtask);
        let first_restored = seen.is_empty() && restore.is_some();
        if restart {
            seen.clear();
        }
        seen.insert(attempt.subtask);
        if !restart && !first_restored {
            return Ok(());
        }
        for (index, op) in v.operators.iter().enumerate() {
            let key = (attempt.job, attempt.vertex, index);
            self.coordinators.remove(&key);
            let (Some(spec), Some(r)) = (&op.coordinator, restore) else {
                continue;
            };
            let Some(state) = r
                .operator(&op.operator_id)
                .and_then(|s| s.coordinator_state.as_ref())
            else {
                continue;
            };
            let parallelism = self
                .parallelism
                .get(&(attempt.job, attempt.vertex))
                .copied()
                .unwrap_or(v.parallelism);
            let mut c = self.registry.create(spec, parallelism)?;
            c.reset_to_checkpoint(r.checkpoint_id, state)?;
            self.coordinators.insert(key, c);
        }
        Ok(())
    }

    /// An attempt failed or was cancelled: its coordinators forget it.
    pub fn attempt_failed(&mut self, attempt: &ExecutionAttemptId) {
        self.locations.remove(attempt);
        for ((job, vertex, _), c) in self.coordinators.iter_mut() {
            if *job == attempt.job && *vertex == attempt.vertex {
                let _ = c.attempt_failed(attempt.subtask, attempt.attempt, &mut Outbox::default());
            }
        }
    }

    /// The job ended: its coordinators go.
    pub fn job_ended(&mut self, job: JobId) {
        self.coordinators.retain(|(j, _, _), _| *j != job);
        self.locations.retain(|a, _| a.job != job);
        self.parallelism.retain(|(j, _), _| *j != job);
        self.incarnation.retain(|(j, _), _| *j != job);
    }

    fn route(
        &self,
        job_id: &str,
        from: &ExecutionAttemptId,
        operator: usize,
        mut out: Outbox,
    ) -> Vec<(String, OperatorEventRequest)> {
        out.take()
            .into_iter()
            .filter_map(|e| {
                let to = ExecutionAttemptId {
                    job: from.job,
                    vertex: from.vertex,
                    subtask: e.subtask,
                    attempt: e.attempt,
                };
                let Some(tm) = self.locations.get(&to) else {
                    tracing::debug!("operator event for {to:?}, which runs nowhere now");
                    return None;
                };
                Some((
                    tm.clone(),
                    OperatorEventRequest {
                        job_id: job_id.to_string(),
                        vertex_index: from.vertex as u32,
                        subtask: e.subtask as u32,
                        attempt: e.attempt,
                        operator_index: operator as u32,
                        event: e.event,
                    },
                ))
            })
            .collect()
    }
}

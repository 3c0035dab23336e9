//! The scheduler: Flink's SchedulerNG as a deterministic state machine.
//!
//! It is fed [`Event`]s (a job submitted, a TaskManager registered, lost or
//! heartbeating, an attempt's state report, a deploy acknowledged or failed,
//! a probe answered) with the current time of an injected clock, and it
//! queues [`Action`]s (deploy an attempt, cancel an attempt, release
//! partitions or a job's resources, probe a TaskManager or a shuffle
//! service, a job ended) that the caller performs however it likes. It never touches a socket, a thread
//! or a real clock: the JobManager is a thin shell around it, and the
//! simulation tests drive it with a virtual clock and seeded faults.
//!
//! Model (Flink's names):
//! - **Pipelined regions.** Vertices joined by pipelined edges form a region
//!   that is scheduled (slots for all its subtasks at once) and restarted as
//!   one. With only blocking edges (batch), each subtask is its own region: a
//!   subtask is deployed when every partition it reads was finished by a
//!   producer attempt whose TaskManager is alive, and a failure re-runs only
//!   that subtask. Within a region a consumer is deployed once its producers'
//!   deployments were acknowledged, so their partitions exist when it asks;
//!   a producer on the consumer's own TaskManager only needs to be deploying,
//!   since a TaskManager's deployments arrive and are created in the order
//!   they were queued (one wave for a region on one TaskManager).
//! - **Attempts.** An execution vertex may have several live attempts (a
//!   failover creates a new one only when none is live; [`Event::AddAttempt`]
//!   adds a concurrent one, as speculative execution will). The first attempt
//!   to finish wins: its partitions are the ones consumers read, the others
//!   are cancelled, and cancelling them is not a failure (one that finishes
//!   before its cancel arrives counts as cancelled). A failed attempt
//!   fails its subtask only when no other attempt of it can still finish.
//! - **Slots.** A job's subtasks run in shared slots: slot `(group, i)` hosts
//!   subtask `i` of each vertex of a slot sharing group. Slots are taken from
//!   TaskManagers whose program fingerprint is the job's, in registration
//!   order, preferring the TaskManager that hosted the same slot before, and
//!   given back when they host nothing live (the TaskManager keeps serving
//!   the finished partitions).
//! - **Failover.** A failure starts a restart after the restart strategy's
//!   delay; failures that arrive before it fires join it (one restart).
//!   Before restarting, every TaskManager is probed, so a dead one is found
//!   at once rather than after the heartbeat timeout. A lost TaskManager
//!   fails what ran there and re-runs the finished subtasks whose partitions
//!   it held, where a consumer still needs them (transitively); those
//!   partitions stay lost when a TaskManager of the same id registers again.
//!   A consumer that cannot read partitions of a job whose data went to a
//!   shuffle service has that service probed; one that does not answer is
//!   lost with the partitions it held.
//! - **Reconciliation.** Heartbeats list the attempts a TaskManager runs; an
//!   acknowledged attempt missing from two heartbeats in a row is failed (its
//!   final report was lost), and an attempt a TaskManager runs that the
//!   scheduler does not know as live is cancelled.
//!
//! Each rule lives in a component with its own state (see the crate
//! documentation): this shell only routes events to them and turns their
//! answers into actions.

use crate::adaptive_setup::{adaptive_plan, try_initialize};
use crate::deployment::{ExecutionAttemptId, PartitionRef};
use crate::deployment_factory::DeploymentFactory;
use crate::execution_graph::{AttemptMetrics, ExecutionState};
use crate::failover::{RestartDecision, RestartPolicy, RestartStrategy};
use crate::job::{Job, JobSettings, JobState};
use crate::protocol::{Action, Event};
use crate::reconciliation;
use crate::shuffle::{ShuffleMaster, ShuffleServiceType};
use crate::slot_pool::{Member, SlotPool, TaskManagerSpec};
use crate::speculative::{self, SpeculativeConfig};
use crate::validate::validate_job_graph;
use fluvia_core::{FluviaError, JobId, Result, ResultPartitionType};
use fluvia_graph::{JobGraph, JobType};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// Settings of the scheduler (Flink's keys are read by the JobManager).
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// `slot.request.timeout`: how long a job waits for slots it cannot get
    /// while nothing of it runs.
    pub slot_request_timeout: Duration,
    /// The cluster's restart strategy (`restart-strategy.type`); a job's
    /// own configuration may name another. Unset: a job with checkpointing
    /// restarts with exponential-delay (Flink ≥ 1.19), others with the
    /// fixed delay below.
    pub restart_strategy: Option<RestartStrategy>,
    /// Restarts allowed without a strategy (fixed delay; 0: none).
    pub restart_attempts: usize,
    /// The fixed delay without a strategy.
    pub restart_delay: Duration,
    /// `heartbeat.timeout`: silence after which a TaskManager is lost.
    pub heartbeat_timeout: Duration,
    /// How long a restart waits for probe answers before going on.
    pub probe_timeout: Duration,
    /// `shuffle-service.type` of jobs that do not set it.
    pub shuffle_service_type: ShuffleServiceType,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            slot_request_timeout: Duration::from_secs(300),
            restart_strategy: None,
            restart_attempts: 0,
            restart_delay: Duration::from_secs(1),
            heartbeat_timeout: Duration::from_secs(50),
            probe_timeout: Duration::from_secs(1),
            shuffle_service_type: ShuffleServiceType::Internal,
        }
    }
}

/// The scheduler of every job of a cluster.
pub struct Scheduler {
    config: SchedulerConfig,
    pool: SlotPool,
    jobs: BTreeMap<JobId, Job>,
    job_order: Vec<JobId>,
    actions: VecDeque<Action>,
    now: Duration,
    shuffle: ShuffleMaster,
    service_heartbeats: BTreeMap<String, Duration>,
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Self {
        Scheduler {
            config,
            pool: SlotPool::default(),
            jobs: BTreeMap::new(),
            job_order: Vec::new(),
            actions: VecDeque::new(),
            now: Duration::ZERO,
            shuffle: ShuffleMaster::default(),
            service_heartbeats: BTreeMap::new(),
        }
    }

    /// The registered shuffle services.
    pub fn shuffle_master(&self) -> &ShuffleMaster {
        &self.shuffle
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    pub fn now(&self) -> Duration {
        self.now
    }

    pub fn job(&self, id: JobId) -> Option<&Job> {
        self.jobs.get(&id)
    }

    /// Jobs in submission order.
    pub fn jobs(&self) -> impl Iterator<Item = &Job> {
        self.job_order.iter().filter_map(|id| self.jobs.get(id))
    }

    /// Registered TaskManagers in registration order, with their used slots.
    pub fn task_managers(&self) -> impl Iterator<Item = (&TaskManagerSpec, usize)> {
        self.pool.task_managers()
    }

    pub fn is_registered(&self, tm: &str) -> bool {
        self.pool.contains(tm)
    }

    /// The next action to perform.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    pub fn drain_actions(&mut self) -> Vec<Action> {
        self.actions.drain(..).collect()
    }

    /// When the scheduler next needs a [`Event::Tick`] (absent other events).
    pub fn poll_timeout(&self) -> Option<Duration> {
        let mut t: Option<Duration> = None;
        let mut at = |d: Duration| t = Some(t.map_or(d, |x| x.min(d)));
        for d in self.pool.deadlines(self.config.heartbeat_timeout) {
            at(d);
        }
        for j in self.jobs.values().filter(|j| !j.state.is_terminal()) {
            for d in j.failover.deadlines(self.now) {
                at(d);
            }
            if let Some(since) = j.waiting_since {
                at(since + self.config.slot_request_timeout);
            }
            if let Some(since) = j.service_wait_since {
                at(since + self.config.slot_request_timeout);
            }
        }
        for &last in self.service_heartbeats.values() {
            at(last + self.config.heartbeat_timeout);
        }
        for j in self.jobs.values().filter(|j| !j.state.is_terminal()) {
            if j.speculative.is_some() && j.has_live_attempts() {
                at(j.next_slow_check);
            }
        }
        t
    }

    /// TaskManagers blocked by speculative execution, with the time their
    /// block ends (scheduler clock).
    pub fn blocked_task_managers(&self) -> impl Iterator<Item = (&str, Duration)> {
        self.pool.blocked()
    }

    /// Whether the TaskManager is blocked for new attempts right now.
    pub fn is_task_manager_blocked(&self, tm: &str) -> bool {
        self.pool.is_blocked(tm, self.now)
    }

    /// Every `slow-task-detector.check-interval` of a speculative job: block
    /// the TaskManagers of slow attempts and give each slow subtask another
    /// attempt elsewhere (Flink's `SpeculativeScheduler`).
    fn detect_slow_tasks(&mut self) {
        let now = self.now;
        self.pool.unblock_expired(now);
        let ids: Vec<JobId> = self.job_order.clone();
        for id in ids {
            let Some(job) = self.jobs.get(&id) else {
                continue;
            };
            let Some(config) = job.speculative else {
                continue;
            };
            if job.state != JobState::Running || now < job.next_slow_check {
                continue;
            }
            let slow =
                speculative::slow_subtasks(&job.eg, |v, i| job.input_bytes(v, i), ms(now), &config);
            let vertices: BTreeSet<usize> = slow.iter().map(|s| s.vertex).collect();
            let mut slow_tms = BTreeSet::new();
            let mut add = Vec::new();
            for s in &slow {
                let sub = &job.eg.vertices[s.vertex].subtasks[s.subtask];
                for &n in &s.attempts {
                    if let Some(tm) = sub.attempt(n).and_then(|e| e.task_manager.clone()) {
                        slow_tms.insert(tm);
                    }
                }
                let live = sub
                    .attempts
                    .iter()
                    .filter(|e| !e.state.is_terminal())
                    .count();
                if live < config.max_concurrent_executions
                    && job.graph.vertices[s.vertex].supports_concurrent_attempts
                {
                    add.push((s.vertex, s.subtask, sub.attempts.len() as u32));
                }
            }
            if !config.block_slow_node_duration.is_zero() {
                for tm in slow_tms {
                    let until = now + config.block_slow_node_duration;
                    self.pool.block(tm, until);
                }
            }
            for (v, i, n) in add {
                if self.add_attempt(id, v, i).is_ok()
                    && let Some(job) = self.jobs.get_mut(&id)
                    && job.eg.vertices[v].subtasks[i].attempts.len() as u32 > n
                {
                    job.speculative_attempts.insert((v, i, n));
                }
            }
            if let Some(job) = self.jobs.get_mut(&id) {
                job.num_slow_execution_vertices = vertices.len();
                job.next_slow_check = now + config.check_interval;
            }
        }
    }

    /// Feeds one event at time `now` (monotonic, from the caller's clock).
    pub fn handle(&mut self, now: Duration, event: Event) -> Result<()> {
        self.now = self.now.max(now);
        let outcome = match event {
            Event::SubmitJob {
                job,
                graph,
                program,
                fingerprint,
            } => self.submit(job, graph, program, fingerprint),
            Event::CancelJob { job } => self.cancel(job),
            Event::RegisterTaskManager(spec) => {
                self.register(spec);
                Ok(())
            }
            Event::RegisterShuffleService(spec) => {
                self.service_heartbeats.insert(spec.id.clone(), self.now);
                self.shuffle.register_service(spec);
                Ok(())
            }
            Event::ShuffleServiceHeartbeat { service } => {
                if self.shuffle.service(&service).is_some() {
                    self.service_heartbeats.insert(service, self.now);
                    Ok(())
                } else {
                    Err(FluviaError::Execution(format!(
                        "shuffle service {service} is not registered"
                    )))
                }
            }
            Event::ShuffleServiceLost { service, reason } => {
                self.lose_shuffle_service(&service, &reason);
                Ok(())
            }
            Event::Heartbeat {
                task_manager,
                running,
            } => self.heartbeat(&task_manager, &running),
            Event::TaskManagerLost {
                task_manager,
                reason,
            } => {
                self.lose_task_manager(&task_manager, &reason);
                Ok(())
            }
            Event::ProbeAnswered {
                task_manager,
                alive,
            } => {
                if alive {
                    for j in self.jobs.values_mut() {
                        j.failover.probe_done(&task_manager);
                    }
                } else {
                    self.lose_task_manager(&task_manager, "it does not answer");
                }
                Ok(())
            }
            Event::DeployAcknowledged { attempt } => {
                self.deploy_acknowledged(attempt);
                Ok(())
            }
            Event::DeployFailed { attempt, reason } => {
                self.deploy_failed(attempt, reason);
                Ok(())
            }
            Event::AttemptState {
                attempt,
                state,
                failure,
                metrics,
            } => {
                self.attempt_state(attempt, state, failure, metrics);
                Ok(())
            }
            Event::ShuffleServiceProbeAnswered { service, alive } => {
                if !alive {
                    self.lose_shuffle_service(&service, "it does not answer");
                }
                Ok(())
            }
            Event::PartitionsLost {
                job,
                partitions,
                reason,
            } => {
                self.probe_shuffle_services(job);
                self.partitions_lost(job, &partitions, &reason);
                Ok(())
            }
            Event::AddAttempt {
                job,
                vertex,
                subtask,
            } => self.add_attempt(job, vertex, subtask),
            Event::FilesCommitted {
                job,
                task_manager,
                failure,
            } => {
                self.files_committed(job, &task_manager, failure);
                Ok(())
            }
            Event::Tick => Ok(()),
        };
        self.check_timeouts();
        self.detect_slow_tasks();
        self.schedule_all();
        outcome
    }

    // ------------------------------------------------------------ events

    fn submit(
        &mut self,
        id: JobId,
        graph: Arc<JobGraph>,
        program: String,
        fingerprint: String,
    ) -> Result<()> {
        if self.jobs.contains_key(&id) {
            return Err(FluviaError::Plan(format!("job {id} was submitted already")));
        }
        validate_job_graph(&graph)?;
        let shuffle_service_type = match graph.config.get_raw(ShuffleServiceType::KEY) {
            Some(v) => ShuffleServiceType::parse(v)?,
            None => self.config.shuffle_service_type,
        };
        let adaptive = adaptive_plan(&graph)?;
        let speculative = match graph.job_type {
            JobType::Batch => SpeculativeConfig::from_configuration(&graph.config)?,
            JobType::Streaming => None,
        };
        let (adaptive, undecided) = match adaptive {
            Some((a, undecided)) => (Some(a), undecided),
            None => (None, vec![false; graph.vertices.len()]),
        };
        let settings = JobSettings {
            program,
            fingerprint,
            shuffle_service_type,
            adaptive,
            speculative,
        };
        let mut job = Job::new(id, graph, settings, &undecided, self.now)?;
        job.restart_strategy = self.restart_strategy_of(&job.graph)?;
        self.jobs.insert(id, job);
        if let Err(e) = self.initialize_vertices(id) {
            self.jobs.remove(&id);
            return Err(e);
        }
        self.job_order.push(id);
        Ok(())
    }

    /// Initializes every vertex that can be now, in topological order.
    fn initialize_vertices(&mut self, id: JobId) -> Result<()> {
        let now = ms(self.now);
        let Some(job) = self.jobs.get_mut(&id) else {
            return Ok(());
        };
        for v in 0..job.eg.vertices.len() {
            try_initialize(job, v, now).map_err(|e| {
                FluviaError::Plan(format!(
                    "deciding the parallelism of '{}': {e}",
                    job.eg.vertices[v].name
                ))
            })?;
        }
        Ok(())
    }

    fn cancel(&mut self, id: JobId) -> Result<()> {
        let job = self
            .jobs
            .get(&id)
            .ok_or_else(|| FluviaError::Plan(format!("no job {id}")))?;
        if job.state.is_terminal() {
            return Err(FluviaError::Plan(format!(
                "job {id} is {} already",
                job.state.name()
            )));
        }
        self.end_job(id, JobState::Canceled, None);
        Ok(())
    }

    fn register(&mut self, spec: TaskManagerSpec) {
        let id = spec.id.clone();
        // A re-registration of a TaskManager we still know keeps its slot
        // accounting.
        if self.pool.register(spec, self.now) {
            self.staged_files_dropped(&id);
        }
    }

    /// A TaskManager registers again only after dropping its jobs: the
    /// files winners staged there are gone and their subtasks run again.
    fn staged_files_dropped(&mut self, tm: &str) {
        let ids: Vec<JobId> = self.job_order.clone();
        for id in ids {
            let Some(job) = self.jobs.get_mut(&id) else {
                continue;
            };
            if job.state.is_terminal() || job.commit_started {
                continue;
            }
            let dropped = job.winners_with_staged_files_on(tm);
            if dropped.is_empty() {
                continue;
            }
            job.lost_staged.extend(dropped);
            self.invalidate_lost_results(id, &format!("TaskManager {tm} dropped its jobs"));
        }
    }

    fn heartbeat(&mut self, tm: &str, running: &[ExecutionAttemptId]) -> Result<()> {
        if !self.pool.heartbeat(tm, self.now) {
            return Err(FluviaError::Execution(format!(
                "TaskManager {tm} is not registered"
            )));
        }
        let running: BTreeSet<ExecutionAttemptId> = running.iter().copied().collect();
        // Attempts it runs that are not live here, or that are being
        // cancelled (the cancel may have been lost): cancel them (again).
        let expected = |a: &ExecutionAttemptId| {
            self.jobs
                .get(&a.job)
                .filter(|j| !j.state.is_terminal())
                .and_then(|j| j.eg.vertices.get(a.vertex))
                .and_then(|v| v.subtasks.get(a.subtask))
                .and_then(|s| s.attempt(a.attempt))
                .is_some_and(|e| {
                    e.state != ExecutionState::Canceling
                        && e.state.is_live()
                        && e.task_manager.as_deref() == Some(tm)
                })
        };
        for attempt in reconciliation::unexpected(&running, expected) {
            self.actions.push_back(Action::CancelAttempt {
                task_manager: tm.to_string(),
                attempt,
            });
        }
        // Acknowledged attempts it no longer runs: their final report was lost.
        let mut lost = Vec::new();
        for job in self.jobs.values_mut().filter(|j| !j.state.is_terminal()) {
            let acknowledged = reconciliation::acknowledged_on(&job.eg, job.id, tm);
            lost.extend(job.reconciliation.heartbeat(acknowledged, &running));
            job.reconciliation.retain_live(&job.eg);
        }
        for a in lost {
            self.attempt_state(
                a,
                ExecutionState::Failed,
                Some(format!(
                    "TaskManager {tm} no longer runs this attempt (its final state report was lost)"
                )),
                None,
            );
        }
        Ok(())
    }

    fn deploy_acknowledged(&mut self, a: ExecutionAttemptId) {
        let now = ms(self.now);
        if let Some(e) = self.execution_mut(a)
            && e.state == ExecutionState::Deploying
        {
            e.transition(ExecutionState::Initializing, now);
        }
    }

    fn deploy_failed(&mut self, a: ExecutionAttemptId, reason: String) {
        let Some(e) = self.execution_mut(a) else {
            return;
        };
        if !e.state.is_live() {
            return;
        }
        let tm = e.task_manager.clone();
        self.attempt_state(
            a,
            ExecutionState::Failed,
            Some(format!("deploying failed: {reason}")),
            None,
        );
        // (Its partitions, if it registered any, were released with the
        // failure.) A TaskManager that fails a deployment may be dying.
        if let Some(tm) = tm
            && self.pool.contains(&tm)
        {
            self.actions.push_back(Action::Probe { task_manager: tm });
        }
    }

    fn add_attempt(&mut self, id: JobId, v: usize, i: usize) -> Result<()> {
        let now = ms(self.now);
        let job = self
            .jobs
            .get_mut(&id)
            .ok_or_else(|| FluviaError::Plan(format!("no job {id}")))?;
        if job.state.is_terminal() || job.graph.job_type != JobType::Batch {
            return Err(FluviaError::Plan(format!(
                "job {id} takes no additional attempts (it is {} or not a batch job)",
                job.state.name()
            )));
        }
        let sub = job
            .eg
            .vertices
            .get_mut(v)
            .and_then(|x| x.subtasks.get_mut(i))
            .ok_or_else(|| FluviaError::Plan(format!("job {id} has no subtask {v}/{i}")))?;
        if sub.finished_attempt.is_some() {
            return Err(FluviaError::Plan(format!(
                "subtask {v}/{i} finished already"
            )));
        }
        if matches!(
            sub.latest_attempt().state,
            ExecutionState::Created | ExecutionState::Scheduled
        ) {
            return Ok(()); // one is waiting to be deployed already
        }
        let avoid: BTreeSet<String> = sub
            .live_attempts()
            .filter_map(|a| a.task_manager.clone())
            .collect();
        let n = sub.new_attempt(now);
        job.avoid.insert((v, i, n), avoid);
        Ok(())
    }

    fn execution_mut(
        &mut self,
        a: ExecutionAttemptId,
    ) -> Option<&mut crate::execution_graph::Execution> {
        self.jobs
            .get_mut(&a.job)
            .filter(|j| !j.state.is_terminal())?
            .eg
            .vertices
            .get_mut(a.vertex)?
            .subtasks
            .get_mut(a.subtask)?
            .attempt_mut(a.attempt)
    }

    /// An attempt's state report. Reports of attempts that ended already
    /// (duplicates, stale attempts) change nothing; a FINISHED of an attempt
    /// being cancelled completes its cancellation.
    fn attempt_state(
        &mut self,
        a: ExecutionAttemptId,
        state: ExecutionState,
        failure: Option<String>,
        metrics: Option<AttemptMetrics>,
    ) {
        let now = ms(self.now);
        let Some(job) = self.jobs.get_mut(&a.job) else {
            return;
        };
        if job.state.is_terminal() {
            return;
        }
        let Some(sub) = job
            .eg
            .vertices
            .get_mut(a.vertex)
            .and_then(|v| v.subtasks.get_mut(a.subtask))
        else {
            return;
        };
        let Some(e) = sub.attempt_mut(a.attempt) else {
            return;
        };
        if !e.state.is_live() {
            return;
        }
        let was_canceling = e.state == ExecutionState::Canceling;
        match state {
            ExecutionState::Initializing | ExecutionState::Running
                if !was_canceling && e.state < state =>
            {
                e.transition(state, now);
            }
            ExecutionState::Finished | ExecutionState::Canceled | ExecutionState::Failed
                if was_canceling =>
            {
                // A cancelled attempt ends cancelled; one that finished
                // before the cancel reached it too (Flink's
                // `completeCancelling`). What it did before stays visible.
                // Nobody reads its partitions: a sibling won, or its region
                // restarts.
                e.transition(ExecutionState::Canceled, now);
                e.metrics = metrics;
                let tm = e.task_manager.clone();
                self.free_slot(a);
                if let Some(tm) = tm {
                    self.release_partitions_of(a, &tm);
                }
            }
            ExecutionState::Finished => {
                e.transition(ExecutionState::Finished, now);
                e.metrics = metrics;
                let tm = e.task_manager.clone();
                self.free_slot(a);
                self.attempt_finished(a, tm);
            }
            ExecutionState::Canceled | ExecutionState::Failed => {
                let cause = match (state, failure) {
                    (_, Some(f)) if !f.is_empty() => f,
                    (ExecutionState::Canceled, _) => {
                        "the attempt was cancelled on its TaskManager".to_string()
                    }
                    _ => "the task failed".to_string(),
                };
                e.transition(ExecutionState::Failed, now);
                e.failure_cause = Some(cause.clone());
                e.metrics = metrics;
                let tm = e.task_manager.clone();
                self.free_slot(a);
                if let Some(tm) = tm {
                    self.release_partitions_of(a, &tm);
                }
                self.subtask_failed(a.job, a.vertex, a.subtask, cause);
            }
            _ => {}
        }
    }

    fn attempt_finished(&mut self, a: ExecutionAttemptId, tm: Option<String>) {
        let now = ms(self.now);
        let Some(job) = self.jobs.get_mut(&a.job) else {
            return;
        };
        let sub = &mut job.eg.vertices[a.vertex].subtasks[a.subtask];
        if sub.finished_attempt.is_some() {
            // Another attempt won; this one's partitions are not read.
            if let Some(tm) = tm {
                self.release_partitions_of(a, &tm);
            }
            return;
        }
        sub.finished_attempt = Some(a.attempt);
        if job
            .speculative_attempts
            .contains(&(a.vertex, a.subtask, a.attempt))
        {
            job.num_effective_speculative_executions += 1;
        }
        let sub = &mut job.eg.vertices[a.vertex].subtasks[a.subtask];
        // Cancel the other attempts: losing is not a failure.
        let mut cancels = Vec::new();
        let mut unslot = Vec::new();
        for e in &mut sub.attempts {
            if e.attempt_number == a.attempt {
                continue;
            }
            match e.state {
                ExecutionState::Created | ExecutionState::Scheduled => {
                    if e.state == ExecutionState::Scheduled {
                        unslot.push(e.attempt_number);
                    }
                    e.transition(ExecutionState::Canceled, now);
                }
                ExecutionState::Deploying
                | ExecutionState::Initializing
                | ExecutionState::Running => {
                    e.transition(ExecutionState::Canceling, now);
                    if let Some(tm) = &e.task_manager {
                        cancels.push((tm.clone(), e.attempt_number));
                    }
                }
                _ => {}
            }
        }
        for n in unslot {
            self.free_slot(ExecutionAttemptId { attempt: n, ..a });
        }
        for (tm, n) in cancels {
            self.actions.push_back(Action::CancelAttempt {
                task_manager: tm,
                attempt: ExecutionAttemptId { attempt: n, ..a },
            });
        }
        if let Err(e) = self.initialize_vertices(a.job) {
            self.end_job(a.job, JobState::Failed, Some(e.to_string()));
            return;
        }
        if let Some(job) = self.jobs.get(&a.job)
            && job.all_finished()
        {
            self.commit_job(a.job);
            return;
        }
        // Handed over to a service that was lost meanwhile: its data is
        // gone already.
        if let Some(job) = self.jobs.get(&a.job)
            && let Some(service) = job.shuffle_locations.get(&(a.vertex, a.subtask, a.attempt))
            && self.shuffle.service(service).is_none()
        {
            let cause = format!("shuffle service {service} was lost");
            if let Some(job) = self.jobs.get_mut(&a.job) {
                job.lost_partitions.insert((a.vertex, a.subtask, a.attempt));
            }
            self.invalidate_lost_results(a.job, &cause);
        }
    }

    /// The subtask's attempt failed: fail over unless another attempt of it
    /// can still finish.
    fn subtask_failed(&mut self, id: JobId, v: usize, i: usize, cause: String) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let sub = &job.eg.vertices[v].subtasks[i];
        let sibling_waits = matches!(
            sub.latest_attempt().state,
            ExecutionState::Created | ExecutionState::Scheduled
        );
        if sub.finished_attempt.is_some()
            || sibling_waits
            || sub
                .live_attempts()
                .any(|e| e.state != ExecutionState::Canceling)
        {
            return;
        }
        let name = &job.graph.vertices[v].name;
        let cause = format!(
            "{name} ({}/{}) failed: {cause}",
            i + 1,
            job.eg.vertices[v].parallelism
        );
        let members = job.region_members(v, i);
        self.restart(id, members, cause);
    }

    /// The strategy a job restarts under: its own configuration's, else the
    /// cluster's, else exponential-delay for a job with checkpointing and
    /// the fixed delay for others (Flink's defaults).
    fn restart_strategy_of(&self, graph: &JobGraph) -> Result<RestartStrategy> {
        if let Some(s) = RestartStrategy::from_configuration(&graph.config)? {
            return Ok(s);
        }
        if let Some(s) = self.config.restart_strategy {
            return Ok(s);
        }
        let checkpointing = graph.job_type == JobType::Streaming
            && !graph
                .config
                .get(&fluvia_core::config::options::CHECKPOINTING_INTERVAL)?
                .is_zero();
        Ok(if checkpointing {
            RestartStrategy::exponential_default()
        } else if self.config.restart_attempts == 0 {
            RestartStrategy::None
        } else {
            RestartStrategy::FixedDelay {
                attempts: self.config.restart_attempts,
                delay: self.config.restart_delay,
            }
        })
    }

    /// Schedules a restart of `subtasks` (and cancels what of them runs), or
    /// fails the job when no restart is left.
    fn restart(&mut self, id: JobId, subtasks: Vec<(usize, usize)>, cause: String) {
        let now = self.now;
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let policy = RestartPolicy {
            strategy: job.restart_strategy,
            probe_timeout: self.config.probe_timeout,
        };
        if job.state.is_terminal() {
            return;
        }
        match job
            .failover
            .on_failure(&mut job.restarts, &policy, now, self.pool.ids())
        {
            RestartDecision::Join => {}
            RestartDecision::Exhausted => {
                self.end_job(id, JobState::Failed, Some(cause));
                return;
            }
            RestartDecision::Start { probe } => {
                for task_manager in probe {
                    self.actions.push_back(Action::Probe { task_manager });
                }
            }
        }
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        job.failure_cause = Some(cause);
        if job.graph.job_type == JobType::Streaming {
            job.state = JobState::Restarting;
        }
        let mut cancels = Vec::new();
        let mut unslot = Vec::new();
        let now_ms = ms(now);
        for &(v, i) in &subtasks {
            let streaming_region = job.region_pipelined[job.region_of[v]];
            let sub = &mut job.eg.vertices[v].subtasks[i];
            if streaming_region {
                // Pipelined data is gone with its readers: finished members
                // of the region run again too.
                sub.finished_attempt = None;
            }
            for e in &mut sub.attempts {
                match e.state {
                    ExecutionState::Deploying
                    | ExecutionState::Initializing
                    | ExecutionState::Running => {
                        e.transition(ExecutionState::Canceling, now_ms);
                        if let Some(tm) = &e.task_manager {
                            cancels.push((tm.clone(), v, i, e.attempt_number));
                        }
                    }
                    ExecutionState::Scheduled => {
                        unslot.push((v, i, e.attempt_number));
                        e.transition(ExecutionState::Canceled, now_ms);
                    }
                    ExecutionState::Created => e.transition(ExecutionState::Canceled, now_ms),
                    _ => {}
                }
            }
        }
        job.failover.restart_also(subtasks);
        for (v, i, n) in unslot {
            self.free_slot(ExecutionAttemptId {
                job: id,
                vertex: v,
                subtask: i,
                attempt: n,
            });
        }
        for (tm, v, i, n) in cancels {
            self.actions.push_back(Action::CancelAttempt {
                task_manager: tm,
                attempt: ExecutionAttemptId {
                    job: id,
                    vertex: v,
                    subtask: i,
                    attempt: n,
                },
            });
        }
    }

    /// A TaskManager is gone: what ran there failed, what it held is lost.
    fn lose_task_manager(&mut self, tm: &str, reason: &str) {
        if !self.pool.remove(tm) {
            return;
        }
        let now = ms(self.now);
        let ids: Vec<JobId> = self.job_order.clone();
        for id in ids {
            let Some(job) = self.jobs.get_mut(&id) else {
                continue;
            };
            job.failover.probe_done(tm);
            job.touched.remove(tm);
            if job.state.is_terminal() {
                continue;
            }
            if job.commit_started {
                // Every subtask finished and others may have renamed their
                // files already: nothing runs again. Only files it has not
                // committed yet are lost.
                if job.committing.contains(tm) {
                    let cause = format!(
                        "TaskManager {tm} was lost while committing the output files: {reason}"
                    );
                    self.end_job(id, JobState::Failed, Some(cause));
                }
                continue;
            }
            // Its shared slots vanish with it.
            let gone: Vec<u64> = job
                .slots
                .iter()
                .filter(|(_, s)| s.task_manager == tm)
                .map(|(k, _)| *k)
                .collect();
            for k in gone {
                job.slots.remove(&k);
            }
            let mut failed = Vec::new();
            for (v, ejv) in job.eg.vertices.iter_mut().enumerate() {
                for (i, s) in ejv.subtasks.iter_mut().enumerate() {
                    for e in &mut s.attempts {
                        if e.task_manager.as_deref() != Some(tm) {
                            continue;
                        }
                        match e.state {
                            // Handed over to a shuffle service: still there.
                            ExecutionState::Finished
                                if job.shuffle_locations.contains_key(&(
                                    v,
                                    i,
                                    e.attempt_number,
                                )) => {}
                            ExecutionState::Finished => {
                                job.lost_partitions.insert((v, i, e.attempt_number));
                            }
                            ExecutionState::Canceling => {
                                e.transition(ExecutionState::Canceled, now);
                                e.slot = None;
                            }
                            ExecutionState::Scheduled => {
                                e.state = ExecutionState::Created;
                                e.slot = None;
                                e.task_manager = None;
                            }
                            s if s.is_live() => {
                                e.transition(ExecutionState::Failed, now);
                                e.failure_cause =
                                    Some(format!("TaskManager {tm} was lost: {reason}"));
                                e.slot = None;
                                failed.push((v, i));
                            }
                            _ => {}
                        }
                    }
                }
            }
            for (v, i) in failed {
                self.subtask_failed(id, v, i, format!("TaskManager {tm} was lost: {reason}"));
            }
            self.invalidate_lost_results(id, &format!("TaskManager {tm} was lost: {reason}"));
        }
    }

    fn lose_shuffle_service(&mut self, service: &str, reason: &str) {
        self.service_heartbeats.remove(service);
        if !self.shuffle.unregister_service(service) {
            return;
        }
        let cause = format!("shuffle service {service} was lost: {reason}");
        let ids: Vec<JobId> = self.job_order.clone();
        for id in ids {
            let Some(job) = self.jobs.get_mut(&id) else {
                continue;
            };
            if job.state.is_terminal() {
                continue;
            }
            // Only what finished is lost: an attempt still running there
            // fails its hand-over, or (if it finishes before it learns)
            // is caught when its FINISHED arrives.
            let lost: Vec<(usize, usize, u32)> = job
                .shuffle_locations
                .iter()
                .filter(|((v, i, n), s)| {
                    s.as_str() == service
                        && job.eg.vertices[*v].subtasks[*i].finished_attempt == Some(*n)
                })
                .map(|(k, _)| *k)
                .collect();
            if lost.is_empty() {
                continue;
            }
            job.lost_partitions.extend(lost);
            self.invalidate_lost_results(id, &cause);
        }
    }

    /// A consumer of the job could not read: if the data was at a shuffle
    /// service, find out now whether the service is gone (rather than after
    /// its heartbeat timeout).
    fn probe_shuffle_services(&mut self, id: JobId) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let services: BTreeSet<&String> = job.shuffle_locations.values().collect();
        for service in services {
            if self.shuffle.service(service).is_some() {
                self.actions.push_back(Action::ProbeShuffleService {
                    service: service.clone(),
                });
            }
        }
    }

    fn partitions_lost(&mut self, id: JobId, partitions: &[PartitionRef], reason: &str) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        if job.state.is_terminal() {
            return;
        }
        let mut any = false;
        for p in partitions {
            // A pipelined partition's producer restarts with its region.
            let Some(r) = job.eg.results.iter().find(|r| {
                r.data_set.0 == p.data_set
                    && r.result_partition_type == ResultPartitionType::Blocking
            }) else {
                continue;
            };
            let (v, i) = (r.producer, p.producer_subtask as usize);
            let Some(sub) = job.eg.vertices[v].subtasks.get(i) else {
                continue;
            };
            // Only the partition consumers read counts: a report about an
            // attempt that no longer matters changes nothing.
            if sub.finished_attempt == Some(p.attempt) {
                any |= job.lost_partitions.insert((v, i, p.attempt));
            }
        }
        if any {
            self.invalidate_lost_results(id, reason);
        }
    }

    /// Finished subtasks whose partitions sit on a TaskManager that is gone
    /// run again where a consumer still needs them, until nothing changes
    /// (a re-run producer needs its own inputs).
    fn invalidate_lost_results(&mut self, id: JobId, cause: &str) {
        loop {
            let Some(job) = self.jobs.get(&id) else {
                return;
            };
            if job.state.is_terminal() {
                return;
            }
            let factory = self.factory();
            let lost = job.first_lost_result(
                |v, i| factory.results_available(job, v, i),
                |tm| self.pool.contains(tm),
            );
            let Some((v, i)) = lost else { return };
            let mut members = vec![(v, i)];
            if let Some(job) = self.jobs.get_mut(&id) {
                job.eg.vertices[v].subtasks[i].finished_attempt = None;
                // Pipelined inputs are gone: the whole region runs again.
                members = job.region_members(v, i);
            }
            let name = self.jobs[&id].graph.vertices[v].name.clone();
            self.restart(
                id,
                members,
                format!("the results of {name} ({}) were lost: {cause}", i + 1),
            );
        }
    }

    fn release_partitions_of(&mut self, a: ExecutionAttemptId, tm: &str) {
        let Some(job) = self.jobs.get(&a.job) else {
            return;
        };
        let (service, at_tm, at_service) = job.partitions_of(a);
        // The TaskManager also drops what it had not handed over yet.
        if self.pool.contains(tm) && !(at_tm.is_empty() && at_service.is_empty()) {
            let mut all = at_tm;
            all.extend(at_service.iter().copied());
            self.actions.push_back(Action::ReleasePartitions {
                task_manager: tm.to_string(),
                job: a.job,
                partitions: all,
            });
        }
        if let Some(service) = service
            && !at_service.is_empty()
            && self.shuffle.service(&service).is_some()
        {
            self.actions.push_back(Action::ReleaseShufflePartitions {
                service,
                job: a.job,
                partitions: at_service,
            });
        }
    }

    /// Every subtask finished: the job is FINISHED once the TaskManagers of
    /// the winning attempts renamed what those staged (Flink's
    /// `finalizeGlobal`), at once if none staged anything.
    fn commit_job(&mut self, id: JobId) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let mut by_tm: BTreeMap<String, Vec<ExecutionAttemptId>> = BTreeMap::new();
        let mut lost = None;
        for (v, ejv) in job.eg.vertices.iter().enumerate() {
            for (i, sub) in ejv.subtasks.iter().enumerate() {
                let Some(e) = sub.winner() else { continue };
                if e.metrics.as_ref().is_none_or(|m| m.staged_files.is_empty()) {
                    continue;
                }
                let attempt = ExecutionAttemptId {
                    job: id,
                    vertex: v,
                    subtask: i,
                    attempt: e.attempt_number,
                };
                match &e.task_manager {
                    Some(tm) if self.pool.contains(tm) => {
                        by_tm.entry(tm.clone()).or_default().push(attempt)
                    }
                    tm => {
                        lost.get_or_insert(format!(
                            "TaskManager {} holding the output files of {} subtask {i} was lost \
                             before they were committed",
                            tm.as_deref().unwrap_or("?"),
                            job.graph.vertices[v].name
                        ));
                    }
                }
            }
        }
        if let Some(cause) = lost {
            self.end_job(id, JobState::Failed, Some(cause));
            return;
        }
        if by_tm.is_empty() {
            self.end_job(id, JobState::Finished, None);
            return;
        }
        job.committing = by_tm.keys().cloned().collect();
        job.commit_started = true;
        for (task_manager, attempts) in by_tm {
            self.actions.push_back(Action::CommitFiles {
                task_manager,
                job: id,
                attempts,
            });
        }
    }

    fn files_committed(&mut self, id: JobId, tm: &str, failure: Option<String>) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        if job.state.is_terminal() || !job.committing.remove(tm) {
            return;
        }
        if let Some(f) = failure {
            let cause = format!("committing the output files on TaskManager {tm}: {f}");
            self.end_job(id, JobState::Failed, Some(cause));
        } else if job.committing.is_empty() {
            self.end_job(id, JobState::Finished, None);
        }
    }

    fn end_job(&mut self, id: JobId, state: JobState, cause: Option<String>) {
        let now = self.now;
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        if job.state.is_terminal() {
            return;
        }
        job.end(state, cause, now);
        self.pool.release_job(job);
        for tm in std::mem::take(&mut job.touched) {
            if self.pool.contains(&tm) {
                self.actions.push_back(Action::ReleaseJob {
                    task_manager: tm,
                    job: id,
                });
            }
        }
        let services: BTreeSet<String> = job.shuffle_locations.values().cloned().collect();
        for service in services {
            if self.shuffle.service(&service).is_some() {
                self.actions
                    .push_back(Action::ReleaseShuffleJob { service, job: id });
            }
        }
        self.actions.push_back(Action::JobEnded { job: id, state });
    }

    fn factory(&self) -> DeploymentFactory<'_> {
        DeploymentFactory {
            pool: &self.pool,
            shuffle: &self.shuffle,
        }
    }

    /// Takes the attempt out of its shared slot (see
    /// [`SlotPool::free_slot_of`]).
    fn free_slot(&mut self, a: ExecutionAttemptId) {
        if let Some(job) = self.jobs.get_mut(&a.job) {
            self.pool.free_slot_of(job, a);
        }
    }

    // ------------------------------------------------------------ time

    fn check_timeouts(&mut self) {
        let timeout = self.config.heartbeat_timeout;
        let now = self.now;
        let silent = self.pool.silent(now, timeout);
        for tm in silent {
            self.lose_task_manager(&tm, &format!("no heartbeat for {} ms", timeout.as_millis()));
        }
        let silent: Vec<String> = self
            .service_heartbeats
            .iter()
            .filter(|(_, t)| now.saturating_sub(**t) >= timeout)
            .map(|(s, _)| s.clone())
            .collect();
        for s in silent {
            self.service_heartbeats.remove(&s);
            self.lose_shuffle_service(&s, &format!("no heartbeat for {} ms", timeout.as_millis()));
        }
        for j in self.jobs.values_mut() {
            j.failover.expire_probes(now);
        }
    }

    // ------------------------------------------------------------ scheduling

    fn schedule_all(&mut self) {
        let ids: Vec<JobId> = self.job_order.clone();
        for id in ids {
            self.schedule(id);
        }
    }

    fn schedule(&mut self, id: JobId) {
        let now = self.now;
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        if job.state.is_terminal() {
            return;
        }
        // A pending restart fires after its delay, once probes are answered
        // and what it cancelled has stopped.
        if job.failover.is_pending() {
            let eg = &job.eg;
            let canceling = |v: usize, i: usize| {
                eg.vertices[v].subtasks[i]
                    .attempts
                    .iter()
                    .any(|e| e.state == ExecutionState::Canceling)
            };
            if let Some(subtasks) = job.failover.take_due(now, canceling) {
                for (v, i) in subtasks {
                    let sub = &mut job.eg.vertices[v].subtasks[i];
                    let waiting = matches!(
                        sub.latest_attempt().state,
                        ExecutionState::Created | ExecutionState::Scheduled
                    );
                    if sub.finished_attempt.is_none()
                        && sub.live_attempts().next().is_none()
                        && !waiting
                    {
                        sub.new_attempt(ms(now));
                    }
                }
                job.state = JobState::Running;
            } else if job.state == JobState::Restarting {
                return;
            }
        }
        if job.state == JobState::Created {
            job.state = JobState::Running;
        }
        self.allocate(id);
        self.deploy_ready(id);
        let Some(since) = self.jobs.get(&id).and_then(|j| j.waiting_since) else {
            return;
        };
        if now.saturating_sub(since) >= self.config.slot_request_timeout {
            let waited = self.config.slot_request_timeout.as_millis();
            let reason = self.pool.shortage_message(&self.jobs[&id], waited);
            self.end_job(id, JobState::Failed, Some(reason));
        }
    }

    /// Gives slots to waiting attempts, one pipelined region at a time (all
    /// of a region or none of it).
    fn allocate(&mut self, id: JobId) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        // Waiting attempts without a slot, grouped by region.
        let mut regions: BTreeMap<(usize, usize), Vec<Member>> = BTreeMap::new();
        for (v, ejv) in job.eg.vertices.iter().enumerate() {
            for (i, s) in ejv.subtasks.iter().enumerate() {
                let e = s.latest_attempt();
                if s.finished_attempt.is_none() && e.state == ExecutionState::Created {
                    let key = if job.region_pipelined[job.region_of[v]] {
                        (job.region_of[v], usize::MAX)
                    } else {
                        (v, i)
                    };
                    regions
                        .entry(key)
                        .or_default()
                        .push((v, i, e.attempt_number));
                }
            }
        }
        let mut short = false;
        for members in regions.into_values() {
            let Some(job) = self.jobs.get(&id) else {
                return;
            };
            // A region waits until its blocking inputs are there, and a
            // pipelined region until all of its subtasks wait (a restart
            // of it has fired).
            if !members
                .iter()
                .all(|&(v, i, _)| self.factory().blocking_inputs_ready(job, v, i))
            {
                continue;
            }
            let r = job.region_of[members[0].0];
            if job.region_pipelined[r] {
                // Busy: a member whose attempt ended and that has no new
                // one yet (its restart is pending). Members that hold a
                // slot (SCHEDULED) wait with the region: a member that lost
                // its slot with its TaskManager is placed again alone.
                let busy = job.eg.vertices.iter().enumerate().any(|(u, ejv)| {
                    job.region_of[u] == r
                        && ejv.subtasks.iter().any(|s| {
                            s.finished_attempt.is_none()
                                && !matches!(
                                    s.latest_attempt().state,
                                    ExecutionState::Created | ExecutionState::Scheduled
                                )
                                && s.live_attempts().next().is_none()
                                && !members.iter().any(|m| m.0 == u)
                        })
                });
                if busy {
                    continue;
                }
            }
            match self.pool.find_slots(job, &members, self.now) {
                Some(plan) => {
                    if let Some(job) = self.jobs.get_mut(&id) {
                        self.pool.commit_slots(job, &members, plan, ms(self.now));
                    }
                }
                None => short = true,
            }
        }
        // The slot wait clock runs only while nothing of the job runs: a
        // running job frees slots itself.
        if let Some(job) = self.jobs.get_mut(&id) {
            if short && !job.has_live_attempts() {
                job.waiting_since.get_or_insert(self.now);
            } else {
                job.waiting_since = None;
            }
        }
    }

    /// Deploys scheduled attempts whose inputs are there: blocking ones
    /// finished, pipelined producers acknowledged (or deploying on the same
    /// TaskManager, queued before them).
    fn deploy_ready(&mut self, id: JobId) {
        // A pass deploys the producers of a region; the next one their
        // consumers on the same TaskManagers, and so on down the region.
        while self.deploy_ready_pass(id) {}
    }

    /// One pass of [`Self::deploy_ready`]; true if it deployed something.
    fn deploy_ready_pass(&mut self, id: JobId) -> bool {
        let now = ms(self.now);
        let Some(job) = self.jobs.get(&id) else {
            return false;
        };
        let mut ready = Vec::new();
        let mut refused = None;
        'all: for (v, ejv) in job.eg.vertices.iter().enumerate() {
            for (i, s) in ejv.subtasks.iter().enumerate() {
                for e in &s.attempts {
                    if e.state != ExecutionState::Scheduled {
                        continue;
                    }
                    match self.factory().build(job, v, i, e.attempt_number) {
                        Ok(Some(d)) => ready.push(d),
                        Ok(None) => {}
                        Err(e) => {
                            refused = Some(e.to_string());
                            break 'all;
                        }
                    }
                }
            }
        }
        let timeout = self.config.slot_request_timeout;
        let now_d = self.now;
        let Some(job) = self.jobs.get_mut(&id) else {
            return false;
        };
        // A producer without a shuffle service on its host waits for one
        // (a restarted service registers again), as long as for slots.
        if let Some(cause) = refused {
            let since = *job.service_wait_since.get_or_insert(now_d);
            let waited = now_d.saturating_sub(since);
            if waited >= timeout {
                self.end_job(
                    id,
                    JobState::Failed,
                    Some(format!(
                        "{cause} (waited {} ms, slot.request.timeout)",
                        waited.as_millis()
                    )),
                );
                return false;
            }
        } else {
            job.service_wait_since = None;
        }
        let deployed = !ready.is_empty();
        for d in ready {
            let a = d.attempt;
            if let Some(t) = d.outputs.iter().find_map(|o| o.shuffle_service.as_ref()) {
                job.shuffle_locations
                    .insert((a.vertex, a.subtask, a.attempt), t.id.clone());
            }
            job.touched.insert(d.task_manager.clone());
            job.eg.vertices[a.vertex].subtasks[a.subtask].attempts[a.attempt as usize]
                .transition(ExecutionState::Deploying, now);
            self.actions.push_back(Action::Deploy(Box::new(d)));
        }
        deployed
    }
}

//! The JobManager process.
//!
//! State lives in one [`JmState`] behind a mutex; gRPC handlers and the REST
//! API change or read it quickly and wake the scheduler loop, which decides
//! what to deploy, cancel or release and then performs those calls (outside
//! the lock, in order, so producers are deployed before their consumers).
//!
//! Scheduling: a job reserves slots up front, one per subtask index per slot
//! sharing group (Flink's slot sharing: a slot hosts one subtask of each
//! vertex of its group), in TaskManager registration order. Streaming jobs
//! deploy every vertex at once; batch jobs deploy a vertex when all vertices
//! it reads from have finished (every exchange of a batch job is blocking,
//! so each vertex is its own pipelined region).
//!
//! Failures: a failed task or a TaskManager silent for `heartbeat.timeout`
//! fails the job. With `restart-strategy.type: fixed-delay` it restarts
//! after the delay: a streaming job restarts every task; a batch job only
//! the unfinished vertices plus finished ones whose results were lost with
//! the TaskManager (and, transitively, the producers those need). Restarted
//! subtasks get new attempt numbers.

use crate::config as cfg;
use crate::deployment::{
    InputDescriptor, OutputDescriptor, PartitionRef, TaskDeploymentDescriptor,
};
use crate::program::{ProgramCatalog, ProgramSpec};
use crate::rpc::job_manager_server::{JobManager, JobManagerServer};
use crate::rpc::task_manager_client::TaskManagerClient;
use crate::rpc::{
    Ack, Empty, HeartbeatResponse, JobList, JobRequest, JobStatus, RegisterTaskManagerRequest,
    RegisterTaskManagerResponse, SubmitJobRequest, SubmitJobResponse, TaskDeployment,
    TaskManagerHeartbeat, TaskStateUpdate,
};
use crate::security;
use fluvia_core::{Configuration, FluviaError, Result, ResultPartitionType};
use fluvia_graph::{JobGraph, JobType};
use fluvia_scheduler::{ExecutionGraph, ExecutionState};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

/// Flink's job states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Created,
    Running,
    Failing,
    Restarting,
    Finished,
    Failed,
    Cancelling,
    Canceled,
}

impl JobState {
    pub fn name(self) -> &'static str {
        match self {
            JobState::Created => "CREATED",
            JobState::Running => "RUNNING",
            JobState::Failing => "FAILING",
            JobState::Restarting => "RESTARTING",
            JobState::Finished => "FINISHED",
            JobState::Failed => "FAILED",
            JobState::Cancelling => "CANCELLING",
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

pub(crate) struct TmEntry {
    pub id: String,
    pub rpc_address: String,
    pub data_address: String,
    pub slots: usize,
    pub last_heartbeat: Instant,
    pub client: TaskManagerClient<Channel>,
    pub metrics_json: String,
}

pub(crate) struct JobEntry {
    pub id: String,
    pub program: ProgramSpec,
    pub graph: Arc<JobGraph>,
    pub eg: ExecutionGraph,
    pub state: JobState,
    pub error: Option<String>,
    pub start_time: u64,
    pub end_time: Option<u64>,
    pub restarts: usize,
    restart_at: Option<Instant>,
    slots_wait_since: Option<Instant>,
    /// TaskManager of each subtask's current attempt.
    pub placement: Vec<Vec<Option<String>>>,
    /// Final metrics of finished subtasks (JSON from the TaskManager).
    pub task_metrics: HashMap<(usize, usize), serde_json::Value>,
    /// Whether the last round's cancel calls were sent.
    cancel_sent: bool,
    /// A failure happened: check which TaskManagers still answer before
    /// restarting (a dead one may not have missed its heartbeat yet).
    probe_pending: bool,
}

impl JobEntry {
    fn vertex_finished(&self, v: usize) -> bool {
        self.eg.vertices[v]
            .subtasks
            .iter()
            .all(|s| s.current_attempt().state == ExecutionState::Finished)
    }

    fn uses_tm(&self, tm: &str) -> bool {
        self.placement
            .iter()
            .flatten()
            .any(|p| p.as_deref() == Some(tm))
    }

    /// Slots the job holds on each TaskManager: one per (slot sharing
    /// group, subtask index) placed there.
    pub(crate) fn slots_per_task_manager(&self) -> HashMap<&str, usize> {
        let mut slots: HashMap<&str, BTreeSet<(&str, usize)>> = HashMap::new();
        for (v, subs) in self.placement.iter().enumerate() {
            let g = self.graph.vertices[v].slot_sharing_group.as_str();
            for (i, p) in subs.iter().enumerate() {
                if let Some(tm) = p {
                    slots.entry(tm.as_str()).or_default().insert((g, i));
                }
            }
        }
        slots.into_iter().map(|(tm, s)| (tm, s.len())).collect()
    }
}

pub(crate) struct JmState {
    pub tms: BTreeMap<String, TmEntry>,
    /// TaskManager ids in registration order (slot order).
    pub tm_order: Vec<String>,
    pub jobs: BTreeMap<String, JobEntry>,
    pub job_order: Vec<String>,
}

pub(crate) struct JmShared {
    pub secret: Option<String>,
    catalog: Arc<dyn ProgramCatalog>,
    pub state: Mutex<JmState>,
    wake: tokio::sync::Notify,
    /// Signalled when a job reaches a final state (long-polling clients).
    job_ended: tokio::sync::Notify,
    heartbeat_interval: Duration,
    heartbeat_timeout: Duration,
    slot_timeout: Duration,
    restart_attempts: usize,
    restart_delay: Duration,
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Something the scheduler does outside the lock.
enum Action {
    Deploy {
        job: String,
        tm: String,
        client: TaskManagerClient<Channel>,
        descriptor: Box<TaskDeploymentDescriptor>,
    },
    Cancel {
        job: String,
        client: TaskManagerClient<Channel>,
    },
    Release {
        job: String,
        client: TaskManagerClient<Channel>,
    },
}

impl JmShared {
    fn state(&self) -> std::sync::MutexGuard<'_, JmState> {
        lock(&self.state)
    }

    /// Marks the job failed or schedules its restart. `lost_tm` names a
    /// TaskManager whose results are gone.
    fn fail_job(&self, st: &mut JmState, job_id: &str, reason: String, lost_tm: Option<&str>) {
        let attempts = self.restart_attempts;
        let delay = self.restart_delay;
        let Some(job) = st.jobs.get_mut(job_id) else {
            return;
        };
        if job.state.is_terminal() || matches!(job.state, JobState::Cancelling) {
            return;
        }
        if job.state == JobState::Restarting {
            // Already restarting: only more results may have been lost.
            if let Some(lost) = lost_tm {
                Self::lose_results(job, lost);
            }
            return;
        }
        tracing::warn!("job {job_id} failed: {reason}");
        job.cancel_sent = false;
        if job.restarts >= attempts {
            job.state = JobState::Failed;
            job.error = Some(reason);
            job.end_time = Some(now_millis());
            self.job_ended.notify_waiters();
            self.wake.notify_one();
            return;
        }
        // Every running task of the job is cancelled, so all deployed,
        // unfinished subtasks re-run; a streaming job re-runs everything
        // that was deployed.
        let streaming = job.graph.job_type == JobType::Streaming;
        let mut rerun = Vec::new();
        for (v, ejv) in job.eg.vertices.iter().enumerate() {
            for (i, sub) in ejv.subtasks.iter().enumerate() {
                let state = sub.current_attempt().state;
                let deployed = state != ExecutionState::Created;
                if deployed && (streaming || state != ExecutionState::Finished) {
                    rerun.push((v, i));
                }
            }
        }
        for (v, i) in rerun {
            Self::new_attempt(job, v, i);
        }
        if let Some(lost) = lost_tm {
            Self::lose_results(job, lost);
        }
        job.restarts += 1;
        job.state = JobState::Restarting;
        job.error = Some(reason);
        job.restart_at = Some(Instant::now() + delay);
        job.probe_pending = true;
        tracing::info!(
            "job {job_id}: restart {} of {attempts} in {delay:?}",
            job.restarts
        );
        self.wake.notify_one();
    }

    fn new_attempt(job: &mut JobEntry, v: usize, i: usize) {
        let sub = &mut job.eg.vertices[v].subtasks[i];
        if !sub.current_attempt().state.is_terminal() {
            sub.current_attempt_mut().state = ExecutionState::Canceled;
        }
        sub.new_attempt();
        job.placement[v][i] = None;
    }

    /// A TaskManager is gone: its finished results that a consumer still
    /// has to read are produced again (transitively), and nothing stays
    /// placed on it.
    fn lose_results(job: &mut JobEntry, lost: &str) {
        let n = job.graph.vertices.len();
        loop {
            let mut found = None;
            'search: for v in 0..n {
                let consumers_pending = job.graph.vertices.iter().enumerate().any(|(c, cv)| {
                    cv.inputs
                        .iter()
                        .any(|e| job.graph.vertex_index(e.source_vertex) == Some(v))
                        && !job.vertex_finished(c)
                });
                if !consumers_pending {
                    continue;
                }
                for i in 0..job.graph.vertices[v].parallelism {
                    let finished = job.eg.vertices[v].subtasks[i].current_attempt().state
                        == ExecutionState::Finished;
                    if finished && job.placement[v][i].as_deref() == Some(lost) {
                        found = Some((v, i));
                        break 'search;
                    }
                }
            }
            match found {
                Some((v, i)) => Self::new_attempt(job, v, i),
                None => break,
            }
        }
        for p in job.placement.iter_mut().flatten() {
            if p.as_deref() == Some(lost) {
                *p = None;
            }
        }
    }

    /// Declares a TaskManager lost and fails (or extends the restart of)
    /// every job that used it.
    fn lose_task_manager(&self, st: &mut JmState, tm: &str, reason: &str) {
        let addr = st
            .tms
            .get(tm)
            .map(|t| t.rpc_address.clone())
            .unwrap_or_default();
        tracing::warn!("TaskManager {tm} ({addr}) lost: {reason}");
        st.tms.remove(tm);
        st.tm_order.retain(|t| t != tm);
        let affected: Vec<String> = st
            .jobs
            .values()
            .filter(|j| !j.state.is_terminal() && j.uses_tm(tm))
            .map(|j| j.id.clone())
            .collect();
        for j in affected {
            self.fail_job(
                st,
                &j,
                format!("TaskManager {tm} ({addr}) was lost: {reason}"),
                Some(tm),
            );
        }
    }

    /// Decides the next actions for every job.
    fn plan(&self, st: &mut JmState) -> Vec<Action> {
        let mut actions = Vec::new();
        // Lost TaskManagers.
        let timeout = self.heartbeat_timeout;
        let lost: Vec<String> = st
            .tms
            .values()
            .filter(|t| t.last_heartbeat.elapsed() > timeout)
            .map(|t| t.id.clone())
            .collect();
        for tm in lost {
            self.lose_task_manager(
                st,
                &tm,
                &format!("no heartbeat for {} ms", timeout.as_millis()),
            );
        }

        let job_ids: Vec<String> = st.job_order.clone();
        for id in job_ids {
            self.plan_job(st, &id, &mut actions);
        }
        actions
    }

    fn free_slots(&self, st: &JmState, except: &str) -> Vec<String> {
        // Slots used by other live jobs, per TaskManager.
        let mut used: HashMap<&str, usize> = HashMap::new();
        for j in st.jobs.values() {
            if j.id == except || j.state.is_terminal() {
                continue;
            }
            for (tm, n) in j.slots_per_task_manager() {
                *used.entry(tm).or_insert(0) += n;
            }
        }
        let mut free = Vec::new();
        for tm in &st.tm_order {
            if let Some(t) = st.tms.get(tm) {
                let n = t.slots.saturating_sub(*used.get(tm.as_str()).unwrap_or(&0));
                free.extend(std::iter::repeat_n(tm.clone(), n));
            }
        }
        free
    }

    fn plan_job(&self, st: &mut JmState, id: &str, actions: &mut Vec<Action>) {
        let Some(state) = st.jobs.get(id).map(|j| j.state) else {
            return;
        };
        match state {
            JobState::Failed | JobState::Canceled | JobState::Restarting | JobState::Cancelling => {
                if !st.jobs[id].cancel_sent {
                    let tms: Vec<TaskManagerClient<Channel>> =
                        st.tms.values().map(|t| t.client.clone()).collect();
                    for client in tms {
                        actions.push(if state.is_terminal() {
                            Action::Release {
                                job: id.to_string(),
                                client,
                            }
                        } else {
                            Action::Cancel {
                                job: id.to_string(),
                                client,
                            }
                        });
                    }
                    if let Some(j) = st.jobs.get_mut(id) {
                        j.cancel_sent = true;
                        if state == JobState::Cancelling {
                            j.state = JobState::Canceled;
                            j.end_time = Some(now_millis());
                            self.job_ended.notify_waiters();
                            j.cancel_sent = false;
                        }
                    }
                }
                if state == JobState::Restarting
                    && !st.jobs[id].probe_pending
                    && st.jobs[id].restart_at.is_some_and(|t| Instant::now() >= t)
                    && let Some(j) = st.jobs.get_mut(id)
                {
                    j.state = JobState::Created;
                    j.restart_at = None;
                }
                return;
            }
            JobState::Finished | JobState::Failing => return,
            JobState::Created | JobState::Running => {}
        }

        // Place unplaced subtasks.
        let needs_placement = st.jobs[id].placement.iter().flatten().any(|p| p.is_none());
        if needs_placement {
            let free = self.free_slots(st, id);
            let job = &st.jobs[id];
            // Slots this job still holds (placed subtasks keep theirs).
            let mut held: Vec<String> = Vec::new();
            for subs in &job.placement {
                for p in subs.iter().flatten() {
                    held.push(p.clone());
                }
            }
            let required = job.graph.required_slots();
            // Slot index s of group g: the same TaskManager for subtask s of every vertex in g.
            let groups: Vec<String> = {
                let mut g: Vec<String> = job
                    .graph
                    .vertices
                    .iter()
                    .map(|v| v.slot_sharing_group.clone())
                    .collect();
                g.dedup();
                let mut seen = BTreeSet::new();
                g.retain(|x| seen.insert(x.clone()));
                g
            };
            let mut slot_tm: Vec<Option<String>> = vec![None; required];
            let mut offsets = HashMap::new();
            let mut off = 0;
            for g in &groups {
                offsets.insert(g.clone(), off);
                off += job
                    .graph
                    .vertices
                    .iter()
                    .filter(|v| &v.slot_sharing_group == g)
                    .map(|v| v.parallelism)
                    .max()
                    .unwrap_or(0);
            }
            for (v, subs) in job.placement.iter().enumerate() {
                let o = offsets[&job.graph.vertices[v].slot_sharing_group];
                for (i, p) in subs.iter().enumerate() {
                    if let Some(tm) = p {
                        slot_tm[o + i] = Some(tm.clone());
                    }
                }
            }
            let missing = slot_tm.iter().filter(|s| s.is_none()).count();
            // Free slots, minus the ones of still-placed subtasks already counted.
            let mut pool = free;
            for t in slot_tm.iter().flatten() {
                if let Some(pos) = pool.iter().position(|x| x == t) {
                    pool.remove(pos);
                }
            }
            if pool.len() < missing {
                let job = st.jobs.get_mut(id).expect("job exists");
                let since = *job.slots_wait_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= self.slot_timeout {
                    let total: usize = st.tms.values().map(|t| t.slots).sum();
                    let reason = format!(
                        "not enough slots: the job needs {required} slots ({missing} more), the cluster \
                         has {} free of {total} on {} TaskManagers, after waiting {} ms \
                         (slot.request.timeout)",
                        pool.len(),
                        st.tms.len(),
                        self.slot_timeout.as_millis()
                    );
                    let job = st.jobs.get_mut(id).expect("job exists");
                    job.state = JobState::Failed;
                    job.error = Some(reason);
                    job.end_time = Some(now_millis());
                    self.job_ended.notify_waiters();
                }
                return;
            }
            let mut pool = pool.into_iter();
            for s in slot_tm.iter_mut().filter(|s| s.is_none()) {
                *s = pool.next();
            }
            let job = st.jobs.get_mut(id).expect("job exists");
            job.slots_wait_since = None;
            for v in 0..job.placement.len() {
                let o = offsets[&job.graph.vertices[v].slot_sharing_group];
                for i in 0..job.placement[v].len() {
                    if job.placement[v][i].is_none() {
                        job.placement[v][i] = slot_tm[o + i].clone();
                    }
                }
            }
        }

        let job = st.jobs.get_mut(id).expect("job exists");
        if job.state == JobState::Created {
            job.state = JobState::Running;
        }
        // Deploy what may run now.
        let n = job.graph.vertices.len();
        if (0..n).all(|v| job.vertex_finished(v)) {
            job.state = JobState::Finished;
            job.end_time = Some(now_millis());
            self.job_ended.notify_waiters();
            return;
        }
        let mut deployable = Vec::new();
        for v in 0..n {
            let ready = match job.graph.job_type {
                JobType::Streaming => true,
                JobType::Batch => job.graph.vertices[v].inputs.iter().all(|e| {
                    job.graph
                        .vertex_index(e.source_vertex)
                        .is_some_and(|u| job.vertex_finished(u))
                }),
            };
            if !ready {
                continue;
            }
            for (i, sub) in job.eg.vertices[v].subtasks.iter().enumerate() {
                if sub.current_attempt().state == ExecutionState::Created {
                    deployable.push((v, i));
                }
            }
        }
        for (v, i) in deployable {
            let job = &st.jobs[id];
            let (tm, d) = match self.descriptor(st, job, v, i) {
                Ok(x) => x,
                Err(e) => {
                    let reason = format!("cannot deploy {}: {e}", job.graph.vertices[v].name);
                    self.fail_job(st, id, reason, None);
                    return;
                }
            };
            let job = st.jobs.get_mut(id).expect("job exists");
            job.eg.vertices[v].subtasks[i].current_attempt_mut().state = ExecutionState::Deploying;
            if let Some(t) = st.tms.get(&tm) {
                actions.push(Action::Deploy {
                    job: id.to_string(),
                    tm: tm.clone(),
                    client: t.client.clone(),
                    descriptor: Box::new(d),
                });
            }
        }
    }

    fn descriptor(
        &self,
        st: &JmState,
        job: &JobEntry,
        v: usize,
        i: usize,
    ) -> Result<(String, TaskDeploymentDescriptor)> {
        let tm = job.placement[v][i]
            .clone()
            .ok_or_else(|| FluviaError::Internal("subtask without a slot".into()))?;
        let sub = &job.eg.vertices[v].subtasks[i];
        let mut inputs = Vec::new();
        for cp in &sub.consumed {
            let result = &job.eg.results[cp.result];
            let pv = result.producer;
            let ptm = job.placement[pv][cp.producer_subtask]
                .clone()
                .ok_or_else(|| FluviaError::Internal("producer without a slot".into()))?;
            let address = st
                .tms
                .get(&ptm)
                .map(|t| t.data_address.clone())
                .ok_or_else(|| FluviaError::Execution(format!("TaskManager {ptm} is gone")))?;
            let attempt = job.eg.vertices[pv].subtasks[cp.producer_subtask]
                .current_attempt()
                .attempt_number;
            for sp in cp.subpartitions.iter() {
                inputs.push(InputDescriptor {
                    type_number: cp.type_number,
                    partition: PartitionRef {
                        data_set: result.data_set.0,
                        producer_subtask: cp.producer_subtask as u32,
                        attempt,
                    },
                    subpartition: sp as u32,
                    producer_address: address.clone(),
                    local: ptm == tm,
                });
            }
        }
        let mut outputs = Vec::new();
        for ds in &job.graph.vertices[v].produced_data_sets {
            let r = job
                .eg
                .results
                .iter()
                .find(|r| r.data_set == ds.id)
                .ok_or_else(|| FluviaError::Internal(format!("no result for {}", ds.id)))?;
            outputs.push(OutputDescriptor {
                data_set: ds.id.0,
                num_subpartitions: r.num_subpartitions[i],
                partitioner: r.partitioner,
                consumer_max_parallelism: r.consumer_max_parallelism,
                blocking: r.result_partition_type == ResultPartitionType::Blocking,
            });
        }
        Ok((
            tm,
            TaskDeploymentDescriptor {
                job_id: job.id.clone(),
                program: job.program.clone(),
                job_fingerprint: job.graph.fingerprint.clone(),
                config: job.graph.config.clone(),
                vertex_index: v,
                subtask: i,
                attempt: sub.current_attempt().attempt_number,
                inputs,
                outputs,
            },
        ))
    }

    async fn perform(self: &Arc<Self>, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Deploy {
                    job,
                    tm,
                    mut client,
                    descriptor,
                } => {
                    let json = match serde_json::to_string(&descriptor) {
                        Ok(j) => j,
                        Err(e) => {
                            let mut st = self.state();
                            self.fail_job(
                                &mut st,
                                &job,
                                format!("encoding a deployment: {e}"),
                                None,
                            );
                            continue;
                        }
                    };
                    let req = security::authorize(
                        TaskDeployment {
                            descriptor_json: json,
                        },
                        &self.secret,
                    );
                    let outcome =
                        tokio::time::timeout(Duration::from_secs(30), client.deploy_task(req))
                            .await;
                    let failure = match outcome {
                        Ok(Ok(ack)) if ack.get_ref().ok => None,
                        Ok(Ok(ack)) => Some(ack.into_inner().message),
                        Ok(Err(status)) => Some(format!(
                            "TaskManager {tm} refused the deployment: {}",
                            status.message()
                        )),
                        Err(_) => Some(format!(
                            "TaskManager {tm} did not answer a deployment in 30 s"
                        )),
                    };
                    if let Some(reason) = failure {
                        let mut st = self.state();
                        self.fail_job(&mut st, &job, reason, None);
                    }
                }
                Action::Cancel { job, mut client } => {
                    let req = security::authorize(
                        JobRequest {
                            job_id: job,
                            wait_ms: 0,
                        },
                        &self.secret,
                    );
                    let _ =
                        tokio::time::timeout(Duration::from_secs(5), client.cancel_job_tasks(req))
                            .await;
                }
                Action::Release { job, mut client } => {
                    let req = security::authorize(
                        JobRequest {
                            job_id: job,
                            wait_ms: 0,
                        },
                        &self.secret,
                    );
                    let _ =
                        tokio::time::timeout(Duration::from_secs(5), client.release_job(req)).await;
                }
            }
        }
    }

    async fn scheduler_loop(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(100).min(self.heartbeat_interval)) => {}
            }
            let actions = {
                let mut st = self.state();
                let actions = self.plan(&mut st);
                // Finished jobs release their partitions once.
                let done: Vec<String> = st
                    .jobs
                    .values()
                    .filter(|j| j.state == JobState::Finished && !j.cancel_sent)
                    .map(|j| j.id.clone())
                    .collect();
                let mut actions = actions;
                for id in done {
                    if let Some(j) = st.jobs.get_mut(&id) {
                        j.cancel_sent = true;
                    }
                    for t in st.tms.values() {
                        actions.push(Action::Release {
                            job: id.clone(),
                            client: t.client.clone(),
                        });
                    }
                }
                actions
            };
            self.perform(actions).await;
            self.probe_if_needed().await;
        }
    }

    /// After a failure, pings every TaskManager; those that do not answer
    /// are lost now rather than after `heartbeat.timeout`, so the restart
    /// does not deploy to a dead process.
    async fn probe_if_needed(self: &Arc<Self>) {
        let clients: Vec<(String, TaskManagerClient<Channel>)> = {
            let st = self.state();
            if !st.jobs.values().any(|j| j.probe_pending) {
                return;
            }
            st.tms
                .values()
                .map(|t| (t.id.clone(), t.client.clone()))
                .collect()
        };
        let mut dead = Vec::new();
        for (id, mut client) in clients {
            let req = security::authorize(Empty {}, &self.secret);
            let alive = matches!(
                tokio::time::timeout(Duration::from_millis(500), client.ping(req)).await,
                Ok(Ok(_))
            );
            if !alive {
                dead.push(id);
            }
        }
        let mut st = self.state();
        for tm in dead {
            self.lose_task_manager(&mut st, &tm, "it does not answer");
        }
        for j in st.jobs.values_mut() {
            j.probe_pending = false;
        }
        drop(st);
        self.wake.notify_one();
    }

    /// JSON details of a job, as `GET /jobs/:id` and `fluvia run` show them.
    pub(crate) fn job_details(&self, st: &JmState, job: &JobEntry) -> serde_json::Value {
        let now = now_millis();
        let vertices: Vec<serde_json::Value> = job
            .graph
            .vertices
            .iter()
            .enumerate()
            .map(|(v, jv)| {
                let subtasks: Vec<serde_json::Value> = job.eg.vertices[v]
                    .subtasks
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let m = job.task_metrics.get(&(v, i)).cloned().unwrap_or(json!({}));
                        let host = job.placement[v][i]
                            .as_ref()
                            .and_then(|t| st.tms.get(t))
                            .map(|t| t.rpc_address.clone())
                            .unwrap_or_default();
                        json!({
                            "subtask": i,
                            "attempt": s.current_attempt().attempt_number,
                            "status": format!("{:?}", s.current_attempt().state).to_uppercase(),
                            "host": host,
                            "taskmanager-id": job.placement[v][i].clone().unwrap_or_default(),
                            "metrics": {
                                "read-records": m.get("records_in").cloned().unwrap_or(json!(0)),
                                "write-records": m.get("records_out").cloned().unwrap_or(json!(0)),
                                "read-bytes": m.get("bytes_in").cloned().unwrap_or(json!(0)),
                                "write-bytes": m.get("bytes_out").cloned().unwrap_or(json!(0)),
                            },
                            "operator-records": m.get("operators").cloned().unwrap_or(json!([])),
                        })
                    })
                    .collect();
                let sum = |k: &str| -> u64 {
                    subtasks
                        .iter()
                        .map(|s| s["metrics"][k].as_u64().unwrap_or(0))
                        .sum()
                };
                let deployed = job.eg.vertices[v]
                    .subtasks
                    .iter()
                    .any(|s| s.current_attempt().state != ExecutionState::Created);
                let status = if job.vertex_finished(v) {
                    "FINISHED"
                } else if deployed {
                    "RUNNING"
                } else {
                    "CREATED"
                };
                json!({
                    "id": jv.id.to_string(),
                    "name": jv.name,
                    "parallelism": jv.parallelism,
                    "maxParallelism": jv.max_parallelism,
                    "status": status,
                    "metrics": {
                        "read-records": sum("read-records"),
                        "write-records": sum("write-records"),
                        "read-bytes": sum("read-bytes"),
                        "write-bytes": sum("write-bytes"),
                    },
                    "subtasks": subtasks,
                })
            })
            .collect();
        json!({
            "jid": job.id,
            "name": job.graph.name,
            "state": job.state.name(),
            "type": job.graph.job_type.name(),
            "start-time": job.start_time,
            "end-time": job.end_time.map_or(-1, |t| t as i64),
            "duration": job.end_time.unwrap_or(now).saturating_sub(job.start_time),
            "now": now,
            "restarts": job.restarts,
            "error": job.error,
            "vertices": vertices,
        })
    }

    fn status_of(&self, st: &JmState, job: &JobEntry) -> JobStatus {
        JobStatus {
            job_id: job.id.clone(),
            name: job.graph.name.clone(),
            state: job.state.name().into(),
            error: job.error.clone().unwrap_or_default(),
            details_json: self.job_details(st, job).to_string(),
        }
    }

    /// Submits a job (gRPC and tests); returns its id.
    pub(crate) fn submit(&self, program: ProgramSpec, submitted: JobGraph) -> Result<String> {
        let (rebuilt, _) = self.catalog.build(&program)?;
        if rebuilt.fingerprint != submitted.fingerprint {
            return Err(FluviaError::Plan(format!(
                "program '{}' builds a different job graph on the JobManager (fingerprint {} instead \
                 of {}): client and cluster run different code",
                program.name, rebuilt.fingerprint, submitted.fingerprint
            )));
        }
        let eg = ExecutionGraph::from_job_graph(&submitted)?;
        let id = submitted.job_id.to_string();
        let entry = JobEntry {
            id: id.clone(),
            program,
            placement: submitted
                .vertices
                .iter()
                .map(|v| vec![None; v.parallelism])
                .collect(),
            graph: Arc::new(submitted),
            eg,
            state: JobState::Created,
            error: None,
            start_time: now_millis(),
            end_time: None,
            restarts: 0,
            restart_at: None,
            slots_wait_since: None,
            task_metrics: HashMap::new(),
            cancel_sent: false,
            probe_pending: false,
        };
        let mut st = self.state();
        if st.jobs.contains_key(&id) {
            return Err(FluviaError::Plan(format!("job {id} was submitted already")));
        }
        st.jobs.insert(id.clone(), entry);
        st.job_order.push(id.clone());
        drop(st);
        self.wake.notify_one();
        Ok(id)
    }

    pub(crate) fn cancel(&self, job_id: &str) -> Result<()> {
        let mut st = self.state();
        let job = st
            .jobs
            .get_mut(job_id)
            .ok_or_else(|| FluviaError::Plan(format!("no job {job_id}")))?;
        if job.state.is_terminal() {
            return Err(FluviaError::Plan(format!(
                "job {job_id} is {} already",
                job.state.name()
            )));
        }
        job.state = JobState::Cancelling;
        job.cancel_sent = false;
        drop(st);
        self.wake.notify_one();
        Ok(())
    }
}

struct JmService {
    shared: Arc<JmShared>,
}

type RpcResult<T> = std::result::Result<Response<T>, Status>;

#[tonic::async_trait]
impl JobManager for JmService {
    async fn register_task_manager(
        &self,
        req: Request<RegisterTaskManagerRequest>,
    ) -> RpcResult<RegisterTaskManagerResponse> {
        security::check_request(&self.shared.secret, &req, "RegisterTaskManager")?;
        let r = req.into_inner();
        let ours = self.shared.catalog.fingerprint();
        if r.program_fingerprint != ours {
            let reason = format!(
                "program fingerprint {} differs from the JobManager's {ours}: the TaskManager runs \
                 different code",
                r.program_fingerprint
            );
            tracing::warn!(
                "refused TaskManager {} ({}): {reason}",
                r.task_manager_id,
                r.rpc_address
            );
            return Ok(Response::new(RegisterTaskManagerResponse {
                accepted: false,
                reason,
                heartbeat_interval_ms: 0,
            }));
        }
        let channel = Channel::from_shared(format!("http://{}", r.rpc_address))
            .map_err(|e| Status::invalid_argument(format!("bad RPC address: {e}")))?
            .tcp_nodelay(true)
            .connect_lazy();
        let mut st = self.shared.state();
        if !st.tm_order.contains(&r.task_manager_id) {
            st.tm_order.push(r.task_manager_id.clone());
        }
        tracing::info!(
            "TaskManager {} registered: {} slots, RPC {}, data {}",
            r.task_manager_id,
            r.slots,
            r.rpc_address,
            r.data_address
        );
        st.tms.insert(
            r.task_manager_id.clone(),
            TmEntry {
                id: r.task_manager_id,
                rpc_address: r.rpc_address,
                data_address: r.data_address,
                slots: r.slots as usize,
                last_heartbeat: Instant::now(),
                client: TaskManagerClient::new(channel),
                metrics_json: String::new(),
            },
        );
        drop(st);
        self.shared.wake.notify_one();
        Ok(Response::new(RegisterTaskManagerResponse {
            accepted: true,
            reason: String::new(),
            heartbeat_interval_ms: self.shared.heartbeat_interval.as_millis() as u64,
        }))
    }

    async fn heartbeat(&self, req: Request<TaskManagerHeartbeat>) -> RpcResult<HeartbeatResponse> {
        security::check_request(&self.shared.secret, &req, "Heartbeat")?;
        let hb = req.into_inner();
        let mut st = self.shared.state();
        let known = match st.tms.get_mut(&hb.task_manager_id) {
            Some(t) => {
                t.last_heartbeat = Instant::now();
                t.metrics_json = hb.metrics_json;
                true
            }
            None => false,
        };
        Ok(Response::new(HeartbeatResponse { known }))
    }

    async fn update_task_state(&self, req: Request<TaskStateUpdate>) -> RpcResult<Ack> {
        security::check_request(&self.shared.secret, &req, "UpdateTaskState")?;
        let u = req.into_inner();
        let mut st = self.shared.state();
        let (v, i) = (u.vertex_index as usize, u.subtask as usize);
        let Some(job) = st.jobs.get_mut(&u.job_id) else {
            return Ok(Response::new(Ack {
                ok: false,
                message: "unknown job".into(),
            }));
        };
        let Some(sub) = job
            .eg
            .vertices
            .get_mut(v)
            .and_then(|x| x.subtasks.get_mut(i))
        else {
            return Ok(Response::new(Ack {
                ok: false,
                message: "unknown subtask".into(),
            }));
        };
        if sub.current_attempt().attempt_number != u.attempt {
            // A report from an attempt that was already replaced.
            return Ok(Response::new(Ack {
                ok: true,
                message: "stale attempt".into(),
            }));
        }
        let state = match u.state.as_str() {
            "RUNNING" => ExecutionState::Running,
            "FINISHED" => ExecutionState::Finished,
            "CANCELED" => ExecutionState::Canceled,
            _ => ExecutionState::Failed,
        };
        sub.current_attempt_mut().state = state;
        if let Ok(m) = serde_json::from_str::<serde_json::Value>(&u.metrics_json) {
            job.task_metrics.insert((v, i), m);
        }
        let job_id = u.job_id.clone();
        match state {
            ExecutionState::Failed => {
                let reason = if u.error.is_empty() {
                    "task failed".to_string()
                } else {
                    u.error
                };
                self.shared.fail_job(&mut st, &job_id, reason, None);
            }
            ExecutionState::Canceled if job.state == JobState::Running => {
                self.shared.fail_job(
                    &mut st,
                    &job_id,
                    format!("task {v}/{i} was cancelled"),
                    None,
                );
            }
            _ => {}
        }
        drop(st);
        self.shared.wake.notify_one();
        Ok(Response::new(Ack {
            ok: true,
            message: String::new(),
        }))
    }

    async fn submit_job(&self, req: Request<SubmitJobRequest>) -> RpcResult<SubmitJobResponse> {
        security::check_request(&self.shared.secret, &req, "SubmitJob")?;
        let r = req.into_inner();
        let program: ProgramSpec = serde_json::from_str(&r.program_json)
            .map_err(|e| Status::invalid_argument(format!("bad program: {e}")))?;
        let graph: JobGraph = serde_json::from_str(&r.job_graph_json)
            .map_err(|e| Status::invalid_argument(format!("bad job graph: {e}")))?;
        let shared = Arc::clone(&self.shared);
        let id = tokio::task::spawn_blocking(move || shared.submit(program, graph))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(Response::new(SubmitJobResponse { job_id: id }))
    }

    async fn get_job(&self, req: Request<JobRequest>) -> RpcResult<JobStatus> {
        security::check_request(&self.shared.secret, &req, "GetJob")?;
        let req = req.into_inner();
        let id = req.job_id;
        // With `wait_ms` the call returns as soon as the job has ended (or
        // the wait is over), so a client learns of the end without polling.
        let deadline = tokio::time::Instant::now() + Duration::from_millis(req.wait_ms);
        loop {
            let ended = self.shared.job_ended.notified();
            {
                let st = self.shared.state();
                let job = st
                    .jobs
                    .get(&id)
                    .ok_or_else(|| Status::not_found(format!("no job {id}")))?;
                if job.end_time.is_some() || tokio::time::Instant::now() >= deadline {
                    return Ok(Response::new(self.shared.status_of(&st, job)));
                }
            }
            // The timeout only bounds a missed signal; ends are signalled.
            let _ = tokio::time::timeout_at(
                deadline.min(tokio::time::Instant::now() + Duration::from_millis(50)),
                ended,
            )
            .await;
        }
    }

    async fn list_jobs(&self, req: Request<Empty>) -> RpcResult<JobList> {
        security::check_request(&self.shared.secret, &req, "ListJobs")?;
        let st = self.shared.state();
        let jobs = st
            .job_order
            .iter()
            .filter_map(|id| st.jobs.get(id))
            .map(|j| JobStatus {
                job_id: j.id.clone(),
                name: j.graph.name.clone(),
                state: j.state.name().into(),
                error: j.error.clone().unwrap_or_default(),
                details_json: String::new(),
            })
            .collect();
        Ok(Response::new(JobList { jobs }))
    }

    async fn cancel_job(&self, req: Request<JobRequest>) -> RpcResult<Ack> {
        security::check_request(&self.shared.secret, &req, "CancelJob")?;
        let id = req.into_inner().job_id;
        match self.shared.cancel(&id) {
            Ok(()) => Ok(Response::new(Ack {
                ok: true,
                message: String::new(),
            })),
            Err(e) => Err(Status::failed_precondition(e.to_string())),
        }
    }
}

/// A running JobManager.
pub struct JobManagerHandle {
    pub rpc_address: SocketAddr,
    pub rest_address: SocketAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl JobManagerHandle {
    /// Waits until a server task ends (they run until the process stops).
    pub async fn wait(mut self) -> Result<()> {
        if let Some(t) = self.tasks.pop() {
            let _ = t.await;
        }
        Err(FluviaError::Execution("a JobManager server stopped".into()))
    }
}

/// Starts the JobManager's RPC server, REST API and scheduler.
pub async fn start(
    config: Configuration,
    catalog: Arc<dyn ProgramCatalog>,
) -> Result<JobManagerHandle> {
    let secret = cfg::cluster_secret(&config)?;
    let shared = Arc::new(JmShared {
        secret,
        catalog,
        state: Mutex::new(JmState {
            tms: BTreeMap::new(),
            tm_order: Vec::new(),
            jobs: BTreeMap::new(),
            job_order: Vec::new(),
        }),
        wake: tokio::sync::Notify::new(),
        job_ended: tokio::sync::Notify::new(),
        heartbeat_interval: config.get(&cfg::HEARTBEAT_INTERVAL)?,
        heartbeat_timeout: config.get(&cfg::HEARTBEAT_TIMEOUT)?,
        slot_timeout: config.get(&cfg::SLOT_REQUEST_TIMEOUT)?,
        restart_attempts: match config
            .get(&cfg::RESTART_STRATEGY)?
            .to_ascii_lowercase()
            .as_str()
        {
            "none" | "disable" | "off" => 0,
            "fixed-delay" | "fixeddelay" => config.get(&cfg::RESTART_ATTEMPTS)?,
            other => {
                return Err(FluviaError::Config(format!(
                    "unknown {} '{other}': expected none or fixed-delay",
                    cfg::RESTART_STRATEGY.key
                )));
            }
        },
        restart_delay: config.get(&cfg::RESTART_DELAY)?,
    });
    let host = config.get(&cfg::JOBMANAGER_ADDRESS)?;
    let rpc_listener =
        tokio::net::TcpListener::bind(format!("{host}:{}", config.get(&cfg::JOBMANAGER_PORT)?))
            .await
            .map_err(|e| {
                FluviaError::io(format!("binding the JobManager RPC port on {host}"), e)
            })?;
    let rpc_address = rpc_listener
        .local_addr()
        .map_err(|e| FluviaError::io("reading the RPC port", e))?;
    let rest_host = config.get(&cfg::REST_ADDRESS)?;
    let rest_listener =
        tokio::net::TcpListener::bind(format!("{rest_host}:{}", config.get(&cfg::REST_PORT)?))
            .await
            .map_err(|e| FluviaError::io(format!("binding the REST port on {rest_host}"), e))?;
    let rest_address = rest_listener
        .local_addr()
        .map_err(|e| FluviaError::io("reading the REST port", e))?;
    let service = JobManagerServer::new(JmService {
        shared: Arc::clone(&shared),
    });
    let rpc = tokio::spawn(async move {
        let incoming =
            tonic::transport::server::TcpIncoming::from(rpc_listener).with_nodelay(Some(true));
        if let Err(e) = Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await
        {
            tracing::error!("JobManager RPC server stopped: {e}");
        }
    });
    let rest = tokio::spawn(crate::rest::serve(rest_listener, Arc::clone(&shared)));
    let scheduler = tokio::spawn(Arc::clone(&shared).scheduler_loop());
    tracing::info!("JobManager: RPC {rpc_address}, REST http://{rest_address}");
    Ok(JobManagerHandle {
        rpc_address,
        rest_address,
        tasks: vec![scheduler, rest, rpc],
    })
}

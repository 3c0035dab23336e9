//! The JobManager process: a thin shell around the scheduler.
//!
//! Every decision (slots, deployment order, failover, lost results,
//! descriptors) is the [`Scheduler`]'s, a state machine in
//! `fluvia-scheduler`. This module only feeds it events (gRPC calls from
//! clients and TaskManagers, answers to its own RPCs, clock ticks) and
//! performs the actions it returns. Each TaskManager has its own queue and
//! worker for the RPCs sent to it, so a slow or stuck TaskManager delays only
//! its own calls; calls to one TaskManager keep their order (a job's release
//! never overtakes its deployments).
//!
//! The JobManager is generic: it takes a job's JobGraph as data from the
//! client and places its tasks only on TaskManagers whose program
//! fingerprint is the job's. It carries no program itself.

use crate::RpcResult;
use crate::config as cfg;
use crate::deployment::{
    JobInformation, attempt_id, attempt_ref, metrics_from_proto, metrics_to_proto,
    partition_to_proto, state_from_proto,
};
use crate::program::ProgramSpec;
use crate::query::{ClusterQuery, ClusterView, JobMeta, TaskManagerStatus};
use crate::rpc::job_manager_server::{JobManager, JobManagerServer};
use crate::rpc::shuffle_service_client::ShuffleServiceClient;
use crate::rpc::task_manager_client::TaskManagerClient;
use crate::rpc::{
    Ack, Empty, HeartbeatResponse, JobList, JobRequest, JobStatus, RegisterShuffleServiceRequest,
    RegisterTaskManagerRequest, RegisterTaskManagerResponse, ReleasePartitionsRequest,
    ShuffleServiceHeartbeatRequest, SubmitJobRequest, SubmitJobResponse, SubtaskResult,
    TaskDeployment, TaskDeployments, TaskManagerHeartbeat, TaskStateUpdate, TaskStateUpdates,
};
use crate::security;
use fluvia_core::{Configuration, FluviaError, JobId, Result};
use fluvia_graph::JobGraph;
pub use fluvia_scheduler::JobState;
use fluvia_scheduler::checkpoint::TerminalJobStatus;
use fluvia_scheduler::{
    Action, Event, ExecutionAttemptId, ExecutionState, Job, Scheduler, SchedulerConfig,
    ShuffleServiceSpec, ShuffleServiceType, TaskDeploymentDescriptor, TaskManagerSpec,
};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

/// Largest gRPC message (deployments of big SQL plans, collected results).
pub const MAX_MESSAGE_SIZE: usize = 512 * 1024 * 1024;

/// How long a probed TaskManager has to answer before it counts as lost
/// (the ping may wait behind that TaskManager's earlier calls; a dead
/// process is usually refused at once).
const PING_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a TaskManager may take to deploy one call's tasks: each may
/// wait for network buffers up to
/// `taskmanager.network.memory.exclusive-buffers-request-timeout-ms`.
const DEPLOY_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a TaskManager may take to rename a job's output files.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(120);

/// A deployment as it is shipped: the scheduler's descriptor and the
/// job's information.
type Shipment = (Box<TaskDeploymentDescriptor>, JobInformation);

/// An RPC to one TaskManager.
enum TmCall {
    /// Deployments in the order the scheduler queued them.
    Deploy(Vec<Shipment>),
    Cancel(crate::rpc::AttemptRef),
    ReleasePartitions(ReleasePartitionsRequest),
    ReleaseJob(String),
    CommitFiles(fluvia_core::JobId, crate::rpc::CommitFilesRequest),
    Ping,
    OperatorEvent(crate::rpc::OperatorEventRequest),
    TriggerCheckpoint(crate::rpc::TriggerCheckpointRequest),
    NotifyCheckpoint(crate::rpc::NotifyCheckpointRequest),
}

/// What the shell keeps of a registered TaskManager beside the scheduler's
/// [`TaskManagerSpec`] (slots, fingerprint, data address).
pub(crate) struct TmEntry {
    pub status: TaskManagerStatus,
    queue: mpsc::UnboundedSender<TmCall>,
}

pub(crate) struct JmState {
    pub scheduler: Scheduler,
    pub tms: BTreeMap<String, TmEntry>,
    /// RPC address of every TaskManager ever registered (lost ones too), for
    /// the job details.
    pub tm_addresses: BTreeMap<String, String>,
    pub jobs: BTreeMap<JobId, JobMeta>,
    /// RPC clients of the registered shuffle services.
    pub shuffle_services: BTreeMap<String, ShuffleServiceClient<Channel>>,
    /// The operator coordinators of the running jobs.
    pub(crate) coordinators: crate::coordinators::JobCoordinators,
    /// The checkpoint coordinators of the streaming jobs.
    pub(crate) checkpoints: crate::checkpointing::Checkpointing,
}

pub(crate) struct JmShared {
    pub secret: Option<String>,
    pub state: Mutex<JmState>,
    /// Signalled when a job reaches a final state (long-polling clients).
    job_ended: tokio::sync::Notify,
    heartbeat_interval: Duration,
    /// `web.refresh-interval`, for the Web UI (`GET /config`).
    pub web_refresh_interval: Duration,
    /// Where the REST API listens (told to clients that submit jobs).
    rest_address: Mutex<String>,
    origin: Instant,
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Queues `call` for TaskManager `tm` (dropped if it is gone).
fn queue(st: &JmState, tm: &str, call: TmCall) {
    if let Some(t) = st.tms.get(tm) {
        let _ = t.queue.send(call);
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl JmShared {
    fn state(&self) -> std::sync::MutexGuard<'_, JmState> {
        lock(&self.state)
    }

    fn clock(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Feeds one event and performs the actions it leads to.
    fn feed(self: &Arc<Self>, st: &mut JmState, event: Event) -> Result<()> {
        let outcome = st.scheduler.handle(self.clock(), event);
        self.dispatch(st);
        outcome
    }

    fn feed_now(self: &Arc<Self>, event: Event) -> Result<()> {
        let mut st = self.state();
        self.feed(&mut st, event)
    }

    /// Hands the scheduler's actions to the TaskManagers' queues.
    fn dispatch(self: &Arc<Self>, st: &mut JmState) {
        let mut undeliverable = Vec::new();
        let mut commits_failed = Vec::new();
        let mut checkpoint_calls = Vec::new();
        // A TaskManager's deployments of one step go out as one call (a
        // region's consumers behind their producers), sent before any
        // other call to it that the step queued after them.
        let mut deploys: BTreeMap<String, Vec<Shipment>> = BTreeMap::new();
        let send = |st: &JmState, tm: &str, call: TmCall| {
            if let Some(t) = st.tms.get(tm) {
                let _ = t.queue.send(call);
            }
        };
        while let Some(action) = st.scheduler.poll_action() {
            let (tm, call) = match action {
                Action::Deploy(mut d) => {
                    let tm = d.task_manager.clone();
                    st.checkpoints.deployed(&mut d, &tm);
                    if let Some(meta) = st.jobs.get(&d.attempt.job) {
                        st.coordinators
                            .deployed(&meta.graph, &d.attempt, &tm, d.parallelism);
                        if meta.graph.job_type == fluvia_graph::JobType::Streaming
                            && let Err(e) = st.coordinators.restore_for_deployment(
                                &meta.graph,
                                &d.attempt,
                                d.restore.as_ref(),
                            )
                        {
                            tracing::error!("restoring the coordinators of {}: {e}", d.attempt);
                        }
                    }
                    match self.job_information(st, d.attempt.job) {
                        Some(job) if st.tms.contains_key(&tm) => {
                            deploys.entry(tm).or_default().push((d, job));
                        }
                        _ => undeliverable.push(d.attempt),
                    }
                    continue;
                }
                Action::CancelAttempt {
                    task_manager,
                    attempt,
                } => (task_manager, TmCall::Cancel(attempt_ref(&attempt))),
                Action::ReleasePartitions {
                    task_manager,
                    job,
                    partitions,
                } => (
                    task_manager,
                    TmCall::ReleasePartitions(ReleasePartitionsRequest {
                        job_id: job.to_string(),
                        partitions: partitions.iter().map(partition_to_proto).collect(),
                    }),
                ),
                Action::ReleaseJob { task_manager, job } => {
                    (task_manager, TmCall::ReleaseJob(job.to_string()))
                }
                Action::Probe { task_manager } => (task_manager, TmCall::Ping),
                Action::ProbeShuffleService { service } => {
                    if let Some(c) = st.shuffle_services.get(&service) {
                        self.probe_shuffle_service(service, c.clone());
                    }
                    continue;
                }
                Action::CommitFiles {
                    task_manager,
                    job,
                    attempts,
                } => {
                    if !st.tms.contains_key(&task_manager) {
                        commits_failed.push((job, task_manager));
                        continue;
                    }
                    let req = crate::rpc::CommitFilesRequest {
                        job_id: job.to_string(),
                        attempts: attempts.iter().map(attempt_ref).collect(),
                    };
                    (task_manager, TmCall::CommitFiles(job, req))
                }
                Action::ReleaseShufflePartitions {
                    service,
                    job,
                    partitions,
                } => {
                    let req = ReleasePartitionsRequest {
                        job_id: job.to_string(),
                        partitions: partitions.iter().map(partition_to_proto).collect(),
                    };
                    if let Some(c) = st.shuffle_services.get(&service) {
                        let (mut c, req) = (c.clone(), security::authorize(req, &self.secret));
                        tokio::spawn(async move {
                            let _ = tokio::time::timeout(
                                Duration::from_secs(5),
                                c.release_partitions(req),
                            )
                            .await;
                        });
                    }
                    continue;
                }
                Action::ReleaseShuffleJob { service, job } => {
                    let req = JobRequest {
                        job_id: job.to_string(),
                        ..Default::default()
                    };
                    if let Some(c) = st.shuffle_services.get(&service) {
                        let (mut c, req) = (c.clone(), security::authorize(req, &self.secret));
                        tokio::spawn(async move {
                            let _ =
                                tokio::time::timeout(Duration::from_secs(5), c.release_job(req))
                                    .await;
                        });
                    }
                    continue;
                }
                Action::JobEnded { job, state } => {
                    st.coordinators.job_ended(job);
                    let status = match state {
                        JobState::Finished => TerminalJobStatus::Finished,
                        JobState::Canceled => TerminalJobStatus::Cancelled,
                        _ => TerminalJobStatus::Failed,
                    };
                    let calls = st.checkpoints.job_ended(&mut st.coordinators, job, status);
                    checkpoint_calls.extend(calls);
                    if let Some(meta) = st.jobs.get_mut(&job) {
                        meta.end_time = Some(now_millis());
                        tracing::info!("job {} ({}) {}", meta.id, meta.graph.name, state.name());
                    }
                    self.job_ended.notify_waiters();
                    continue;
                }
            };
            if let Some(batch) = deploys.remove(&tm) {
                send(st, &tm, TmCall::Deploy(batch));
            }
            send(st, &tm, call);
        }
        for (tm, batch) in deploys {
            send(st, &tm, TmCall::Deploy(batch));
        }
        self.send_checkpoint_calls(st, checkpoint_calls);
        // TaskManagers the scheduler declared lost: stop their workers.
        st.tms.retain(|id, _| st.scheduler.is_registered(id));
        for attempt in undeliverable {
            let reason = "the JobManager has no connection to that TaskManager".into();
            let _ = self.feed(st, Event::DeployFailed { attempt, reason });
        }
        for (job, task_manager) in commits_failed {
            let failure = Some("the JobManager has no connection to that TaskManager".into());
            let _ = self.feed(
                st,
                Event::FilesCommitted {
                    job,
                    task_manager,
                    failure,
                },
            );
        }
    }

    /// Queues what checkpointing asks of the TaskManagers; a job whose
    /// checkpoints failed beyond the tolerable count fails over.
    fn send_checkpoint_calls(
        self: &Arc<Self>,
        st: &mut JmState,
        calls: Vec<crate::checkpointing::CheckpointCall>,
    ) {
        use crate::checkpointing::CheckpointCall;
        for call in calls {
            match call {
                CheckpointCall::Trigger {
                    task_manager,
                    request,
                } => queue(st, &task_manager, TmCall::TriggerCheckpoint(request)),
                CheckpointCall::Notify {
                    task_manager,
                    request,
                } => queue(st, &task_manager, TmCall::NotifyCheckpoint(request)),
                CheckpointCall::FailJob { attempt, reason } => {
                    tracing::warn!("job {} fails over: {reason}", attempt.job);
                    let _ = self.feed(
                        st,
                        Event::AttemptState {
                            attempt,
                            state: ExecutionState::Failed,
                            failure: Some(reason),
                            metrics: None,
                        },
                    );
                }
            }
        }
    }

    fn job_information(&self, st: &JmState, job: JobId) -> Option<JobInformation> {
        let meta = st.jobs.get(&job)?;
        Some(JobInformation {
            program: meta.program.clone(),
            job_fingerprint: meta.graph.fingerprint.clone(),
            config: meta.graph.config.clone(),
            program_in_call: false,
        })
    }

    /// Pings a shuffle service the scheduler wants probed and feeds back
    /// whether it answered.
    fn probe_shuffle_service(
        self: &Arc<Self>,
        service: String,
        mut client: ShuffleServiceClient<Channel>,
    ) {
        let shared = Arc::clone(self);
        tokio::spawn(async move {
            let req = security::authorize(Empty {}, &shared.secret);
            let alive = matches!(
                tokio::time::timeout(PING_TIMEOUT, client.ping(req)).await,
                Ok(Ok(_))
            );
            let _ = shared.feed_now(Event::ShuffleServiceProbeAnswered { service, alive });
        });
    }

    /// The worker that performs one TaskManager's calls, in order.
    fn spawn_worker(
        self: &Arc<Self>,
        tm: String,
        client: TaskManagerClient<Channel>,
    ) -> mpsc::UnboundedSender<TmCall> {
        let (tx, mut rx) = mpsc::unbounded_channel::<TmCall>();
        let shared = Arc::clone(self);
        tokio::spawn(async move {
            // A call taken from the queue while gathering deployments.
            let mut held: Option<TmCall> = None;
            loop {
                let call = match held.take() {
                    Some(c) => c,
                    None => match rx.recv().await {
                        Some(c) => c,
                        None => break,
                    },
                };
                let mut client = client.clone();
                let secret = &shared.secret;
                // Calls the TaskManager's RPC `$method` with `$req`, waiting
                // at most 5 s: the error it answered with, if any.
                macro_rules! tm_rpc {
                    ($method:ident, $req:expr) => {
                        match tokio::time::timeout(
                            Duration::from_secs(5),
                            client.$method(security::authorize($req, secret)),
                        )
                        .await
                        {
                            Ok(Err(status)) => Some(status),
                            _ => None,
                        }
                    };
                }
                match call {
                    TmCall::Deploy(mut batch) => {
                        // The deployments queued behind these go in the
                        // same call, in order: one round trip per wave.
                        loop {
                            match rx.try_recv() {
                                Ok(TmCall::Deploy(more)) => batch.extend(more),
                                Ok(other) => {
                                    held = Some(other);
                                    break;
                                }
                                Err(_) => break,
                            }
                        }
                        for (attempt, failure) in
                            deploy_batch(&mut client, secret, &tm, batch).await
                        {
                            let event = match failure {
                                None => Event::DeployAcknowledged { attempt },
                                Some(reason) => Event::DeployFailed { attempt, reason },
                            };
                            let _ = shared.feed_now(event);
                        }
                    }
                    TmCall::Cancel(a) => {
                        let _ = tm_rpc!(cancel_task, a);
                    }
                    TmCall::ReleasePartitions(r) => {
                        let _ = tm_rpc!(release_partitions, r);
                    }
                    TmCall::ReleaseJob(job) => {
                        let req = JobRequest {
                            job_id: job,
                            ..Default::default()
                        };
                        let _ = tm_rpc!(release_job, req);
                    }
                    TmCall::CommitFiles(job, r) => {
                        // Renames may take a while on a slow disk: the
                        // other calls of this queue do not wait for them.
                        let req = security::authorize(r, secret);
                        let (shared, tm) = (Arc::clone(&shared), tm.clone());
                        tokio::spawn(async move {
                            let failure = match tokio::time::timeout(
                                COMMIT_TIMEOUT,
                                client.commit_files(req),
                            )
                            .await
                            {
                                Ok(Ok(ack)) if ack.get_ref().ok => None,
                                Ok(Ok(ack)) => Some(ack.into_inner().message),
                                Ok(Err(status)) => Some(status.message().to_string()),
                                Err(_) => {
                                    Some(format!("no answer in {} s", COMMIT_TIMEOUT.as_secs()))
                                }
                            };
                            let _ = shared.feed_now(Event::FilesCommitted {
                                job,
                                task_manager: tm,
                                failure,
                            });
                        });
                    }
                    TmCall::OperatorEvent(e) => {
                        if let Some(status) = tm_rpc!(send_operator_event, e) {
                            tracing::debug!("operator event to {tm}: {}", status.message());
                        }
                    }
                    TmCall::TriggerCheckpoint(r) => {
                        if let Some(status) = tm_rpc!(trigger_checkpoint, r) {
                            tracing::debug!(
                                "triggering a checkpoint on {tm}: {}",
                                status.message()
                            );
                        }
                    }
                    TmCall::NotifyCheckpoint(r) => {
                        if let Some(status) = tm_rpc!(notify_checkpoint, r) {
                            tracing::debug!("notifying a checkpoint on {tm}: {}", status.message());
                        }
                    }
                    TmCall::Ping => {
                        let req = security::authorize(Empty {}, secret);
                        let alive = matches!(
                            tokio::time::timeout(PING_TIMEOUT, client.ping(req)).await,
                            Ok(Ok(_))
                        );
                        let _ = shared.feed_now(Event::ProbeAnswered {
                            task_manager: tm.clone(),
                            alive,
                        });
                    }
                }
            }
        });
        tx
    }

    /// Drives the scheduler's timers (heartbeat timeouts, restart delays,
    /// slot timeouts).
    async fn timer_loop(self: Arc<Self>) {
        loop {
            let wait = {
                let st = self.state();
                let now = self.clock();
                st.scheduler
                    .poll_timeout()
                    .map(|t| t.saturating_sub(now))
                    .unwrap_or(Duration::from_millis(100))
                    .clamp(Duration::from_millis(2), Duration::from_millis(100))
            };
            tokio::time::sleep(wait).await;
            let _ = self.feed_now(Event::Tick);
            let mut st = self.state();
            let st = &mut *st;
            let calls = st.checkpoints.tick(&mut st.coordinators);
            self.send_checkpoint_calls(st, calls);
        }
    }

    /// JSON details of a job, as `GET /jobs/:id` and `fluvia run` show them.
    pub(crate) fn job_details(&self, st: &JmState, meta: &JobMeta, job: &Job) -> serde_json::Value {
        let view = self.cluster_view(st);
        crate::details::View::new(&view, meta, job).job_json()
    }

    /// What the REST API reads of the state, as of now.
    fn cluster_view<'a>(&self, st: &'a JmState) -> ClusterView<'a> {
        ClusterView {
            scheduler: &st.scheduler,
            task_managers: st
                .tms
                .iter()
                .map(|(id, t)| (id.as_str(), &t.status))
                .collect(),
            tm_addresses: &st.tm_addresses,
            jobs: &st.jobs,
            checkpoints: &st.checkpoints,
            now: now_millis(),
            clock: self.clock().as_millis() as u64,
        }
    }

    /// The job's status; with `details`, the JSON of every vertex too (a
    /// few milliseconds for a job of twenty tasks: only on request).
    fn status_of(&self, st: &JmState, meta: &JobMeta, job: &Job, details: bool) -> JobStatus {
        let mut results = Vec::new();
        if job.state == JobState::Finished {
            for (v, ejv) in job.eg.vertices.iter().enumerate() {
                for (i, s) in ejv.subtasks.iter().enumerate() {
                    if let Some(w) = s.winner() {
                        results.push(SubtaskResult {
                            vertex_index: v as u32,
                            subtask: i as u32,
                            attempt: w.attempt_number,
                            metrics: w.metrics.as_ref().map(metrics_to_proto),
                        });
                    }
                }
            }
        }
        JobStatus {
            job_id: meta.id.clone(),
            name: job.graph.name.clone(),
            state: job.state.name().into(),
            error: job.failure_cause.clone().unwrap_or_default(),
            details_json: if details {
                self.job_details(st, meta, job).to_string()
            } else {
                String::new()
            },
            results,
            checkpoints_json: st
                .checkpoints
                .summary(job.id)
                .and_then(|s| serde_json::to_string(&s).ok())
                .unwrap_or_default(),
        }
    }

    /// Submits a job (gRPC and tests); returns its id.
    pub(crate) fn submit(
        self: &Arc<Self>,
        program: ProgramSpec,
        graph: JobGraph,
        fingerprint: String,
    ) -> Result<String> {
        let id = graph.job_id;
        let graph = Arc::new(graph);
        let mut st = self.state();
        if st.jobs.contains_key(&id) {
            return Err(FluviaError::Plan(format!("job {id} was submitted already")));
        }
        // Before the scheduler deploys anything: deployments restore what
        // the job starts from.
        st.checkpoints.job_submitted(&graph)?;
        // Known before the scheduler sees it: its first deployments need it.
        st.jobs.insert(
            id,
            JobMeta {
                id: id.to_string(),
                program: program.clone(),
                graph: Arc::clone(&graph),
                start_time: now_millis(),
                end_time: None,
            },
        );
        let submitted = self.feed(
            &mut st,
            Event::SubmitJob {
                job: id,
                graph,
                program: program.name,
                fingerprint,
            },
        );
        if let Err(e) = submitted {
            st.jobs.remove(&id);
            return Err(e);
        }
        // The job ended at once (an empty cluster with no slot wait)?
        if st.scheduler.job(id).is_some_and(|j| j.state.is_terminal())
            && let Some(m) = st.jobs.get_mut(&id)
        {
            m.end_time.get_or_insert_with(now_millis);
        }
        Ok(id.to_string())
    }

    /// Triggers a savepoint of a running streaming job (and, with `stop`,
    /// ends its sources after it); returns the trigger id.
    pub(crate) fn trigger_savepoint(
        self: &Arc<Self>,
        job_id: &str,
        target: Option<String>,
        stop: bool,
        drain: bool,
    ) -> Result<String> {
        let id = JobId::try_from(job_id.to_string())
            .map_err(|_| FluviaError::Plan(format!("no job {job_id}")))?;
        let mut st = self.state();
        let st = &mut *st;
        let (request, calls) =
            st.checkpoints
                .trigger_savepoint(&mut st.coordinators, id, target, stop, drain)?;
        self.send_checkpoint_calls(st, calls);
        Ok(request)
    }

    /// Where savepoint request `request_id` of `job_id` stands.
    pub(crate) fn savepoint_status(
        &self,
        job_id: &str,
        request_id: &str,
    ) -> Option<crate::checkpointing::SavepointOutcome> {
        let id = JobId::try_from(job_id.to_string()).ok()?;
        self.state().checkpoints.savepoint(id, request_id).cloned()
    }

    pub(crate) fn cancel(self: &Arc<Self>, job_id: &str) -> Result<()> {
        let id = JobId::try_from(job_id.to_string())
            .map_err(|_| FluviaError::Plan(format!("no job {job_id}")))?;
        self.feed_now(Event::CancelJob { job: id })
    }

    /// The scheduler's events for a state report: the partitions it could
    /// not read (typed, so only their producers re-run), then its state.
    fn update_events(u: &TaskStateUpdate) -> Option<Vec<Event>> {
        let attempt = attempt_id(&crate::rpc::AttemptRef {
            job_id: u.job_id.clone(),
            vertex_index: u.vertex_index,
            subtask: u.subtask,
            attempt: u.attempt,
        })?;
        let state = state_from_proto(u.state).unwrap_or(ExecutionState::Failed);
        let mut events = Vec::new();
        let lost: Vec<_> = u
            .unreadable_partitions
            .iter()
            .filter_map(crate::deployment::partition_from_proto)
            .collect();
        if !lost.is_empty() {
            events.push(Event::PartitionsLost {
                job: attempt.job,
                partitions: lost,
                reason: u.error.clone(),
            });
        }
        events.push(Event::AttemptState {
            attempt,
            state,
            failure: (!u.error.is_empty()).then(|| u.error.clone()),
            metrics: u.metrics.as_ref().map(metrics_from_proto),
        });
        Some(events)
    }
}

/// The JobManager as the REST API may query it.
struct RestQuery(Arc<JmShared>);

impl ClusterQuery for RestQuery {
    fn read(&self, f: &mut dyn FnMut(&ClusterView<'_>)) {
        let st = self.0.state();
        f(&self.0.cluster_view(&st));
    }

    fn cancel_job(&self, job_id: &str) -> Result<()> {
        self.0.cancel(job_id)
    }

    fn trigger_savepoint(
        &self,
        job_id: &str,
        target: Option<String>,
        stop: bool,
        drain: bool,
    ) -> Result<String> {
        self.0.trigger_savepoint(job_id, target, stop, drain)
    }

    fn secret(&self) -> &Option<String> {
        &self.0.secret
    }

    fn web_refresh_interval(&self) -> Duration {
        self.0.web_refresh_interval
    }
}

struct JmService {
    shared: Arc<JmShared>,
}

impl JmService {
    /// Feeds attempts' state updates to the scheduler, in order, under one
    /// lock of the state.
    fn apply_updates(&self, updates: Vec<TaskStateUpdate>) -> Ack {
        let mut bad = Vec::new();
        let mut st = self.shared.state();
        for u in &updates {
            let Some(events) = JmShared::update_events(u) else {
                bad.push(u.job_id.clone());
                continue;
            };
            for e in events {
                if let Event::AttemptState {
                    attempt,
                    state: ExecutionState::Failed | ExecutionState::Canceled,
                    ..
                } = &e
                {
                    st.coordinators.attempt_failed(attempt);
                }
                if let Event::AttemptState {
                    attempt,
                    state,
                    failure,
                    ..
                } = &e
                {
                    let st = &mut *st;
                    let calls = st.checkpoints.attempt_state(
                        &mut st.coordinators,
                        attempt,
                        *state,
                        failure.as_deref(),
                    );
                    self.shared.send_checkpoint_calls(st, calls);
                }
                let _ = self.shared.feed(&mut st, e);
            }
        }
        drop(st);
        if bad.is_empty() {
            Ack::success()
        } else {
            Ack {
                ok: false,
                message: format!("bad job id '{}'", bad.join("', '")),
            }
        }
    }
}

impl JmService {
    /// Hands an operator's event to its coordinator and queues what the
    /// coordinator answers for the TaskManagers of the addressed attempts.
    fn operator_event(&self, e: crate::rpc::OperatorEventRequest) -> Result<()> {
        let attempt = attempt_id(&crate::rpc::AttemptRef {
            job_id: e.job_id.clone(),
            vertex_index: e.vertex_index,
            subtask: e.subtask,
            attempt: e.attempt,
        })
        .ok_or_else(|| FluviaError::Execution(format!("bad job id '{}'", e.job_id)))?;
        let mut st = self.shared.state();
        let graph = st
            .jobs
            .get(&attempt.job)
            .map(|m| Arc::clone(&m.graph))
            .ok_or_else(|| FluviaError::Execution(format!("no job {}", e.job_id)))?;
        let out = st.coordinators.handle_event(
            &graph,
            &e.job_id,
            &attempt,
            e.operator_index as usize,
            &e.event,
        )?;
        for (tm, req) in out {
            if let Some(t) = st.tms.get(&tm) {
                let _ = t.queue.send(TmCall::OperatorEvent(req));
            }
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl JobManager for JmService {
    async fn trigger_savepoint(
        &self,
        req: Request<crate::rpc::SavepointRequest>,
    ) -> RpcResult<crate::rpc::SavepointResponse> {
        let r = security::authorized(&self.shared.secret, req, "TriggerSavepoint")?;
        let target = (!r.target_directory.is_empty()).then_some(r.target_directory);
        let request_id = self
            .shared
            .trigger_savepoint(&r.job_id, target, r.stop, r.drain)
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        Ok(Response::new(crate::rpc::SavepointResponse { request_id }))
    }

    async fn get_savepoint(
        &self,
        req: Request<crate::rpc::SavepointStatusRequest>,
    ) -> RpcResult<crate::rpc::SavepointStatus> {
        let r = req.into_inner();
        use crate::checkpointing::SavepointOutcome;
        let status = match self.shared.savepoint_status(&r.job_id, &r.request_id) {
            None => {
                return Err(Status::not_found(format!(
                    "no savepoint request {}",
                    r.request_id
                )));
            }
            Some(SavepointOutcome::InProgress) => crate::rpc::SavepointStatus {
                completed: false,
                ..Default::default()
            },
            Some(SavepointOutcome::Completed { location }) => crate::rpc::SavepointStatus {
                completed: true,
                location,
                failure: String::new(),
            },
            Some(SavepointOutcome::Failed { reason }) => crate::rpc::SavepointStatus {
                completed: true,
                location: String::new(),
                failure: reason,
            },
        };
        Ok(Response::new(status))
    }

    async fn report_checkpoint(
        &self,
        req: Request<crate::rpc::CheckpointReport>,
    ) -> RpcResult<Ack> {
        let r = security::authorized(&self.shared.secret, req, "ReportCheckpoint")?;
        let mut st = self.shared.state();
        let st = &mut *st;
        let outcome = st
            .checkpoints
            .report(&mut st.coordinators, r.declined, &r.report_json)
            .map(|calls| self.shared.send_checkpoint_calls(st, calls))
            .map_err(|e| e.to_string());
        Ok(Response::new(Ack::from_result(outcome)))
    }

    async fn send_operator_event(
        &self,
        req: Request<crate::rpc::OperatorEventRequest>,
    ) -> RpcResult<Ack> {
        let msg = security::authorized(&self.shared.secret, req, "SendOperatorEvent")?;
        Ok(Response::new(Ack::from_result(
            self.operator_event(msg).map_err(|e| e.to_string()),
        )))
    }

    async fn register_task_manager(
        &self,
        req: Request<RegisterTaskManagerRequest>,
    ) -> RpcResult<RegisterTaskManagerResponse> {
        let r = security::authorized(&self.shared.secret, req, "RegisterTaskManager")?;
        let channel = registered_channel(&r.rpc_address)?;
        let client = TaskManagerClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE);
        tracing::info!(
            "TaskManager {} registered: {} slots, RPC {}, data {}, program fingerprint {}",
            r.task_manager_id,
            r.slots,
            r.rpc_address,
            r.data_address,
            r.program_fingerprint
        );
        let queue = self.shared.spawn_worker(r.task_manager_id.clone(), client);
        let mut st = self.shared.state();
        st.tm_addresses
            .insert(r.task_manager_id.clone(), r.rpc_address.clone());
        st.tms.insert(
            r.task_manager_id.clone(),
            TmEntry {
                status: TaskManagerStatus {
                    last_heartbeat: Instant::now(),
                    metrics_json: String::new(),
                },
                queue,
            },
        );
        let event = Event::RegisterTaskManager(TaskManagerSpec {
            id: r.task_manager_id,
            slots: r.slots as usize,
            fingerprint: r.program_fingerprint,
            data_address: r.data_address,
        });
        self.shared
            .feed(&mut st, event)
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(RegisterTaskManagerResponse {
            accepted: true,
            reason: String::new(),
            heartbeat_interval_ms: self.shared.heartbeat_interval.as_millis() as u64,
        }))
    }

    async fn heartbeat(&self, req: Request<TaskManagerHeartbeat>) -> RpcResult<HeartbeatResponse> {
        let hb = security::authorized(&self.shared.secret, req, "Heartbeat")?;
        let mut st = self.shared.state();
        if !st.scheduler.is_registered(&hb.task_manager_id) {
            return Ok(Response::new(HeartbeatResponse { known: false }));
        }
        if let Some(t) = st.tms.get_mut(&hb.task_manager_id) {
            t.status.last_heartbeat = Instant::now();
            t.status.metrics_json = hb.metrics_json;
        }
        for u in &hb.unacknowledged {
            for e in JmShared::update_events(u).unwrap_or_default() {
                let _ = self.shared.feed(&mut st, e);
            }
        }
        let running = hb.running.iter().filter_map(attempt_id).collect();
        let known = self
            .shared
            .feed(
                &mut st,
                Event::Heartbeat {
                    task_manager: hb.task_manager_id,
                    running,
                },
            )
            .is_ok();
        Ok(Response::new(HeartbeatResponse { known }))
    }

    async fn update_task_state(&self, req: Request<TaskStateUpdate>) -> RpcResult<Ack> {
        let msg = security::authorized(&self.shared.secret, req, "UpdateTaskState")?;
        Ok(Response::new(self.apply_updates(vec![msg])))
    }

    async fn update_task_states(&self, req: Request<TaskStateUpdates>) -> RpcResult<Ack> {
        let msg = security::authorized(&self.shared.secret, req, "UpdateTaskStates")?;
        Ok(Response::new(self.apply_updates(msg.updates)))
    }

    async fn register_shuffle_service(
        &self,
        req: Request<RegisterShuffleServiceRequest>,
    ) -> RpcResult<Ack> {
        let r = security::authorized(&self.shared.secret, req, "RegisterShuffleService")?;
        let channel = registered_channel(&r.rpc_address)?;
        tracing::info!(
            "shuffle service {} registered: host {}, data {}, RPC {}, directory {}",
            r.service_id,
            r.host,
            r.data_address,
            r.rpc_address,
            r.dir
        );
        let mut st = self.shared.state();
        st.shuffle_services
            .insert(r.service_id.clone(), ShuffleServiceClient::new(channel));
        let event = Event::RegisterShuffleService(ShuffleServiceSpec {
            id: r.service_id,
            host: r.host,
            data_address: r.data_address,
            dir: r.dir,
            rpc_address: r.rpc_address,
        });
        self.shared
            .feed(&mut st, event)
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(Ack::success()))
    }

    async fn shuffle_service_heartbeat(
        &self,
        req: Request<ShuffleServiceHeartbeatRequest>,
    ) -> RpcResult<HeartbeatResponse> {
        let msg = security::authorized(&self.shared.secret, req, "ShuffleServiceHeartbeat")?;
        let service = msg.service_id;
        let mut st = self.shared.state();
        let known = self
            .shared
            .feed(&mut st, Event::ShuffleServiceHeartbeat { service })
            .is_ok();
        Ok(Response::new(HeartbeatResponse { known }))
    }

    async fn submit_job(&self, req: Request<SubmitJobRequest>) -> RpcResult<SubmitJobResponse> {
        let r = security::authorized(&self.shared.secret, req, "SubmitJob")?;
        let program: ProgramSpec = serde_json::from_str(&r.program_json)
            .map_err(|e| Status::invalid_argument(format!("bad program: {e}")))?;
        let graph: JobGraph = serde_json::from_str(&r.job_graph_json)
            .map_err(|e| Status::invalid_argument(format!("bad job graph: {e}")))?;
        let id = self
            .shared
            .submit(program, graph, r.program_fingerprint)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let rest_address = lock(&self.shared.rest_address).clone();
        Ok(Response::new(SubmitJobResponse {
            job_id: id,
            rest_address,
        }))
    }

    async fn get_job(&self, req: Request<JobRequest>) -> RpcResult<JobStatus> {
        security::check_request(&self.shared.secret, &req, "GetJob")?;
        let req = req.into_inner();
        let id = JobId::try_from(req.job_id.clone())
            .map_err(|_| Status::not_found(format!("no job {}", req.job_id)))?;
        // With `wait_ms` the call returns as soon as the job has ended (or
        // the wait is over), so a client learns of the end without polling.
        let deadline = tokio::time::Instant::now() + Duration::from_millis(req.wait_ms);
        loop {
            let ended = self.shared.job_ended.notified();
            {
                let st = self.shared.state();
                let (Some(meta), Some(job)) = (st.jobs.get(&id), st.scheduler.job(id)) else {
                    return Err(Status::not_found(format!("no job {id}")));
                };
                if job.state.is_terminal() || tokio::time::Instant::now() >= deadline {
                    let details = !req.omit_details;
                    return Ok(Response::new(
                        self.shared.status_of(&st, meta, job, details),
                    ));
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
            .scheduler
            .jobs()
            .filter_map(|j| st.jobs.get(&j.id).map(|m| (m, j)))
            .map(|(m, j)| JobStatus {
                job_id: m.id.clone(),
                name: j.graph.name.clone(),
                state: j.state.name().into(),
                error: j.failure_cause.clone().unwrap_or_default(),
                details_json: String::new(),
                results: Vec::new(),
                checkpoints_json: String::new(),
            })
            .collect();
        Ok(Response::new(JobList { jobs }))
    }

    async fn cancel_job(&self, req: Request<JobRequest>) -> RpcResult<Ack> {
        security::check_request(&self.shared.secret, &req, "CancelJob")?;
        let id = req.into_inner().job_id;
        match self.shared.cancel(&id) {
            Ok(()) => Ok(Response::new(Ack::success())),
            Err(e) => Err(Status::failed_precondition(e.to_string())),
        }
    }
}

/// A running JobManager.
pub struct JobManagerHandle {
    pub rpc_address: SocketAddr,
    pub rest_address: SocketAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    shared: Arc<JmShared>,
}

impl JobManagerHandle {
    /// Waits until a server task ends (they run until the process stops).
    pub async fn wait(mut self) -> Result<()> {
        if let Some(t) = self.tasks.pop() {
            let _ = t.await;
        }
        Err(FluviaError::Execution("a JobManager server stopped".into()))
    }

    /// Stops the servers (embedded clusters).
    pub fn abort(&self) {
        for t in &self.tasks {
            t.abort();
        }
        // Dropping the queues ends the TaskManagers' workers.
        self.shared.state().tms.clear();
    }
}

/// The scheduler settings from Flink's keys.
pub fn scheduler_config(config: &Configuration) -> Result<SchedulerConfig> {
    Ok(SchedulerConfig {
        slot_request_timeout: config.get(&cfg::SLOT_REQUEST_TIMEOUT)?,
        restart_strategy: fluvia_scheduler::RestartStrategy::from_configuration(config)?,
        restart_attempts: 0,
        restart_delay: config.get(&fluvia_core::config::options::RESTART_DELAY)?,
        heartbeat_timeout: config.get(&cfg::HEARTBEAT_TIMEOUT)?,
        probe_timeout: PING_TIMEOUT * 2,
        shuffle_service_type: ShuffleServiceType::parse(config.get(&cfg::SHUFFLE_SERVICE_TYPE)?)?,
    })
}

/// Starts the JobManager's RPC server, REST API and scheduler.
pub async fn start(config: Configuration) -> Result<JobManagerHandle> {
    let secret = cfg::cluster_secret(&config)?;
    let shared = Arc::new(JmShared {
        secret,
        state: Mutex::new(JmState {
            scheduler: Scheduler::new(scheduler_config(&config)?),
            tms: BTreeMap::new(),
            tm_addresses: BTreeMap::new(),
            jobs: BTreeMap::new(),
            shuffle_services: BTreeMap::new(),
            coordinators: crate::coordinators::JobCoordinators::new(),
            checkpoints: Default::default(),
        }),
        job_ended: tokio::sync::Notify::new(),
        heartbeat_interval: config.get(&cfg::HEARTBEAT_INTERVAL)?,
        web_refresh_interval: config.get(&cfg::WEB_REFRESH_INTERVAL)?,
        rest_address: Mutex::new(String::new()),
        origin: Instant::now(),
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
    *lock(&shared.rest_address) = rest_address.to_string();
    let service = JobManagerServer::new(JmService {
        shared: Arc::clone(&shared),
    })
    .max_decoding_message_size(MAX_MESSAGE_SIZE)
    .max_encoding_message_size(MAX_MESSAGE_SIZE);
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
    let query: Arc<dyn ClusterQuery> = Arc::new(RestQuery(Arc::clone(&shared)));
    let rest = tokio::spawn(crate::rest::serve(rest_listener, query));
    let timer = tokio::spawn(Arc::clone(&shared).timer_loop());
    tracing::info!("JobManager: RPC {rpc_address}, REST http://{rest_address}");
    Ok(JobManagerHandle {
        rpc_address,
        rest_address,
        tasks: vec![timer, rest, rpc],
        shared,
    })
}

/// Sends deployments to one TaskManager in one call; per attempt, why it
/// failed (`None`: acknowledged).
async fn deploy_batch(
    client: &mut TaskManagerClient<Channel>,
    secret: &Option<String>,
    tm: &str,
    batch: Vec<Shipment>,
) -> Vec<(ExecutionAttemptId, Option<String>)> {
    let mut deployments = Vec::with_capacity(batch.len());
    let mut attempts = Vec::with_capacity(batch.len());
    let mut failed = Vec::new();
    let mut jobs_sent: Vec<JobId> = Vec::new();
    for (desc, mut job) in batch {
        let attempt = desc.attempt;
        if jobs_sent.contains(&attempt.job) {
            job.program.args.clear();
            job.program_in_call = true;
        } else {
            jobs_sent.push(attempt.job);
        }
        let encoded = serde_json::to_string(&desc).and_then(|descriptor_json| {
            Ok(TaskDeployment {
                descriptor_json,
                job_information_json: serde_json::to_string(&job)?,
                restore_handles: None,
                operator_events: Vec::new(),
            })
        });
        match encoded {
            Ok(deployment) => {
                deployments.push(deployment);
                attempts.push(attempt);
            }
            Err(e) => failed.push((attempt, Some(format!("encoding the deployment: {e}")))),
        }
    }
    if attempts.is_empty() {
        return failed;
    }
    let req = security::authorize(TaskDeployments { deployments }, secret);
    let reply = tokio::time::timeout(DEPLOY_TIMEOUT, client.deploy_tasks(req)).await;
    let n = attempts.len();
    let outcomes: Vec<Option<String>> = match reply {
        Ok(Ok(acks)) => {
            let acks = acks.into_inner().acks;
            if acks.len() == n {
                acks.into_iter()
                    .map(|a| (!a.ok).then_some(a.message))
                    .collect()
            } else {
                vec![
                    Some(format!(
                        "TaskManager {tm} answered {} of {n} deployments",
                        acks.len()
                    ));
                    n
                ]
            }
        }
        Ok(Err(status)) => vec![
            Some(format!(
                "TaskManager {tm} refused the deployment: {}",
                status.message()
            ));
            n
        ],
        Err(_) => vec![
            Some(format!(
                "TaskManager {tm} did not answer a deployment in {} s",
                DEPLOY_TIMEOUT.as_secs()
            ));
            n
        ],
    };
    failed.extend(attempts.into_iter().zip(outcomes));
    failed
}

/// A lazy channel to the RPC address a TaskManager or shuffle service
/// registered with; a malformed address is the caller's error.
fn registered_channel(address: &str) -> std::result::Result<Channel, Status> {
    crate::lazy_channel(address)
        .map_err(|e| Status::invalid_argument(format!("bad RPC address: {e}")))
}

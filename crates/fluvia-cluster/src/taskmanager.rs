//! The TaskManager process: registers its slots with the JobManager, sends
//! heartbeats, and runs the attempts it is given.
//!
//! A deployed attempt runs on its own thread with the runtime's task code.
//! Its output partitions are registered in this TaskManager's network
//! environment (so other TaskManagers can request them); inputs produced on
//! this TaskManager are read in place, the others over TCP. The attempt
//! reports RUNNING when its thread starts and its end (finished with typed
//! metrics, failed, cancelled) when it stops. A final report stays in the
//! heartbeat until the JobManager has taken it, and every heartbeat lists
//! the attempts running here, so a lost message cannot hang a job.

use crate::RpcResult;
use crate::config::{self as cfg};
use crate::deployment::{
    AttemptMetrics, ExecutionState, JobInformation, OutputDescriptor, StagedFile,
    TaskDeploymentDescriptor, metrics_to_proto, partition_from_proto, partition_id, state_to_proto,
};
use crate::program::{ProgramCatalog, ProgramSpec};
use crate::rpc::job_manager_client::JobManagerClient;
use crate::rpc::task_manager_server::{TaskManager, TaskManagerServer};
use crate::rpc::{
    Ack, Acks, AttemptRef, CommitFilesRequest, Empty, JobRequest, OperatorEventRequest,
    RegisterTaskManagerRequest, ReleasePartitionsRequest, TaskDeployment as TaskDeploymentMsg,
    TaskDeployments as TaskDeploymentsMsg, TaskManagerHeartbeat, TaskStateUpdate,
};
use crate::security;
use crate::shuffle::{
    ExternalShuffleEnvironment, InputChannels, InternalShuffleEnvironment, PartitionRequest,
    ShuffleEnvironment, create_input_channels,
};
use fluvia_core::config::options;
use fluvia_core::{ConfigOption, Configuration, FluviaError, Result};
use fluvia_graph::JobGraph;
use fluvia_network::CancelToken;
use fluvia_network::metrics::IoCounters;
use fluvia_network::net::environment::{NetworkConfig, NetworkEnvironment};
use fluvia_network::net::protocol::ResultPartitionId;
use fluvia_runtime::metrics::TaskMetricGroup;
use fluvia_runtime::task::{OutputSpec, TaskDeployment, discard_staged_file, run_task_attributed};
use fluvia_runtime::{MailboxSender, MetricRegistry, OperatorRegistry};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

/// (vertex, subtask, attempt) of a job.
type AttemptKey = (usize, usize, u32);

/// A job as this TaskManager runs it: its graph, user code and checkpointing.
type JobHere = (
    Arc<JobGraph>,
    Arc<OperatorRegistry>,
    Option<fluvia_runtime::checkpoint::TaskCheckpointing>,
);

struct TmJob {
    graph: Arc<JobGraph>,
    registry: Arc<OperatorRegistry>,
    /// Attempts running here.
    running: HashMap<AttemptKey, CancelToken>,
    /// Their mailboxes, for their coordinators' operator events and
    /// checkpoint mail.
    mailboxes: HashMap<AttemptKey, fluvia_runtime::MailboxSender>,
    /// How the job's tasks take part in checkpoints (streaming jobs).
    checkpointing: Option<fluvia_runtime::checkpoint::TaskCheckpointing>,
    partitions: Vec<ResultPartitionId>,
    spill_dir: Option<tempfile_dir::Dir>,
    /// Files finished attempts staged here, until the JobManager commits
    /// the winners' (the rest go when the job is released).
    staged: HashMap<AttemptKey, Vec<StagedFile>>,
}

/// A temporary directory removed on drop (blocking partitions spill here).
mod tempfile_dir {
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

struct Shared {
    id: String,
    secret: Option<String>,
    catalog: Arc<dyn ProgramCatalog>,
    env: Arc<NetworkEnvironment>,
    metrics: Arc<MetricRegistry>,
    jobmanager: JobManagerClient<Channel>,
    runtime: tokio::runtime::Handle,
    jobs: Mutex<HashMap<String, TmJob>>,
    /// Final reports the JobManager has not acknowledged (lock after `jobs`).
    unacknowledged: Mutex<HashMap<(String, AttemptKey), TaskStateUpdate>>,
    /// Final reports not yet sent: the reporter sends all there are in one
    /// call ([`report_finished`]).
    to_report: Mutex<Vec<((String, AttemptKey), TaskStateUpdate)>>,
    report_ready: tokio::sync::Notify,
    /// Jobs released here: a deployment of theirs still in flight is refused.
    released: Mutex<std::collections::HashSet<String>>,
    flush_epoch: Arc<AtomicU64>,
    stopped: AtomicBool,
    /// Work that may still write or remove a job's files: task threads
    /// (running, or cleaning up after cancellation), deployment calls
    /// (they start task threads) and job releases (they remove staged
    /// files).
    busy: Arc<BusyCount>,
    /// Where this TaskManager's jobs spill, one directory per job.
    workdir: crate::workdir::WorkDir,
    /// Operator events of this TaskManager's tasks for their coordinators,
    /// sent in order by one forwarder ([`forward_operator_events`]).
    operator_events: tokio::sync::mpsc::UnboundedSender<(OperatorEventRequest, MailboxSender)>,
    /// The tasks' checkpoint reports, sent in order by one forwarder
    /// ([`forward_checkpoint_reports`]).
    checkpoint_reports: tokio::sync::mpsc::UnboundedSender<crate::rpc::CheckpointReport>,
    internal_shuffle: InternalShuffleEnvironment,
    external_shuffle: ExternalShuffleEnvironment,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn job_for(&self, job_id: &str, desc: &JobInformation) -> Result<JobHere> {
        if let Some(j) = lock(&self.jobs).get(job_id) {
            return Ok((
                Arc::clone(&j.graph),
                Arc::clone(&j.registry),
                j.checkpointing.clone(),
            ));
        }
        let (mut graph, registry) = self.catalog.build(&desc.program)?;
        if graph.fingerprint != desc.job_fingerprint {
            return Err(FluviaError::Plan(format!(
                "program '{}' builds a different job graph on TaskManager {} (fingerprint {} \
                 instead of {}): the processes run different code",
                desc.program.name, self.id, graph.fingerprint, desc.job_fingerprint
            )));
        }
        graph.config = desc.config.clone();
        graph.object_reuse = desc.config.get(&options::OBJECT_REUSE)?;
        let (graph, registry) = (Arc::new(graph), Arc::new(registry));
        let checkpointing = self.checkpointing_for(job_id, &graph)?;
        if lock(&self.released).contains(job_id) {
            return Err(FluviaError::Execution(format!(
                "job {job_id} was released on this TaskManager"
            )));
        }
        // Two deployments may build the job at once: the first one's entry
        // stays.
        let mut jobs = lock(&self.jobs);
        if self.stopped.load(Ordering::SeqCst) {
            return Err(FluviaError::Execution(format!(
                "TaskManager {} is stopping: job {job_id} is not deployed",
                self.id
            )));
        }
        let job = jobs.entry(job_id.to_string()).or_insert_with(|| TmJob {
            graph: Arc::clone(&graph),
            registry: Arc::clone(&registry),
            running: HashMap::new(),
            mailboxes: HashMap::new(),
            checkpointing: checkpointing.clone(),
            partitions: Vec::new(),
            spill_dir: None,
            staged: HashMap::new(),
        });
        Ok((
            Arc::clone(&job.graph),
            Arc::clone(&job.registry),
            job.checkpointing.clone(),
        ))
    }

    /// A streaming job's tasks write their snapshots to the job's checkpoint
    /// storage and report to the JobManager; a batch job takes none.
    fn checkpointing_for(
        &self,
        job_id: &str,
        graph: &JobGraph,
    ) -> Result<Option<fluvia_runtime::checkpoint::TaskCheckpointing>> {
        if graph.job_type != fluvia_graph::JobType::Streaming {
            return Ok(None);
        }
        let dir = crate::checkpointing::checkpoint_directory(&graph.config)?;
        let storage = fluvia_state::CheckpointStorage::for_directory(&dir)
            .map_err(fluvia_runtime::checkpoint::state_error)?;
        Ok(Some(fluvia_runtime::checkpoint::TaskCheckpointing {
            responder: Arc::new(ReportResponder {
                job_id: job_id.to_string(),
                reports: self.checkpoint_reports.clone(),
            }),
            store: Arc::new(StorageSnapshots {
                storage,
                job_id: job_id.to_string(),
            }),
        }))
    }

    /// One deployment of a `DeployTasks` call. `programs` holds the program
    /// of each job from the call's first deployment of it; the later ones
    /// carry none and need one only if the job is not built here yet.
    fn deploy_in_call(
        self: &Arc<Self>,
        msg: &TaskDeploymentMsg,
        programs: &mut HashMap<String, ProgramSpec>,
    ) -> std::result::Result<(), String> {
        let desc: TaskDeploymentDescriptor = serde_json::from_str(&msg.descriptor_json)
            .map_err(|e| format!("bad deployment descriptor: {e}"))?;
        let mut job: JobInformation = serde_json::from_str(&msg.job_information_json)
            .map_err(|e| format!("bad job information: {e}"))?;
        let job_id = desc.attempt.job.to_string();
        if !job.program_in_call {
            programs.insert(job_id, job.program.clone());
        } else if !lock(&self.jobs).contains_key(&job_id) {
            job.program = programs.get(&job_id).cloned().ok_or_else(|| {
                format!(
                    "the deployment of job {job_id} refers to a program no earlier deployment \
                     of the call carries"
                )
            })?;
        }
        self.deploy(&job, desc).map_err(|e| e.to_string())
    }

    fn spill_dir(&self, job_id: &str) -> Result<std::path::PathBuf> {
        let mut jobs = lock(&self.jobs);
        let job = jobs
            .get_mut(job_id)
            .ok_or_else(|| FluviaError::Internal(format!("job {job_id} vanished")))?;
        if let Some(d) = &job.spill_dir {
            return Ok(d.0.clone());
        }
        let dir = self.workdir.path().join(job_id);
        std::fs::create_dir_all(&dir).map_err(|e| {
            FluviaError::io(format!("creating spill directory {}", dir.display()), e)
        })?;
        job.spill_dir = Some(tempfile_dir::Dir(dir.clone()));
        Ok(dir)
    }

    /// Creates the subtask's partitions and channels and starts its thread.
    fn deploy(
        self: &Arc<Self>,
        job: &JobInformation,
        desc: TaskDeploymentDescriptor,
    ) -> Result<()> {
        let job_id = desc.attempt.job.to_string();
        let (vertex_index, subtask, attempt) = (
            desc.attempt.vertex,
            desc.attempt.subtask,
            desc.attempt.attempt,
        );
        let (graph, registry, checkpointing) = self.job_for(&job_id, job)?;
        let vertex = graph.vertices.get(vertex_index).ok_or_else(|| {
            FluviaError::Internal(format!("job {job_id} has no vertex {vertex_index}"))
        })?;
        let mut outputs = Vec::new();
        let mut partition_ids = Vec::new();
        let mut produced = Vec::new();
        let mut spill_dir = || self.spill_dir(&job_id);
        for (i, o) in desc.outputs.iter().enumerate() {
            let name = format!(
                "{} ({}/{}) -> {i}",
                vertex.name,
                subtask + 1,
                desc.parallelism
            );
            let request = PartitionRequest {
                job_id: &job_id,
                id: ResultPartitionId {
                    data_set: o.data_set,
                    producer_subtask: subtask as u32,
                    attempt,
                },
                name,
                output: o,
            };
            let p = self
                .shuffle_for(o)
                .create_result_partition(request, &mut spill_dir)?;
            if p.served_here {
                partition_ids.push(p.id);
            }
            outputs.push(OutputSpec {
                partition: Arc::clone(&p.partition),
                pool: self.env.buffer_pool().create_local_pool(p.pool_size)?,
                partitioner: o.partitioner,
                consumer_max_parallelism: o.consumer_max_parallelism,
            });
            produced.push((o.shuffle_service.is_some(), p));
        }
        let InputChannels {
            inputs,
            watched,
            pools: input_pools,
        } = create_input_channels(&self.env, &self.id, &desc.inputs)?;
        let counters = Arc::new(IoCounters::default());
        let group = self.metrics.register(
            TaskMetricGroup::new(
                desc.attempt.job,
                vertex.name.clone(),
                subtask,
                Arc::clone(&counters),
                outputs.iter().map(|o| Arc::clone(&o.pool)).collect(),
                input_pools,
            )
            .for_attempt(vertex_index, attempt),
        );
        let cancel = CancelToken::new();
        let mailbox = fluvia_runtime::Mailbox::new();
        let coordinator_gateway = Some(self.coordinator_gateway(&job_id, &desc, mailbox.sender()));
        let deployment = TaskDeployment {
            job: Arc::clone(&graph),
            descriptor: desc,
            registry,
            inputs,
            outputs,
            cancel: cancel.clone(),
            flush_epoch: Arc::clone(&self.flush_epoch),
            counters,
            mailbox: mailbox.clone(),
            coordinator_gateway,
            checkpointing,
        };
        let key: AttemptKey = (vertex_index, subtask, attempt);
        {
            let mut jobs = lock(&self.jobs);
            // Checked under the lock `shutdown` drops the jobs under: a
            // deployment either is cancelled with its job or sees the stop.
            let job = match jobs.get_mut(&job_id) {
                Some(job) if !self.stopped.load(Ordering::SeqCst) => Some(job),
                _ => None,
            };
            let Some(job) = job else {
                // Released while this deployment was being built.
                drop(jobs);
                for p in &partition_ids {
                    self.env.partitions().release(p);
                }
                self.metrics.unregister(&group);
                return Err(FluviaError::Execution(format!(
                    "job {} was released on this TaskManager",
                    job_id
                )));
            };
            job.running.insert(key, cancel);
            job.mailboxes.insert(key, mailbox.sender());
            job.partitions.extend(partition_ids);
        }
        let shared = Arc::clone(self);
        let name = deployment.task_name();
        let job_id_of_spawn = job_id.clone();
        let update = |state: ExecutionState| TaskStateUpdate {
            job_id: job_id.clone(),
            vertex_index: vertex_index as u32,
            subtask: subtask as u32,
            attempt,
            state: state_to_proto(state).into(),
            error: String::new(),
            metrics: None,
            unreadable_partitions: Vec::new(),
        };
        let running = update(ExecutionState::Running);
        let mut last = update(ExecutionState::Finished);
        let alive = Busy::start(&self.busy);
        let spawned = crate::task_threads::shared().spawn(name.clone(), move || {
            let _alive = alive;
            tracing::info!("task {name} attempt {attempt} started");
            // RUNNING is a hint (the scheduler also learns it from
            // heartbeats, and takes FINISHED from a deploying attempt, as
            // Flink does for very fast tasks): sent without waiting, and
            // only for a task still running after RUNNING_HINT_DELAY.
            {
                let hint = Arc::clone(&shared);
                let job_id = job_id.clone();
                shared.runtime.spawn(async move {
                    tokio::time::sleep(RUNNING_HINT_DELAY).await;
                    let still = lock(&hint.jobs)
                        .get(&job_id)
                        .is_some_and(|j| j.running.contains_key(&key));
                    if still {
                        let mut client = hint.jobmanager.clone();
                        let req = security::authorize(running, &hint.secret);
                        let _ = client.update_task_state(req).await;
                    }
                });
            }
            let mut result = run_task_attributed(&deployment);
            if let Ok(m) = &result {
                // FINISHED only once consumers can read every partition
                // where they will look for it.
                for (external, p) in &produced {
                    let shuffle = shared.shuffle_for_kind(*external);
                    if let Err(e) = shuffle.partition_finished(&job_id, p) {
                        m.staged_files.iter().for_each(discard_staged_file);
                        result = Err(e);
                        break;
                    }
                }
            }
            drop(produced);
            let (state, error) = match &result {
                Ok(_) => (ExecutionState::Finished, String::new()),
                Err(FluviaError::Cancelled) => (ExecutionState::Canceled, String::new()),
                Err(e) => (ExecutionState::Failed, e.to_string()),
            };
            let (busy, idle, bp) = group.run_averages();
            let snapshot = group.snapshot();
            let mut metrics = match result {
                Ok(m) => m,
                Err(_) => AttemptMetrics {
                    records_in: snapshot.records_in,
                    records_out: snapshot.records_out,
                    bytes_in: snapshot.bytes_in,
                    bytes_out: snapshot.bytes_out,
                    ..Default::default()
                },
            };
            metrics.busy_ms_per_second = busy;
            metrics.idle_ms_per_second = idle;
            metrics.back_pressured_ms_per_second = bp;
            tracing::info!("task {name} attempt {attempt} {} {error}", state.name());
            // Its pools go with the task (the registry would keep them).
            shared.metrics.unregister(&group);
            if state == ExecutionState::Failed {
                last.unreadable_partitions = watched
                    .iter()
                    .filter(|(_, ch)| ch.failure().is_some())
                    .map(|(p, _)| crate::deployment::partition_to_proto(p))
                    .collect();
            }
            if !metrics.staged_files.is_empty() {
                shared.keep_staged(&job_id, key, &metrics.staged_files);
            }
            last.state = state_to_proto(state).into();
            last.error = error;
            last.metrics = Some(metrics_to_proto(&metrics));
            shared.finished(&job_id, key, last);
        });
        if let Err(e) = spawned {
            if let Some(job) = lock(&self.jobs).get_mut(&job_id_of_spawn) {
                job.running.remove(&key);
                job.mailboxes.remove(&key);
            }
            return Err(FluviaError::io("starting a task thread", e));
        }
        Ok(())
    }

    /// The environment that creates (and finishes) output `o`'s partition.
    fn shuffle_for(&self, o: &OutputDescriptor) -> &dyn ShuffleEnvironment {
        self.shuffle_for_kind(o.shuffle_service.is_some())
    }

    fn shuffle_for_kind(&self, external: bool) -> &dyn ShuffleEnvironment {
        if external {
            &self.external_shuffle
        } else {
            &self.internal_shuffle
        }
    }

    /// An attempt ended: its final report moves from "running" to
    /// "unacknowledged" in one step (a heartbeat sees it in one list or the
    /// other), then goes to the JobManager with the reports of the attempts
    /// that ended meanwhile ([`report_finished`]). The task's thread does not
    /// wait for it.
    fn finished(&self, job_id: &str, key: AttemptKey, update: TaskStateUpdate) {
        {
            let mut jobs = lock(&self.jobs);
            let mut pending = lock(&self.unacknowledged);
            if let Some(job) = jobs.get_mut(job_id) {
                job.running.remove(&key);
                job.mailboxes.remove(&key);
                pending.insert((job_id.to_string(), key), update.clone());
            }
        }
        lock(&self.to_report).push(((job_id.to_string(), key), update));
        self.report_ready.notify_one();
    }

    /// A finished attempt's staged files wait here for the JobManager's
    /// word; a job released meanwhile will not commit them.
    fn keep_staged(&self, job_id: &str, key: AttemptKey, files: &[StagedFile]) {
        match lock(&self.jobs).get_mut(job_id) {
            Some(job) => {
                job.staged.insert(key, files.to_vec());
            }
            None => files.iter().for_each(discard_staged_file),
        }
    }

    /// Renames the staged files of the job's winning attempts run here. A
    /// job released meanwhile (cancelled, failed) renames nothing more; on
    /// an error the files not renamed are removed.
    fn commit_files(&self, r: &CommitFilesRequest) -> std::result::Result<usize, String> {
        let files: Vec<StagedFile> = {
            let mut jobs = lock(&self.jobs);
            let job = jobs
                .get_mut(&r.job_id)
                .ok_or_else(|| format!("job {} is not known here", r.job_id))?;
            let keys: Vec<AttemptKey> = r
                .attempts
                .iter()
                .map(|a| (a.vertex_index as usize, a.subtask as usize, a.attempt))
                .collect();
            // All or nothing: a missing attempt leaves the others staged
            // (removed at release).
            if let Some(k) = keys.iter().find(|k| !job.staged.contains_key(k)) {
                return Err(format!(
                    "attempt {} of subtask {} of vertex {} staged no files here",
                    k.2, k.1, k.0
                ));
            }
            keys.iter()
                .filter_map(|k| job.staged.remove(k))
                .flatten()
                .collect()
        };
        for (n, f) in files.iter().enumerate() {
            let failure = if lock(&self.released).contains(&r.job_id) {
                Some(format!("job {} was released during the commit", r.job_id))
            } else {
                std::fs::rename(&f.pending, &f.target)
                    .err()
                    .map(|e| format!("renaming {} to {}: {e}", f.pending, f.target))
            };
            if let Some(failure) = failure {
                files[n..].iter().for_each(discard_staged_file);
                return Err(failure);
            }
        }
        Ok(files.len())
    }

    /// Where the operators of the attempt `desc` send their coordinator
    /// events: the forwarder, which tells the task if the JobManager cannot
    /// be reached (the task then fails, naming why, instead of waiting).
    fn coordinator_gateway(
        &self,
        job_id: &str,
        desc: &TaskDeploymentDescriptor,
        mailbox: MailboxSender,
    ) -> fluvia_runtime::CoordinatorGateway {
        let (tx, job_id) = (self.operator_events.clone(), job_id.to_string());
        let a = &desc.attempt;
        let (vertex, subtask, attempt) = (a.vertex, a.subtask, a.attempt);
        fluvia_runtime::CoordinatorGateway(Arc::new(move |operator, event| {
            let req = OperatorEventRequest {
                job_id: job_id.clone(),
                vertex_index: vertex as u32,
                subtask: subtask as u32,
                attempt,
                operator_index: operator as u32,
                event,
            };
            tx.send((req, mailbox.clone()))
                .map_err(|_| FluviaError::Execution("the TaskManager is shutting down".to_string()))
        }))
    }

    /// Puts checkpoint mail into an attempt's mailbox; an attempt that ended
    /// meanwhile is not an error (the coordinator learns it from its state).
    fn send_task_mail(&self, job_id: &str, key: AttemptKey, mail: fluvia_runtime::TaskMail) {
        let mailbox = lock(&self.jobs)
            .get(job_id)
            .and_then(|j| j.mailboxes.get(&key).cloned());
        match mailbox {
            Some(m) => {
                if let Err(e) = m.send(fluvia_runtime::Mail::task(mail)) {
                    tracing::debug!("checkpoint mail for {key:?}: {e}");
                }
            }
            None => tracing::debug!("checkpoint mail for {key:?} of job {job_id}, which ended"),
        }
    }

    /// Hands a coordinator's event to the attempt's mailbox; an attempt that
    /// ended is not an error (the event came too late).
    fn deliver_operator_event(&self, e: OperatorEventRequest) {
        let key = (e.vertex_index as usize, e.subtask as usize, e.attempt);
        let mailbox = lock(&self.jobs)
            .get(&e.job_id)
            .and_then(|j| j.mailboxes.get(&key).cloned());
        match mailbox {
            Some(m) => {
                if let Err(err) = m.send_operator_event(e.operator_index as usize, e.event) {
                    tracing::debug!("operator event for {key:?}: {err}");
                }
            }
            None => tracing::debug!(
                "operator event for {key:?} of job {}, which ended",
                e.job_id
            ),
        }
    }

    fn cancel_attempt(&self, a: &AttemptRef) {
        let key = (a.vertex_index as usize, a.subtask as usize, a.attempt);
        if let Some(c) = lock(&self.jobs)
            .get(&a.job_id)
            .and_then(|j| j.running.get(&key))
        {
            c.cancel();
        }
    }

    fn release_partitions(&self, r: &ReleasePartitionsRequest) {
        for p in &r.partitions {
            let Some(id) = partition_from_proto(p).map(partition_id) else {
                continue;
            };
            self.env.partitions().release(&id);
            if let Some(job) = lock(&self.jobs).get_mut(&r.job_id) {
                job.partitions.retain(|x| *x != id);
            }
        }
    }

    /// The JobManager says the job ended: drop it and refuse deployments of
    /// it still in flight.
    fn release_job(&self, job_id: &str) {
        lock(&self.released).insert(job_id.to_string());
        self.drop_job(job_id);
    }

    /// Cancels what of the job runs here and drops its partitions.
    fn drop_job(&self, job_id: &str) {
        // Counted before the job leaves the map: whoever finds it gone
        // (a stopping mini-cluster) still sees its files being removed.
        let _busy = Busy::start(&self.busy);
        let job = lock(&self.jobs).remove(job_id);
        if let Some(job) = job {
            for c in job.running.values() {
                c.cancel();
            }
            for p in &job.partitions {
                self.env.partitions().release(p);
            }
            // Losers' files and those of a job that did not finish.
            for f in job.staged.values().flatten() {
                discard_staged_file(f);
            }
            if let Ok(id) = fluvia_core::JobId::try_from(job_id.to_string()) {
                self.metrics.remove_job(id);
            }
        }
        lock(&self.unacknowledged).retain(|(j, _), _| j != job_id);
    }

    fn drop_all_jobs(&self) {
        let ids: Vec<String> = lock(&self.jobs).keys().cloned().collect();
        for j in ids {
            self.drop_job(&j);
        }
    }

    /// What the next heartbeat says: attempts running, reports pending.
    fn heartbeat_lists(&self) -> (Vec<AttemptRef>, Vec<TaskStateUpdate>) {
        let jobs = lock(&self.jobs);
        let pending = lock(&self.unacknowledged);
        let running = jobs
            .iter()
            .flat_map(|(id, j)| {
                j.running.keys().map(move |&(v, i, a)| AttemptRef {
                    job_id: id.clone(),
                    vertex_index: v as u32,
                    subtask: i as u32,
                    attempt: a,
                })
            })
            .collect();
        (running, pending.values().cloned().collect())
    }
}

/// Longest wait for an answer of the JobManager (a report, a heartbeat):
/// a hung call must not outlast the checks that notice a lost JobManager.
const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// Sends the attempts' final states to the JobManager: whatever ended
/// while the previous call was under way goes in the next one, so a job
/// whose tasks end together is told in a few calls, not one per task.
/// Reports that do not get through stay unacknowledged: the heartbeats
/// carry them.
async fn report_finished(shared: Arc<Shared>) {
    loop {
        shared.report_ready.notified().await;
        loop {
            let batch = std::mem::take(&mut *lock(&shared.to_report));
            if batch.is_empty() {
                break;
            }
            let (keys, updates): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
            if send_updates(&shared, updates).await {
                let mut pending = lock(&shared.unacknowledged);
                for k in &keys {
                    pending.remove(k);
                }
            }
        }
    }
}

/// One call with `updates`, tried three times; false if none got through.
async fn send_updates(shared: &Shared, updates: Vec<TaskStateUpdate>) -> bool {
    let batch = crate::rpc::TaskStateUpdates { updates };
    for attempt in 0..3 {
        let mut client = shared.jobmanager.clone();
        let req = security::authorize(batch.clone(), &shared.secret);
        let error = match tokio::time::timeout(RPC_TIMEOUT, client.update_task_states(req)).await {
            Ok(Ok(_)) => return true,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer in {} s", RPC_TIMEOUT.as_secs()),
        };
        if shared.stopped.load(Ordering::Acquire) {
            return false;
        }
        tracing::warn!("reporting task states to the JobManager failed: {error}");
        tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
    }
    false
}

/// How long a task runs before the JobManager is told it is RUNNING. A
/// small SQL statement's tasks mostly end sooner; their FINISHED then is the
/// one call, instead of two per task.
const RUNNING_HINT_DELAY: Duration = Duration::from_millis(10);

/// Sends the tasks' operator events to the JobManager, one at a time, in
/// the order the tasks sent them. An event the JobManager cannot take fails
/// its task with the reason (through the task's mailbox).
async fn forward_operator_events(
    mut jobmanager: JobManagerClient<Channel>,
    secret: Option<String>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<(OperatorEventRequest, MailboxSender)>,
) {
    while let Some((event, mailbox)) = rx.recv().await {
        let req = security::authorize(event, &secret);
        let failure =
            match tokio::time::timeout(RPC_TIMEOUT, jobmanager.send_operator_event(req)).await {
                Ok(Ok(ack)) if ack.get_ref().ok => None,
                Ok(Ok(ack)) => Some(ack.into_inner().message),
                Ok(Err(status)) => Some(status.message().to_string()),
                Err(_) => Some(format!("no answer in {} s", RPC_TIMEOUT.as_secs())),
            };
        if let Some(reason) = failure {
            let _ = mailbox.send(fluvia_runtime::Mail::new(
                "operator event refused",
                move |_| {
                    Err(FluviaError::Execution(format!(
                        "the JobManager did not take an operator event: {reason}"
                    )))
                },
            ));
        }
    }
}

/// Sends the tasks' checkpoint reports to the JobManager in order. A lost
/// report is not retried: the checkpoint expires (or the next one
/// completes) as Flink's does.
async fn forward_checkpoint_reports(
    mut jobmanager: JobManagerClient<Channel>,
    secret: Option<String>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<crate::rpc::CheckpointReport>,
) {
    while let Some(report) = rx.recv().await {
        let req = security::authorize(report, &secret);
        match tokio::time::timeout(RPC_TIMEOUT, jobmanager.report_checkpoint(req)).await {
            Ok(Ok(ack)) if ack.get_ref().ok => {}
            Ok(Ok(ack)) => tracing::warn!("checkpoint report refused: {}", ack.get_ref().message),
            Ok(Err(status)) => tracing::warn!("checkpoint report lost: {}", status.message()),
            Err(_) => tracing::warn!("checkpoint report not answered in time"),
        }
    }
}

/// A task's checkpoint reports, as JSON of the shared contract types.
struct ReportResponder {
    job_id: String,
    reports: tokio::sync::mpsc::UnboundedSender<crate::rpc::CheckpointReport>,
}

impl ReportResponder {
    fn send(&self, declined: bool, json: serde_json::Result<String>) {
        match json {
            Ok(report_json) => {
                let _ = self.reports.send(crate::rpc::CheckpointReport {
                    job_id: self.job_id.clone(),
                    declined,
                    report_json,
                });
            }
            Err(e) => tracing::warn!("encoding a checkpoint report: {e}"),
        }
    }
}

impl fluvia_runtime::checkpoint::CheckpointResponder for ReportResponder {
    fn acknowledge(&self, ack: fluvia_deployment::TaskCheckpointAck) {
        self.send(false, serde_json::to_string(&ack));
    }
    fn decline(&self, decline: fluvia_deployment::TaskCheckpointDecline) {
        self.send(true, serde_json::to_string(&decline));
    }
}

/// A job's snapshot files in its checkpoint storage.
struct StorageSnapshots {
    storage: fluvia_state::CheckpointStorage,
    job_id: String,
}

impl fluvia_runtime::checkpoint::SnapshotStore for StorageSnapshots {
    fn write(&self, checkpoint_id: u64, name: &str, bytes: Vec<u8>) -> Result<String> {
        let location = format!(
            "{}/{name}",
            fluvia_state::storage::checkpoint_dir(&self.job_id, checkpoint_id)
        );
        self.storage
            .put(&location, bytes)
            .map_err(fluvia_runtime::checkpoint::state_error)
    }
    fn read(&self, location: &str) -> Result<Vec<u8>> {
        self.storage
            .get(location)
            .map_err(fluvia_runtime::checkpoint::state_error)
    }
}

struct TmService {
    shared: Arc<Shared>,
}

#[tonic::async_trait]
impl TaskManager for TmService {
    async fn deploy_tasks(&self, req: Request<TaskDeploymentsMsg>) -> RpcResult<Acks> {
        let msg = security::authorized(&self.shared.secret, req, "DeployTasks")?;
        let shared = Arc::clone(&self.shared);
        let deployments = msg.deployments;
        // In order, on one blocking thread: a later task's local channels
        // find the partitions of the earlier ones registered.
        let acks = tokio::task::spawn_blocking(move || {
            // Counted until the task threads it starts are.
            let _deploying = Busy::start(&shared.busy);
            let mut programs = HashMap::new();
            deployments
                .iter()
                .map(|d| Ack::from_result(shared.deploy_in_call(d, &mut programs)))
                .collect()
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(Acks { acks }))
    }

    async fn send_operator_event(&self, req: Request<OperatorEventRequest>) -> RpcResult<Ack> {
        let msg = security::authorized(&self.shared.secret, req, "SendOperatorEvent")?;
        self.shared.deliver_operator_event(msg);
        Ok(Response::new(Ack::success()))
    }

    async fn trigger_checkpoint(
        &self,
        req: Request<crate::rpc::TriggerCheckpointRequest>,
    ) -> RpcResult<Ack> {
        let r = security::authorized(&self.shared.secret, req, "TriggerCheckpoint")?;
        let a = r.attempt.unwrap_or_default();
        let options = fluvia_network::CheckpointOptions {
            snapshot_type: if r.snapshot_type == 0 {
                fluvia_network::SnapshotType::Checkpoint
            } else {
                fluvia_network::SnapshotType::Savepoint
            },
            alignment: match r.alignment {
                1 => fluvia_network::AlignmentType::Unaligned,
                2 => fluvia_network::AlignmentType::ForcedAligned,
                3 => fluvia_network::AlignmentType::AtLeastOnce,
                _ => fluvia_network::AlignmentType::Aligned,
            },
        };
        let barrier = fluvia_network::CheckpointBarrier {
            id: r.checkpoint_id,
            timestamp: r.timestamp,
            options,
        };
        // 2: a stop-with-savepoint; the sources end after it.
        let mail = if r.snapshot_type == 2 {
            fluvia_runtime::TaskMail::TriggerSynchronousSavepoint(barrier)
        } else {
            fluvia_runtime::TaskMail::TriggerCheckpoint(barrier)
        };
        self.shared.send_task_mail(
            &a.job_id,
            (a.vertex_index as usize, a.subtask as usize, a.attempt),
            mail,
        );
        Ok(Response::new(Ack::success()))
    }

    async fn notify_checkpoint(
        &self,
        req: Request<crate::rpc::NotifyCheckpointRequest>,
    ) -> RpcResult<Ack> {
        let r = security::authorized(&self.shared.secret, req, "NotifyCheckpoint")?;
        for a in &r.attempts {
            self.shared.send_task_mail(
                &r.job_id,
                (a.vertex_index as usize, a.subtask as usize, a.attempt),
                fluvia_runtime::TaskMail::NotifyCheckpoint {
                    id: r.checkpoint_id,
                    complete: r.complete,
                },
            );
        }
        Ok(Response::new(Ack::success()))
    }

    async fn cancel_task(&self, req: Request<AttemptRef>) -> RpcResult<Ack> {
        let msg = security::authorized(&self.shared.secret, req, "CancelTask")?;
        self.shared.cancel_attempt(&msg);
        Ok(Response::new(Ack::success()))
    }

    async fn release_partitions(&self, req: Request<ReleasePartitionsRequest>) -> RpcResult<Ack> {
        let msg = security::authorized(&self.shared.secret, req, "ReleasePartitions")?;
        self.shared.release_partitions(&msg);
        Ok(Response::new(Ack::success()))
    }

    async fn release_job(&self, req: Request<JobRequest>) -> RpcResult<Ack> {
        let msg = security::authorized(&self.shared.secret, req, "ReleaseJob")?;
        self.shared.release_job(&msg.job_id);
        Ok(Response::new(Ack::success()))
    }

    async fn commit_files(&self, req: Request<CommitFilesRequest>) -> RpcResult<Ack> {
        let r = security::authorized(&self.shared.secret, req, "CommitFiles")?;
        let shared = Arc::clone(&self.shared);
        let outcome = tokio::task::spawn_blocking(move || shared.commit_files(&r))
            .await
            .map_err(|e| Status::internal(format!("committing files: {e}")))?;
        Ok(Response::new(Ack::from_result(outcome.map(|n| {
            tracing::info!("committed {n} output files");
        }))))
    }

    async fn ping(&self, req: Request<Empty>) -> RpcResult<Ack> {
        security::check_request(&self.shared.secret, &req, "Ping")?;
        Ok(Response::new(Ack {
            ok: true,
            message: self.shared.id.clone(),
        }))
    }
}

struct AbortOnDrop(Vec<tokio::task::AbortHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

/// A TaskManager started in this process (the embedded mini-cluster).
pub struct TaskManagerHandle {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<Result<()>>,
}

/// Work under way ([`Shared::busy`]), and a wake-up for whoever waits for
/// none: a stopping mini-cluster learns it at once instead of polling.
#[derive(Default)]
struct BusyCount {
    count: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
}

/// Counts work in [`Shared::busy`] until it ends (also if it panics; for a
/// task thread, also if it never started: the guard drops with the
/// closure).
struct Busy(Arc<BusyCount>);

impl Busy {
    fn start(busy: &Arc<BusyCount>) -> Self {
        // SeqCst with `stopped`: a stop either sees this count or is seen
        // by the work it counts.
        busy.count.fetch_add(1, Ordering::SeqCst);
        Busy(Arc::clone(busy))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl TaskManagerHandle {
    /// Task threads, deployments and job releases still under way: a
    /// cancelled task removes the files it staged (in-progress part files)
    /// before its thread ends, a released job the files its finished tasks
    /// staged.
    pub fn busy(&self) -> usize {
        self.shared.busy.count.load(Ordering::SeqCst)
    }

    /// Drops what of an ended job runs or is staged here, as the
    /// JobManager's release does (whichever comes second finds nothing):
    /// a kept mini-cluster does it before it tells the caller the job ended,
    /// since the JobManager's call may still be on its way.
    pub fn release_job(&self, job_id: &str) {
        self.shared.release_job(job_id);
    }

    /// Returns once nothing is [`busy`](Self::busy) (at once if nothing is).
    pub async fn idle(&self) {
        loop {
            // Registered before the count is read: a drop to zero in between
            // still wakes it.
            let idle = self.shared.busy.idle.notified();
            if self.busy() == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Cancels every attempt it runs, closes its network and stops it.
    pub fn shutdown(&self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.shared.drop_all_jobs();
        self.shared.env.shutdown();
        self.task.abort();
    }
}

/// Starts a TaskManager on the current async runtime (see [`run`]) and
/// returns once it listens.
pub async fn spawn(
    jobmanager: &str,
    config: Configuration,
    catalog: Arc<dyn ProgramCatalog>,
) -> Result<TaskManagerHandle> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let jobmanager = jobmanager.to_string();
    let task = tokio::spawn(async move { run_inner(&jobmanager, config, catalog, Some(tx)).await });
    match rx.await {
        Ok(shared) => Ok(TaskManagerHandle { shared, task }),
        Err(_) => Err(match task.await {
            Ok(Err(e)) => e,
            _ => FluviaError::Execution("the embedded TaskManager did not start".into()),
        }),
    }
}

/// [`spawn`] with owned arguments: a future another runtime can run (a
/// kept mini-cluster's own).
pub async fn spawn_owned(
    jobmanager: String,
    config: Configuration,
    catalog: Arc<dyn ProgramCatalog>,
) -> Result<TaskManagerHandle> {
    spawn(&jobmanager, config, catalog).await
}

/// Runs a TaskManager until the process is stopped. `jobmanager` is the
/// JobManager's RPC address (`host:port`).
/// The data plane settings from Flink's keys (TaskManagers and shuffle
/// services).
pub(crate) fn network_config(
    config: &Configuration,
    secret: &Option<String>,
) -> Result<NetworkConfig> {
    Ok(NetworkConfig {
        segment_size: config.get(&options::SEGMENT_SIZE)? as usize,
        total_memory: config.get(&options::NETWORK_MEMORY)?,
        buffers_per_channel: config.get(&options::BUFFERS_PER_CHANNEL)?.max(1),
        floating_buffers_per_gate: config.get(&options::FLOATING_BUFFERS)?,
        compression: config
            .get(&options::COMPRESSION_CODEC)?
            .eq_ignore_ascii_case("LZ4"),
        secret: secret.clone(),
        sort_shuffle_min_parallelism: config.get(&options::SORT_SHUFFLE_MIN_PARALLELISM)?,
        sort_shuffle_min_buffers: config.get(&options::SORT_SHUFFLE_MIN_BUFFERS)?.max(1),
        blocking_compression: config.get(&options::BLOCKING_SHUFFLE_COMPRESSION)?,
        batch_shuffle_read_memory: config.get(&options::BATCH_SHUFFLE_READ_MEMORY)?,
        buffer_request_timeout: std::time::Duration::from_millis(
            config.get(&options::BUFFER_REQUEST_TIMEOUT)?,
        ),
    })
}

/// The ports of a process that serves partitions (a TaskManager or a
/// shuffle service).
pub(crate) struct ServerPorts {
    /// The key of the host option, for errors.
    pub host_key: &'static str,
    pub data_port: &'static ConfigOption<usize>,
    pub rpc_port: &'static ConfigOption<usize>,
    /// Names the process in errors.
    pub what: &'static str,
}

/// Starts the data plane of a process that serves partitions at `host` and
/// binds its RPC port; returns them with the RPC address bound.
pub(crate) async fn bind_endpoints(
    config: &Configuration,
    secret: &Option<String>,
    host: &str,
    ports: &ServerPorts,
) -> Result<(Arc<NetworkEnvironment>, tokio::net::TcpListener, SocketAddr)> {
    let net = network_config(config, secret)?;
    let data_bind: SocketAddr = format!("{host}:{}", config.get(ports.data_port)?)
        .parse()
        .map_err(|e| FluviaError::Config(format!("bad {}: {e}", ports.host_key)))?;
    let env = NetworkEnvironment::start(net, data_bind)?;
    let listener = tokio::net::TcpListener::bind(format!("{host}:{}", config.get(ports.rpc_port)?))
        .await
        .map_err(|e| FluviaError::io(format!("binding the {} RPC port", ports.what), e))?;
    let rpc_address = listener
        .local_addr()
        .map_err(|e| FluviaError::io(format!("reading the {} RPC port", ports.what), e))?;
    Ok((env, listener, rpc_address))
}

/// A channel to the JobManager's RPC server at `jobmanager`.
pub(crate) fn jobmanager_channel(jobmanager: &str) -> Result<Channel> {
    crate::lazy_channel(jobmanager)
        .map_err(|e| FluviaError::Config(format!("bad JobManager address '{jobmanager}': {e}")))
}

pub async fn run(
    jobmanager: &str,
    config: Configuration,
    catalog: Arc<dyn ProgramCatalog>,
) -> Result<()> {
    run_inner(jobmanager, config, catalog, None).await
}

async fn run_inner(
    jobmanager: &str,
    config: Configuration,
    catalog: Arc<dyn ProgramCatalog>,
    started: Option<tokio::sync::oneshot::Sender<Arc<Shared>>>,
) -> Result<()> {
    let secret = cfg::cluster_secret(&config)?;
    let host = config.get(&cfg::TASKMANAGER_HOST)?.to_string();
    let slots = config.get(&cfg::SLOTS)?;
    if slots == 0 {
        return Err(FluviaError::Config(format!(
            "{} must be at least 1",
            cfg::SLOTS.key
        )));
    }
    let (env, listener, rpc_address) = bind_endpoints(
        &config,
        &secret,
        &host,
        &ServerPorts {
            host_key: cfg::TASKMANAGER_HOST.key,
            data_port: &cfg::TASKMANAGER_DATA_PORT,
            rpc_port: &cfg::TASKMANAGER_RPC_PORT,
            what: "TaskManager",
        },
    )
    .await?;
    let channel = jobmanager_channel(jobmanager)?;
    let id = format!("tm-{}-{}", rpc_address.port(), std::process::id());
    let interval = config.get(&cfg::HEARTBEAT_INTERVAL)?;
    // Below 50 ms the reports would only load the JobManager.
    let metrics_interval = config
        .get(&cfg::METRICS_UPDATE_INTERVAL)?
        .max(Duration::from_millis(50));
    let timeout = config.get(&cfg::HEARTBEAT_TIMEOUT)?;
    let (operator_events, operator_events_rx) = tokio::sync::mpsc::unbounded_channel();
    let (checkpoint_reports, checkpoint_reports_rx) = tokio::sync::mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        operator_events,
        checkpoint_reports,
        id: id.clone(),
        secret: secret.clone(),
        catalog: Arc::clone(&catalog),
        env: Arc::clone(&env),
        metrics: Arc::new(MetricRegistry::new()),
        jobmanager: JobManagerClient::new(channel)
            .max_decoding_message_size(crate::jobmanager::MAX_MESSAGE_SIZE)
            .max_encoding_message_size(crate::jobmanager::MAX_MESSAGE_SIZE),
        runtime: tokio::runtime::Handle::current(),
        jobs: Mutex::new(HashMap::new()),
        unacknowledged: Mutex::new(HashMap::new()),
        to_report: Mutex::new(Vec::new()),
        report_ready: tokio::sync::Notify::new(),
        released: Mutex::new(std::collections::HashSet::new()),
        flush_epoch: Arc::new(AtomicU64::new(0)),
        stopped: AtomicBool::new(false),
        busy: Arc::default(),
        workdir: crate::workdir::WorkDir::claim(&crate::workdir::tmp_base(&config)?, "tm", &id)?,
        internal_shuffle: InternalShuffleEnvironment::new(Arc::clone(&env)),
        external_shuffle: ExternalShuffleEnvironment::new(
            Arc::clone(&env),
            secret.clone(),
            tokio::runtime::Handle::current(),
            RPC_TIMEOUT,
        ),
    });
    let reporter = tokio::spawn(report_finished(Arc::clone(&shared)));
    let forwarder = tokio::spawn(forward_operator_events(
        shared.jobmanager.clone(),
        secret.clone(),
        operator_events_rx,
    ));
    let report_forwarder = tokio::spawn(forward_checkpoint_reports(
        shared.jobmanager.clone(),
        secret.clone(),
        checkpoint_reports_rx,
    ));
    let ticker = {
        let epoch = Arc::clone(&shared.flush_epoch);
        let every = config
            .get(&options::BUFFER_TIMEOUT)?
            .max(Duration::from_millis(1));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                epoch.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    if let Some(tx) = started {
        let _ = tx.send(Arc::clone(&shared));
    }
    let service = TaskManagerServer::new(TmService {
        shared: Arc::clone(&shared),
    })
    .max_decoding_message_size(crate::jobmanager::MAX_MESSAGE_SIZE)
    .max_encoding_message_size(crate::jobmanager::MAX_MESSAGE_SIZE);
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let server = tokio::spawn(
        Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming),
    );
    // The server and the ticker stop with this TaskManager (also when an
    // embedded one is shut down by aborting this future).
    let _stop = AbortOnDrop(vec![
        server.abort_handle(),
        ticker.abort_handle(),
        reporter.abort_handle(),
        forwarder.abort_handle(),
        report_forwarder.abort_handle(),
    ]);
    tracing::info!(
        "TaskManager {id}: {slots} slots, RPC {rpc_address}, data {}",
        env.data_address()
    );

    let register = RegisterTaskManagerRequest {
        task_manager_id: id.clone(),
        rpc_address: rpc_address.to_string(),
        data_address: env.data_address().to_string(),
        slots: slots as u32,
        program_fingerprint: catalog.fingerprint(),
    };
    let mut registered = false;
    let mut last_contact = Instant::now();
    let mut last_sent = Instant::now();
    loop {
        if server.is_finished() {
            return Err(FluviaError::Execution(
                "the TaskManager RPC server stopped".into(),
            ));
        }
        let mut client = shared.jobmanager.clone();
        if !registered {
            match client
                .register_task_manager(security::authorize(register.clone(), &secret))
                .await
            {
                Ok(r) => {
                    let r = r.into_inner();
                    if !r.accepted {
                        shared.stopped.store(true, Ordering::Release);
                        env.shutdown();
                        return Err(FluviaError::Config(format!(
                            "the JobManager at {jobmanager} refused this TaskManager: {}",
                            r.reason
                        )));
                    }
                    tracing::info!("registered at JobManager {jobmanager}");
                    registered = true;
                    last_contact = Instant::now();
                }
                Err(e) if e.code() == tonic::Code::Unauthenticated => {
                    env.shutdown();
                    return Err(FluviaError::Config(format!(
                        "the JobManager at {jobmanager} refused this TaskManager: {}",
                        e.message()
                    )));
                }
                Err(e) => {
                    tracing::warn!(
                        "cannot reach the JobManager at {jobmanager}: {}",
                        e.message()
                    );
                }
            }
        } else if !shared.heartbeat_lists().0.is_empty() || last_sent.elapsed() >= interval {
            // While tasks run, the JobManager's view of their metrics is
            // kept at most `metrics.fetcher.update-interval` old; otherwise
            // every `heartbeat.interval`.
            last_sent = Instant::now();
            let metrics_json =
                serde_json::to_string(&shared.metrics.snapshot()).unwrap_or_default();
            let (running, unacknowledged) = shared.heartbeat_lists();
            let sent: Vec<(String, AttemptKey)> = unacknowledged
                .iter()
                .map(|u| {
                    (
                        u.job_id.clone(),
                        (u.vertex_index as usize, u.subtask as usize, u.attempt),
                    )
                })
                .collect();
            let hb = TaskManagerHeartbeat {
                task_manager_id: id.clone(),
                metrics_json,
                running,
                unacknowledged,
            };
            let call = tokio::time::timeout(
                RPC_TIMEOUT,
                client.heartbeat(security::authorize(hb, &secret)),
            );
            let outcome = match call.await {
                Ok(r) => r.map_err(|e| e.message().to_string()),
                Err(_) => Err(format!("no answer in {} s", RPC_TIMEOUT.as_secs())),
            };
            match outcome {
                Ok(r) if r.get_ref().known => {
                    last_contact = Instant::now();
                    let mut pending = lock(&shared.unacknowledged);
                    for k in &sent {
                        pending.remove(k);
                    }
                }
                Ok(_) => {
                    // It declared this TaskManager lost and re-ran its work
                    // elsewhere: what runs here is of no use any more.
                    last_contact = Instant::now();
                    tracing::warn!("the JobManager forgot this TaskManager; registering again");
                    shared.drop_all_jobs();
                    lock(&shared.unacknowledged).clear();
                    registered = false;
                }
                Err(e) => {
                    tracing::warn!("heartbeat to {jobmanager} failed: {e}");
                    if last_contact.elapsed() > timeout {
                        tracing::error!("JobManager lost: cancelling all tasks");
                        shared.drop_all_jobs();
                        registered = false;
                    }
                }
            }
        }
        // Wake for the next metrics report or the next heartbeat,
        // whichever is first.
        tokio::time::sleep(if registered {
            metrics_interval.min(interval.saturating_sub(last_sent.elapsed()))
        } else {
            Duration::from_millis(200)
        })
        .await;
    }
}

//! What the REST API and the job details read of the JobManager: a
//! read-only [`ClusterView`] taken under the JobManager's lock, and the
//! small [`ClusterQuery`] interface that hands it out and cancels jobs.
//! The REST API sees no more of the JobManager than this, so the
//! JobManager's internals (its RPC queues, its lock) stay its own.

use crate::program::ProgramSpec;
use fluvia_core::{JobId, Result};
use fluvia_graph::JobGraph;
use fluvia_scheduler::Scheduler;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the JobManager keeps of a job beside the scheduler's view.
pub(crate) struct JobMeta {
    pub id: String,
    pub program: ProgramSpec,
    pub graph: Arc<JobGraph>,
    pub start_time: u64,
    pub end_time: Option<u64>,
}

/// What a TaskManager last told the JobManager about itself.
pub(crate) struct TaskManagerStatus {
    pub last_heartbeat: Instant,
    /// JSON array of its tasks' live metrics, as its heartbeat carried it.
    pub metrics_json: String,
}

/// The JobManager's state as the REST API reads it, consistent (taken
/// under one lock) and read-only.
pub(crate) struct ClusterView<'a> {
    pub scheduler: &'a Scheduler,
    /// The registered TaskManagers' last reports, by id.
    pub task_managers: BTreeMap<&'a str, &'a TaskManagerStatus>,
    /// RPC address of every TaskManager ever registered (lost ones too).
    pub tm_addresses: &'a BTreeMap<String, String>,
    pub jobs: &'a BTreeMap<JobId, JobMeta>,
    /// The streaming jobs' checkpointing (statistics and settings).
    pub checkpoints: &'a crate::checkpointing::Checkpointing,
    /// Wall clock now, epoch ms.
    pub now: u64,
    /// The scheduler clock now, ms.
    pub clock: u64,
}

/// What the REST API may ask of the JobManager.
pub(crate) trait ClusterQuery: Send + Sync + 'static {
    /// Calls `f` once with a view of the cluster as of now.
    fn read(&self, f: &mut dyn FnMut(&ClusterView<'_>));
    /// Cancels a job (`PATCH /jobs/:id`).
    fn cancel_job(&self, job_id: &str) -> Result<()>;
    /// Triggers a savepoint (`POST /jobs/:id/savepoints`, with `stop` for
    /// `POST /jobs/:id/stop`); returns the trigger id.
    fn trigger_savepoint(
        &self,
        job_id: &str,
        target: Option<String>,
        stop: bool,
        drain: bool,
    ) -> Result<String>;
    /// The cluster secret mutations must present, if one is configured.
    fn secret(&self) -> &Option<String>;
    /// `web.refresh-interval`, for the Web UI.
    fn web_refresh_interval(&self) -> Duration;
}

/// Runs `f` on a view of the cluster as of now and returns its answer.
pub(crate) fn read<R>(q: &dyn ClusterQuery, f: impl FnOnce(&ClusterView<'_>) -> R) -> R {
    let mut f = Some(f);
    let mut out = None;
    q.read(&mut |view| {
        if let Some(f) = f.take() {
            out = Some(f(view));
        }
    });
    // `read` calls back exactly once (every implementation does).
    match out {
        Some(r) => r,
        None => unreachable!("ClusterQuery::read did not call back"),
    }
}

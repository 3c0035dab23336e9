//! The embedded mini-cluster: a JobManager and TaskManagers in this process,
//! talking over loopback exactly as separate processes do (Flink's
//! `MiniCluster`). `fluvia run` without `--jobmanager`, `fluvia sql` and the
//! library's `env.execute()` run their jobs here: one execution path.

use crate::client::ClusterClient;
use crate::config as cfg;
use crate::program::{ProgramCatalog, ProgramSpec};
use crate::rpc::JobStatus;
use fluvia_core::config::options;
use fluvia_core::{Configuration, Result};
use fluvia_graph::JobGraph;
use std::sync::Arc;

/// Starts a JobManager and `local.number-taskmanager` TaskManagers with
/// enough slots for `graph`, runs the job to its end, stops them and returns
/// the job's status.
pub async fn run_job(
    config: &Configuration,
    catalog: Arc<dyn ProgramCatalog>,
    program: &ProgramSpec,
    graph: &JobGraph,
) -> Result<JobStatus> {
    run_job_until(config, catalog, program, graph, std::future::pending()).await
}

/// [`run_job`], cancelling the job when `cancel` completes first (the job
/// then ends CANCELED).
pub async fn run_job_until(
    config: &Configuration,
    catalog: Arc<dyn ProgramCatalog>,
    program: &ProgramSpec,
    graph: &JobGraph,
    cancel: impl std::future::Future<Output = ()>,
) -> Result<JobStatus> {
    run_job_watching(config, catalog, program, graph, cancel, None, true).await
}

/// How long an embedded run waits, after its job ended, for the
/// TaskManagers' cancelled tasks to stop.
const TASK_STOP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// [`run_job_until`], showing `watch` the job's status while it runs;
/// without `details` the final status has no `details_json` (see
/// [`ClusterClient::set_details`]).
pub async fn run_job_watching(
    config: &Configuration,
    catalog: Arc<dyn ProgramCatalog>,
    program: &ProgramSpec,
    graph: &JobGraph,
    cancel: impl std::future::Future<Output = ()>,
    watch: Option<&mut (dyn FnMut(&JobStatus) + Send)>,
    details: bool,
) -> Result<JobStatus> {
    let task_managers = config.get(&options::LOCAL_TASK_MANAGERS)?.max(1);
    let slots = graph.required_slots().max(1).div_ceil(task_managers);
    let mut c = config.clone();
    for (k, v) in [
        ("jobmanager.rpc.address", "127.0.0.1"),
        ("jobmanager.rpc.port", "0"),
        ("rest.address", "127.0.0.1"),
        ("rest.port", "0"),
        ("taskmanager.host", "127.0.0.1"),
        ("heartbeat.interval", "100 ms"),
    ] {
        if config.get_raw(k).is_none() || k.ends_with("port") || k.ends_with("address") {
            c.set(k, v);
        }
    }
    c.set_option(&cfg::SLOTS, slots);
    // One embedded TaskManager holds what a cluster spreads over several:
    // its network budget grows with its slots (a budget, not an
    // allocation: buffers are taken as tasks need them).
    if config.get_raw(options::NETWORK_MEMORY.key).is_none()
        && config.get_raw("taskmanager.memory.network.max").is_none()
    {
        let per_slot = 32 * 1024 * 1024u64;
        let size = options::NETWORK_MEMORY.default.max(per_slot * slots as u64);
        c.set(options::NETWORK_MEMORY.key, size.to_string());
    }
    // The embedded TaskManagers spill under a directory this call owns and
    // removes when it returns.
    let base = config.get(&options::TMP_DIRS)?;
    let spill = if base.is_empty() {
        tempfile::Builder::new().prefix("fluvia-mini-").tempdir()
    } else {
        tempfile::Builder::new()
            .prefix("fluvia-mini-")
            .tempdir_in(base)
    }
    .map_err(|e| fluvia_core::FluviaError::io("creating the spill directory", e))?;
    c.set(
        options::TMP_DIRS.key,
        spill.path().to_string_lossy().to_string(),
    );
    let began = std::time::Instant::now();
    let jm = crate::jobmanager::start(c.clone()).await?;
    let jm_started = began.elapsed();
    let address = jm.rpc_address.to_string();
    // The job is submitted while the TaskManagers start, as a cluster's
    // JobManager takes jobs before its TaskManagers register (the job waits
    // for slots): the two overlap instead of adding up.
    let start_task_managers = async {
        let mut tms = Vec::new();
        for _ in 0..task_managers {
            match crate::taskmanager::spawn(&address, c.clone(), Arc::clone(&catalog)).await {
                Ok(tm) => tms.push(tm),
                Err(e) => return (tms, Err(e)),
            }
        }
        (tms, Ok(()))
    };
    let submit = async {
        let secret = cfg::cluster_secret(&c)?;
        let mut client = ClusterClient::connect(&address, secret).await?;
        client.set_details(details);
        let id = client
            .submit(program, graph, &catalog.fingerprint())
            .await?;
        Ok::<_, fluvia_core::FluviaError>((client, id))
    };
    let ((tms, started), submitted) = tokio::join!(start_task_managers, submit);
    let tms_started = began.elapsed();
    let outcome = match (started, submitted) {
        // The JobManager goes down with the call: so does a submitted job.
        (Err(e), _) | (Ok(()), Err(e)) => Err(e),
        (Ok(()), Ok((mut client, id))) => client.wait_watching(&id, cancel, watch).await,
    };
    let ran = began.elapsed();
    for tm in &tms {
        tm.shutdown();
    }
    jm.abort();
    // A job that failed or was cancelled ends before its other tasks have
    // stopped; they remove what they staged as they stop. The caller sees
    // the output as the job left it once they have (bounded: a task that
    // ignores cancellation does not hold the caller forever).
    let _ = tokio::time::timeout(TASK_STOP_TIMEOUT, async {
        for tm in &tms {
            tm.idle().await;
        }
    })
    .await;
    tracing::debug!(
        "mini-cluster: JobManager up at {:.1} ms, TaskManagers up and job submitted at {:.1} ms, job done at {:.1} ms, shut down at {:.1} ms",
        jm_started.as_secs_f64() * 1e3,
        tms_started.as_secs_f64() * 1e3,
        ran.as_secs_f64() * 1e3,
        began.elapsed().as_secs_f64() * 1e3
    );
    outcome
}

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

/// A directory for the embedded TaskManagers' spill files, under
/// `io.tmp.dirs` (or the system's temporary directory), removed on drop.
fn spill_dir(config: &Configuration) -> Result<tempfile::TempDir> {
    let base = config.get(&options::TMP_DIRS)?;
    if base.is_empty() {
        tempfile::Builder::new().prefix("fluvia-mini-").tempdir()
    } else {
        tempfile::Builder::new()
            .prefix("fluvia-mini-")
            .tempdir_in(base)
    }
    .map_err(|e| fluvia_core::FluviaError::io("creating the spill directory", e))
}

/// Stops the servers of an embedded cluster: the TaskManagers cancel what
/// they run, the JobManager stops taking calls.
fn stop_servers(
    jm: &crate::jobmanager::JobManagerHandle,
    tms: &[crate::taskmanager::TaskManagerHandle],
) {
    for tm in tms {
        tm.shutdown();
    }
    jm.abort();
}

/// Waits until no TaskManager of `tms` is busy; false if one still is after
/// [`TASK_STOP_TIMEOUT`] (a task that ignores cancellation does not hold
/// the caller forever).
async fn idle(tms: &[crate::taskmanager::TaskManagerHandle]) -> bool {
    tokio::time::timeout(TASK_STOP_TIMEOUT, async {
        for tm in tms {
            tm.idle().await;
        }
    })
    .await
    .is_ok()
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
    if warm::kept() {
        return warm::run(
            warm::Shape {
                key: warm::key(config, task_managers, catalog.as_ref()),
                task_managers,
                slots,
                config: c,
            },
            catalog,
            program,
            graph,
            cancel,
            watch,
            details,
        )
        .await;
    }
    // The embedded TaskManagers spill under a directory this call owns and
    // removes when it returns.
    let spill = spill_dir(config)?;
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
    stop_servers(&jm, &tms);
    // A job that failed or was cancelled ends before its other tasks have
    // stopped; they remove what they staged as they stop. The caller sees
    // the output as the job left it once they have.
    idle(&tms).await;
    tracing::debug!(
        "mini-cluster: JobManager up at {:.1} ms, TaskManagers up and job submitted at {:.1} ms, job done at {:.1} ms, shut down at {:.1} ms",
        jm_started.as_secs_f64() * 1e3,
        tms_started.as_secs_f64() * 1e3,
        ran.as_secs_f64() * 1e3,
        began.elapsed().as_secs_f64() * 1e3
    );
    outcome
}

/// Mini-clusters kept between jobs, for clients that run one statement
/// after another in a session (`fluvia sql`, `fluvia tpcds run`): Flink's
/// SQL client likewise runs a session's jobs on one cluster. Starting a
/// JobManager and its TaskManagers took about 1.2 ms of every statement.
///
/// Opt-in with a [`KeepWarm`] guard for the session; without one every job
/// gets a cluster of its own. A kept cluster serves a job only
/// when it was started from the same configuration, TaskManager count and
/// program catalog, with at least the slots the job needs; else it is
/// stopped and a new one started. A job takes the cluster out of the cache
/// while it runs (jobs of concurrent callers get clusters of their own), and
/// puts it back once its TaskManagers are idle.
pub mod warm {
    use super::*;
    use crate::jobmanager::JobManagerHandle;
    use crate::taskmanager::TaskManagerHandle;
    use std::sync::Mutex;

    /// What a job needs of a kept cluster.
    pub(super) struct Shape {
        pub key: String,
        pub task_managers: usize,
        pub slots: usize,
        /// The configuration a new cluster starts from.
        pub config: Configuration,
    }

    struct Kept {
        key: String,
        slots: usize,
        jm: JobManagerHandle,
        tms: Vec<TaskManagerHandle>,
        /// Connected once: a job's client does not open a connection of its
        /// own (a TCP connection and an HTTP/2 handshake before each
        /// submission). Its connection is driven by `runtime`.
        client: ClusterClient,
        /// The cluster's servers run here, not on a caller's runtime (each
        /// `block_on` has its own, gone when it returns).
        runtime: tokio::runtime::Runtime,
        _spill: tempfile::TempDir,
    }

    impl Kept {
        fn stop(self) {
            stop_servers(&self.jm, &self.tms);
            self.runtime.shutdown_background();
        }
    }

    #[derive(Default)]
    struct Cache {
        guards: usize,
        idle: Option<Kept>,
    }

    static CACHE: Mutex<Cache> = Mutex::new(Cache {
        guards: 0,
        idle: None,
    });

    fn cache() -> std::sync::MutexGuard<'static, Cache> {
        CACHE.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// While one lives, embedded jobs of this process keep their cluster for
    /// the next job. The last one dropped stops the kept cluster.
    pub struct KeepWarm(());

    impl KeepWarm {
        pub fn new() -> Self {
            cache().guards += 1;
            KeepWarm(())
        }
    }

    impl Default for KeepWarm {
        fn default() -> Self {
            Self::new()
        }
    }

    impl Drop for KeepWarm {
        fn drop(&mut self) {
            let idle = {
                let mut c = cache();
                c.guards -= 1;
                if c.guards == 0 { c.idle.take() } else { None }
            };
            if let Some(k) = idle {
                k.stop();
            }
        }
    }

    pub(super) fn kept() -> bool {
        cache().guards > 0
    }

    /// Everything a kept cluster was started from, but the slots (a job may
    /// use a cluster with more than it needs).
    pub(super) fn key(
        config: &Configuration,
        task_managers: usize,
        catalog: &dyn ProgramCatalog,
    ) -> String {
        let mut key = format!("{task_managers}\n{}\n", catalog.fingerprint());
        for (k, v) in config.iter() {
            key.push_str(k);
            key.push('=');
            key.push_str(v);
            key.push('\n');
        }
        key
    }

    /// The kept cluster if it fits `shape`; one that does not is stopped.
    fn take(shape: &Shape) -> Option<Kept> {
        let idle = cache().idle.take()?;
        if idle.key == shape.key && idle.slots >= shape.slots {
            return Some(idle);
        }
        idle.stop();
        None
    }

    async fn start(
        shape: &Shape,
        mut config: Configuration,
        catalog: Arc<dyn ProgramCatalog>,
    ) -> Result<Kept> {
        let spill = spill_dir(&config)?;
        config.set(
            options::TMP_DIRS.key,
            spill.path().to_string_lossy().to_string(),
        );
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fluvia-mini-cluster")
            .enable_all()
            .build()
            .map_err(|e| fluvia_core::FluviaError::io("starting the mini-cluster's runtime", e))?;
        let jm = match runtime
            .spawn(crate::jobmanager::start(config.clone()))
            .await
        {
            Ok(Ok(jm)) => jm,
            // A runtime dropped here would block this caller's async context.
            Ok(Err(e)) => {
                runtime.shutdown_background();
                return Err(e);
            }
            Err(e) => {
                runtime.shutdown_background();
                return Err(fluvia_core::FluviaError::Execution(format!(
                    "JobManager: {e}"
                )));
            }
        };
        let address = jm.rpc_address.to_string();
        let mut tms = Vec::new();
        for _ in 0..shape.task_managers {
            let started = runtime
                .spawn(crate::taskmanager::spawn_owned(
                    address.clone(),
                    config.clone(),
                    Arc::clone(&catalog),
                ))
                .await
                .map_err(|e| fluvia_core::FluviaError::Execution(format!("TaskManager: {e}")));
            match started {
                Ok(Ok(tm)) => tms.push(tm),
                Ok(Err(e)) | Err(e) => {
                    stop_servers(&jm, &tms);
                    runtime.shutdown_background();
                    return Err(e);
                }
            }
        }
        let connected = match cfg::cluster_secret(&config) {
            Ok(secret) => runtime
                .spawn(async move { ClusterClient::connect(&address, secret).await })
                .await
                .map_err(|e| fluvia_core::FluviaError::Execution(format!("client: {e}")))
                .and_then(|c| c),
            Err(e) => Err(e),
        };
        let client = match connected {
            Ok(c) => c,
            Err(e) => {
                stop_servers(&jm, &tms);
                runtime.shutdown_background();
                return Err(e);
            }
        };
        Ok(Kept {
            key: shape.key.clone(),
            slots: shape.slots,
            jm,
            tms,
            client,
            runtime,
            _spill: spill,
        })
    }

    /// Runs the job on the kept cluster (or a new one) and keeps the
    /// cluster for the next job once its TaskManagers are idle.
    pub(super) async fn run(
        shape: Shape,
        catalog: Arc<dyn ProgramCatalog>,
        program: &ProgramSpec,
        graph: &JobGraph,
        cancel: impl std::future::Future<Output = ()>,
        watch: Option<&mut (dyn FnMut(&JobStatus) + Send)>,
        details: bool,
    ) -> Result<JobStatus> {
        let config = &shape.config;
        let began = std::time::Instant::now();
        let (kept, reused) = match take(&shape) {
            Some(k) => (k, true),
            None => (
                start(&shape, config.clone(), Arc::clone(&catalog)).await?,
                false,
            ),
        };
        let up = began.elapsed();
        let mut submitted = None;
        let outcome = async {
            let mut client = kept.client.clone();
            client.set_details(details);
            let id = client
                .submit(program, graph, &catalog.fingerprint())
                .await?;
            submitted = Some(id.clone());
            client.wait_watching(&id, cancel, watch).await
        }
        .await;
        let ran = began.elapsed();
        // The job's tasks and its release (which removes what it staged)
        // end before the caller sees its output, as when the cluster stops.
        // The JobManager reports the end before its release reaches the
        // TaskManagers: they release the job here first.
        if let Some(id) = &submitted {
            for tm in &kept.tms {
                tm.release_job(id);
            }
        }
        let settled = idle(&kept.tms).await;
        tracing::debug!(
            "mini-cluster ({}): up at {:.1} ms, job done at {:.1} ms, TaskManagers idle at {:.1} ms",
            if reused { "kept" } else { "new" },
            up.as_secs_f64() * 1e3,
            ran.as_secs_f64() * 1e3,
            began.elapsed().as_secs_f64() * 1e3
        );
        // A cluster whose client failed, or whose tasks did not stop, is
        // not trusted with the next job.
        let healthy = outcome.is_ok() && settled;
        let rest = {
            let mut c = cache();
            if healthy && c.guards > 0 && c.idle.is_none() {
                c.idle = Some(kept);
                None
            } else {
                Some(kept)
            }
        };
        if let Some(k) = rest {
            k.stop();
        }
        outcome
    }
}

//! The external shuffle service (`fluvia shuffle-service`): one per host,
//! outside the TaskManagers, serving the blocking partitions of every job
//! on it (Flink's remote shuffle `ShuffleWorker`).
//!
//! TaskManagers of its host write sort-merge files into its directory
//! (`<dir>/<job id>/`) and hand each finished partition over with
//! `RegisterPartition`; the service checks the files and serves them with
//! the same credit-based data protocol and cluster secret as a TaskManager,
//! until the JobManager releases them. A TaskManager can therefore go away
//! as soon as its producers finished. The service registers with the
//! JobManager and heartbeats; a service that stops answering is lost, and
//! the producers of what it held run again.
//!
//! It knows nothing of jobs' contents or scheduling.

use crate::RpcResult;
use crate::config as cfg;
use crate::deployment::{partition_from_proto, partition_id};
use crate::rpc::job_manager_client::JobManagerClient;
use crate::rpc::shuffle_service_server::{ShuffleService, ShuffleServiceServer};
use crate::rpc::{
    Ack, Empty, JobRequest, RegisterPartitionRequest, RegisterShuffleServiceRequest,
    ReleasePartitionsRequest, ShuffleServiceHeartbeatRequest,
};
use crate::security;
use crate::taskmanager;
use fluvia_core::{Configuration, FluviaError, JobId, Result};
use fluvia_network::ResultPartition;
use fluvia_network::net::environment::NetworkEnvironment;
use fluvia_network::net::protocol::ResultPartitionId;
use fluvia_network::sortmerge::SortMergePartition;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response};

struct Shared {
    id: String,
    dir: PathBuf,
    env: Arc<NetworkEnvironment>,
    secret: Option<String>,
    /// The partitions each job has here.
    jobs: Mutex<HashMap<String, Vec<ResultPartitionId>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn ack(result: std::result::Result<(), String>) -> Response<Ack> {
    Response::new(Ack::from_result(result))
}

impl Shared {
    /// The job's directory, for a job id that is one (never a path).
    fn job_dir(&self, job_id: &str) -> std::result::Result<PathBuf, String> {
        let id = JobId::try_from(job_id.to_string()).map_err(|e| format!("bad job id: {e}"))?;
        Ok(self.dir.join(id.to_string()))
    }

    fn register(&self, r: &RegisterPartitionRequest) -> std::result::Result<(), String> {
        let job_dir = self.job_dir(&r.job_id)?;
        let partition = r
            .partition
            .as_ref()
            .and_then(partition_from_proto)
            .ok_or("a partition request without a valid partition id")?;
        let id = partition_id(partition);
        // A hand-over sent again (its answer was lost) is done already.
        if self.env.partitions().get(&id).is_some() {
            return Ok(());
        }
        // Only files of this job's directory are served.
        let inside = |p: &str| -> std::result::Result<PathBuf, String> {
            let path = Path::new(p);
            let canonical = path
                .canonicalize()
                .map_err(|e| format!("partition {id}: {p}: {e}"))?;
            let dir = job_dir
                .canonicalize()
                .map_err(|e| format!("{}: {e}", job_dir.display()))?;
            if canonical.parent() != Some(dir.as_path()) {
                return Err(format!(
                    "partition {id}: {p} is not in this service's directory {}",
                    dir.display()
                ));
            }
            Ok(canonical)
        };
        let (data, index) = (inside(&r.data_path)?, inside(&r.index_path)?);
        let smp = SortMergePartition::open(
            format!("{id}"),
            &data,
            &index,
            Arc::clone(self.env.read_scheduler()),
        )
        .map_err(|e| e.to_string())?;
        self.env
            .register_partition(id, Arc::new(ResultPartition::sort_merge(smp)));
        lock(&self.jobs)
            .entry(r.job_id.clone())
            .or_default()
            .push(id);
        tracing::info!("shuffle service {}: serving partition {id}", self.id);
        Ok(())
    }

    /// Drops every partition: the JobManager forgot this service (it
    /// declared it lost and re-ran what it held).
    fn release_all(&self) {
        let jobs: Vec<String> = lock(&self.jobs).keys().cloned().collect();
        for job in jobs {
            self.release_job(&job);
        }
    }

    fn release_job(&self, job_id: &str) {
        let ids = lock(&self.jobs).remove(job_id).unwrap_or_default();
        for id in &ids {
            self.env.partitions().release(id);
        }
        if let Ok(dir) = self.job_dir(job_id) {
            // Files still being read stay readable until their readers end.
            let _ = std::fs::remove_dir_all(dir);
        }
        tracing::info!(
            "shuffle service {}: released job {job_id} ({} partitions)",
            self.id,
            ids.len()
        );
    }
}

struct Service {
    shared: Arc<Shared>,
}

#[tonic::async_trait]
impl ShuffleService for Service {
    async fn register_partition(&self, req: Request<RegisterPartitionRequest>) -> RpcResult<Ack> {
        security::check_request(&self.shared.secret, &req, "RegisterPartition")?;
        Ok(ack(self.shared.register(req.get_ref())))
    }

    async fn release_partitions(&self, req: Request<ReleasePartitionsRequest>) -> RpcResult<Ack> {
        let r = security::authorized(&self.shared.secret, req, "ReleasePartitions")?;
        let ids: Vec<ResultPartitionId> = r
            .partitions
            .iter()
            .filter_map(partition_from_proto)
            .map(partition_id)
            .collect();
        for id in &ids {
            self.shared.env.partitions().release(id);
        }
        if let Some(list) = lock(&self.shared.jobs).get_mut(&r.job_id) {
            list.retain(|p| !ids.contains(p));
        }
        Ok(ack(Ok(())))
    }

    async fn release_job(&self, req: Request<JobRequest>) -> RpcResult<Ack> {
        security::check_request(&self.shared.secret, &req, "ReleaseJob")?;
        self.shared.release_job(&req.get_ref().job_id);
        Ok(ack(Ok(())))
    }

    async fn ping(&self, req: Request<Empty>) -> RpcResult<Ack> {
        security::check_request(&self.shared.secret, &req, "Ping")?;
        Ok(ack(Ok(())))
    }
}

/// A running shuffle service.
pub struct ShuffleServiceHandle {
    pub id: String,
    pub rpc_address: SocketAddr,
    pub data_address: SocketAddr,
    pub dir: PathBuf,
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Held for the service's life: one service per directory.
    _lock: std::fs::File,
}

impl ShuffleServiceHandle {
    /// Runs until a server task stops.
    pub async fn wait(mut self) -> Result<()> {
        if let Some(t) = self.tasks.pop() {
            let _ = t.await;
        }
        Err(FluviaError::Execution("the shuffle service stopped".into()))
    }

    /// Partitions served now.
    pub fn num_partitions(&self) -> usize {
        self.shared.env.partitions().len()
    }

    /// Stops serving (embedded use).
    pub fn shutdown(&self) {
        for t in &self.tasks {
            t.abort();
        }
        self.shared.env.shutdown();
    }
}

/// Takes `dir` for this service and removes what a previous service left
/// there (its partitions were lost with it: the JobManager re-runs them).
fn claim_dir(dir: &Path) -> Result<std::fs::File> {
    std::fs::create_dir_all(dir)
        .map_err(|e| FluviaError::io(format!("creating {}", dir.display()), e))?;
    let file = crate::workdir::try_lock_dir(dir)?.ok_or_else(|| {
        FluviaError::Config(format!(
            "another shuffle service uses {} (its LOCK is held)",
            dir.display()
        ))
    })?;
    let entries = std::fs::read_dir(dir)
        .map_err(|e| FluviaError::io(format!("reading {}", dir.display()), e))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if JobId::try_from(name.clone()).is_ok() {
            tracing::info!("removing stale shuffle data {}", e.path().display());
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    Ok(file)
}

/// Starts a shuffle service that registers with the JobManager at
/// `jobmanager`; `dir` overrides `shuffle-service.dir`.
pub async fn start(
    jobmanager: &str,
    config: Configuration,
    dir: Option<PathBuf>,
) -> Result<ShuffleServiceHandle> {
    let secret = cfg::cluster_secret(&config)?;
    let host = config.get(&cfg::SHUFFLE_SERVICE_HOST)?.to_string();
    let dir = match dir {
        Some(d) => d,
        None => match config.get(&cfg::SHUFFLE_SERVICE_DIR)? {
            "" => crate::workdir::tmp_base(&config)?.join("fluvia-shuffle-service"),
            d => PathBuf::from(d),
        },
    };
    let lock_file = claim_dir(&dir)?;
    let dir = dir
        .canonicalize()
        .map_err(|e| FluviaError::io(format!("resolving {}", dir.display()), e))?;
    let (env, listener, rpc_address) = taskmanager::bind_endpoints(
        &config,
        &secret,
        &host,
        &taskmanager::ServerPorts {
            host_key: cfg::SHUFFLE_SERVICE_HOST.key,
            data_port: &cfg::SHUFFLE_SERVICE_DATA_PORT,
            rpc_port: &cfg::SHUFFLE_SERVICE_RPC_PORT,
            what: "shuffle service",
        },
    )
    .await?;
    let id = format!("ss-{}-{}", rpc_address.port(), std::process::id());
    let shared = Arc::new(Shared {
        id: id.clone(),
        dir: dir.clone(),
        env: Arc::clone(&env),
        secret: secret.clone(),
        jobs: Mutex::new(HashMap::new()),
    });
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let service = ShuffleServiceServer::new(Service {
        shared: Arc::clone(&shared),
    });
    let server = tokio::spawn(async move {
        let _ = Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await;
    });
    let channel = taskmanager::jobmanager_channel(jobmanager)?;
    let register = RegisterShuffleServiceRequest {
        service_id: id.clone(),
        host: host.clone(),
        data_address: env.data_address().to_string(),
        rpc_address: rpc_address.to_string(),
        dir: dir.display().to_string(),
    };
    let interval = config.get(&cfg::HEARTBEAT_INTERVAL)?;
    let heartbeats = tokio::spawn(heartbeat_loop(
        JobManagerClient::new(channel),
        register,
        Arc::clone(&shared),
        interval,
        jobmanager.to_string(),
    ));
    tracing::info!(
        "shuffle service {id}: RPC {rpc_address}, data {}, directory {}",
        env.data_address(),
        dir.display()
    );
    Ok(ShuffleServiceHandle {
        id,
        rpc_address,
        data_address: env.data_address(),
        dir,
        shared,
        tasks: vec![heartbeats, server],
        _lock: lock_file,
    })
}

/// Registers, then heartbeats; registers again when the JobManager forgot
/// the service (it restarted, or declared the service lost).
async fn heartbeat_loop(
    mut client: JobManagerClient<Channel>,
    register: RegisterShuffleServiceRequest,
    shared: Arc<Shared>,
    interval: Duration,
    jobmanager: String,
) {
    let secret = shared.secret.clone();
    let mut registered = false;
    loop {
        if !registered {
            match client
                .register_shuffle_service(security::authorize(register.clone(), &secret))
                .await
            {
                Ok(r) if r.get_ref().ok => {
                    tracing::info!("registered at JobManager {jobmanager}");
                    registered = true;
                }
                Ok(r) => tracing::warn!("the JobManager refused: {}", r.get_ref().message),
                Err(e) => tracing::warn!(
                    "cannot reach the JobManager at {jobmanager}: {}",
                    e.message()
                ),
            }
        } else {
            let hb = ShuffleServiceHeartbeatRequest {
                service_id: register.service_id.clone(),
            };
            match tokio::time::timeout(
                Duration::from_secs(10),
                client.shuffle_service_heartbeat(security::authorize(hb, &secret)),
            )
            .await
            {
                Ok(Ok(r)) if !r.get_ref().known => {
                    // Declared lost: what it held was re-run elsewhere.
                    tracing::warn!("the JobManager forgot this service: dropping its partitions");
                    shared.release_all();
                    registered = false;
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!("heartbeat to {jobmanager} failed: {}", e.message()),
                Err(_) => tracing::warn!("heartbeat to {jobmanager}: no answer"),
            }
        }
        tokio::time::sleep(if registered {
            interval
        } else {
            Duration::from_millis(500)
        })
        .await;
    }
}

/// Runs a shuffle service until the process stops.
pub async fn run(jobmanager: &str, config: Configuration, dir: Option<PathBuf>) -> Result<()> {
    let handle = start(jobmanager, config, dir).await?;
    // Scripts and tests read these lines to find the ports.
    crate::announce(&[
        format!("Shuffle service {}", handle.id),
        format!("Shuffle service RPC {}", handle.rpc_address),
        format!("Shuffle service data {}", handle.data_address),
    ]);
    handle.wait().await
}

//! The embedded runtime: runs a JobGraph in this process.
//!
//! It expands the JobGraph into an ExecutionGraph, reserves buffer pools from
//! one [`NetworkBufferPool`] (the budget `taskmanager.memory.network.size`),
//! creates a result partition per producing subtask and data set (pipelined,
//! or blocking spill files under `io.tmp.dirs`), and starts one thread per
//! subtask: tasks are CPU-bound, so they get OS threads, not async tasks.
//! A timer thread bumps the flush epoch every `execution.buffer-timeout`.
//!
//! The first failing task cancels all others; the job then fails with that
//! task's error (never "finished" with partial results). A panicking user
//! function is caught on its task thread and attributed to its operator.

use crate::metrics::{MetricRegistry, TaskMetricGroup, TaskMetricsSnapshot};
use crate::registry::OperatorRegistry;
use crate::task::{
    OutputSpec, TaskDeployment, TaskMetrics, new_result_partition, run_task_attributed,
};
use fluvia_core::config::options;
use fluvia_core::{Configuration, FluviaError, JobId, Result, ResultPartitionType};
use fluvia_graph::JobGraph;
use fluvia_network::gate::InputChannel;
use fluvia_network::metrics::IoCounters;
use fluvia_network::net::environment::{NetworkConfig, NetworkEnvironment, RemoteChannelSpec};
use fluvia_network::net::protocol::ResultPartitionId;
use fluvia_network::{
    CancelToken, InputChannelSpec, LocalBufferPool, NetworkBufferPool, ResultPartition,
};
use fluvia_scheduler::{ExecutionGraph, ExecutionState};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

/// Metrics of one JobVertex, summed over its subtasks.
#[derive(Debug, Clone, Default)]
pub struct VertexMetrics {
    pub name: String,
    pub parallelism: usize,
    pub records_in: u64,
    pub records_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// (operator name, records received or, for sources, emitted).
    pub operators: Vec<(String, u64)>,
    pub output_buffers_max_in_use: usize,
    pub output_buffers_limit: usize,
    pub backpressure_waits: u64,
    /// Averages over the subtasks, for the whole run.
    pub busy_ms_per_second: f64,
    pub back_pressured_ms_per_second: f64,
}

/// The outcome of a finished job.
#[derive(Debug, Clone)]
pub struct JobExecutionResult {
    pub job_id: JobId,
    pub job_name: String,
    pub duration: Duration,
    pub vertices: Vec<VertexMetrics>,
    pub execution_graph: ExecutionGraph,
    /// Every subtask's metrics at the end of the run.
    pub task_metrics: Vec<TaskMetricsSnapshot>,
}

impl JobExecutionResult {
    /// A short human-readable summary.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "Job '{}' ({}) finished in {:.3} s",
            self.job_name,
            self.job_id,
            self.duration.as_secs_f64()
        );
        for v in &self.vertices {
            let _ = writeln!(
                s,
                "  {} [parallelism {}]: records in {}, out {}; bytes in {}, out {}; \
                 busy {:.0} ms/s, back-pressured {:.0} ms/s",
                v.name,
                v.parallelism,
                v.records_in,
                v.records_out,
                v.bytes_in,
                v.bytes_out,
                v.busy_ms_per_second,
                v.back_pressured_ms_per_second
            );
            if v.operators.len() > 1 {
                for (name, n) in &v.operators {
                    let _ = writeln!(s, "      {name}: {n} records");
                }
            }
        }
        s
    }

    /// Total records handled by the operator named `name` (all subtasks).
    pub fn operator_records(&self, name: &str) -> Option<u64> {
        self.vertices
            .iter()
            .flat_map(|v| v.operators.iter())
            .find(|(n, _)| n == name)
            .map(|(_, c)| *c)
    }
}

/// Shuts the mini-cluster's network down however `execute` returns.
struct ShutdownOnDrop<'a>(&'a [Arc<NetworkEnvironment>]);

impl Drop for ShutdownOnDrop<'_> {
    fn drop(&mut self) {
        for env in self.0 {
            env.shutdown();
        }
    }
}

/// The checks made before a job runs: every operator has user code, and
/// each factory's own checks pass (input files exist, ...).
pub fn validate_job(job: &JobGraph, registry: &OperatorRegistry) -> Result<()> {
    for v in &job.vertices {
        for op in &v.operators {
            registry.factory(op.node_id)?.validate()?;
        }
    }
    Ok(())
}

/// Runs jobs in this process.
#[derive(Debug, Clone, Default)]
pub struct LocalExecutor {
    config: Configuration,
    metrics: Arc<MetricRegistry>,
}

struct Outcome {
    vertex: usize,
    subtask: usize,
    result: Result<TaskMetrics>,
}

impl LocalExecutor {
    pub fn new(config: Configuration) -> Self {
        LocalExecutor {
            config,
            metrics: Arc::new(MetricRegistry::new()),
        }
    }

    /// Reports task metrics into `registry` (which a REST endpoint may read
    /// while jobs run).
    pub fn with_metrics(mut self, registry: Arc<MetricRegistry>) -> Self {
        self.metrics = registry;
        self
    }

    pub fn execute(
        &self,
        job: JobGraph,
        registry: Arc<OperatorRegistry>,
    ) -> Result<JobExecutionResult> {
        let started = Instant::now();
        validate_job(&job, &registry)?;
        let segment_size = self.config.get(&options::SEGMENT_SIZE)? as usize;
        let network_memory = self.config.get(&options::NETWORK_MEMORY)?;
        let buffers_per_channel = self.config.get(&options::BUFFERS_PER_CHANNEL)?.max(1);
        let floating = self.config.get(&options::FLOATING_BUFFERS)?;
        let buffer_timeout = self.config.get(&options::BUFFER_TIMEOUT)?;
        let tmp_dir = self.config.get(&options::TMP_DIRS)?;

        let compression = match self
            .config
            .get(&options::COMPRESSION_CODEC)?
            .to_ascii_uppercase()
            .as_str()
        {
            "NONE" => false,
            "LZ4" => true,
            other => {
                return Err(FluviaError::Config(format!(
                    "unknown {} '{other}': expected NONE or LZ4",
                    options::COMPRESSION_CODEC.key
                )));
            }
        };
        let num_task_managers = self.config.get(&options::LOCAL_TASK_MANAGERS)?.max(1);

        let mut eg = ExecutionGraph::from_job_graph(&job)?;
        // One TaskManager: everything is local and no socket is opened. More:
        // each gets its own network environment, and exchanges between them
        // go through their data servers on loopback.
        let cluster = if num_task_managers > 1 {
            let net = NetworkConfig {
                segment_size,
                total_memory: network_memory,
                buffers_per_channel,
                floating_buffers_per_gate: floating,
                compression,
                secret: None,
            };
            (0..num_task_managers)
                .map(|_| {
                    NetworkEnvironment::start(net.clone(), SocketAddr::from(([127, 0, 0, 1], 0)))
                })
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        let _shutdown = ShutdownOnDrop(&cluster);
        let single_pool = NetworkBufferPool::new(network_memory, segment_size)?;
        // Subtask i of every vertex runs on TaskManager i mod N, so forward
        // edges stay local, as with Flink's slot sharing.
        let task_manager_of = |subtask: usize| subtask % num_task_managers;
        let pool_of = |subtask: usize| match cluster.get(task_manager_of(subtask)) {
            Some(env) => Arc::clone(env.buffer_pool()),
            None => Arc::clone(&single_pool),
        };
        let spill_dir = if eg
            .results
            .iter()
            .any(|r| r.result_partition_type == ResultPartitionType::Blocking)
        {
            let dir = if tmp_dir.is_empty() {
                tempfile::Builder::new().prefix("fluvia-").tempdir()
            } else {
                tempfile::Builder::new()
                    .prefix("fluvia-")
                    .tempdir_in(tmp_dir)
            };
            Some(dir.map_err(|e| FluviaError::io("creating the spill directory", e))?)
        } else {
            None
        };

        // partitions[result][producer subtask]
        let mut partitions: Vec<Vec<(Arc<ResultPartition>, Arc<LocalBufferPool>)>> = Vec::new();
        for (ri, r) in eg.results.iter().enumerate() {
            let producer_name = &eg.vertices[r.producer].name;
            let mut per_producer = Vec::with_capacity(r.num_subpartitions.len());
            for (p, &n) in r.num_subpartitions.iter().enumerate() {
                let name = format!(
                    "{producer_name} ({}/{}) -> result {ri}",
                    p + 1,
                    r.num_subpartitions.len()
                );
                let prefix = format!("r{ri}-p{p}");
                let spill = match (&spill_dir, r.result_partition_type) {
                    (Some(dir), ResultPartitionType::Blocking) => {
                        Some((dir.path(), prefix.as_str()))
                    }
                    _ => None,
                };
                let (partition, pool_size) = new_result_partition(
                    name,
                    n,
                    segment_size,
                    spill,
                    buffers_per_channel,
                    floating,
                )?;
                let partition = Arc::new(partition);
                if let Some(env) = cluster.get(task_manager_of(p)) {
                    env.register_partition(
                        ResultPartitionId {
                            data_set: r.data_set.0,
                            producer_subtask: p as u32,
                            attempt: 0,
                        },
                        Arc::clone(&partition),
                    );
                }
                per_producer.push((partition, pool_of(p).create_local_pool(pool_size)?));
            }
            partitions.push(per_producer);
        }

        let job = Arc::new(job);
        let cancel = CancelToken::new();
        let flush_epoch = Arc::new(AtomicU64::new(0));
        let timer_stop = Arc::new(AtomicBool::new(false));
        let timer = {
            let (epoch, stop) = (Arc::clone(&flush_epoch), Arc::clone(&timer_stop));
            std::thread::Builder::new()
                .name("output-flusher".into())
                .spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        std::thread::park_timeout(buffer_timeout.max(Duration::from_millis(1)));
                        epoch.fetch_add(1, Ordering::Relaxed);
                    }
                })
                .map_err(|e| FluviaError::io("starting the output flusher", e))?
        };

        let results = eg.results.clone();
        let mut metric_groups = Vec::new();
        let (tx, rx) = mpsc::channel::<Outcome>();
        let mut handles = Vec::new();
        for (vi, ejv) in eg.vertices.iter_mut().enumerate() {
            let jv = &job.vertices[vi];
            for ev in &mut ejv.subtasks {
                let mut inputs = Vec::new();
                let mut remote = Vec::new();
                let consumer_tm = task_manager_of(ev.subtask_index);
                for cp in &ev.consumed {
                    let partition = &partitions[cp.result][cp.producer_subtask].0;
                    for sp in cp.subpartitions.iter() {
                        let producer_tm = task_manager_of(cp.producer_subtask);
                        if producer_tm == consumer_tm {
                            inputs.push(InputChannelSpec {
                                channel: Arc::clone(partition.subpartition(sp))
                                    as Arc<dyn InputChannel>,
                                input_index: cp.type_number as usize,
                            });
                        } else {
                            remote.push((
                                cp.type_number as usize,
                                RemoteChannelSpec {
                                    peer: cluster[producer_tm].data_address(),
                                    partition: ResultPartitionId {
                                        data_set: results[cp.result].data_set.0,
                                        producer_subtask: cp.producer_subtask as u32,
                                        attempt: 0,
                                    },
                                    subpartition: sp as u32,
                                },
                            ));
                        }
                    }
                }
                let mut input_pools = Vec::new();
                if !remote.is_empty() {
                    let specs: Vec<RemoteChannelSpec> = remote.iter().map(|(_, s)| *s).collect();
                    let (gate_pool, channels) =
                        cluster[consumer_tm].open_remote_channels(&specs)?;
                    input_pools.push(gate_pool);
                    for ((input_index, _), ch) in remote.iter().zip(channels) {
                        inputs.push(InputChannelSpec {
                            channel: ch as Arc<dyn InputChannel>,
                            input_index: *input_index,
                        });
                    }
                }
                let outputs = jv
                    .produced_data_sets
                    .iter()
                    .map(|ds| {
                        let ri = results
                            .iter()
                            .position(|r| r.data_set == ds.id)
                            .ok_or_else(|| {
                                FluviaError::Internal(format!("no result for data set {}", ds.id))
                            })?;
                        let (partition, pool) = &partitions[ri][ev.subtask_index];
                        Ok(OutputSpec {
                            partition: Arc::clone(partition),
                            pool: Arc::clone(pool),
                            partitioner: results[ri].partitioner,
                            consumer_max_parallelism: results[ri].consumer_max_parallelism,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                let counters = Arc::new(IoCounters::default());
                metric_groups.push(
                    self.metrics.register(TaskMetricGroup::new(
                        job.job_id,
                        jv.name.clone(),
                        ev.subtask_index,
                        Arc::clone(&counters),
                        outputs
                            .iter()
                            .map(|o: &OutputSpec| Arc::clone(&o.pool))
                            .collect(),
                        input_pools,
                    )),
                );
                let deployment = TaskDeployment {
                    job: Arc::clone(&job),
                    vertex_index: vi,
                    subtask_index: ev.subtask_index,
                    attempt_number: ev.current_attempt().attempt_number,
                    registry: Arc::clone(&registry),
                    inputs,
                    outputs,
                    cancel: cancel.clone(),
                    flush_epoch: Arc::clone(&flush_epoch),
                    counters,
                };
                ev.current_attempt_mut().state = ExecutionState::Running;
                let tx = tx.clone();
                let name = deployment.task_name();
                let (subtask, cancel_on_failure) = (ev.subtask_index, cancel.clone());
                let handle = std::thread::Builder::new()
                    .name(name.clone())
                    .spawn(move || {
                        let result = run_task_attributed(&deployment);
                        if matches!(&result, Err(FluviaError::Task { .. })) {
                            cancel_on_failure.cancel();
                        }
                        // The receiver only goes away after every task reported.
                        let _ = tx.send(Outcome {
                            vertex: vi,
                            subtask,
                            result,
                        });
                    })
                    .map_err(|e| FluviaError::io(format!("starting task thread {name}"), e))?;
                handles.push(handle);
            }
        }
        drop(tx);

        let mut first_error: Option<FluviaError> = None;
        let mut per_task: Vec<Vec<TaskMetrics>> = eg
            .vertices
            .iter()
            .map(|v| vec![TaskMetrics::default(); v.parallelism])
            .collect();
        for outcome in rx.iter() {
            let attempt =
                eg.vertices[outcome.vertex].subtasks[outcome.subtask].current_attempt_mut();
            match outcome.result {
                Ok(m) => {
                    attempt.state = ExecutionState::Finished;
                    per_task[outcome.vertex][outcome.subtask] = m;
                }
                Err(FluviaError::Cancelled) => attempt.state = ExecutionState::Canceled,
                Err(e) => {
                    attempt.state = ExecutionState::Failed;
                    tracing::error!("{e}");
                    cancel.cancel();
                    if first_error.is_none() {
                        first_error = Some(e);
                    }
                }
            }
        }
        for h in handles {
            let _ = h.join();
        }
        timer_stop.store(true, Ordering::Release);
        timer.thread().unpark();
        let _ = timer.join();
        // Whole-run rates: each group's first snapshot covers its lifetime.
        let task_metrics: Vec<TaskMetricsSnapshot> =
            metric_groups.iter().map(|g| g.snapshot()).collect();
        self.metrics.remove_job(job.job_id);
        if let Some(e) = first_error {
            return Err(e);
        }
        if cancel.is_cancelled() {
            return Err(FluviaError::Cancelled);
        }

        let vertices = job
            .vertices
            .iter()
            .zip(per_task)
            .map(|(jv, tasks)| {
                let mut m = VertexMetrics {
                    name: jv.name.clone(),
                    parallelism: jv.parallelism,
                    operators: jv.operators.iter().map(|o| (o.name.clone(), 0)).collect(),
                    ..Default::default()
                };
                let snaps: Vec<&TaskMetricsSnapshot> =
                    task_metrics.iter().filter(|s| s.task == jv.name).collect();
                if !snaps.is_empty() {
                    let n = snaps.len() as f64;
                    m.busy_ms_per_second =
                        snaps.iter().map(|s| s.busy_ms_per_second).sum::<f64>() / n;
                    m.back_pressured_ms_per_second = snaps
                        .iter()
                        .map(|s| s.back_pressured_ms_per_second)
                        .sum::<f64>()
                        / n;
                }
                for t in tasks {
                    m.records_in += t.records_in;
                    m.records_out += t.records_out;
                    m.bytes_in += t.bytes_in;
                    m.bytes_out += t.bytes_out;
                    m.output_buffers_max_in_use =
                        m.output_buffers_max_in_use.max(t.output_buffers_max_in_use);
                    m.output_buffers_limit = m.output_buffers_limit.max(t.output_buffers_limit);
                    m.backpressure_waits += t.backpressure_waits;
                    for (slot, n) in m.operators.iter_mut().zip(&t.operator_records) {
                        slot.1 += n;
                    }
                }
                m
            })
            .collect();
        Ok(JobExecutionResult {
            job_id: job.job_id,
            job_name: job.name.clone(),
            duration: started.elapsed(),
            vertices,
            execution_graph: eg,
            task_metrics,
        })
    }
}

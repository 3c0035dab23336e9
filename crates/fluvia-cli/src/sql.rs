//! `fluvia sql` and `fluvia tpcds`: plan with fluvia-sql in the client, run
//! the job on the embedded mini-cluster or a cluster, print the result.

use crate::block_on;
use crate::progress::progress_watch;
use anyhow::{Context, Result, anyhow};
use fluvia_cluster::client::ClusterClient;
use fluvia_cluster::config as cluster_config;
use fluvia_cluster::program::{ProgramCatalog, ProgramSpec};
use fluvia_cluster::rpc::JobStatus;
use fluvia_core::Configuration;
use fluvia_graph::JobGraph;
use fluvia_sql::datafusion::arrow::record_batch::RecordBatch;
use fluvia_sql::job::{InsertTarget, PROGRAM, PlanError, PlanRequest, PlannedQuery};
use fluvia_sql::session::TableFormat;
use fluvia_sql::session::catalog::Catalog;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a query runs.
#[derive(Debug, Clone)]
pub enum Target {
    /// The embedded mini-cluster (JobManager and TaskManagers in this process).
    Embedded,
    /// A cluster's JobManager.
    Cluster(String),
    /// DataFusion alone in this process (`collect`), the comparison baseline.
    DataFusion,
}

/// A query's outcome.
pub struct QueryRun {
    pub batches: Vec<RecordBatch>,
    pub schema: fluvia_sql::datafusion::arrow::datatypes::SchemaRef,
    pub elapsed: Duration,
    pub graph: Option<JobGraph>,
    pub status: Option<JobStatus>,
}

/// Failures of `fluvia sql`, split so the binary can give a query error exit code 2.
#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    #[error("{0}")]
    Query(String),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl From<fluvia_core::FluviaError> for SqlError {
    fn from(e: fluvia_core::FluviaError) -> Self {
        SqlError::Other(e.into())
    }
}

/// Settings shared by the SQL commands.
#[derive(Debug, Clone)]
pub struct SqlSettings {
    /// The tables and views statements see.
    pub catalog: Catalog,
    pub parallelism: usize,
    /// No `-p` given: stages past the scans get their parallelism from the
    /// data at runtime (the adaptive batch scheduler); `parallelism` is then
    /// only what the scans are planned with.
    pub adaptive: bool,
    pub config: Configuration,
    /// Whether a run's status carries the job's details (`details_json`:
    /// every vertex and subtask, as the REST API shows them). Off by
    /// default: the JobManager writes them in milliseconds a small
    /// statement would wait for, and the exchanged bytes come from the
    /// subtasks' results.
    pub job_details: bool,
}

impl SqlSettings {
    /// Settings over the tables of `tables` (one sub-folder or file each).
    pub fn new(
        tables: PathBuf,
        format: TableFormat,
        parallelism: Option<usize>,
        config: Configuration,
    ) -> fluvia_core::Result<Self> {
        SqlSettings::with_catalog(Catalog::with_dir(&tables, format)?, parallelism, config)
    }

    /// Settings for `-p` (kept as given) or, without it, adaptive ones whose
    /// scans are planned at [`default_scan_parallelism`].
    pub fn with_catalog(
        catalog: Catalog,
        parallelism: Option<usize>,
        config: Configuration,
    ) -> fluvia_core::Result<Self> {
        let (parallelism, adaptive) = match parallelism {
            Some(p) => (p, false),
            None => (default_scan_parallelism(&config)?, true),
        };
        Ok(SqlSettings {
            catalog,
            parallelism,
            adaptive,
            config,
            job_details: false,
        })
    }
}

/// The parallelism scans are planned with when the query has none:
/// `execution.batch.adaptive.auto-parallelism.default-source-parallelism`
/// or `parallelism.default` when configured, else the machine's cores.
pub fn default_scan_parallelism(config: &Configuration) -> fluvia_core::Result<usize> {
    use fluvia_core::config::options;
    if config
        .get_raw(options::AUTO_PARALLELISM_DEFAULT_SOURCE.key)
        .is_some()
    {
        return config.get(&options::AUTO_PARALLELISM_DEFAULT_SOURCE);
    }
    if config.get_raw(options::PARALLELISM.key).is_some() {
        return config.get(&options::PARALLELISM);
    }
    Ok(std::thread::available_parallelism().map_or(2, |n| n.get()))
}

/// Plans one statement; the result file goes to `work`.
pub fn plan(s: &SqlSettings, sql: &str, name: &str, work: &Path) -> Result<PlannedQuery, SqlError> {
    plan_insert(s, sql, None, name, work)
}

/// Plans a query, or with `insert` the `INSERT INTO` of its rows.
pub fn plan_insert(
    s: &SqlSettings,
    sql: &str,
    insert: Option<InsertTarget>,
    name: &str,
    work: &Path,
) -> Result<PlannedQuery, SqlError> {
    let req = PlanRequest {
        sql: sql.to_string(),
        catalog: s.catalog.clone(),
        insert,
        parallelism: s.parallelism,
        adaptive: s.adaptive,
        config: s.config.clone(),
        result_path: work.join(format!("{}.arrow", sanitize(name))),
        name: name.to_string(),
    };
    fluvia_sql::job::plan(&req).map_err(|e| match e {
        PlanError::Query(q) => SqlError::Query(q.to_string()),
        PlanError::Fluvia(f) => SqlError::Other(f.into()),
    })
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Runs one query on `target`.
pub fn run(s: &SqlSettings, sql: &str, name: &str, target: &Target) -> Result<QueryRun, SqlError> {
    run_with(s, sql, None, name, target, &Cancel::default())
}

/// A way to cancel a running statement from another thread (Ctrl-C in
/// the interactive client).
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<tokio::sync::Notify>);

impl Cancel {
    pub fn cancel(&self) {
        self.0.notify_one();
    }

    pub async fn cancelled(&self) {
        self.0.notified().await
    }
}

/// Runs a query (or with `insert`, writes its rows into a table) on
/// `target`; `cancel` cancels the job.
pub fn run_with(
    s: &SqlSettings,
    sql: &str,
    insert: Option<InsertTarget>,
    name: &str,
    target: &Target,
    cancel: &Cancel,
) -> Result<QueryRun, SqlError> {
    let work = tempfile::Builder::new()
        .prefix("fluvia-sql-")
        .tempdir()
        .context("creating a directory for the result")?;
    if let Target::DataFusion = target {
        let started = Instant::now();
        let (schema, batches) =
            fluvia_sql::job::run_in_datafusion(sql, &s.catalog, s.parallelism, &s.config).map_err(
                |e| match e {
                    PlanError::Query(q) => SqlError::Query(q.to_string()),
                    PlanError::Fluvia(f) => SqlError::Other(f.into()),
                },
            )?;
        return Ok(QueryRun {
            batches,
            schema,
            elapsed: started.elapsed(),
            graph: None,
            status: None,
        });
    }
    let started = Instant::now();
    let mut planned = plan_insert(s, sql, insert, name, work.path())?;
    planned
        .job
        .resolve_shuffle_mode(matches!(target, Target::Embedded))?;
    let job = Arc::new(planned.job);
    let spec = ProgramSpec {
        name: PROGRAM.to_string(),
        args: job.to_args()?,
    };
    let (graph, registry) = job.build()?;
    fluvia_runtime::validate_job(&graph, &registry)?;
    let planned_in = started.elapsed();
    let mut progress = crate::progress::Progress::new(name);
    let active = progress.active();
    let mut watch = |s: &JobStatus| progress.update(s);
    let status = match target {
        Target::Embedded => block_on(fluvia_cluster::minicluster::run_job_watching(
            &graph.config,
            Arc::new(crate::catalog::ExampleCatalog),
            &spec,
            &graph,
            cancel.cancelled(),
            progress_watch(&mut watch, active),
            s.job_details,
        ))??,
        Target::Cluster(jm) => {
            let secret = cluster_config::cluster_secret(&graph.config)?;
            block_on(async {
                let mut client = ClusterClient::connect(jm, secret).await?;
                client.set_details(s.job_details);
                let id = client
                    .submit(&spec, &graph, &crate::catalog::ExampleCatalog.fingerprint())
                    .await?;
                if let Some(url) = client.web_ui(&id) {
                    crate::note_line(&format!("Job {id} submitted: {url}"));
                }
                client
                    .wait_watching(&id, cancel.cancelled(), progress_watch(&mut watch, active))
                    .await
            })??
        }
        Target::DataFusion => unreachable!("handled above"),
    };
    progress.finish();
    if status.state != "FINISHED" {
        return Err(SqlError::Other(anyhow!(
            "job {} {}: {}",
            status.job_id,
            status.state,
            status.error
        )));
    }
    if job.files.is_some() {
        return Ok(QueryRun {
            batches: Vec::new(),
            schema: planned.physical.schema(),
            elapsed: started.elapsed(),
            graph: Some(graph),
            status: Some(status),
        });
    }
    let ran_in = started.elapsed();
    let batches = fluvia_sql::job::read_result(Path::new(&job.result_path))?;
    let schema = planned.physical.schema();
    // Where a statement's fixed cost goes (`RUST_LOG=fluvia_cli=debug`).
    tracing::debug!(
        "{name}: job planned at {:.1} ms, finished at {:.1} ms, result read at {:.1} ms",
        planned_in.as_secs_f64() * 1e3,
        ran_in.as_secs_f64() * 1e3,
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(QueryRun {
        batches,
        schema,
        elapsed: started.elapsed(),
        graph: Some(graph),
        status: Some(status),
    })
}

/// Rows an `INSERT INTO` job wrote, from its sinks' reports.
pub fn rows_written(status: &JobStatus) -> u64 {
    status
        .results
        .iter()
        .filter_map(|r| r.metrics.as_ref())
        .flat_map(|m| &m.accumulators)
        .filter(|a| a.name == fluvia_sql::formats::file_sink::ROWS_WRITTEN)
        .filter_map(|a| <[u8; 8]>::try_from(a.value.as_slice()).ok())
        .map(u64::from_le_bytes)
        .sum()
}

/// Bytes and batches sent over each network edge, from a finished job's
/// status (the winning attempts' reports): `(producer, consumer, ship
/// strategy, bytes, batches)`.
pub fn edge_stats(graph: &JobGraph, status: &JobStatus) -> Vec<(String, String, String, u64, u64)> {
    let mut written = vec![(0u64, 0u64); graph.vertices.len()];
    for r in &status.results {
        if let (Some(w), Some(m)) = (written.get_mut(r.vertex_index as usize), &r.metrics) {
            w.0 += m.bytes_out;
            w.1 += m.records_out;
        }
    }
    let mut out = Vec::new();
    for consumer in &graph.vertices {
        for e in &consumer.inputs {
            let Some(pi) = graph.vertex_index(e.source_vertex) else {
                continue;
            };
            let (bytes, batches) = written[pi];
            out.push((
                graph.vertices[pi].name.clone(),
                consumer.name.clone(),
                e.ship_strategy_name().to_string(),
                bytes,
                batches,
            ));
        }
    }
    out
}

//! `fluvia`: one binary for every role — the JobManager and TaskManager
//! processes, and the client commands that run, explain, list and cancel
//! jobs (on a cluster with `--jobmanager`, else on the embedded
//! mini-cluster).

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Parser, Subcommand};
use fluvia_cli::catalog::{Example, ExampleCatalog};
use fluvia_cli::progress::progress_watch;
use fluvia_cli::session::{Outcome, SqlSession};
use fluvia_cli::sql::{SqlError, SqlSettings, Target};
use fluvia_cli::{block_on, examples};
use fluvia_cluster::client::ClusterClient;
use fluvia_cluster::config as cluster_config;
use fluvia_cluster::program::{ProgramCatalog, ProgramSpec};
use fluvia_core::config::options;
use fluvia_graph::plan;
use fluvia_sql::session::TableFormat;
use fluvia_sql::session::catalog::Catalog;
use fluvia_tpcds as tpcds;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// `eprintln!` that does not panic when standard error is closed (a
/// summary piped into `head`).
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// CSV tables without a declared schema are read with a guessed one: say so.
fn note_inferred_schemas(dir: &std::path::Path, format: TableFormat) {
    let guessed = fluvia_sql::session::undeclared_tables(dir, format);
    if !guessed.is_empty() {
        note!(
            "note: no {} for table(s) {}: column types are inferred from the data",
            fluvia_sql::formats::schema_file::SCHEMA_FILE,
            guessed.join(", ")
        );
    }
}

#[derive(Parser)]
#[command(
    name = "fluvia",
    version,
    about = "Fluvia: a distributed dataflow engine in the lineage of Apache Flink"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an example job (on the embedded mini-cluster, or on a cluster with --jobmanager).
    #[command(alias = "submit")]
    Run {
        /// Submit to the JobManager at HOST:PORT instead of running embedded.
        #[arg(long, value_name = "HOST:PORT")]
        jobmanager: Option<String>,
        #[command(subcommand)]
        example: Example,
    },
    /// Print an example's JobGraph (after chaining) without running it.
    Explain {
        #[command(flatten)]
        format: PlanFormat,
        #[command(subcommand)]
        example: Example,
    },
    /// Run SQL over a directory of tables (on the embedded mini-cluster, or a cluster with --jobmanager).
    Sql(SqlArgs),
    /// TPC-DS: generate the tables, run and check the 99 queries.
    Tpcds {
        #[command(subcommand)]
        command: TpcdsCommand,
    },
    /// List the example jobs.
    Examples,
    /// List the configuration keys Fluvia reads, with their defaults.
    Config,
    /// Start a JobManager (RPC, REST API, scheduler) and run until stopped.
    Jobmanager {
        #[command(flatten)]
        conf: ConfigArgs,
    },
    /// Start a TaskManager that registers with a JobManager.
    Taskmanager {
        /// The JobManager's RPC address.
        #[arg(long, value_name = "HOST:PORT")]
        jobmanager: String,
        /// Number of task slots (taskmanager.numberOfTaskSlots).
        #[arg(long)]
        slots: Option<usize>,
        #[command(flatten)]
        conf: ConfigArgs,
    },
    /// Start an external shuffle service (one per host) that registers with
    /// a JobManager and serves the blocking partitions of this host's
    /// TaskManagers (jobs with shuffle-service.type: external).
    ShuffleService {
        /// The JobManager's RPC address.
        #[arg(long, value_name = "HOST:PORT")]
        jobmanager: String,
        /// Directory of the partition files (shuffle-service.dir).
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
        #[command(flatten)]
        conf: ConfigArgs,
    },
    /// List the jobs of a cluster.
    List {
        #[arg(long, value_name = "HOST:PORT")]
        jobmanager: String,
        #[command(flatten)]
        conf: ConfigArgs,
    },
    /// Cancel a job on a cluster.
    Cancel {
        #[arg(long, value_name = "HOST:PORT")]
        jobmanager: String,
        job_id: String,
        #[command(flatten)]
        conf: ConfigArgs,
    },
    /// Take a savepoint of a running streaming job (into a new directory
    /// under DIR, or execution.checkpointing.savepoint-dir); prints its path.
    Savepoint {
        #[arg(long, value_name = "HOST:PORT")]
        jobmanager: String,
        job_id: String,
        /// Parent directory of the savepoint.
        dir: Option<String>,
        #[command(flatten)]
        conf: ConfigArgs,
    },
    /// Stop a streaming job with a savepoint: its sources end after the
    /// savepoint and the job finishes; prints the savepoint's path.
    Stop {
        #[arg(long, value_name = "HOST:PORT")]
        jobmanager: String,
        /// Parent directory of the savepoint (else
        /// execution.checkpointing.savepoint-dir).
        #[arg(long = "savepoint-path", short = 'p', value_name = "DIR")]
        savepoint_path: Option<String>,
        /// Emit end of input before the savepoint (Flink's --drain).
        #[arg(long, short = 'd')]
        drain: bool,
        job_id: String,
        #[command(flatten)]
        conf: ConfigArgs,
    },
}

#[derive(Args)]
struct SqlArgs {
    /// Directory with one sub-folder (or file) per table, named after the
    /// table (a shortcut for one CREATE TABLE each).
    #[arg(long, value_name = "DIR")]
    tables: Option<PathBuf>,
    /// Format of the table files.
    #[arg(long, default_value = "parquet", value_parser = parse_format)]
    format: TableFormat,
    /// File with the statement(s) to run, separated by `;`. Without -f or
    /// -e, statements are read from standard input, or typed at a prompt
    /// when it is a terminal (the interactive client).
    #[arg(long, short = 'f', value_name = "FILE", conflicts_with = "execute")]
    file: Option<PathBuf>,
    /// The statement(s) to run.
    #[arg(short = 'e', long = "execute", value_name = "SQL")]
    execute: Option<String>,
    /// Parallelism of the query's operators; without it the scans run at the
    /// default source parallelism (the machine's cores unless configured) and
    /// fragments that only read exchanges get theirs from the data.
    #[arg(short, long)]
    parallelism: Option<usize>,
    /// Print the JobGraph (fragments, exchanges, multiple-input members) instead of running.
    #[arg(long)]
    explain: bool,
    /// After the result, print bytes and batches sent over each network edge (stderr).
    #[arg(long)]
    stats: bool,
    /// Submit to the JobManager at HOST:PORT instead of running embedded.
    #[arg(long, value_name = "HOST:PORT")]
    jobmanager: Option<String>,
    #[command(flatten)]
    conf: ConfigArgs,
}

#[derive(Subcommand)]
enum TpcdsCommand {
    /// Generate the 24 TPC-DS tables (DIR/<table>/<table>.1.parquet).
    Gen {
        /// Scale factor (1 = about 1 GB of raw data; fractions work).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        #[arg(long, default_value = "parquet", value_parser = parse_format)]
        format: TableFormat,
        /// Tables generated at once.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Compare the generated tables with a tables.csv of checksums.
        #[arg(long, value_name = "TABLES_CSV")]
        check: Option<PathBuf>,
    },
    /// Run queries and print, per statement, time, rows and pass/fail.
    Run {
        /// Table directory (as written by `tpcds gen`).
        #[arg(long, value_name = "DIR")]
        data: PathBuf,
        #[arg(long, default_value = "parquet", value_parser = parse_format)]
        format: TableFormat,
        /// Directory with q1.sql ... q99.sql.
        #[arg(long, value_name = "DIR")]
        queries: PathBuf,
        /// Only these query numbers (repeatable).
        #[arg(long = "query", value_name = "N")]
        query: Vec<usize>,
        /// Directory of answers (qN.csv) to check results against.
        #[arg(long, value_name = "DIR")]
        check: Option<PathBuf>,
        /// Parallelism of every operator; without it the scans run at the
        /// default source parallelism (the machine's cores unless configured)
        /// and fragments that only read exchanges get theirs from the data.
        #[arg(short, long)]
        parallelism: Option<usize>,
        /// Runs of each query; the median time is reported.
        #[arg(long, default_value_t = 1)]
        repeat: usize,
        /// fluvia (embedded mini-cluster) or datafusion (one process, the baseline).
        #[arg(long, default_value = "fluvia")]
        engine: String,
        /// Submit to the JobManager at HOST:PORT instead of running embedded.
        #[arg(long, value_name = "HOST:PORT")]
        jobmanager: Option<String>,
        #[command(flatten)]
        conf: ConfigArgs,
    },
}

fn parse_format(s: &str) -> Result<TableFormat, String> {
    TableFormat::parse(s).map_err(|e| e.to_string())
}

/// Configuration of a process: a file plus `-D` overrides.
#[derive(Args, Clone)]
struct ConfigArgs {
    /// Configuration file: flat YAML (`key: value`) or TOML.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// A configuration key, as key=value (repeatable).
    #[arg(short = 'D', value_name = "KEY=VALUE")]
    dynamic: Vec<String>,
}

impl ConfigArgs {
    fn load(&self) -> Result<fluvia_core::Configuration> {
        Ok(cluster_config::load(self.config.as_deref(), &self.dynamic)?)
    }
}

#[derive(Args, Clone, Copy)]
struct PlanFormat {
    /// Print the plan as JSON, in the shape of Flink's /jobs/:id/plan.
    #[arg(long, global = true, conflicts_with = "dot")]
    json: bool,
    /// Print the plan as a Graphviz DOT graph.
    #[arg(long, global = true)]
    dot: bool,
}

/// Runs on the embedded mini-cluster: a JobManager and TaskManagers in
/// this process, over loopback.
fn run_embedded(example: Example) -> Result<()> {
    let spec = program_spec(&example);
    let env = example.environment()?;
    let graph = env.job_graph(example.name())?;
    fluvia_runtime::validate_job(&graph, &env.registry())?;
    let mut progress = fluvia_cli::progress::Progress::new(example.name());
    let active = progress.active();
    let mut watch = |s: &fluvia_cluster::rpc::JobStatus| progress.update(s);
    let status = block_on(fluvia_cluster::minicluster::run_job_watching(
        &graph.config,
        Arc::new(ExampleCatalog),
        &spec,
        &graph,
        std::future::pending(),
        progress_watch(&mut watch, active),
        true,
    ))??;
    progress.finish();
    report(&status, &graph, Some(&example))
}

/// Prints a finished job's summary (stderr) and, for the pipeline, rows/s.
fn report(
    status: &fluvia_cluster::rpc::JobStatus,
    graph: &fluvia_graph::JobGraph,
    example: Option<&Example>,
) -> Result<()> {
    let details: serde_json::Value = serde_json::from_str(&status.details_json).unwrap_or_default();
    let secs = details["duration"].as_u64().unwrap_or(0) as f64 / 1000.0;
    if status.state == "FINISHED" {
        note!(
            "Job '{}' ({}) finished in {secs:.3} s",
            status.name,
            status.job_id
        );
    } else {
        note!(
            "Job '{}' ({}) {} after {secs:.3} s",
            status.name,
            status.job_id,
            status.state
        );
    }
    if details["restarts"].as_u64().unwrap_or(0) > 0 {
        note!("  restarts: {}", details["restarts"]);
    }
    for (v, jv) in details["vertices"]
        .as_array()
        .into_iter()
        .flatten()
        .zip(&graph.vertices)
    {
        note!(
            "  {} [parallelism {}]: records in {}, out {}; bytes in {}, out {}",
            jv.name,
            v["parallelism"],
            v["metrics"]["read-records"],
            v["metrics"]["write-records"],
            v["metrics"]["read-bytes"],
            v["metrics"]["write-bytes"]
        );
        if jv.operators.len() > 1 {
            for (k, op) in jv.operators.iter().enumerate() {
                let n: u64 = v["subtasks"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|s| s["operator-records"][k].as_u64().unwrap_or(0))
                    .sum();
                note!("      {}: {n} records", op.name);
            }
        }
    }
    if status.state != "FINISHED" {
        bail!("job {} {}: {}", status.job_id, status.state, status.error);
    }
    if let Some(Example::Pipeline { rows, .. }) = example {
        println!(
            "{rows} rows in {secs:.3} s: {:.2} M rows/s",
            *rows as f64 / secs.max(1e-9) / 1e6
        );
    }
    Ok(())
}

/// The example's own arguments, as typed after its name.
fn program_spec(example: &Example) -> ProgramSpec {
    let args: Vec<String> = std::env::args().collect();
    let name = example.name();
    let after = args
        .iter()
        .position(|a| a == name)
        .map(|i| args[i + 1..].to_vec())
        .unwrap_or_default();
    ProgramSpec {
        name: name.to_string(),
        args: after,
    }
}

fn run_on_cluster(jobmanager: &str, example: Example) -> Result<()> {
    let spec = program_spec(&example);
    let env = example.environment()?;
    let graph = env.job_graph(example.name())?;
    fluvia_runtime::validate_job(&graph, &env.registry())?;
    let secret = cluster_config::cluster_secret(&graph.config)?;
    let mut progress = fluvia_cli::progress::Progress::new(example.name());
    let active = progress.active();
    let mut watch = |s: &fluvia_cluster::rpc::JobStatus| progress.update(s);
    let status = block_on(async {
        let mut client = ClusterClient::connect(jobmanager, secret).await?;
        let job_id = client
            .submit(&spec, &graph, &ExampleCatalog.fingerprint())
            .await?;
        note!("Job {job_id} submitted to {jobmanager}");
        if let Some(url) = client.web_ui(&job_id) {
            note!("Web UI: {url}");
        }
        client
            .wait_watching(
                &job_id,
                std::future::pending(),
                progress_watch(&mut watch, active),
            )
            .await
    })??;
    progress.finish();
    report(&status, &graph, Some(&example))
}

fn explain(example: Example, format: PlanFormat) -> Result<()> {
    let env = example.environment()?;
    let job = env.job_graph(example.name())?;
    if format.json {
        println!("{}", serde_json::to_string_pretty(&plan::json_plan(&job))?);
    } else if format.dot {
        print!("{}", plan::dot_plan(&job));
    } else {
        print!("{}", plan::text_plan(&job));
    }
    Ok(())
}

fn jobmanager(conf: ConfigArgs) -> Result<()> {
    let config = conf.load()?;
    block_on(async {
        let handle = fluvia_cluster::jobmanager::start(config).await?;
        // Scripts and tests read these two lines to find the ports.
        fluvia_cluster::announce(&[
            format!("JobManager RPC {}", handle.rpc_address),
            format!("REST http://{}", handle.rest_address),
        ]);
        handle.wait().await?;
        Ok(())
    })?
}

fn taskmanager(jobmanager: String, slots: Option<usize>, conf: ConfigArgs) -> Result<()> {
    let mut config = conf.load()?;
    if let Some(s) = slots {
        config.set_option(&cluster_config::SLOTS, s);
    }
    block_on(async {
        fluvia_cluster::taskmanager::run(&jobmanager, config, Arc::new(ExampleCatalog)).await?;
        Ok(())
    })?
}

fn shuffle_service(
    jobmanager: String,
    dir: Option<std::path::PathBuf>,
    conf: ConfigArgs,
) -> Result<()> {
    let config = conf.load()?;
    block_on(async {
        fluvia_cluster::shuffle_service::run(&jobmanager, config, dir).await?;
        Ok(())
    })?
}

fn list(jobmanager: String, conf: ConfigArgs) -> Result<()> {
    let secret = cluster_config::cluster_secret(&conf.load()?)?;
    block_on(async {
        let mut client = ClusterClient::connect(&jobmanager, secret).await?;
        for j in client.list().await? {
            println!("{}  {:<10}  {}", j.job_id, j.state, j.name);
        }
        Ok(())
    })?
}

fn cancel(jobmanager: String, job_id: String, conf: ConfigArgs) -> Result<()> {
    let secret = cluster_config::cluster_secret(&conf.load()?)?;
    block_on(async {
        let mut client = ClusterClient::connect(&jobmanager, secret).await?;
        client.cancel(&job_id).await.map_err(|e| anyhow!(e))?;
        println!("Cancelling job {job_id}");
        Ok(())
    })?
}

fn savepoint(
    jobmanager: String,
    job_id: String,
    dir: Option<String>,
    stop: bool,
    drain: bool,
    conf: ConfigArgs,
) -> Result<()> {
    let secret = cluster_config::cluster_secret(&conf.load()?)?;
    block_on(async {
        let mut client = ClusterClient::connect(&jobmanager, secret).await?;
        if stop {
            note!("Stopping job {job_id} with a savepoint");
        } else {
            note!("Triggering a savepoint of job {job_id}");
        }
        let location = client
            .savepoint(&job_id, dir.as_deref(), stop, drain)
            .await
            .map_err(|e| anyhow!(e))?;
        note!("Savepoint completed. Path: {location}");
        println!("{location}");
        Ok(())
    })?
}

/// Exit code of a query the planner rejects (syntax, unknown table or column).
const QUERY_ERROR: u8 = 2;

fn sql_command(a: SqlArgs) -> Result<ExitCode> {
    let config = a.conf.load()?;
    let catalog = match &a.tables {
        Some(dir) => {
            note_inferred_schemas(dir, a.format);
            Catalog::with_dir(dir, a.format)?
        }
        None => Catalog::new(),
    };
    let target = match a.jobmanager {
        Some(jm) => Target::Cluster(jm),
        None => Target::Embedded,
    };
    let mut session = match SqlSession::new(catalog, a.parallelism, config, target) {
        Ok(s) => s,
        Err(SqlError::Query(msg)) => {
            note!("error: {msg}");
            return Ok(ExitCode::from(QUERY_ERROR));
        }
        Err(SqlError::Other(e)) => return Err(e),
    };
    let text = match (&a.file, &a.execute) {
        (Some(f), _) => {
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?
        }
        (None, Some(e)) => e.clone(),
        (None, None) if std::io::stdin().is_terminal() => {
            return fluvia_cli::interactive::run(&mut session);
        }
        (None, None) => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .context("reading statements from standard input")?;
            text
        }
    };
    let statements = fluvia_sql::session::statement::split_statements(&text);
    if statements.is_empty() {
        bail!("no SQL statement given");
    }
    let mut stdout = std::io::stdout().lock();
    let mut printed = false;
    let cancel = fluvia_cli::sql::Cancel::default();
    for sql in &statements {
        let outcome = if a.explain {
            session.explain_or_execute(sql, &cancel)
        } else {
            session.execute(sql, &cancel)
        };
        let outcome = match outcome {
            Ok(o) => o,
            Err(SqlError::Query(msg)) => {
                note!("error: {msg}");
                return Ok(ExitCode::from(QUERY_ERROR));
            }
            Err(SqlError::Other(e)) => return Err(e),
        };
        match outcome {
            Outcome::Message(m) => note!("{m}"),
            Outcome::Plan(p) => {
                use std::io::Write as _;
                write!(stdout, "{p}").context("writing to standard output")?;
            }
            Outcome::Rows(run) => {
                if printed {
                    use std::io::Write as _;
                    writeln!(stdout).context("writing to standard output")?;
                }
                printed = true;
                fluvia_sql::formats::output::write_csv(&mut stdout, &run.batches, &run.schema)?;
                let rows: usize = run.batches.iter().map(|b| b.num_rows()).sum();
                if let (Some(g), Some(st)) = (&run.graph, &run.status) {
                    let shuffled: u64 =
                        fluvia_cli::sql::edge_stats(g, st).iter().map(|e| e.3).sum();
                    note!(
                        "{rows} rows in {:.3} s; {shuffled} bytes exchanged between tasks",
                        run.elapsed.as_secs_f64()
                    );
                    if a.stats {
                        print_stats(g, st);
                    }
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_stats(graph: &fluvia_graph::JobGraph, status: &fluvia_cluster::rpc::JobStatus) {
    let mut total = 0;
    for (from, to, ship, bytes, batches) in fluvia_cli::sql::edge_stats(graph, status) {
        note!("  {ship:<9} {bytes:>12} bytes {batches:>7} batches  {from}  =>  {to}");
        total += bytes;
    }
    note!("  network total: {total} bytes");
}

fn tpcds_command(command: TpcdsCommand) -> Result<ExitCode> {
    match command {
        TpcdsCommand::Gen {
            scale,
            out,
            format,
            threads,
            check,
        } => {
            let started = std::time::Instant::now();
            tpcds::generate(scale, &out, format == TableFormat::Csv, threads)?;
            note!(
                "generated 24 tables at scale {scale} in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            if let Some(expected) = check {
                if format != TableFormat::Parquet {
                    bail!("--check reads Parquet tables");
                }
                let text = std::fs::read_to_string(&expected)
                    .with_context(|| format!("reading {}", expected.display()))?;
                let mut bad = 0;
                for line in text.lines().skip(1) {
                    let Some(table) = line.split(',').next() else {
                        continue;
                    };
                    let got = tpcds::checksum_parquet(&out, table)?.line(table);
                    if got != line {
                        note!("{table}: got {got}, expected {line}");
                        bad += 1;
                    }
                }
                if bad > 0 {
                    bail!("{bad} tables differ from {}", expected.display());
                }
                note!("all tables match {}", expected.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        TpcdsCommand::Run {
            data,
            format,
            queries,
            query,
            check,
            parallelism,
            repeat,
            engine,
            jobmanager,
            conf,
        } => {
            note_inferred_schemas(&data, format);
            let settings = SqlSettings::new(data, format, parallelism, conf.load()?)?;
            let target = match (engine.as_str(), jobmanager) {
                ("fluvia", Some(jm)) => Target::Cluster(jm),
                ("fluvia", None) => Target::Embedded,
                ("datafusion", None) => Target::DataFusion,
                ("datafusion", Some(_)) => bail!("--engine datafusion runs in this process"),
                (other, _) => bail!("unknown engine '{other}': fluvia or datafusion"),
            };
            let numbers: Vec<usize> = if query.is_empty() {
                (1..=99).collect()
            } else {
                query
            };
            let (mut passed, mut failed, mut total_secs) = (0, 0, 0.0);
            println!("query,statement,seconds,rows,result");
            for q in numbers {
                let path = queries.join(format!("q{q}.sql"));
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                for (k, sql) in tpcds::statements(&text).iter().enumerate() {
                    let name = format!("tpcds q{q}.{}", k + 1);
                    let mut times = Vec::new();
                    let mut last = None;
                    for _ in 0..repeat.max(1) {
                        let r = fluvia_cli::sql::run(&settings, sql, &name, &target);
                        if let Ok(run) = &r {
                            times.push(run.elapsed.as_secs_f64());
                        }
                        let stop = r.is_err();
                        last = Some(r);
                        if stop {
                            break;
                        }
                    }
                    times.sort_by(f64::total_cmp);
                    let median = times.get(times.len() / 2).copied().unwrap_or(0.0);
                    let (rows, verdict) = match last {
                        Some(Ok(run)) => {
                            total_secs += median;
                            let rows: usize = run.batches.iter().map(|b| b.num_rows()).sum();
                            let verdict = match &check {
                                None => "ok".to_string(),
                                Some(dir) => {
                                    tpcds::check_answer(dir, q, k + 1, &run.batches, &run.schema)
                                }
                            };
                            (rows, verdict)
                        }
                        Some(Err(e)) => (0, tpcds::error_verdict(q, &e.to_string())),
                        None => (0, "FAIL not run".to_string()),
                    };
                    if verdict.starts_with("FAIL") {
                        failed += 1;
                    } else {
                        passed += 1;
                    }
                    println!("q{q},{},{median:.3},{rows},{verdict}", k + 1);
                }
            }
            println!("# {passed} passed, {failed} failed, {total_secs:.3} s in total");
            Ok(if failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

fn main() -> ExitCode {
    // Before any thread starts: the allocator's thresholds are process-wide.
    fluvia_cluster::allocator::tune();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // By default a log line that cannot be written is reported with
        // `eprintln!`, which panics when stderr is a closed pipe (`2>&1 |
        // head`); a panic on a task or JobManager thread would leave the job
        // waiting for an answer that never comes. Lost log lines are fine.
        .log_internal_errors(false)
        .init();
    let cli = Cli::parse();
    let outcome = match cli.command {
        // A session's statements run one after another on one kept
        // mini-cluster (stopped before the process exits).
        Command::Sql(args) => {
            let outcome = {
                let _warm = fluvia_cluster::minicluster::warm::KeepWarm::new();
                sql_command(args)
            };
            return exit(outcome);
        }
        Command::Tpcds { command } => {
            let outcome = {
                let _warm = fluvia_cluster::minicluster::warm::KeepWarm::new();
                tpcds_command(command)
            };
            return exit(outcome);
        }
        Command::Run {
            jobmanager: None,
            example,
        } => run_embedded(example),
        Command::Run {
            jobmanager: Some(jm),
            example,
        } => run_on_cluster(&jm, example),
        Command::Explain { format, example } => explain(example, format),
        Command::Examples => {
            for (name, about) in examples::EXAMPLES {
                println!("{name:<12} {about}");
            }
            Ok(())
        }
        Command::Config => {
            for (key, default, about) in options::all()
                .into_iter()
                .chain(fluvia_sql::session::options::all())
                .chain(cluster_config::all())
            {
                println!("{key}\n    default: {default}\n    {about}");
            }
            Ok(())
        }
        Command::Jobmanager { conf } => jobmanager(conf),
        Command::Taskmanager {
            jobmanager,
            slots,
            conf,
        } => taskmanager(jobmanager, slots, conf),
        Command::ShuffleService {
            jobmanager,
            dir,
            conf,
        } => shuffle_service(jobmanager, dir, conf),
        Command::List { jobmanager, conf } => list(jobmanager, conf),
        Command::Cancel {
            jobmanager,
            job_id,
            conf,
        } => cancel(jobmanager, job_id, conf),
        Command::Savepoint {
            jobmanager,
            job_id,
            dir,
            conf,
        } => savepoint(jobmanager, job_id, dir, false, false, conf),
        Command::Stop {
            jobmanager,
            savepoint_path,
            drain,
            job_id,
            conf,
        } => savepoint(jobmanager, job_id, savepoint_path, true, drain, conf),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            note!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn exit(outcome: Result<ExitCode>) -> ExitCode {
    match outcome {
        Ok(code) => code,
        Err(e) => {
            note!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn unknown_job_and_mode_are_rejected() {
        assert!(Cli::try_parse_from(["fluvia", "run", "pipeline", "--job", "nope"]).is_err());
        assert!(Cli::try_parse_from(["fluvia", "run", "pipeline", "--mode", "fast"]).is_err());
        assert!(Cli::try_parse_from(["fluvia", "run", "pipeline", "--mode", "batch"]).is_ok());
        assert!(
            Cli::try_parse_from(["fluvia", "taskmanager"]).is_err(),
            "needs --jobmanager"
        );
    }
}

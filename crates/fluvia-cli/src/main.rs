//! `fluvia`: one binary for every role — the JobManager and TaskManager
//! processes, and the client commands that run, explain, list and cancel
//! jobs (on a cluster with `--jobmanager`, else on the embedded runtime).

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Parser, Subcommand};
use fluvia_cli::catalog::{Example, ExampleCatalog};
use fluvia_cli::examples;
use fluvia_cluster::client::ClusterClient;
use fluvia_cluster::config as cluster_config;
use fluvia_cluster::program::ProgramSpec;
use fluvia_core::config::options;
use fluvia_graph::plan;
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
    fluvia_runtime::executor::validate_job(&graph, &env.registry())?;
    let status = block_on(fluvia_cluster::minicluster::run_job(
        &graph.config,
        Arc::new(ExampleCatalog),
        &spec,
        &graph,
    ))??;
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
            jv.parallelism,
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

/// Runs `future` on a fresh async runtime and shuts the runtime down without
/// waiting for background work (servers of an embedded cluster).
fn block_on<T>(future: impl std::future::Future<Output = T>) -> Result<T> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let out = rt.block_on(future);
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    Ok(out)
}

fn run_on_cluster(jobmanager: &str, example: Example) -> Result<()> {
    let spec = program_spec(&example);
    let env = example.environment()?;
    let graph = env.job_graph(example.name())?;
    fluvia_runtime::executor::validate_job(&graph, &env.registry())?;
    let secret = cluster_config::cluster_secret(&graph.config)?;
    let status = block_on(async {
        let mut client = ClusterClient::connect(jobmanager, secret).await?;
        let job_id = client.submit(&spec, &graph).await?;
        note!("Job {job_id} submitted to {jobmanager}");
        client.wait(&job_id).await
    })??;
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
        let handle = fluvia_cluster::jobmanager::start(config, Arc::new(ExampleCatalog)).await?;
        // Scripts and tests read these two lines to find the ports.
        println!("JobManager RPC {}", handle.rpc_address);
        println!("REST http://{}", handle.rest_address);
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

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let outcome = match cli.command {
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
            for (key, default, about) in options::all().into_iter().chain(cluster_config::all()) {
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
        Command::List { jobmanager, conf } => list(jobmanager, conf),
        Command::Cancel {
            jobmanager,
            job_id,
            conf,
        } => cancel(jobmanager, job_id, conf),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
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

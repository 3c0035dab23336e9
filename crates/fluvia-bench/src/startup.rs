//! `fluvia-bench startup`: how long a trivial job takes from the client's
//! call to its end — an upper bound on the time to the first running task —
//! through the library's `env.execute()` and through `fluvia run` (both start
//! the embedded mini-cluster — JobManager and TaskManagers — for the job),
//! and on an already running cluster.

use anyhow::Result;
use fluvia_cli::catalog::{Example, ExampleCatalog};
use fluvia_cluster::client::ClusterClient;
use fluvia_cluster::program::{ProgramCatalog, ProgramSpec};
use fluvia_core::Configuration;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// Runs per case; the median is reported.
    #[arg(long, default_value_t = 10)]
    runs: usize,
}

fn spec() -> ProgramSpec {
    ProgramSpec {
        name: "pipeline".into(),
        args: ["--rows", "1", "--job", "count", "-p", "2"]
            .map(String::from)
            .to_vec(),
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

pub fn run(args: Args) -> Result<()> {
    let runs = args.runs.max(1);
    let example = Example::parse_spec(&spec())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;

    let mut local = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let env = example.environment()?;
        env.execute("pipeline")?;
        local.push(t.elapsed());
    }

    let mut mini = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let env = example.environment()?;
        let graph = env.job_graph("pipeline")?;
        let status = rt.block_on(fluvia_cluster::minicluster::run_job(
            &graph.config,
            Arc::new(ExampleCatalog),
            &spec(),
            &graph,
        ))?;
        anyhow::ensure!(status.state == "FINISHED", "{}", status.error);
        mini.push(t.elapsed());
    }

    let mut warm = Vec::new();
    rt.block_on(async {
        let mut c = Configuration::new();
        c.set("jobmanager.rpc.port", "0")
            .set("rest.port", "0")
            .set("heartbeat.interval", "100 ms");
        let jm = fluvia_cluster::jobmanager::start(c.clone()).await?;
        let address = jm.rpc_address.to_string();
        for _ in 0..2 {
            let (a, mut c) = (address.clone(), c.clone());
            c.set("taskmanager.numberOfTaskSlots", "2");
            tokio::spawn(async move {
                fluvia_cluster::taskmanager::run(&a, c, Arc::new(ExampleCatalog)).await
            });
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut client = ClusterClient::connect(&address, None).await?;
        let fingerprint = ExampleCatalog.fingerprint();
        for _ in 0..runs {
            let t = Instant::now();
            let env = example.environment()?;
            let graph = env.job_graph("pipeline")?;
            let id = client.submit(&spec(), &graph, &fingerprint).await?;
            let s = client.wait(&id).await?;
            anyhow::ensure!(s.state == "FINISHED", "{}", s.error);
            warm.push(t.elapsed());
        }
        anyhow::Ok(())
    })?;

    println!("trivial job (`pipeline --rows 1 --job count -p 2`), {runs} runs, median\n");
    println!("| path | median ms |");
    println!("|---|---|");
    println!(
        "| library `env.execute()` (embedded mini-cluster) | {:.1} |",
        median(local).as_secs_f64() * 1e3
    );
    println!(
        "| embedded mini-cluster, started for the job (`fluvia run`) | {:.1} |",
        median(mini).as_secs_f64() * 1e3
    );
    println!(
        "| running cluster, 2 TaskManagers (`fluvia run --jobmanager`) | {:.1} |",
        median(warm).as_secs_f64() * 1e3
    );
    Ok(())
}

//! A skewed join under the adaptive batch scheduler, skew splitting off and
//! on in one run: one key holds half the rows of the probe side. Prints,
//! per run, the parallelism of the join vertex, its slowest and median
//! subtask times and their ratio (the goal: at most 2 with splitting on),
//! and checks that both runs give the same answer.

use anyhow::{Context, Result, bail};
use clap::Args as ClapArgs;
use fluvia_cli::sql::{SqlSettings, Target, run};
use fluvia_core::Configuration;
use fluvia_sql::session::TableFormat;
use std::fmt::Write as _;
use std::path::Path;

#[derive(ClapArgs)]
pub struct Args {
    /// Rows of the probe side (half of them carry the hot key).
    #[arg(long, default_value_t = 4_000_000)]
    rows: usize,
    /// Distinct keys of the build side.
    #[arg(long, default_value_t = 200_000)]
    keys: usize,
    /// Scan parallelism (the join's is decided at runtime): the producer
    /// partitions a hot subpartition can be split by.
    #[arg(short, long, default_value_t = 4)]
    parallelism: usize,
    #[arg(long, default_value = "4mb")]
    avg_data_volume_per_task: String,
}

const QUERY: &str = "select count(*) as n, sum(p.v + b.w) as s \
                     from probe p join build b on p.k = b.k";

fn write_tables(dir: &Path, rows: usize, keys: usize) -> Result<()> {
    let mut state: u64 = 0x853c_49e6_748f_ea9b;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for (table, n) in [("probe", rows), ("build", keys)] {
        std::fs::create_dir_all(dir.join(table))?;
        let mut text = String::with_capacity(n * 16);
        text.push_str(if table == "probe" { "k,v\n" } else { "k,w\n" });
        for i in 0..n {
            let key = match table {
                "probe" if i % 2 == 0 => 0,
                "probe" => (next() % keys as u64) as usize,
                _ => i,
            };
            writeln!(text, "{key},{}", next() % 1000)?;
        }
        std::fs::write(dir.join(table).join(format!("{table}.csv")), text)?;
    }
    Ok(())
}

struct Outcome {
    answer: String,
    secs: f64,
    parallelism: usize,
    slowest_ms: f64,
    median_ms: f64,
}

fn measure(dir: &Path, a: &Args, strategy: &str) -> Result<Outcome> {
    let mut config = Configuration::new();
    config.set("parallelism.default", a.parallelism.to_string());
    config.set(
        "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task",
        a.avg_data_volume_per_task.clone(),
    );
    config.set("table.optimizer.join.broadcast-threshold", "0");
    config.set(
        "table.optimizer.skewed-join-optimization.strategy",
        strategy,
    );
    config.set(
        "table.optimizer.skewed-join-optimization.skewed-threshold",
        "1mb",
    );
    let mut settings = SqlSettings::new(dir.to_path_buf(), TableFormat::Csv, None, config)?;
    // The join's subtasks' times come from the job's details.
    settings.job_details = true;
    let r = match run(&settings, QUERY, "skewed join", &Target::Embedded) {
        Ok(r) => r,
        Err(e) => bail!("{e}"),
    };
    let status = r.status.context("no job status")?;
    let details: serde_json::Value = serde_json::from_str(&status.details_json)?;
    let join = details["vertices"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"].as_str().is_some_and(|n| n.contains("HashJoin")))
        .context("no join vertex")?;
    let mut times: Vec<f64> = join["subtasks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| {
            let attempts = s["attempts"].as_array()?;
            attempts.last()?["duration"].as_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let mut csv = Vec::new();
    fluvia_sql::formats::output::write_csv(&mut csv, &r.batches, &r.schema)?;
    let answer = String::from_utf8_lossy(&csv).to_string();
    Ok(Outcome {
        answer,
        secs: r.elapsed.as_secs_f64(),
        parallelism: times.len(),
        slowest_ms: times.last().copied().unwrap_or(0.0),
        median_ms: times.get(times.len() / 2).copied().unwrap_or(0.0),
    })
}

pub fn run_bench(a: Args) -> Result<()> {
    let dir = tempfile::tempdir()?;
    write_tables(dir.path(), a.rows, a.keys)?;
    println!(
        "skewed join: {} probe rows (half of them one key), {} build keys, scans at p{}, \
         avg-data-volume-per-task {}",
        a.rows, a.keys, a.parallelism, a.avg_data_volume_per_task
    );
    println!("| skew splitting | join subtasks | slowest | median | slowest / median | query |");
    println!("|---|---|---|---|---|---|");
    let mut answers = Vec::new();
    for strategy in ["NONE", "AUTO"] {
        let o = measure(dir.path(), &a, strategy)?;
        println!(
            "| {} | {} | {:.0} ms | {:.0} ms | {:.2} | {:.2} s |",
            if strategy == "NONE" { "off" } else { "on" },
            o.parallelism,
            o.slowest_ms,
            o.median_ms,
            o.slowest_ms / o.median_ms.max(1.0),
            o.secs
        );
        answers.push(o.answer);
    }
    if answers[0] != answers[1] {
        bail!("the answers differ:\n{}\n{}", answers[0], answers[1]);
    }
    println!("same answer either way:\n{}", answers[0]);
    Ok(())
}

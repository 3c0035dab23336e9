//! TPC-DS side by side in one run: DataFusion alone in this process with
//! `p` target partitions (the baseline), Fluvia on the embedded
//! mini-cluster at parallelism `p`, and Fluvia with multiple-input off.
//! Each cell is the median of `--repeat` runs; totals are sums of medians.

use anyhow::{Result, bail};
use clap::Args as ClapArgs;
use fluvia_cli::sql::{QueryRun, SqlSettings, Target, edge_stats, run};
use fluvia_core::Configuration;
use fluvia_sql::session::TableFormat;
use fluvia_sql::tpcds::statements;
use std::path::PathBuf;

#[derive(ClapArgs)]
pub struct Args {
    /// Table directory (`fluvia tpcds gen --scale 1 --out DIR`).
    #[arg(long)]
    data: PathBuf,
    #[arg(long, default_value = "tpcds/queries")]
    queries: PathBuf,
    /// Only these queries (default: all 99).
    #[arg(long = "query")]
    query: Vec<usize>,
    #[arg(short, long, default_value_t = 2)]
    parallelism: usize,
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    #[arg(long, default_value = "parquet")]
    format: String,
}

struct Cell {
    secs: f64,
    network_bytes: u64,
}

fn measure(s: &SqlSettings, sql: &str, target: &Target, repeat: usize) -> Result<Cell> {
    let mut times = Vec::new();
    let mut bytes = 0;
    for _ in 0..repeat.max(1) {
        let r: QueryRun = match run(s, sql, "bench", target) {
            Ok(r) => r,
            Err(e) => bail!("{e}"),
        };
        times.push(r.elapsed.as_secs_f64());
        if let (Some(g), Some(st)) = (&r.graph, &r.status) {
            bytes = edge_stats(g, st).iter().map(|e| e.3).sum();
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(Cell {
        secs: times[times.len() / 2],
        network_bytes: bytes,
    })
}

pub fn run_suite(a: Args) -> Result<()> {
    let format = TableFormat::parse(&a.format)?;
    let settings = |multiple_input: bool| {
        let mut config = Configuration::new();
        config.set(
            "table.optimizer.multiple-input-enabled",
            multiple_input.to_string(),
        );
        SqlSettings {
            tables: a.data.clone(),
            format,
            parallelism: a.parallelism,
            adaptive: false,
            config,
        }
    };
    let (on, off) = (settings(true), settings(false));
    // No -p: scans at p, every later stage decided from the data.
    let adaptive = SqlSettings {
        adaptive: true,
        ..on.clone()
    };
    let numbers: Vec<usize> = if a.query.is_empty() {
        (1..=99).collect()
    } else {
        a.query.clone()
    };
    println!(
        "{:<8} {:>10} {:>10} {:>7} {:>12} {:>14} {:>14} {:>10} {:>7}",
        "query",
        "datafusion",
        "fluvia",
        "ratio",
        "fluvia MI-off",
        "net bytes MI",
        "net MI-off",
        "adaptive",
        "ratio"
    );
    let (mut df_total, mut fl_total, mut off_total, mut ad_total) = (0.0, 0.0, 0.0, 0.0);
    let (mut bytes_on, mut bytes_off) = (0u64, 0u64);
    let mut failed = Vec::new();
    for q in numbers {
        let text = std::fs::read_to_string(a.queries.join(format!("q{q}.sql")))?;
        for (k, sql) in statements(&text).iter().enumerate() {
            let name = format!("q{q}.{}", k + 1);
            let cells = (
                measure(&on, sql, &Target::DataFusion, a.repeat),
                measure(&on, sql, &Target::Embedded, a.repeat),
                measure(&off, sql, &Target::Embedded, a.repeat),
                measure(&adaptive, sql, &Target::Embedded, a.repeat),
            );
            let (Ok(d), Ok(f), Ok(o), Ok(ad)) = cells else {
                failed.push(name);
                continue;
            };
            df_total += d.secs;
            fl_total += f.secs;
            off_total += o.secs;
            ad_total += ad.secs;
            bytes_on += f.network_bytes;
            bytes_off += o.network_bytes;
            println!(
                "{name:<8} {:>10.3} {:>10.3} {:>7.2} {:>12.3} {:>14} {:>14} {:>10.3} {:>7.2}",
                d.secs,
                f.secs,
                f.secs / d.secs.max(1e-9),
                o.secs,
                f.network_bytes,
                o.network_bytes,
                ad.secs,
                ad.secs / d.secs.max(1e-9)
            );
        }
    }
    println!(
        "{:<8} {df_total:>10.3} {fl_total:>10.3} {:>7.2} {off_total:>12.3} {bytes_on:>14} {bytes_off:>14} {ad_total:>10.3} {:>7.2}",
        "total",
        fl_total / df_total.max(1e-9),
        ad_total / df_total.max(1e-9)
    );
    if !failed.is_empty() {
        println!("not measured (an engine failed): {}", failed.join(" "));
    }
    Ok(())
}

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
    /// Which columns to run: datafusion, fluvia, mi-off, adaptive
    /// (comma-separated; default all).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "datafusion,fluvia,mi-off,adaptive"
    )]
    variants: Vec<String>,
    /// Run this statement instead of the TPC-DS queries (for example a scan
    /// to measure read throughput).
    #[arg(long)]
    sql: Option<String>,
    /// A configuration key for every variant, as key=value (repeatable).
    #[arg(short = 'D', value_name = "KEY=VALUE")]
    dynamic: Vec<String>,
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
    let base = {
        let mut c = Configuration::new();
        c.apply_dynamic(&a.dynamic)?;
        c
    };
    let catalog = fluvia_sql::catalog::Catalog::with_dir(&a.data, format)?;
    let settings = |multiple_input: bool| {
        let mut config = base.clone();
        config.set(
            "table.optimizer.multiple-input-enabled",
            multiple_input.to_string(),
        );
        SqlSettings {
            catalog: catalog.clone(),
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
    for v in &a.variants {
        if !["datafusion", "fluvia", "mi-off", "adaptive"].contains(&v.as_str()) {
            bail!("unknown variant '{v}': datafusion, fluvia, mi-off or adaptive");
        }
    }
    let wants = |v: &str| a.variants.iter().any(|x| x == v);
    let numbers: Vec<usize> = if a.query.is_empty() {
        (1..=99).collect()
    } else {
        a.query.clone()
    };
    let mut work: Vec<(String, String)> = Vec::new();
    match &a.sql {
        Some(sql) => work.push(("sql".into(), sql.clone())),
        None => {
            for q in numbers {
                let text = std::fs::read_to_string(a.queries.join(format!("q{q}.sql")))?;
                for (k, sql) in statements(&text).iter().enumerate() {
                    work.push((format!("q{q}.{}", k + 1), sql.clone()));
                }
            }
        }
    }
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
    let mut only_fluvia = Vec::new();
    let skipped = || {
        Ok(Cell {
            secs: f64::NAN,
            network_bytes: 0,
        })
    };
    for (name, sql) in work {
        let cell = |v: &str, s: &SqlSettings, t: &Target| {
            if wants(v) {
                measure(s, &sql, t, a.repeat)
            } else {
                skipped()
            }
        };
        let cells = (
            cell("datafusion", &on, &Target::DataFusion),
            cell("fluvia", &on, &Target::Embedded),
            cell("mi-off", &off, &Target::Embedded),
            cell("adaptive", &adaptive, &Target::Embedded),
        );
        let (d, f, o, ad) = match cells {
            (Ok(d), Ok(f), Ok(o), Ok(ad)) => (d, f, o, ad),
            (Err(_), Ok(f), Ok(_), Ok(_)) => {
                println!("{name:<8} {:>10} {:>10.3}", "failed", f.secs);
                only_fluvia.push(name);
                continue;
            }
            _ => {
                failed.push(name);
                continue;
            }
        };
        let add = |total: &mut f64, secs: f64| {
            if secs.is_finite() {
                *total += secs;
            }
        };
        add(&mut df_total, d.secs);
        add(&mut fl_total, f.secs);
        add(&mut off_total, o.secs);
        add(&mut ad_total, ad.secs);
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
    println!(
        "{:<8} {df_total:>10.3} {fl_total:>10.3} {:>7.2} {off_total:>12.3} {bytes_on:>14} {bytes_off:>14} {ad_total:>10.3} {:>7.2}",
        "total",
        fl_total / df_total.max(1e-9),
        ad_total / df_total.max(1e-9)
    );
    if !only_fluvia.is_empty() {
        println!(
            "only Fluvia completed (DataFusion failed; not in the totals): {}",
            only_fluvia.join(" ")
        );
    }
    if !failed.is_empty() {
        println!(
            "not measured (a Fluvia variant failed): {}",
            failed.join(" ")
        );
    }
    Ok(())
}

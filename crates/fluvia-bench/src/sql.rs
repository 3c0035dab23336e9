//! TPC-DS side by side in one run: DataFusion alone in this process with
//! `p` target partitions (the baseline), Fluvia on the embedded
//! mini-cluster at parallelism `p`, Fluvia with multiple-input off,
//! Fluvia with filtered build sides broadcast from their own tasks, and
//! Fluvia with blocking exchanges, Fluvia reading CSV with DataFusion's
//! reader, and Fluvia without source reuse.
//! Each cell is the median of `--repeat` runs; totals are sums of medians.

use anyhow::{Result, bail};
use clap::Args as ClapArgs;
use fluvia_cli::sql::{QueryRun, SqlSettings, Target, edge_stats, run};
use fluvia_core::Configuration;
use fluvia_sql::session::TableFormat;
use fluvia_tpcds::statements;
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
    /// Which columns to run: datafusion, fluvia, mi-off, adaptive,
    /// build-broadcast, blocking, df-reader (Fluvia reading CSV with
    /// DataFusion's reader), no-reuse (source reuse off), drain (inputs a
    /// task stops needing read to the end instead of released), no-cluster
    /// (hash join build sides not clustered by key), no-rf (no runtime
    /// filters across tasks), byte-ranges (Parquet scans on DataFusion's
    /// byte ranges, not split on row groups), sq-on-top (scalar subquery
    /// joins left on top of the FROM list), eager-sources (every scan
    /// started at deployment, none on its consumer's first poll)
    /// (comma-separated; default all but df-reader, no-reuse, drain,
    /// no-cluster, no-rf, byte-ranges, sq-on-top and eager-sources).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "datafusion,fluvia,mi-off,adaptive,build-broadcast,blocking"
    )]
    variants: Vec<String>,
    /// Run this statement instead of the TPC-DS queries (for example a scan
    /// to measure read throughput).
    #[arg(long)]
    sql: Option<String>,
    /// A configuration key for every variant, as key=value (repeatable).
    #[arg(short = 'D', value_name = "KEY=VALUE")]
    dynamic: Vec<String>,
    /// Adds a DuckDB column: this Python, with the `duckdb` package from
    /// PyPI, runs each statement with 2 threads over views of the same
    /// Parquet files (as `../shared/anchors/` runs it).
    #[arg(long, value_name = "PYTHON")]
    duckdb: Option<PathBuf>,
}

/// The DuckDB side: a Python child that keeps one connection and answers
/// one JSON line per statement with the median of its runs.
const DUCKDB_SCRIPT: &str = r#"
import duckdb, json, os, statistics, sys, time
data = sys.argv[1]
con = duckdb.connect()
con.execute("SET threads=2")
for t in sorted(os.listdir(data)):
    if os.path.isdir(os.path.join(data, t)):
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{data}/{t}/*.parquet')")
print(json.dumps({"version": duckdb.__version__}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    try:
        times = []
        for _ in range(req["repeat"]):
            t0 = time.perf_counter()
            con.sql(req["sql"]).fetchall()
            times.append(time.perf_counter() - t0)
        print(json.dumps({"secs": statistics.median(times)}), flush=True)
    except Exception as e:
        print(json.dumps({"error": str(e).splitlines()[0][:120]}), flush=True)
"#;

struct DuckDb {
    child: std::process::Child,
    input: std::process::ChildStdin,
    output: std::io::BufReader<std::process::ChildStdout>,
    _script: tempfile::NamedTempFile,
}

impl DuckDb {
    fn start(python: &std::path::Path, data: &std::path::Path) -> Result<(DuckDb, String)> {
        use std::io::{BufRead, Write};
        let mut script = tempfile::NamedTempFile::new()?;
        script.write_all(DUCKDB_SCRIPT.as_bytes())?;
        let mut child = std::process::Command::new(python)
            .arg(script.path())
            .arg(data)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {}: {e}", python.display()))?;
        let (Some(input), Some(output)) = (child.stdin.take(), child.stdout.take()) else {
            bail!("no pipes to {}", python.display());
        };
        let mut output = std::io::BufReader::new(output);
        let mut hello = String::new();
        output.read_line(&mut hello)?;
        let version: serde_json::Value = serde_json::from_str(&hello).map_err(|_| {
            anyhow::anyhow!(
                "{} could not start DuckDB (pip install duckdb into it)",
                python.display()
            )
        })?;
        let version = version["version"].as_str().unwrap_or("?").to_string();
        Ok((
            DuckDb {
                child,
                input,
                output,
                _script: script,
            },
            version,
        ))
    }

    /// The median of `repeat` runs of `sql`, or DuckDB's error.
    fn measure(&mut self, sql: &str, repeat: usize) -> Result<f64> {
        use std::io::{BufRead, Write};
        let req = serde_json::json!({"sql": sql, "repeat": repeat.max(1)});
        writeln!(self.input, "{req}")?;
        self.input.flush()?;
        let mut line = String::new();
        if self.output.read_line(&mut line)? == 0 {
            bail!("DuckDB's process ended");
        }
        let v: serde_json::Value = serde_json::from_str(&line)?;
        match (v["secs"].as_f64(), v["error"].as_str()) {
            (Some(secs), _) => Ok(secs),
            (None, Some(e)) => bail!("{e}"),
            (None, None) => bail!("DuckDB answered {line}"),
        }
    }
}

impl Drop for DuckDb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
    // Fluvia's statements run one after another on one kept mini-cluster,
    // as in a `fluvia sql` session.
    let _warm = fluvia_cluster::minicluster::warm::KeepWarm::new();
    let format = TableFormat::parse(&a.format)?;
    let base = {
        let mut c = Configuration::new();
        c.apply_dynamic(&a.dynamic)?;
        c
    };
    let catalog = fluvia_sql::session::catalog::Catalog::with_dir(&a.data, format)?;
    let settings = |multiple_input: bool, build_in_task: bool| {
        let mut config = base.clone();
        config.set(
            "table.optimizer.multiple-input-enabled",
            multiple_input.to_string(),
        );
        config.set(
            fluvia_sql::session::options::FILTERED_BUILD_IN_TASK.key,
            build_in_task.to_string(),
        );
        SqlSettings {
            catalog: catalog.clone(),
            parallelism: a.parallelism,
            adaptive: false,
            config,
            job_details: false,
        }
    };
    let (on, off) = (settings(true, true), settings(false, true));
    let build_broadcast = settings(true, false);
    // Fluvia as `on`, with one key changed.
    let on_with = |key: &str, value: &str| {
        let mut s = settings(true, true);
        s.config.set(key, value.to_string());
        s
    };
    use fluvia_sql::session::options;
    // Fluvia with one key changed: a column each, after the others.
    let one_key: Vec<(&str, SqlSettings)> = [
        (
            "blocking",
            options::BATCH_SHUFFLE_MODE.key,
            "ALL_EXCHANGES_BLOCKING",
        ),
        ("df-reader", options::CSV_READER.key, "datafusion"),
        ("no-reuse", options::REUSE_SOURCE.key, "false"),
        ("drain", options::RELEASE_UNREAD_INPUTS.key, "false"),
        (
            "eager-sources",
            options::SOURCE_START_ON_DEMAND.key,
            "false",
        ),
        ("no-cluster", options::CLUSTER_BUILD_SIDE.key, "false"),
        ("no-read-once", options::READ_BUILD_SIDE_ONCE.key, "false"),
        ("no-rf", options::RUNTIME_FILTER_ENABLED.key, "false"),
        (
            "byte-ranges",
            options::SPLIT_SCANS_ON_ROW_GROUPS.key,
            "false",
        ),
        (
            "sq-on-top",
            options::SCALAR_SUBQUERY_JOIN_PUSHDOWN.key,
            "false",
        ),
    ]
    .into_iter()
    .map(|(name, key, value)| (name, on_with(key, value)))
    .collect();
    // No -p: scans at p, every later stage decided from the data.
    let adaptive = SqlSettings {
        adaptive: true,
        ..on.clone()
    };
    let known: Vec<&str> = [
        "datafusion",
        "fluvia",
        "mi-off",
        "adaptive",
        "build-broadcast",
    ]
    .into_iter()
    .chain(one_key.iter().map(|(n, _)| *n))
    .collect();
    for v in &a.variants {
        if !known.contains(&v.as_str()) {
            bail!("unknown variant '{v}': {}", known.join(", "));
        }
    }
    let wants = |v: &str| a.variants.iter().any(|x| x == v);
    let mut duck = match &a.duckdb {
        Some(python) => {
            if format != TableFormat::Parquet {
                bail!("the DuckDB column reads Parquet tables only");
            }
            let (d, version) = DuckDb::start(python, &a.data)?;
            println!("DuckDB {version} (Python), 2 threads, same Parquet files");
            Some(d)
        }
        None => None,
    };
    let (mut duck_total, mut df_duck_total, mut fl_duck_total) = (0.0, 0.0, 0.0);
    let mut duck_failed = Vec::new();
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
    let extra_header: String = one_key.iter().map(|(n, _)| format!(" {n:>9}")).collect();
    println!(
        "{:<8} {:>10} {:>10} {:>7} {:>12} {:>14} {:>14} {:>10} {:>7} {:>15}{extra_header}",
        "query",
        "datafusion",
        "fluvia",
        "ratio",
        "fluvia MI-off",
        "net bytes MI",
        "net MI-off",
        "adaptive",
        "ratio",
        "build-broadcast",
    );
    if duck.is_some() {
        println!("(then per line: duckdb seconds, fluvia / duckdb)");
    }
    let (mut df_total, mut fl_total, mut off_total, mut ad_total) = (0.0, 0.0, 0.0, 0.0);
    let mut bb_total = 0.0;
    let mut extra_totals = vec![0.0; one_key.len()];
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
            cell("build-broadcast", &build_broadcast, &Target::Embedded),
            one_key
                .iter()
                .map(|(v, s)| cell(v, s, &Target::Embedded))
                .collect::<Result<Vec<Cell>>>(),
        );
        let (d, f, o, ad, bb, extra) = match cells {
            (Ok(d), Ok(f), Ok(o), Ok(ad), Ok(bb), Ok(extra)) => (d, f, o, ad, bb, extra),
            (Err(_), Ok(f), Ok(_), Ok(_), Ok(_), Ok(_)) => {
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
        add(&mut bb_total, bb.secs);
        for (total, c) in extra_totals.iter_mut().zip(&extra) {
            add(total, c.secs);
        }
        bytes_on += f.network_bytes;
        bytes_off += o.network_bytes;
        let extra_cells: String = extra.iter().map(|c| format!(" {:>9.3}", c.secs)).collect();
        println!(
            "{name:<8} {:>10.3} {:>10.3} {:>7.2} {:>12.3} {:>14} {:>14} {:>10.3} {:>7.2} {:>15.3}{extra_cells}",
            d.secs,
            f.secs,
            f.secs / d.secs.max(1e-9),
            o.secs,
            f.network_bytes,
            o.network_bytes,
            ad.secs,
            ad.secs / d.secs.max(1e-9),
            bb.secs,
        );
        if let Some(duck) = duck.as_mut() {
            match duck.measure(&sql, a.repeat) {
                Ok(secs) => {
                    duck_total += secs;
                    df_duck_total += d.secs;
                    fl_duck_total += f.secs;
                    println!(
                        "{:<8} duckdb {secs:.3} s, fluvia / duckdb {:.2}",
                        "",
                        f.secs / secs.max(1e-9)
                    );
                }
                Err(e) => {
                    println!("{:<8} duckdb failed: {e}", "");
                    duck_failed.push(name.clone());
                }
            }
        }
    }
    let extra_totals: String = extra_totals.iter().map(|t| format!(" {t:>9.3}")).collect();
    println!(
        "{:<8} {df_total:>10.3} {fl_total:>10.3} {:>7.2} {off_total:>12.3} {bytes_on:>14} {bytes_off:>14} {ad_total:>10.3} {:>7.2} {bb_total:>15.3}{extra_totals}",
        "total",
        fl_total / df_total.max(1e-9),
        ad_total / df_total.max(1e-9)
    );
    if duck.is_some() {
        println!(
            "over the statements DuckDB completed: duckdb {duck_total:.3} s, datafusion {df_duck_total:.3} s, fluvia {fl_duck_total:.3} s ({:.2} of duckdb); duckdb failed: {}",
            fl_duck_total / duck_total.max(1e-9),
            if duck_failed.is_empty() {
                "none".to_string()
            } else {
                duck_failed.join(" ")
            }
        );
    }
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

//! `fluvia-bench checkpoints`: what checkpoints cost a running job, side by
//! side in one run.
//!
//! 1. The keyed running count of `fluvia run pipeline --job count` (1,000
//!    keys) with checkpoints off and every second, at p1 and p2: rows/s and
//!    their ratio (the goal is within 5 %).
//! 2. A keyed count over N distinct keys (1 M and 10 M by default) of
//!    max(2 N, `--rows`) records, with a checkpoint every second: how long a
//!    checkpoint takes and how large it is as the state grows.
//!
//! Each case runs `--runs` times and reports the median. Run it with
//! `cargo run --release -p fluvia-bench -- checkpoints` and copy the tables
//! into BENCHMARKS.md.

use anyhow::{Context, Result};
use fluvia_cli::examples::pipeline::{self, PipelineJob};
use fluvia_core::{Configuration, RuntimeMode};
use fluvia_datastream::StreamExecutionEnvironment;
use fluvia_datastream::prelude::*;
use fluvia_runtime::result::CheckpointSummary;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Rows of the running-count job.
    #[arg(long, default_value_t = 50_000_000)]
    rows: u64,
    /// Distinct keys of the state-size cases.
    #[arg(long, value_delimiter = ',', default_values_t = [1_000_000u64, 10_000_000])]
    keys: Vec<u64>,
    /// Runs per case; the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

/// An environment for a streaming job, checkpointing every `interval`.
fn env(
    parallelism: usize,
    interval: Option<Duration>,
    dir: &std::path::Path,
) -> Result<StreamExecutionEnvironment> {
    let mut config = Configuration::new();
    config.set("execution.checkpointing.dir", dir.display().to_string());
    if let Some(i) = interval {
        config.set(
            "execution.checkpointing.interval",
            format!("{} ms", i.as_millis()),
        );
    }
    let env = StreamExecutionEnvironment::with_config(config)?;
    env.set_parallelism(parallelism)
        .set_runtime_mode(RuntimeMode::Streaming);
    Ok(env)
}

/// Median of the runs of `job`: (seconds, its checkpoints).
fn median(
    runs: usize,
    mut job: impl FnMut() -> Result<(Duration, Option<CheckpointSummary>)>,
) -> Result<(f64, Option<CheckpointSummary>)> {
    let mut all = Vec::new();
    for _ in 0..runs.max(1) {
        all.push(job()?);
    }
    all.sort_by_key(|(d, _)| *d);
    let (d, c) = all.swap_remove(all.len() / 2);
    Ok((d.as_secs_f64(), c))
}

/// Bytes as MB, or KB below one MB.
fn size(bytes: u64) -> String {
    if bytes >= 1_000_000 {
        format!("{:.1} MB", bytes as f64 / 1e6)
    } else {
        format!("{:.1} KB", bytes as f64 / 1e3)
    }
}

fn describe(c: &Option<CheckpointSummary>) -> String {
    match c {
        Some(c) if c.completed > 0 => format!(
            "{} completed, {}/{}/{} ms, {}",
            c.completed,
            c.duration_ms.0,
            c.duration_ms.1,
            c.duration_ms.2,
            size(c.last_state_size)
        ),
        Some(_) => "none completed".to_string(),
        None => "off".to_string(),
    }
}

pub fn run(args: Args) -> Result<()> {
    let dir = tempfile::tempdir().context("a checkpoint directory")?;
    println!(
        "(1) keyed running count, {} rows, runs per case: {} (median)\n",
        args.rows, args.runs
    );
    println!("| case | median s | M rows/s | checkpoints (min/avg/max) | vs off |");
    println!("|---|---|---|---|---|");
    for p in [1, 2] {
        let mut off_rate = None;
        for interval in [None, Some(Duration::from_secs(1))] {
            let (secs, checkpoints) = median(args.runs, || {
                let env = env(p, interval, dir.path())?;
                pipeline::build(&env, args.rows, PipelineJob::Count);
                let r = env.execute("pipeline")?;
                Ok((r.duration, r.checkpoints))
            })?;
            let rate = args.rows as f64 / secs;
            let vs_off = off_rate.map_or(String::new(), |o: f64| format!("{:.3}", rate / o));
            off_rate.get_or_insert(rate);
            println!(
                "| p{p}, checkpoints {} | {secs:.3} | {:.2} | {} | {vs_off} |",
                if interval.is_some() {
                    "every 1 s"
                } else {
                    "off"
                },
                rate / 1e6,
                describe(if interval.is_some() {
                    &checkpoints
                } else {
                    &None
                }),
            );
        }
    }

    println!(
        "\n(2) checkpoint duration and size vs state size (keyed count of max(2 N, {}) \
         records, p1, every 1 s)\n",
        args.rows
    );
    println!(
        "| distinct keys | job s | checkpoints | min ms | avg ms | max ms | last state size |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &keys in &args.keys {
        let (secs, checkpoints) = median(args.runs, || {
            let env = env(1, Some(Duration::from_secs(1)), dir.path())?;
            env.from_generator((keys * 2).max(args.rows), move |i| (i % keys, 1u64))
                .key_by(|(k, _): &(u64, u64)| *k)
                .process(
                    |ctx: &mut KeyedContext<'_, u64, u64>, _r: (u64, u64), out| {
                        let count = ctx.state.get_or_insert(0);
                        *count += 1;
                        out.collect(*count);
                        Ok(())
                    },
                )
                .name("Count")
                .discard();
            let r = env.execute("state size")?;
            Ok((r.duration, r.checkpoints))
        })?;
        let c = checkpoints.unwrap_or_default();
        println!(
            "| {keys} | {secs:.2} | {} | {} | {} | {} | {} |",
            c.completed,
            c.duration_ms.0,
            c.duration_ms.1,
            c.duration_ms.2,
            size(c.last_state_size)
        );
    }
    Ok(())
}

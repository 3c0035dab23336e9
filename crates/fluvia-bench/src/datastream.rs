//! `fluvia-bench datastream`: the DataStream throughput benchmarks, side by
//! side in one run. It mirrors the jobs timed on Flink 2.3 (see BENCHMARKS.md):
//!
//! 1. `filter(c < 50)` → `map((a, c, b + d))` → discard, chained, against a
//!    hand-written loop doing the same work and against the same job with
//!    chaining disabled (every operator its own task, records serialised
//!    between them);
//! 2. `key_by(d % 1000)` → running count → discard, across a HASH exchange.
//!
//! Each case runs `--runs` times; the median wall time (job submission to
//! finish, including task start-up) is reported as rows/s. Run it with
//! `cargo run --release -p fluvia-bench -- datastream --rows 50000000` and copy the table
//! into BENCHMARKS.md.

use anyhow::Result;
use fluvia_cli::examples::pipeline::{self, PipelineJob};
use fluvia_core::RuntimeMode;
use fluvia_datastream::StreamExecutionEnvironment;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// Rows generated per run.
    #[arg(long, default_value_t = 50_000_000)]
    rows: u64,
    /// Runs per case; the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

struct Case {
    name: String,
    flink_rows_per_sec: Option<f64>,
    run: Box<dyn Fn(u64) -> Result<Duration>>,
}

fn engine(
    job: PipelineJob,
    parallelism: usize,
    chaining: bool,
    object_reuse: bool,
) -> Box<dyn Fn(u64) -> Result<Duration>> {
    Box::new(move |rows| {
        let env = StreamExecutionEnvironment::new();
        env.set_parallelism(parallelism)
            .set_runtime_mode(RuntimeMode::Streaming);
        if !chaining {
            env.disable_operator_chaining();
        }
        if object_reuse {
            env.enable_object_reuse();
        }
        pipeline::build(&env, rows, job);
        Ok(env.execute("pipeline")?.duration)
    })
}

pub fn run(args: Args) -> Result<()> {
    let cases = vec![
        Case {
            name: "(1) hand-written loop, 1 thread".into(),
            flink_rows_per_sec: None,
            run: Box::new(|rows| {
                let t = Instant::now();
                std::hint::black_box(pipeline::hand_written_filter(rows));
                Ok(t.elapsed())
            }),
        },
        Case {
            name: "(1) filter+map, chained, p1".into(),
            flink_rows_per_sec: Some(4.42e6),
            run: engine(PipelineJob::Filter, 1, true, false),
        },
        Case {
            name: "(1) filter+map, chained, object reuse, p1".into(),
            flink_rows_per_sec: None,
            run: engine(PipelineJob::Filter, 1, true, true),
        },
        Case {
            name: "(1) filter+map, chaining disabled, p1".into(),
            flink_rows_per_sec: None,
            run: engine(PipelineJob::Filter, 1, false, false),
        },
        Case {
            name: "(1) filter+map, chained, p2".into(),
            flink_rows_per_sec: Some(7.52e6),
            run: engine(PipelineJob::Filter, 2, true, false),
        },
        Case {
            name: "(1) filter+map, chaining disabled, p2".into(),
            flink_rows_per_sec: None,
            run: engine(PipelineJob::Filter, 2, false, false),
        },
        Case {
            name: "(2) keyed running count, p1".into(),
            flink_rows_per_sec: Some(2.93e6),
            run: engine(PipelineJob::Count, 1, true, false),
        },
        Case {
            name: "(2) keyed running count, p2".into(),
            flink_rows_per_sec: Some(3.03e6),
            run: engine(PipelineJob::Count, 2, true, false),
        },
    ];

    println!(
        "rows per run: {}, runs per case: {} (median)\n",
        args.rows, args.runs
    );
    println!("| case | median s | M rows/s | vs Flink 2.3 | vs hand-written loop |");
    println!("|---|---|---|---|---|");
    let mut loop_rate = None;
    for case in &cases {
        let mut times = Vec::with_capacity(args.runs);
        for _ in 0..args.runs.max(1) {
            times.push((case.run)(args.rows)?);
        }
        times.sort();
        let median = times[times.len() / 2].as_secs_f64();
        let rate = args.rows as f64 / median;
        if loop_rate.is_none() {
            loop_rate = Some(rate);
        }
        let vs_flink = case.flink_rows_per_sec.map_or("".to_string(), |f| {
            format!("{:.1}× ({:.2} M)", rate / f, f / 1e6)
        });
        let vs_loop = loop_rate.map_or("".to_string(), |l| format!("{:.2}", rate / l));
        println!(
            "| {} | {:.3} | {:.2} | {} | {} |",
            case.name,
            median,
            rate / 1e6,
            vs_flink,
            vs_loop
        );
    }
    Ok(())
}

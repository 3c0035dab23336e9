//! `fluvia`: one binary for every role. For now it runs and explains the
//! built-in example jobs on the embedded runtime.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use fluvia_cli::examples::{self, pipeline, wordcount};
use fluvia_core::config::options;
use fluvia_core::{Configuration, RuntimeMode};
use fluvia_datastream::StreamExecutionEnvironment;
use fluvia_graph::plan;
use std::path::PathBuf;
use std::process::ExitCode;

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
    /// Run an example job on the embedded runtime and print a summary.
    Run {
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

/// Settings every example takes.
#[derive(Args, Clone)]
struct Common {
    /// Default parallelism of the job's operators.
    #[arg(short, long)]
    parallelism: Option<usize>,
    /// Run every operator as its own task (pipeline.operator-chaining.enabled=false).
    #[arg(long)]
    disable_chaining: bool,
    /// Hand records to chained operators without copying them (pipeline.object-reuse=true).
    #[arg(long)]
    object_reuse: bool,
    /// Runtime mode: streaming, batch or automatic.
    #[arg(long, value_parser = parse_mode)]
    mode: Option<RuntimeMode>,
    /// A configuration key, as key=value (repeatable).
    #[arg(short = 'D', value_name = "KEY=VALUE")]
    dynamic: Vec<String>,
}

fn parse_mode(s: &str) -> Result<RuntimeMode, String> {
    RuntimeMode::parse(s)
        .ok_or_else(|| format!("unknown mode '{s}' (streaming, batch or automatic)"))
}

#[derive(Subcommand, Clone)]
enum Example {
    /// Count words in text files; output lines are `word,count`, sorted by word.
    Wordcount {
        /// Input text file(s).
        #[arg(long, required = true, num_args = 1..)]
        input: Vec<PathBuf>,
        /// Output file (default: standard output).
        #[arg(long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        common: Common,
    },
    /// Throughput job over generated rows; prints rows/s.
    Pipeline {
        /// Number of generated rows.
        #[arg(long, default_value_t = 50_000_000)]
        rows: u64,
        /// filter (chained filter + map) or count (keyed running count).
        #[arg(long, default_value = "filter")]
        job: pipeline::PipelineJob,
        #[command(flatten)]
        common: Common,
    },
}

impl Example {
    fn common(&self) -> &Common {
        match self {
            Example::Wordcount { common, .. } | Example::Pipeline { common, .. } => common,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Example::Wordcount { .. } => "wordcount",
            Example::Pipeline { .. } => "pipeline",
        }
    }

    /// Builds the job on a fresh environment configured from the flags.
    fn environment(&self) -> Result<StreamExecutionEnvironment> {
        let common = self.common();
        let mut config = Configuration::new();
        config.apply_dynamic(&common.dynamic)?;
        if let Some(p) = common.parallelism {
            config.set_option(&options::PARALLELISM, p);
        }
        if common.disable_chaining {
            config.set_option(&options::CHAINING_ENABLED, false);
        }
        if common.object_reuse {
            config.set_option(&options::OBJECT_REUSE, true);
        }
        if let Some(mode) = common.mode {
            config.set(options::RUNTIME_MODE.key, mode.to_string());
        }
        let env = StreamExecutionEnvironment::with_config(config)?;
        match self {
            Example::Wordcount { input, output, .. } => {
                wordcount::build(&env, input.clone(), output.clone())
            }
            Example::Pipeline { rows, job, .. } => pipeline::build(&env, *rows, *job),
        }
        Ok(env)
    }
}

fn run(example: Example) -> Result<()> {
    let env = example.environment()?;
    let result = env
        .execute(example.name())
        .with_context(|| format!("job '{}' failed", example.name()))?;
    eprint!("{}", result.summary());
    if let Example::Pipeline { rows, .. } = example {
        let secs = result.duration.as_secs_f64();
        println!(
            "{rows} rows in {secs:.3} s: {:.2} M rows/s",
            rows as f64 / secs / 1e6
        );
    }
    Ok(())
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
        Command::Run { example } => run(example),
        Command::Explain { format, example } => explain(example, format),
        Command::Examples => {
            for (name, about) in examples::EXAMPLES {
                println!("{name:<12} {about}");
            }
            Ok(())
        }
        Command::Config => {
            for (key, default, about) in options::all() {
                println!("{key}\n    default: {default}\n    {about}");
            }
            Ok(())
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
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
    }
}

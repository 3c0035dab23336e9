//! The example programs as a [`ProgramCatalog`]: the same arguments parse
//! into the same job in the client, the JobManager and every TaskManager
//! (application mode).

use crate::examples::{pipeline, wordcount};
use clap::{Args, Parser, Subcommand};
use fluvia_cluster::program::{ProgramCatalog, ProgramSpec};
use fluvia_core::config::options;
use fluvia_core::{Configuration, FluviaError, RuntimeMode};
use fluvia_datastream::StreamExecutionEnvironment;
use fluvia_graph::JobGraph;
use fluvia_runtime::OperatorRegistry;
use std::path::PathBuf;

/// Settings every example takes.
#[derive(Args, Clone, Debug)]
pub struct Common {
    /// Default parallelism of the job's operators.
    #[arg(short, long)]
    pub parallelism: Option<usize>,
    /// Run every operator as its own task (pipeline.operator-chaining.enabled=false).
    #[arg(long)]
    pub disable_chaining: bool,
    /// Hand records to chained operators without copying them (pipeline.object-reuse=true).
    #[arg(long)]
    pub object_reuse: bool,
    /// Runtime mode: streaming, batch or automatic.
    #[arg(long, value_parser = parse_mode)]
    pub mode: Option<RuntimeMode>,
    /// A configuration key, as key=value (repeatable).
    #[arg(short = 'D', value_name = "KEY=VALUE")]
    pub dynamic: Vec<String>,
    /// Start from a savepoint or retained checkpoint (its directory or
    /// `_metadata`; execution.state-recovery.path).
    #[arg(short = 's', long = "fromSavepoint", value_name = "PATH")]
    pub from_savepoint: Option<String>,
    /// Start even if the snapshot holds state of operators the job no
    /// longer has (execution.state-recovery.ignore-unclaimed-state).
    #[arg(short = 'n', long = "allowNonRestoredState")]
    pub allow_non_restored_state: bool,
}

pub fn parse_mode(s: &str) -> Result<RuntimeMode, String> {
    RuntimeMode::parse(s)
        .ok_or_else(|| format!("unknown mode '{s}' (streaming, batch or automatic)"))
}

#[derive(Subcommand, Clone, Debug)]
pub enum Example {
    /// Count words in text files; output lines are `word,count`, sorted by word.
    Wordcount {
        /// Input text file(s).
        #[arg(long, required = true, num_args = 1..)]
        input: Vec<PathBuf>,
        /// Output file (default: standard output).
        #[arg(long)]
        output: Option<PathBuf>,
        /// Skip the sort: each counting subtask writes its own counts, to
        /// OUTPUT/part-<subtask> at parallelism > 1 (as Flink's WordCount).
        #[arg(long)]
        unsorted: bool,
        /// Lines per second each source subtask reads at most (so a
        /// streaming job runs long enough to be checkpointed, killed,
        /// savepointed or rescaled by hand).
        #[arg(long)]
        rate: Option<f64>,
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
    pub fn common(&self) -> &Common {
        match self {
            Example::Wordcount { common, .. } | Example::Pipeline { common, .. } => common,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Example::Wordcount { .. } => "wordcount",
            Example::Pipeline { .. } => "pipeline",
        }
    }

    /// Builds the job on a fresh environment configured from the flags.
    pub fn environment(&self) -> fluvia_core::Result<StreamExecutionEnvironment> {
        let common = self.common();
        let mut config = Configuration::new();
        config.apply_dynamic(&common.dynamic)?;
        if common.disable_chaining {
            config.set_option(&options::CHAINING_ENABLED, false);
        }
        if common.object_reuse {
            config.set_option(&options::OBJECT_REUSE, true);
        }
        if let Some(mode) = common.mode {
            config.set(options::RUNTIME_MODE.key, mode.to_string());
        }
        if let Some(path) = &common.from_savepoint {
            config.set(options::STATE_RECOVERY_PATH.key, path.clone());
        }
        if common.allow_non_restored_state {
            config.set_option(&options::STATE_RECOVERY_IGNORE_UNCLAIMED, true);
        }
        let env = StreamExecutionEnvironment::with_config(config)?;
        // `-p` is the user's choice (kept); without it, a batch job's
        // operators get their parallelism from the data (adaptive batch).
        if let Some(p) = common.parallelism {
            env.set_parallelism(p);
        }
        match self {
            Example::Wordcount {
                input,
                output,
                unsorted,
                rate,
                ..
            } => wordcount::build(&env, input.clone(), output.clone(), !*unsorted, *rate),
            Example::Pipeline { rows, job, .. } => pipeline::build(&env, *rows, *job),
        }
        Ok(env)
    }
}

/// Parses an example's command line (`NAME ARGS...`).
#[derive(Parser, Debug)]
#[command(no_binary_name = true)]
struct ExampleLine {
    #[command(subcommand)]
    example: Example,
}

impl Example {
    /// The example as a program spec: its name and its arguments.
    pub fn parse_spec(spec: &ProgramSpec) -> fluvia_core::Result<Example> {
        let line = std::iter::once(spec.name.clone()).chain(spec.args.iter().cloned());
        ExampleLine::try_parse_from(line)
            .map(|l| l.example)
            .map_err(|e| {
                FluviaError::Plan(format!("bad arguments for program '{}': {e}", spec.name))
            })
    }
}

/// The examples this binary carries.
pub struct ExampleCatalog;

impl ProgramCatalog for ExampleCatalog {
    fn build(&self, spec: &ProgramSpec) -> fluvia_core::Result<(JobGraph, OperatorRegistry)> {
        if spec.name == fluvia_sql::job::PROGRAM {
            // A SQL statement's job, planned again from its arguments.
            let job = std::sync::Arc::new(fluvia_sql::job::SqlJob::from_args(&spec.args)?);
            return job.build();
        }
        let example = Example::parse_spec(spec)?;
        let env = example.environment()?;
        let graph = env.job_graph(example.name())?;
        Ok((graph, env.registry()))
    }

    fn fingerprint(&self) -> String {
        // The same for the whole process, and asked for at every submission
        // (building the examples cost 0.15 ms of each SQL statement's path).
        static FINGERPRINT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        FINGERPRINT
            .get_or_init(|| self.compute_fingerprint())
            .clone()
    }
}

impl ExampleCatalog {
    fn compute_fingerprint(&self) -> String {
        // The version and the shape of every example, built with fixed arguments.
        let mut h = fluvia_core::StableHasher::new();
        h.write_str(env!("CARGO_PKG_VERSION"));
        for (name, args) in [
            ("wordcount", vec!["--input", "in.txt", "-p", "2"]),
            ("pipeline", vec!["--job", "count", "-p", "2"]),
        ] {
            let spec = ProgramSpec {
                name: name.into(),
                args: args.into_iter().map(String::from).collect(),
            };
            if let Ok((g, _)) = self.build(&spec) {
                h.write_str(&g.fingerprint);
            }
        }
        format!("{:032x}", h.finish128())
    }
}

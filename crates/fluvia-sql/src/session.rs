//! DataFusion session settings and table registration.
//!
//! The settings make DataFusion plan for a distributed run: partitions are
//! Fluvia subtasks, so every option that couples partitions inside one
//! process (work stealing between scan partitions, scalar subqueries
//! evaluated into an in-process container) is switched off, and round-robin
//! exchanges, which only spread work across threads, are not planned.
//! Dynamic filters stay on: each task runs its fragment as a plan of one
//! partition (`split::task_view`), where a join's filter is complete. The
//! same options are shipped with the job so every process decodes fragments
//! with the planner's settings.

use datafusion::execution::context::{SessionConfig, SessionContext};
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions};
use fluvia_core::config::{Configuration, options};
use fluvia_core::{FluviaError, Result};
use std::path::Path;

/// Table file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TableFormat {
    Parquet,
    Csv,
}

impl TableFormat {
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "parquet" => Ok(TableFormat::Parquet),
            "csv" => Ok(TableFormat::Csv),
            other => Err(FluviaError::Config(format!(
                "unknown table format '{other}': expected parquet or csv"
            ))),
        }
    }

    fn extension(self) -> &'static str {
        match self {
            TableFormat::Parquet => ".parquet",
            TableFormat::Csv => ".csv",
        }
    }
}

/// DataFusion options for `parallelism` subtasks, as `(key, value)` pairs.
pub fn datafusion_options(
    parallelism: usize,
    config: &Configuration,
) -> Result<Vec<(String, String)>> {
    // RUNTIME_ONLY: no join is broadcast on estimates, only once the
    // scheduler saw a side's real bytes.
    let threshold = match config
        .get(&options::ADAPTIVE_BROADCAST_JOIN_STRATEGY)?
        .to_ascii_uppercase()
        .as_str()
    {
        "RUNTIME_ONLY" => 0,
        _ => config.get(&options::BROADCAST_THRESHOLD)?,
    };
    let mut opts: Vec<(String, String)> = vec![
        (
            "datafusion.execution.target_partitions",
            parallelism.to_string(),
        ),
        (
            "datafusion.optimizer.enable_round_robin_repartition",
            "false".into(),
        ),
        // Partitions of one scan steal each other's files in one process;
        // here each partition is its own task and must read only its own.
        (
            "datafusion.execution.enable_file_stream_work_stealing",
            "false".into(),
        ),
        // A scalar subquery evaluated into an in-process container cannot
        // cross tasks; rewritten as a join it can.
        (
            "datafusion.optimizer.enable_physical_uncorrelated_scalar_subquery",
            "false".into(),
        ),
        (
            "datafusion.execution.parquet.schema_force_view_types",
            "false".into(),
        ),
        (
            "datafusion.sql_parser.map_string_types_to_utf8view",
            "false".into(),
        ),
        (
            "datafusion.optimizer.hash_join_single_partition_threshold",
            threshold.to_string(),
        ),
        ("datafusion.optimizer.repartition_joins", "true".into()),
        // Flink's non-strict rule: data hash-partitioned on a subset of the
        // required keys is already distributed correctly; no new shuffle.
        (
            "datafusion.optimizer.subset_repartition_threshold",
            "1".into(),
        ),
        (
            "datafusion.optimizer.repartition_aggregations",
            "true".into(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if parallelism == 1 {
        opts.push((
            "datafusion.optimizer.repartition_file_scans".into(),
            "false".into(),
        ));
    }
    Ok(opts)
}

/// The session config built from shipped options; unknown keys are errors.
pub fn session_config(options: &[(String, String)]) -> Result<SessionConfig> {
    let mut config = SessionConfig::new();
    for (k, v) in options {
        config
            .options_mut()
            .set(k, v)
            .map_err(|e| FluviaError::Config(format!("DataFusion option {k}={v}: {e}")))?;
    }
    Ok(config)
}

/// Registers every sub-folder (or file) of `dir` as a table named after it.
pub async fn register_tables(
    ctx: &SessionContext,
    dir: &Path,
    format: TableFormat,
) -> Result<Vec<String>> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        FluviaError::io(format!("reading the table directory {}", dir.display()), e)
    })?;
    let mut tables = Vec::new();
    let mut paths: Vec<_> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        let Some(file_name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let name = if path.is_dir() {
            file_name.to_string()
        } else if let Some(stem) = file_name.strip_suffix(format.extension()) {
            stem.to_string()
        } else {
            continue;
        };
        let location = path.to_string_lossy().to_string();
        let registered = match format {
            TableFormat::Parquet => {
                ctx.register_parquet(&name, &location, ParquetReadOptions::default())
                    .await
            }
            TableFormat::Csv => {
                ctx.register_csv(&name, &location, CsvReadOptions::new().has_header(true))
                    .await
            }
        };
        registered.map_err(|e| FluviaError::Plan(format!("table '{name}' ({location}): {e}")))?;
        tables.push(name);
    }
    if tables.is_empty() {
        return Err(FluviaError::Config(format!(
            "no tables in {}: expected one sub-folder or {} file per table",
            dir.display(),
            format.extension()
        )));
    }
    Ok(tables)
}

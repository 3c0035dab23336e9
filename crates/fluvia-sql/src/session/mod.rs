//! A SQL session: DataFusion session settings and table registration here,
//! the statements it takes ([`statement`]), the tables and views it knows
//! ([`catalog`]) and SQL's configuration keys ([`options`]).
//!
//! The settings make DataFusion plan for a distributed run: partitions are
//! Fluvia subtasks, so every option that couples partitions inside one
//! process (work stealing between scan partitions, scalar subqueries
//! evaluated into an in-process container) is switched off, and round-robin
//! exchanges, which only spread work across threads, are not planned.
//! Dynamic filters stay on: each task runs its fragment as a plan of one
//! partition (`planning::split::task_view`), where a join's filter is complete. The
//! same options are shipped with the job so every process decodes fragments
//! with the planner's settings.
//!
//! Knows DataFusion and the formats it registers tables in; not how a
//! plan is cut, shipped or run.

pub mod catalog;
pub mod options;
pub mod statement;

use crate::formats::schema_file::{SCHEMA_FILE, read_schema_file};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::datasource::file_format::options::ReadOptions;
use datafusion::execution::context::{SessionConfig, SessionContext};
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions};
use fluvia_core::config::{Configuration, options as core_options};
use fluvia_core::{FluviaError, Result};
use std::path::Path;
use std::sync::Arc;

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
        .get(&core_options::ADAPTIVE_BROADCAST_JOIN_STRATEGY)?
        .to_ascii_uppercase()
        .as_str()
    {
        "RUNTIME_ONLY" => 0,
        _ => config.get(&core_options::BROADCAST_THRESHOLD)?,
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
        // Strings as views (DataFusion's default): an operator that gathers
        // many batches (a hash join's build side) never overflows 32-bit
        // offsets past 2 GiB of strings. Exchanges compact views before
        // shipping them (`ipc`).
        (
            "datafusion.execution.parquet.schema_force_view_types",
            "true".into(),
        ),
        (
            "datafusion.sql_parser.map_string_types_to_utf8view",
            "true".into(),
        ),
        (
            "datafusion.optimizer.hash_join_single_partition_threshold",
            threshold.to_string(),
        ),
        // DataFusion also broadcasts a side estimated below this many rows
        // when its bytes are unknown; a threshold of 0 means no broadcast
        // on estimates at all.
        (
            "datafusion.optimizer.hash_join_single_partition_threshold_rows",
            if threshold == 0 { "0" } else { "131072" }.to_string(),
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
    // Not DataFusion's: `session_config` turns it into an extension.
    let reader = crate::formats::csv_scan::CsvReader::parse(config.get(&options::CSV_READER)?)?;
    opts.push((
        crate::formats::csv_scan::CsvReader::OPTION.to_string(),
        reader.name().to_string(),
    ));
    // DataFusion's own keys given in the configuration (`-D`) win.
    for (k, v) in config.iter() {
        if k.starts_with("datafusion.") {
            opts.retain(|(key, _)| key != k);
            opts.push((k.to_string(), v.to_string()));
        }
    }
    Ok(opts)
}

/// The session config built from shipped options; unknown keys are errors.
pub fn session_config(options: &[(String, String)]) -> Result<SessionConfig> {
    let mut config = SessionConfig::new();
    for (k, v) in options {
        if k == crate::formats::csv_scan::CsvReader::OPTION {
            config =
                config.with_extension(Arc::new(crate::formats::csv_scan::CsvReader::parse(v)?));
            continue;
        }
        config
            .options_mut()
            .set(k, v)
            .map_err(|e| FluviaError::Config(format!("DataFusion option {k}={v}: {e}")))?;
    }
    Ok(config)
}

/// `schema` with its strings as views when the session reads Parquet
/// strings as views, so CSV and Parquet tables plan alike.
pub(crate) fn with_views(schema: &SchemaRef, ctx: &SessionContext) -> SchemaRef {
    if !ctx
        .copied_config()
        .options()
        .execution
        .parquet
        .schema_force_view_types
    {
        return Arc::clone(schema);
    }
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Utf8 | DataType::LargeUtf8 => {
                f.as_ref().clone().with_data_type(DataType::Utf8View)
            }
            DataType::Binary | DataType::LargeBinary => {
                f.as_ref().clone().with_data_type(DataType::BinaryView)
            }
            _ => f.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new(fields))
}

/// The tables of `dir` whose schema will be inferred (CSV without a
/// [`SCHEMA_FILE`]), for the client to say so.
pub fn undeclared_tables(dir: &Path, format: TableFormat) -> Vec<String> {
    if format != TableFormat::Csv {
        return Vec::new();
    }
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter_map(|p| {
                    let name = p.file_name()?.to_str()?.to_string();
                    if p.is_dir() {
                        (!p.join(SCHEMA_FILE).exists()).then_some(name)
                    } else {
                        name.strip_suffix(format.extension()).map(str::to_string)
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The tables of `dir`: every sub-folder, or file of the format, by name.
pub fn table_entries(dir: &Path, format: TableFormat) -> Result<Vec<(String, std::path::PathBuf)>> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        FluviaError::io(format!("reading the table directory {}", dir.display()), e)
    })?;
    let mut paths: Vec<_> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    paths.sort();
    let mut out = Vec::new();
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
        out.push((name, path));
    }
    if out.is_empty() {
        return Err(FluviaError::Config(format!(
            "no tables in {}: expected one sub-folder or {} file per table",
            dir.display(),
            format.extension()
        )));
    }
    Ok(out)
}

/// Registers every sub-folder (or file) of `dir` as a table named after it.
/// A CSV table with a [`SCHEMA_FILE`] in its folder is read with that
/// schema; otherwise the schema is inferred ([`undeclared_tables`] names
/// those tables).
pub async fn register_tables(
    ctx: &SessionContext,
    dir: &Path,
    format: TableFormat,
) -> Result<Vec<String>> {
    let mut tables = Vec::new();
    for (name, path) in table_entries(dir, format)? {
        let location = path.to_string_lossy().to_string();
        let registered = match format {
            TableFormat::Parquet => {
                ctx.register_parquet(&name, &location, ParquetReadOptions::default())
                    .await
            }
            TableFormat::Csv => {
                let declared = path.join(SCHEMA_FILE);
                let (schema, stats) = if path.is_dir() && declared.exists() {
                    let (schema, stats) = read_schema_file(&declared)?;
                    (Some(schema), stats)
                } else {
                    (None, Vec::new())
                };
                let schema = schema.map(|s| with_views(&s, ctx));
                let mut options = CsvReadOptions::new().has_header(true);
                if let Some(schema) = &schema {
                    options = options.schema(schema);
                }
                let mut listing =
                    options.to_listing_options(&ctx.copied_config(), ctx.copied_table_options());
                listing.format = Arc::new(crate::formats::csv_stats::EstimatingCsvFormat::new(
                    Arc::clone(&listing.format),
                    true,
                    stats,
                ));
                ctx.register_listing_table(&name, &location, listing, schema, None)
                    .await
            }
        };
        registered.map_err(|e| FluviaError::Plan(format!("table '{name}' ({location}): {e}")))?;
        tables.push(name);
    }
    Ok(tables)
}

//! A `fluvia sql` session: the statements of one `-e`, `-f` or interactive
//! client share a catalog (DDL persists for the statements after it) and
//! settings (`SET` / `RESET`), as in Flink's SQL client.
//!
//! What a statement does is decided here; planning and running stay in
//! [`crate::sql`], and printing is the caller's ([`Outcome`]).

use crate::sql::{Cancel, QueryRun, SqlError, SqlSettings, Target, run_with};
use anyhow::anyhow;
use fluvia_core::Configuration;
use fluvia_sql::datafusion::arrow::array::{ArrayRef, StringArray};
use fluvia_sql::datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use fluvia_sql::datafusion::arrow::record_batch::RecordBatch;
use fluvia_sql::job::InsertTarget;
use fluvia_sql::session::TableFormat;
use fluvia_sql::session::catalog::{Catalog, CsvLayout, FileFormat, TableKind};
use fluvia_sql::session::statement::{self, Statement};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// What a statement produced.
pub enum Outcome {
    /// Rows of a query (or of SHOW, DESCRIBE, SET): printed as a result.
    Rows(Box<QueryRun>),
    /// DDL, SET, an INSERT: one line for the user.
    Message(String),
    /// EXPLAIN: the JobGraph as text.
    Plan(String),
}

/// A SQL session.
pub struct SqlSession {
    settings: SqlSettings,
    /// The configuration before any `SET`.
    base: Configuration,
    /// `-p`, kept until `SET 'parallelism.default'` replaces it.
    parallelism: Option<usize>,
    /// What `SET` changed, in the order shown by `SET`.
    overrides: BTreeMap<String, String>,
    target: Target,
    statements: usize,
}

/// A statement the session rejects, in its own words (without the
/// "invalid job" of a plan error).
fn query_error(e: fluvia_core::FluviaError) -> SqlError {
    use fluvia_core::FluviaError;
    SqlError::Query(match e {
        FluviaError::Plan(m) | FluviaError::Config(m) => m,
        other => other.to_string(),
    })
}

fn message(m: impl Into<String>) -> SqlError {
    SqlError::Query(m.into())
}

impl SqlSession {
    pub fn new(
        catalog: Catalog,
        parallelism: Option<usize>,
        config: Configuration,
        target: Target,
    ) -> Result<Self, SqlError> {
        Ok(SqlSession {
            settings: SqlSettings::with_catalog(catalog, parallelism, config.clone())?,
            base: config,
            parallelism,
            overrides: BTreeMap::new(),
            target,
            statements: 0,
        })
    }

    pub fn settings(&self) -> &SqlSettings {
        &self.settings
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Rebuilds the settings from the base configuration and the `SET`s.
    fn apply_settings(&mut self) -> Result<(), SqlError> {
        let mut config = self.base.clone();
        for (k, v) in &self.overrides {
            config.set(k, v.clone());
        }
        let parallelism = if self.overrides.contains_key("parallelism.default") {
            None
        } else {
            self.parallelism
        };
        // Planning with the new settings checks them (a value of the wrong
        // type is an error now, not at the next query).
        let settings =
            SqlSettings::with_catalog(self.settings.catalog.clone(), parallelism, config)
                .map_err(query_error)?;
        fluvia_core::config::options::check(&settings.config).map_err(query_error)?;
        fluvia_sql::session::options::check(&settings.config).map_err(query_error)?;
        fluvia_sql::session::datafusion_options(settings.parallelism, &settings.config)
            .and_then(|o| fluvia_sql::session::session_config(&o).map(|_| ()))
            .map_err(query_error)?;
        self.settings = settings;
        Ok(())
    }

    /// Runs one statement.
    pub fn execute(&mut self, sql: &str, cancel: &Cancel) -> Result<Outcome, SqlError> {
        self.statements += 1;
        let name = format!("sql statement {}", self.statements);
        let parsed = statement::parse(sql).map_err(query_error)?;
        self.run(parsed, &name, cancel)
    }

    /// `--explain`: queries and INSERTs are explained, not run; other
    /// statements (DDL, SET) run so that the ones after them plan.
    pub fn explain_or_execute(&mut self, sql: &str, cancel: &Cancel) -> Result<Outcome, SqlError> {
        self.statements += 1;
        let name = format!("sql statement {}", self.statements);
        let parsed = statement::parse(sql).map_err(query_error)?;
        let parsed = match parsed {
            q @ (Statement::Query(_) | Statement::Insert { .. }) => Statement::Explain(Box::new(q)),
            other => other,
        };
        self.run(parsed, &name, cancel)
    }

    fn run(&mut self, s: Statement, name: &str, cancel: &Cancel) -> Result<Outcome, SqlError> {
        match s {
            Statement::Query(q) => Ok(Outcome::Rows(Box::new(run_with(
                &self.settings,
                &q,
                None,
                name,
                &self.target,
                cancel,
            )?))),
            Statement::Insert {
                table,
                columns,
                query,
                overwrite,
            } => self.insert(&table, columns, &query, overwrite, name, cancel),
            Statement::CreateTable {
                def,
                if_not_exists,
                or_replace,
            } => {
                let table = def.name.clone();
                let created = self
                    .settings
                    .catalog
                    .create_table(def, if_not_exists, or_replace)
                    .map_err(query_error)?;
                Ok(Outcome::Message(if created {
                    format!("table '{table}' created")
                } else {
                    format!("table '{table}' exists; nothing changed")
                }))
            }
            Statement::CreateExternal {
                name: table,
                sql,
                if_not_exists,
            } => {
                if if_not_exists && self.settings.catalog.kind(&table).is_some() {
                    return Ok(Outcome::Message(format!(
                        "table '{table}' exists; nothing changed"
                    )));
                }
                fluvia_sql::job::check_statement(
                    &self.settings.catalog,
                    self.settings.parallelism,
                    &self.settings.config,
                    &sql,
                )
                .map_err(plan_error)?;
                self.settings
                    .catalog
                    .create_external(table.clone(), sql)
                    .map_err(query_error)?;
                Ok(Outcome::Message(format!("table '{table}' created")))
            }
            Statement::CreateView {
                name: view,
                query,
                or_replace,
                if_not_exists,
            } => {
                match self.settings.catalog.kind(&view) {
                    Some(_) if if_not_exists => {
                        return Ok(Outcome::Message(format!(
                            "'{view}' exists; nothing changed"
                        )));
                    }
                    Some(TableKind::View) if or_replace => {}
                    Some(k) => {
                        return Err(message(format!(
                            "{} '{view}' already exists",
                            k.name().to_lowercase()
                        )));
                    }
                    None => {}
                }
                fluvia_sql::job::check_statement(
                    &self.settings.catalog,
                    self.settings.parallelism,
                    &self.settings.config,
                    &query,
                )
                .map_err(|e| message(format!("view '{view}': {}", plan_error(e))))?;
                self.settings.catalog.create_view(view.clone(), query);
                Ok(Outcome::Message(format!("view '{view}' created")))
            }
            Statement::Drop {
                name: table,
                view,
                if_exists,
            } => {
                let dropped = self
                    .settings
                    .catalog
                    .drop(&table, view, if_exists)
                    .map_err(query_error)?;
                let what = if view { "view" } else { "table" };
                Ok(Outcome::Message(if dropped {
                    format!("{what} '{table}' dropped")
                } else {
                    format!("{what} '{table}' does not exist; nothing changed")
                }))
            }
            Statement::ShowTables | Statement::ShowViews => {
                let views = matches!(s, Statement::ShowViews);
                let names: Vec<String> = self
                    .settings
                    .catalog
                    .names()
                    .into_iter()
                    .filter(|(_, k)| !views || *k == TableKind::View)
                    .map(|(n, _)| n)
                    .collect();
                let column = if views { "view name" } else { "table name" };
                Ok(Outcome::Rows(text_rows(&[column], vec![names])?))
            }
            Statement::Describe(table) => self.describe(&table),
            Statement::Set(None) => {
                let (keys, values): (Vec<String>, Vec<String>) =
                    self.overrides.clone().into_iter().unzip();
                Ok(Outcome::Rows(text_rows(
                    &["key", "value"],
                    vec![keys, values],
                )?))
            }
            Statement::Set(Some((k, v))) => {
                let old = self.overrides.insert(k.clone(), v.clone());
                if let Err(e) = self.apply_settings() {
                    match old {
                        Some(o) => self.overrides.insert(k, o),
                        None => self.overrides.remove(&k),
                    };
                    return Err(e);
                }
                Ok(Outcome::Message(format!("set '{k}' = '{v}'")))
            }
            Statement::Reset(key) => {
                match &key {
                    Some(k) => {
                        self.overrides.remove(k);
                    }
                    None => self.overrides.clear(),
                }
                self.apply_settings()?;
                Ok(Outcome::Message(match key {
                    Some(k) => format!("reset '{k}'"),
                    None => "reset all session properties".to_string(),
                }))
            }
            Statement::Explain(inner) => {
                let work = tempfile::tempdir().map_err(|e| SqlError::Other(e.into()))?;
                let planned = match *inner {
                    Statement::Query(q) => {
                        crate::sql::plan_insert(&self.settings, &q, None, name, work.path())?
                    }
                    Statement::Insert {
                        table,
                        columns,
                        query,
                        ..
                    } => {
                        let target = self.insert_target(&table, columns)?;
                        crate::sql::plan_insert(
                            &self.settings,
                            &query,
                            Some(target),
                            name,
                            work.path(),
                        )?
                    }
                    _ => return Err(message("EXPLAIN takes a query or an INSERT INTO")),
                };
                let mut job = planned.job;
                // The plan shows the exchanges the statement would run with.
                job.resolve_shuffle_mode(matches!(self.target, Target::Embedded))?;
                let (graph, _) = Arc::new(job).build()?;
                Ok(Outcome::Plan(fluvia_graph::plan::text_plan(&graph)))
            }
        }
    }

    /// Where `INSERT INTO table` writes.
    fn insert_target(&self, table: &str, columns: Vec<String>) -> Result<InsertTarget, SqlError> {
        let catalog = &self.settings.catalog;
        match catalog.kind(table) {
            None => Err(message(format!("table '{table}' does not exist"))),
            Some(TableKind::View) => Err(message(format!(
                "'{table}' is a view; INSERT INTO takes a table"
            ))),
            Some(TableKind::Declared) => {
                let def = catalog.declared(table).ok_or_else(|| {
                    message(format!(
                        "table '{table}' was made by CREATE EXTERNAL TABLE; INSERT INTO \
                         takes a table made by CREATE TABLE ... WITH ('connector' = 'filesystem')"
                    ))
                })?;
                if def.path.is_file() {
                    return Err(message(format!(
                        "table '{table}': path '{}' is a file; INSERT INTO writes part files \
                         into a folder",
                        def.path.display()
                    )));
                }
                Ok(InsertTarget {
                    table: table.to_string(),
                    dir: def.path.clone(),
                    format: def.format,
                    csv: def.csv.clone(),
                    schema: Arc::clone(&def.schema),
                    columns,
                })
            }
            Some(TableKind::Folder) => {
                let Some((dir, format)) = catalog.dir() else {
                    return Err(message(format!("table '{table}' has no folder")));
                };
                let folder = dir.join(table);
                if !folder.is_dir() {
                    return Err(message(format!(
                        "table '{table}' is the file {}; INSERT INTO writes part files into a \
                         folder",
                        folder.display()
                    )));
                }
                let schema = plain_types(self.schema_of(table)?.as_ref());
                let (format, csv) = match format {
                    TableFormat::Parquet => (FileFormat::Parquet, CsvLayout::default()),
                    // Folders of --tables are read with a header line.
                    TableFormat::Csv => (
                        FileFormat::Csv,
                        CsvLayout {
                            header: true,
                            ..CsvLayout::default()
                        },
                    ),
                };
                Ok(InsertTarget {
                    table: table.to_string(),
                    dir: folder,
                    format,
                    csv,
                    schema,
                    columns,
                })
            }
        }
    }

    fn schema_of(&self, table: &str) -> Result<SchemaRef, SqlError> {
        fluvia_sql::job::check_statement(
            &self.settings.catalog,
            self.settings.parallelism,
            &self.settings.config,
            &format!("SELECT * FROM \"{}\"", table.replace('"', "\"\"")),
        )
        .map_err(plan_error)
    }

    fn insert(
        &mut self,
        table: &str,
        columns: Vec<String>,
        query: &str,
        overwrite: bool,
        name: &str,
        cancel: &Cancel,
    ) -> Result<Outcome, SqlError> {
        let target = self.insert_target(table, columns)?;
        let dir = target.dir.clone();
        // Nothing the reader could not read back as written.
        if target.format == FileFormat::Csv {
            let c = &target.csv;
            let unsupported = if c.quote.is_none() {
                Some("csv.disable-quote-character")
            } else if c.escape.is_some() {
                Some("csv.escape-character")
            } else if c.allow_comments {
                Some("csv.allow-comments")
            } else {
                None
            };
            if let Some(option) = unsupported {
                return Err(message(format!(
                    "INSERT INTO {table}: a table with '{option}' can be read but not written \
                     (what it writes would not read back the same)"
                )));
            }
        }
        // An INSERT of no rows still leaves a table that reads (empty).
        std::fs::create_dir_all(&dir).map_err(|e| {
            message(format!(
                "INSERT INTO {table}: creating {}: {e}",
                dir.display()
            ))
        })?;
        let extension = target.format.extension();
        // What OVERWRITE replaces: the table's files before the job.
        let before = if overwrite {
            data_files(&dir, extension)
        } else {
            Vec::new()
        };
        let started = Instant::now();
        let run = run_with(
            &self.settings,
            query,
            Some(target),
            name,
            &self.target,
            cancel,
        )?;
        for f in &before {
            std::fs::remove_file(f).map_err(|e| {
                SqlError::Other(anyhow!("INSERT OVERWRITE: removing {}: {e}", f.display()))
            })?;
        }
        let rows = run.status.as_ref().map_or(0, crate::sql::rows_written);
        Ok(Outcome::Message(format!(
            "{rows} rows written into '{table}' in {:.3} s",
            started.elapsed().as_secs_f64()
        )))
    }

    fn describe(&self, table: &str) -> Result<Outcome, SqlError> {
        let catalog = &self.settings.catalog;
        let schema = match (catalog.kind(table), catalog.declared(table)) {
            (None, _) => return Err(message(format!("table '{table}' does not exist"))),
            (_, Some(def)) => Arc::clone(&def.schema),
            _ => plain_types(self.schema_of(table)?.as_ref()),
        };
        let fields = schema.fields();
        let names = fields.iter().map(|f| f.name().clone()).collect();
        let types = fields
            .iter()
            .map(|f| sql_type_name(f.data_type()))
            .collect();
        let nulls = fields.iter().map(|f| f.is_nullable().to_string()).collect();
        Ok(Outcome::Rows(text_rows(
            &["name", "type", "null"],
            vec![names, types, nulls],
        )?))
    }
}

fn plan_error(e: fluvia_sql::job::PlanError) -> SqlError {
    match e {
        fluvia_sql::job::PlanError::Query(q) => SqlError::Query(q.to_string()),
        fluvia_sql::job::PlanError::Fluvia(f) => SqlError::Query(f.to_string()),
    }
}

/// The data files of a folder: what a reader of the table reads (every
/// file with the format's extension; in-progress part files have another).
fn data_files(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.is_file()
                        && p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.ends_with(extension))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// `schema` with strings and binaries as their plain types (what files
/// hold and what users declared), not DataFusion's views.
fn plain_types(schema: &Schema) -> SchemaRef {
    Arc::new(Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| {
                let t = match f.data_type() {
                    DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
                    DataType::BinaryView | DataType::LargeBinary => DataType::Binary,
                    t => t.clone(),
                };
                Field::new(f.name(), t, f.is_nullable())
            })
            .collect::<Vec<_>>(),
    ))
}

/// A column type in SQL words, as Flink's DESCRIBE shows it.
fn sql_type_name(t: &DataType) -> String {
    use fluvia_sql::datafusion::arrow::datatypes::TimeUnit;
    match t {
        DataType::Boolean => "BOOLEAN".into(),
        DataType::Int8 => "TINYINT".into(),
        DataType::Int16 => "SMALLINT".into(),
        DataType::Int32 => "INT".into(),
        DataType::Int64 => "BIGINT".into(),
        DataType::Float32 => "FLOAT".into(),
        DataType::Float64 => "DOUBLE".into(),
        DataType::Decimal128(p, s) => format!("DECIMAL({p}, {s})"),
        DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 => "STRING".into(),
        DataType::Binary | DataType::BinaryView | DataType::LargeBinary => "BYTES".into(),
        DataType::Date32 => "DATE".into(),
        DataType::Time64(_) => "TIME".into(),
        DataType::Timestamp(unit, tz) => {
            let p = match unit {
                TimeUnit::Second => 0,
                TimeUnit::Millisecond => 3,
                TimeUnit::Microsecond => 6,
                TimeUnit::Nanosecond => 9,
            };
            match tz {
                None => format!("TIMESTAMP({p})"),
                Some(_) => format!("TIMESTAMP_LTZ({p})"),
            }
        }
        other => other.to_string(),
    }
}

/// A result of text columns (SHOW, DESCRIBE, SET).
fn text_rows(names: &[&str], columns: Vec<Vec<String>>) -> Result<Box<QueryRun>, SqlError> {
    let schema = Arc::new(Schema::new(
        names
            .iter()
            .map(|n| Field::new(*n, DataType::Utf8, false))
            .collect::<Vec<_>>(),
    ));
    let arrays: Vec<ArrayRef> = columns
        .into_iter()
        .map(|c| Arc::new(StringArray::from(c)) as ArrayRef)
        .collect();
    let batch = RecordBatch::try_new(Arc::clone(&schema), arrays)
        .map_err(|e| SqlError::Other(anyhow!("building a result: {e}")))?;
    Ok(Box::new(QueryRun {
        batches: vec![batch],
        schema,
        elapsed: std::time::Duration::ZERO,
        graph: None,
        status: None,
    }))
}

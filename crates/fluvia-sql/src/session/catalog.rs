//! The tables and views a SQL session knows: the folders of `--tables`,
//! tables declared with `CREATE TABLE ... WITH ('connector' = 'filesystem',
//! ...)` (Flink's filesystem connector and its csv, parquet and json
//! formats), DataFusion's own `CREATE EXTERNAL TABLE`, and temporary views.
//!
//! The catalog lives in the client only: a planned job carries its scans
//! (files, schema, format options) in its fragments, so no other process
//! needs it. Each statement is planned in a fresh DataFusion context the
//! catalog registers itself into, which keeps `SET` of a planner option as
//! simple as planning the next statement with it.

use crate::session::{TableFormat, register_tables, with_views};
use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{ScalarValue, TableReference};
use datafusion::datasource::TableType;
use datafusion::datasource::file_format::options::ReadOptions;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{CsvReadOptions, JsonReadOptions, ParquetReadOptions};
use datafusion::sql::sqlparser::ast::{
    self, ColumnOption, ExactNumberInfo, Ident, ObjectName, SqlOption, TimezoneInfo,
};
use fluvia_core::{FluviaError, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// File formats of a declared table (Flink's `'format'`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum FileFormat {
    Csv,
    Parquet,
    Json,
}

impl FileFormat {
    pub fn name(self) -> &'static str {
        match self {
            FileFormat::Csv => "csv",
            FileFormat::Parquet => "parquet",
            FileFormat::Json => "json",
        }
    }

    /// The extension of the files it reads in a folder and writes.
    pub fn extension(self) -> &'static str {
        match self {
            FileFormat::Csv => ".csv",
            FileFormat::Parquet => ".parquet",
            FileFormat::Json => ".json",
        }
    }
}

/// How a CSV table's files are laid out (Flink's `csv.*` options).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CsvLayout {
    pub delimiter: u8,
    /// `None`: `csv.disable-quote-character`.
    pub quote: Option<u8>,
    pub escape: Option<u8>,
    /// Fluvia's `csv.header`: the first line of every file names the
    /// columns (Flink's csv format has no header line; false by default).
    pub header: bool,
    /// Lines starting with `#` are comments (`csv.allow-comments`).
    pub allow_comments: bool,
    /// A field equal to this text is NULL (`csv.null-literal`).
    pub null_literal: Option<String>,
    /// A value that does not parse as its column's type becomes NULL
    /// (`csv.ignore-parse-errors`) instead of failing the query.
    pub ignore_parse_errors: bool,
}

impl Default for CsvLayout {
    fn default() -> Self {
        CsvLayout {
            delimiter: b',',
            quote: Some(b'"'),
            escape: None,
            header: false,
            allow_comments: false,
            null_literal: None,
            ignore_parse_errors: false,
        }
    }
}

/// A table declared with `CREATE TABLE`.
#[derive(Debug, Clone)]
pub struct TableDef {
    pub name: String,
    /// The columns as declared.
    pub schema: SchemaRef,
    /// A folder of files (or one file).
    pub path: PathBuf,
    pub format: FileFormat,
    pub csv: CsvLayout,
    /// The `WITH` options as written, for `DESCRIBE` and `SHOW CREATE TABLE`.
    pub options: Vec<(String, String)>,
}

/// What a name in the catalog is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TableKind {
    /// A folder of `--tables`.
    Folder,
    /// `CREATE TABLE` (or DataFusion's `CREATE EXTERNAL TABLE`).
    Declared,
    View,
}

impl TableKind {
    pub fn name(self) -> &'static str {
        match self {
            TableKind::Folder => "TABLE",
            TableKind::Declared => "TABLE",
            TableKind::View => "VIEW",
        }
    }
}

/// The session's tables and views.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    dir: Option<(PathBuf, TableFormat)>,
    dir_tables: Vec<String>,
    tables: BTreeMap<String, TableDef>,
    /// DataFusion DDL statements replayed into every context, by name.
    external: BTreeMap<String, String>,
    /// Temporary views in the order they were created (a view may read an
    /// older one), by name: the query's text.
    views: Vec<(String, String)>,
}

impl Catalog {
    /// An empty catalog: tables come from DDL only.
    pub fn new() -> Self {
        Catalog::default()
    }

    /// A catalog holding every sub-folder (or file) of `dir` as a table.
    pub fn with_dir(dir: &Path, format: TableFormat) -> Result<Self> {
        let dir_tables = crate::session::table_entries(dir, format)?
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        Ok(Catalog {
            dir: Some((dir.to_path_buf(), format)),
            dir_tables,
            ..Catalog::default()
        })
    }

    /// The `--tables` folder and its format, if any.
    pub fn dir(&self) -> Option<(&Path, TableFormat)> {
        self.dir.as_ref().map(|(d, f)| (d.as_path(), *f))
    }

    /// What `name` is, if the catalog has it.
    pub fn kind(&self, name: &str) -> Option<TableKind> {
        if self.views.iter().any(|(v, _)| v == name) {
            Some(TableKind::View)
        } else if self.tables.contains_key(name) || self.external.contains_key(name) {
            Some(TableKind::Declared)
        } else if self.dir_tables.iter().any(|t| t == name) {
            Some(TableKind::Folder)
        } else {
            None
        }
    }

    /// Every name with its kind, sorted.
    pub fn names(&self) -> Vec<(String, TableKind)> {
        let mut out: Vec<(String, TableKind)> = self
            .dir_tables
            .iter()
            .filter(|t| !self.tables.contains_key(*t))
            .map(|t| (t.clone(), TableKind::Folder))
            .chain(
                self.tables
                    .keys()
                    .chain(self.external.keys())
                    .map(|t| (t.clone(), TableKind::Declared)),
            )
            .chain(self.views.iter().map(|(v, _)| (v.clone(), TableKind::View)))
            .collect();
        out.sort();
        out
    }

    pub fn declared(&self, name: &str) -> Option<&TableDef> {
        self.tables.get(name)
    }

    /// Adds a declared table; `false` if the name was taken and
    /// `if_not_exists` says to keep the old one. `or_replace` replaces an
    /// older declared table of that name.
    pub fn create_table(
        &mut self,
        def: TableDef,
        if_not_exists: bool,
        or_replace: bool,
    ) -> Result<bool> {
        if or_replace && self.kind(&def.name) == Some(TableKind::Declared) {
            self.tables.remove(&def.name);
            self.external.remove(&def.name);
        }
        if self.kind(&def.name).is_some() {
            if if_not_exists {
                return Ok(false);
            }
            return Err(FluviaError::Plan(format!(
                "table '{}' already exists",
                def.name
            )));
        }
        self.tables.insert(def.name.clone(), def);
        Ok(true)
    }

    /// Keeps a DataFusion `CREATE EXTERNAL TABLE` (already checked by
    /// running it once) to replay it for the statements after it.
    pub fn create_external(&mut self, name: String, sql: String) -> Result<()> {
        if self.kind(&name).is_some() {
            return Err(FluviaError::Plan(format!("table '{name}' already exists")));
        }
        self.external.insert(name, sql);
        Ok(())
    }

    /// Adds or replaces a view (the caller checked its query plans); a
    /// replaced view keeps its place, before the views that read it.
    pub fn create_view(&mut self, name: String, sql: String) {
        match self.views.iter_mut().find(|(v, _)| *v == name) {
            Some(old) => old.1 = sql,
            None => self.views.push((name, sql)),
        }
    }

    /// Drops a declared table or a view of that kind; `false` if there was
    /// none and `if_exists` allows that.
    pub fn drop(&mut self, name: &str, view: bool, if_exists: bool) -> Result<bool> {
        let what = if view { "view" } else { "table" };
        let found = match (view, self.kind(name)) {
            (true, Some(TableKind::View)) => {
                self.views.retain(|(v, _)| v != name);
                true
            }
            (false, Some(TableKind::Declared)) => {
                self.tables.remove(name);
                self.external.remove(name);
                true
            }
            (false, Some(TableKind::Folder)) => {
                return Err(FluviaError::Plan(format!(
                    "table '{name}' is a folder of --tables and cannot be dropped"
                )));
            }
            (false, Some(TableKind::View)) => {
                return Err(FluviaError::Plan(format!(
                    "'{name}' is a view: DROP VIEW {name}"
                )));
            }
            (true, Some(TableKind::Declared | TableKind::Folder)) => {
                return Err(FluviaError::Plan(format!(
                    "'{name}' is a table: DROP TABLE {name}"
                )));
            }
            _ => false,
        };
        if !found && !if_exists {
            return Err(FluviaError::Plan(format!("{what} '{name}' does not exist")));
        }
        Ok(found)
    }

    /// Registers every table and view into `ctx`.
    pub async fn register(&self, ctx: &SessionContext) -> Result<()> {
        if let Some((dir, format)) = &self.dir {
            register_tables(ctx, dir, *format).await?;
        }
        for def in self.tables.values() {
            register_declared(ctx, def).await?;
        }
        for (name, sql) in &self.external {
            ctx.sql(sql)
                .await
                .map_err(|e| FluviaError::Plan(format!("table '{name}': {e}")))?;
        }
        for (name, sql) in &self.views {
            // A view whose tables changed fails when it is used, not for
            // every statement of the session (as in Flink).
            let provider: Arc<dyn TableProvider> = match ctx.sql(sql).await {
                Ok(view) => view.into_view(),
                Err(e) => Arc::new(Unreadable {
                    message: format!("view '{name}' no longer plans: {e}"),
                    schema: Arc::new(Schema::empty()),
                }),
            };
            ctx.register_table(bare(name), provider)
                .map_err(|e| FluviaError::Plan(format!("view '{name}': {e}")))?;
        }
        Ok(())
    }
}

/// An identifier as DataFusion resolves it: unquoted ones fold to lower case.
pub fn normalize(ident: &Ident) -> String {
    match ident.quote_style {
        Some(_) => ident.value.clone(),
        None => ident.value.to_lowercase(),
    }
}

/// The last part of a (possibly qualified) name, normalised.
pub fn object_name(name: &ObjectName) -> String {
    name.0
        .last()
        .and_then(|p| p.as_ident())
        .map(normalize)
        .unwrap_or_else(|| name.to_string())
}

/// The options Fluvia takes in `WITH`, with what each means.
const OPTIONS: &[(&str, &str)] = &[
    ("connector", "'filesystem'"),
    ("path", "a folder of files, or one file"),
    ("format", "'csv', 'parquet' or 'json'"),
    ("csv.field-delimiter", "one character, ',' by default"),
    ("csv.quote-character", "one character, '\"' by default"),
    ("csv.disable-quote-character", "'true' or 'false'"),
    ("csv.escape-character", "one character"),
    (
        "csv.allow-comments",
        "'true': lines starting with '#' are skipped",
    ),
    (
        "csv.ignore-parse-errors",
        "'true': a value that does not parse is NULL",
    ),
    ("csv.null-literal", "the text of a NULL field"),
    (
        "csv.header",
        "'true': the first line of each file names the columns",
    ),
];

/// The table a `CREATE TABLE` statement declares. Errors name the table and
/// the option or column at fault.
pub fn table_def(ct: &ast::CreateTable) -> Result<TableDef> {
    let name = object_name(&ct.name);
    let err = |msg: String| FluviaError::Plan(format!("CREATE TABLE {name}: {msg}"));
    if ct.query.is_some() {
        return Err(err(
            "CREATE TABLE ... AS SELECT is not supported; declare the table, then INSERT INTO it"
                .into(),
        ));
    }
    if ct.external {
        return Err(err("use CREATE EXTERNAL TABLE ... STORED AS ... LOCATION (DataFusion's syntax) or CREATE TABLE ... WITH (...)".into()));
    }
    let unsupported_clause = if !matches!(ct.hive_distribution, ast::HiveDistributionStyle::NONE)
        || ct.partition_by.is_some()
        || ct.partition_of.is_some()
    {
        Some("PARTITIONED BY")
    } else if ct.like.is_some() || ct.clone.is_some() {
        Some("LIKE / CLONE")
    } else if ct.location.is_some() || ct.file_format.is_some() || ct.hive_formats.is_some() {
        Some("LOCATION / STORED AS (give 'path' and 'format' in WITH)")
    } else if ct.order_by.is_some() || ct.cluster_by.is_some() || ct.clustered_by.is_some() {
        Some("ORDER BY / CLUSTER BY")
    } else if ct.primary_key.is_some() || ct.inherits.is_some() {
        Some("PRIMARY KEY / INHERITS")
    } else {
        None
    };
    if let Some(clause) = unsupported_clause {
        return Err(err(format!("{clause} is not supported")));
    }
    if ct.columns.is_empty() {
        return Err(err("no columns declared".into()));
    }
    if let Some(c) = ct.constraints.first() {
        return Err(err(format!(
            "constraint '{c}' is not supported (filesystem tables have no keys)"
        )));
    }
    let with = match &ct.table_options {
        ast::CreateTableOptions::With(o) => o.as_slice(),
        ast::CreateTableOptions::None => &[],
        other => return Err(err(format!("expected WITH (...), found {other}"))),
    };
    let mut options: Vec<(String, String)> = Vec::new();
    for o in with {
        let SqlOption::KeyValue { key, value } = o else {
            return Err(err(format!(
                "option {o} is not of the form 'key' = 'value'"
            )));
        };
        let value = match value {
            ast::Expr::Value(v) => match &v.value {
                ast::Value::SingleQuotedString(s) | ast::Value::DoubleQuotedString(s) => s.clone(),
                ast::Value::Number(n, _) => n.clone(),
                ast::Value::Boolean(b) => b.to_string(),
                other => other.to_string(),
            },
            other => other.to_string(),
        };
        let key = key.value.clone();
        if !OPTIONS.iter().any(|(k, _)| *k == key) {
            let known: Vec<&str> = OPTIONS.iter().map(|(k, _)| *k).collect();
            return Err(err(format!(
                "unknown option '{key}' in WITH; the options are {}",
                known.join(", ")
            )));
        }
        if options.iter().any(|(k, _)| *k == key) {
            return Err(err(format!("option '{key}' given twice")));
        }
        options.push((key, value));
    }
    let get = |k: &str| {
        options
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    match get("connector") {
        Some(c) if c.eq_ignore_ascii_case("filesystem") => {}
        Some(c) => {
            return Err(err(format!(
                "connector '{c}' is not supported; the connector is 'filesystem'"
            )));
        }
        None => return Err(err("missing option 'connector' (= 'filesystem')".into())),
    }
    let path = get("path").ok_or_else(|| err("missing option 'path'".into()))?;
    if path.is_empty() {
        return Err(err("option 'path' is empty".into()));
    }
    let format = match get("format").map(str::to_ascii_lowercase).as_deref() {
        Some("csv") => FileFormat::Csv,
        Some("parquet") => FileFormat::Parquet,
        Some("json") => FileFormat::Json,
        Some(other) => {
            return Err(err(format!(
                "format '{other}' is not supported; formats are csv, parquet and json"
            )));
        }
        None => return Err(err("missing option 'format' (csv, parquet or json)".into())),
    };
    let mut csv = CsvLayout::default();
    for (k, v) in &options {
        if k.starts_with("csv.") && format != FileFormat::Csv {
            return Err(err(format!("option '{k}' needs 'format' = 'csv'")));
        }
        let flag = || -> Result<bool> {
            match v.to_ascii_lowercase().as_str() {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(err(format!(
                    "option '{k}' is '{v}'; expected 'true' or 'false'"
                ))),
            }
        };
        let byte = || -> Result<u8> {
            match v.as_bytes() {
                [b] => Ok(*b),
                _ if v == "\\t" => Ok(b'\t'),
                _ => Err(err(format!(
                    "option '{k}' is '{v}'; expected one ASCII character"
                ))),
            }
        };
        match k.as_str() {
            "csv.field-delimiter" => csv.delimiter = byte()?,
            "csv.quote-character" => csv.quote = Some(byte()?),
            "csv.disable-quote-character" if flag()? => csv.quote = None,
            "csv.escape-character" => csv.escape = Some(byte()?),
            "csv.allow-comments" => csv.allow_comments = flag()?,
            "csv.ignore-parse-errors" => csv.ignore_parse_errors = flag()?,
            "csv.null-literal" => csv.null_literal = Some(v.clone()),
            "csv.header" => csv.header = flag()?,
            _ => {}
        }
    }
    let mut fields = Vec::with_capacity(ct.columns.len());
    for c in &ct.columns {
        let column = normalize(&c.name);
        if fields.iter().any(|f: &Field| *f.name() == column) {
            return Err(err(format!("column '{column}' declared twice")));
        }
        let data_type = arrow_type(&c.data_type)
            .map_err(|m| err(format!("column '{column}' has type {}: {m}", c.data_type)))?;
        let mut nullable = true;
        for o in &c.options {
            match &o.option {
                ColumnOption::NotNull => nullable = false,
                ColumnOption::Null => nullable = true,
                ColumnOption::Comment(_) => {}
                other => {
                    return Err(err(format!(
                        "column '{column}': '{other}' is not supported"
                    )));
                }
            }
        }
        if format == FileFormat::Csv && matches!(data_type, DataType::Binary) {
            return Err(err(format!(
                "column '{column}': BYTES cannot be stored in CSV; use 'format' = 'parquet' or 'json'"
            )));
        }
        fields.push(Field::new(column, data_type, nullable));
    }
    // Relative to where the client runs, not to each TaskManager.
    let path = PathBuf::from(path);
    let path = if path.is_relative() {
        std::env::current_dir()
            .map_err(|e| err(format!("resolving the relative path: {e}")))?
            .join(path)
    } else {
        path
    };
    Ok(TableDef {
        name,
        schema: Arc::new(Schema::new(fields)),
        path,
        format,
        csv,
        options,
    })
}

/// A SQL type as Flink names it (and the common synonyms) → Arrow.
pub fn arrow_type(t: &ast::DataType) -> std::result::Result<DataType, String> {
    use ast::DataType as T;
    let decimal = |info: &ExactNumberInfo| -> std::result::Result<DataType, String> {
        // Flink's DECIMAL is DECIMAL(10, 0).
        let (p, s) = match info {
            ExactNumberInfo::None => (10, 0),
            ExactNumberInfo::Precision(p) => (*p, 0),
            ExactNumberInfo::PrecisionAndScale(p, s) => (*p, *s),
        };
        if !(1..=38).contains(&p) || s < 0 || s as u64 > p {
            return Err(format!(
                "precision must be 1 to 38 and scale 0 to the precision (got {p}, {s})"
            ));
        }
        Ok(DataType::Decimal128(p as u8, s as i8))
    };
    let timestamp = |p: &Option<u64>| -> std::result::Result<TimeUnit, String> {
        // Flink's TIMESTAMP is TIMESTAMP(6).
        match p.unwrap_or(6) {
            0 => Ok(TimeUnit::Second),
            1..=3 => Ok(TimeUnit::Millisecond),
            4..=6 => Ok(TimeUnit::Microsecond),
            7..=9 => Ok(TimeUnit::Nanosecond),
            p => Err(format!("precision {p} is above 9")),
        }
    };
    Ok(match t {
        T::Boolean | T::Bool => DataType::Boolean,
        T::TinyInt(_) => DataType::Int8,
        T::SmallInt(_) | T::Int2(_) => DataType::Int16,
        T::Int(_) | T::Integer(_) | T::Int4(_) => DataType::Int32,
        T::BigInt(_) | T::Int8(_) => DataType::Int64,
        T::Float(ExactNumberInfo::None) | T::Real | T::Float4 => DataType::Float32,
        T::Float(ExactNumberInfo::Precision(p)) if *p <= 24 => DataType::Float32,
        T::Float(_) | T::Double(_) | T::DoublePrecision | T::Float8 | T::Float64 => {
            DataType::Float64
        }
        T::Decimal(i) | T::Numeric(i) | T::Dec(i) => decimal(i)?,
        T::Char(_)
        | T::Character(_)
        | T::Varchar(_)
        | T::CharVarying(_)
        | T::CharacterVarying(_)
        | T::Nvarchar(_)
        | T::String(_)
        | T::Text => DataType::Utf8,
        T::Binary(_) | T::Varbinary(_) | T::Bytes(_) | T::Bytea | T::Blob(_) => DataType::Binary,
        T::Date => DataType::Date32,
        T::Time(_, TimezoneInfo::None | TimezoneInfo::WithoutTimeZone) => {
            DataType::Time64(TimeUnit::Microsecond)
        }
        T::Timestamp(p, TimezoneInfo::None | TimezoneInfo::WithoutTimeZone) => {
            DataType::Timestamp(timestamp(p)?, None)
        }
        T::Timestamp(p, TimezoneInfo::WithTimeZone | TimezoneInfo::Tz) => {
            DataType::Timestamp(timestamp(p)?, Some("UTC".into()))
        }
        T::Custom(name, args) => {
            let n = name.to_string().to_ascii_uppercase();
            match (n.as_str(), args.as_slice()) {
                ("STRING", []) => DataType::Utf8,
                ("DOUBLE", []) => DataType::Float64,
                ("TIMESTAMP_LTZ", []) => {
                    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
                }
                ("TIMESTAMP_LTZ", [p]) => {
                    let p = p.parse::<u64>().map_err(|_| format!("precision '{p}'"))?;
                    DataType::Timestamp(timestamp(&Some(p))?, Some("UTC".into()))
                }
                _ => return Err(unsupported()),
            }
        }
        _ => return Err(unsupported()),
    })
}

fn unsupported() -> String {
    "not a supported type (BOOLEAN, TINYINT, SMALLINT, INT, BIGINT, FLOAT, DOUBLE, \
     DECIMAL(p, s), CHAR(n), VARCHAR(n), STRING, BYTES, DATE, TIME, TIMESTAMP(p), TIMESTAMP_LTZ(p))"
        .to_string()
}

/// The name a declared table's raw (all-text) columns are registered
/// under when its text needs more than the CSV reader does (NULL literals,
/// bad values as NULL).
fn raw_name(table: &str) -> String {
    format!("__fluvia_raw_{table}")
}

fn bare(name: &str) -> TableReference {
    TableReference::bare(name.to_string())
}

async fn register_declared(ctx: &SessionContext, def: &TableDef) -> Result<()> {
    let name = def.name.as_str();
    let path = def.path.to_string_lossy().to_string();
    let err = |e: DataFusionError| FluviaError::Plan(format!("table '{name}' ({path}): {e}"));
    let schema = with_views(&def.schema, ctx);
    if !def.path.exists() {
        ctx.register_table(
            bare(name),
            Arc::new(Unreadable {
                message: format!("table '{name}': path '{path}' does not exist"),
                schema,
            }),
        )
        .map_err(err)?;
        return Ok(());
    }
    // One file is read whatever its name; in a folder, the files of the format.
    let extension = if def.path.is_file() {
        ""
    } else {
        def.format.extension()
    };
    match def.format {
        FileFormat::Parquet => {
            let options = ParquetReadOptions {
                schema: Some(schema.as_ref()),
                file_extension: extension,
                ..Default::default()
            };
            ctx.register_parquet(bare(name), &path, options)
                .await
                .map_err(err)?;
        }
        FileFormat::Json => {
            let options = JsonReadOptions {
                schema: Some(schema.as_ref()),
                file_extension: extension,
                ..Default::default()
            };
            ctx.register_json(bare(name), &path, options)
                .await
                .map_err(err)?;
        }
        FileFormat::Csv => {
            let csv = &def.csv;
            // NULL literals and bad values as NULL: read every column as
            // text, then turn the text into the declared types in a view
            // of the table's name.
            let as_text = csv.ignore_parse_errors || csv.null_literal.is_some();
            let read_schema = if as_text {
                Arc::new(Schema::new(
                    schema
                        .fields()
                        .iter()
                        .map(|f| Field::new(f.name(), DataType::Utf8View, true))
                        .collect::<Vec<_>>(),
                ))
            } else {
                Arc::clone(&schema)
            };
            let mut options = CsvReadOptions::new()
                .has_header(csv.header)
                .delimiter(csv.delimiter)
                .file_extension(extension)
                .schema(read_schema.as_ref())
                .truncated_rows(csv.ignore_parse_errors);
            options = match csv.quote {
                Some(q) => options.quote(q),
                // No quoting: a quote byte that never occurs in text.
                None => options.quote(0),
            };
            if let Some(e) = csv.escape {
                options = options.escape(e);
            }
            if csv.allow_comments {
                options = options.comment(b'#');
            }
            let mut listing =
                options.to_listing_options(&ctx.copied_config(), ctx.copied_table_options());
            listing.format = Arc::new(crate::formats::csv_stats::EstimatingCsvFormat::new(
                Arc::clone(&listing.format),
                csv.header,
                Vec::new(),
            ));
            let table = if as_text {
                raw_name(name)
            } else {
                name.to_string()
            };
            ctx.register_listing_table(bare(&table), &path, listing, Some(read_schema), None)
                .await
                .map_err(err)?;
            if as_text {
                use datafusion::logical_expr::{cast, col, lit, try_cast, when};
                let raw = ctx.table(bare(&table)).await.map_err(err)?;
                let columns: Vec<Expr> = schema
                    .fields()
                    .iter()
                    .map(|f| {
                        let text = col(datafusion::common::Column::new_unqualified(f.name()));
                        // Empty fields are NULL, as the CSV reader reads them.
                        let text = when(text.clone().eq(lit("")), lit(ScalarValue::Utf8View(None)))
                            .otherwise(text)?;
                        let text = match &csv.null_literal {
                            Some(null) => when(
                                text.clone().eq(lit(null.as_str())),
                                lit(ScalarValue::Utf8View(None)),
                            )
                            .otherwise(text)?,
                            None => text,
                        };
                        let typed = if csv.ignore_parse_errors {
                            try_cast(text, f.data_type().clone())
                        } else {
                            cast(text, f.data_type().clone())
                        };
                        Ok(typed.alias(f.name()))
                    })
                    .collect::<std::result::Result<_, DataFusionError>>()
                    .map_err(err)?;
                let view = raw.select(columns).map_err(err)?;
                ctx.register_table(bare(name), view.into_view())
                    .map_err(err)?;
            }
        }
    }
    Ok(())
}

/// A table that cannot be read: a declared table whose path does not
/// exist (yet: a sink's folder is made by the first INSERT), or a view
/// whose query no longer plans. Reading it is an error that says why.
#[derive(Debug)]
struct Unreadable {
    message: String,
    schema: SchemaRef,
}

#[async_trait]
impl TableProvider for Unreadable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        _projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Err(DataFusionError::Plan(self.message.clone()))
    }
}

//! TPC-DS, a tool beside the engine: data generation with `tpcdsgen` (the
//! generator of the reference answers), table checksums, the statements of
//! a query file, and the verdict on each statement a runner ran: its rows
//! compared with the answers, or its error judged.
//!
//! Used by `fluvia tpcds ...` and by the benchmarks; the engine never
//! depends on it. It knows Fluvia's SQL crate only for its DataFusion, its
//! result rendering and its schema files.

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{
    ArrowPrimitiveType, DataType, Date32Type, Decimal128Type, Field, Int32Type, Int64Type, Schema,
    SchemaRef,
};
use datafusion::arrow::error::ArrowError;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::Compression;
use datafusion::parquet::file::properties::WriterProperties;
use fluvia_core::{FluviaError, Result};
use fluvia_sql::datafusion;
use fluvia_sql::formats::output::{Cell, parse_csv};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tpcdsgen::config::{Session, SessionBuilder};
use tpcdsgen_arrow as g;

type BatchIter = Box<dyn Iterator<Item = std::result::Result<RecordBatch, ArrowError>> + Send>;

/// The 24 tables (dbgen_version is not part of the benchmark).
pub const TABLES: [&str; 24] = [
    "call_center",
    "catalog_page",
    "catalog_returns",
    "catalog_sales",
    "customer",
    "customer_address",
    "customer_demographics",
    "date_dim",
    "household_demographics",
    "income_band",
    "inventory",
    "item",
    "promotion",
    "reason",
    "ship_mode",
    "store",
    "store_returns",
    "store_sales",
    "time_dim",
    "warehouse",
    "web_page",
    "web_returns",
    "web_sales",
    "web_site",
];

fn generator(table: &str, s: Session) -> Option<(SchemaRef, BatchIter)> {
    macro_rules! table_gen {
        ($t:ty) => {
            Some((<$t>::schema_ref(), Box::new(<$t>::new(s)) as BatchIter))
        };
    }
    match table {
        "call_center" => table_gen!(g::CallCenterArrow),
        "catalog_page" => table_gen!(g::CatalogPageArrow),
        "catalog_returns" => table_gen!(g::CatalogReturnsArrow),
        "catalog_sales" => table_gen!(g::CatalogSalesArrow),
        "customer" => table_gen!(g::CustomerArrow),
        "customer_address" => table_gen!(g::CustomerAddressArrow),
        "customer_demographics" => table_gen!(g::CustomerDemographicsArrow),
        "date_dim" => table_gen!(g::DateDimArrow),
        "household_demographics" => table_gen!(g::HouseholdDemographicsArrow),
        "income_band" => table_gen!(g::IncomeBandArrow),
        "inventory" => table_gen!(g::InventoryArrow),
        "item" => table_gen!(g::ItemArrow),
        "promotion" => table_gen!(g::PromotionArrow),
        "reason" => table_gen!(g::ReasonArrow),
        "ship_mode" => table_gen!(g::ShipModeArrow),
        "store" => table_gen!(g::StoreArrow),
        "store_returns" => table_gen!(g::StoreReturnsArrow),
        "store_sales" => table_gen!(g::StoreSalesArrow),
        "time_dim" => table_gen!(g::TimeDimArrow),
        "warehouse" => table_gen!(g::WarehouseArrow),
        "web_page" => table_gen!(g::WebPageArrow),
        "web_returns" => table_gen!(g::WebReturnsArrow),
        "web_sales" => table_gen!(g::WebSalesArrow),
        "web_site" => table_gen!(g::WebSiteArrow),
        _ => None,
    }
}

/// Plain UTF-8 strings instead of views: compact files and exchanges.
fn plain_schema(schema: &Schema) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Utf8View => f.as_ref().clone().with_data_type(DataType::Utf8),
            _ => f.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new(fields))
}

fn plain_batch(
    batch: &RecordBatch,
    schema: &SchemaRef,
) -> std::result::Result<RecordBatch, ArrowError> {
    let cols = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(Arc::clone(c))
            } else {
                cast(c, f.data_type())
            }
        })
        .collect::<std::result::Result<Vec<ArrayRef>, _>>()?;
    RecordBatch::try_new(Arc::clone(schema), cols)
}

/// Writes `DIR/<table>/<table>.1.<ext>` for the 24 tables.
pub fn generate(scale: f64, out: &Path, csv: bool, threads: usize) -> Result<()> {
    let session = SessionBuilder::new()
        .with_scale_factor(scale)
        .build()
        .map_err(|e| FluviaError::Config(format!("TPC-DS scale factor {scale}: {e}")))?;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let errors = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(table) = TABLES.get(i) else { break };
                    if let Err(e) = generate_table(table, session.clone(), out, csv)
                        && let Ok(mut v) = errors.lock()
                    {
                        v.push(e);
                    }
                }
            });
        }
    });
    match errors.into_inner().ok().and_then(|mut v| v.pop()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn generate_table(table: &str, session: Session, out: &Path, csv: bool) -> Result<()> {
    let (schema, batches) = generator(table, session)
        .ok_or_else(|| FluviaError::Config(format!("unknown table {table}")))?;
    let schema = plain_schema(&schema);
    let dir = out.join(table);
    std::fs::create_dir_all(&dir)
        .map_err(|e| FluviaError::io(format!("creating {}", dir.display()), e))?;
    let ext = if csv { "csv" } else { "parquet" };
    let path = dir.join(format!("{table}.1.{ext}"));
    let file = std::fs::File::create(&path)
        .map_err(|e| FluviaError::io(format!("creating {}", path.display()), e))?;
    let fail = |e: String| FluviaError::Internal(format!("writing {}: {e}", path.display()));
    if csv {
        let mut w = datafusion::arrow::csv::WriterBuilder::new()
            .with_header(true)
            .build(file);
        let mut stats = ColumnBounds::new(schema.fields().len());
        for b in batches {
            let b = plain_batch(&b.map_err(|e| fail(e.to_string()))?, &schema)
                .map_err(|e| fail(e.to_string()))?;
            stats.add(&b);
            w.write(&b).map_err(|e| fail(e.to_string()))?;
        }
        // Declared, so readers need not guess (zip codes are strings), with
        // the column statistics a planner orders joins by.
        let declared = dir.join(fluvia_sql::formats::schema_file::SCHEMA_FILE);
        let json =
            fluvia_sql::formats::schema_file::schema_file_json(&schema, &stats.declared(&schema));
        std::fs::write(&declared, json)
            .map_err(|e| FluviaError::io(format!("writing {}", declared.display()), e))?;
    } else {
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build();
        let mut w = ArrowWriter::try_new(file, Arc::clone(&schema), Some(props))
            .map_err(|e| fail(e.to_string()))?;
        for b in batches {
            let b = plain_batch(&b.map_err(|e| fail(e.to_string()))?, &schema)
                .map_err(|e| fail(e.to_string()))?;
            w.write(&b).map_err(|e| fail(e.to_string()))?;
        }
        w.close().map_err(|e| fail(e.to_string()))?;
    }
    Ok(())
}

/// Smallest and largest value of each integer, date and decimal column,
/// and nulls of every column, over the batches added.
struct ColumnBounds {
    bounds: Vec<Option<(i128, i128)>>,
    nulls: Vec<u64>,
}

impl ColumnBounds {
    fn new(columns: usize) -> Self {
        ColumnBounds {
            bounds: vec![None; columns],
            nulls: vec![0; columns],
        }
    }

    fn add(&mut self, batch: &RecordBatch) {
        use datafusion::arrow::compute::{max, min};
        use datafusion::arrow::datatypes::Decimal128Type;
        for (i, c) in batch.columns().iter().enumerate() {
            self.nulls[i] += c.null_count() as u64;
            let range: Option<(i128, i128)> = match c.data_type() {
                DataType::Int32 => {
                    let a = c.as_primitive::<Int32Type>();
                    min(a).zip(max(a)).map(|(l, h)| (l as i128, h as i128))
                }
                DataType::Int64 => {
                    let a = c.as_primitive::<Int64Type>();
                    min(a).zip(max(a)).map(|(l, h)| (l as i128, h as i128))
                }
                DataType::Date32 => {
                    let a = c.as_primitive::<Date32Type>();
                    min(a).zip(max(a)).map(|(l, h)| (l as i128, h as i128))
                }
                DataType::Decimal128(_, _) => {
                    let a = c.as_primitive::<Decimal128Type>();
                    min(a).zip(max(a))
                }
                _ => None,
            };
            if let Some((lo, hi)) = range {
                let b = self.bounds[i].get_or_insert((lo, hi));
                b.0 = b.0.min(lo);
                b.1 = b.1.max(hi);
            }
        }
    }

    fn declared(
        &self,
        schema: &Schema,
    ) -> Vec<fluvia_sql::formats::schema_file::DeclaredColumnStats> {
        use datafusion::common::ScalarValue;
        schema
            .fields()
            .iter()
            .zip(self.bounds.iter().zip(&self.nulls))
            .map(|(f, (b, &nulls))| {
                let text = |v: i128| -> Option<String> {
                    let s = match f.data_type() {
                        DataType::Int32 => ScalarValue::Int32(Some(v as i32)),
                        DataType::Int64 => ScalarValue::Int64(Some(v as i64)),
                        DataType::Date32 => ScalarValue::Date32(Some(v as i32)),
                        DataType::Decimal128(p, s) => ScalarValue::Decimal128(Some(v), *p, *s),
                        _ => return None,
                    };
                    Some(s.to_string())
                };
                fluvia_sql::formats::schema_file::DeclaredColumnStats {
                    min: b.and_then(|(lo, _)| text(lo)),
                    max: b.and_then(|(_, hi)| text(hi)),
                    nulls: Some(nulls),
                }
            })
            .collect()
    }
}

/// A table's checksum line, as in `tables.csv`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableChecksum {
    pub rows: i128,
    pub int_sum: i128,
    pub date_sum: i128,
    pub decimal_unscaled_sum: i128,
    pub string_bytes: i128,
    pub null_cells: i128,
    pub columns: i128,
}

/// The sum of the non-null values of primitive column `c`.
fn primitive_sum<T: ArrowPrimitiveType>(c: &ArrayRef) -> i128
where
    T::Native: Into<i128>,
{
    c.as_primitive::<T>().iter().flatten().map(Into::into).sum()
}

/// The bytes of the non-null values of a string column.
fn string_bytes<'a>(values: impl IntoIterator<Item = Option<&'a str>>) -> i128 {
    values.into_iter().flatten().map(|s| s.len() as i128).sum()
}

impl TableChecksum {
    pub fn add(&mut self, batch: &RecordBatch) {
        self.rows += batch.num_rows() as i128;
        self.columns = batch.num_columns() as i128;
        for c in batch.columns() {
            self.null_cells += c.null_count() as i128;
            match c.data_type() {
                DataType::Int32 => self.int_sum += primitive_sum::<Int32Type>(c),
                DataType::Int64 => self.int_sum += primitive_sum::<Int64Type>(c),
                DataType::Date32 => self.date_sum += primitive_sum::<Date32Type>(c),
                DataType::Decimal128(_, _) => {
                    self.decimal_unscaled_sum += primitive_sum::<Decimal128Type>(c)
                }
                DataType::Utf8 => self.string_bytes += string_bytes(c.as_string::<i32>()),
                DataType::Utf8View => self.string_bytes += string_bytes(c.as_string_view()),
                _ => {}
            }
        }
    }

    pub fn line(&self, table: &str) -> String {
        format!(
            "{table},{},{},{},{},{},{},{}",
            self.rows,
            self.int_sum,
            self.date_sum,
            self.decimal_unscaled_sum,
            self.string_bytes,
            self.null_cells,
            self.columns
        )
    }
}

/// Checksums of the Parquet tables under `dir`.
pub fn checksum_parquet(dir: &Path, table: &str) -> Result<TableChecksum> {
    let mut sum = TableChecksum::default();
    let tdir = dir.join(table);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&tdir)
        .map_err(|e| FluviaError::io(format!("reading {}", tdir.display()), e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect();
    files.sort();
    for f in files {
        let file = std::fs::File::open(&f)
            .map_err(|e| FluviaError::io(format!("opening {}", f.display()), e))?;
        let reader =
            datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
                file,
            )
            .and_then(|b| b.build())
            .map_err(|e| FluviaError::Internal(format!("reading {}: {e}", f.display())))?;
        for b in reader {
            sum.add(
                &b.map_err(|e| FluviaError::Internal(format!("reading {}: {e}", f.display())))?,
            );
        }
    }
    Ok(sum)
}

// ---------------------------------------------------------------- answers

/// The statements of a query file: split on `;`, empty pieces dropped.
pub fn statements(sql: &str) -> Vec<String> {
    sql.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// The answer file of statement `k` (1-based) of query `q`, preferring
/// the PostgreSQL-semantics answer where there is one (integer division,
/// NULLs first under DESC, as DataFusion).
pub fn answer_path(answers: &Path, q: usize, k: usize) -> PathBuf {
    let stem = if k == 1 {
        format!("q{q}")
    } else {
        format!("q{q}_{k}")
    };
    let pg = answers.join(format!("{stem}.pg.csv"));
    if pg.exists() {
        pg
    } else {
        answers.join(format!("{stem}.csv"))
    }
}

fn close(a: f64, b: f64) -> bool {
    if a.is_nan() && b.is_nan() {
        return true;
    }
    if a == b {
        return true;
    }
    (a - b).abs() <= 1e-6 * 1f64.max(a.abs()).max(b.abs())
}

fn cell_eq(a: &Cell, b: &Cell, numeric: bool) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), Some(y)) if numeric => match (parse_num(x), parse_num(y)) {
            (Some(p), Some(q)) => close(p, q),
            _ => x == y,
        },
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

fn parse_num(s: &str) -> Option<f64> {
    match s {
        "inf" | "Infinity" => Some(f64::INFINITY),
        "-inf" | "-Infinity" => Some(f64::NEG_INFINITY),
        _ => s.parse().ok(),
    }
}

fn row_eq(a: &[Cell], b: &[Cell], numeric: &[bool]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .zip(numeric)
            .all(|((x, y), &n)| cell_eq(x, y, n))
}

/// Compares `actual` with the answer CSV text as multisets of rows (see
/// the answers' README). `numeric[i]`: column i holds numbers.
pub fn compare(
    actual: &[Vec<Cell>],
    answer_csv: &str,
    numeric: &[bool],
) -> std::result::Result<(), String> {
    let mut expected = parse_csv(answer_csv)?;
    if expected.is_empty() {
        return Err("the answer file has no header".into());
    }
    expected.remove(0);
    if expected.len() != actual.len() {
        return Err(format!(
            "{} rows, expected {}",
            actual.len(),
            expected.len()
        ));
    }
    let key = |r: &Vec<Cell>| -> Vec<String> {
        r.iter()
            .zip(numeric)
            .map(|(c, &n)| match c {
                None => "\u{0}NULL".to_string(),
                Some(v) if n => parse_num(v).map_or(v.clone(), |f| format!("{:+024.6e}", f)),
                Some(v) => v.clone(),
            })
            .collect()
    };
    let mut a: Vec<&Vec<Cell>> = actual.iter().collect();
    let mut e: Vec<&Vec<Cell>> = expected.iter().collect();
    a.sort_by_key(|r| key(r));
    e.sort_by_key(|r| key(r));
    if a.iter().zip(&e).all(|(x, y)| row_eq(x, y, numeric)) {
        return Ok(());
    }
    // Rounding can order near-equal numbers differently: match greedily.
    let mut used = vec![false; a.len()];
    for row in &e {
        match (0..a.len()).find(|&i| !used[i] && row_eq(a[i], row, numeric)) {
            Some(i) => used[i] = true,
            None => {
                return Err(format!("expected row {:?} is missing", row));
            }
        }
    }
    Ok(())
}

/// The verdict on statement `k` of query `q` that ran: `pass`, or `FAIL`
/// and why, from the answer file of `answers`.
pub fn check_answer(
    answers: &Path,
    q: usize,
    k: usize,
    batches: &[RecordBatch],
    schema: &SchemaRef,
) -> String {
    let path = answer_path(answers, q, k);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return format!("FAIL no answer {}", path.display());
    };
    let rows = match fluvia_sql::formats::output::render(batches) {
        Ok(r) => r,
        Err(e) => return format!("FAIL {e}"),
    };
    let numeric: Vec<bool> = schema
        .fields()
        .iter()
        .map(|f| fluvia_sql::formats::output::is_numeric(f.data_type()))
        .collect();
    match compare(&rows, &text, &numeric) {
        Ok(()) => "pass".to_string(),
        Err(e) => format!("FAIL {e}"),
    }
}

/// The verdict on a statement of query `q` that failed with `error`.
pub fn error_verdict(q: usize, error: &str) -> String {
    let msg = error.replace('\n', " ");
    // q90 divides by a count that is 0 at small scales.
    if q == 90 && msg.contains("Divide by zero") {
        "pass (division by zero, accepted)".to_string()
    } else {
        format!("FAIL error: {msg}")
    }
}

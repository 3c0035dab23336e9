//! Fluvia's CSV scan.
//!
//! DataFusion's [`CsvSource`] keeps what planning needs (options, table
//! schema, projection, byte ranges); [`FluviaCsvSource`] wraps it and reads
//! the rows itself. Field boundaries are found sixteen bytes at a time when
//! a buffer holds no quote and no carriage return, and by csv-core's own
//! state machine otherwise; only the columns a query needs are parsed,
//! column by column; and the runtime filters of the joins above (DataFusion's
//! dynamic filters, which its CSV source declines) are kept and applied to
//! the columns they read before the other columns of a batch are parsed.
//!
//! What this reader does not do exactly as arrow-csv does (escape and comment
//! bytes, another terminator, compressed files, short rows, a type without
//! a parser here) is read by DataFusion's CSV opener. A value the fast
//! parsers do not recognise goes to arrow's own parser, so every value
//! parses, or fails, as it does in DataFusion's CSV scan; failures carry
//! arrow-csv's wording, which [`crate::csv_errors`] turns into file, line
//! and column.

use datafusion::arrow::array::builder::{
    LargeStringBuilder, NullBufferBuilder, StringBuilder, StringViewBuilder,
};
use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, PrimitiveArray, RecordBatch, RecordBatchOptions,
};
use datafusion::arrow::compute::filter;
use datafusion::arrow::datatypes::{
    ArrowPrimitiveType, DataType, Date32Type, Decimal128Type, FieldRef, Float32Type, Float64Type,
    Int8Type, Int16Type, Int32Type, Int64Type, Schema, SchemaRef, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use datafusion::arrow::error::ArrowError;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result};
use datafusion::config::ConfigOptions;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{
    CsvSource, FileOpenFuture, FileOpener, FileScanConfig, FileScanConfigBuilder, FileSource,
};
use datafusion::datasource::projection::{ProjectionOpener, SplitProjection};
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::table_schema::TableSchema;
use datafusion::object_store::path::Path;
use datafusion::object_store::{GetOptions, ObjectStore};
use datafusion::physical_expr::expressions::DynamicFilterPhysicalExpr;
use datafusion::physical_expr::projection::ProjectionExprs;
use datafusion::physical_expr::utils::{collect_columns, reassign_expr_columns};
use datafusion::physical_expr::{PhysicalExpr, conjunction};
use datafusion::physical_plan::filter_pushdown::{FilterPushdownPropagation, PushedDown};
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::{DisplayFormatType, ExecutionPlan};
use futures::StreamExt;
use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

/// Bytes read from the file at a time. Rows are parsed per read, so this
/// bounds a scan's memory beside the batches it emits. Tests read little at
/// a time so that rows cross reads.
const READ_BYTES: u64 = if cfg!(test) { 1000 } else { 1 << 20 };

/// Set in a field's end when the field is quoted in a way that needs
/// csv-core's unquoting (doubled quotes, text after the closing quote).
const RAW: u32 = 1 << 31;

/// A slot that is not parsed.
const SKIP: u32 = u32::MAX;

/// Which reader parses a session's CSV tables
/// (`table.exec.csv.reader`); a [`datafusion::prelude::SessionConfig`]
/// extension, absent meaning Fluvia's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CsvReader {
    Fluvia,
    DataFusion,
}

impl CsvReader {
    /// The name it travels under among a job's DataFusion options.
    pub const OPTION: &'static str = "fluvia.csv.reader";

    pub fn parse(v: &str) -> fluvia_core::Result<CsvReader> {
        match v.to_ascii_lowercase().as_str() {
            "fluvia" => Ok(CsvReader::Fluvia),
            "datafusion" => Ok(CsvReader::DataFusion),
            _ => Err(fluvia_core::FluviaError::Config(format!(
                "{} must be 'fluvia' or 'datafusion', not '{v}'",
                fluvia_core::config::options::CSV_READER.key
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CsvReader::Fluvia => "fluvia",
            CsvReader::DataFusion => "datafusion",
        }
    }
}

/// DataFusion's CSV source, read by Fluvia (see the module comment).
#[derive(Debug, Clone)]
pub struct FluviaCsvSource {
    inner: CsvSource,
    batch_size: Option<usize>,
    /// Runtime filters pushed in by the joins above, in terms of the table
    /// schema. They only drop rows the join would drop, so a reader that
    /// cannot apply them may ignore them.
    predicate: Option<Arc<dyn PhysicalExpr>>,
}

impl FluviaCsvSource {
    pub fn new(inner: CsvSource) -> Self {
        FluviaCsvSource {
            inner,
            batch_size: None,
            predicate: None,
        }
    }

    /// DataFusion's source this one wraps (its options and projection).
    pub fn inner(&self) -> &CsvSource {
        &self.inner
    }

    /// The runtime filters this scan applies, if any.
    pub fn predicate(&self) -> Option<&Arc<dyn PhysicalExpr>> {
        self.predicate.as_ref()
    }

    pub fn with_predicate(mut self, predicate: Option<Arc<dyn PhysicalExpr>>) -> Self {
        self.predicate = predicate;
        self
    }

    /// `plan` reading with this source if it is a scan of DataFusion's CSV
    /// source; `plan` unchanged otherwise.
    pub fn wrap(plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        let Some(config) = plan
            .downcast_ref::<DataSourceExec>()
            .and_then(|ds| ds.data_source().downcast_ref::<FileScanConfig>())
        else {
            return plan;
        };
        let Some(csv) = config.file_source.downcast_ref::<CsvSource>() else {
            return plan;
        };
        let source: Arc<dyn FileSource> = Arc::new(FluviaCsvSource::new(csv.clone()));
        let config = FileScanConfigBuilder::from(config.clone())
            .with_source(source)
            .build();
        DataSourceExec::from_data_source(config)
    }

    fn with_inner(&self, inner: Arc<dyn FileSource>) -> Result<Self> {
        let csv = inner.downcast_ref::<CsvSource>().ok_or_else(|| {
            DataFusionError::Internal("CSV source changed into another source".into())
        })?;
        Ok(FluviaCsvSource {
            inner: csv.clone(),
            batch_size: self.batch_size,
            predicate: self.predicate.clone(),
        })
    }

    /// How to read the file columns `file_indices` (in that order), or
    /// `None` when DataFusion's opener has to.
    fn reading(&self, config: &FileScanConfig, file_indices: &[usize]) -> Option<Reading> {
        let csv = &self.inner;
        if config.file_compression_type.is_compressed()
            || csv.escape().is_some()
            || csv.comment().is_some()
            || csv.terminator().is_some()
            || csv.truncate_rows()
        {
            return None;
        }
        let file_schema = Arc::clone(csv.table_schema().file_schema());
        let columns = file_schema.fields().len();
        let mut slot = vec![SKIP; columns];
        let mut parsed: Vec<Column> = Vec::new();
        let mut slot_of = |index: usize, parsed: &mut Vec<Column>| -> Option<usize> {
            if slot[index] == SKIP {
                let field = Arc::clone(file_schema.fields().get(index)?);
                let kind = Kind::of(field.data_type())?;
                slot[index] = parsed.len() as u32;
                parsed.push(Column { index, field, kind });
            }
            Some(slot[index] as usize)
        };
        let output = file_indices
            .iter()
            .map(|&i| slot_of(i, &mut parsed))
            .collect::<Option<Vec<_>>>()?;
        let output_schema = Arc::new(file_schema.project(file_indices).ok()?);
        // Filters on file columns only (a partition column is not in the
        // file); a filter that does not fit is left to the join.
        let predicate = match &self.predicate {
            None => None,
            Some(p) => {
                let mut names: Vec<String> = collect_columns(p)
                    .iter()
                    .map(|c| c.name().to_string())
                    .collect();
                names.sort();
                let mut slots = Vec::new();
                let mut fields = Vec::new();
                for name in &names {
                    let index = file_schema.index_of(name).ok()?;
                    slots.push(slot_of(index, &mut parsed)?);
                    fields.push(file_schema.field(index).clone());
                }
                let schema = Arc::new(Schema::new(fields));
                let expr = reassign_expr_columns(Arc::clone(p), &schema).ok()?;
                Some(Filter {
                    expr,
                    schema,
                    slots,
                })
            }
        };
        Some(Reading {
            delimiter: csv.delimiter(),
            quote: csv.quote(),
            has_header: csv.has_header(),
            columns,
            slot,
            parsed,
            output,
            output_schema,
            predicate,
            batch_size: self.batch_size.unwrap_or(8192).max(1),
        })
    }
}

fn contains_dynamic_filter(expr: &Arc<dyn PhysicalExpr>) -> bool {
    let mut found = false;
    let _ = expr.apply(|e| {
        if e.downcast_ref::<DynamicFilterPhysicalExpr>().is_some() {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

impl FileSource for FluviaCsvSource {
    fn create_file_opener(
        &self,
        object_store: Arc<dyn ObjectStore>,
        base_config: &FileScanConfig,
        partition: usize,
    ) -> Result<Arc<dyn FileOpener>> {
        let file_schema = self.inner.table_schema().file_schema();
        let Some(projection) = self.inner.projection() else {
            return self
                .inner
                .create_file_opener(object_store, base_config, partition);
        };
        let split = SplitProjection::new(file_schema, projection);
        match self.reading(base_config, &split.file_indices) {
            Some(reading) => {
                let opener = Arc::new(FluviaCsvOpener {
                    reading: Arc::new(reading),
                    store: object_store,
                });
                ProjectionOpener::try_new(split, opener, file_schema)
            }
            None => self
                .inner
                .create_file_opener(object_store, base_config, partition),
        }
    }

    fn table_schema(&self) -> &TableSchema {
        self.inner.table_schema()
    }

    fn with_batch_size(&self, batch_size: usize) -> Arc<dyn FileSource> {
        let inner = self.inner.with_batch_size(batch_size);
        match self.with_inner(inner) {
            Ok(mut s) => {
                s.batch_size = Some(batch_size);
                Arc::new(s)
            }
            // Not reachable with DataFusion's CSV source; keep what we have.
            Err(_) => Arc::new(self.clone()),
        }
    }

    fn filter(&self) -> Option<Arc<dyn PhysicalExpr>> {
        self.predicate.clone()
    }

    fn projection(&self) -> Option<&ProjectionExprs> {
        self.inner.projection()
    }

    fn metrics(&self) -> &ExecutionPlanMetricsSet {
        self.inner.metrics()
    }

    fn file_type(&self) -> &str {
        "csv"
    }

    fn fmt_extra(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        self.inner.fmt_extra(t, f)?;
        match (&self.predicate, t) {
            (Some(p), DisplayFormatType::Default | DisplayFormatType::Verbose) => {
                write!(f, ", runtime_filter={p}")
            }
            _ => Ok(()),
        }
    }

    fn supports_repartitioning(&self) -> bool {
        self.inner.supports_repartitioning()
    }

    fn try_pushdown_filters(
        &self,
        filters: Vec<Arc<dyn PhysicalExpr>>,
        _config: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn FileSource>>> {
        // Only runtime filters, and only as a way to skip rows early: every
        // filter stays with the operator that pushed it ("No"), so a static
        // filter is not evaluated twice and a reader that cannot apply one
        // loses nothing.
        let file_schema = self.inner.table_schema().file_schema();
        let taken: Vec<Arc<dyn PhysicalExpr>> = filters
            .iter()
            .filter(|f| contains_dynamic_filter(f))
            .filter(|f| {
                collect_columns(f)
                    .iter()
                    .all(|c| file_schema.index_of(c.name()).is_ok())
            })
            .cloned()
            .collect();
        let result = FilterPushdownPropagation::with_parent_pushdown_result(vec![
            PushedDown::No;
            filters.len()
        ]);
        if taken.is_empty() {
            return Ok(result);
        }
        let predicate = conjunction(self.predicate.clone().into_iter().chain(taken));
        let source = self.clone().with_predicate(Some(predicate));
        Ok(result.with_updated_node(Arc::new(source) as Arc<dyn FileSource>))
    }

    fn try_pushdown_projection(
        &self,
        projection: &ProjectionExprs,
    ) -> Result<Option<Arc<dyn FileSource>>> {
        match self.inner.try_pushdown_projection(projection)? {
            Some(inner) => Ok(Some(Arc::new(self.with_inner(inner)?))),
            None => Ok(None),
        }
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        if self.inner.apply_expressions(f)? == TreeNodeRecursion::Stop {
            return Ok(TreeNodeRecursion::Stop);
        }
        match &self.predicate {
            Some(p) => f(p),
            None => Ok(TreeNodeRecursion::Continue),
        }
    }
}

/// One parsed column: its index in the file, its field and parser.
struct Column {
    index: usize,
    field: FieldRef,
    kind: Kind,
}

/// The runtime filter over the columns it reads (`slots`, in `schema`'s
/// order).
struct Filter {
    expr: Arc<dyn PhysicalExpr>,
    schema: SchemaRef,
    slots: Vec<usize>,
}

/// Everything an opener needs to read one scan's files.
struct Reading {
    delimiter: u8,
    quote: u8,
    has_header: bool,
    /// Fields per row.
    columns: usize,
    /// For each file column, its slot in `parsed`, or [`SKIP`].
    slot: Vec<u32>,
    parsed: Vec<Column>,
    /// Slots of the output columns, in output order.
    output: Vec<usize>,
    output_schema: SchemaRef,
    predicate: Option<Filter>,
    batch_size: usize,
}

/// Arrow types read here; anything else goes to DataFusion's opener.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Int8,
    Int16,
    Int32,
    Int64,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
    Float32,
    Float64,
    Decimal128(u8, i8),
    Date32,
    Utf8,
    LargeUtf8,
    Utf8View,
}

impl Kind {
    fn of(t: &DataType) -> Option<Kind> {
        Some(match t {
            DataType::Int8 => Kind::Int8,
            DataType::Int16 => Kind::Int16,
            DataType::Int32 => Kind::Int32,
            DataType::Int64 => Kind::Int64,
            DataType::UInt8 => Kind::UInt8,
            DataType::UInt16 => Kind::UInt16,
            DataType::UInt32 => Kind::UInt32,
            DataType::UInt64 => Kind::UInt64,
            DataType::Float32 => Kind::Float32,
            DataType::Float64 => Kind::Float64,
            DataType::Decimal128(p, s) => Kind::Decimal128(*p, *s),
            DataType::Date32 => Kind::Date32,
            DataType::Utf8 => Kind::Utf8,
            DataType::LargeUtf8 => Kind::LargeUtf8,
            DataType::Utf8View => Kind::Utf8View,
            _ => return None,
        })
    }
}

struct FluviaCsvOpener {
    reading: Arc<Reading>,
    store: Arc<dyn ObjectStore>,
}

impl FileOpener for FluviaCsvOpener {
    fn open(&self, file: PartitionedFile) -> Result<FileOpenFuture> {
        let reading = Arc::clone(&self.reading);
        let store = Arc::clone(&self.store);
        Ok(Box::pin(async move {
            let size = file.object_meta.size;
            // A range holds the lines that start in it: from the first line
            // start at or after `start` (the byte before it is a line end)
            // to the line holding byte `end - 1`, as DataFusion splits.
            let (from, stop_at, partial) = match &file.range {
                Some(r) if r.start > 0 => (r.start as u64 - 1, r.end as u64, true),
                Some(r) => (0, r.end as u64, false),
                None => (0, u64::MAX, false),
            };
            let scan = Scan {
                header: reading.has_header && from == 0 && !partial,
                reading,
                store,
                location: file.object_meta.location.clone(),
                source: Source::Unopened,
                size,
                next_read: from,
                stop_at,
                partial,
                buf: BUFFERS.take_bytes(),
                lo: 0,
                hi: 0,
                buf_start: from,
                lines: 0,
                closed: false,
                finished: false,
                starts: BUFFERS.take_starts(),
                ready: VecDeque::new(),
            };
            let stream = futures::stream::try_unfold(scan, |mut scan| async move {
                let batch = scan.next_batch().await?;
                Ok(batch.map(|b| (b, scan)))
            });
            Ok(stream.boxed())
        }))
    }
}

/// Where a scan's bytes come from: a local file is read straight into the
/// scan's buffer; any other store's stream is copied into it.
enum Source {
    Unopened,
    File(std::fs::File),
    Stream(futures::stream::BoxStream<'static, datafusion::object_store::Result<bytes::Bytes>>),
}

/// One file (or byte range of one) being read.
struct Scan {
    reading: Arc<Reading>,
    store: Arc<dyn ObjectStore>,
    location: Path,
    source: Source,
    size: u64,
    next_read: u64,
    /// Rows starting at or after this offset belong to the next range.
    stop_at: u64,
    /// The first bytes up to a line end belong to the range before.
    partial: bool,
    /// The first line is the header.
    header: bool,
    /// Read but not yet parsed: `buf[lo..hi]`, from the start of a row.
    /// The buffer is reused, so a read neither allocates nor zeroes.
    buf: Vec<u8>,
    lo: usize,
    hi: usize,
    /// File offset of `buf[lo]`.
    buf_start: u64,
    /// Rows parsed so far (for messages).
    lines: usize,
    /// A line end was added after the file's last byte.
    closed: bool,
    finished: bool,
    /// Field starts of the rows being parsed (reused).
    starts: Vec<u32>,
    ready: VecDeque<RecordBatch>,
}

impl Drop for Scan {
    fn drop(&mut self) {
        BUFFERS.give(
            std::mem::take(&mut self.buf),
            std::mem::take(&mut self.starts),
        );
    }
}

/// Read buffers and field starts of finished scans, for the next: a new
/// buffer of megabytes costs page faults and zeroing on every scan, and a
/// query scans dozens of times.
struct Buffers(std::sync::Mutex<Kept>);

struct Kept {
    bytes: Vec<Vec<u8>>,
    starts: Vec<Vec<u32>>,
}

/// Buffers kept: enough for the scans of a few queries' tasks at once.
const KEPT_BUFFERS: usize = 8;

static BUFFERS: Buffers = Buffers(std::sync::Mutex::new(Kept {
    bytes: Vec::new(),
    starts: Vec::new(),
}));

impl Buffers {
    fn take_bytes(&self) -> Vec<u8> {
        self.0
            .lock()
            .ok()
            .and_then(|mut b| b.bytes.pop())
            .unwrap_or_default()
    }

    fn take_starts(&self) -> Vec<u32> {
        self.0
            .lock()
            .ok()
            .and_then(|mut b| b.starts.pop())
            .unwrap_or_default()
    }

    fn give(&self, bytes: Vec<u8>, starts: Vec<u32>) {
        if let Ok(mut b) = self.0.lock() {
            // Only buffers of a usual size: one very long line's buffer is
            // let go.
            if b.bytes.len() < KEPT_BUFFERS && bytes.len() <= 2 * READ_BYTES as usize {
                b.bytes.push(bytes);
            }
            if b.starts.len() < KEPT_BUFFERS && starts.len() <= 2 * READ_BYTES as usize {
                b.starts.push(starts);
            }
        }
    }
}

impl Scan {
    /// Room for `n` more bytes after `hi`, keeping `buf[lo..hi]`.
    fn make_room(&mut self, n: usize) {
        if self.hi + n > self.buf.len() && self.lo > 0 {
            self.buf.copy_within(self.lo..self.hi, 0);
            self.hi -= self.lo;
            self.lo = 0;
        }
        if self.hi + n > self.buf.len() {
            self.buf.resize(self.hi + n, 0);
        }
    }

    async fn read(&mut self) -> Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        if let Source::Unopened = self.source {
            let got = self
                .store
                .get_opts(
                    &self.location,
                    GetOptions {
                        range: Some((self.next_read..self.size).into()),
                        ..GetOptions::default()
                    },
                )
                .await?;
            self.source = match got.payload {
                datafusion::object_store::GetResultPayload::File(mut f, _) => {
                    f.seek(SeekFrom::Start(self.next_read))
                        .map_err(|e| DataFusionError::External(Box::new(e)))?;
                    Source::File(f)
                }
                datafusion::object_store::GetResultPayload::Stream(s) => Source::Stream(s),
            };
        }
        match &mut self.source {
            Source::Unopened => Ok(()),
            Source::File(_) => {
                let n = (self.size - self.next_read).min(READ_BYTES) as usize;
                self.make_room(n);
                let Source::File(f) = &mut self.source else {
                    return Ok(());
                };
                f.read_exact(&mut self.buf[self.hi..self.hi + n])
                    .map_err(|e| {
                        DataFusionError::Execution(format!("reading {}: {e}", self.location))
                    })?;
                self.hi += n;
                self.next_read += n as u64;
                Ok(())
            }
            Source::Stream(s) => match s.next().await {
                Some(bytes) => {
                    let bytes = bytes?;
                    self.make_room(bytes.len());
                    self.buf[self.hi..self.hi + bytes.len()].copy_from_slice(&bytes);
                    self.hi += bytes.len();
                    self.next_read += bytes.len() as u64;
                    Ok(())
                }
                None => Err(DataFusionError::Execution(format!(
                    "{} ended before its {} bytes",
                    self.location, self.size
                ))),
            },
        }
    }

    /// Drops `n` parsed bytes from the front.
    fn consume(&mut self, n: usize) {
        self.lo += n;
        self.buf_start += n as u64;
    }

    async fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            if let Some(b) = self.ready.pop_front() {
                return Ok(Some(b));
            }
            if self.finished {
                return Ok(None);
            }
            if self.next_read < self.size {
                self.read().await?;
            }
            let eof = self.next_read >= self.size;
            if eof && !self.closed {
                self.closed = true;
                if !matches!(
                    self.buf[self.lo..self.hi].last(),
                    None | Some(b'\n') | Some(b'\r')
                ) {
                    self.make_room(1);
                    self.buf[self.hi] = b'\n';
                    self.hi += 1;
                }
            }
            if self.partial || self.header {
                match memchr::memchr(b'\n', &self.buf[self.lo..self.hi]) {
                    Some(i) => {
                        self.consume(i + 1);
                        if self.partial {
                            self.partial = false;
                        } else {
                            self.header = false;
                        }
                        continue;
                    }
                    None if eof => {
                        self.finished = true;
                        continue;
                    }
                    None => {
                        if self.partial {
                            self.consume(self.hi - self.lo);
                        }
                        continue;
                    }
                }
            }
            let stop = self.stop_at.saturating_sub(self.buf_start);
            let stop = usize::try_from(stop).unwrap_or(usize::MAX);
            let r = Arc::clone(&self.reading);
            let buf = &self.buf[self.lo..self.hi];
            let (fields, count, consumed, done) =
                tokenize(buf, &r, stop, self.lines, &mut self.starts)?;
            if eof && !done && consumed < buf.len() {
                return Err(csv_error(format!(
                    "unterminated quoted field in line {} of {}",
                    self.lines + count + 1,
                    self.location
                )));
            }
            let mut start = 0;
            while start < count {
                let end = (start + r.batch_size).min(count);
                if let Some(batch) = build_batch(&r, buf, &fields, start..end, self.lines)? {
                    self.ready.push_back(batch);
                }
                start = end;
            }
            if let Fields::Flat { starts, .. } = fields {
                self.starts = starts;
            }
            self.lines += count;
            self.consume(consumed);
            if done || (eof && self.lo == self.hi) {
                self.finished = true;
            }
            if self.hi - self.lo > (1 << 30) {
                return Err(csv_error(format!(
                    "a line of {} is longer than 1 GiB",
                    self.location
                )));
            }
        }
    }
}

fn csv_error(message: String) -> DataFusionError {
    DataFusionError::ArrowError(Box::new(ArrowError::CsvError(message)), None)
}

/// Where the fields of a read's rows are.
enum Fields {
    /// Rows without quotes: the start of every field, row after row
    /// (`columns` per row), and one past the last row. A field ends one byte
    /// before the next starts.
    Flat { starts: Vec<u32>, columns: usize },
    /// Rows with quotes: per parsed slot, the start and end of each row's
    /// field (`end | RAW` when it needs unquoting).
    Bounds(Vec<Vec<u32>>),
}

/// Splits the whole rows of `buf` (which starts at a row) into fields, up
/// to the first row starting at or after `stop`. Returns the fields, the
/// rows, the bytes consumed (whole rows) and whether `stop` was reached.
/// `starts` is a buffer to reuse.
fn tokenize(
    buf: &[u8],
    r: &Reading,
    stop: usize,
    lines: usize,
    starts: &mut Vec<u32>,
) -> Result<(Fields, usize, usize, bool)> {
    if buf.len() >= RAW as usize {
        return Err(csv_error("a read buffer of 2 GiB or more".into()));
    }
    let whole = memchr::memrchr(b'\n', buf).map_or(0, |i| i + 1);
    let mut flat = std::mem::take(starts);
    let plain = tokenize_plain(&buf[..whole], r.delimiter, r.quote, r.columns, &mut flat);
    if let Some(rows) = plain {
        // The rows that start before `stop`: all of them but in a range's
        // last read.
        let n = r.columns;
        let row_start = |row: usize| flat[row * n] as usize;
        let kept = if rows == 0 || row_start(rows - 1) < stop {
            rows
        } else {
            let (mut lo, mut hi) = (0, rows - 1);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if row_start(mid) < stop {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            lo
        };
        let consumed = if kept < rows { row_start(kept) } else { whole };
        let done = kept < rows || consumed >= stop;
        let fields = Fields::Flat {
            starts: flat,
            columns: n,
        };
        return Ok((fields, kept, consumed, done));
    }
    // Quotes, carriage returns, empty lines or a row with another number
    // of fields: the careful reader reads the one, skips the other and names
    // the last.
    *starts = flat;
    let mut bounds = vec![Vec::new(); r.parsed.len()];
    let (count, consumed, done) = tokenize_quoted(buf, r, stop, lines, &mut bounds)?;
    Ok((Fields::Bounds(bounds), count, consumed, done))
}

fn wrong_fields(line: usize, expected: usize, got: usize) -> DataFusionError {
    csv_error(format!(
        "incorrect number of fields for line {line}, expected {expected} got {got}"
    ))
}

/// Masks of a block: delimiters and line feeds, line feeds, and quotes and
/// carriage returns (which the plain reader leaves to the careful one).
#[cfg(target_arch = "x86_64")]
fn classify(block: &[u8; 64], delimiter: u8, quote: u8) -> (u64, u64, u64) {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };
    #[target_feature(enable = "sse2")]
    fn sse2(block: &[u8; 64], delimiter: u8, quote: u8) -> (u64, u64, u64) {
        let d = _mm_set1_epi8(delimiter as i8);
        let n = _mm_set1_epi8(b'\n' as i8);
        let q = _mm_set1_epi8(quote as i8);
        let cr = _mm_set1_epi8(b'\r' as i8);
        let (mut any, mut lines, mut special) = (0u64, 0u64, 0u64);
        for (i, lane) in block.chunks_exact(16).enumerate() {
            // SAFETY: `lane` is 16 readable bytes; the load is unaligned.
            let v = unsafe { _mm_loadu_si128(lane.as_ptr().cast::<__m128i>()) };
            let nl = _mm_cmpeq_epi8(v, n);
            let hit = _mm_or_si128(_mm_cmpeq_epi8(v, d), nl);
            let odd = _mm_or_si128(_mm_cmpeq_epi8(v, q), _mm_cmpeq_epi8(v, cr));
            any |= u64::from(_mm_movemask_epi8(hit) as u16) << (16 * i);
            lines |= u64::from(_mm_movemask_epi8(nl) as u16) << (16 * i);
            special |= u64::from(_mm_movemask_epi8(odd) as u16) << (16 * i);
        }
        (any, lines, special)
    }
    // SAFETY: SSE2 is part of every x86_64 target.
    unsafe { sse2(block, delimiter, quote) }
}

#[cfg(not(target_arch = "x86_64"))]
fn classify(block: &[u8; 64], delimiter: u8, quote: u8) -> (u64, u64, u64) {
    classify_scalar(block, delimiter, quote)
}

#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn classify_scalar(block: &[u8; 64], delimiter: u8, quote: u8) -> (u64, u64, u64) {
    block
        .iter()
        .enumerate()
        .fold((0, 0, 0), |(any, lines, special), (i, &b)| {
            (
                any | (u64::from(b == delimiter || b == b'\n') << i),
                lines | (u64::from(b == b'\n') << i),
                special | (u64::from(b == quote || b == b'\r') << i),
            )
        })
}

/// Rows without quotes or carriage returns, `buf` ending at a line end:
/// every delimiter ends a field and every line feed a row. Fills `starts`
/// (see [`Fields::Flat`]; its length only grows, so it is reused without
/// zeroing) and returns the rows, or `None` unless every row has `columns`
/// fields and the rows hold no quote or carriage return.
fn tokenize_plain(
    buf: &[u8],
    delimiter: u8,
    quote: u8,
    columns: usize,
    starts: &mut Vec<u32>,
) -> Option<usize> {
    if columns == 0 {
        return None;
    }
    if starts.is_empty() {
        starts.resize(64 << 10, 0);
    }
    starts[0] = 0;
    // `out[k]` is where the field after the k-th separator starts; the
    // separator stored at `row_end` must end a row.
    let mut k = 1usize;
    let mut row_end = columns;
    let (mut rows, mut line_ends) = (0usize, 0usize);
    let mut base = 0usize;
    let mut tail;
    while base < buf.len() {
        // Room for a block's separators; grown rarely, never zeroed again.
        if k + 64 >= starts.len() {
            let more = starts.len().max(k + 65);
            starts.resize(starts.len() + more, 0);
        }
        let out = &mut starts[..];
        let n = (buf.len() - base).min(64);
        let block: &[u8; 64] = match buf[base..].first_chunk::<64>() {
            Some(b) => b,
            None => {
                tail = [0u8; 64];
                tail[..n].copy_from_slice(&buf[base..]);
                &tail
            }
        };
        let (mut any, mut lines, mut special) = classify(block, delimiter, quote);
        if n < 64 {
            let valid = (1u64 << n) - 1;
            any &= valid;
            lines &= valid;
            special &= valid;
        }
        if special != 0 {
            return None;
        }
        // Line feeds are sparse: cheaper than a population count without
        // the POPCNT instruction.
        while lines != 0 {
            line_ends += 1;
            lines &= lines - 1;
        }
        while any != 0 {
            let p = base + any.trailing_zeros() as usize;
            any &= any - 1;
            out[k] = (p + 1) as u32;
            if k == row_end {
                if buf[p] != b'\n' {
                    return None;
                }
                rows += 1;
                row_end += columns;
            }
            k += 1;
        }
        base += 64;
    }
    // Every row's last separator is a line feed and there are no others.
    (line_ends == rows && k == rows * columns + 1).then_some(rows)
}

/// Drops the fields recorded for the unfinished row (its first `col`).
fn rollback(bounds: &mut [Vec<u32>], r: &Reading, rows: usize, col: usize) {
    for &s in r.slot.iter().take(col) {
        if s != SKIP {
            bounds[s as usize].truncate(2 * rows);
        }
    }
}

/// Rows with quotes or carriage returns, with csv-core's rules: a quote
/// opens a quoted field only at its start, `""` inside one is a quote, a
/// line feed or carriage return ends a row (`\r\n` once), empty lines are
/// skipped.
fn tokenize_quoted(
    buf: &[u8],
    r: &Reading,
    stop: usize,
    lines: usize,
    bounds: &mut [Vec<u32>],
) -> Result<(usize, usize, bool)> {
    let mut count = 0usize;
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        StartRecord,
        StartField,
        InField,
        InQuoted,
        QuoteInQuoted,
    }
    let (d, q) = (r.delimiter, r.quote);
    let mut state = State::StartRecord;
    let mut col = 0usize;
    let mut field_start = 0usize;
    let mut row_start = 0usize;
    // The field was quoted: simple (content between the quotes) or raw.
    let mut quoted = false;
    let mut raw = false;
    if stop == 0 {
        return Ok((0, 0, true));
    }
    let mut i = 0usize;
    while i < buf.len() {
        let c = buf[i];
        let term = c == b'\n' || c == b'\r';
        match state {
            State::StartRecord => {
                if term {
                    i += 1;
                    row_start = i;
                    continue;
                }
                if row_start >= stop {
                    return Ok((count, row_start, true));
                }
                state = State::StartField;
                continue;
            }
            State::StartField => {
                field_start = i;
                quoted = false;
                raw = false;
                if c == q {
                    quoted = true;
                    state = State::InQuoted;
                    i += 1;
                    continue;
                }
                state = State::InField;
                continue;
            }
            State::InField => {
                if c != d && !term {
                    if c == q && quoted {
                        raw = true;
                    }
                    i += 1;
                    continue;
                }
            }
            State::InQuoted => {
                if c == q {
                    state = State::QuoteInQuoted;
                }
                i += 1;
                continue;
            }
            State::QuoteInQuoted => {
                if c == q {
                    raw = true;
                    state = State::InQuoted;
                    i += 1;
                    continue;
                }
                if c != d && !term {
                    raw = true;
                    state = State::InField;
                    i += 1;
                    continue;
                }
            }
        }
        // `c` ends the field at `i` (a delimiter or a terminator).
        if let Some(&s) = r.slot.get(col)
            && s != SKIP
        {
            let b = &mut bounds[s as usize];
            if raw {
                b.push(field_start as u32);
                b.push(i as u32 | RAW);
            } else if quoted {
                b.push(field_start as u32 + 1);
                b.push(i as u32 - 1);
            } else {
                b.push(field_start as u32);
                b.push(i as u32);
            }
        }
        col += 1;
        i += 1;
        if term {
            if col != r.columns {
                return Err(wrong_fields(lines + count + 1, r.columns, col));
            }
            count += 1;
            col = 0;
            // `\r\n` is one terminator; a line feed after it is skipped by
            // StartRecord like an empty line.
            row_start = i;
            state = State::StartRecord;
        } else {
            state = State::StartField;
        }
    }
    if state == State::StartRecord {
        // Only terminators after the last row.
        return Ok((count, row_start, row_start >= stop));
    }
    rollback(bounds, r, count, col);
    Ok((count, row_start, false))
}

/// csv-core's reading of a quoted field with doubled quotes or text after
/// its closing quote.
fn unquote(raw: &[u8], quote: u8, into: &mut Vec<u8>) {
    into.clear();
    let mut inside = false;
    let mut i = 0;
    if raw.first() == Some(&quote) {
        inside = true;
        i = 1;
    }
    while i < raw.len() {
        let c = raw[i];
        if inside {
            if c == quote {
                if raw.get(i + 1) == Some(&quote) {
                    into.push(quote);
                    i += 2;
                    continue;
                }
                inside = false;
            } else {
                into.push(c);
            }
        } else {
            into.push(c);
        }
        i += 1;
    }
}

/// What a column's values are parsed from.
struct Values<'a> {
    buf: &'a [u8],
    fields: &'a Fields,
    slot: usize,
    quote: u8,
    column: &'a Column,
    /// Rows before this batch, for messages.
    line: usize,
}

impl Values<'_> {
    fn text<'s>(&self, f: &'s [u8], row: usize) -> Result<&'s str> {
        std::str::from_utf8(f).map_err(|_| {
            csv_error(format!(
                "Encountered invalid UTF-8 data for line {} and field {}",
                self.line + row + 1,
                self.column.index + 1
            ))
        })
    }

    fn parse_error(&self, s: &str, row: usize) -> DataFusionError {
        DataFusionError::ArrowError(
            Box::new(ArrowError::ParseError(format!(
                "Error while parsing value '{s}' as type '{}' for column {} at line {}",
                self.column.field.data_type(),
                self.column.index,
                self.line + row
            ))),
            None,
        )
    }

    fn primitive<T>(
        &self,
        rows: &[u32],
        fast: impl Fn(&[u8]) -> Option<T::Native>,
        slow: impl Fn(&str) -> Option<T::Native>,
    ) -> Result<ArrayRef>
    where
        T: ArrowPrimitiveType,
    {
        let mut values = Vec::with_capacity(rows.len());
        let mut nulls = NullBufferBuilder::new(rows.len());
        self.each_field(rows, |row, f| {
            if f.is_empty() {
                values.push(T::Native::default());
                nulls.append_null();
                return Ok(());
            }
            let v = match fast(f) {
                Some(v) => v,
                None => {
                    let s = self.text(f, row)?;
                    slow(s).ok_or_else(|| self.parse_error(s, row))?
                }
            };
            values.push(v);
            nulls.append_non_null();
            Ok(())
        })?;
        let array = PrimitiveArray::<T>::new(values.into(), nulls.finish())
            .with_data_type(self.column.field.data_type().clone());
        Ok(Arc::new(array))
    }

    fn build(&self, rows: &[u32]) -> Result<ArrayRef> {
        use datafusion::arrow::compute::kernels::cast_utils::Parser;
        macro_rules! int {
            ($t:ty, $native:ty) => {
                self.primitive::<$t>(
                    rows,
                    |b| parse_int(b).and_then(|v| <$native>::try_from(v).ok()),
                    <$t>::parse,
                )
            };
        }
        match self.column.kind {
            Kind::Int8 => int!(Int8Type, i8),
            Kind::Int16 => int!(Int16Type, i16),
            Kind::Int32 => int!(Int32Type, i32),
            Kind::Int64 => int!(Int64Type, i64),
            Kind::UInt8 => int!(UInt8Type, u8),
            Kind::UInt16 => int!(UInt16Type, u16),
            Kind::UInt32 => int!(UInt32Type, u32),
            Kind::UInt64 => int!(UInt64Type, u64),
            Kind::Float32 => self.primitive::<Float32Type>(rows, |_| None, Float32Type::parse),
            Kind::Float64 => self.primitive::<Float64Type>(rows, |_| None, Float64Type::parse),
            Kind::Date32 => self.primitive::<Date32Type>(rows, parse_date, Date32Type::parse),
            Kind::Decimal128(p, s) => self.primitive::<Decimal128Type>(
                rows,
                |b| parse_decimal(b, p, s),
                |t| {
                    datafusion::arrow::compute::kernels::cast_utils::parse_decimal::<
                            Decimal128Type,
                        >(t, p, s)
                        .ok()
                },
            ),
            Kind::Utf8View => {
                let mut b = StringViewBuilder::with_capacity(rows.len());
                self.strings(rows, |s| match s {
                    Some(s) => b.append_value(s),
                    None => b.append_null(),
                })?;
                Ok(Arc::new(b.finish()))
            }
            Kind::Utf8 => {
                let mut b = StringBuilder::with_capacity(rows.len(), rows.len() * 16);
                self.strings(rows, |s| b.append_option(s))?;
                Ok(Arc::new(b.finish()))
            }
            Kind::LargeUtf8 => {
                let mut b = LargeStringBuilder::with_capacity(rows.len(), rows.len() * 16);
                self.strings(rows, |s| b.append_option(s))?;
                Ok(Arc::new(b.finish()))
            }
        }
    }

    fn strings(&self, rows: &[u32], mut append: impl FnMut(Option<&str>)) -> Result<()> {
        self.each_field(rows, |row, f| {
            if f.is_empty() {
                append(None);
            } else {
                append(Some(self.text(f, row)?));
            }
            Ok(())
        })
    }

    /// Calls `f` with each row of `rows` and the text of its field; the
    /// layout is matched once, outside the loop.
    fn each_field(
        &self,
        rows: &[u32],
        mut f: impl FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        match self.fields {
            Fields::Flat { starts, columns } => {
                let c = self.column.index;
                for &row in rows {
                    let j = row as usize * columns + c;
                    let (start, end) = (starts[j] as usize, starts[j + 1] as usize - 1);
                    f(row as usize, &self.buf[start..end])?;
                }
            }
            Fields::Bounds(bounds) => {
                let bounds = &bounds[self.slot];
                let mut scratch = Vec::new();
                for &row in rows {
                    let row = row as usize;
                    let start = bounds[2 * row] as usize;
                    let end = bounds[2 * row + 1];
                    if end & RAW != 0 {
                        unquote(
                            &self.buf[start..(end & !RAW) as usize],
                            self.quote,
                            &mut scratch,
                        );
                        f(row, &scratch)?;
                    } else {
                        f(row, &self.buf[start..end as usize])?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// `-?[0-9]{1,18}`; anything else goes to arrow's parser.
fn parse_int(b: &[u8]) -> Option<i64> {
    let (negative, digits) = match b.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, b),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let mut v: i64 = 0;
    for &c in digits {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v * 10 + i64::from(d);
    }
    Some(if negative { -v } else { v })
}

/// `-?[0-9]+(\.[0-9]+)?` with at most `scale` decimals, `precision -
/// scale` integer digits and 18 digits in all; anything else goes to
/// arrow's parser.
fn parse_decimal(b: &[u8], precision: u8, scale: i8) -> Option<i128> {
    let scale = u32::try_from(scale).ok()?;
    let (negative, digits) = match b.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, b),
    };
    let mut v: i64 = 0;
    let mut int_digits = 0u32;
    let mut decimals: Option<u32> = None;
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    for &c in digits {
        if c == b'.' {
            if decimals.is_some() || int_digits == 0 {
                return None;
            }
            decimals = Some(0);
            continue;
        }
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v.wrapping_mul(10).wrapping_add(i64::from(d));
        match &mut decimals {
            Some(n) => *n += 1,
            None => int_digits += 1,
        }
    }
    let decimals = match decimals {
        Some(0) => return None,
        Some(n) => n,
        None => 0,
    };
    if int_digits == 0
        || int_digits + decimals > 18
        || decimals > scale
        || int_digits + scale > u32::from(precision)
    {
        return None;
    }
    let v = i128::from(v) * 10i128.pow(scale - decimals);
    Some(if negative { -v } else { v })
}

/// `YYYY-MM-DD` as days since 1970-01-01; anything else goes to arrow's
/// parser.
fn parse_date(b: &[u8]) -> Option<i32> {
    let b: &[u8; 10] = b.try_into().ok()?;
    if b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let num = |s: &[u8]| -> Option<i32> {
        s.iter().try_fold(0i32, |v, &c| {
            let d = c.wrapping_sub(b'0');
            (d <= 9).then_some(v * 10 + i32::from(d))
        })
    };
    let (y, m, d) = (num(&b[..4])?, num(&b[5..7])?, num(&b[8..])?);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days_in_month = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if d < 1 || d > days_in_month {
        return None;
    }
    // Days from the civil date (proleptic Gregorian), March-based years.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some(era * 146_097 + doe - 719_468)
}

/// Rows `range` of `rows` as a batch of the output columns; the runtime
/// filter first, on its own columns, so rows it drops are never parsed
/// further. `None` when the filter drops every row.
fn build_batch(
    r: &Reading,
    buf: &[u8],
    fields: &Fields,
    range: std::ops::Range<usize>,
    lines: usize,
) -> Result<Option<RecordBatch>> {
    let values = |slot: usize| Values {
        buf,
        fields,
        slot,
        quote: r.quote,
        column: &r.parsed[slot],
        line: lines,
    };
    let all: Vec<u32> = (range.start as u32..range.end as u32).collect();
    let mut built: Vec<Option<ArrayRef>> = vec![None; r.parsed.len()];
    let mut selected = all;
    if let Some(p) = &r.predicate {
        let columns = p
            .slots
            .iter()
            .map(|&s| values(s).build(&selected))
            .collect::<Result<Vec<_>>>()?;
        let batch = RecordBatch::try_new(Arc::clone(&p.schema), columns.clone())?;
        let mask = p.expr.evaluate(&batch)?.into_array(batch.num_rows())?;
        let mask = mask
            .as_any()
            .downcast_ref::<BooleanArray>()
            .ok_or_else(|| DataFusionError::Internal("runtime filter is not boolean".into()))?;
        let kept = mask.true_count();
        if kept == 0 {
            return Ok(None);
        }
        let all_kept = kept == mask.len();
        for (&s, column) in p.slots.iter().zip(columns) {
            built[s] = Some(if all_kept {
                column
            } else {
                filter(&column, mask)?
            });
        }
        if !all_kept {
            selected = selected
                .iter()
                .zip(mask.iter())
                .filter(|(_, keep)| *keep == Some(true))
                .map(|(&row, _)| row)
                .collect();
        }
    }
    let mut columns = Vec::with_capacity(r.output.len());
    for &s in &r.output {
        if built[s].is_none() {
            built[s] = Some(values(s).build(&selected)?);
        }
        if let Some(a) = &built[s] {
            columns.push(Arc::clone(a));
        }
    }
    let options = RecordBatchOptions::new().with_row_count(Some(selected.len()));
    Ok(Some(RecordBatch::try_new_with_options(
        Arc::clone(&r.output_schema),
        columns,
        &options,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_matches_the_scalar_reference() {
        let text: Vec<u8> = (0..64u32)
            .map(|i| match i % 7 {
                0 => b',',
                3 => b'\n',
                5 => b'|',
                _ => b'a' + (i % 26) as u8,
            })
            .collect();
        let block: &[u8; 64] = text.as_slice().try_into().unwrap();
        for (d, q) in [(b',', b'"'), (b'|', b'a'), (b',', 0)] {
            assert_eq!(classify(block, d, q), classify_scalar(block, d, q));
        }
        let (any, lines, special) = classify_scalar(block, b',', b'b');
        assert_eq!(any.count_ones(), 19);
        assert_eq!(lines.count_ones(), 9);
        assert_eq!(special.count_ones(), 3);
    }

    #[test]
    fn fast_parsers_agree_with_arrow() {
        use datafusion::arrow::compute::kernels::cast_utils::{Parser, parse_decimal as arrow};
        for s in ["0", "-1", "123456789012345678", "2147483647", "-2147483648"] {
            assert_eq!(parse_int(s.as_bytes()), Int64Type::parse(s), "{s}");
        }
        assert_eq!(
            parse_int(b"1234567890123456789"),
            None,
            "19 digits go to arrow"
        );
        assert_eq!(parse_int(b"+1"), None);
        assert_eq!(parse_int(b"1a"), None);
        for s in ["0.00", "-12.5", "99999.99", "7", "-0.01", "00012.30"] {
            assert_eq!(
                parse_decimal(s.as_bytes(), 7, 2),
                arrow::<Decimal128Type>(s, 7, 2).ok(),
                "{s}"
            );
        }
        assert_eq!(
            parse_decimal(b"1.234", 7, 2),
            None,
            "more decimals than the scale"
        );
        assert_eq!(
            parse_decimal(b"123456.1", 7, 2),
            None,
            "too many integer digits"
        );
        assert_eq!(parse_decimal(b"1.", 7, 2), None);
        assert_eq!(
            parse_decimal(b"9999999999999999999", 38, 0),
            None,
            "19 digits go to arrow"
        );
        assert_eq!(parse_decimal(b"1.2.3", 7, 2), None);
        for s in [
            "1970-01-01",
            "2000-02-29",
            "1998-01-02",
            "2003-12-31",
            "1900-03-01",
            "0001-01-01",
        ] {
            assert_eq!(parse_date(s.as_bytes()), Date32Type::parse(s), "{s}");
        }
        assert_eq!(parse_date(b"2001-02-29"), None);
        assert_eq!(parse_date(b"2001-13-01"), None);
        assert_eq!(parse_date(b"2001-1-01x"), None);
    }

    use datafusion::arrow::compute::concat_batches;
    use datafusion::config::CsvOptions;
    use datafusion::datasource::physical_plan::FileGroup;
    use datafusion::execution::object_store::ObjectStoreUrl;
    use datafusion::physical_plan::collect_partitioned;
    use datafusion::prelude::SessionContext;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            datafusion::arrow::datatypes::Field::new("id", DataType::Int32, false),
            datafusion::arrow::datatypes::Field::new("name", DataType::Utf8View, true),
            datafusion::arrow::datatypes::Field::new("price", DataType::Decimal128(7, 2), true),
            datafusion::arrow::datatypes::Field::new("day", DataType::Date32, true),
            datafusion::arrow::datatypes::Field::new("big", DataType::Int64, true),
            datafusion::arrow::datatypes::Field::new("note", DataType::Utf8, true),
            datafusion::arrow::datatypes::Field::new("ratio", DataType::Float64, true),
        ]))
    }

    /// Rows with what CSV files hold: empty fields, quoted delimiters,
    /// doubled quotes, text after a closing quote, `\r\n` and empty lines,
    /// values only arrow's parsers read (`+7`, `1e3`, 19 digits).
    fn text(rows: usize, quotes: bool) -> String {
        let mut s = String::from("id,name,price,day,big,note,ratio\n");
        for i in 0..rows {
            let name = match (i % 9, quotes) {
                (0, _) => String::new(),
                (1, true) => "\"a, b\"".to_string(),
                (2, true) => "\"say \"\"hi\"\"\"".to_string(),
                (3, true) => "\"ab\"cd".to_string(),
                (4, true) => "x\"y".to_string(),
                _ => format!("name{i}"),
            };
            let price = match i % 5 {
                0 => String::new(),
                1 => format!("-{}.5", i % 1000),
                2 => "+7".to_string(),
                _ => format!("{}.{:02}", i % 99_999, i % 100),
            };
            let day = match i % 6 {
                0 => String::new(),
                1 => "2000-02-29".to_string(),
                _ => format!("19{:02}-{:02}-{:02}", i % 100, i % 12 + 1, i % 28 + 1),
            };
            let big = match i % 4 {
                0 => "-1234567890123456789".to_string(),
                1 => String::new(),
                _ => format!("{}", i as i64 * 1_000_003),
            };
            let end = if quotes && i % 11 == 0 { "\r\n" } else { "\n" };
            s.push_str(&format!(
                "{i},{name},{price},{day},{big},n{},{}{end}",
                i % 13,
                if i % 3 == 0 {
                    "1e3".into()
                } else {
                    format!("{i}.25")
                }
            ));
            if quotes && i % 50 == 7 {
                s.push('\n');
            }
        }
        s
    }

    fn write(name: &str, text: &str) -> (String, u64) {
        let dir = std::env::temp_dir().join(format!("fluvia-csv-scan-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        (path.to_string_lossy().into_owned(), text.len() as u64)
    }

    /// The file read in `ranges` byte ranges, once by DataFusion's scan and
    /// once by Fluvia's, with `projection`.
    fn scans(
        path: &str,
        size: u64,
        ranges: u64,
        projection: Option<Vec<usize>>,
        predicate: Option<Arc<dyn PhysicalExpr>>,
    ) -> (Arc<dyn ExecutionPlan>, Arc<dyn ExecutionPlan>) {
        let options = CsvOptions {
            has_header: Some(true),
            ..Default::default()
        };
        let csv = CsvSource::new(schema()).with_csv_options(options);
        let step = size.div_ceil(ranges);
        let groups = (0..ranges)
            .map(|k| {
                let (a, b) = (k * step, ((k + 1) * step).min(size));
                let file = if ranges == 1 {
                    PartitionedFile::new(path.to_string(), size)
                } else {
                    PartitionedFile::new_with_range(path.to_string(), size, a as i64, b as i64)
                };
                FileGroup::new(vec![file])
            })
            .collect();
        let config = FileScanConfigBuilder::new(ObjectStoreUrl::local_filesystem(), Arc::new(csv))
            .with_file_groups(groups)
            .with_projection_indices(projection)
            .unwrap()
            .build();
        let theirs: Arc<dyn ExecutionPlan> = DataSourceExec::from_data_source(config);
        let ours = FluviaCsvSource::wrap(Arc::clone(&theirs));
        let ours = match predicate {
            None => ours,
            Some(p) => {
                let ds = ours.downcast_ref::<DataSourceExec>().unwrap();
                let config = ds.data_source().downcast_ref::<FileScanConfig>().unwrap();
                let source = config
                    .file_source
                    .downcast_ref::<FluviaCsvSource>()
                    .unwrap();
                let source: Arc<dyn FileSource> = Arc::new(source.clone().with_predicate(Some(p)));
                DataSourceExec::from_data_source(
                    FileScanConfigBuilder::from(config.clone())
                        .with_source(source)
                        .build(),
                )
            }
        };
        (theirs, ours)
    }

    /// All rows the plan reads, sorted: DataFusion lets a partition that
    /// is done take files (ranges) queued for another.
    fn read(plan: Arc<dyn ExecutionPlan>) -> Result<RecordBatch> {
        use datafusion::arrow::compute::{SortColumn, lexsort_to_indices, take_record_batch};
        let ctx = SessionContext::new();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let schema = plan.schema();
        let parts = rt.block_on(collect_partitioned(plan, ctx.task_ctx()))?;
        let all = concat_batches(&schema, parts.iter().flatten())?;
        if all.num_columns() == 0 {
            return Ok(all);
        }
        let keys: Vec<SortColumn> = all
            .columns()
            .iter()
            .map(|c| SortColumn {
                values: Arc::clone(c),
                options: None,
            })
            .collect();
        Ok(take_record_batch(&all, &lexsort_to_indices(&keys, None)?)?)
    }

    #[test]
    fn reads_what_datafusion_reads_in_any_ranges_and_projection() {
        for quotes in [false, true] {
            let (path, size) = write("t.csv", &text(3000, quotes));
            // A batch size that does not divide the rows.
            for ranges in [1, 2, 7] {
                for projection in [None, Some(vec![6, 0, 2]), Some(vec![1, 3]), Some(vec![])] {
                    let (theirs, ours) = scans(&path, size, ranges, projection.clone(), None);
                    assert!(ours.downcast_ref::<DataSourceExec>().is_some());
                    let (a, b) = (read(theirs).unwrap(), read(ours).unwrap());
                    assert_eq!(a, b, "quotes {quotes}, {ranges} ranges, {projection:?}");
                    assert_eq!(b.num_rows(), 3000);
                }
            }
        }
    }

    #[test]
    fn quoted_line_ends_stay_in_their_field_when_the_file_is_read_whole() {
        let text =
            "id,name,price,day,big,note,ratio\n1,\"two\nlines\",1.00,,,\"x\r\ny\",1\n2,b,,,,,\n";
        let (path, size) = write("q.csv", text);
        let (theirs, ours) = scans(&path, size, 1, None, None);
        let (a, b) = (read(theirs).unwrap(), read(ours).unwrap());
        assert_eq!(a, b);
        assert_eq!(b.num_rows(), 2);
    }

    #[test]
    fn bad_rows_fail_with_arrow_csv_wording() {
        let (path, size) = write(
            "bad.csv",
            "id,name,price,day,big,note,ratio\n1,a,1.00,,,,\n2,b\n",
        );
        let (_, ours) = scans(&path, size, 1, None, None);
        let e = read(ours).unwrap_err().to_string();
        assert!(
            e.contains("incorrect number of fields for line 2, expected 7 got 2"),
            "{e}"
        );
        let (path, size) = write(
            "bad.csv",
            "id,name,price,day,big,note,ratio\n1,a,1.0x,,,,\n",
        );
        let (_, ours) = scans(&path, size, 1, Some(vec![2]), None);
        let e = read(ours).unwrap_err().to_string();
        assert!(e.contains("Error while parsing value '1.0x'"), "{e}");
        assert!(e.contains("Decimal128(7, 2)"), "{e}");
        let (path, size) = write("bad.csv", "id,name,price,day,big,note,ratio\n1,\"a,,,,,,\n");
        let (_, ours) = scans(&path, size, 1, None, None);
        let e = read(ours).unwrap_err().to_string();
        assert!(e.contains("unterminated quoted field"), "{e}");
    }

    #[test]
    fn a_runtime_filter_drops_rows_before_the_other_columns_are_parsed() {
        use datafusion::logical_expr::Operator;
        use datafusion::physical_expr::expressions::{BinaryExpr, Column as Col, lit};
        // A value that does not parse sits only in rows the filter drops.
        let mut text = String::from("id,name,price,day,big,note,ratio\n");
        for i in 0..20_000 {
            let price = if i % 10 == 0 { "1.00" } else { "oops" };
            text.push_str(&format!("{i},n{i},{price},,,,\n"));
        }
        let (path, size) = write("f.csv", &text);
        let keep: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
            Arc::new(BinaryExpr::new(
                Arc::new(Col::new("id", 0)),
                Operator::Modulo,
                lit(10),
            )),
            Operator::Eq,
            lit(0),
        ));
        let (_, ours) = scans(&path, size, 3, Some(vec![2, 1]), Some(keep));
        let batch = read(ours).unwrap();
        assert_eq!(batch.num_rows(), 2000);
        assert_eq!(batch.schema().field(0).name(), "price");
    }

    #[test]
    fn unquote_follows_csv_core() {
        let mut out = Vec::new();
        unquote(br#""a""b""#, b'"', &mut out);
        assert_eq!(out, br#"a"b"#);
        unquote(br#""ab"cd"#, b'"', &mut out);
        assert_eq!(out, b"abcd");
        unquote(br#""a"b"c"#, b'"', &mut out);
        assert_eq!(out, br#"ab"c"#);
    }
}

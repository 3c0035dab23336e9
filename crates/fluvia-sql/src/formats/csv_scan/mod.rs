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
//! arrow-csv's wording, which [`errors`] turns into file, line
//! and column.
//!
//! Here: the source, the opener and its reads, batches; `fields` finds
//! where a read's fields are, `values` parses them.

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions};
use datafusion::arrow::compute::filter;
use datafusion::arrow::datatypes::{DataType, FieldRef, Schema, SchemaRef};
use datafusion::arrow::error::ArrowError;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result};
use datafusion::config::{ConfigOptions, CsvOptions};
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
                crate::session::options::CSV_READER.key
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

    /// The same files and options reading table columns `columns`, without
    /// runtime filters (a scan read once for several consumers).
    pub fn with_columns(&self, columns: &[usize]) -> Result<Self> {
        Ok(FluviaCsvSource {
            inner: csv_with_columns(&self.inner, columns)?,
            batch_size: self.batch_size,
            predicate: None,
        })
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
        // Filters on file columns of types read here only; a filter that
        // does not fit is left to the join, the scan still read here.
        let predicate = self.predicate.as_ref().and_then(|p| {
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
        });
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

/// DataFusion's CSV source for the files and options of `csv` reading table
/// columns `columns`. A projection only narrows once set, so this starts
/// from an unprojected source with the options a shipped source keeps (those
/// DataFusion's plan encoding carries).
pub fn csv_with_columns(csv: &CsvSource, columns: &[usize]) -> Result<CsvSource> {
    let table_schema = csv.table_schema().clone();
    let options = CsvOptions {
        has_header: Some(csv.has_header()),
        delimiter: csv.delimiter(),
        quote: csv.quote(),
        terminator: csv.terminator(),
        newlines_in_values: Some(csv.newlines_in_values()),
        truncated_rows: Some(csv.truncate_rows()),
        ..Default::default()
    };
    let projection = ProjectionExprs::from_indices(columns, table_schema.table_schema());
    let source = CsvSource::new(table_schema)
        .with_csv_options(options)
        .with_escape(csv.escape())
        .with_comment(csv.comment())
        .try_pushdown_projection(&projection)?
        .ok_or_else(|| DataFusionError::Internal("a CSV scan without projection".into()))?;
    source
        .downcast_ref::<CsvSource>()
        .cloned()
        .ok_or_else(|| DataFusionError::Internal("CSV source changed into another source".into()))
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
            let (buf, starts) = BUFFERS.take();
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
                buf,
                lo: 0,
                hi: 0,
                buf_start: from,
                lines: 0,
                closed: false,
                finished: false,
                starts,
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
    /// A read buffer and a field-start buffer, empty when none is kept.
    fn take(&self) -> (Vec<u8>, Vec<u32>) {
        match self.0.lock() {
            Ok(mut b) => (
                b.bytes.pop().unwrap_or_default(),
                b.starts.pop().unwrap_or_default(),
            ),
            Err(_) => Default::default(),
        }
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

pub mod errors;
mod fields;
mod values;

use fields::{Fields, tokenize};
use values::Values;

#[cfg(test)]
mod tests;

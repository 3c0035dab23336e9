//! Statistics for CSV tables, which carry none: a CSV format that estimates
//! each file's rows from its size and the line length of its first bytes.
//!
//! Without any, DataFusion cannot tell a fact table from a dimension, keeps
//! every join in the order the query wrote it and may build a hash table on
//! a join of hundreds of millions of rows (TPC-DS q72 on CSV ran out of
//! memory that way). With the estimate, joins are ordered and broadcast as
//! for Parquet files of the same data. Only planning sees this type: the
//! scans it plans read with [`crate::formats::csv_scan`] (or DataFusion's reader,
//! see [`crate::formats::csv_scan::CsvReader`]).

use crate::formats::schema_file::DeclaredColumnStats;
use async_trait::async_trait;
use datafusion::arrow::datatypes::{Field, SchemaRef};
use datafusion::catalog::Session;
use datafusion::common::stats::Precision;
use datafusion::common::{ColumnStatistics, Result, ScalarValue, Statistics};
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::file_format::file_compression_type::FileCompressionType;
use datafusion::datasource::physical_plan::{FileScanConfig, FileSinkConfig, FileSource};
use datafusion::datasource::table_schema::TableSchema;
use datafusion::object_store::{GetOptions, ObjectMeta, ObjectStore};
use datafusion::physical_expr::LexRequirement;
use datafusion::physical_plan::ExecutionPlan;
use std::sync::Arc;

/// Bytes read from the start of a file to estimate its line length.
const SAMPLE_BYTES: u64 = 256 << 10;

/// A CSV format whose files report estimated row counts and sizes, and the
/// column statistics the table declares (min, max, nulls per column).
#[derive(Debug)]
pub struct EstimatingCsvFormat {
    inner: Arc<dyn FileFormat>,
    has_header: bool,
    declared: Vec<DeclaredColumnStats>,
}

impl EstimatingCsvFormat {
    pub fn new(
        inner: Arc<dyn FileFormat>,
        has_header: bool,
        declared: Vec<DeclaredColumnStats>,
    ) -> Self {
        EstimatingCsvFormat {
            inner,
            has_header,
            declared,
        }
    }
}

/// Declared bounds as DataFusion column statistics (inexact: they hold for
/// the table, so for every file of it); text that does not parse as the
/// column's type is ignored.
fn column_stats(declared: &DeclaredColumnStats, field: &Field) -> ColumnStatistics {
    let parse = |v: &Option<String>| {
        v.as_ref()
            .and_then(|t| ScalarValue::try_from_string(t.clone(), field.data_type()).ok())
            .map_or(Precision::Absent, Precision::Inexact)
    };
    let mut c = ColumnStatistics::new_unknown();
    c.min_value = parse(&declared.min);
    c.max_value = parse(&declared.max);
    c.null_count = declared
        .nulls
        .map_or(Precision::Absent, |n| Precision::Inexact(n as usize));
    c
}

/// Rows in a file of `size` bytes whose first `sample.len()` bytes hold
/// `sample`: lines in the sample scaled to the file, less the header.
pub fn estimate_rows(size: u64, sample: &[u8], has_header: bool) -> usize {
    let lines = sample.iter().filter(|&&b| b == b'\n').count() as u64;
    if sample.is_empty() || lines == 0 {
        return usize::from(size > 0);
    }
    let whole = sample.len() as u64 >= size;
    let estimate = if whole {
        lines + u64::from(sample.last() != Some(&b'\n'))
    } else {
        size * lines / sample.len() as u64
    };
    estimate.saturating_sub(u64::from(has_header)) as usize
}

#[async_trait]
impl FileFormat for EstimatingCsvFormat {
    fn get_ext(&self) -> String {
        self.inner.get_ext()
    }

    fn get_ext_with_compression(&self, c: &FileCompressionType) -> Result<String> {
        self.inner.get_ext_with_compression(c)
    }

    fn compression_type(&self) -> Option<FileCompressionType> {
        self.inner.compression_type()
    }

    async fn infer_schema(
        &self,
        state: &dyn Session,
        store: &Arc<dyn ObjectStore>,
        objects: &[ObjectMeta],
    ) -> Result<SchemaRef> {
        self.inner.infer_schema(state, store, objects).await
    }

    async fn infer_stats(
        &self,
        _state: &dyn Session,
        store: &Arc<dyn ObjectStore>,
        table_schema: SchemaRef,
        object: &ObjectMeta,
    ) -> Result<Statistics> {
        let mut stats = Statistics::new_unknown(&table_schema);
        if self.compression_type().is_some_and(|c| c.is_compressed()) {
            return Ok(stats);
        }
        let n = object.size.min(SAMPLE_BYTES);
        let sample = store
            .get_opts(
                &object.location,
                GetOptions {
                    range: Some((0..n).into()),
                    ..GetOptions::default()
                },
            )
            .await?
            .bytes()
            .await?;
        let sample: &[u8] = sample.as_ref();
        stats.num_rows = Precision::Inexact(estimate_rows(object.size, sample, self.has_header));
        stats.total_byte_size = Precision::Inexact(object.size as usize);
        if self.declared.len() == table_schema.fields().len() {
            stats.column_statistics = self
                .declared
                .iter()
                .zip(table_schema.fields())
                .map(|(d, f)| column_stats(d, f))
                .collect();
        }
        Ok(stats)
    }

    async fn create_physical_plan(
        &self,
        state: &dyn Session,
        conf: FileScanConfig,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = self.inner.create_physical_plan(state, conf).await?;
        match state
            .config()
            .get_extension::<crate::formats::csv_scan::CsvReader>()
        {
            Some(r) if *r == crate::formats::csv_scan::CsvReader::DataFusion => Ok(plan),
            _ => Ok(crate::formats::csv_scan::FluviaCsvSource::wrap(plan)),
        }
    }

    async fn create_writer_physical_plan(
        &self,
        input: Arc<dyn ExecutionPlan>,
        state: &dyn Session,
        conf: FileSinkConfig,
        order_requirements: Option<LexRequirement>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.inner
            .create_writer_physical_plan(input, state, conf, order_requirements)
            .await
    }

    fn file_source(&self, table_schema: TableSchema) -> Arc<dyn FileSource> {
        self.inner.file_source(table_schema)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_scaled_from_the_sample() {
        let file = b"a,b\n1,2\n3,4\n5,6\n";
        assert_eq!(estimate_rows(file.len() as u64, file, true), 3);
        assert_eq!(estimate_rows(file.len() as u64, file, false), 4);
        // No newline at the end: the last line counts.
        assert_eq!(estimate_rows(11, b"a,b\n1,2\n3,4", true), 2);
        // A sample of 4 lines of 4 bytes from a 1600-byte file: 400 lines.
        assert_eq!(estimate_rows(1600, b"1,2\n3,4\n5,6\n7,8\n", true), 399);
        assert_eq!(estimate_rows(0, b"", true), 0);
    }

    #[test]
    fn declared_bounds_become_column_statistics() {
        use datafusion::arrow::datatypes::DataType;
        let d = DeclaredColumnStats {
            min: Some("1998-01-02".into()),
            max: Some("2003-12-31".into()),
            nulls: Some(7),
        };
        let c = column_stats(&d, &Field::new("d", DataType::Date32, true));
        assert_eq!(
            c.min_value,
            Precision::Inexact(ScalarValue::Date32(Some(10228)))
        );
        assert_eq!(c.null_count, Precision::Inexact(7));
        let m = DeclaredColumnStats {
            min: Some("-1.50".into()),
            max: Some("not a number".into()),
            nulls: None,
        };
        let c = column_stats(&m, &Field::new("m", DataType::Decimal128(7, 2), true));
        assert_eq!(
            c.min_value,
            Precision::Inexact(ScalarValue::Decimal128(Some(-150), 7, 2))
        );
        assert_eq!(c.max_value, Precision::Absent, "unparsable text is ignored");
        assert_eq!(c.null_count, Precision::Absent);
    }
}

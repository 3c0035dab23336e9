//! The sink of `INSERT INTO` a filesystem table: every subtask writes its
//! own part file, `part-<job uuid>-<subtask>-0.<ext>` in the table's folder
//! (Flink's part file naming), under an attempt-private name the job
//! commits when it finishes (`OperatorContext::stage_file`), so a failed
//! or cancelled job leaves the folder as it was and each row shows up once.
//!
//! A subtask that receives no rows writes no file (Flink's part files open
//! with their first record).

use crate::exec::exchange::{SqlBatch, SqlBatchType};
use crate::session::catalog::{CsvLayout, FileFormat};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;
use fluvia_core::{FluviaError, Result};
use fluvia_runtime::operator::{AnyOutput, OperatorInstance, RecordType};
use fluvia_runtime::output::Output;
use fluvia_runtime::{OperatorContext, OperatorFactory};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The accumulator each subtask reports its written rows in (little-endian
/// u64), summed by the client.
pub const ROWS_WRITTEN: &str = "rows-written";

/// Where and how an `INSERT INTO` writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileSinkSpec {
    pub table: String,
    pub dir: String,
    pub format: FileFormat,
    pub csv: CsvLayout,
    /// The job's part of every file name (a UUID).
    pub prefix: String,
    /// proto bytes of the file schema (the table's declared columns).
    pub schema: Vec<u8>,
}

impl FileSinkSpec {
    /// The part file subtask `subtask` writes.
    pub fn part_file(&self, subtask: usize) -> PathBuf {
        Path::new(&self.dir).join(format!(
            "part-{}-{subtask}-0{}",
            self.prefix,
            self.format.extension()
        ))
    }
}

pub(crate) struct FileSinkFactory {
    pub spec: FileSinkSpec,
    /// What the fragment before it produces (the table's columns, strings
    /// possibly as views).
    pub input: SchemaRef,
    /// The columns as the files hold them.
    pub file_schema: SchemaRef,
}

impl OperatorFactory for FileSinkFactory {
    fn create(&self, ctx: &OperatorContext, _output: AnyOutput) -> Result<OperatorInstance> {
        let sink: Box<dyn Output<SqlBatch>> = Box::new(PartFileSink {
            spec: self.spec.clone(),
            file_schema: Arc::clone(&self.file_schema),
            ctx: ctx.clone(),
            writer: None,
            rows: 0,
        });
        Ok(sink_of(sink, &self.input))
    }

    fn output_type(&self) -> Arc<dyn RecordType> {
        Arc::new(SqlBatchType {
            schema: Arc::clone(&self.input),
        })
    }
}

/// A sink operator: the batches of a SQL edge of `schema` into `sink`.
pub(crate) fn sink_of(sink: Box<dyn Output<SqlBatch>>, schema: &SchemaRef) -> OperatorInstance {
    OperatorInstance::OneInput {
        input: Box::new(sink),
        input_type: Arc::new(SqlBatchType {
            schema: Arc::clone(schema),
        }),
    }
}

enum PartWriter {
    Csv(Box<datafusion::arrow::csv::Writer<BufWriter<File>>>),
    Json(datafusion::arrow::json::LineDelimitedWriter<BufWriter<File>>),
    Parquet(Box<ArrowWriter<File>>),
}

struct PartFileSink {
    spec: FileSinkSpec,
    file_schema: SchemaRef,
    ctx: OperatorContext,
    writer: Option<(PartWriter, PathBuf)>,
    rows: u64,
}

impl PartFileSink {
    fn open(&mut self) -> Result<&mut (PartWriter, PathBuf)> {
        if self.writer.is_none() {
            let dir = Path::new(&self.spec.dir);
            std::fs::create_dir_all(dir)
                .map_err(|e| FluviaError::io(format!("creating {}", dir.display()), e))?;
            let target = self.spec.part_file(self.ctx.subtask_index);
            let pending = self.ctx.stage_file(&target)?;
            let file = File::create(&pending)
                .map_err(|e| FluviaError::io(format!("creating {}", pending.display()), e))?;
            let writer = match self.spec.format {
                FileFormat::Csv => {
                    let c = &self.spec.csv;
                    let mut b = datafusion::arrow::csv::WriterBuilder::new()
                        .with_header(c.header)
                        .with_delimiter(c.delimiter)
                        .with_date_format("%Y-%m-%d".to_string());
                    if let Some(q) = c.quote {
                        b = b.with_quote(q);
                    }
                    if let Some(e) = c.escape {
                        b = b.with_escape(e);
                    }
                    if let Some(null) = &c.null_literal {
                        b = b.with_null(null.clone());
                    }
                    PartWriter::Csv(Box::new(b.build(BufWriter::new(file))))
                }
                FileFormat::Json => PartWriter::Json(
                    datafusion::arrow::json::LineDelimitedWriter::new(BufWriter::new(file)),
                ),
                FileFormat::Parquet => PartWriter::Parquet(Box::new(
                    ArrowWriter::try_new(file, Arc::clone(&self.file_schema), None)
                        .map_err(|e| write_error(&pending, e))?,
                )),
            };
            self.writer = Some((writer, pending));
        }
        self.writer
            .as_mut()
            .ok_or_else(|| FluviaError::Internal("part file not open".into()))
    }

    /// `batch` with the file's column types (strings as views become plain).
    fn to_file_types(&self, batch: RecordBatch) -> Result<RecordBatch> {
        if batch.schema().fields() == self.file_schema.fields() {
            return Ok(batch);
        }
        let columns = batch
            .columns()
            .iter()
            .zip(self.file_schema.fields())
            .map(|(c, f)| {
                if c.data_type() == f.data_type() {
                    Ok(Arc::clone(c))
                } else {
                    datafusion::arrow::compute::cast(c, f.data_type())
                }
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| FluviaError::Execution(format!("INSERT INTO {}: {e}", self.spec.table)))?;
        RecordBatch::try_new(Arc::clone(&self.file_schema), columns)
            .map_err(|e| FluviaError::Execution(format!("INSERT INTO {}: {e}", self.spec.table)))
    }
}

fn write_error(path: &Path, e: impl std::fmt::Display) -> FluviaError {
    FluviaError::Execution(format!("writing {}: {e}", path.display()))
}

impl Output<SqlBatch> for PartFileSink {
    fn collect(&mut self, record: SqlBatch) -> Result<()> {
        if record.batch.num_rows() == 0 {
            return Ok(());
        }
        let batch = self.to_file_types(record.batch)?;
        self.rows += batch.num_rows() as u64;
        let (writer, path) = self.open()?;
        match writer {
            PartWriter::Csv(w) => w.write(&batch).map_err(|e| write_error(path, e)),
            PartWriter::Json(w) => w.write(&batch).map_err(|e| write_error(path, e)),
            PartWriter::Parquet(w) => w.write(&batch).map_err(|e| write_error(path, e)),
        }
    }

    fn close(&mut self) -> Result<()> {
        if let Some((writer, path)) = self.writer.take() {
            match writer {
                PartWriter::Csv(w) => {
                    let mut inner = w.into_inner();
                    std::io::Write::flush(&mut inner).map_err(|e| write_error(&path, e))?;
                    inner
                        .into_inner()
                        .map_err(|e| write_error(&path, e.error()))?
                        .sync_all()
                        .map_err(|e| write_error(&path, e))?;
                }
                PartWriter::Json(mut w) => {
                    w.finish().map_err(|e| write_error(&path, e))?;
                    let mut inner = w.into_inner();
                    std::io::Write::flush(&mut inner).map_err(|e| write_error(&path, e))?;
                }
                PartWriter::Parquet(w) => {
                    w.close().map_err(|e| write_error(&path, e))?;
                }
            }
        }
        self.ctx
            .accumulators()
            .borrow_mut()
            .push((ROWS_WRITTEN.to_string(), self.rows.to_le_bytes().to_vec()));
        Ok(())
    }
}

//! The sinks behind the DataStream methods that end a stream: print,
//! collect, text files, discard and user functions.

use fluvia_runtime::{Collector, Data, OneInputOperator, OperatorContext, UserError};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Prints records with `Debug`, prefixed by `subtask> ` when parallel (as
/// Flink's print sink does).
pub struct PrintSink {
    pub prefix: String,
}

impl<T: std::fmt::Debug + 'static> OneInputOperator<T, ()> for PrintSink {
    fn open(&mut self, ctx: &OperatorContext) -> Result<(), UserError> {
        if ctx.parallelism > 1 {
            self.prefix = format!("{}> ", ctx.subtask_index + 1);
        }
        Ok(())
    }

    fn process_element(
        &mut self,
        record: T,
        _out: &mut Collector<'_, ()>,
    ) -> Result<(), UserError> {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{}{:?}", self.prefix, record)?;
        Ok(())
    }
}

/// Gathers a subtask's records and hands them to the client in the
/// attempt's final report (an accumulator named after the sink), so
/// `collect()` works on any cluster and only the winning attempt counts.
pub struct CollectSink<T> {
    pub name: String,
    pub local: Vec<T>,
    pub accumulators: Option<fluvia_runtime::operator::Accumulators>,
}

impl<T: Data> OneInputOperator<T, ()> for CollectSink<T> {
    fn open(&mut self, ctx: &OperatorContext) -> Result<(), UserError> {
        self.accumulators = Some(ctx.accumulators());
        Ok(())
    }

    #[inline]
    fn process_element(
        &mut self,
        record: T,
        _out: &mut Collector<'_, ()>,
    ) -> Result<(), UserError> {
        self.local.push(record);
        Ok(())
    }

    fn end_input(&mut self, _out: &mut Collector<'_, ()>) -> Result<(), UserError> {
        let bytes = bincode::serialize(&self.local)
            .map_err(|e| format!("encoding the collected records: {e}"))?;
        self.local.clear();
        if let Some(acc) = &self.accumulators {
            acc.borrow_mut().push((self.name.clone(), bytes));
        }
        Ok(())
    }
}

/// The records a collect sink gathered, readable after the job ran.
#[derive(Clone)]
pub struct CollectHandle<T> {
    pub(crate) data: Arc<Mutex<Vec<T>>>,
}

impl<T> CollectHandle<T> {
    /// Takes everything collected so far.
    pub fn take(&self) -> Vec<T> {
        self.data
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }
}

/// Writes one line per record (`Display`): to `path` itself at parallelism
/// 1, else to `path/part-<subtask>`. In batch, each attempt writes a file of
/// its own and the winner's gets the final name when the job finishes, so it
/// supports concurrent attempts.
pub struct TextFileSink {
    pub path: PathBuf,
    pub writer: Option<std::io::BufWriter<std::fs::File>>,
    pub file: PathBuf,
}

impl<T: std::fmt::Display + 'static> OneInputOperator<T, ()> for TextFileSink {
    fn open(&mut self, ctx: &OperatorContext) -> Result<(), UserError> {
        self.file = if ctx.parallelism == 1 {
            self.path.clone()
        } else {
            std::fs::create_dir_all(&self.path).map_err(|e| {
                format!(
                    "cannot create output directory '{}': {e}",
                    self.path.display()
                )
            })?;
            self.path.join(format!("part-{}", ctx.subtask_index))
        };
        if let Some(parent) = self.file.parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create directory '{}': {e}", parent.display()))?;
        }
        // In batch, written under an attempt-private name and renamed when
        // the job finishes if this attempt won. A streaming job may never
        // finish (and has no checkpoints to commit on): it writes in place,
        // as Flink's `writeAsText`.
        let pending = if ctx.batch {
            ctx.stage_file(&self.file)?
        } else {
            self.file.clone()
        };
        let f = std::fs::File::create(&pending)
            .map_err(|e| format!("cannot create output file '{}': {e}", pending.display()))?;
        self.writer = Some(std::io::BufWriter::new(f));
        Ok(())
    }

    #[inline]
    fn process_element(
        &mut self,
        record: T,
        _out: &mut Collector<'_, ()>,
    ) -> Result<(), UserError> {
        if let Some(w) = &mut self.writer {
            writeln!(w, "{record}")
                .map_err(|e| format!("writing '{}': {e}", self.file.display()))?;
        }
        Ok(())
    }

    fn end_input(&mut self, _out: &mut Collector<'_, ()>) -> Result<(), UserError> {
        if let Some(mut w) = self.writer.take() {
            w.flush()
                .map_err(|e| format!("writing '{}': {e}", self.file.display()))?;
        }
        Ok(())
    }
}

/// Drops every record (Flink's `DiscardingSink`), for benchmarks.
pub struct DiscardSink;

impl<T: 'static> OneInputOperator<T, ()> for DiscardSink {
    #[inline]
    fn process_element(
        &mut self,
        record: T,
        _out: &mut Collector<'_, ()>,
    ) -> Result<(), UserError> {
        std::hint::black_box(record);
        Ok(())
    }
}

/// Calls a function per record.
pub struct FnSink<F>(pub Arc<F>);

impl<T, F> OneInputOperator<T, ()> for FnSink<F>
where
    T: 'static,
    F: Fn(T) -> Result<(), UserError> + Send + Sync + 'static,
{
    fn process_element(
        &mut self,
        record: T,
        _out: &mut Collector<'_, ()>,
    ) -> Result<(), UserError> {
        (self.0)(record)
    }
}

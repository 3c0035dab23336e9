//! The runtimes SQL runs on: a multi-threaded Tokio runtime for planning,
//! a pool of current-thread runtimes for tasks, and DataFusion's runtime
//! environment with the process's cache of file footers.

use super::df_err;
use fluvia_core::{FluviaError, Result};
use std::sync::{Arc, Mutex, OnceLock};

/// Idle task runtimes at most: as many as task threads a TaskManager keeps.
const IDLE_RUNTIMES: usize = 64;

/// Runtimes of ended tasks, for the next ones. Building a runtime (its
/// driver's file descriptors, its timer) cost about 50 µs per subtask, and
/// each new runtime started its own threads for the file reads its scans
/// hand off; a kept runtime keeps them.
static IDLE: Mutex<Vec<tokio::runtime::Runtime>> = Mutex::new(Vec::new());

pub(super) fn current_thread_runtime() -> Result<TaskRuntime> {
    let idle = IDLE.lock().unwrap_or_else(|p| p.into_inner()).pop();
    if let Some(rt) = idle {
        return Ok(TaskRuntime(Some(rt)));
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map(|rt| TaskRuntime(Some(rt)))
        .map_err(|e| FluviaError::io("starting a task runtime", e))
}

/// A task's runtime, back among the idle ones when the task is done. What
/// the task left on it (tasks DataFusion spawned and aborted) is cleared
/// when the next task runs it. Dropping a runtime waits until each of its
/// blocking threads (the file reads a scan handed off) has exited, on the
/// task's path to reporting its end; one beyond [`IDLE_RUNTIMES`] lets them
/// exit on their own.
pub(super) struct TaskRuntime(Option<tokio::runtime::Runtime>);

impl std::ops::Deref for TaskRuntime {
    type Target = tokio::runtime::Runtime;
    fn deref(&self) -> &Self::Target {
        self.0
            .as_ref()
            .expect("a task runtime is only taken when dropped")
    }
}

impl Drop for TaskRuntime {
    fn drop(&mut self) {
        let Some(rt) = self.0.take() else {
            return;
        };
        // A runtime a panic unwound out of is not lent again.
        if std::thread::panicking() {
            rt.shutdown_background();
            return;
        }
        let mut idle = IDLE.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < IDLE_RUNTIMES {
            idle.push(rt);
        } else {
            drop(idle);
            rt.shutdown_background();
        }
    }
}

/// Planning reads every table's footers (schemas, then statistics): on
/// the machine's cores it takes about two thirds of the time it takes on
/// one thread, as DataFusion alone plans on its multi-threaded runtime.
pub(super) fn planning_runtime() -> Result<tokio::runtime::Runtime> {
    per_core_runtime("fluvia-planner", 1)
        .map_err(|e| FluviaError::io("starting the planning runtime", e))
}

/// A multi-threaded runtime of one worker thread per core (`unknown` when
/// the number of cores is), its threads named `name`.
pub(crate) fn per_core_runtime(
    name: &str,
    unknown: usize,
) -> std::io::Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(unknown, |n| n.get());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .thread_name(name)
        .enable_all()
        .build()
}

/// DataFusion's runtime for a job's tasks in this process, with the
/// process's cache of file footers. Each task's scans open their files
/// anew, and a Parquet footer costs a read and a decode (1.7 ms for `item`
/// at SF 1, longer than reading its two columns); DataFusion in one process
/// reads each footer once, when it plans. A TaskManager keeps the footers of
/// the files its jobs read, bounded as DataFusion bounds its own cache, and
/// an entry serves only a file of the same size and modification time.
pub(super) fn task_runtime_env() -> Result<Arc<datafusion::execution::runtime_env::RuntimeEnv>> {
    use datafusion::execution::cache::cache_manager::{CacheManagerConfig, FileMetadataCache};
    use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
    static FOOTERS: OnceLock<Arc<FileMetadataCache>> = OnceLock::new();
    let footers = FOOTERS.get_or_init(|| {
        RuntimeEnv::default()
            .cache_manager
            .get_file_metadata_cache()
    });
    RuntimeEnvBuilder::new()
        .with_cache_manager(
            CacheManagerConfig::default().with_file_metadata_cache(Some(Arc::clone(footers))),
        )
        .build_arc()
        .map_err(df_err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::register_parquet;
    use datafusion::arrow::array::{Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::execution::SessionStateBuilder;
    use datafusion::execution::context::SessionContext;
    use datafusion::parquet::arrow::ArrowWriter;

    #[tokio::test]
    async fn a_footer_one_job_read_serves_the_next_jobs_tasks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int64Array::from_iter_values(0..100))],
        )
        .unwrap();
        let mut w =
            ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();

        // One job's tasks read the file.
        let first = SessionContext::new_with_state(
            SessionStateBuilder::new()
                .with_runtime_env(task_runtime_env().unwrap())
                .with_default_features()
                .build(),
        );
        register_parquet(&first, "t", &path).await;
        let rows = first
            .sql("SELECT count(*) FROM t")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_eq!(rows[0].num_rows(), 1);
        drop(first);

        // The next job's runtime already holds its footer; a runtime of its
        // own (DataFusion's default) does not.
        let key = datafusion::object_store::path::Path::from_filesystem_path(&path).unwrap();
        let next = task_runtime_env().unwrap();
        assert!(
            next.cache_manager
                .get_file_metadata_cache()
                .contains_key(&key)
        );
        let own = datafusion::execution::runtime_env::RuntimeEnv::default();
        assert!(
            !own.cache_manager
                .get_file_metadata_cache()
                .contains_key(&key)
        );
    }
}

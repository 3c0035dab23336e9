//! The task side of a SQL job: [`StageFactory`] builds, in each subtask,
//! a driver that decodes its stage's fragments, applies the task-time
//! rewrites of [`crate::exec`] (clustered build sides, early ends, shared
//! scans), runs them on a current-thread runtime and writes every batch to
//! its output; [`SinkFactory`] collects the result into a file.

use super::runtime::{current_thread_runtime, task_runtime_env};
use super::{SqlJob, df_err};
use crate::exec::exchange::{SqlBatch, SqlBatchType, TaskInputs};
use crate::formats::codec::FluviaCodec;
use crate::planning::split::{self, Exchange};
use crate::session::options as sql_options;
use crate::session::session_config;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::writer::FileWriter;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::DataFusionError;
use datafusion::execution::{SessionState, SessionStateBuilder, TaskContext};
use datafusion::physical_expr::Partitioning;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::Time;
use datafusion::physical_plan::repartition::{BatchPartitioner, RepartitionExec};
use datafusion_proto::physical_plan::{
    DeduplicatingProtoConverter, PhysicalPlanDecodeContext, PhysicalProtoConverterExtension,
};
use fluvia_core::{FluviaError, Result};
use fluvia_network::metrics::IoCounters;
use fluvia_network::{CancelToken, InputChannelSpec};
use fluvia_runtime::operator::{AnyOutput, OperatorInstance, RecordType, downcast_output};
use fluvia_runtime::output::Output;
use fluvia_runtime::{InputStats, OperatorContext, OperatorFactory, TaskDriver};
use futures::StreamExt;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

pub(super) struct StageFactory {
    pub(super) job: Arc<SqlJob>,
    /// The stages this task runs (several: a reuse group).
    pub(super) stages: Vec<usize>,
    pub(super) schema: SchemaRef,
    /// DataFusion's functions and runtime, built once per process and job
    /// and shared by its tasks: building a session (or cloning one, with
    /// its maps of every function) costs more than running a small
    /// fragment.
    pub(super) session: Arc<OnceLock<JobSession>>,
}

/// A job's DataFusion session in this process, and a task context holding
/// its functions: the one fragments are decoded with. A decoded plan holds
/// the functions it calls, so the context each task executes with leaves
/// the maps of every function empty (copying them cost each subtask about
/// 35 µs).
pub(super) struct JobSession {
    state: Arc<SessionState>,
    functions: Arc<TaskContext>,
}

impl OperatorFactory for StageFactory {
    fn create(&self, ctx: &OperatorContext, output: AnyOutput) -> Result<OperatorInstance> {
        let state = match self.session.get() {
            Some(s) => s,
            None => {
                // Tasks starting together wait for one build.
                let config = session_config(&self.job.options)?;
                let runtime = task_runtime_env()?;
                self.session.get_or_init(|| {
                    let state = SessionStateBuilder::new()
                        .with_config(config)
                        .with_runtime_env(runtime)
                        .with_default_features()
                        .build();
                    JobSession {
                        functions: Arc::new(TaskContext::from(&state)),
                        state: Arc::new(state),
                    }
                })
            }
        };
        Ok(OperatorInstance::Driver(Box::new(StageDriver {
            state: Arc::clone(&state.state),
            functions: Arc::clone(&state.functions),
            job: Arc::clone(&self.job),
            stages: self.stages.clone(),
            subtask: ctx.subtask_index,
            attempt: ctx.attempt_number,
            staged: ctx.staged_files(),
            out: downcast_output::<SqlBatch>(output)?,
        })))
    }

    fn output_type(&self) -> Arc<dyn RecordType> {
        Arc::new(SqlBatchType {
            schema: Arc::clone(&self.schema),
        })
    }
}

/// Runs partition `subtask` of one fragment (or of each fragment of a
/// reuse group) on a current-thread runtime.
struct StageDriver {
    state: Arc<SessionState>,
    /// What fragments are decoded with ([`JobSession`]).
    functions: Arc<TaskContext>,
    job: Arc<SqlJob>,
    stages: Vec<usize>,
    subtask: usize,
    attempt: u32,
    /// Where files the fragment writes (`COPY ... TO`) are staged.
    staged: fluvia_runtime::operator::StagedFiles,
    out: Box<dyn Output<SqlBatch>>,
}

impl TaskDriver for StageDriver {
    fn run(
        &mut self,
        inputs: Vec<InputChannelSpec>,
        counters: &Arc<IoCounters>,
        cancel: &CancelToken,
    ) -> Result<InputStats> {
        let began = std::time::Instant::now();
        let node_inputs = self.job.task_inputs(&self.stages);
        let mut by_stage: BTreeMap<usize, Vec<InputChannelSpec>> = BTreeMap::new();
        for c in inputs {
            let pos = c.input_index.saturating_sub(1);
            let producer = *node_inputs.get(pos).ok_or_else(|| {
                FluviaError::Internal(format!("unexpected input {}", c.input_index))
            })?;
            by_stage.entry(producer).or_default().push(c);
        }
        for &p in &node_inputs {
            by_stage.entry(p).or_default();
        }
        let configuration = self.job.configuration();
        let release_unread = configuration.get(&sql_options::RELEASE_UNREAD_INPUTS)?;
        let cluster = configuration.get(&sql_options::CLUSTER_BUILD_SIDE)?;
        let read_once = configuration.get(&sql_options::READ_BUILD_SIDE_ONCE)?;
        let end_on_empty_probe = configuration.get(&sql_options::END_JOIN_ON_EMPTY_PROBE)?;
        let skip_on_pruned_probe = configuration.get(&sql_options::SKIP_BUILD_ON_PRUNED_PROBE)?;
        let task_inputs = Arc::new(TaskInputs::new(
            by_stage,
            release_unread,
            cancel.clone(),
            Arc::clone(counters),
        ));
        let config = self
            .state
            .config()
            .clone()
            .with_extension(Arc::clone(&task_inputs));
        let task_ctx = Arc::new(TaskContext::new(
            None,
            self.state.session_id().to_string(),
            config,
            Default::default(),
            Default::default(),
            Default::default(),
            Default::default(),
            Arc::clone(self.state.runtime_env()),
        ));
        let context_at = began.elapsed();
        let rt = current_thread_runtime()?;
        let _enter = rt.enter();
        let runtime_at = began.elapsed();
        let mut plans = Vec::with_capacity(self.stages.len());
        let mut outputs = Vec::with_capacity(self.stages.len());
        let mut task_ctx = task_ctx;
        // Scans this task reads on a join's probe side wait for demand;
        // they get it once the join's build side delivered a row.
        let waiting: std::collections::BTreeSet<usize> = node_inputs
            .iter()
            .copied()
            .filter(|&s| self.job.read_later.get(s).copied().unwrap_or(false))
            .collect();
        // A scan its consumer reads only on a join's probe side, and so may
        // never read (the join's build side may come out empty), waits for
        // demand ([`crate::exec::demand`]) before it even decodes its plan; the
        // scans read first have the cores meanwhile.
        let mut unread = false;
        if self
            .stages
            .iter()
            .all(|&s| self.job.read_later.get(s).copied().unwrap_or(false))
            && let Some(r) = self.out.consumers_released()
        {
            unread = !r.wait_for_demand(cancel)?;
        }
        for &stage in self.stages.iter().filter(|_| !unread) {
            let (plan, out, ctx) = self.fragment(stage, &task_ctx)?;
            let plan = crate::exec::demand::demand_on_first_build_row(plan, &waiting, &task_inputs)
                .map_err(df_err)?;
            let plan = if cluster {
                let plan = crate::exec::cluster::cluster_build_sides(plan).map_err(df_err)?;
                let job = &self.job;
                crate::exec::cluster::share_broadcast_builds(
                    plan,
                    &job.shared_clusters,
                    (stage, self.attempt),
                    &|s| {
                        job.stages
                            .get(s)
                            .is_some_and(|s| s.exchange == Exchange::Broadcast)
                    },
                    read_once,
                )
                .map_err(df_err)?
            } else {
                plan
            };
            let plan = if end_on_empty_probe {
                crate::exec::empty_probe::end_joins_on_empty_probe(plan).map_err(df_err)?
            } else {
                plan
            };
            let plan = if skip_on_pruned_probe {
                crate::exec::pruned_probe::skip_builds_over_pruned_probes(plan).map_err(df_err)?
            } else {
                plan
            };
            plans.push(plan);
            outputs.push(out);
            task_ctx = ctx;
        }
        // Scans several fragments of this task make are read once.
        if plans.len() > 1 {
            plans = crate::exec::shared_scan::share_scans(plans).map_err(df_err)?;
        }
        // Inputs no reader of this subtask reads (other union branches'):
        // released now rather than when the task ends.
        let mut read = std::collections::BTreeSet::new();
        for p in &plans {
            p.apply(|node| {
                if let Some(r) = node.downcast_ref::<crate::exec::exchange::ExchangeReaderExec>() {
                    read.insert(r.stage());
                }
                Ok(TreeNodeRecursion::Continue)
            })
            .map_err(df_err)?;
        }
        task_inputs.release_unread_stages(&read)?;
        // Once every consumer stopped reading (its join's build side was
        // empty, its LIMIT satisfied), the rest of the work reaches nobody.
        let released = self.out.consumers_released().filter(|_| release_unread);
        if let Some(r) = &released {
            task_inputs.stop_when_released(r.clone());
            plans = plans
                .into_iter()
                .map(|p| crate::exec::released::end_when_released(p, r))
                .collect::<std::result::Result<_, _>>()
                .map_err(df_err)?;
        }
        let plans_at = began.elapsed();
        let streams = plans
            .iter()
            .enumerate()
            .map(|(i, plan)| {
                plan.execute(0, Arc::clone(&task_ctx))
                    .map(|s| s.map(move |b| (i, b)))
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(df_err)?;
        let streams_at = began.elapsed();
        let mut batches = futures::stream::select_all(streams);
        while let Some((i, next)) = rt.block_on(batches.next()) {
            let batch = next.map_err(|e| {
                let message = e.to_string();
                // A CSV row that does not fit the table's schema: name it.
                match crate::formats::csv_scan::errors::locate(&plans[i], &message) {
                    Some(located) => FluviaError::Execution(located),
                    None => df_err(e),
                }
            })?;
            if cancel.is_cancelled() {
                return Err(FluviaError::Cancelled);
            }
            let (stage, partitioner, offset) = &mut outputs[i];
            let output = Some(*stage);
            match partitioner.as_mut() {
                None => self.out.collect(SqlBatch {
                    batch,
                    target: Some(*offset),
                    output,
                })?,
                Some(p) => {
                    let out = &mut self.out;
                    let mut failed = None;
                    p.partition(batch, |i, b| {
                        out.collect(SqlBatch {
                            batch: b,
                            target: Some(*offset + i),
                            output,
                        })
                        .map_err(|e| {
                            failed = Some(e);
                            DataFusionError::Execution("output failed".into())
                        })
                    })
                    .map_err(|e| failed.take().unwrap_or_else(|| df_err(e)))?;
                }
            }
            if released.as_ref().is_some_and(|r| r.all()) {
                break;
            }
        }
        drop(batches);
        // Rows and time per operator, for `RUST_LOG=fluvia_sql=debug`.
        if tracing::enabled!(tracing::Level::DEBUG) {
            let us = |d: std::time::Duration| d.as_micros();
            tracing::debug!(
                "stages {:?} subtask {}: context at {} µs, runtime at {} µs, plans at {} µs, \
                 streams at {} µs, ran at {} µs",
                self.stages,
                self.subtask,
                us(context_at),
                us(runtime_at),
                us(plans_at),
                us(streams_at),
                us(began.elapsed())
            );
            for (plan, &stage) in plans.iter().zip(&self.stages) {
                tracing::debug!(
                    "stage {stage} subtask {}:\n{}",
                    self.subtask,
                    datafusion::physical_plan::display::DisplayableExecutionPlan::with_metrics(
                        plan.as_ref()
                    )
                    .indent(true)
                );
            }
        }
        self.out.close()?;
        task_inputs.finish()
    }
}

/// Where one fragment's batches go: its stage, the hash partitioner of a
/// HASH output, the first consumer subtask.
type FragmentOutput = (usize, Option<BatchPartitioner>, usize);

impl StageDriver {
    /// Fragment `stage` as this subtask runs it, where its batches go, and
    /// the task context to run it with (attempt-private files if it writes
    /// any).
    fn fragment(
        &self,
        stage: usize,
        task_ctx: &Arc<TaskContext>,
    ) -> Result<(Arc<dyn ExecutionPlan>, FragmentOutput, Arc<TaskContext>)> {
        let spec = &self.job.stages[stage];
        let parsed = self.job.parsed(stage)?;
        // Deduplicating keeps one dynamic filter shared by the join that
        // fills it and the scan that reads it.
        let plan = DeduplicatingProtoConverter {}
            .proto_to_execution_plan(
                &parsed,
                &PhysicalPlanDecodeContext::new(&self.functions, &FluviaCodec),
            )
            .map_err(df_err)?;
        // Files it writes are private to this attempt until the job commits.
        let task_ctx = if crate::formats::staging::writes_files(&plan) {
            let mut env = (*task_ctx.runtime_env()).clone();
            env.object_store_registry = Arc::new(crate::formats::staging::StagingRegistry::new(
                Arc::clone(&env.object_store_registry),
                crate::formats::staging::StagingStore::new(self.attempt, Arc::clone(&self.staged)),
            ));
            Arc::new(TaskContext::new(
                None,
                self.state.session_id().to_string(),
                task_ctx.session_config().clone(),
                self.state.scalar_functions().clone(),
                self.state.higher_order_functions().clone(),
                self.state.aggregate_functions().clone(),
                self.state.window_functions().clone(),
                Arc::new(env),
            ))
        } else {
            Arc::clone(task_ctx)
        };
        let (plan, partitioner, offset) = match spec.exchange {
            Exchange::Hash { partitions, offset } => {
                // An adaptive consumer reads ranges of key groups.
                let partitions = match spec.consumer {
                    Some(c) if self.job.is_adaptive(c) => self.job.key_groups,
                    _ => partitions,
                };
                let Some(r) = plan.downcast_ref::<RepartitionExec>() else {
                    return Err(FluviaError::Internal(
                        "hash stage without its exchange".into(),
                    ));
                };
                let Partitioning::Hash(exprs, _) = r.partitioning() else {
                    return Err(FluviaError::Internal("hash stage without hash keys".into()));
                };
                let p =
                    BatchPartitioner::new_hash_partitioner(exprs.clone(), partitions, Time::new())
                        .map_err(df_err)?;
                (Arc::clone(r.input()), Some(p), offset)
            }
            Exchange::Global { offset } => (plan, None, offset),
            Exchange::Forward { .. } if self.job.is_pointwise(stage) => (plan, None, 0),
            Exchange::Forward { offset } => (plan, None, offset + self.subtask),
            Exchange::Broadcast => (plan, None, 0),
        };
        // One partition: state DataFusion shares between the partitions of
        // an operator (a join's dynamic filter) is complete in this task.
        // An adaptive stage has no scan or union, the only operators whose
        // partition index picks data: its subtasks read what the scheduler
        // handed them, however many there are.
        let view = if self.job.is_adaptive(stage) {
            self.subtask % spec.parallelism.max(1)
        } else {
            self.subtask
        };
        let plan = split::task_view(&plan, view).map_err(df_err)?;
        Ok((plan, (stage, partitioner, offset), task_ctx))
    }
}

pub(super) struct SinkFactory {
    pub(super) path: PathBuf,
    pub(super) schema: SchemaRef,
}

impl OperatorFactory for SinkFactory {
    fn create(&self, ctx: &OperatorContext, _output: AnyOutput) -> Result<OperatorInstance> {
        // Attempt-private until the job finishes with this attempt the
        // winner: the client reads exactly one attempt's rows.
        let pending = ctx.stage_file(&self.path)?;
        let file = std::fs::File::create(&pending)
            .map_err(|e| FluviaError::io(format!("creating {}", pending.display()), e))?;
        let writer = FileWriter::try_new(file, &self.schema)
            .map_err(|e| FluviaError::Internal(format!("result file: {e}")))?;
        let input: Box<dyn Output<SqlBatch>> = Box::new(ResultSink {
            writer: Some(writer),
            path: pending,
        });
        Ok(crate::formats::file_sink::sink_of(input, &self.schema))
    }

    fn output_type(&self) -> Arc<dyn RecordType> {
        Arc::new(SqlBatchType {
            schema: Arc::clone(&self.schema),
        })
    }
}

/// Collects the query result into an Arrow IPC file the client reads.
struct ResultSink {
    writer: Option<FileWriter<std::fs::File>>,
    path: PathBuf,
}

impl Output<SqlBatch> for ResultSink {
    fn collect(&mut self, record: SqlBatch) -> Result<()> {
        let w = self
            .writer
            .as_mut()
            .ok_or_else(|| FluviaError::Internal("result written after the end".into()))?;
        w.write(&record.batch)
            .map_err(|e| FluviaError::Internal(format!("writing {}: {e}", self.path.display())))
    }

    fn close(&mut self) -> Result<()> {
        if let Some(mut w) = self.writer.take() {
            w.finish().map_err(|e| {
                FluviaError::Internal(format!("writing {}: {e}", self.path.display()))
            })?;
        }
        Ok(())
    }
}

/// Reads the result file the sink wrote.
pub fn read_result(path: &Path) -> Result<Vec<datafusion::arrow::record_batch::RecordBatch>> {
    let file = std::fs::File::open(path)
        .map_err(|e| FluviaError::io(format!("opening the result {}", path.display()), e))?;
    let reader = datafusion::arrow::ipc::reader::FileReader::try_new(file, None)
        .map_err(|e| FluviaError::Internal(format!("reading {}: {e}", path.display())))?;
    reader
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| FluviaError::Internal(format!("reading {}: {e}", path.display())))
}

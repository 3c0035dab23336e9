//! A planned query as a Fluvia job: the serialisable [`SqlJob`] (fragments
//! as datafusion-proto bytes, edges, DataFusion options), the StreamGraph
//! built from it, and the operators that run its fragments.
//!
//! The client plans once; every process (JobManager, TaskManagers) rebuilds
//! the same StreamGraph from the same bytes, so fingerprints match by
//! construction and no process needs the SQL, the tables' catalog or the
//! planner.

use crate::catalog::Catalog;
use crate::codec::FluviaCodec;
use crate::exchange::{OutputOf, SqlBatch, SqlBatchType, TaskInputs, lock};
use crate::file_sink::{FileSinkFactory, FileSinkSpec};
use crate::reuse::ReuseGroup;
use crate::session::{datafusion_options, session_config};
use crate::split::{self, CutPolicy, Exchange, StageInput, StagePlan};
use base64::Engine;
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::arrow::ipc::writer::FileWriter;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::DataFusionError;
use datafusion::execution::context::SessionContext;
use datafusion::execution::{SessionState, SessionStateBuilder, TaskContext};
use datafusion::physical_expr::Partitioning;
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::Time;
use datafusion::physical_plan::repartition::{BatchPartitioner, RepartitionExec};
use datafusion_proto::bytes::physical_plan_to_bytes_with_proto_converter;
use datafusion_proto::physical_plan::{
    DeduplicatingProtoConverter, PhysicalPlanDecodeContext, PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf;
use fluvia_core::config::options;
use fluvia_core::{Configuration, ExchangeMode, FluviaError, PartitionerKind, Result, RuntimeMode};
use fluvia_graph::{JobGraph, JobGraphGenerator, StreamGraph, StreamGraphBuilder};
use fluvia_network::metrics::IoCounters;
use fluvia_network::{CancelToken, InputChannelSpec};
use fluvia_runtime::operator::{AnyOutput, OperatorInstance, RecordType, downcast_output};
use fluvia_runtime::output::Output;
use fluvia_runtime::{InputStats, OperatorContext, OperatorFactory, OperatorRegistry, TaskDriver};
use futures::StreamExt;
use prost::Message;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// The name of the SQL program in a binary's program catalog.
pub const PROGRAM: &str = "sql";

/// One fragment, shipped.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageSpec {
    pub name: String,
    /// datafusion-proto bytes; a HASH output wraps the fragment in a
    /// `RepartitionExec` that carries the hash expressions.
    pub plan: Vec<u8>,
    pub parallelism: usize,
    pub exchange: Exchange,
    pub consumer: Option<usize>,
    pub inputs: Vec<usize>,
    /// proto bytes of the fragment's output schema.
    pub schema: Vec<u8>,
}

/// A planned query.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SqlJob {
    pub name: String,
    /// DataFusion options the fragments were planned with.
    pub options: Vec<(String, String)>,
    pub stages: Vec<StageSpec>,
    /// Where the sink writes the result (an Arrow IPC file).
    pub result_path: String,
    /// Fluvia configuration entries of the job (`-D`).
    pub config: Vec<(String, String)>,
    /// Per stage: whether its parallelism is left to the adaptive batch
    /// scheduler (decided from the bytes its inputs wrote).
    #[serde(default)]
    pub adaptive: Vec<bool>,
    /// Subpartitions a producer hashes into for an adaptive consumer (its
    /// max parallelism: the consumer reads ranges of them).
    #[serde(default)]
    pub key_groups: usize,
    /// Per stage, per input: whether a skewed subpartition of the input may
    /// be split across the stage's subtasks (a join side; FLIP-475).
    #[serde(default)]
    pub splittable: Vec<Vec<bool>>,
    /// Some stage reads exchanges under the branches of a union: each of
    /// its subtasks reads only its branch's inputs. It releases the others'
    /// at its start; read to their end instead (when it ends), a pipelined
    /// broadcast into another branch would wait for it while that branch
    /// waits for the broadcast, so such a job then blocks.
    #[serde(default)]
    pub branch_readers: bool,
    /// `INSERT INTO`: part files in a table's folder instead of the
    /// result file.
    #[serde(default)]
    pub files: Option<FileSinkSpec>,
    /// Groups of stages that scan the same files and run as one task
    /// reading them once (`table.optimizer.reuse-source-enabled`).
    #[serde(default)]
    pub reuse: Vec<ReuseGroup>,
    /// Per stage: a scan its consumer reads only on the probe side of a
    /// join, which waits for demand (`table.exec.source.start-on-demand`).
    #[serde(default)]
    pub read_later: Vec<bool>,
    /// Broadcast build sides this process's subtasks cluster once.
    #[serde(skip)]
    pub shared_clusters: Arc<crate::cluster::SharedClusters>,
    /// Each fragment's protobuf message, read from its bytes once per
    /// process: its subtasks each build their own plan from it (a plan holds
    /// the state of one execution), but need not parse the bytes again.
    #[serde(skip)]
    pub parsed: Arc<Mutex<BTreeMap<usize, Arc<protobuf::PhysicalPlanNode>>>>,
}

/// How to plan a query.
#[derive(Debug, Clone)]
pub struct PlanRequest {
    pub sql: String,
    pub catalog: Catalog,
    /// `Some`: the query's rows go into a table's files (`INSERT INTO`).
    pub insert: Option<InsertTarget>,
    pub parallelism: usize,
    /// No parallelism was given (`-p`): stages that only read exchanges
    /// get theirs at runtime from the data, when the configuration allows.
    pub adaptive: bool,
    pub config: Configuration,
    pub result_path: PathBuf,
    pub name: String,
}

/// The table an `INSERT INTO` writes.
#[derive(Debug, Clone)]
pub struct InsertTarget {
    pub table: String,
    pub dir: PathBuf,
    pub format: crate::catalog::FileFormat,
    pub csv: crate::catalog::CsvLayout,
    /// The table's columns.
    pub schema: SchemaRef,
    /// The columns the query fills, in its order (empty: all, in the
    /// table's order); the others are NULL.
    pub columns: Vec<String>,
}

/// A planned query and what `--explain` shows of it.
pub struct PlannedQuery {
    pub job: SqlJob,
    pub stage_plan: StagePlan,
    pub physical: Arc<dyn ExecutionPlan>,
}

/// An error in the query itself (syntax, unknown table or column,
/// unsupported construct), as opposed to a failure while running it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct QueryError(pub String);

fn df_err(e: DataFusionError) -> FluviaError {
    match e {
        DataFusionError::External(inner) => match inner.downcast::<FluviaError>() {
            Ok(f) => *f,
            Err(other) => FluviaError::Internal(other.to_string()),
        },
        DataFusionError::Context(ctx, inner) => match df_err(*inner) {
            FluviaError::Cancelled => FluviaError::Cancelled,
            other => FluviaError::Internal(format!("{ctx}: {other}")),
        },
        other => FluviaError::Internal(other.to_string()),
    }
}

/// A session for planning: DataFusion's rules plus Fluvia's broadcast
/// safety rule right after join selection, and with `push_scalar_joins`
/// the scalar subquery joins moved down right after filter pushdown.
pub fn planning_context(
    options: &[(String, String)],
    push_scalar_joins: bool,
) -> Result<SessionContext> {
    let config = session_config(options)?;
    let mut logical = datafusion::optimizer::Optimizer::new().rules;
    if push_scalar_joins {
        let at = logical
            .iter()
            .position(|r| r.name() == "push_down_filter")
            .map_or(logical.len(), |i| i + 1);
        logical.insert(at, Arc::new(crate::scalar_join::PushScalarSubqueryJoins));
    }
    let mut rules = PhysicalOptimizer::new().rules;
    let at = rules
        .iter()
        .position(|r| r.name() == "join_selection")
        .map_or(0, |i| i + 1);
    rules.insert(at, Arc::new(split::BroadcastSafety));
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_physical_optimizer_rules(rules)
        .with_optimizer_rules(logical)
        .build();
    Ok(SessionContext::new_with_state(state))
}

/// Idle task runtimes at most: as many as task threads a TaskManager keeps.
const IDLE_RUNTIMES: usize = 64;

/// Runtimes of ended tasks, for the next ones. Building a runtime (its
/// driver's file descriptors, its timer) cost about 50 µs per subtask, and
/// each new runtime started its own threads for the file reads its scans
/// hand off; a kept runtime keeps them.
static IDLE: Mutex<Vec<tokio::runtime::Runtime>> = Mutex::new(Vec::new());

fn current_thread_runtime() -> Result<TaskRuntime> {
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
struct TaskRuntime(Option<tokio::runtime::Runtime>);

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
fn planning_runtime() -> Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .thread_name("fluvia-planner")
        .enable_all()
        .build()
        .map_err(|e| FluviaError::io("starting the planning runtime", e))
}

/// Which cuts the configuration asks for.
pub fn cut_policy(config: &Configuration) -> Result<CutPolicy> {
    Ok(if !config.get(&options::CHAINING_ENABLED)? {
        CutPolicy::Everything
    } else if !config.get(&options::MULTIPLE_INPUT)? {
        CutPolicy::Joins
    } else {
        CutPolicy::Exchanges
    })
}

/// Plans `req.sql` into a job. Errors in the query come back as
/// [`QueryError`] inside `FluviaError::Plan`.
pub fn plan(req: &PlanRequest) -> std::result::Result<PlannedQuery, PlanError> {
    let started = std::time::Instant::now();
    let rt = planning_runtime()?;
    let options = datafusion_options(req.parallelism, &req.config)?;
    let ctx = planning_context(
        &options,
        req.config.get(&options::SCALAR_SUBQUERY_JOIN_PUSHDOWN)?,
    )?;
    rt.block_on(req.catalog.register(&ctx))?;
    let registered = started.elapsed();
    // What the steps after DataFusion's planning read of the session, read
    // in place: `ctx.state()` copies it, with its maps of every function.
    let (runtime_env, config_options) = {
        let state = ctx.state_ref();
        let state = state.read();
        (
            Arc::clone(state.runtime_env()),
            Arc::clone(state.config_options()),
        )
    };
    let split_on_row_groups = req.config.get(&options::SPLIT_SCANS_ON_ROW_GROUPS)?;
    let physical = rt
        .block_on(async {
            let df = ctx.sql(&req.sql).await?;
            let df = match &req.insert {
                Some(target) => insert_projection(df, target)?,
                None => df,
            };
            let plan = df.create_physical_plan().await?;
            if split_on_row_groups {
                crate::row_group_split::split_scans_on_row_groups(
                    &runtime_env,
                    &config_options,
                    plan,
                )
                .await
            } else {
                Ok(plan)
            }
        })
        .map_err(|e| PlanError::Query(QueryError(e.to_string())))?;
    let planned = started.elapsed();
    let policy = cut_policy(&req.config)?;
    let filtered_build_in_task = req.config.get(&options::FILTERED_BUILD_IN_TASK)?;
    let small_build_bytes = req.config.get(&options::SMALL_BUILD_IN_TASK_MAX_SIZE)?;
    let mut stage_plan = split::split(
        Arc::clone(&physical),
        policy,
        filtered_build_in_task,
        small_build_bytes,
    )
    .map_err(|e| PlanError::Query(QueryError(e.to_string())))?;
    if policy == CutPolicy::Exchanges && req.config.get(&options::RUNTIME_FILTER_ENABLED)? {
        let filters = crate::runtime_filter::RuntimeFilterOptions {
            max_build_bytes: req.config.get(&options::RUNTIME_FILTER_MAX_BUILD_SIZE)?,
            min_probe_bytes: req.config.get(&options::RUNTIME_FILTER_MIN_PROBE_SIZE)?,
        };
        let planted =
            crate::runtime_filter::plant_runtime_filters(&mut stage_plan, filters, &config_options)
                .map_err(|e| PlanError::Query(QueryError(e.to_string())))?;
        if planted > 0 {
            tracing::debug!("{}: {planted} runtime filters planted", req.name);
        }
    }
    if req.insert.is_some() {
        // Every subtask of the last fragment writes its own part file:
        // the sink runs beside it, chained.
        if let Some(root) = stage_plan.stages.last_mut() {
            root.exchange = Exchange::Forward { offset: 0 };
        }
    }
    let mut stages = Vec::with_capacity(stage_plan.stages.len());
    for (id, s) in stage_plan.stages.iter().enumerate() {
        let shipped: Arc<dyn ExecutionPlan> = match s.exchange {
            Exchange::Hash { partitions, .. } => Arc::new(
                RepartitionExec::try_new(
                    Arc::clone(&s.plan),
                    Partitioning::Hash(s.hash_exprs.clone(), partitions),
                )
                .map_err(df_err)?,
            ),
            _ => Arc::clone(&s.plan),
        };
        let bytes = physical_plan_to_bytes_with_proto_converter(
            shipped,
            &FluviaCodec,
            &DeduplicatingProtoConverter {},
        )
        .map_err(|e| PlanError::Query(QueryError(format!("stage {id}: {e}"))))?;
        let schema: protobuf::Schema = s
            .plan
            .schema()
            .as_ref()
            .try_into()
            .map_err(|e| FluviaError::Serialization(format!("stage {id} schema: {e}")))?;
        stages.push(StageSpec {
            name: stage_name(&stage_plan, id),
            plan: bytes.to_vec(),
            parallelism: s.parallelism,
            exchange: s.exchange,
            consumer: s.consumer,
            inputs: s.inputs.clone(),
            schema: schema.encode_to_vec(),
        });
    }
    tracing::debug!(
        "{}: tables registered at {:.1} ms, physical plan at {:.1} ms, stages encoded at {:.1} ms",
        req.name,
        registered.as_secs_f64() * 1e3,
        planned.as_secs_f64() * 1e3,
        started.elapsed().as_secs_f64() * 1e3
    );
    let config = req
        .config
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let adaptive = if req.adaptive && req.config.get(&options::AUTO_PARALLELISM_ENABLED)? {
        split::adaptive_stages(&stage_plan)
    } else {
        vec![false; stage_plan.stages.len()]
    };
    let reuse = if req.config.get(&options::REUSE_SOURCE)? {
        let min_bytes = req.config.get(&options::REUSE_SOURCE_MIN_SIZE)?;
        crate::reuse::reuse_groups(&stage_plan, min_bytes)
            .into_iter()
            .filter(|g| g.stages.iter().all(|&s| !adaptive[s]))
            .collect()
    } else {
        Vec::new()
    };
    Ok(PlannedQuery {
        job: SqlJob {
            name: req.name.clone(),
            options,
            stages,
            result_path: req.result_path.to_string_lossy().to_string(),
            config,
            splittable: stage_plan
                .stages
                .iter()
                .zip(&adaptive)
                .map(|(s, &a)| {
                    if a {
                        split::splittable_inputs(s)
                    } else {
                        vec![false; s.inputs.len()]
                    }
                })
                .collect(),
            adaptive,
            branch_readers: stage_plan
                .stages
                .iter()
                .any(|s| split::reads_under_union(&s.plan)),
            key_groups: req.config.get(&options::AUTO_PARALLELISM_MAX)?,
            reuse,
            read_later: if req.config.get(&options::SOURCE_START_ON_DEMAND)? {
                split::read_later(&stage_plan)
            } else {
                Vec::new()
            },
            files: match &req.insert {
                None => None,
                Some(t) => Some(FileSinkSpec {
                    table: t.table.clone(),
                    dir: t.dir.to_string_lossy().to_string(),
                    format: t.format,
                    csv: t.csv.clone(),
                    prefix: uuid::Uuid::new_v4().to_string(),
                    schema: {
                        let schema: protobuf::Schema =
                            t.schema.as_ref().try_into().map_err(|e| {
                                FluviaError::Serialization(format!("table schema: {e}"))
                            })?;
                        schema.encode_to_vec()
                    },
                }),
            },
            shared_clusters: Default::default(),
            parsed: Default::default(),
        },
        stage_plan,
        physical,
    })
}

/// The query's rows as the columns of the INSERT's table: by position (or
/// into the named columns, the others NULL), cast to the table's types.
fn insert_projection(
    df: datafusion::dataframe::DataFrame,
    target: &InsertTarget,
) -> datafusion::error::Result<datafusion::dataframe::DataFrame> {
    use datafusion::logical_expr::{Expr, ExprSchemable, cast, lit};
    use datafusion::scalar::ScalarValue;
    let given = df.schema().fields().len();
    let table = &target.table;
    let expected = if target.columns.is_empty() {
        target.schema.fields().len()
    } else {
        target.columns.len()
    };
    if given != expected {
        return Err(DataFusionError::Plan(format!(
            "INSERT INTO {table}: the query gives {given} column(s), the table takes {expected}"
        )));
    }
    for (i, c) in target.columns.iter().enumerate() {
        if target.columns[..i].contains(c) {
            return Err(DataFusionError::Plan(format!(
                "INSERT INTO {table}: column '{c}' is named twice"
            )));
        }
        if target.schema.field_with_name(c).is_err() {
            return Err(DataFusionError::Plan(format!(
                "INSERT INTO {table}: the table has no column '{c}'"
            )));
        }
    }
    let source: Vec<Expr> = df
        .schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect();
    let mut exprs = Vec::with_capacity(target.schema.fields().len());
    for (i, f) in target.schema.fields().iter().enumerate() {
        let from = if target.columns.is_empty() {
            Some(source[i].clone())
        } else {
            target
                .columns
                .iter()
                .position(|c| c == f.name())
                .map(|p| source[p].clone())
        };
        let want = f.data_type().clone();
        let e = match from {
            Some(e) => {
                let have = e.get_type(df.schema())?;
                if have == want { e } else { cast(e, want) }
            }
            None => {
                if !f.is_nullable() {
                    return Err(DataFusionError::Plan(format!(
                        "INSERT INTO {table}: column '{}' is NOT NULL and not given",
                        f.name()
                    )));
                }
                cast(lit(ScalarValue::Null), want)
            }
        };
        exprs.push(e.alias(f.name()));
    }
    df.select(exprs)
}

/// Plans `sql` logically against `catalog` (nothing runs): the schema of
/// its result. Checks a view's query or a DDL statement before the session
/// keeps it, and gives `DESCRIBE` its columns.
pub fn check_statement(
    catalog: &Catalog,
    parallelism: usize,
    config: &Configuration,
    sql: &str,
) -> std::result::Result<SchemaRef, PlanError> {
    let rt = current_thread_runtime()?;
    let options = datafusion_options(parallelism, config)?;
    let ctx = planning_context(
        &options,
        config.get(&options::SCALAR_SUBQUERY_JOIN_PUSHDOWN)?,
    )?;
    rt.block_on(catalog.register(&ctx))?;
    rt.block_on(async {
        let df = ctx.sql(sql).await?;
        Ok::<_, DataFusionError>(Arc::new(df.schema().as_arrow().clone()))
    })
    .map_err(|e| PlanError::Query(QueryError(e.to_string())))
}

/// Why planning failed.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{0}")]
    Query(QueryError),
    #[error(transparent)]
    Fluvia(#[from] FluviaError),
}

/// Flink-style names: a fragment with one input is its operators bottom-up;
/// with several it is a `MultipleInput` listing its read order and members.
fn stage_name(plan: &StagePlan, id: usize) -> String {
    let stage = &plan.stages[id];
    let (inputs, order) = split::read_order(&stage.plan);
    let members = split::members(&stage.plan);
    let sources: Vec<String> = inputs
        .iter()
        .filter_map(|i| match i {
            StageInput::Scan(t) => Some(format!("Source: {t}")),
            StageInput::Exchange(_) => None,
        })
        .collect();
    let fused = split::multi_input_operators(&stage.plan);
    let body = if inputs.len() >= 2 && fused >= 2 {
        let order = order
            .iter()
            .map(|o| o.to_string())
            .collect::<Vec<_>>()
            .join(",");
        format!(
            "MultipleInput(readOrder=[{order}], members=[{}])",
            members.join(", ")
        )
    } else {
        members.join(" -> ")
    };
    match (sources.is_empty(), body.is_empty()) {
        (true, _) => body,
        (false, true) => sources.join(", "),
        (false, false) if stage.inputs.is_empty() && inputs.len() == 1 => {
            format!("{} -> {body}", sources[0])
        }
        (false, false) => format!("{body} [{}]", sources.join(", ")),
    }
}

// ---------------------------------------------------------------- exchange mode

/// `execution.batch-shuffle-mode`: how a SQL job's exchanges move data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShuffleMode {
    /// Each exchange a blocking partition, read once its producer finished.
    Blocking,
    /// Each exchange streamed while both ends run (one pipelined region).
    Pipelined,
    /// Pipelined where a blocking partition buys nothing; the client
    /// resolves it with [`SqlJob::resolve_shuffle_mode`] before submitting.
    Auto,
}

impl ShuffleMode {
    pub fn of(config: &Configuration) -> Result<ShuffleMode> {
        let v = config.get(&options::BATCH_SHUFFLE_MODE)?;
        match v.to_ascii_uppercase().as_str() {
            "ALL_EXCHANGES_BLOCKING" => Ok(ShuffleMode::Blocking),
            "ALL_EXCHANGES_PIPELINED" => Ok(ShuffleMode::Pipelined),
            "AUTO" => Ok(ShuffleMode::Auto),
            _ => Err(FluviaError::Config(format!(
                "{} must be ALL_EXCHANGES_BLOCKING, ALL_EXCHANGES_PIPELINED or AUTO, not '{v}'",
                options::BATCH_SHUFFLE_MODE.key
            ))),
        }
    }
}

impl SqlJob {
    /// Settles `AUTO` for where the job runs: pipelined on the embedded
    /// mini-cluster, which starts with a slot for every task, unless
    /// speculative attempts or an external shuffle service want finished,
    /// stored partitions; blocking on a cluster, whose slots may be fewer
    /// than the tasks (blocking stages run in waves).
    pub fn resolve_shuffle_mode(&mut self, embedded: bool) -> Result<()> {
        let config = self.configuration();
        if ShuffleMode::of(&config)? != ShuffleMode::Auto {
            return Ok(());
        }
        let speculative = config.get(&options::SPECULATIVE_ENABLED)?;
        let external = config
            .get_raw("shuffle-service.type")
            .is_some_and(|t| t.eq_ignore_ascii_case("external"));
        let mode = if embedded && !speculative && !external {
            "ALL_EXCHANGES_PIPELINED"
        } else {
            "ALL_EXCHANGES_BLOCKING"
        };
        self.config
            .retain(|(k, _)| k != options::BATCH_SHUFFLE_MODE.key);
        self.config.push((
            options::BATCH_SHUFFLE_MODE.key.to_string(),
            mode.to_string(),
        ));
        Ok(())
    }
}

// ---------------------------------------------------------------- job encoding

impl SqlJob {
    /// The job as program arguments.
    pub fn to_args(&self) -> Result<Vec<String>> {
        let bytes = bincode::serialize(self)
            .map_err(|e| FluviaError::Serialization(format!("encoding the SQL job: {e}")))?;
        Ok(vec![
            "--job".to_string(),
            base64::engine::general_purpose::STANDARD.encode(bytes),
        ])
    }

    pub fn from_args(args: &[String]) -> Result<SqlJob> {
        let [flag, data] = args else {
            return Err(FluviaError::Plan("the sql program takes --job DATA".into()));
        };
        if flag != "--job" {
            return Err(FluviaError::Plan("the sql program takes --job DATA".into()));
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| FluviaError::Serialization(format!("decoding the SQL job: {e}")))?;
        bincode::deserialize(&bytes)
            .map_err(|e| FluviaError::Serialization(format!("decoding the SQL job: {e}")))
    }

    pub fn configuration(&self) -> Configuration {
        let mut c = Configuration::new();
        for (k, v) in &self.config {
            c.set(k, v.clone());
        }
        c
    }

    /// Fragment `id`'s protobuf message, parsed at its first use here.
    fn parsed(&self, id: usize) -> Result<Arc<protobuf::PhysicalPlanNode>> {
        if let Some(p) = lock(&self.parsed).get(&id) {
            return Ok(Arc::clone(p));
        }
        let spec = self
            .stages
            .get(id)
            .ok_or_else(|| FluviaError::Internal(format!("the job has no stage {id}")))?;
        let p = Arc::new(
            protobuf::PhysicalPlanNode::decode(spec.plan.as_slice())
                .map_err(|e| FluviaError::Serialization(format!("stage {id}'s plan: {e}")))?,
        );
        lock(&self.parsed).insert(id, Arc::clone(&p));
        Ok(p)
    }

    fn stage_schema(&self, id: usize) -> Result<SchemaRef> {
        decode_schema(&self.stages[id].schema, &format!("stage {id}"))
    }

    /// Whether the scheduler decides the parallelism of stage `id`.
    pub fn is_adaptive(&self, id: usize) -> bool {
        self.adaptive.get(id).copied().unwrap_or(false) && self.key_groups > 0
    }

    /// How many subtasks the sink runs: one collects the result; an
    /// INSERT's part files are written by as many as the last fragment has.
    fn sink_parallelism(&self) -> usize {
        match (&self.files, self.stages.last()) {
            (Some(_), Some(root)) => root.parallelism.max(1),
            _ => 1,
        }
    }

    /// Whether stage `id` feeds its consumer one-to-one.
    fn is_pointwise(&self, id: usize) -> bool {
        let s = &self.stages[id];
        let consumer_parallelism = s
            .consumer
            .map_or(self.sink_parallelism(), |c| self.stages[c].parallelism);
        s.exchange == (Exchange::Forward { offset: 0 }) && s.parallelism == consumer_parallelism
    }

    fn partitioner(&self, id: usize) -> PartitionerKind {
        match self.stages[id].exchange {
            Exchange::Hash { .. } => PartitionerKind::Hash,
            Exchange::Broadcast => PartitionerKind::Broadcast,
            Exchange::Global { .. } => PartitionerKind::Global,
            Exchange::Forward { .. } if self.is_pointwise(id) => PartitionerKind::Forward,
            // A direct route: the producer picks the consumer subtask.
            Exchange::Forward { .. } => PartitionerKind::Hash,
        }
    }

    /// The stages run by one task, as [`SqlJob::tasks`] lists them.
    fn members(&self, id: usize) -> Vec<usize> {
        self.reuse_group(id)
            .map(|g| g.stages.clone())
            .unwrap_or_else(|| vec![id])
    }

    fn reuse_group(&self, id: usize) -> Option<&ReuseGroup> {
        self.reuse.iter().find(|g| g.stages.contains(&id))
    }

    /// One entry per task, in stage order of its first stage: a reuse group
    /// runs as one task, every other stage alone.
    pub fn tasks(&self) -> Vec<Vec<usize>> {
        let mut out: Vec<Vec<usize>> = Vec::new();
        for id in 0..self.stages.len() {
            let m = self.members(id);
            if m[0] == id {
                out.push(m);
            }
        }
        out
    }

    /// The stages a task reads, in the order of its input numbers: its
    /// stages' inputs one after another.
    fn task_inputs(&self, members: &[usize]) -> Vec<usize> {
        members
            .iter()
            .flat_map(|&m| self.stages[m].inputs.iter().copied())
            .collect()
    }

    /// Flink's chain name for a task of several stages: the shared source
    /// chained to each stage's operators.
    fn task_name(&self, members: &[usize]) -> String {
        match members {
            [one] => self.stages[*one].name.clone(),
            _ => {
                let names: Vec<&str> = members
                    .iter()
                    .map(|&m| self.stages[m].name.as_str())
                    .collect();
                let prefix = names[0].split(" -> ").next().unwrap_or_default();
                if prefix.starts_with("Source: ")
                    && names
                        .iter()
                        .all(|n| n.starts_with(&format!("{prefix} -> ")))
                {
                    let rest: Vec<&str> = names.iter().map(|n| &n[prefix.len() + 4..]).collect();
                    format!("{prefix} -> ({})", rest.join(", "))
                } else {
                    format!("({})", names.join(", "))
                }
            }
        }
    }

    /// The StreamGraph: one node per task (a source when it has no
    /// network input) and a sink; edges carry the stages' exchanges. Also
    /// the node of each stage, the edge out of each stage, and the sink.
    fn graph(&self) -> Result<(StreamGraph, Vec<usize>, Vec<usize>, usize)> {
        let config = self.configuration();
        let mut b = StreamGraphBuilder::new(self.name.clone());
        b.runtime_mode = RuntimeMode::Batch;
        b.chaining_enabled = config.get(&options::CHAINING_ENABLED)?;
        // Branch readers deadlock pipelined unless the inputs of branches a
        // subtask does not run are released at its start.
        let branches_safe = !self.branch_readers || config.get(&options::RELEASE_UNREAD_INPUTS)?;
        // The adaptive batch scheduler sizes stages from the bytes their
        // producers wrote into finished partitions (as in Flink, it takes
        // blocking exchanges only).
        let pipelined = ShuffleMode::of(&config)? == ShuffleMode::Pipelined
            && branches_safe
            && !(0..self.stages.len()).any(|k| self.is_adaptive(k));
        let mut nodes = vec![usize::MAX; self.stages.len()];
        for members in self.tasks() {
            let k = members[0];
            let s = &self.stages[k];
            let inputs = self.task_inputs(&members).len();
            let name = self.task_name(&members);
            let id = if inputs == 0 {
                b.add_source(name, true)
            } else {
                let n = b.add_operator(name, inputs);
                // A fragment pulls its own inputs: never chained behind
                // another one, even over a pipelined forward edge.
                b.set_chaining_strategy(n, fluvia_core::ChainingStrategy::Head);
                n
            };
            if self.is_adaptive(k) {
                // Left to the scheduler; the planned count is the default.
                b.default_parallelism = s.parallelism;
                b.set_max_parallelism(id, self.key_groups.max(s.parallelism));
            } else {
                b.set_parallelism(id, s.parallelism);
                b.set_max_parallelism(id, s.parallelism.max(1));
            }
            for &m in &members {
                nodes[m] = id;
            }
        }
        let sink_name = match &self.files {
            Some(f) => format!("Sink: {} ({} files)", f.table, f.format.name()),
            None => "Sink: collect".to_string(),
        };
        let sink = b.add_operator(sink_name, 1);
        // Each attempt writes its own files; the winner's are renamed into
        // place when the job finishes.
        b.set_supports_concurrent_attempts(sink, true);
        let root = self.stages.len() - 1;
        if self.files.is_some() && self.is_adaptive(root) {
            // Chained to the last fragment: its parallelism, whatever the
            // scheduler decides.
            b.set_max_parallelism(sink, self.key_groups.max(self.stages[root].parallelism));
        } else {
            b.set_parallelism(sink, self.sink_parallelism());
            b.set_max_parallelism(sink, self.sink_parallelism());
        }
        let mut edges = Vec::with_capacity(self.stages.len());
        for (id, s) in self.stages.iter().enumerate() {
            let (target, type_number) = match s.consumer {
                Some(c) => {
                    let inputs = self.task_inputs(&self.members(c));
                    let pos = inputs.iter().position(|&i| i == id).ok_or_else(|| {
                        FluviaError::Plan(format!("stage {c} does not read stage {id}"))
                    })?;
                    (nodes[c], if inputs.len() == 1 { 0 } else { pos as u8 + 1 })
                }
                None => (sink, 0),
            };
            // Fragments are never chained to each other (each pulls its
            // own inputs); only the sink chains onto the last fragment. A
            // task of several stages writes blocking partitions unless its
            // outputs are single rows (see `ReuseGroup`).
            let blocking = self.reuse_group(id).is_some_and(|g| !g.small_outputs);
            let mode = if s.consumer.is_some() {
                if pipelined && !blocking {
                    ExchangeMode::Pipelined
                } else {
                    ExchangeMode::Batch
                }
            } else {
                ExchangeMode::Undefined
            };
            let edge = b.add_edge(
                nodes[id],
                target,
                Some(self.partitioner(id)),
                mode,
                type_number,
            );
            if let Some(c) = s.consumer {
                let pos = self.stages[c].inputs.iter().position(|&i| i == id);
                let split = pos
                    .and_then(|p| self.splittable.get(c).and_then(|f| f.get(p)))
                    .copied()
                    .unwrap_or(false);
                b.set_intra_input_key_correlated(edge, !split);
            }
            edges.push(edge);
        }
        Ok((b.build()?, nodes, edges, sink))
    }

    /// The StreamGraph the job runs as.
    pub fn stream_graph(&self) -> Result<StreamGraph> {
        Ok(self.graph()?.0)
    }

    /// The JobGraph and the operators of every process.
    pub fn build(self: &Arc<Self>) -> Result<(JobGraph, OperatorRegistry)> {
        let (graph, nodes, edges, sink) = self.graph()?;
        let job = JobGraphGenerator::new(&graph).create_job_graph(self.configuration(), true)?;
        let mut registry = OperatorRegistry::new();
        let session = Arc::new(OnceLock::new());
        for members in self.tasks() {
            let node = nodes[members[0]];
            let schema = self.stage_schema(members[0])?;
            registry.register(
                node,
                Arc::new(StageFactory {
                    job: Arc::clone(self),
                    stages: members,
                    schema,
                    session: Arc::clone(&session),
                }),
            );
        }
        // Which stage's batches each edge takes (a task of several stages
        // writes each stage's output to its own edge).
        for (stage, &edge) in edges.iter().enumerate() {
            registry.register_edge_data(edge, Arc::new(OutputOf(stage)));
        }
        let root = self.stages.len() - 1;
        match &self.files {
            None => registry.register(
                sink,
                Arc::new(SinkFactory {
                    path: PathBuf::from(&self.result_path),
                    schema: self.stage_schema(root)?,
                }),
            ),
            Some(spec) => registry.register(
                sink,
                Arc::new(FileSinkFactory {
                    spec: spec.clone(),
                    input: self.stage_schema(root)?,
                    file_schema: decode_schema(&spec.schema, "table")?,
                }),
            ),
        }
        Ok((job, registry))
    }
}

fn decode_schema(bytes: &[u8], what: &str) -> Result<SchemaRef> {
    let proto = protobuf::Schema::decode(bytes)
        .map_err(|e| FluviaError::Serialization(format!("{what} schema: {e}")))?;
    let schema: Schema = (&proto)
        .try_into()
        .map_err(|e| FluviaError::Serialization(format!("{what} schema: {e}")))?;
    Ok(Arc::new(schema))
}

// ---------------------------------------------------------------- operators

struct StageFactory {
    job: Arc<SqlJob>,
    /// The stages this task runs (several: a reuse group).
    stages: Vec<usize>,
    schema: SchemaRef,
    /// DataFusion's functions and runtime, built once per process and job
    /// and shared by its tasks: building a session (or cloning one, with
    /// its maps of every function) costs more than running a small
    /// fragment.
    session: Arc<OnceLock<JobSession>>,
}

/// A job's DataFusion session in this process, and a task context holding
/// its functions: the one fragments are decoded with. A decoded plan holds
/// the functions it calls, so the context each task executes with leaves
/// the maps of every function empty (copying them cost each subtask about
/// 35 µs).
struct JobSession {
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

/// DataFusion's runtime for a job's tasks in this process, with the
/// process's cache of file footers. Each task's scans open their files
/// anew, and a Parquet footer costs a read and a decode (1.7 ms for `item`
/// at SF 1, longer than reading its two columns); DataFusion in one process
/// reads each footer once, when it plans. A TaskManager keeps the footers of
/// the files its jobs read, bounded as DataFusion bounds its own cache, and
/// an entry serves only a file of the same size and modification time.
fn task_runtime_env() -> Result<Arc<datafusion::execution::runtime_env::RuntimeEnv>> {
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
        let release_unread = configuration.get(&options::RELEASE_UNREAD_INPUTS)?;
        let cluster = configuration.get(&options::CLUSTER_BUILD_SIDE)?;
        let read_once = configuration.get(&options::READ_BUILD_SIDE_ONCE)?;
        let end_on_empty_probe = configuration.get(&options::END_JOIN_ON_EMPTY_PROBE)?;
        let skip_on_pruned_probe = configuration.get(&options::SKIP_BUILD_ON_PRUNED_PROBE)?;
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
        // demand ([`crate::demand`]) before it even decodes its plan; the
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
            let plan = crate::demand::demand_on_first_build_row(plan, &waiting, &task_inputs)
                .map_err(df_err)?;
            let plan = if cluster {
                let plan = crate::cluster::cluster_build_sides(plan).map_err(df_err)?;
                let job = &self.job;
                crate::cluster::share_broadcast_builds(
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
                crate::empty_probe::end_joins_on_empty_probe(plan).map_err(df_err)?
            } else {
                plan
            };
            let plan = if skip_on_pruned_probe {
                crate::pruned_probe::skip_builds_over_pruned_probes(plan).map_err(df_err)?
            } else {
                plan
            };
            plans.push(plan);
            outputs.push(out);
            task_ctx = ctx;
        }
        // Scans several fragments of this task make are read once.
        if plans.len() > 1 {
            plans = crate::reuse::share_scans(plans).map_err(df_err)?;
        }
        // Inputs no reader of this subtask reads (other union branches'):
        // released now rather than when the task ends.
        let mut read = std::collections::BTreeSet::new();
        for p in &plans {
            p.apply(|node| {
                if let Some(r) = node.downcast_ref::<crate::exchange::ExchangeReaderExec>() {
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
                .map(|p| crate::released::end_when_released(p, r))
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
                match crate::csv_errors::locate(&plans[i], &message) {
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
        let task_ctx = if crate::staging::writes_files(&plan) {
            let mut env = (*task_ctx.runtime_env()).clone();
            env.object_store_registry = Arc::new(crate::staging::StagingRegistry::new(
                Arc::clone(&env.object_store_registry),
                crate::staging::StagingStore::new(self.attempt, Arc::clone(&self.staged)),
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

struct SinkFactory {
    path: PathBuf,
    schema: SchemaRef,
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
        Ok(OperatorInstance::OneInput {
            input: Box::new(input),
            input_type: Arc::new(SqlBatchType {
                schema: Arc::clone(&self.schema),
            }),
        })
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

/// Runs `sql` with DataFusion alone in this process, with the same tables
/// and `parallelism` target partitions: the single-process baseline.
pub fn run_in_datafusion(
    sql: &str,
    catalog: &Catalog,
    parallelism: usize,
    config: &Configuration,
) -> std::result::Result<(SchemaRef, Vec<datafusion::arrow::record_batch::RecordBatch>), PlanError>
{
    // Timed from the same point as `plan`: its runtime's start included.
    let started = std::time::Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(parallelism.max(1))
        .enable_all()
        .build()
        .map_err(|e| FluviaError::io("starting the DataFusion runtime", e))?;
    let mut options = datafusion_options(parallelism, config)?;
    // In one process DataFusion's own defaults apply (round-robin
    // exchanges, work stealing between scan partitions, physical scalar
    // subqueries are its strengths there).
    options.retain(|(k, _)| {
        k == "datafusion.execution.target_partitions"
            || k.contains("view_types")
            || k.contains("utf8view")
    });
    // DataFusion alone reads CSV with its own reader.
    let config =
        session_config(&options)?.with_extension(Arc::new(crate::csv_scan::CsvReader::DataFusion));
    let ctx = SessionContext::new_with_config(config);
    rt.block_on(catalog.register(&ctx))?;
    let registered = started.elapsed();
    rt.block_on(async {
        let df = ctx.sql(sql).await?;
        let schema = Arc::new(df.schema().as_arrow().clone());
        let task_ctx = Arc::new(df.task_ctx());
        let plan = df.create_physical_plan().await?;
        let planned = started.elapsed();
        let batches = datafusion::physical_plan::collect(Arc::clone(&plan), task_ctx).await?;
        tracing::debug!(
            "DataFusion: tables registered at {:.1} ms, physical plan at {:.1} ms, executed at {:.1} ms",
            registered.as_secs_f64() * 1e3,
            planned.as_secs_f64() * 1e3,
            started.elapsed().as_secs_f64() * 1e3
        );
        tracing::debug!(
            "DataFusion's plan:\n{}",
            datafusion::physical_plan::display::DisplayableExecutionPlan::with_metrics(
                plan.as_ref()
            )
            .indent(true)
        );
        Ok::<_, DataFusionError>((schema, batches))
    })
    .map_err(|e| PlanError::Query(QueryError(e.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::prelude::ParquetReadOptions;

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
        first
            .register_parquet("t", path.to_str().unwrap(), ParquetReadOptions::default())
            .await
            .unwrap();
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

//! A statement into a [`SqlJob`]: DataFusion plans it in a session with
//! Fluvia's rules, [`crate::planning`] cuts its physical plan into stages,
//! and each stage's fragment is encoded for shipping. Also the checks a
//! session runs before it keeps a view or a table, and the single-process
//! baseline. Nothing here runs a task.

use super::runtime::{current_thread_runtime, planning_runtime};
use super::{SqlJob, StageSpec, df_err};
use crate::formats::codec::FluviaCodec;
use crate::formats::file_sink::FileSinkSpec;
use crate::planning::split::{self, CutPolicy, Exchange, StagePlan};
use crate::session::catalog::Catalog;
use crate::session::options as sql_options;
use crate::session::{datafusion_options, session_config};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::DataFusionError;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionContext;
use datafusion::physical_expr::Partitioning;
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion_proto::bytes::physical_plan_to_bytes_with_proto_converter;
use datafusion_proto::physical_plan::DeduplicatingProtoConverter;
use datafusion_proto::protobuf;
use fluvia_core::config::options;
use fluvia_core::{Configuration, FluviaError, Result};
use prost::Message;
use std::path::PathBuf;
use std::sync::Arc;

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
    pub format: crate::session::catalog::FileFormat,
    pub csv: crate::session::catalog::CsvLayout,
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
        logical.insert(
            at,
            Arc::new(crate::planning::scalar_join::PushScalarSubqueryJoins),
        );
    }
    let mut rules = PhysicalOptimizer::new().rules;
    let at = rules
        .iter()
        .position(|r| r.name() == "join_selection")
        .map_or(0, |i| i + 1);
    rules.insert(at, Arc::new(crate::planning::broadcast::BroadcastSafety));
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_physical_optimizer_rules(rules)
        .with_optimizer_rules(logical)
        .build();
    Ok(SessionContext::new_with_state(state))
}

/// Which cuts the configuration asks for.
pub fn cut_policy(config: &Configuration) -> Result<CutPolicy> {
    Ok(if !config.get(&options::CHAINING_ENABLED)? {
        CutPolicy::Everything
    } else if !config.get(&sql_options::MULTIPLE_INPUT)? {
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
        req.config
            .get(&sql_options::SCALAR_SUBQUERY_JOIN_PUSHDOWN)?,
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
    let split_on_row_groups = req.config.get(&sql_options::SPLIT_SCANS_ON_ROW_GROUPS)?;
    let physical = rt
        .block_on(async {
            let df = ctx.sql(&req.sql).await?;
            let df = match &req.insert {
                Some(target) => insert_projection(df, target)?,
                None => df,
            };
            let plan = df.create_physical_plan().await?;
            if split_on_row_groups {
                crate::planning::row_group_split::split_scans_on_row_groups(
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
    let chaining = crate::planning::source_chaining::SourceChaining {
        filtered_build_in_task: req.config.get(&sql_options::FILTERED_BUILD_IN_TASK)?,
        small_build_bytes: req.config.get(&sql_options::SMALL_BUILD_IN_TASK_MAX_SIZE)?,
    };
    let mut stage_plan = split::split(Arc::clone(&physical), policy, chaining)
        .map_err(|e| PlanError::Query(QueryError(e.to_string())))?;
    if policy == CutPolicy::Exchanges && req.config.get(&sql_options::RUNTIME_FILTER_ENABLED)? {
        let filters = crate::planning::runtime_filter::RuntimeFilterOptions {
            max_build_bytes: req
                .config
                .get(&sql_options::RUNTIME_FILTER_MAX_BUILD_SIZE)?,
            min_probe_bytes: req
                .config
                .get(&sql_options::RUNTIME_FILTER_MIN_PROBE_SIZE)?,
        };
        let planted = crate::planning::runtime_filter::plant_runtime_filters(
            &mut stage_plan,
            filters,
            &config_options,
        )
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
            name: crate::planning::multiple_input::stage_name(&stage_plan, id),
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
    let reuse = if req.config.get(&sql_options::REUSE_SOURCE)? {
        let min_bytes = req.config.get(&sql_options::REUSE_SOURCE_MIN_SIZE)?;
        crate::planning::source_reuse::reuse_groups(&stage_plan, min_bytes)
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
            read_later: if req.config.get(&sql_options::SOURCE_START_ON_DEMAND)? {
                crate::planning::multiple_input::read_later(&stage_plan)
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
        config.get(&sql_options::SCALAR_SUBQUERY_JOIN_PUSHDOWN)?,
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
    let config = session_config(&options)?
        .with_extension(Arc::new(crate::formats::csv_scan::CsvReader::DataFusion));
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

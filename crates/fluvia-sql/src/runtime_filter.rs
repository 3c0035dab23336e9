//! Runtime filters that cross a task: Flink's `table.optimizer.runtime-filter.*`.
//!
//! DataFusion's hash join fills a dynamic filter from its build side and the
//! probe side's scan skips what cannot match (row groups and pages by the
//! key's bounds, rows by a lookup). In one process that reaches any scan
//! below the join. Cut into fragments, a scan in another task than its join
//! holds the filter too, but nobody there fills it: q18's `catalog_sales`
//! scan reads all its rows although the join with `d_year = 2001` above the
//! next exchange keeps a fifth of them.
//!
//! Flink builds such a filter from the join's build side and ships it to a
//! filter operator beside the probe side's scan, before the shuffle. Fluvia
//! does the same with what a fragment already runs: where the build side is
//! a small filtered scan pipeline, a copy of it becomes the build side of a
//! right semi join planted directly over the probe-side scan in the other
//! fragment. Every subtask there reads the small side whole (as a build
//! side kept in its join's task is read), and DataFusion's own dynamic
//! filter of the semi join prunes the scan. The semi join passes the scan's
//! rows through unchanged in schema; it only drops rows the join above
//! would drop anyway, which [`trace`] checks for every operator between.
//!
//! Knows plans and stages only; which stages run where is the job's
//! business.

use crate::exchange::ExchangeReaderExec;
use crate::split::{Exchange, StagePlan, dynamic_filter_ids, file_bytes, is_plain_pipeline};
use datafusion::common::{JoinSide, JoinType, NullEquality};
use datafusion::config::ConfigOptions;
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result as DfResult;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_optimizer::filter_pushdown::FilterPushdown;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::utils::build_join_schema;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use std::sync::Arc;

/// When a join's filter is planted beside a scan in another fragment.
#[derive(Debug, Clone, Copy)]
pub struct RuntimeFilterOptions {
    /// The build side's files at most this many bytes: every subtask of the
    /// scan's fragment reads them whole.
    pub max_build_bytes: u64,
    /// The probe side's scan at least this many bytes of files: below, what
    /// it could skip costs less than reading the build side again.
    pub min_probe_bytes: u64,
}

/// Where a column of a stage's plan comes from unchanged: a file scan's
/// column, reached through the children at `path`, in stage `stage`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin {
    stage: usize,
    path: Vec<usize>,
    column: usize,
}

/// Plants a semi join over the probe-side scans of every eligible join of
/// `plan` (see the module doc); returns how many it planted.
pub fn plant_runtime_filters(
    plan: &mut StagePlan,
    options: RuntimeFilterOptions,
    config: &ConfigOptions,
) -> DfResult<usize> {
    let mut planted = 0;
    for consumer in 0..plan.stages.len() {
        let mut joins = Vec::new();
        collect_joins(&plan.stages[consumer].plan, &mut joins);
        for join in joins {
            if let Some((origin, build, keys)) = candidate(plan, consumer, &join, options) {
                let stage = &mut plan.stages[origin.stage];
                stage.plan = plant(&stage.plan, &origin.path, &build, &keys, config)?;
                planted += 1;
            }
        }
    }
    Ok(planted)
}

fn collect_joins(plan: &Arc<dyn ExecutionPlan>, out: &mut Vec<Arc<dyn ExecutionPlan>>) {
    if plan.is::<HashJoinExec>() {
        out.push(Arc::clone(plan));
    }
    for child in plan.children() {
        collect_joins(child, out);
    }
}

/// A build key and the scan column it meets.
type KeyPair = (Arc<dyn PhysicalExpr>, usize);

/// For a join of stage `consumer`: the scan in another stage its probe keys
/// come from, the build side to copy there, and the key pairs.
fn candidate(
    plan: &StagePlan,
    consumer: usize,
    join: &Arc<dyn ExecutionPlan>,
    options: RuntimeFilterOptions,
) -> Option<(Origin, Arc<dyn ExecutionPlan>, Vec<KeyPair>)> {
    let j = join.downcast_ref::<HashJoinExec>()?;
    // Joins whose output loses a probe row without a match.
    if *j.partition_mode() != PartitionMode::CollectLeft
        || !matches!(
            j.join_type(),
            JoinType::Inner | JoinType::RightSemi | JoinType::LeftSemi
        )
        || j.null_equality() != NullEquality::NullEqualsNothing
    {
        return None;
    }
    let build = small_build(plan, j.left(), options)?;
    let mut target: Option<Origin> = None;
    let mut keys = Vec::new();
    for (build_key, probe_key) in j.on() {
        let Some(c) = probe_key.downcast_ref::<Column>() else {
            continue;
        };
        let Some(origin) = trace(plan, consumer, j.right(), c.index(), Vec::new()) else {
            continue;
        };
        let same = target
            .as_ref()
            .is_none_or(|t| t.stage == origin.stage && t.path == origin.path);
        if same {
            keys.push((Arc::clone(build_key), origin.column));
            target.get_or_insert(origin);
        }
    }
    let target = target?;
    if target.stage == consumer {
        // DataFusion's own filter reaches a scan of the join's fragment.
        return None;
    }
    let scan = node_at(&plan.stages[target.stage].plan, &target.path)?;
    let config = scan
        .downcast_ref::<DataSourceExec>()?
        .data_source()
        .downcast_ref::<FileScanConfig>()?;
    if crate::reuse::scan_bytes(config) < options.min_probe_bytes {
        return None;
    }
    Some((target, build, keys))
}

/// The build side of a collect-left join as a plan any fragment can run
/// whole: a plain, filtered scan pipeline over at most the size's files,
/// either in the join's fragment or the only content of the stage that
/// broadcasts it. Pipelines that read dynamic filters are left alone:
/// their producers live in the join's task.
fn small_build(
    plan: &StagePlan,
    left: &Arc<dyn ExecutionPlan>,
    options: RuntimeFilterOptions,
) -> Option<Arc<dyn ExecutionPlan>> {
    let pipeline = match left.downcast_ref::<ExchangeReaderExec>() {
        Some(r) => {
            let stage = plan.stages.get(r.stage())?;
            if stage.exchange != Exchange::Broadcast || !stage.inputs.is_empty() {
                return None;
            }
            Arc::clone(&stage.plan)
        }
        None => match left.downcast_ref::<CoalescePartitionsExec>() {
            Some(c) => Arc::clone(c.input()),
            None => Arc::clone(left),
        },
    };
    let filtered = {
        fn has_filter(p: &Arc<dyn ExecutionPlan>) -> bool {
            p.is::<FilterExec>() || p.children().into_iter().any(has_filter)
        }
        has_filter(&pipeline)
    };
    if !is_plain_pipeline(&pipeline)
        || !filtered
        || !dynamic_filter_ids(&pipeline).is_empty()
        || file_bytes(&pipeline).is_none_or(|b| b > options.max_build_bytes)
        || pipeline.schema() != left.schema()
    {
        return None;
    }
    Some(if pipeline.output_partitioning().partition_count() > 1 {
        Arc::new(CoalescePartitionsExec::new(pipeline))
    } else {
        pipeline
    })
}

/// Follows column `column` of `node` (reached through `path` in stage
/// `stage`) down to the file scan it comes from, through operators that pass
/// it on unchanged and only keep or drop rows: a row dropped at the scan
/// would leave only rows the join above drops anyway (those carrying its
/// key, and under an outer join rows whose key is then NULL, which the
/// join's `NullEqualsNothing` drops too). Crosses exchanges into the stage
/// that produces them. No limits (they would pick other rows), no unions,
/// windows or sorts with a fetch.
fn trace(
    plan: &StagePlan,
    stage: usize,
    node: &Arc<dyn ExecutionPlan>,
    column: usize,
    mut path: Vec<usize>,
) -> Option<Origin> {
    if node.fetch().is_some() {
        return None;
    }
    let mut down = |child: usize, column: usize| {
        path.push(child);
        let next = node.children().get(child).map(|c| Arc::clone(c))?;
        trace(plan, stage, &next, column, std::mem::take(&mut path))
    };
    if let Some(r) = node.downcast_ref::<ExchangeReaderExec>() {
        let producer = plan.stages.get(r.stage())?;
        if producer.plan.schema() != r.schema() {
            return None;
        }
        return trace(plan, r.stage(), &producer.plan, column, Vec::new());
    }
    if let Some(ds) = node.downcast_ref::<DataSourceExec>() {
        ds.data_source().downcast_ref::<FileScanConfig>()?;
        return Some(Origin {
            stage,
            path,
            column,
        });
    }
    if let Some(p) = node.downcast_ref::<ProjectionExec>() {
        let expr = &p.expr().get(column)?.expr;
        let c = expr.downcast_ref::<Column>()?;
        return down(0, c.index());
    }
    if let Some(f) = node.downcast_ref::<FilterExec>() {
        let column = match f.projection() {
            Some(p) => *p.get(column)?,
            None => column,
        };
        return down(0, column);
    }
    if let Some(j) = node.downcast_ref::<HashJoinExec>() {
        let column = match &j.projection {
            Some(p) => *p.get(column)?,
            None => column,
        };
        let (_, indices) =
            build_join_schema(&j.left().schema(), &j.right().schema(), j.join_type());
        let ci = indices.get(column)?;
        return match ci.side {
            JoinSide::Left => down(0, ci.index),
            JoinSide::Right => down(1, ci.index),
            JoinSide::None => None,
        };
    }
    if let Some(a) = node.downcast_ref::<AggregateExec>() {
        // A group key: dropping rows drops whole groups of other keys.
        let group = a.group_expr();
        if !group.is_single() {
            return None;
        }
        let expr = &group.expr().get(column)?.0;
        let c = expr.downcast_ref::<Column>()?;
        return down(0, c.index());
    }
    let name = node.name();
    if matches!(name, "CoalesceBatchesExec" | "RepartitionExec" | "SortExec") {
        return down(0, column);
    }
    None
}

fn node_at(plan: &Arc<dyn ExecutionPlan>, path: &[usize]) -> Option<Arc<dyn ExecutionPlan>> {
    let mut node = Arc::clone(plan);
    for &i in path {
        let next = Arc::clone(node.children().get(i)?);
        node = next;
    }
    Some(node)
}

/// `plan` with the node at `path` (a scan) under a right semi join with
/// `build`, whose dynamic filter DataFusion's pushdown wires into the scan.
fn plant(
    plan: &Arc<dyn ExecutionPlan>,
    path: &[usize],
    build: &Arc<dyn ExecutionPlan>,
    keys: &[KeyPair],
    config: &ConfigOptions,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let Some((&first, rest)) = path.split_first() else {
        let scan_schema = plan.schema();
        let on = keys
            .iter()
            .map(|(build_key, column)| {
                let name = scan_schema.field(*column).name();
                let probe: Arc<dyn PhysicalExpr> = Arc::new(Column::new(name, *column));
                (Arc::clone(build_key), probe)
            })
            .collect();
        let semi: Arc<dyn ExecutionPlan> = Arc::new(HashJoinExec::try_new(
            Arc::clone(build),
            Arc::clone(plan),
            on,
            None,
            &JoinType::RightSemi,
            None,
            PartitionMode::CollectLeft,
            NullEquality::NullEqualsNothing,
            false,
        )?);
        return FilterPushdown::new_post_optimization().optimize(semi, config);
    };
    let mut children: Vec<Arc<dyn ExecutionPlan>> =
        plan.children().into_iter().map(Arc::clone).collect();
    let Some(child) = children.get_mut(first) else {
        return Ok(Arc::clone(plan));
    };
    *child = plant(child, rest, build, keys, config)?;
    replace_children_if_necessary(Arc::clone(plan), children)
}

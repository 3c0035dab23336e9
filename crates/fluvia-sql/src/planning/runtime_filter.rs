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

use crate::exec::exchange::ExchangeReaderExec;
use crate::inspect::dynamic_filter_ids;
use crate::inspect::{file_bytes, is_plain_pipeline};
use crate::planning::split::{Exchange, StagePlan};
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
    /// The filtered scan's fragment reads at least this many bytes of files
    /// in all its scans (see [`scanned_bytes`]): below, what it could skip
    /// costs less than reading the build side again.
    pub min_probe_bytes: u64,
}

/// Where a column of a stage's plan comes from unchanged: a file scan's
/// column, reached through the children at `path`, in stage `stage`.
#[derive(Debug)]
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
                tracing::debug!(
                    "runtime filter: a join of stage {consumer} filters the scan of {} in stage {} ({} build bytes)",
                    node_at(&plan.stages[origin.stage].plan, &origin.path)
                        .and_then(|s| crate::planning::split::scan_table(&s))
                        .unwrap_or_default(),
                    origin.stage,
                    file_bytes(&build).unwrap_or_default(),
                );
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
    if scanned_bytes(&plan.stages[target.stage].plan) < options.min_probe_bytes {
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

/// Bytes of files the scans of a fragment read: the work a filter on one of
/// them may save, since the fragment's other scans are pruned by the joins
/// the filtered rows no longer reach (q2's `date_dim`, filtered to a year's
/// weeks, narrows the join that reads `web_sales`).
fn scanned_bytes(plan: &Arc<dyn ExecutionPlan>) -> u64 {
    let own = plan
        .downcast_ref::<DataSourceExec>()
        .and_then(|ds| ds.data_source().downcast_ref::<FileScanConfig>())
        .map_or(0, crate::inspect::scan_bytes);
    own + plan.children().into_iter().map(scanned_bytes).sum::<u64>()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::exchange::ReaderFacts;
    use crate::planning::split::Stage;
    use datafusion::arrow::array::{Array, Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
    use datafusion::datasource::listing::PartitionedFile;
    use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, ParquetSource};
    use datafusion::execution::object_store::ObjectStoreUrl;
    use datafusion::logical_expr::Operator;
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::physical_expr::expressions::{BinaryExpr, lit};
    use datafusion::physical_plan::collect;
    use datafusion::prelude::SessionContext;

    fn schema(key: &str) -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new(key, DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]))
    }

    /// A Parquet file of `(key, v)` rows in `dir`; its path and size.
    fn table(dir: &std::path::Path, name: &str, rows: &[(i64, i64)]) -> (String, u64) {
        let schema = schema(name);
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap();
        let path = dir.join(format!("{name}.parquet"));
        let mut w =
            ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let size = std::fs::metadata(&path).unwrap().len();
        (path.to_string_lossy().into_owned(), size)
    }

    fn scan(name: &str, file: &(String, u64)) -> Arc<dyn ExecutionPlan> {
        let source = ParquetSource::new(schema(name));
        let config =
            FileScanConfigBuilder::new(ObjectStoreUrl::local_filesystem(), Arc::new(source))
                .with_file_groups(vec![FileGroup::new(vec![PartitionedFile::new(
                    file.0.clone(),
                    file.1,
                )])])
                .build();
        DataSourceExec::from_data_source(config)
    }

    /// `v = 1` over a `(key, v)` input.
    fn v_is_one(input: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        let pred = Arc::new(BinaryExpr::new(
            Arc::new(Column::new("v", 1)),
            Operator::Eq,
            lit(1i64),
        ));
        Arc::new(FilterExec::try_new(pred, input).unwrap())
    }

    struct Shape {
        join_type: JoinType,
        filtered_build: bool,
        limit_on_probe: bool,
    }

    const INNER: Shape = Shape {
        join_type: JoinType::Inner,
        filtered_build: true,
        limit_on_probe: false,
    };

    /// Stage 0 broadcasts `dim` (maybe filtered), stage 1 hashes `fact`,
    /// stage 2 joins them on `dim.dim = fact.fact`: the join's probe side
    /// reads the scan of another fragment.
    fn stages(dir: &std::path::Path, shape: Shape) -> StagePlan {
        // dim: keys 0..10, v = 1 for keys 3 and 7.
        let dim = table(
            dir,
            "dim",
            &(0..10)
                .map(|k| (k, i64::from(k == 3 || k == 7)))
                .collect::<Vec<_>>(),
        );
        // fact: 100 rows, keys 0..10 round robin.
        let fact = table(
            dir,
            "fact",
            &(0..100).map(|i| (i % 10, i)).collect::<Vec<_>>(),
        );
        let build = if shape.filtered_build {
            v_is_one(scan("dim", &dim))
        } else {
            scan("dim", &dim)
        };
        let mut probe = scan("fact", &fact);
        if shape.limit_on_probe {
            probe = Arc::new(datafusion::physical_plan::limit::GlobalLimitExec::new(
                probe,
                0,
                Some(50),
            ));
        }
        let reader = |stage: usize, plan: &Arc<dyn ExecutionPlan>| -> Arc<dyn ExecutionPlan> {
            Arc::new(
                ExchangeReaderExec::new(stage, plan.schema(), 1, ReaderFacts::of(plan, None))
                    .unwrap(),
            )
        };
        let join: Arc<dyn ExecutionPlan> = Arc::new(crate::exec::collect_left_join(
            reader(0, &build),
            reader(1, &probe),
            vec![(
                Arc::new(Column::new("dim", 0)) as Arc<dyn PhysicalExpr>,
                Arc::new(Column::new("fact", 0)) as Arc<dyn PhysicalExpr>,
            )],
            &shape.join_type,
            None,
        ));
        let stage = |plan: Arc<dyn ExecutionPlan>, exchange, consumer, inputs| Stage {
            plan,
            parallelism: 1,
            exchange,
            hash_exprs: Vec::new(),
            consumer,
            inputs,
        };
        StagePlan {
            stages: vec![
                stage(build, Exchange::Broadcast, Some(2), vec![]),
                stage(
                    probe,
                    Exchange::Hash {
                        partitions: 1,
                        offset: 0,
                    },
                    Some(2),
                    vec![],
                ),
                stage(join, Exchange::Forward { offset: 0 }, None, vec![0, 1]),
            ],
        }
    }

    /// The probe side's scan of a join that an empty build side empties
    /// starts on demand; the build side's scan, and the probe side of a
    /// join that outputs probe rows without any build row, start at once.
    #[test]
    fn only_a_scan_on_the_probe_side_of_a_join_an_empty_build_side_empties_waits() {
        let dir = tempfile::tempdir().unwrap();
        let read_later = |join_type| {
            let plan = stages(dir.path(), Shape { join_type, ..INNER });
            crate::planning::multiple_input::read_later(&plan)
        };
        for join_type in [
            INNER.join_type,
            JoinType::LeftSemi,
            JoinType::LeftAnti,
            JoinType::Left,
        ] {
            assert_eq!(read_later(join_type), [false, true, false], "{join_type}");
        }
        for join_type in [JoinType::Right, JoinType::Full, JoinType::RightAnti] {
            assert_eq!(read_later(join_type), [false, false, false], "{join_type}");
        }
    }

    const ANY_SIZE: RuntimeFilterOptions = RuntimeFilterOptions {
        max_build_bytes: u64::MAX,
        min_probe_bytes: 0,
    };

    fn plant_in(plan: &mut StagePlan, options: RuntimeFilterOptions) -> usize {
        plant_runtime_filters(plan, options, &ConfigOptions::new()).unwrap()
    }

    fn fact_keys(plan: &Arc<dyn ExecutionPlan>) -> Vec<i64> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let batches = rt
            .block_on(collect(Arc::clone(plan), SessionContext::new().task_ctx()))
            .unwrap();
        let mut keys: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                let a = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                (0..a.len()).map(|i| a.value(i)).collect::<Vec<_>>()
            })
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    #[test]
    fn a_join_across_an_exchange_filters_the_probe_scan_of_the_other_fragment() {
        let dir = tempfile_dir();
        let mut plan = stages(dir.path(), INNER);
        assert_eq!(plant_in(&mut plan, ANY_SIZE), 1);
        let producer = &plan.stages[1].plan;
        let semi = producer
            .downcast_ref::<HashJoinExec>()
            .expect("a semi join over the scan");
        assert_eq!(*semi.join_type(), JoinType::RightSemi);
        assert_eq!(producer.schema(), schema("fact"));
        // The semi join's own dynamic filter reaches the scan.
        assert_eq!(dynamic_filter_ids(semi.right()).len(), 1, "{producer:?}");
        // The fragment now emits only the rows whose key the filtered
        // build side holds.
        assert_eq!(fact_keys(producer), vec![3, 7]);
        // The join's fragment and the build side's are untouched.
        assert!(plan.stages[2].plan.is::<HashJoinExec>());
        assert!(plan.stages[0].plan.is::<FilterExec>());
    }

    #[test]
    fn joins_that_keep_unmatched_probe_rows_or_read_a_limit_or_an_unfiltered_side_are_left_alone() {
        let dir = tempfile_dir();
        for shape in [
            Shape {
                join_type: JoinType::Right,
                ..INNER
            },
            Shape {
                join_type: JoinType::RightAnti,
                ..INNER
            },
            Shape {
                filtered_build: false,
                ..INNER
            },
            Shape {
                limit_on_probe: true,
                ..INNER
            },
        ] {
            let mut plan = stages(dir.path(), shape);
            assert_eq!(plant_in(&mut plan, ANY_SIZE), 0);
            assert!(
                plan.stages[1].plan.is::<DataSourceExec>() || plan.stages[1].plan.fetch().is_some()
            );
        }
    }

    #[test]
    fn the_sizes_bound_which_joins_get_a_filter() {
        let dir = tempfile_dir();
        let small_build = RuntimeFilterOptions {
            max_build_bytes: 1,
            ..ANY_SIZE
        };
        assert_eq!(plant_in(&mut stages(dir.path(), INNER), small_build), 0);
        let large_probe = RuntimeFilterOptions {
            min_probe_bytes: 1 << 30,
            ..ANY_SIZE
        };
        assert_eq!(plant_in(&mut stages(dir.path(), INNER), large_probe), 0);
    }

    /// A directory of its own, removed when the test is done with it.
    fn tempfile_dir() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("fluvia-rf-")
            .tempdir()
            .unwrap()
    }
}

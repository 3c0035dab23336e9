//! A hash join that skips its build side when its probe side's scan is
//! pruned away (`table.exec.hash-join.skip-build-on-pruned-probe`).
//!
//! DataFusion's hash join collects its build side before it polls its probe
//! side, and nested joins collect theirs one after another, the outermost
//! first. The scan at the bottom of the probe side opens last and only then
//! prunes its row groups with the runtime filters the joins above it
//! completed. A subtask whose row groups all fall outside the outermost
//! join's filter (q15's second `catalog_sales` row group, outside the
//! quarter its `date_dim` filter keeps) thus still read and hashed every
//! inner build side (50 K addresses, 100 K customers) before finding its
//! probe side empty. In one process DataFusion collects such a build side
//! once for all partitions; here each subtask collects its own, so the
//! wasted work is per subtask.
//!
//! [`PrunedProbeGateExec`] sits on a join's build side. On its first poll it
//! evaluates the probe side's Parquet scan against the filters as they
//! stand (the joins above have completed theirs: they built before they
//! polled this join): if no row group of the task's part of the scan can
//! match, the probe side is empty, so is the join's output, and the build
//! side ends without a row (its readers release their channels). A filter
//! only gets more selective as it completes, so what is pruned now is
//! pruned when the scan opens: nothing is lost. Otherwise the build side
//! is read as before.
//!
//! It knows DataFusion's plans and Parquet footers, not tasks or the
//! network.

use crate::exec::pass_through::{PassThrough, PassThroughExec, Unstarted};
use crate::inspect::dynamic_filter_ids;
use datafusion::datasource::physical_plan::FileSource;
use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
use datafusion::datasource::physical_plan::parquet::{
    ParquetAccessPlan, ParquetFileMetrics, RowGroupAccessPlanFilter,
};
use datafusion::datasource::physical_plan::{FileScanConfig, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result as DfResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::parquet::file::metadata::PageIndexPolicy;
use datafusion::physical_optimizer::pruning::PruningPredicateBuilder;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;
use std::sync::Arc;

/// Our pass-through nodes: their output is their input's rows.
const PASS_THROUGH: [&str; 3] = ["EndWhenReleasedExec", "FirstRowExec", "DeferredExec"];

/// The Parquet scan `probe` reads such that an empty scan makes `probe`'s
/// output empty: through projections, filters, our
/// pass-through nodes and the probe sides of hash joins an empty probe
/// side empties.
fn probe_scan(probe: &Arc<dyn ExecutionPlan>) -> Option<&Arc<dyn ExecutionPlan>> {
    if let Some(ds) = probe.downcast_ref::<DataSourceExec>() {
        let config = ds.data_source().downcast_ref::<FileScanConfig>()?;
        let parquet = config.file_source.downcast_ref::<ParquetSource>()?;
        // One file group: the task's part of the scan (its task view).
        return (parquet.filter().is_some() && config.file_groups.len() == 1).then_some(probe);
    }
    if let Some(join) = probe.downcast_ref::<HashJoinExec>() {
        return crate::exec::empty_probe::empty_probe_empties(join)
            .then(|| probe_scan(join.right()))
            .flatten();
    }
    let passes = probe.is::<ProjectionExec>()
        || probe.is::<FilterExec>()
        || PASS_THROUGH.contains(&probe.name());
    match probe.children().as_slice() {
        [child] if passes => probe_scan(child),
        _ => None,
    }
}

/// `plan` with the build side of every hash join whose output an empty
/// probe side empties gated by [`PrunedProbeGateExec`] where it can pay:
/// the join's probe side reads a Parquet scan ([`probe_scan`]) that a
/// runtime filter of a join above it in this plan targets (complete by the
/// time this join builds).
pub fn skip_builds_over_pruned_probes(
    plan: Arc<dyn ExecutionPlan>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    rewrite(plan, &[])
}

/// `above`: the runtime filters of the joins whose probe side `plan` is in.
fn rewrite(plan: Arc<dyn ExecutionPlan>, above: &[u64]) -> DfResult<Arc<dyn ExecutionPlan>> {
    let Some(join) = plan.downcast_ref::<HashJoinExec>() else {
        let children = plan
            .children()
            .into_iter()
            .map(|c| rewrite(Arc::clone(c), above))
            .collect::<DfResult<Vec<_>>>()?;
        return replace_children_if_necessary(plan, children);
    };
    let mut below: Vec<u64> = above.to_vec();
    below.extend(
        join.dynamic_expressions_produced()
            .iter()
            .filter_map(|e| e.expression_id()),
    );
    let mut build = rewrite(Arc::clone(join.left()), &[])?;
    let probe = rewrite(Arc::clone(join.right()), &below)?;
    // Only a join that an empty probe side empties: a left, full or anti
    // join still emits its build rows.
    if crate::exec::empty_probe::empty_probe_empties(join)
        && let Some(scan) = probe_scan(&probe)
        && dynamic_filter_ids(scan).iter().any(|id| above.contains(id))
    {
        build = Arc::new(PrunedProbeGateExec::new(build, Arc::clone(scan)));
    }
    replace_children_if_necessary(plan, vec![build, probe])
}

/// Whether every row group `scan` (one file group) would read is pruned by
/// its predicate as its runtime filters stand now. False whenever that
/// cannot be shown (a footer not read, statistics that do not convert).
async fn pruned(scan: &Arc<dyn ExecutionPlan>, ctx: &TaskContext) -> bool {
    let Some(config) = scan
        .downcast_ref::<DataSourceExec>()
        .and_then(|ds| ds.data_source().downcast_ref::<FileScanConfig>())
    else {
        return false;
    };
    let Some(predicate) = config
        .file_source
        .downcast_ref::<ParquetSource>()
        .and_then(|p| p.filter())
    else {
        return false;
    };
    let schema = config.file_schema();
    let Ok(pruning) = PruningPredicateBuilder::new()
        .with_file_schema(Arc::clone(schema))
        .try_build(predicate)
    else {
        return false;
    };
    if pruning.always_true() {
        return false;
    }
    let Ok(store) = ctx.runtime_env().object_store(&config.object_store_url) else {
        return false;
    };
    let cache = ctx.runtime_env().cache_manager.get_file_metadata_cache();
    let metrics = ExecutionPlanMetricsSet::new();
    for group in &config.file_groups {
        for file in group.iter() {
            // Row groups chosen by an access plan: left to the scan.
            if !file.extensions.is_empty() {
                return false;
            }
            let Ok(metadata) = DFParquetMetadata::new(store.as_ref(), &file.object_meta)
                .with_file_metadata_cache(Some(Arc::clone(&cache)))
                .with_page_index_policy(Some(PageIndexPolicy::Skip))
                .fetch_metadata()
                .await
            else {
                return false;
            };
            let groups = metadata.row_groups();
            let mut left = RowGroupAccessPlanFilter::new(ParquetAccessPlan::new_all(groups.len()));
            if let Some(range) = &file.range {
                left.prune_by_range(groups, range);
            }
            if left.remaining_row_group_count() == 0 {
                continue;
            }
            let file_metrics =
                ParquetFileMetrics::new(0, file.object_meta.location.as_ref(), &metrics);
            left.prune_by_statistics(
                schema,
                metadata.file_metadata().schema_descr(),
                groups,
                &pruning,
                &file_metrics,
            );
            if left.remaining_row_group_count() > 0 {
                return false;
            }
        }
    }
    true
}

/// A join's build side, read only if the probe side's scan keeps a row
/// group (see the module).
pub type PrunedProbeGateExec = PassThroughExec<PrunedProbeGate>;

/// The probe side's scan a [`PrunedProbeGateExec`] checks: the same node
/// the probe side holds, so its runtime filters are the joins' own.
pub struct PrunedProbeGate {
    scan: Arc<dyn ExecutionPlan>,
}

impl PrunedProbeGateExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, scan: Arc<dyn ExecutionPlan>) -> Self {
        PassThroughExec::of(input, "PrunedProbeGateExec", PrunedProbeGate { scan })
    }
}

impl PassThrough for PrunedProbeGate {
    fn execute(&self, input: Unstarted) -> DfResult<SendableRecordBatchStream> {
        let ctx = Arc::clone(&input.ctx);
        let input = input.start()?;
        let schema = input.schema();
        let scan = Arc::clone(&self.scan);
        let empty_schema = Arc::clone(&schema);
        let gated = futures::stream::once(async move {
            if pruned(&scan, &ctx).await {
                tracing::debug!("probe side pruned: build side not read");
                // Dropped unread: its readers release their channels.
                drop(input);
                Box::pin(RecordBatchStreamAdapter::new(
                    empty_schema,
                    futures::stream::empty(),
                )) as SendableRecordBatchStream
            } else {
                input
            }
        })
        .flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, gated)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{physical_plan, register_parquet};
    use datafusion::arrow::array::{Array, Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::common::tree_node::TreeNode;
    use datafusion::common::tree_node::TreeNodeRecursion;
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::file::properties::WriterProperties;
    use datafusion::physical_plan::collect;
    use datafusion::prelude::{SessionConfig, SessionContext};

    /// A Parquet table `name` of columns k and v (v = k % 10) for these
    /// keys, in row groups of `row_group` rows.
    fn table(dir: &std::path::Path, name: &str, keys: std::ops::Range<i64>, row_group: usize) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]));
        std::fs::create_dir_all(dir.join(name)).unwrap();
        let file = std::fs::File::create(dir.join(name).join("part-0.parquet")).unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(row_group))
            .build();
        let mut w = ArrowWriter::try_new(file, Arc::clone(&schema), Some(props)).unwrap();
        let k: Vec<i64> = keys.collect();
        let v: Vec<i64> = k.iter().map(|k| k % 10).collect();
        let batch = RecordBatch::try_new(
            schema,
            vec![Arc::new(Int64Array::from(k)), Arc::new(Int64Array::from(v))],
        )
        .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }

    /// `fact` (2 row groups of keys 0..2000) joined with `b` on v, under a
    /// join with `a`, whose keys (5000..5005) no row group of `fact` holds:
    /// once `a` is built, its runtime filter on `fact.k` prunes the scan.
    async fn nested_joins(dir: &std::path::Path) -> (SessionContext, Arc<dyn ExecutionPlan>) {
        table(dir, "fact", 0..2000, 1000);
        table(dir, "a", 5000..5005, 1000);
        table(dir, "b", 0..10, 1000);
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1));
        for t in ["fact", "a", "b"] {
            register_parquet(&ctx, t, &dir.join(t)).await;
        }
        let sql = "SELECT count(*) FROM a JOIN \
                   (SELECT fact.k FROM fact JOIN b ON fact.v = b.v) x ON a.k = x.k";
        let plan = physical_plan(&ctx, sql).await;
        (ctx, plan)
    }

    /// Rows each hash join of `plan` read from its build side, outermost
    /// first.
    fn build_rows(plan: &Arc<dyn ExecutionPlan>) -> Vec<usize> {
        let mut rows = Vec::new();
        plan.apply(|node| {
            if node.is::<HashJoinExec>() {
                let m = node.metrics().expect("join metrics");
                rows.push(
                    m.sum_by_name("build_input_rows")
                        .map_or(0, |v| v.as_usize()),
                );
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
        rows
    }

    async fn count(ctx: &SessionContext, plan: &Arc<dyn ExecutionPlan>) -> i64 {
        let batches = collect(Arc::clone(plan), ctx.task_ctx()).await.unwrap();
        let c = batches[0]
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert_eq!(c.len(), 1);
        c.value(0)
    }

    #[test]
    fn a_build_side_is_not_read_when_the_filters_above_prune_the_probe_scan() {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let dir = tempfile::tempdir().unwrap();
                let (ctx, plan) = nested_joins(dir.path()).await;
                let gated = skip_builds_over_pruned_probes(plan).unwrap();
                let mut gates = 0;
                gated
                    .apply(|n| {
                        gates += usize::from(n.is::<PrunedProbeGateExec>());
                        Ok(TreeNodeRecursion::Continue)
                    })
                    .unwrap();
                assert_eq!(gates, 1, "one join below a filtering join");
                assert_eq!(count(&ctx, &gated).await, 0);
                // `a`'s 5 keys are read; `b`'s 10 are not.
                assert_eq!(build_rows(&gated), vec![5, 0]);
                // Without the gate the inner join hashes `b` for nothing.
                let other = tempfile::tempdir().unwrap();
                let (ctx, plan) = nested_joins(other.path()).await;
                assert_eq!(count(&ctx, &plan).await, 0);
                assert_eq!(build_rows(&plan), vec![5, 10]);
                // A left join emits its build rows whatever its probe side
                // holds: never gated.
                let mut changed = false;
                let left = plan
                    .transform_up(|n| match n.downcast_ref::<HashJoinExec>() {
                        Some(j) if !changed => {
                            changed = true;
                            j.builder()
                                .with_type(datafusion::common::JoinType::Left)
                                .build_exec()
                                .map(datafusion::common::tree_node::Transformed::yes)
                        }
                        _ => Ok(datafusion::common::tree_node::Transformed::no(n)),
                    })
                    .unwrap()
                    .data;
                let left = skip_builds_over_pruned_probes(left).unwrap();
                let gated = left.exists(|n| Ok(n.is::<PrunedProbeGateExec>())).unwrap();
                assert!(changed && !gated, "a left join's build side is gated");
            });
    }
}

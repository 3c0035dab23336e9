//! Facts read off a DataFusion physical plan that both the planning rules
//! ([`crate::planning`]) and the execution nodes ([`crate::exec`]) ask:
//! which dynamic filters a plan holds, which joins an empty build side
//! empties, how many partitions and bytes of files it has, whether it is a
//! plain pipeline. Knows DataFusion and the exchange reader, not the rules
//! or the nodes that ask.

use crate::exec::exchange::ExchangeReaderExec;
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, SortMergeJoinExec,
};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use std::sync::Arc;

/// Ids of the dynamic filters (DataFusion's runtime filters) that `plan`'s
/// operators hold, its scans' predicates among them.
pub fn dynamic_filter_ids(plan: &Arc<dyn ExecutionPlan>) -> Vec<u64> {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    let mut ids = Vec::new();
    let _ = plan.apply(|node| {
        node.apply_expressions(&mut |root| {
            root.apply(|e| {
                if let Some(id) = e.expression_id() {
                    ids.push(id);
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })?;
        Ok(TreeNodeRecursion::Continue)
    });
    ids
}

/// The hash join whose output an empty build side empties, if `node` is
/// one: DataFusion then never polls its probe side (its second child).
/// Which scans wait at planning and which joins demand them in the task
/// are both decided here.
pub fn empty_without_build(node: &Arc<dyn ExecutionPlan>) -> Option<&HashJoinExec> {
    node.downcast_ref::<HashJoinExec>()
        .filter(|j| j.join_type().empty_build_side_produces_empty_result())
}

pub fn partitions(plan: &Arc<dyn ExecutionPlan>) -> usize {
    plan.output_partitioning().partition_count()
}

pub fn is_join(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.is::<HashJoinExec>()
        || plan.is::<NestedLoopJoinExec>()
        || plan.is::<CrossJoinExec>()
        || plan.is::<SortMergeJoinExec>()
}

/// Bytes of files the scans of `plan` read; None if a leaf is not a file
/// scan.
pub fn file_bytes(plan: &Arc<dyn ExecutionPlan>) -> Option<u64> {
    let children = plan.children();
    if children.is_empty() {
        let ds = plan.downcast_ref::<DataSourceExec>()?;
        let config = ds.data_source().downcast_ref::<FileScanConfig>()?;
        return Some(scan_bytes(config));
    }
    children.into_iter().map(file_bytes).sum()
}

/// Whether `plan` runs entirely in one task: no exchange and no join
/// (which could want one) anywhere in it.
pub fn is_plain_pipeline(plan: &Arc<dyn ExecutionPlan>) -> bool {
    !(plan.is::<RepartitionExec>()
        || plan.is::<CoalescePartitionsExec>()
        || plan.is::<SortPreservingMergeExec>()
        || plan.is::<ExchangeReaderExec>()
        || plan.is::<UnionExec>()
        || is_join(plan))
        && plan.children().into_iter().all(is_plain_pipeline)
}

/// Bytes of files a scan reads (its byte ranges where it has them).
pub fn scan_bytes(config: &FileScanConfig) -> u64 {
    config
        .file_groups
        .iter()
        .flat_map(|g| g.iter())
        .map(|f| match &f.range {
            Some(r) => (r.end - r.start).max(0) as u64,
            None => f.object_meta.size,
        })
        .sum()
}

//! Which hash joins get a [`ClusterByKeyExec`] on their build side, and the
//! broadcast build sides the subtasks of one process share.

use super::exec::ClusterByKeyExec;
use super::shared::SharedClusters;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::Result as DfResult;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::joins::HashJoinExec;
use std::collections::HashSet;
use std::sync::Arc;

/// `plan` with the build side of every hash join clustered by key. For a
/// plan that has not run: a rewritten join keeps the build-side state (and
/// the dynamic filter its probe side's scan reads) of the original.
pub fn cluster_build_sides(plan: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(join) = node.downcast_ref::<HashJoinExec>() else {
            return Ok(Transformed::no(node));
        };
        if join.left().is::<ClusterByKeyExec>() {
            return Ok(Transformed::no(node));
        }
        let keys = join.on().iter().map(|(l, _)| Arc::clone(l)).collect();
        let build = Arc::new(ClusterByKeyExec::new(Arc::clone(join.left()), keys));
        let right = Arc::clone(join.right());
        replace_children_if_necessary(node, vec![build, right]).map(Transformed::yes)
    })
    .map(|t| t.data)
}

/// `plan` (a task's, with its build sides clustered) with each clustered
/// build side that is the same in every subtask (it reads broadcast inputs,
/// `broadcast` being the stages whose output every consumer subtask
/// receives whole, or scans read whole) clustered once for the subtasks of
/// `stage` that run in this process; with `read_once`, one that reads no
/// exchange is also read once for them.
pub fn share_broadcast_builds(
    plan: Arc<dyn ExecutionPlan>,
    shared: &Arc<SharedClusters>,
    (stage, attempt): (usize, u32),
    broadcast: &dyn Fn(usize) -> bool,
    read_once: bool,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let uniform = uniform_filters(&plan, broadcast)?;
    plan.transform_up(|node| {
        let Some(c) = node.downcast_ref::<ClusterByKeyExec>() else {
            return Ok(Transformed::no(node));
        };
        if c.share.is_some() || !same_in_every_subtask(&c.input, broadcast, &uniform)? {
            return Ok(Transformed::no(node));
        }
        // Named by what it computes (inputs, filters, keys), not by its
        // place: a subtask's plan may lack union branches another has.
        let what = format!(
            "{}",
            datafusion::physical_plan::displayable(node.as_ref()).indent(false)
        );
        let key = (stage, what, attempt);
        let mut shared_node = ClusterByKeyExec::new(Arc::clone(&c.input), c.keys.clone());
        shared_node.share = Some(Arc::new(SharedClusters::join(shared, key)));
        shared_node.read_once = read_once && !reads_exchange(&c.input)?;
        Ok(Transformed::yes(
            Arc::new(shared_node) as Arc<dyn ExecutionPlan>
        ))
    })
    .map(|t| t.data)
}

/// Whether `plan` gives every subtask the same rows: it reads only
/// broadcast inputs or scans it reads whole (a scan a subtask reads part of
/// shows its own file ranges, and so another key), through filters and
/// projections. The dynamic filters it reads must be `uniform`: those of
/// joins whose build side is the same in every subtask, which hold the same
/// keys everywhere (a filter only drops rows that join's build side cannot
/// match, whenever it is filled).
pub(super) fn same_in_every_subtask(
    plan: &Arc<dyn ExecutionPlan>,
    broadcast: &dyn Fn(usize) -> bool,
    uniform: &HashSet<u64>,
) -> DfResult<bool> {
    use datafusion::datasource::source::DataSourceExec;
    use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
    use datafusion::physical_plan::filter::FilterExec;
    use datafusion::physical_plan::projection::ProjectionExec;
    let mut same = true;
    plan.apply(|node| {
        let ok = if let Some(r) = node.downcast_ref::<crate::exec::exchange::ExchangeReaderExec>() {
            broadcast(r.stage())
        } else if node.is::<FilterExec>() || node.is::<DataSourceExec>() {
            crate::inspect::dynamic_filter_ids(node)
                .iter()
                .all(|id| uniform.contains(id))
        } else {
            node.is::<ProjectionExec>()
                || node.is::<CoalescePartitionsExec>()
                || node.is::<crate::exec::first_row::FirstRowExec>()
                || node.is::<crate::exec::deferred::DeferredExec>()
                || node.is::<ClusterByKeyExec>()
        };
        same &= ok;
        Ok(if ok {
            TreeNodeRecursion::Continue
        } else {
            TreeNodeRecursion::Stop
        })
    })?;
    Ok(same)
}

/// The dynamic filters of the hash joins in `plan` whose build side is the
/// same in every subtask (a join's build side may read another such
/// join's filter, hence the rounds).
fn uniform_filters(
    plan: &Arc<dyn ExecutionPlan>,
    broadcast: &dyn Fn(usize) -> bool,
) -> DfResult<HashSet<u64>> {
    let mut uniform = HashSet::new();
    loop {
        let mut found = HashSet::new();
        plan.apply(|node| {
            if let Some(j) = node.downcast_ref::<HashJoinExec>() {
                let ids: HashSet<u64> = j
                    .dynamic_expressions_produced()
                    .iter()
                    .filter_map(|f| f.expression_id())
                    .filter(|id| !uniform.contains(id))
                    .collect();
                if !ids.is_empty() && same_in_every_subtask(j.left(), broadcast, &uniform)? {
                    found.extend(ids);
                }
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        if found.is_empty() {
            return Ok(uniform);
        }
        uniform.extend(found);
    }
}

/// Whether `plan` reads an exchange.
fn reads_exchange(plan: &Arc<dyn ExecutionPlan>) -> DfResult<bool> {
    plan.exists(|n| Ok(n.is::<crate::exec::exchange::ExchangeReaderExec>()))
}

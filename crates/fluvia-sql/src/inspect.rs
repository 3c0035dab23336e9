//! Facts read off a DataFusion physical plan that both the planning rules
//! ([`crate::planning`]) and the execution nodes ([`crate::exec`]) ask:
//! which dynamic filters a plan holds, which joins an empty build side
//! empties. Knows DataFusion only, neither of its two users.

use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::HashJoinExec;
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

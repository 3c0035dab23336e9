//! Execution nodes: the DataFusion [`ExecutionPlan`]s Fluvia adds to a
//! fragment, and the rewrites a task applies to put them in place.
//!
//! - [`exchange`]: the leaf that reads a stage's input channels, and the
//!   record type whose output writes batches into result partitions.
//! - [`pass_through`]: the one node behind every one-child node that hands
//!   its input on and acts only on how its stream starts or ends:
//!   [`deferred`] (execute at the first poll), [`first_row`] (notice the
//!   first row), [`demand`] (start a probe side's scans once a build row
//!   came), [`empty_probe`] (end a join on an empty probe side),
//!   [`pruned_probe`] (skip a build side over a pruned probe side),
//!   [`released`] (end a fragment nobody reads any more).
//! - [`shared_scan`]: one read of a scan several fragments of a task share.
//! - [`cluster`]: a hash join's build side with the rows of one key side
//!   by side, shared by the subtasks of a process.
//!
//! These nodes know DataFusion and a task's inputs; they do not know how a
//! plan was cut or which rule placed them (that is [`crate::planning`]).
//!
//! [`ExecutionPlan`]: datafusion::physical_plan::ExecutionPlan

pub mod cluster;
pub mod deferred;
pub mod demand;
pub mod empty_probe;
pub mod exchange;
pub mod first_row;
pub mod pass_through;
pub mod pruned_probe;
pub mod released;
pub mod shared_scan;

/// A collect-left hash join of `build` and `probe` on one pair of keys
/// (`projection`: the columns it keeps), for tests.
#[cfg(test)]
pub(crate) fn collect_left_join(
    build: std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    probe: std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    on: datafusion::physical_plan::joins::utils::JoinOn,
    join_type: &datafusion::logical_expr::JoinType,
    projection: Option<Vec<usize>>,
) -> datafusion::physical_plan::joins::HashJoinExec {
    use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
    HashJoinExec::try_new(
        build,
        probe,
        on,
        None,
        join_type,
        projection,
        PartitionMode::CollectLeft,
        datafusion::common::NullEquality::NullEqualsNothing,
        false,
    )
    .expect("join")
}

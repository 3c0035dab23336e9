//! Broadcast for small build sides: a physical optimizer rule, run right
//! after DataFusion's join selection, that keeps a join partitioned where
//! broadcasting its build side would duplicate rows or cost more than the
//! shuffle it saves ([`BroadcastSafety`]).

use crate::inspect::partitions;
use crate::planning::split::row_wise;
use datafusion::common::JoinType;
use datafusion::config::ConfigOptions;
use datafusion::error::Result as DfResult;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::joins::{HashJoinExec, NestedLoopJoinExec, PartitionMode};
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use std::sync::Arc;

/// Largest estimated build side a cost comparison may broadcast.
const BROADCAST_COST_CAP: usize = 64 * 1024 * 1024;

/// Whether broadcasting the build side (`p - 1` extra copies) moves fewer
/// bytes than hash-partitioning both sides (the probe side crosses the
/// network), by DataFusion's estimates. Without estimates: no.
fn broadcast_is_cheaper(hj: &HashJoinExec, parallelism: usize) -> bool {
    let bytes = |p: &Arc<dyn ExecutionPlan>| {
        let s = StatisticsContext::new()
            .compute(p.as_ref(), &StatisticsArgs::new())
            .ok()?;
        // Joins often know their rows but not their bytes.
        s.total_byte_size.get_value().copied().or_else(|| {
            let width: usize = p
                .schema()
                .fields()
                .iter()
                .map(|f| f.data_type().primitive_width().unwrap_or(16))
                .sum();
            s.num_rows
                .get_value()
                .map(|rows| rows.saturating_mul(width))
        })
    };
    match (bytes(hj.left()), bytes(hj.right())) {
        (Some(build), Some(probe)) => {
            build <= BROADCAST_COST_CAP
                && build.saturating_mul(parallelism.saturating_sub(1)) < probe
        }
        _ => false,
    }
}

/// Whether a row of `plan`'s child counts only for whether it exists, not
/// how often: under an aggregate without aggregate functions (a GROUP BY
/// or DISTINCT, whose final phase merges equal groups of every subtask),
/// through operators that keep or drop rows one by one.
fn child_duplicates_vanish(plan: &Arc<dyn ExecutionPlan>, duplicates_vanish: bool) -> bool {
    use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
    if let Some(a) = plan.downcast_ref::<AggregateExec>() {
        return a.aggr_expr().is_empty()
            && matches!(
                a.mode(),
                AggregateMode::Partial | AggregateMode::Single | AggregateMode::SinglePartitioned
            );
    }
    duplicates_vanish && row_wise(plan)
}

/// [`BroadcastSafety`] below `plan`; `duplicates_vanish`: the rows `plan`
/// emits count only for whether they exist.
fn broadcast_safety(
    plan: Arc<dyn ExecutionPlan>,
    duplicates_vanish: bool,
    parallelism: usize,
    on_estimates: bool,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let below = child_duplicates_vanish(&plan, duplicates_vanish);
    let children = plan
        .children()
        .into_iter()
        .map(|c| broadcast_safety(Arc::clone(c), below, parallelism, on_estimates))
        .collect::<DfResult<Vec<_>>>()?;
    let node = replace_children_if_necessary(plan, children)?;
    if let Some(hj) = node.downcast_ref::<HashJoinExec>() {
        // A left semi join broadcast emits the build rows each subtask's
        // probe rows matched: a build row once per subtask that matched
        // it, which an aggregate of groups only merges into one.
        let safe = broadcast_safe(hj.join_type())
            || (duplicates_vanish && *hj.join_type() == JoinType::LeftSemi);
        if *hj.partition_mode() == PartitionMode::Partitioned
            && on_estimates
            && safe
            && broadcast_is_cheaper(hj, parallelism)
        {
            return hj
                .builder()
                .with_partition_mode(PartitionMode::CollectLeft)
                .build_exec();
        }
        if *hj.partition_mode() == PartitionMode::CollectLeft && !safe {
            return hj
                .builder()
                .with_partition_mode(PartitionMode::Partitioned)
                .build_exec();
        }
    } else if let Some(nlj) = node.downcast_ref::<NestedLoopJoinExec>()
        && !broadcast_safe(nlj.join_type())
        && partitions(nlj.right()) > 1
    {
        let right: Arc<dyn ExecutionPlan> =
            Arc::new(CoalescePartitionsExec::new(Arc::clone(nlj.right())));
        let children = vec![Arc::clone(nlj.left()), right];
        return replace_children_if_necessary(Arc::clone(&node), children);
    }
    Ok(node)
}

/// Chooses broadcast joins by cost and keeps them only where they are
/// correct.
///
/// Beyond DataFusion's size threshold, a partitioned join whose build side
/// is estimated smaller than its probe side by more than the parallelism
/// is broadcast: the probe side then stays where it is, chained to its
/// producer, instead of crossing the network.
///
/// In one process all probe partitions of a collect-left join share one
/// build side and one "matched" bitmap. Distributed, every probe subtask
/// has its own copy, so a join that emits build rows depending on whether
/// any probe row matched (left, left semi/anti/mark, full) would emit them
/// once per subtask. Such hash joins are planned partitioned instead,
/// except a left semi join whose rows only feed an aggregate of groups
/// (DataFusion's plan of `GROUP BY` over `EXISTS`/`IN`, as in TPC-DS q37
/// and q82), where a row emitted twice makes the same group; a nested-loop
/// join of that kind gathers its probe side into one task.
/// Runs after DataFusion's join selection and before it enforces
/// distributions, so the exchanges that follow are planned by DataFusion.
#[derive(Debug, Default)]
pub struct BroadcastSafety;

pub fn broadcast_safe(join_type: &JoinType) -> bool {
    matches!(
        join_type,
        JoinType::Inner
            | JoinType::Right
            | JoinType::RightSemi
            | JoinType::RightAnti
            | JoinType::RightMark
    )
}

impl PhysicalOptimizerRule for BroadcastSafety {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let parallelism = config.execution.target_partitions;
        // A broadcast threshold of 0 (or RUNTIME_ONLY): nothing is broadcast
        // on estimates, by size or by cost.
        let on_estimates = config.optimizer.hash_join_single_partition_threshold > 0;
        broadcast_safety(plan, false, parallelism, on_estimates)
    }

    fn name(&self) -> &str {
        "fluvia_broadcast_safety"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

//! When a scan read on a join's probe side is wanted: as soon as the join's
//! build side delivered a row.
//!
//! A scan its consumer reads only on the probe side of a hash join that an
//! empty build side empties waits for demand before it reads
//! (`planning::multiple_input::read_later`): DataFusion collects the build side first
//! and never polls the probe side when it came out empty, so behind an
//! empty build side the scan never runs. Waiting for the probe side's first
//! poll would also hold it back while a non-empty build side is collected,
//! where starting at once would have had both scans side by side. So the
//! consumer demands such a scan once every join above it, within the task,
//! saw its build side deliver a row: the output can no longer be empty for
//! want of a build row, and the scan starts while the build side is still
//! being read. This module knows DataFusion and the task's inputs, not the
//! network: [`TaskInputs::demand_stage`] tells the producer.

use crate::exec::exchange::{ExchangeReaderExec, TaskInputs};
use crate::exec::first_row::FirstRowExec;
use crate::inspect::empty_without_build;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::Result as DfResult;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// Joins above each waiting stage whose build side has not delivered a row.
#[derive(Debug, Default)]
struct Pending {
    joins: Mutex<BTreeMap<usize, usize>>,
}

/// `plan` with the build side of every hash join an empty build side
/// empties watched for its first row; `waiting` are the stages whose scans
/// wait for demand. When every such join above a waiting stage's reader saw
/// a build row, the stage is demanded through `inputs`.
pub fn demand_on_first_build_row(
    plan: Arc<dyn ExecutionPlan>,
    waiting: &BTreeSet<usize>,
    inputs: &Arc<TaskInputs>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    if waiting.is_empty() {
        return Ok(plan);
    }
    let pending = Arc::new(Pending::default());
    plan.transform_up(|node| {
        let Some(join) = empty_without_build(&node) else {
            return Ok(Transformed::no(node));
        };
        let stages: Vec<usize> = readers(join.right())
            .into_iter()
            .filter(|s| waiting.contains(s))
            .collect();
        if stages.is_empty() {
            return Ok(Transformed::no(node));
        }
        if let Ok(mut joins) = pending.joins.lock() {
            for &s in &stages {
                *joins.entry(s).or_default() += 1;
            }
        }
        let (pending, inputs) = (Arc::clone(&pending), Arc::clone(inputs));
        let on_row: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            let ready: Vec<usize> = match pending.joins.lock() {
                Ok(mut joins) => stages
                    .iter()
                    .filter(|s| {
                        joins.get_mut(s).is_some_and(|n| {
                            *n = n.saturating_sub(1);
                            *n == 0
                        })
                    })
                    .copied()
                    .collect(),
                Err(_) => stages.clone(),
            };
            for s in ready {
                inputs.demand_stage(s);
            }
        });
        let build = Arc::new(FirstRowExec::new(Arc::clone(join.left()), on_row));
        let probe = Arc::clone(join.right());
        replace_children_if_necessary(node, vec![build, probe]).map(Transformed::yes)
    })
    .map(|t| t.data)
}

/// The stages `plan` reads through exchange readers.
fn readers(plan: &Arc<dyn ExecutionPlan>) -> BTreeSet<usize> {
    let mut stages = BTreeSet::new();
    let _ = plan.apply(|node| {
        if let Some(r) = node.downcast_ref::<ExchangeReaderExec>() {
            stages.insert(r.stage());
        }
        Ok(TreeNodeRecursion::Continue)
    });
    stages
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::exchange::ReaderFacts;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::common::tree_node::TreeNodeRecursion;
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::logical_expr::JoinType;
    use datafusion::physical_expr::PhysicalExpr;
    use datafusion::physical_expr::expressions::Column;
    use datafusion::physical_plan::collect;
    use datafusion::prelude::SessionContext;
    use fluvia_network::metrics::IoCounters;
    use fluvia_network::{CancelToken, InputChannelSpec, LocalInputChannel, ResultPartition};

    fn schema(name: &str) -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new(name, DataType::Int64, false)]))
    }

    /// A hash join of `join_type` whose build side holds `build_rows` rows
    /// and whose probe side reads stage 1, produced by `producer`; the plan
    /// as the consumer task runs it.
    fn join_reading(
        join_type: JoinType,
        build_rows: usize,
        producer: &Arc<ResultPartition>,
    ) -> (Arc<dyn ExecutionPlan>, Arc<TaskInputs>) {
        let rows: Vec<i64> = (0..build_rows as i64).collect();
        let batch = RecordBatch::try_new(
            schema("b"),
            vec![Arc::new(Int64Array::from_iter_values(rows))],
        )
        .unwrap();
        let build = MemorySourceConfig::try_new_exec(&[vec![batch]], schema("b"), None).unwrap();
        let probe: Arc<dyn ExecutionPlan> =
            Arc::new(ExchangeReaderExec::new(1, schema("p"), 1, ReaderFacts::default()).unwrap());
        let join = crate::exec::collect_left_join(
            build,
            probe,
            vec![(
                Arc::new(Column::new("b", 0)) as Arc<dyn PhysicalExpr>,
                Arc::new(Column::new("p", 0)) as Arc<dyn PhysicalExpr>,
            )],
            &join_type,
            None,
        );
        let channel = InputChannelSpec {
            channel: LocalInputChannel::new(Arc::clone(producer), 0, 0).unwrap(),
            input_index: 1,
        };
        let inputs = Arc::new(TaskInputs::new(
            BTreeMap::from([(1, vec![channel])]),
            true,
            CancelToken::new(),
            Arc::new(IoCounters::default()),
        ));
        let waiting = BTreeSet::from([1]);
        let plan = demand_on_first_build_row(Arc::new(join), &waiting, &inputs).unwrap();
        (plan, inputs)
    }

    /// Runs the watched build side of `plan` alone, as the join does first.
    fn read_build_side(plan: &Arc<dyn ExecutionPlan>) {
        let mut build = None;
        plan.apply(|n| {
            if n.is::<FirstRowExec>() {
                build = Some(Arc::clone(n));
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
        let build = build.expect("the build side is watched");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(collect(build, SessionContext::new().task_ctx()))
            .unwrap();
    }

    #[test]
    fn a_build_row_demands_the_probe_sides_scan_and_an_empty_build_side_does_not() {
        let producer = Arc::new(ResultPartition::pipelined("probe", 1, 64));
        let state = producer.consumers_released().unwrap();
        let (plan, _inputs) = join_reading(JoinType::Inner, 0, &producer);
        read_build_side(&plan);
        assert!(!state.demanded(), "an empty build side demanded the probe");

        let (plan, _inputs) = join_reading(JoinType::Inner, 3, &producer);
        read_build_side(&plan);
        assert!(state.demanded(), "a build row did not demand the probe");
    }

    #[test]
    fn a_join_that_outputs_probe_rows_anyway_is_not_watched() {
        let producer = Arc::new(ResultPartition::pipelined("probe", 1, 64));
        let (plan, _inputs) = join_reading(JoinType::Right, 3, &producer);
        let watched = plan.exists(|n| Ok(n.is::<FirstRowExec>())).unwrap();
        assert!(!watched);
    }
}

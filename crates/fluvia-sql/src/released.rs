//! Ending a fragment early once nobody reads what it produces.
//!
//! A consumer stops reading an input it does not need: a hash join whose
//! build side came out empty never reads its probe side, a satisfied LIMIT
//! reads no more. It releases those channels, and the producer learns it
//! through the network stack ([`ConsumersReleased`]). Once every consumer of
//! every output of a task did, the rest of the task's work reaches nobody.
//!
//! The check sits at the plan's leaves rather than between output batches:
//! one poll of a DataFusion operator can work through a whole file (a
//! selective filter coalescing its output into full batches), so only the
//! leaves see every step. A released leaf ends its stream; what the operators
//! above make of the partial input goes to released outputs and is dropped.
//! This module knows nothing of the network beyond that one flag.

use crate::reuse::SharedScanExec;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::Result as DfResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use fluvia_network::ConsumersReleased;
use futures::StreamExt;
use std::fmt;
use std::sync::Arc;

/// `plan` with every leaf ending its stream once `released` says all
/// consumers stopped reading. A consumer's end of a shared scan counts as a
/// leaf: the scan it shows as its child runs through the shared state.
pub fn end_when_released(
    plan: Arc<dyn ExecutionPlan>,
    released: &ConsumersReleased,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    if plan.children().is_empty() || plan.is::<SharedScanExec>() {
        return Ok(Arc::new(EndWhenReleasedExec {
            input: plan,
            released: released.clone(),
        }));
    }
    let children = plan
        .children()
        .into_iter()
        .map(|c| end_when_released(Arc::clone(c), released))
        .collect::<DfResult<Vec<_>>>()?;
    replace_children_if_necessary(plan, children)
}

/// A leaf's stream, ended early when its task's outputs are all released.
#[derive(Debug)]
struct EndWhenReleasedExec {
    input: Arc<dyn ExecutionPlan>,
    released: ConsumersReleased,
}

impl DisplayAs for EndWhenReleasedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "EndWhenReleasedExec")
    }
}

impl ExecutionPlan for EndWhenReleasedExec {
    fn name(&self) -> &str {
        "EndWhenReleasedExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        match children.pop() {
            Some(input) if children.is_empty() => Ok(Arc::new(EndWhenReleasedExec {
                input,
                released: self.released.clone(),
            })),
            _ => Err(datafusion::error::DataFusionError::Internal(
                "EndWhenReleasedExec takes one child".into(),
            )),
        }
    }

    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let inner = self.input.execute(partition, ctx)?;
        let schema = inner.schema();
        let released = self.released.clone();
        let mut inner = Some(inner);
        let stream = futures::stream::poll_fn(move |cx| {
            if released.all() {
                // Dropped at once, so an exchange reader releases its own
                // inputs in turn.
                inner = None;
            }
            match inner.as_mut() {
                Some(s) => s.poll_next_unpin(cx),
                None => std::task::Poll::Ready(None),
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

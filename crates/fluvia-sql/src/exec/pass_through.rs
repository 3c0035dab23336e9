//! One-child plan nodes that hand on their input's rows and act only on how
//! its stream is started, watched or cut short (a first row noticed, the
//! input executed at the first poll, a build side skipped).
//!
//! [`PassThroughExec`] is the DataFusion node once for all of them: it has
//! its input's schema and properties, no expressions and no metrics of its
//! own; a [`PassThrough`] says what its stream does. It knows DataFusion
//! only.

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use std::fmt;
use std::sync::Arc;

/// What a [`PassThroughExec`] does with its input's stream. Most nodes
/// only change the stream their input gives ([`PassThrough::wrap`]); one
/// that decides when or whether its input is executed at all implements
/// [`PassThrough::execute`].
pub trait PassThrough: Send + Sync + 'static {
    /// The node's stream of partition `partition`, from its input: by
    /// default the input's stream of that partition, as `wrap` makes it.
    fn execute(
        &self,
        input: &Arc<dyn ExecutionPlan>,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        self.wrap(input.execute(partition, ctx)?)
    }

    /// The node's stream made of its input's (by default that stream).
    fn wrap(&self, input: SendableRecordBatchStream) -> DfResult<SendableRecordBatchStream> {
        Ok(input)
    }
}

/// Its input's rows, streamed as `P` says.
pub struct PassThroughExec<P> {
    input: Arc<dyn ExecutionPlan>,
    /// The node's name in plans (`EXPLAIN`, debug logs).
    name: &'static str,
    node: Arc<P>,
}

impl<P: PassThrough> PassThroughExec<P> {
    pub fn of(input: Arc<dyn ExecutionPlan>, name: &'static str, node: P) -> Self {
        PassThroughExec {
            input,
            name,
            node: Arc::new(node),
        }
    }

    /// What the node does with the stream, and the state it keeps for it.
    pub fn node(&self) -> &P {
        &self.node
    }
}

impl<P: PassThrough> fmt::Debug for PassThroughExec<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(self.name).finish()
    }
}

impl<P: PassThrough> DisplayAs for PassThroughExec<P> {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}", self.name)
    }
}

impl<P: PassThrough> ExecutionPlan for PassThroughExec<P> {
    fn name(&self) -> &str {
        self.name
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
            Some(input) if children.is_empty() => Ok(Arc::new(PassThroughExec {
                input,
                name: self.name,
                node: Arc::clone(&self.node),
            })),
            _ => Err(DataFusionError::Internal(format!(
                "{} takes one child",
                self.name
            ))),
        }
    }

    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        self.node.execute(&self.input, partition, ctx)
    }
}

/// Counts the executions of its input (a scan opening its files): for
/// tests.
#[cfg(test)]
pub(crate) struct CountExecutions(pub(crate) Arc<std::sync::atomic::AtomicUsize>);

#[cfg(test)]
impl PassThrough for CountExecutions {
    fn wrap(&self, input: SendableRecordBatchStream) -> DfResult<SendableRecordBatchStream> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(input)
    }
}

//! One-child plan nodes that hand on their input's rows and act only on how
//! its stream is started, watched or cut short (a first row noticed, the
//! input executed at the first poll, a build side skipped).
//!
//! [`PassThroughExec`] is the DataFusion node once for all of them: it has
//! its input's schema and properties, no expressions and no metrics of its
//! own; a [`PassThrough`] says what its stream does. It knows DataFusion
//! only.

use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use std::fmt;
use std::sync::Arc;

/// The plain items of an [`ExecutionPlan`] impl, written once for every
/// Fluvia node: `name`, `properties` and `children`, each an expression of
/// `this` (the node); with `no_expressions` after them, the
/// `apply_expressions` of a node that has no expressions of its own.
macro_rules! plan_basics {
    (|$this:ident| $name:expr, $properties:expr, [$($child:expr),*] $(, $no_expressions:ident)?) => {
        fn name(&self) -> &str {
            #[allow(unused_variables)]
            let $this = self;
            $name
        }

        fn properties(&self) -> &std::sync::Arc<datafusion::physical_plan::PlanProperties> {
            let $this = self;
            $properties
        }

        fn children(&self) -> Vec<&std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
            #[allow(unused_variables)]
            let $this = self;
            vec![$($child),*]
        }

        $($crate::exec::pass_through::plan_basics!(@$no_expressions);)?
    };
    (@no_expressions) => {
        fn apply_expressions(
            &self,
            _f: &mut dyn FnMut(
                &std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>,
            ) -> datafusion::error::Result<datafusion::common::tree_node::TreeNodeRecursion>,
        ) -> datafusion::error::Result<datafusion::common::tree_node::TreeNodeRecursion> {
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        }
    };
}
pub(crate) use plan_basics;

/// What a [`PassThroughExec`] does with its input's stream. Most nodes
/// only change the stream their input gives ([`PassThrough::wrap`]); one
/// that decides when or whether its input is executed at all implements
/// [`PassThrough::execute`].
pub trait PassThrough: Send + Sync + 'static {
    /// The node's stream of one partition, from its input's: by default
    /// the input's stream of that partition, started now, as `wrap` makes it.
    fn execute(&self, input: Unstarted) -> DfResult<SendableRecordBatchStream> {
        self.wrap(input.start()?)
    }

    /// The node's stream made of its input's (by default that stream).
    fn wrap(&self, input: SendableRecordBatchStream) -> DfResult<SendableRecordBatchStream> {
        Ok(input)
    }
}

/// The input's stream of one partition of a [`PassThroughExec`], not yet
/// executed: what [`PassThrough::execute`] starts, when it chooses to.
pub struct Unstarted {
    pub plan: Arc<dyn ExecutionPlan>,
    pub partition: usize,
    pub ctx: Arc<TaskContext>,
}

impl Unstarted {
    /// Executes the input's partition.
    pub fn start(self) -> DfResult<SendableRecordBatchStream> {
        self.plan.execute(self.partition, self.ctx)
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
    plan_basics!(
        |this| this.name,
        this.input.properties(),
        [&this.input],
        no_expressions
    );

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
        self.node.execute(Unstarted {
            plan: Arc::clone(&self.input),
            partition,
            ctx,
        })
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

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
//! The same leaf wrapper ends the leaves a join stops reading because its
//! probe side came out empty ([`EndSignal::Stopped`], the `empty_probe`
//! module). This module knows nothing of the network beyond those flags.

use crate::exec::exchange::{ReaderStop, lock};
use crate::exec::pass_through::{PassThrough, PassThroughExec};
use crate::exec::shared_scan::SharedScanExec;
use datafusion::error::Result as DfResult;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use fluvia_network::ConsumersReleased;
use futures::StreamExt;
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

/// `plan` with every leaf ending its stream once `released` says all
/// consumers stopped reading. A consumer's end of a shared scan counts as a
/// leaf: the scan it shows as its child runs through the shared state.
pub fn end_when_released(
    plan: Arc<dyn ExecutionPlan>,
    released: &ConsumersReleased,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    if plan.children().is_empty() || plan.is::<SharedScanExec>() {
        return Ok(end_leaf_when(plan, EndSignal::Released(released.clone())));
    }
    let children = plan
        .children()
        .into_iter()
        .map(|c| end_when_released(Arc::clone(c), released))
        .collect::<DfResult<Vec<_>>>()?;
    replace_children_if_necessary(plan, children)
}

/// What ends a leaf's stream early.
#[derive(Debug, Clone)]
pub enum EndSignal {
    /// Every consumer of every output of the task released it. Checked at
    /// each poll, and a leaf waiting for its input (a scan's file read) is
    /// woken to end at once rather than at its next batch. (An exchange
    /// reader's gate wakes it too.)
    Released(ConsumersReleased),
    /// A join needs no more of this input ([`ReaderStop`]); a leaf waiting
    /// for its input is woken to end as well.
    Stopped(Arc<ReaderStop>),
}

impl EndSignal {
    fn is_set(&self) -> bool {
        match self {
            EndSignal::Released(r) => r.all(),
            EndSignal::Stopped(s) => s.is_stopped(),
        }
    }

    /// Calls `wake` when the signal may have become set.
    fn watch(&self, wake: Arc<dyn Fn() + Send + Sync>) {
        match self {
            EndSignal::Released(r) => r.watch(wake),
            EndSignal::Stopped(s) => s.watch(wake),
        }
    }
}

/// Whether a leaf of `plan` was (or may have been) ended early: one of its
/// end signals is set. Signals stay set, so a stream that ended asks this
/// after the fact to tell all of its input from a part of it.
pub fn cut_short(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let mut cut = false;
    // Walking a plan that is not being rewritten cannot fail.
    let _ = datafusion::common::tree_node::TreeNode::apply(plan, |node| {
        if let Some(e) = node.downcast_ref::<PassThroughExec<EndWhen>>() {
            cut |= e.node().signal.is_set();
        }
        Ok(if cut {
            datafusion::common::tree_node::TreeNodeRecursion::Stop
        } else {
            datafusion::common::tree_node::TreeNodeRecursion::Continue
        })
    });
    cut
}

/// `leaf`, its stream ended (and dropped at once, so an exchange reader
/// releases its own inputs in turn) once `signal` is set.
pub fn end_leaf_when(leaf: Arc<dyn ExecutionPlan>, signal: EndSignal) -> Arc<dyn ExecutionPlan> {
    let name = match signal {
        EndSignal::Released(_) => "EndWhenReleasedExec",
        EndSignal::Stopped(_) => "EndOnStopExec",
    };
    Arc::new(PassThroughExec::of(leaf, name, EndWhen { signal }))
}

/// A leaf's stream, ended early when its signal is set.
struct EndWhen {
    signal: EndSignal,
}

impl PassThrough for EndWhen {
    fn wrap(&self, inner: SendableRecordBatchStream) -> DfResult<SendableRecordBatchStream> {
        let schema = inner.schema();
        let signal = self.signal.clone();
        let mut inner = Some(inner);
        // The waker of the last poll that found nothing, for the signal.
        let waker: Arc<Mutex<Option<Waker>>> = Arc::new(Mutex::new(None));
        let mut watching = false;
        let stream = futures::stream::poll_fn(move |cx| {
            if signal.is_set() {
                inner = None;
            }
            let Some(s) = inner.as_mut() else {
                return Poll::Ready(None);
            };
            let next = s.poll_next_unpin(cx);
            if next.is_pending() {
                *lock(&waker) = Some(cx.waker().clone());
                if !watching {
                    watching = true;
                    let cell = Arc::clone(&waker);
                    signal.watch(Arc::new(move || {
                        if let Some(w) = lock(&cell).take() {
                            w.wake();
                        }
                    }));
                }
                if signal.is_set() {
                    inner = None;
                    return Poll::Ready(None);
                }
            }
            next
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

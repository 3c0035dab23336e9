//! A node that notices the first row through it: [`FirstRowExec`] hands
//! its input on unchanged and calls a callback once, when the first row
//! passes. A build side's first row is what demands a probe side's scans
//! and starts reading a probe side early; this module knows neither.

use crate::exec::pass_through::{PassThrough, PassThroughExec};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::Result as DfResult;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Its input unchanged; calls `on_row` once, when the first row passes (a
/// build side's first row: to demand a probe side's scans, or
/// to start reading the probe side early).
pub type FirstRowExec = PassThroughExec<FirstRow>;

/// What [`FirstRowExec`] calls at the first row.
pub struct FirstRow {
    on_row: Arc<dyn Fn() + Send + Sync>,
}

impl FirstRowExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, on_row: Arc<dyn Fn() + Send + Sync>) -> Self {
        PassThroughExec::of(input, "FirstRowExec", FirstRow { on_row })
    }
}

/// Calls what every [`FirstRowExec`] in `plan` calls at its first row:
/// for a build side whose rows came from elsewhere (another subtask read
/// them) and whose own input is therefore never run.
pub fn signal_first_rows(plan: &Arc<dyn ExecutionPlan>) {
    let _ = plan.apply(|node| {
        if let Some(f) = node.downcast_ref::<FirstRowExec>() {
            (f.node().on_row)();
        }
        Ok(TreeNodeRecursion::Continue)
    });
}

impl PassThrough for FirstRow {
    fn wrap(&self, input: SendableRecordBatchStream) -> DfResult<SendableRecordBatchStream> {
        let schema = input.schema();
        let (on_row, seen) = (Arc::clone(&self.on_row), AtomicBool::new(false));
        let stream = input.map(move |b: DfResult<RecordBatch>| {
            if let Ok(batch) = &b
                && batch.num_rows() > 0
                && !seen.swap(true, Ordering::Relaxed)
            {
                on_row();
            }
            b
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

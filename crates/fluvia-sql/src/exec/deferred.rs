//! Starting an operator at the first poll of its stream instead of at
//! `execute`.
//!
//! DataFusion builds a whole plan's streams at once: a hash join's `execute`
//! executes its build side there and then, and a `CoalescePartitionsExec`
//! spawns the reading of every input partition as soon as it is executed.
//! A build side kept in its join's task is such a gather over a scan whose
//! predicate holds the dynamic filters of the joins above it; spawned at
//! `execute`, its scan opens its files as soon as the task first waits (for
//! another build side), before those joins built their tables, and prunes
//! nothing. Deferred, it starts when its join first asks for the build
//! side: after every join above has built its table, as the join order
//! promises. This module knows DataFusion only.

use crate::exec::pass_through::{PassThrough, PassThroughExec, Unstarted};
use datafusion::error::Result as DfResult;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;
use std::sync::Arc;

/// Its input, executed at the first poll of its stream.
pub type DeferredExec = PassThroughExec<Deferred>;

/// What [`DeferredExec`] does: nothing until the first poll.
pub struct Deferred;

impl DeferredExec {
    pub fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        PassThroughExec::of(input, "DeferredExec", Deferred)
    }
}

impl PassThrough for Deferred {
    fn execute(&self, input: Unstarted) -> DfResult<SendableRecordBatchStream> {
        let schema = input.plan.schema();
        let stream = futures::stream::once(async move { input.start() })
            .map(|started| match started {
                Ok(s) => s.left_stream(),
                Err(e) => futures::stream::once(async move { Err(e) }).right_stream(),
            })
            .flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::pass_through::CountExecutions;
    use datafusion::arrow::array::Int32Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::error::DataFusionError;
    use datafusion::execution::TaskContext;
    use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
    use datafusion::physical_plan::common::collect;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn the_input_starts_at_the_first_poll_and_yields_all_rows() -> DfResult<()> {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, false)]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int32Array::from(vec![1, 2, 3]))],
        )?;
        let memory = MemorySourceConfig::try_new_exec(&[vec![batch]], Arc::clone(&schema), None)?;
        let executed = Arc::new(AtomicUsize::new(0));
        let leaf: Arc<dyn ExecutionPlan> = Arc::new(PassThroughExec::of(
            memory,
            "Counting",
            CountExecutions(Arc::clone(&executed)),
        ));
        let gather: Arc<dyn ExecutionPlan> = Arc::new(CoalescePartitionsExec::new(leaf));
        let deferred = DeferredExec::new(gather);
        let stream = deferred.execute(0, Arc::new(TaskContext::default()))?;
        assert_eq!(executed.load(Ordering::SeqCst), 0, "executed before a poll");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let batches = rt.block_on(collect(stream))?;
        assert_eq!(executed.load(Ordering::SeqCst), 1);
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        assert_eq!(rows, 3);
        Ok(())
    }
}

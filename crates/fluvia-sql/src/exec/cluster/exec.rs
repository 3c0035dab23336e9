//! [`ClusterByKeyExec`]: buffers a build side, estimates the rows per key
//! from a sample and orders the rows by the hash of their key where keys
//! repeat; reads its input for every subtask when asked.

use super::hash::*;
use super::shared::*;
use crate::exec::pass_through::plan_basics;
use datafusion::arrow::array::UInt32Array;
use datafusion::arrow::compute::{concat_batches, take_record_batch};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::TryStreamExt;
use std::fmt;
use std::sync::Arc;

/// Its input, every row of it, with rows of equal keys adjacent when keys
/// repeat enough for that to pay (the module doc). Emits when its input
/// ended; declares no order.
#[derive(Debug)]
pub struct ClusterByKeyExec {
    pub(super) input: Arc<dyn ExecutionPlan>,
    pub(super) keys: Vec<Arc<dyn PhysicalExpr>>,
    /// Set where the subtasks of this process share the result.
    pub(super) share: Option<Arc<Member>>,
    /// With `share`: the input is read by one subtask for all (it reads no
    /// exchange, which each subtask must drain of its own).
    pub(super) read_once: bool,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl ClusterByKeyExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, keys: Vec<Arc<dyn PhysicalExpr>>) -> Self {
        let properties = PlanProperties::new(
            EquivalenceProperties::new(input.schema()),
            input.properties().partitioning.clone(),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        ClusterByKeyExec {
            input,
            keys,
            share: None,
            read_once: false,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for ClusterByKeyExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let keys: Vec<String> = self.keys.iter().map(|k| k.to_string()).collect();
        write!(f, "ClusterByKeyExec: keys=[{}]", keys.join(", "))?;
        if self.share.is_some() {
            write!(f, ", shared")?;
            if self.read_once {
                write!(f, ", read once")?;
            }
        }
        Ok(())
    }
}

impl ExecutionPlan for ClusterByKeyExec {
    plan_basics!(|this| "ClusterByKeyExec", &this.properties, [&this.input]);

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        for k in &self.keys {
            if f(k)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        match children.pop() {
            Some(input) if children.is_empty() => {
                let mut node = ClusterByKeyExec::new(input, self.keys.clone());
                node.share = self.share.clone();
                node.read_once = self.read_once;
                Ok(Arc::new(node))
            }
            _ => Err(DataFusionError::Internal(
                "ClusterByKeyExec takes one child".into(),
            )),
        }
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        if self.read_once
            && let Some(member) = &self.share
            // A consumer of a scan this task shares between fragments must
            // read its part, or the others wait for it.
            && !self
                .input
                .exists(|n| Ok(n.is::<crate::exec::shared_scan::SharedScanExec>()))?
        {
            return self.execute_once(Arc::clone(member), partition, ctx);
        }
        let input = self.input.execute(partition, ctx)?;
        let schema = input.schema();
        let keys = self.keys.clone();
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let sorted = MetricBuilder::new(&self.metrics).counter("sorted", partition);
        let taken = MetricBuilder::new(&self.metrics).counter("shared_taken", partition);
        let share = self.share.clone();
        let stream = futures::stream::once(async move {
            let batches: Vec<RecordBatch> = input.try_collect().await?;
            let rows = batches.iter().map(|b| b.num_rows()).sum();
            let turn = share.as_ref().map_or(Turn::Own, |m| m.turn(rows));
            let (claim, shared) = match turn {
                Turn::Own => (None, None),
                Turn::Claim(c) => (Some(c), None),
                Turn::Take(b) => (None, Some(b)),
                Turn::Wait(mut rx) => {
                    let state = rx
                        .wait_for(|s| !matches!(s, SlotState::Claimed { .. }))
                        .await
                        .map(|s| s.clone());
                    (None, state.ok().and_then(|s| Taken::of(&s, rows)))
                }
            };
            let out = match shared {
                Some(Taken::Sorted(b)) => {
                    taken.add(1);
                    b
                }
                Some(Taken::AsIs) => batches,
                None => {
                    let timer = baseline.elapsed_compute().timer();
                    let out = cluster(batches, &keys, &sorted);
                    timer.done();
                    if let Some(c) = claim {
                        c.finish(&out);
                    }
                    out?.0
                }
            };
            baseline.record_output(out.iter().map(|b| b.num_rows()).sum());
            Ok::<_, DataFusionError>(out)
        })
        .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

impl ClusterByKeyExec {
    /// The stream of a build side one subtask reads for all: when the join
    /// first asks, the subtask takes what another read, waits for the one
    /// reading, or reads and hands it on. The input of one that takes is
    /// never run; what its first row would have started is started.
    fn execute_once(
        &self,
        member: Arc<Member>,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let input = Arc::clone(&self.input);
        let schema = input.schema();
        let keys = self.keys.clone();
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let sorted = MetricBuilder::new(&self.metrics).counter("sorted", partition);
        let taken = MetricBuilder::new(&self.metrics).counter("shared_taken", partition);
        let stream = futures::stream::once(async move {
            let read = match member.read_turn() {
                ReadTurn::Take(b) => Some(b),
                ReadTurn::Wait(mut rx) => {
                    let state = rx
                        .wait_for(|s| !matches!(s, SlotState::Reading))
                        .await
                        .map(|s| s.clone());
                    match state {
                        Ok(SlotState::Read { batches }) => Some(batches),
                        _ => None,
                    }
                }
                ReadTurn::Lead(claim) => match build_readers() {
                    // Not on this task's thread: an exchange reader blocks
                    // it while it waits for data, and that data may come
                    // from a producer held up by a subtask waiting here.
                    Some(readers) => {
                        let time = baseline.elapsed_compute().clone();
                        let read = readers.spawn(read_for_all(
                            claim,
                            Arc::clone(&input),
                            (partition, ctx),
                            keys,
                            (sorted, time),
                        ));
                        let _abort = AbortOnDrop(read.abort_handle());
                        let out = read.await.map_err(|e| {
                            DataFusionError::Execution(format!("reading a build side: {e}"))
                        })??;
                        baseline.record_output(out.iter().map(|b| b.num_rows()).sum());
                        return Ok(out);
                    }
                    // No thread for it: each reads its own.
                    None => None,
                },
                ReadTurn::Own => None,
            };
            if let Some(batches) = read {
                taken.add(1);
                if batches.iter().any(|b| b.num_rows() > 0) {
                    crate::exec::first_row::signal_first_rows(&input);
                }
                baseline.record_output(batches.iter().map(|b| b.num_rows()).sum());
                return Ok(batches);
            }
            let time = baseline.elapsed_compute();
            let out = read_clustered(&input, (partition, ctx), &keys, (&sorted, time)).await?;
            baseline.record_output(out.iter().map(|b| b.num_rows()).sum());
            Ok::<_, DataFusionError>(out)
        })
        .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// The threads build sides read once are read on, shared by the process:
/// `None` if they could not be started.
fn build_readers() -> Option<&'static tokio::runtime::Runtime> {
    static READERS: std::sync::OnceLock<Option<tokio::runtime::Runtime>> =
        std::sync::OnceLock::new();
    READERS
        .get_or_init(|| crate::job::runtime::per_core_runtime("fluvia-build-reader", 2).ok())
        .as_ref()
}

/// Aborts a spawned read whose subtask no longer wants it (its join ended,
/// its task was cancelled); dropping its claim lets the others read their
/// own.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reads `input` for every subtask of the claim: clustered, as one batch
/// (the joins index it as it is, without a copy each), handed on unless a
/// leaf ended early and read part of it (then only the reader's own join
/// takes it, and the others read their own).
async fn read_for_all(
    claim: Claim,
    input: Arc<dyn ExecutionPlan>,
    (partition, ctx): (usize, Arc<TaskContext>),
    keys: Vec<Arc<dyn PhysicalExpr>>,
    (sorted, time): (Count, datafusion::physical_plan::metrics::Time),
) -> DfResult<Vec<RecordBatch>> {
    let mut out = read_clustered(&input, (partition, ctx), &keys, (&sorted, &time)).await?;
    if out.len() > 1 {
        let timer = time.timer();
        out = vec![concat_batches(&out[0].schema(), &out)?];
        timer.done();
    }
    if !crate::exec::released::cut_short(&input) {
        claim.publish(out.clone());
    }
    Ok(out)
}

/// `input` read whole and clustered by `keys`, the clustering timed.
async fn read_clustered(
    input: &Arc<dyn ExecutionPlan>,
    (partition, ctx): (usize, Arc<TaskContext>),
    keys: &[Arc<dyn PhysicalExpr>],
    (sorted, time): (&Count, &datafusion::physical_plan::metrics::Time),
) -> DfResult<Vec<RecordBatch>> {
    let batches: Vec<RecordBatch> = input.execute(partition, ctx)?.try_collect().await?;
    let timer = time.timer();
    let out = cluster(batches, keys, sorted);
    timer.done();
    Ok(out?.0)
}

/// `batches` as they are, or as one batch sorted by the hash of `keys`;
/// true if sorted.
pub(super) fn cluster(
    batches: Vec<RecordBatch>,
    keys: &[Arc<dyn PhysicalExpr>],
    sorted: &Count,
) -> DfResult<(Vec<RecordBatch>, bool)> {
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let Some(first) = batches.first() else {
        return Ok((batches, false));
    };
    if rows < MIN_ROWS || keys.is_empty() || !keys_repeat(&batches, keys, rows)? {
        return Ok((batches, false));
    }
    let all = concat_batches(&first.schema(), &batches)?;
    drop(batches);
    let hashes = hash_keys(&all, keys)?;
    let indices = UInt32Array::from(order_by_hash(&hashes)?);
    sorted.add(1);
    Ok((vec![take_record_batch(&all, &indices)?], true))
}

//! A join that ends as soon as its probe side turns out empty.
//!
//! DataFusion's hash join collects its whole build side before it polls its
//! probe side. Where the probe side comes from another task, it is often
//! known to be empty long before the build side is collected: a selective
//! filter upstream matched nothing (at SF 1, q34's store filter matches no
//! store, yet the join above still waited for 100 K customers to be read,
//! broadcast and hashed). For the join types whose output is made of probe
//! rows or of matches (inner, right, right semi and anti, left semi), an
//! empty probe side means an empty output.
//!
//! [`EndOnEmptyProbeExec`] starts reading the probe side on a thread of its
//! own once the build side delivered its first row (exchange readers block
//! their thread, so the task's thread cannot wait for both; an empty build
//! side ends the join without its probe side, as before). If the probe side
//! ends without a row, it stops the build side's readers and scans
//! ([`ReaderStop`]); the join, its build side cut short, finds the probe
//! side empty and ends, and the task releases its inputs so the tasks
//! producing the build side stop too. Otherwise the first batch is kept for
//! the join (the probe tap hands it over) and the task's thread reads the
//! rest: nothing is read twice or lost. Once the join's output ended, the
//! probe side's readers are stopped and release their channels.
//!
//! Only probe sides of exchange readers under projections, filters and
//! aggregates are read early: they spawn nothing on the task's runtime and
//! hold no scan that could wait for a runtime filter of this join. A
//! wrapped plan is executed once (it is a task's).

use crate::exec::exchange::{ExchangeReaderExec, ReaderStop, lock};
use crate::exec::first_row::FirstRowExec;
use crate::exec::pass_through::{PassThrough, PassThroughExec};
use crate::exec::released::EndSignal;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::JoinType;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::joins::HashJoinExec;
use futures::{Stream, StreamExt};
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// The probe stream of one execution, shared between the join (through the
/// tap) and the thread that watches it.
struct SharedProbe {
    input: SendableRecordBatchStream,
    /// A batch the watcher took while the join was still building.
    kept: Option<DfResult<RecordBatch>>,
    /// A row has been seen: the probe side is not empty.
    rows_seen: bool,
    ended: bool,
}

/// What the wrapper, its taps and its watcher thread share.
#[derive(Default)]
struct Watch {
    /// The probe stream, once the tap was executed.
    probe: Mutex<Option<Arc<Mutex<SharedProbe>>>>,
    /// The watcher, once the build side delivered a row.
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Ends the build side once the probe side ended without a row.
    build_stop: Arc<ReaderStop>,
    /// Ends the probe side's readers once the join's output ended.
    probe_stop: Arc<ReaderStop>,
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch").finish_non_exhaustive()
    }
}

impl Watch {
    /// Starts the watcher (once, and only if the probe side was executed
    /// and its readers were not stopped).
    fn start(&self) {
        let Some(probe) = lock(&self.probe).take() else {
            return;
        };
        if self.probe_stop.is_stopped() {
            return;
        }
        let build_stop = Arc::clone(&self.build_stop);
        let spawned = std::thread::Builder::new()
            .name("fluvia-probe-watch".into())
            .spawn(move || watch_probe(&probe, &build_stop));
        // Without a thread the join simply runs as DataFusion's does.
        if let Ok(handle) = spawned {
            *lock(&self.thread) = Some(handle);
        }
    }
}

/// Reads the probe side up to its first row; if it ends (or fails) first,
/// stops the build side so the join gets to its probe side at once.
fn watch_probe(shared: &Mutex<SharedProbe>, build_stop: &ReaderStop) {
    let mut s = lock(shared);
    let mut failed = false;
    while !(s.rows_seen || s.kept.is_some() || s.ended) {
        match futures::executor::block_on(s.input.next()) {
            Some(Ok(b)) if b.num_rows() == 0 => {}
            Some(Ok(b)) => {
                s.rows_seen = true;
                s.kept = Some(Ok(b));
            }
            Some(Err(e)) => {
                // The join reports it once it reads its probe side.
                s.kept = Some(Err(e));
                failed = true;
            }
            None => s.ended = true,
        }
    }
    let empty = s.ended && !s.rows_seen;
    drop(s);
    if empty || failed {
        build_stop.stop();
    }
}

/// The wrapped join's probe input: hands the probe stream to the watcher.
/// (The build side's leaves are watched by [`FirstRowExec`]s, which start
/// the watcher at the first row they see.)
type ProbeTapExec = PassThroughExec<ProbeTap>;

struct ProbeTap {
    watch: Arc<Watch>,
}

impl PassThrough for ProbeTap {
    fn wrap(&self, input: SendableRecordBatchStream) -> DfResult<SendableRecordBatchStream> {
        let schema = input.schema();
        let shared = Arc::new(Mutex::new(SharedProbe {
            input,
            kept: None,
            rows_seen: false,
            ended: false,
        }));
        *lock(&self.watch.probe) = Some(Arc::clone(&shared));
        Ok(Box::pin(ProbeTapStream { shared, schema }))
    }
}

struct ProbeTapStream {
    shared: Arc<Mutex<SharedProbe>>,
    schema: SchemaRef,
}

impl Stream for ProbeTapStream {
    type Item = DfResult<RecordBatch>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // Waits here for the watcher, if it still reads.
        let mut s = lock(&self.shared);
        if let Some(kept) = s.kept.take() {
            return Poll::Ready(Some(kept));
        }
        if s.ended {
            return Poll::Ready(None);
        }
        let next = s.input.poll_next_unpin(cx);
        match &next {
            Poll::Ready(None) => s.ended = true,
            Poll::Ready(Some(Ok(b))) if b.num_rows() > 0 => s.rows_seen = true,
            _ => {}
        }
        next
    }
}

impl RecordBatchStream for ProbeTapStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

/// A join (whose inputs are taps) that ends when its probe side ends
/// without a row, whether or not its build side is complete.
pub type EndOnEmptyProbeExec = PassThroughExec<EndOnEmptyProbe>;

/// What the join's taps and its watcher share.
pub struct EndOnEmptyProbe {
    watch: Arc<Watch>,
}

impl EndOnEmptyProbeExec {
    /// `join` with its inputs read through taps and both sides' leaves given
    /// a stop signal, wrapped. The caller checks that the join type makes an
    /// empty probe side (the second input) an empty output.
    pub fn wrap(join: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
        let children = join.children();
        let [build, probe] = children.as_slice() else {
            return Err(DataFusionError::Internal(format!(
                "{} is not a join of two inputs",
                join.name()
            )));
        };
        let watch = Arc::new(Watch::default());
        let probe = Arc::new(ProbeTapExec::of(
            stop_leaves(Arc::clone(probe), &watch.probe_stop, None)?,
            "ProbeTapExec",
            ProbeTap {
                watch: Arc::clone(&watch),
            },
        ));
        // The build side's leaves tell its first row: the operators above
        // them may hold every row back (clustering by key, aggregates).
        let build = stop_leaves(Arc::clone(build), &watch.build_stop, Some(&watch))?;
        let join = replace_children_if_necessary(Arc::clone(&join), vec![build, probe])?;
        Ok(Arc::new(EndOnEmptyProbeExec::of(
            join,
            "EndOnEmptyProbeExec",
            EndOnEmptyProbe { watch },
        )))
    }
}

/// `plan` with every exchange reader also ended by `stop`, every other
/// leaf wrapped so that its stream ends once `stop` is set, and (with
/// `watch`) every leaf tapped to start the watcher at its first row.
fn stop_leaves(
    plan: Arc<dyn ExecutionPlan>,
    stop: &Arc<ReaderStop>,
    watch: Option<&Arc<Watch>>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let leaf: Arc<dyn ExecutionPlan> = if let Some(r) = plan.downcast_ref::<ExchangeReaderExec>() {
        Arc::new(r.with_stop(Arc::clone(stop)))
    } else if plan.children().is_empty() {
        crate::exec::released::end_leaf_when(plan, EndSignal::Stopped(Arc::clone(stop)))
    } else {
        let children = plan
            .children()
            .into_iter()
            .map(|c| stop_leaves(Arc::clone(c), stop, watch))
            .collect::<DfResult<Vec<_>>>()?;
        return replace_children_if_necessary(plan, children);
    };
    Ok(match watch {
        Some(watch) => {
            let watch = Arc::clone(watch);
            Arc::new(FirstRowExec::new(leaf, Arc::new(move || watch.start())))
        }
        None => leaf,
    })
}

impl PassThrough for EndOnEmptyProbe {
    fn wrap(&self, join: SendableRecordBatchStream) -> DfResult<SendableRecordBatchStream> {
        Ok(Box::pin(EndOnEmptyProbeStream {
            schema: join.schema(),
            join,
            watch: Arc::clone(&self.watch),
        }))
    }
}

struct EndOnEmptyProbeStream {
    join: SendableRecordBatchStream,
    watch: Arc<Watch>,
    schema: SchemaRef,
}

impl Stream for EndOnEmptyProbeStream {
    type Item = DfResult<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.join.poll_next_unpin(cx)
    }
}

impl Drop for EndOnEmptyProbeStream {
    /// The probe side's readers end (and release their channels) if the
    /// watcher still waits on them: nothing reads the join's output now.
    fn drop(&mut self) {
        self.watch.probe_stop.stop();
        if let Some(w) = lock(&self.watch.thread).take() {
            let _ = w.join();
        }
    }
}

impl RecordBatchStream for EndOnEmptyProbeStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

/// Whether an empty probe side (the second input) makes `join`'s output
/// empty: its rows are probe rows or matches.
pub(crate) fn empty_probe_empties(join: &HashJoinExec) -> bool {
    matches!(
        join.join_type(),
        JoinType::Inner
            | JoinType::Right
            | JoinType::RightSemi
            | JoinType::RightAnti
            | JoinType::RightMark
            | JoinType::LeftSemi
    )
}

/// Whether `probe` can be read on a thread of its own while the join
/// collects its build side: exchange readers under operators that spawn
/// nothing on the task's runtime (projections, filters, aggregates). No
/// scan, so no runtime filter it would read too
/// early.
fn probe_can_start_early(probe: &Arc<dyn ExecutionPlan>) -> bool {
    use datafusion::physical_plan::aggregates::AggregateExec;
    use datafusion::physical_plan::filter::FilterExec;
    use datafusion::physical_plan::projection::ProjectionExec;
    let node_ok = probe.is::<ExchangeReaderExec>()
        || probe.is::<ProjectionExec>()
        || probe.is::<FilterExec>()
        || probe.is::<AggregateExec>();
    node_ok
        && probe.children().is_empty() == probe.is::<ExchangeReaderExec>()
        && probe.children().into_iter().all(probe_can_start_early)
}

/// Whether the build side reads anything the join can stop early: an
/// exchange or a scan (a join over a constant build side gains nothing).
fn build_can_stop(build: &Arc<dyn ExecutionPlan>) -> bool {
    use datafusion::datasource::source::DataSourceExec;
    build.is::<ExchangeReaderExec>()
        || build.is::<DataSourceExec>()
        || build.children().into_iter().any(build_can_stop)
}

/// `plan` with every hash join whose output an empty probe side empties,
/// and whose probe side can be read early, wrapped in
/// [`EndOnEmptyProbeExec`]. For a plan of one task that has not run.
pub fn end_joins_on_empty_probe(plan: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
    use datafusion::common::tree_node::{Transformed, TreeNode};
    plan.transform_up(|node| {
        let Some(join) = node.downcast_ref::<HashJoinExec>() else {
            return Ok(Transformed::no(node));
        };
        if !empty_probe_empties(join)
            || !probe_can_start_early(join.right())
            || !build_can_stop(join.left())
        {
            return Ok(Transformed::no(node));
        }
        EndOnEmptyProbeExec::wrap(node).map(Transformed::yes)
    })
    .map(|t| t.data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int32Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::execution::TaskContext;
    use datafusion::physical_expr::PhysicalExpr;
    use datafusion::physical_expr::expressions::Column;
    use datafusion::physical_plan::common::collect;
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
    use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, false)]))
    }

    fn batch(keys: Vec<i32>) -> RecordBatch {
        RecordBatch::try_new(schema(), vec![Arc::new(Int32Array::from(keys))]).expect("batch")
    }

    fn memory(batches: Vec<RecordBatch>) -> Arc<dyn ExecutionPlan> {
        MemorySourceConfig::try_new_exec(&[batches], schema(), None).expect("memory")
    }

    /// A build side that delivers rows and never ends (its producer is
    /// still running): a leaf.
    #[derive(Debug)]
    struct Endless(SchemaRef);

    impl Endless {
        fn plan() -> Arc<dyn ExecutionPlan> {
            let partitions: Vec<Arc<dyn PartitionStream>> = vec![Arc::new(Endless(schema()))];
            Arc::new(
                StreamingTableExec::try_new(schema(), partitions, None, vec![], false, None)
                    .expect("endless"),
            )
        }
    }

    impl PartitionStream for Endless {
        fn schema(&self) -> &SchemaRef {
            &self.0
        }

        fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
            let first = futures::stream::once(async { Ok(batch(vec![1, 2])) });
            Box::pin(RecordBatchStreamAdapter::new(
                schema(),
                first.chain(futures::stream::pending()),
            ))
        }
    }

    fn join(
        build: Arc<dyn ExecutionPlan>,
        probe: Arc<dyn ExecutionPlan>,
        join_type: JoinType,
    ) -> Arc<dyn ExecutionPlan> {
        let k: Arc<dyn PhysicalExpr> = Arc::new(Column::new("k", 0));
        Arc::new(crate::exec::collect_left_join(
            build,
            probe,
            vec![(Arc::clone(&k), k)],
            &join_type,
            None,
        ))
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
    }

    #[test]
    fn an_empty_probe_side_ends_the_join_before_its_build_side_does() -> DfResult<()> {
        // Empty batches first, as an exchange may deliver them.
        let probe = memory(vec![batch(vec![]), batch(vec![])]);
        let plain = join(Endless::plan(), Arc::clone(&probe), JoinType::Inner);
        let wrapped = EndOnEmptyProbeExec::wrap(join(Endless::plan(), probe, JoinType::Inner))?;
        let ctx = Arc::new(TaskContext::default());
        let rt = runtime();
        let stream = wrapped.execute(0, Arc::clone(&ctx))?;
        let out = rt
            .block_on(async {
                tokio::time::timeout(std::time::Duration::from_secs(10), collect(stream)).await
            })
            .expect("the join waited for its endless build side")?;
        assert!(out.iter().all(|b| b.num_rows() == 0));
        // The join alone waits for its build side.
        let mut stream = plain.execute(0, ctx)?;
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let polled = rt.block_on(async { stream.poll_next_unpin(&mut cx) });
        assert!(polled.is_pending());
        Ok(())
    }

    #[test]
    fn an_empty_build_side_ends_the_join_without_reading_its_probe_side() -> DfResult<()> {
        let wrapped =
            EndOnEmptyProbeExec::wrap(join(memory(vec![]), Endless::plan(), JoinType::Inner))?;
        let rt = runtime();
        let mut stream = wrapped.execute(0, Arc::new(TaskContext::default()))?;
        let first = rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(10), stream.next()).await
        });
        assert!(matches!(first, Ok(None)), "the join read its probe side");
        let Some(w) = wrapped.downcast_ref::<EndOnEmptyProbeExec>() else {
            panic!("not wrapped: {}", wrapped.name());
        };
        assert!(
            lock(&w.node().watch.thread).is_none(),
            "a watcher was started"
        );
        Ok(())
    }

    #[test]
    fn a_probe_side_with_rows_gives_the_joins_answer() -> DfResult<()> {
        let build = vec![batch((0..100).collect())];
        // The first probe batch is taken while the build side is read.
        let probe = vec![batch(vec![]), batch(vec![1, 2, 200]), batch(vec![3, 3])];
        let ctx = Arc::new(TaskContext::default());
        let rt = runtime();
        for join_type in [JoinType::Inner, JoinType::RightSemi, JoinType::LeftSemi] {
            // Two joins: a rewritten join shares the build-side state of the
            // one it was made from, so that one must not have run.
            let plain = join(memory(build.clone()), memory(probe.clone()), join_type);
            let other = join(memory(build.clone()), memory(probe.clone()), join_type);
            let wrapped = EndOnEmptyProbeExec::wrap(other)?;
            let expected = rt.block_on(collect(plain.execute(0, Arc::clone(&ctx))?))?;
            let got = rt.block_on(collect(wrapped.execute(0, Arc::clone(&ctx))?))?;
            let rows = |b: &[RecordBatch]| b.iter().map(|b| b.num_rows()).sum::<usize>();
            assert!(rows(&expected) > 0, "{join_type}");
            assert_eq!(rows(&got), rows(&expected), "{join_type}");
            assert_eq!(
                datafusion::arrow::compute::concat_batches(&got[0].schema(), &got)?,
                datafusion::arrow::compute::concat_batches(&expected[0].schema(), &expected)?,
                "{join_type}"
            );
        }
        Ok(())
    }

    #[test]
    fn only_joins_an_empty_probe_side_empties_over_exchanges_are_wrapped() -> DfResult<()> {
        use crate::exec::exchange::{ExchangeReaderExec, ReaderFacts};
        use datafusion::physical_plan::filter::FilterExec;
        let reader = |stage| -> Arc<dyn ExecutionPlan> {
            Arc::new(
                ExchangeReaderExec::new(stage, schema(), 1, ReaderFacts::default())
                    .expect("reader"),
            )
        };
        let k: Arc<dyn PhysicalExpr> = Arc::new(Column::new("k", 0));
        let is_positive = Arc::new(datafusion::physical_expr::expressions::BinaryExpr::new(
            k,
            datafusion::logical_expr::Operator::Gt,
            Arc::new(datafusion::physical_expr::expressions::Literal::new(
                datafusion::common::ScalarValue::Int32(Some(0)),
            )),
        ));
        let filtered: Arc<dyn ExecutionPlan> =
            Arc::new(FilterExec::try_new(is_positive, reader(2))?);
        for join_type in [JoinType::Inner, JoinType::RightSemi, JoinType::LeftSemi] {
            let out = end_joins_on_empty_probe(join(reader(1), Arc::clone(&filtered), join_type))?;
            assert_eq!(out.name(), "EndOnEmptyProbeExec", "{join_type}");
        }
        // Unmatched build rows are output with an empty probe side.
        for join_type in [JoinType::Left, JoinType::LeftAnti, JoinType::Full] {
            let out = end_joins_on_empty_probe(join(reader(1), reader(2), join_type))?;
            assert_eq!(out.name(), "HashJoinExec", "{join_type}");
        }
        // A scan on the probe side may wait for this join's runtime filter.
        let out = end_joins_on_empty_probe(join(reader(1), memory(vec![]), JoinType::Inner))?;
        assert_eq!(out.name(), "HashJoinExec");
        Ok(())
    }
}

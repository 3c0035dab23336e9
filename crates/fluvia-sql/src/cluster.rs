//! A hash join's build side with the rows of one key side by side.
//!
//! DataFusion's hash join chains the build rows of a key through an index
//! array and gathers their columns by position. When many build rows share
//! a key (q72's `catalog_sales ⋈ inventory` on the item: 18 build rows per
//! key, 26 candidate rows per probe row), every candidate is a jump to a
//! random row of a build table larger than the core's cache. DataFusion alone
//! hides part of that by splitting the join into hash partitions; a Fluvia
//! task runs one partition, so its build table is the whole one. Reordering
//! the build rows by the hash of their key makes each chain one run of
//! neighbouring rows.
//!
//! Whether that pays is only known once the build side is in: a sort of a
//! million rows whose keys are unique costs more than it saves. The build
//! side is blocking anyway (the join reads all of it before it probes), so
//! [`ClusterByKeyExec`] buffers it, estimates the rows per key from a
//! sample, and sorts only where keys repeat. This module knows DataFusion
//! only; which joins get it is the task's choice.
//!
//! A broadcast join's build side is the same rows in every subtask. The
//! subtasks of one stage that run in one process cluster it once
//! ([`SharedClusters`], [`share_broadcast_builds`]): the first whose input
//! ended clusters it and hands the result to the others, which still read
//! their own input and take the shared result only if it has as many rows
//! (a build side cut short, because its join no longer needed it, is never
//! handed to a subtask that read its whole input). A build side that reads
//! no exchange (a scan kept in the join's task, read whole by every
//! subtask) is read once: the others wait for the first and never run their
//! own input, unless the first was cut short (one of its leaves' end
//! signals set), failed or was dropped, when each reads its own. The read
//! runs on threads of the process ([`build_readers`]), not on the first's
//! task thread, which its exchange readers may block on data that a waiting
//! subtask holds up.

use datafusion::arrow::array::{ArrayRef, UInt32Array};
use datafusion::arrow::compute::{concat_batches, take, take_record_batch};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::hash_utils::{RandomState, create_hashes};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{
    Boundedness, EmissionType, replace_children_if_necessary,
};
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::TryStreamExt;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

/// Below this many build rows the table stays in the core's cache.
const MIN_ROWS: usize = 32 * 1024;
/// Rows whose keys are counted to estimate the rows per key.
const SAMPLE: usize = 64 * 1024;
/// Sampled rows per distinct key from which the build side is sorted.
const MIN_ROWS_PER_KEY: usize = 2;

/// `plan` with the build side of every hash join clustered by key. For a
/// plan that has not run: a rewritten join keeps the build-side state (and
/// the dynamic filter its probe side's scan reads) of the original.
pub fn cluster_build_sides(plan: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(join) = node.downcast_ref::<HashJoinExec>() else {
            return Ok(Transformed::no(node));
        };
        if join.left().is::<ClusterByKeyExec>() {
            return Ok(Transformed::no(node));
        }
        let keys = join.on().iter().map(|(l, _)| Arc::clone(l)).collect();
        let build = Arc::new(ClusterByKeyExec::new(Arc::clone(join.left()), keys));
        let right = Arc::clone(join.right());
        replace_children_if_necessary(node, vec![build, right]).map(Transformed::yes)
    })
    .map(|t| t.data)
}

/// `plan` (a task's, with its build sides clustered) with each clustered
/// build side that is the same in every subtask (it reads broadcast inputs,
/// `broadcast` being the stages whose output every consumer subtask
/// receives whole, or scans read whole) clustered once for the subtasks of
/// `stage` that run in this process; with `read_once`, one that reads no
/// exchange is also read once for them.
pub fn share_broadcast_builds(
    plan: Arc<dyn ExecutionPlan>,
    shared: &Arc<SharedClusters>,
    (stage, attempt): (usize, u32),
    broadcast: &dyn Fn(usize) -> bool,
    read_once: bool,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let uniform = uniform_filters(&plan, broadcast)?;
    plan.transform_up(|node| {
        let Some(c) = node.downcast_ref::<ClusterByKeyExec>() else {
            return Ok(Transformed::no(node));
        };
        if c.share.is_some() || !same_in_every_subtask(&c.input, broadcast, &uniform)? {
            return Ok(Transformed::no(node));
        }
        // Named by what it computes (inputs, filters, keys), not by its
        // place: a subtask's plan may lack union branches another has.
        let what = format!(
            "{}",
            datafusion::physical_plan::displayable(node.as_ref()).indent(false)
        );
        let key = (stage, what, attempt);
        let mut shared_node = ClusterByKeyExec::new(Arc::clone(&c.input), c.keys.clone());
        shared_node.share = Some(Arc::new(SharedClusters::join(shared, key)));
        shared_node.read_once = read_once && !reads_exchange(&c.input)?;
        Ok(Transformed::yes(
            Arc::new(shared_node) as Arc<dyn ExecutionPlan>
        ))
    })
    .map(|t| t.data)
}

/// Whether `plan` gives every subtask the same rows: it reads only
/// broadcast inputs or scans it reads whole (a scan a subtask reads part of
/// shows its own file ranges, and so another key), through filters and
/// projections. The dynamic filters it reads must be `uniform`: those of
/// joins whose build side is the same in every subtask, which hold the same
/// keys everywhere (a filter only drops rows that join's build side cannot
/// match, whenever it is filled).
fn same_in_every_subtask(
    plan: &Arc<dyn ExecutionPlan>,
    broadcast: &dyn Fn(usize) -> bool,
    uniform: &HashSet<u64>,
) -> DfResult<bool> {
    use datafusion::datasource::source::DataSourceExec;
    use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
    use datafusion::physical_plan::filter::FilterExec;
    use datafusion::physical_plan::projection::ProjectionExec;
    let mut same = true;
    plan.apply(|node| {
        let ok = if let Some(r) = node.downcast_ref::<crate::exchange::ExchangeReaderExec>() {
            broadcast(r.stage())
        } else if node.is::<FilterExec>() || node.is::<DataSourceExec>() {
            crate::split::dynamic_filter_ids(node)
                .iter()
                .all(|id| uniform.contains(id))
        } else {
            node.is::<ProjectionExec>()
                || node.is::<CoalescePartitionsExec>()
                || node.is::<crate::demand::FirstRowExec>()
                || node.is::<crate::deferred::DeferredExec>()
                || node.is::<ClusterByKeyExec>()
        };
        same &= ok;
        Ok(if ok {
            TreeNodeRecursion::Continue
        } else {
            TreeNodeRecursion::Stop
        })
    })?;
    Ok(same)
}

/// The dynamic filters of the hash joins in `plan` whose build side is the
/// same in every subtask (a join's build side may read another such
/// join's filter, hence the rounds).
fn uniform_filters(
    plan: &Arc<dyn ExecutionPlan>,
    broadcast: &dyn Fn(usize) -> bool,
) -> DfResult<HashSet<u64>> {
    let mut uniform = HashSet::new();
    loop {
        let mut found = HashSet::new();
        plan.apply(|node| {
            if let Some(j) = node.downcast_ref::<HashJoinExec>() {
                let ids: HashSet<u64> = j
                    .dynamic_expressions_produced()
                    .iter()
                    .filter_map(|f| f.expression_id())
                    .filter(|id| !uniform.contains(id))
                    .collect();
                if !ids.is_empty() && same_in_every_subtask(j.left(), broadcast, &uniform)? {
                    found.extend(ids);
                }
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        if found.is_empty() {
            return Ok(uniform);
        }
        uniform.extend(found);
    }
}

/// Whether `plan` reads an exchange.
fn reads_exchange(plan: &Arc<dyn ExecutionPlan>) -> DfResult<bool> {
    plan.exists(|n| Ok(n.is::<crate::exchange::ExchangeReaderExec>()))
}

/// The build sides one job's subtasks in this process cluster once, by
/// (stage, the clustering's plan as displayed, attempt). An entry
/// lives while a subtask's plan holds it.
#[derive(Debug, Default)]
pub struct SharedClusters {
    entries: std::sync::Mutex<HashMap<SlotKey, (usize, Arc<Slot>)>>,
}

type SlotKey = (usize, String, u32);

impl SharedClusters {
    fn join(this: &Arc<Self>, key: SlotKey) -> Member {
        let mut entries = this.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (members, slot) = entries.entry(key.clone()).or_insert_with(|| {
            let (tx, _) = tokio::sync::watch::channel(SlotState::Open);
            (0, Arc::new(Slot(tx)))
        });
        *members += 1;
        Member {
            registry: Arc::clone(this),
            key,
            slot: Arc::clone(slot),
        }
    }

    /// Entries held now (for tests).
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug)]
struct Slot(tokio::sync::watch::Sender<SlotState>);

#[derive(Debug, Clone)]
enum SlotState {
    /// No subtask has its whole input yet.
    Open,
    /// One clusters `rows` rows.
    Claimed { rows: usize },
    /// Sorted: one batch, which the joins build from without a copy.
    Done {
        rows: usize,
        batches: Vec<RecordBatch>,
    },
    /// Sorting would not pay: each keeps its own rows as they are (holding
    /// them here would keep a second copy beside each join's).
    AsIs { rows: usize },
    /// The one that claimed it failed or was stopped.
    Abandoned,
    /// One subtask reads the input for all ([`ClusterByKeyExec::read_once`]).
    Reading,
    /// What it read: its rows as the joins take them.
    Read { batches: Vec<RecordBatch> },
}

/// A subtask's place at one shared build side.
#[derive(Debug)]
struct Member {
    registry: Arc<SharedClusters>,
    key: SlotKey,
    slot: Arc<Slot>,
}

impl Drop for Member {
    fn drop(&mut self) {
        let mut entries = self
            .registry
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((members, _)) = entries.get_mut(&self.key) {
            *members -= 1;
            if *members == 0 {
                entries.remove(&self.key);
            }
        }
    }
}

/// What a subtask whose input ended with `rows` rows does.
enum Turn {
    /// Clusters them and hands the result on.
    Claim(Claim),
    /// Waits for the one that claimed the same number of rows.
    Wait(tokio::sync::watch::Receiver<SlotState>),
    /// The claim's outcome for as many rows as this subtask has.
    Take(Taken),
    /// Clusters its own (another number of rows was shared).
    Own,
}

/// What a subtask takes from another's clustering.
enum Taken {
    Sorted(Vec<RecordBatch>),
    AsIs,
}

impl Taken {
    fn of(state: &SlotState, rows: usize) -> Option<Taken> {
        match state {
            SlotState::Done { rows: r, batches } if *r == rows => {
                Some(Taken::Sorted(batches.clone()))
            }
            SlotState::AsIs { rows: r } if *r == rows => Some(Taken::AsIs),
            _ => None,
        }
    }
}

/// The claim on a slot; dropped unfinished, it lets the others cluster
/// their own.
struct Claim {
    slot: Arc<Slot>,
    rows: usize,
    done: bool,
}

impl Claim {
    fn finish(mut self, out: &DfResult<(Vec<RecordBatch>, bool)>) {
        let rows = self.rows;
        let state = match out {
            Ok((batches, true)) => SlotState::Done {
                rows,
                batches: batches.clone(),
            },
            Ok((_, false)) => SlotState::AsIs { rows },
            Err(_) => SlotState::Abandoned,
        };
        self.slot.0.send_replace(state);
        self.done = true;
    }
}

impl Claim {
    /// Hands the rows read for all to the others.
    fn publish(mut self, batches: Vec<RecordBatch>) {
        self.slot.0.send_replace(SlotState::Read { batches });
        self.done = true;
    }
}

/// What a subtask whose input is read once does when its join asks.
enum ReadTurn {
    /// Reads it for all.
    Lead(Claim),
    /// Waits for the one that does.
    Wait(tokio::sync::watch::Receiver<SlotState>),
    /// Takes what it read.
    Take(Vec<RecordBatch>),
    /// Reads its own (the one that read for all was cut short).
    Own,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.done {
            self.slot.0.send_replace(SlotState::Abandoned);
        }
    }
}

impl Member {
    fn read_turn(&self) -> ReadTurn {
        let mut turn = ReadTurn::Own;
        self.slot.0.send_if_modified(|state| match state {
            SlotState::Open => {
                *state = SlotState::Reading;
                turn = ReadTurn::Lead(Claim {
                    slot: Arc::clone(&self.slot),
                    rows: 0,
                    done: false,
                });
                true
            }
            SlotState::Reading => {
                turn = ReadTurn::Wait(self.slot.0.subscribe());
                false
            }
            SlotState::Read { batches } => {
                turn = ReadTurn::Take(batches.clone());
                false
            }
            _ => false,
        });
        turn
    }

    fn turn(&self, rows: usize) -> Turn {
        let mut turn = Turn::Own;
        self.slot.0.send_if_modified(|state| match state {
            SlotState::Open => {
                *state = SlotState::Claimed { rows };
                turn = Turn::Claim(Claim {
                    slot: Arc::clone(&self.slot),
                    rows,
                    done: false,
                });
                true
            }
            SlotState::Claimed { rows: r } if *r == rows => {
                turn = Turn::Wait(self.slot.0.subscribe());
                false
            }
            done => {
                if let Some(t) = Taken::of(done, rows) {
                    turn = Turn::Take(t);
                }
                false
            }
        });
        turn
    }
}

/// Its input, every row of it, with rows of equal keys adjacent when keys
/// repeat enough for that to pay (the module doc). Emits when its input
/// ended; declares no order.
#[derive(Debug)]
pub struct ClusterByKeyExec {
    input: Arc<dyn ExecutionPlan>,
    keys: Vec<Arc<dyn PhysicalExpr>>,
    /// Set where the subtasks of this process share the result.
    share: Option<Arc<Member>>,
    /// With `share`: the input is read by one subtask for all (it reads no
    /// exchange, which each subtask must drain of its own).
    read_once: bool,
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
    fn name(&self) -> &str {
        "ClusterByKeyExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

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
                .exists(|n| Ok(n.is::<crate::reuse::SharedScanExec>()))?
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
                    crate::demand::signal_first_rows(&input);
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
        .get_or_init(|| {
            let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .thread_name("fluvia-build-reader")
                .enable_all()
                .build()
                .ok()
        })
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
    if !crate::released::cut_short(&input) {
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
fn cluster(
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

/// Most buckets of the counting pass in [`order_by_hash`] (4 MiB of counts).
const MAX_BUCKET_BITS: u32 = 20;

/// Row numbers in the order of their `hashes`, as a comparison sort gives
/// them (rows of equal hashes in any order), in linear time: one counting
/// pass on the hashes' top bits, about as many buckets as rows, then each
/// bucket (the rows of one key, or of a few) sorted on its own. A
/// comparison sort of a million hashes was 40 % of clustering q14's build
/// sides.
fn order_by_hash(hashes: &[u64]) -> DfResult<Vec<u32>> {
    let n = hashes.len();
    if u32::try_from(n).is_err() {
        return Err(DataFusionError::Execution(format!(
            "a build side of {n} rows is more than a join can index"
        )));
    }
    let bits = (usize::BITS - n.leading_zeros()).clamp(1, MAX_BUCKET_BITS);
    let shift = u64::BITS - bits;
    let bucket = |h: u64| (h >> shift) as usize;
    // starts[b]..starts[b + 1]: where bucket b's rows go.
    let mut starts = vec![0u32; (1usize << bits) + 1];
    for &h in hashes {
        starts[bucket(h) + 1] += 1;
    }
    for b in 1..starts.len() {
        starts[b] += starts[b - 1];
    }
    let mut next = starts.clone();
    let mut order = vec![0u32; n];
    for (row, &h) in hashes.iter().enumerate() {
        let slot = &mut next[bucket(h)];
        order[*slot as usize] = row as u32;
        *slot += 1;
    }
    for w in starts.windows(2) {
        let rows = &mut order[w[0] as usize..w[1] as usize];
        if rows.len() > 1 {
            rows.sort_unstable_by_key(|&r| hashes[r as usize]);
        }
    }
    Ok(order)
}

/// The hash of `keys` for every row of `batch`.
fn hash_keys(batch: &RecordBatch, keys: &[Arc<dyn PhysicalExpr>]) -> DfResult<Vec<u64>> {
    hash_rows(&key_columns(batch, keys)?)
}

/// `keys` evaluated on `batch`.
fn key_columns(batch: &RecordBatch, keys: &[Arc<dyn PhysicalExpr>]) -> DfResult<Vec<ArrayRef>> {
    keys.iter()
        .map(|k| k.evaluate(batch)?.into_array(batch.num_rows()))
        .collect()
}

/// One hash per row over `columns`.
fn hash_rows(columns: &[ArrayRef]) -> DfResult<Vec<u64>> {
    let mut hashes = vec![0u64; columns.first().map_or(0, |c| c.len())];
    create_hashes(columns, &RandomState::with_seed(0), &mut hashes)?;
    Ok(hashes)
}

/// Whether every `step`-th row (about [`SAMPLE`] of the `rows`) has at
/// least [`MIN_ROWS_PER_KEY`] rows per distinct key hash. Only the sample
/// is hashed: a build side that stays as it is costs little.
fn keys_repeat(
    batches: &[RecordBatch],
    keys: &[Arc<dyn PhysicalExpr>],
    rows: usize,
) -> DfResult<bool> {
    let step = rows.div_ceil(SAMPLE).max(1);
    let mut distinct = DistinctCount::default();
    let mut sampled = 0;
    // Row number (over all batches) of the next sampled row.
    let mut next = 0;
    let mut start = 0;
    for b in batches {
        let end = start + b.num_rows();
        let picks: Vec<u32> = (next..end)
            .step_by(step)
            .map(|r| (r - start) as u32)
            .collect();
        if let Some(&last) = picks.last() {
            next = start + last as usize + step;
            let picks = UInt32Array::from(picks);
            let columns = key_columns(b, keys)?
                .iter()
                .map(|c| take(c, &picks, None))
                .collect::<std::result::Result<Vec<ArrayRef>, _>>()?;
            let hashes = hash_rows(&columns)?;
            sampled += hashes.len();
            hashes.iter().for_each(|&h| distinct.add(h));
        }
        start = end;
    }
    Ok(sampled as f64 >= MIN_ROWS_PER_KEY as f64 * distinct.estimate())
}

/// Bits of [`DistinctCount`]'s bitmap: 64 KiB, which a core's cache
/// holds, eight bits per sampled row.
const DISTINCT_BITS: u32 = 19;

/// Distinct key hashes counted the linear way (Whang et al.): each hash
/// sets one bit, and the share of bits still clear gives the count. A
/// hash set of the sample did the same exactly, at several times the cost
/// (an insert per row into half a megabyte of fresh memory), and for every
/// build side of 32K rows or more, most of which are then not sorted: the
/// decision needs the ratio of rows to keys, not the last key. With at
/// most [`SAMPLE`] hashes in 2^19 bits the count is within about 1 %.
struct DistinctCount {
    bits: Vec<u64>,
}

impl Default for DistinctCount {
    fn default() -> Self {
        DistinctCount {
            bits: vec![0; (1 << DISTINCT_BITS) / 64],
        }
    }
}

impl DistinctCount {
    fn add(&mut self, hash: u64) {
        // Mixed once more (MurmurHash3's finaliser): the count assumes
        // hashes that collide as random ones do, and the key hash of
        // consecutive integers collides less (65,536 of them counted as
        // 70,009 unmixed).
        let mut h = hash;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        let bit = (h >> (u64::BITS - DISTINCT_BITS)) as usize;
        self.bits[bit / 64] |= 1 << (bit % 64);
    }

    fn estimate(&self) -> f64 {
        let size = f64::from(1u32 << DISTINCT_BITS);
        let clear: u32 = self.bits.iter().map(|w| w.count_zeros()).sum();
        // All bits set: more keys than the bitmap can tell apart.
        if clear == 0 {
            return f64::INFINITY;
        }
        size * (size / f64::from(clear)).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::Column;

    fn batch(keys: Vec<i64>) -> RecordBatch {
        let n = keys.len();
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("row", DataType::Utf8, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(keys)),
                Arc::new(StringArray::from(
                    (0..n).map(|i| i.to_string()).collect::<Vec<_>>(),
                )),
            ],
        )
        .expect("batch")
    }

    fn key() -> Vec<Arc<dyn PhysicalExpr>> {
        vec![Arc::new(Column::new("k", 0))]
    }

    fn keys_of(b: &RecordBatch) -> &Int64Array {
        b.column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .expect("k")
    }

    /// Rows as (key, the other columns), sorted, to compare contents.
    fn contents(batches: &[RecordBatch]) -> Vec<(i64, Vec<String>)> {
        let mut out = Vec::new();
        for b in batches {
            let k = keys_of(b);
            let others: Vec<&StringArray> = b.columns()[1..]
                .iter()
                .map(|c| c.as_any().downcast_ref::<StringArray>().expect("utf8"))
                .collect();
            for i in 0..b.num_rows() {
                let rest = others.iter().map(|c| c.value(i).to_string()).collect();
                out.push((k.value(i), rest));
            }
        }
        out.sort();
        out
    }

    /// Each key's rows form one run.
    fn runs_of_one_key(batches: &[RecordBatch]) -> bool {
        let mut done = std::collections::HashSet::new();
        let mut last = None;
        for b in batches {
            let k = keys_of(b);
            for i in 0..b.num_rows() {
                let v = k.value(i);
                if last != Some(v) {
                    if !done.insert(v) {
                        return false;
                    }
                    last = Some(v);
                }
            }
        }
        true
    }

    #[test]
    fn the_distinct_count_is_within_two_percent_up_to_the_sample_size() {
        for (rows, keys) in [
            (65_536, 65_536),
            (65_536, 32_768),
            (65_536, 3_641),
            (1_000, 10),
        ] {
            let column: ArrayRef = Arc::new(Int64Array::from(
                (0..rows).map(|i| (i * 7_919) % keys).collect::<Vec<i64>>(),
            ));
            let mut distinct = DistinctCount::default();
            for h in hash_rows(&[column]).expect("hashes") {
                distinct.add(h);
            }
            let error = (distinct.estimate() - keys as f64).abs() / keys as f64;
            assert!(
                error < 0.02,
                "{keys} keys counted as {}",
                distinct.estimate()
            );
        }
    }

    #[test]
    fn repeated_keys_end_up_side_by_side_and_no_row_is_lost() {
        // 40,000 rows over 1,000 keys, interleaved: 40 rows per key.
        let input: Vec<RecordBatch> = (0..5)
            .map(|b| batch((0..8_000).map(|i| (b * 8_000 + i) % 1_000).collect()))
            .collect();
        assert!(!runs_of_one_key(&input));
        let sorted = Count::new();
        let (out, _) = cluster(input.clone(), &key(), &sorted).expect("cluster");
        assert_eq!(sorted.value(), 1);
        assert!(runs_of_one_key(&out));
        assert_eq!(contents(&out), contents(&input));
    }

    /// The metric `sorted` summed over a plan's ClusterByKeyExecs.
    fn sorted_count(plan: &Arc<dyn ExecutionPlan>) -> usize {
        let mut n = 0;
        plan.apply(|node| {
            if node.is::<ClusterByKeyExec>() {
                n += node
                    .metrics()
                    .and_then(|m| m.sum_by_name("sorted"))
                    .map_or(0, |v| v.as_usize());
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .expect("walk");
        n
    }

    #[test]
    fn a_join_over_a_clustered_build_side_returns_the_same_rows() {
        use datafusion::common::NullEquality;
        use datafusion::datasource::memory::MemorySourceConfig;
        use datafusion::logical_expr::JoinType;
        use datafusion::physical_plan::collect;
        use datafusion::physical_plan::joins::PartitionMode;

        // Build: 40,000 rows over 500 keys; probe: keys 0..1,000 twice.
        let build = batch((0..40_000).map(|i| (i * 7) % 500).collect());
        let probe = batch((0..2_000).map(|i| i % 1_000).collect());
        let scan = |b: &RecordBatch| {
            MemorySourceConfig::try_new_exec(&[vec![b.clone()]], b.schema(), None).expect("scan")
                as Arc<dyn ExecutionPlan>
        };
        // Two joins: a rewritten join keeps the build-side state of the
        // one it was made from, so that one must not have run.
        let join = || -> Arc<dyn ExecutionPlan> {
            Arc::new(
                HashJoinExec::try_new(
                    scan(&build),
                    scan(&probe),
                    vec![(key()[0].clone(), key()[0].clone())],
                    None,
                    &JoinType::Inner,
                    Some(vec![0, 1, 3]),
                    PartitionMode::CollectLeft,
                    NullEquality::NullEqualsNothing,
                    false,
                )
                .expect("join"),
            )
        };
        let clustered = cluster_build_sides(join()).expect("rewrite");
        let ctx = Arc::new(TaskContext::default());
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let plain = rt
            .block_on(collect(join(), Arc::clone(&ctx)))
            .expect("plain");
        let out = rt
            .block_on(collect(Arc::clone(&clustered), ctx))
            .expect("clustered");
        assert_eq!(sorted_count(&clustered), 1);
        // Keys 0..500 match 80 build rows each, twice over in the probe.
        assert_eq!(contents(&out).len(), 500 * 80 * 2);
        assert_eq!(contents(&out), contents(&plain));
    }

    #[test]
    fn unique_keys_keep_their_order() {
        let input = vec![batch((0..40_000).rev().collect())];
        let sorted = Count::new();
        let (out, _) = cluster(input.clone(), &key(), &sorted).expect("cluster");
        assert_eq!(sorted.value(), 0);
        assert_eq!(out, input);
    }

    /// The hashes in the order `order_by_hash` gives, and whether it is a
    /// permutation of the rows.
    fn ordered(hashes: &[u64]) -> (Vec<u64>, bool) {
        let order = order_by_hash(hashes).unwrap();
        let mut seen = vec![false; hashes.len()];
        for &r in &order {
            seen[r as usize] = true;
        }
        let all = order.len() == hashes.len() && seen.iter().all(|&s| s);
        (order.iter().map(|&r| hashes[r as usize]).collect(), all)
    }

    #[test]
    fn the_linear_order_by_hash_is_the_sorted_order_of_every_row() {
        // xorshift: spread hashes, with repeats (every value drawn 3 times),
        // a run of equal hashes and the extremes.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut hashes: Vec<u64> = (0..30_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            })
            .flat_map(|h| [h, h, h])
            .collect();
        hashes.extend([0, u64::MAX, 0, u64::MAX]);
        hashes.extend(std::iter::repeat_n(42, 1000));
        for n in [0, 1, 2, 17, hashes.len()] {
            let mut want = hashes[..n].to_vec();
            want.sort_unstable();
            let (got, permutation) = ordered(&hashes[..n]);
            assert!(permutation, "{n} rows: a row lost or repeated");
            assert_eq!(got, want, "{n} rows");
        }
    }

    #[test]
    fn small_build_sides_are_passed_through() {
        let input = vec![batch((0..1_000).map(|i| i % 3).collect())];
        let sorted = Count::new();
        let (out, _) = cluster(input.clone(), &key(), &sorted).expect("cluster");
        assert_eq!(sorted.value(), 0);
        assert_eq!(out, input);
    }

    /// A clustering of `input` (one partition) that shares its result as
    /// member of `key` in `shared`.
    fn shared_node(
        input: &[RecordBatch],
        shared: &Arc<SharedClusters>,
        slot: SlotKey,
    ) -> Arc<dyn ExecutionPlan> {
        use datafusion::datasource::memory::MemorySourceConfig;
        let scan = MemorySourceConfig::try_new_exec(&[input.to_vec()], input[0].schema(), None)
            .expect("scan");
        let mut node = ClusterByKeyExec::new(scan, key());
        node.share = Some(Arc::new(SharedClusters::join(shared, slot)));
        Arc::new(node)
    }

    fn metric(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
        plan.metrics()
            .and_then(|m| m.sum_by_name(name))
            .map_or(0, |v| v.as_usize())
    }

    fn run(plan: &Arc<dyn ExecutionPlan>) -> Vec<RecordBatch> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(datafusion::physical_plan::collect(
            Arc::clone(plan),
            Arc::new(TaskContext::default()),
        ))
        .expect("run")
    }

    fn repeating(n: i64) -> Vec<RecordBatch> {
        (0..4)
            .map(|b| batch((0..n / 4).map(|i| (b * n / 4 + i) % 1_000).collect()))
            .collect()
    }

    #[test]
    fn subtasks_with_the_same_build_rows_cluster_them_once() {
        let shared = Arc::new(SharedClusters::default());
        let input = repeating(40_000);
        let first = shared_node(&input, &shared, (3, "j0".into(), 0));
        let second = shared_node(&input, &shared, (3, "j0".into(), 0));
        let a = run(&first);
        let b = run(&second);
        assert_eq!(
            (metric(&first, "sorted"), metric(&first, "shared_taken")),
            (1, 0)
        );
        assert_eq!(
            (metric(&second, "sorted"), metric(&second, "shared_taken")),
            (0, 1)
        );
        assert!(runs_of_one_key(&b));
        assert_eq!(contents(&a), contents(&input));
        assert_eq!(contents(&b), contents(&input));
        drop((first, second));
        assert!(shared.is_empty(), "the entry outlived its subtasks' plans");
    }

    #[test]
    fn a_subtask_whose_rows_differ_in_number_clusters_its_own() {
        let shared = Arc::new(SharedClusters::default());
        let full = repeating(40_000);
        // Cut short (its join stopped reading): fewer rows.
        let cut = full[..3].to_vec();
        let first = shared_node(&cut, &shared, (3, "j0".into(), 0));
        let second = shared_node(&full, &shared, (3, "j0".into(), 0));
        run(&first);
        let b = run(&second);
        assert_eq!(metric(&second, "shared_taken"), 0);
        assert_eq!(contents(&b), contents(&full));
        // Another join of the same stage shares nothing with these.
        let other = shared_node(&cut, &shared, (3, "j1".into(), 0));
        run(&other);
        assert_eq!(metric(&other, "shared_taken"), 0);
    }

    #[test]
    fn a_claim_given_up_lets_the_waiting_subtask_cluster_its_own() {
        let shared = Arc::new(SharedClusters::default());
        let (m1, m2) = (
            SharedClusters::join(&shared, (0, "j0".into(), 0)),
            SharedClusters::join(&shared, (0, "j0".into(), 0)),
        );
        let Turn::Claim(claim) = m1.turn(10) else {
            panic!("the first subtask claims the clustering");
        };
        let Turn::Wait(mut rx) = m2.turn(10) else {
            panic!("the second waits for it");
        };
        // The claiming task was cancelled before it clustered.
        drop(claim);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let state = rt
            .block_on(rx.wait_for(|s| !matches!(s, SlotState::Claimed { .. })))
            .map(|s| s.clone())
            .expect("state");
        assert!(matches!(state, SlotState::Abandoned), "{state:?}");
        assert!(matches!(m2.turn(10), Turn::Own));
    }

    #[test]
    fn only_build_sides_of_broadcast_inputs_are_shared() {
        use crate::exchange::{ExchangeReaderExec, ReaderFacts};
        use datafusion::physical_plan::filter::FilterExec;
        use datafusion::physical_plan::union::UnionExec;
        let schema = batch(vec![1]).schema();
        let reader = |stage| -> Arc<dyn ExecutionPlan> {
            Arc::new(
                ExchangeReaderExec::new(stage, Arc::clone(&schema), 1, ReaderFacts::default())
                    .expect("reader"),
            )
        };
        let filtered = |input| -> Arc<dyn ExecutionPlan> {
            let predicate = datafusion::physical_expr::expressions::binary(
                key()[0].clone(),
                datafusion::logical_expr::Operator::Gt,
                datafusion::physical_expr::expressions::lit(0i64),
                &schema,
            )
            .expect("predicate");
            Arc::new(FilterExec::try_new(predicate, input).expect("filter"))
        };
        // Stage 1 is broadcast, stage 2 hash-partitioned.
        let builds: Vec<Arc<dyn ExecutionPlan>> = vec![
            Arc::new(ClusterByKeyExec::new(filtered(reader(1)), key())),
            Arc::new(ClusterByKeyExec::new(reader(2), key())),
            Arc::new(ClusterByKeyExec::new(
                UnionExec::try_new(vec![reader(1), reader(2)]).expect("union"),
                key(),
            )),
        ];
        let plan = UnionExec::try_new(builds).expect("union");
        let shared = Arc::new(SharedClusters::default());
        let plan = share_broadcast_builds(plan, &shared, (7, 0), &|s| s == 1, true).expect("share");
        let mut marked = Vec::new();
        plan.apply(|node| {
            if let Some(c) = node.downcast_ref::<ClusterByKeyExec>() {
                marked.push(c.share.is_some());
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .expect("walk");
        assert_eq!(marked, vec![true, false, false]);
        assert_eq!(shared.len(), 1);
    }

    /// A subtask may run other union branches than its sibling: the first
    /// clustering of one subtask's plan and of the other's read different
    /// inputs, possibly with as many rows. They must not meet.
    #[test]
    fn builds_of_other_inputs_at_the_same_place_are_not_shared() {
        use crate::exchange::{ExchangeReaderExec, ReaderFacts};
        let schema = batch(vec![1]).schema();
        let plan_reading = |stage| -> Arc<dyn ExecutionPlan> {
            let reader =
                ExchangeReaderExec::new(stage, Arc::clone(&schema), 1, ReaderFacts::default())
                    .expect("reader");
            Arc::new(ClusterByKeyExec::new(Arc::new(reader), key()))
        };
        let shared = Arc::new(SharedClusters::default());
        let broadcast = |_| true;
        let a =
            share_broadcast_builds(plan_reading(5), &shared, (9, 0), &broadcast, true).expect("a");
        let b =
            share_broadcast_builds(plan_reading(8), &shared, (9, 0), &broadcast, true).expect("b");
        assert_eq!(shared.len(), 2, "one entry per input");
        let c =
            share_broadcast_builds(plan_reading(8), &shared, (9, 0), &broadcast, true).expect("c");
        assert_eq!(shared.len(), 2, "the same input: the same entry");
        drop((a, b, c));
        assert!(shared.is_empty());
    }

    /// Unique keys are not sorted: the others keep their own rows and skip
    /// the sample, and nothing is held for them beside the joins' copies.
    #[test]
    fn a_build_side_not_worth_sorting_is_left_as_it_is_by_every_subtask() {
        let shared = Arc::new(SharedClusters::default());
        let input: Vec<RecordBatch> = (0..4)
            .map(|b| batch((b * 10_000..(b + 1) * 10_000).collect()))
            .collect();
        let first = shared_node(&input, &shared, (1, "j".into(), 0));
        let second = shared_node(&input, &shared, (1, "j".into(), 0));
        let a = run(&first);
        {
            let entries = shared.entries.lock().expect("entries");
            let (_, slot) = entries.values().next().expect("entry");
            assert!(
                matches!(*slot.0.borrow(), SlotState::AsIs { rows: 40_000 }),
                "{:?}",
                slot.0.borrow()
            );
        }
        let b = run(&second);
        assert_eq!(metric(&first, "sorted") + metric(&second, "sorted"), 0);
        assert_eq!(metric(&second, "shared_taken"), 0);
        assert_eq!(contents(&a), contents(&input));
        assert_eq!(contents(&b), contents(&input));
    }

    /// A clustering of `input` read once for the members of `slot`, its
    /// input wrapped in `wrap`.
    fn read_once_node(
        input: &[RecordBatch],
        shared: &Arc<SharedClusters>,
        slot: SlotKey,
        wrap: impl FnOnce(Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan>,
    ) -> Arc<dyn ExecutionPlan> {
        use datafusion::datasource::memory::MemorySourceConfig;
        let scan = MemorySourceConfig::try_new_exec(&[input.to_vec()], input[0].schema(), None)
            .expect("scan");
        let mut node = ClusterByKeyExec::new(wrap(scan), key());
        node.share = Some(Arc::new(SharedClusters::join(shared, slot)));
        node.read_once = true;
        Arc::new(node)
    }

    /// Counts the executions of its input (a scan opening its files).
    struct Opened(Arc<std::sync::atomic::AtomicUsize>);

    impl crate::pass_through::PassThrough for Opened {
        fn name(&self) -> &'static str {
            "OpenedExec"
        }

        fn execute(
            &self,
            input: &Arc<dyn ExecutionPlan>,
            partition: usize,
            ctx: Arc<TaskContext>,
        ) -> DfResult<SendableRecordBatchStream> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            input.execute(partition, ctx)
        }
    }

    /// The second subtask never runs its input, and what the first row of
    /// that input would have started (a probe side's scans) still starts.
    #[test]
    fn a_build_side_read_once_is_read_by_one_subtask_for_all() {
        use crate::pass_through::PassThroughExec;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let shared = Arc::new(SharedClusters::default());
        let input = repeating(40_000);
        let (opened, first_rows) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let wrap = |scan: Arc<dyn ExecutionPlan>| -> Arc<dyn ExecutionPlan> {
            let counted = Arc::new(PassThroughExec::of(scan, Opened(Arc::clone(&opened))));
            let rows = Arc::clone(&first_rows);
            Arc::new(crate::demand::FirstRowExec::new(
                counted,
                Arc::new(move || {
                    rows.fetch_add(1, Ordering::SeqCst);
                }),
            ))
        };
        let first = read_once_node(&input, &shared, (2, "j".into(), 0), wrap);
        let second = read_once_node(&input, &shared, (2, "j".into(), 0), wrap);
        let a = run(&first);
        let b = run(&second);
        assert_eq!(opened.load(Ordering::SeqCst), 1, "the input was read twice");
        assert_eq!(
            first_rows.load(Ordering::SeqCst),
            2,
            "one first row per subtask"
        );
        assert_eq!(metric(&second, "shared_taken"), 1);
        assert_eq!(contents(&a), contents(&input));
        assert_eq!(contents(&b), contents(&input));
        assert!(runs_of_one_key(&b), "the clustering is handed on");
        drop((first, second));
        assert!(shared.is_empty(), "the entry outlived its subtasks' plans");
    }

    /// The first subtask's leaf was stopped (its join needed no more): the
    /// part it read is not handed on, and the other reads all of its own.
    #[test]
    fn a_build_side_cut_short_is_not_handed_on() {
        use crate::released::{EndSignal, end_leaf_when};
        let shared = Arc::new(SharedClusters::default());
        let input = repeating(40_000);
        let stop = Arc::new(crate::exchange::ReaderStop::default());
        stop.stop();
        let first = read_once_node(&input, &shared, (2, "j".into(), 0), |scan| {
            end_leaf_when(scan, EndSignal::Stopped(Arc::clone(&stop)))
        });
        let second = read_once_node(&input, &shared, (2, "j".into(), 0), |scan| scan);
        assert!(run(&first).is_empty(), "the stopped leaf read nothing");
        let b = run(&second);
        assert_eq!(metric(&second, "shared_taken"), 0);
        assert_eq!(contents(&b), contents(&input));
    }

    /// A scan read whole is the same in every subtask unless it reads a
    /// dynamic filter that is not known to be the same everywhere.
    #[test]
    fn a_scan_is_shared_only_with_dynamic_filters_of_shared_build_sides() {
        use datafusion::physical_expr::expressions::DynamicFilterPhysicalExpr;
        use datafusion::physical_plan::filter::FilterExec;
        let schema = batch(vec![1]).schema();
        let dynamic = Arc::new(DynamicFilterPhysicalExpr::new(
            key(),
            datafusion::physical_expr::expressions::lit(true),
        ));
        let id = dynamic.expression_id().expect("a dynamic filter has an id");
        let scan = datafusion::datasource::memory::MemorySourceConfig::try_new_exec(
            &[vec![batch(vec![1, 2])]],
            Arc::clone(&schema),
            None,
        )
        .expect("scan");
        let filtered: Arc<dyn ExecutionPlan> =
            Arc::new(FilterExec::try_new(dynamic, scan).expect("filter"));
        let broadcast = |_| true;
        assert!(
            !same_in_every_subtask(&filtered, &broadcast, &HashSet::new()).expect("walk"),
            "a filter of unknown keys"
        );
        assert!(
            same_in_every_subtask(&filtered, &broadcast, &HashSet::from([id])).expect("walk"),
            "a filter of a build side the same everywhere"
        );
    }

    /// Its input's rows, after one wait (a file read), as a scan.
    struct WaitsOnce;

    impl crate::pass_through::PassThrough for WaitsOnce {
        fn name(&self) -> &'static str {
            "WaitsOnceExec"
        }

        fn execute(
            &self,
            input: &Arc<dyn ExecutionPlan>,
            partition: usize,
            ctx: Arc<TaskContext>,
        ) -> DfResult<SendableRecordBatchStream> {
            use futures::StreamExt;
            let rows = input.execute(partition, ctx)?;
            let schema = rows.schema();
            let waited = futures::stream::once(tokio::task::yield_now())
                .filter_map(|()| async { None::<DfResult<RecordBatch>> });
            Ok(Box::pin(RecordBatchStreamAdapter::new(
                schema,
                waited.chain(rows),
            )))
        }
    }

    /// The first subtask's thread blocks after the read started (as an
    /// exchange reader blocks it while waiting for data another subtask
    /// holds up): the read goes on without it, and the waiting subtask gets
    /// the rows.
    #[test]
    fn a_build_side_read_for_all_goes_on_while_the_first_subtasks_thread_is_blocked() {
        use futures::StreamExt;
        let shared = Arc::new(SharedClusters::default());
        let input = repeating(40_000);
        // A scan waits for its file read once before its rows come.
        let slow = |scan| -> Arc<dyn ExecutionPlan> {
            Arc::new(crate::pass_through::PassThroughExec::of(scan, WaitsOnce))
        };
        let first = read_once_node(&input, &shared, (4, "j".into(), 0), slow);
        let second = read_once_node(&input, &shared, (4, "j".into(), 0), slow);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let mut stream = first
            .execute(0, Arc::new(TaskContext::default()))
            .expect("stream");
        // The first poll claims the read and starts it.
        let started = rt.block_on(async { futures::poll!(stream.next()) });
        assert!(started.is_pending(), "the scan waits once");
        let (tx, rx) = std::sync::mpsc::channel();
        let waiting = std::thread::spawn(move || {
            let _ = tx.send(run(&second));
        });
        // This thread now blocks, its runtime unpolled.
        let taken = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the waiting subtask never got the rows");
        waiting.join().expect("the waiting subtask");
        assert_eq!(contents(&taken), contents(&input));
        let own: Vec<RecordBatch> = rt
            .block_on(stream.collect::<Vec<_>>())
            .into_iter()
            .collect::<DfResult<_>>()
            .expect("the first's rows");
        assert_eq!(contents(&own), contents(&input));
    }
}

//! Exchanges between plan fragments: the consumer's leaf
//! [`ExchangeReaderExec`] pulls Arrow batches out of Fluvia input channels,
//! and [`SqlBatchType`] is the record type whose network output writes them
//! as Arrow IPC into Fluvia result partitions.
//!
//! A reader blocks its task thread while it waits for a buffer. That is
//! sound because each task drives its fragment on its own current-thread
//! runtime and every input comes from another task: nothing this thread
//! could run instead can make the data arrive.

use crate::exec::pass_through::plan_basics;
use crate::formats::ipc::{self, IpcEncoder};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{
    AcrossPartitions, ConstExpr, EquivalenceProperties, LexOrdering, Partitioning, PhysicalExpr,
};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use fluvia_core::{FluviaError, PartitionerKind, Result};
use fluvia_network::metrics::IoCounters;
use fluvia_network::{
    CancelToken, ChannelSelector, ConsumersReleased, InputChannelSpec, InputGate, PartitionWriter,
    RecordBytes, Target,
};
use fluvia_runtime::input::{DataOutput, InputStatus, StreamInputProcessor};
use fluvia_runtime::operator::{AnyOutput, NetworkInput, downcast_output};
use fluvia_runtime::output::{BroadcastingOutput, DiscardingOutput, Output};
use fluvia_runtime::{InputStats, RecordType};
use futures::Stream;
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// A batch travelling between operators. `target` is the consumer subtask
/// chosen by the producing fragment's partitioner (None: the edge decides).
#[derive(Clone, Debug)]
pub struct SqlBatch {
    pub batch: RecordBatch,
    pub target: Option<usize>,
    /// The stage that produced it, in a task of several stages (each
    /// writes to its own edge); `None`: every edge takes it.
    pub output: Option<usize>,
}

/// The edge data of a SQL edge: the stage whose batches it carries.
#[derive(Debug, Clone, Copy)]
pub struct OutputOf(pub usize);

/// What a reader knows about its rows beyond the schema: facts that hold
/// for every row survive any exchange (equalities between columns, values
/// constant in all partitions), and a HASH edge's rows are hash-partitioned
/// on the producer's keys. Orderings do not survive a merge of channels.
#[derive(Debug, Clone, Default)]
pub struct ReaderFacts {
    pub hash: Option<Vec<Arc<dyn PhysicalExpr>>>,
    pub constants: Vec<Arc<dyn PhysicalExpr>>,
    pub classes: Vec<Vec<Arc<dyn PhysicalExpr>>>,
    /// Kept only over a one-to-one edge.
    pub ordering: Option<LexOrdering>,
}

impl ReaderFacts {
    /// The facts of a producer's output.
    pub fn of(producer: &Arc<dyn ExecutionPlan>, hash: Option<Vec<Arc<dyn PhysicalExpr>>>) -> Self {
        let mut eq = producer.equivalence_properties().clone();
        eq.clear_per_partition_constants();
        let constants = eq.constants().into_iter().map(|c| c.expr).collect();
        let classes = eq
            .eq_group()
            .iter()
            .filter(|c| c.len() > 1)
            .map(|c| c.iter().cloned().collect())
            .collect();
        ReaderFacts {
            hash,
            constants,
            classes,
            ordering: None,
        }
    }

    /// The facts of a producer whose subtask `i` feeds consumer subtask `i`.
    pub fn forwarded(producer: &Arc<dyn ExecutionPlan>) -> Self {
        let hash = match producer.output_partitioning() {
            Partitioning::Hash(exprs, _) => Some(exprs.clone()),
            _ => None,
        };
        let mut facts = Self::of(producer, hash);
        facts.ordering = producer.output_ordering().cloned();
        facts
    }
}

/// The leaf that stands for a cut-off producer fragment.
#[derive(Debug)]
pub struct ExchangeReaderExec {
    /// Id of the producing stage.
    stage: usize,
    schema: SchemaRef,
    partitions: usize,
    facts: ReaderFacts,
    props: Arc<PlanProperties>,
    /// Signals that end this reader early (task-local, never encoded).
    stops: Vec<Arc<ReaderStop>>,
}

/// A signal that ends the exchange readers it was given to: a waiting
/// reader wakes, releases its channels and ends its stream. Set by an
/// operator that learnt it needs no more of those inputs while they were
/// still being read (a join whose probe side came out empty stops the
/// readers of its build side).
#[derive(Default)]
pub struct ReaderStop {
    stopped: std::sync::atomic::AtomicBool,
    wakers: Mutex<Vec<Arc<dyn Fn() + Send + Sync>>>,
}

impl fmt::Debug for ReaderStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReaderStop")
            .field("stopped", &self.is_stopped())
            .finish()
    }
}

impl ReaderStop {
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Ends every reader given this signal, waking those that wait.
    pub fn stop(&self) {
        self.stopped
            .store(true, std::sync::atomic::Ordering::Release);
        let wakers = lock(&self.wakers).clone();
        for wake in wakers {
            wake();
        }
    }

    /// Calls `wake` when the signal is set (at once if it is).
    pub fn watch(&self, wake: Arc<dyn Fn() + Send + Sync>) {
        lock(&self.wakers).push(Arc::clone(&wake));
        if self.is_stopped() {
            wake();
        }
    }
}

/// A mutex's guard, poisoned or not: poisoned only if a poll panicked,
/// which already failed the task.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ExchangeReaderExec {
    pub fn new(
        stage: usize,
        schema: SchemaRef,
        partitions: usize,
        facts: ReaderFacts,
    ) -> DfResult<Self> {
        let mut eq = EquivalenceProperties::new(Arc::clone(&schema));
        eq.add_constants(
            facts
                .constants
                .iter()
                .map(|e| ConstExpr::new(Arc::clone(e), AcrossPartitions::Uniform(None))),
        )?;
        for class in &facts.classes {
            for pair in class.windows(2) {
                eq.add_equal_conditions(Arc::clone(&pair[0]), Arc::clone(&pair[1]))?;
            }
        }
        if let Some(ordering) = &facts.ordering {
            eq.add_ordering(ordering.iter().cloned());
        }
        let partitioning = match &facts.hash {
            Some(exprs) => Partitioning::Hash(exprs.clone(), partitions),
            None => Partitioning::UnknownPartitioning(partitions),
        };
        let props = PlanProperties::new(
            eq,
            partitioning,
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(ExchangeReaderExec {
            stage,
            schema,
            partitions,
            facts,
            props: Arc::new(props),
            stops: Vec::new(),
        })
    }

    /// This reader, also ended by `stop`.
    pub fn with_stop(&self, stop: Arc<ReaderStop>) -> Self {
        let mut stops = self.stops.clone();
        stops.push(stop);
        ExchangeReaderExec {
            stage: self.stage,
            schema: Arc::clone(&self.schema),
            partitions: self.partitions,
            facts: self.facts.clone(),
            props: Arc::clone(&self.props),
            stops,
        }
    }

    pub fn stage(&self) -> usize {
        self.stage
    }

    pub fn partitions(&self) -> usize {
        self.partitions
    }

    pub fn facts(&self) -> &ReaderFacts {
        &self.facts
    }
}

impl DisplayAs for ExchangeReaderExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "ExchangeReaderExec: stage={}, partitions={}",
            self.stage, self.partitions
        )
    }
}

impl ExecutionPlan for ExchangeReaderExec {
    plan_basics!(|this| "ExchangeReaderExec", &this.props, [], no_expressions);

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        _partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let inputs = ctx
            .session_config()
            .get_extension::<TaskInputs>()
            .ok_or_else(|| {
                DataFusionError::Internal(
                    "an exchange reader ran outside a Fluvia task".to_string(),
                )
            })?;
        let gate = InputGate::new(inputs.take(self.stage)?);
        if let Some(r) = inputs.released.get() {
            r.watch(gate.waker());
        }
        for stop in &self.stops {
            stop.watch(gate.waker());
        }
        let input = StreamInputProcessor::new(gate)
            .with_owned_records(true)
            .with_counters(Arc::clone(&inputs.counters));
        let stream = GateStream {
            stops: self.stops.clone(),
            input: Some(input),
            pending: VecDeque::new(),
            schema: Arc::clone(&self.schema),
            inputs: Arc::clone(&inputs),
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        )))
    }
}

/// The input channels of one subtask, by producing stage, handed to the
/// readers of its fragment (each stage's channels once).
pub struct TaskInputs {
    channels: Mutex<BTreeMap<usize, Vec<InputChannelSpec>>>,
    /// Every channel by producing stage, to demand a stage's data before
    /// its reader first polls ([`crate::exec::demand`]).
    by_stage: BTreeMap<usize, Vec<Arc<dyn fluvia_network::InputChannel>>>,
    /// Inputs no longer needed are released (`table.exec.release-unread-inputs`)
    /// rather than read to their end.
    release_unread: bool,
    /// Set once the task knows its outputs: when every consumer of them
    /// released its input, readers stop waiting and end.
    released: std::sync::OnceLock<ConsumersReleased>,
    pub cancel: CancelToken,
    counters: Arc<IoCounters>,
    stats: Mutex<InputStats>,
}

impl fmt::Debug for TaskInputs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskInputs").finish_non_exhaustive()
    }
}

impl TaskInputs {
    pub fn new(
        channels: BTreeMap<usize, Vec<InputChannelSpec>>,
        release_unread: bool,
        cancel: CancelToken,
        counters: Arc<IoCounters>,
    ) -> Self {
        let by_stage = channels
            .iter()
            .map(|(&s, specs)| (s, specs.iter().map(|c| Arc::clone(&c.channel)).collect()))
            .collect();
        TaskInputs {
            by_stage,
            channels: Mutex::new(channels),
            release_unread,
            released: std::sync::OnceLock::new(),
            cancel,
            counters,
            stats: Mutex::new(InputStats::default()),
        }
    }

    /// Tells the producers of `stage` that this task will read them (a scan
    /// waiting for demand starts).
    pub fn demand_stage(&self, stage: usize) {
        for c in self.by_stage.get(&stage).into_iter().flatten() {
            c.demand();
        }
    }

    fn take(&self, stage: usize) -> DfResult<Vec<InputChannelSpec>> {
        let mut map = self
            .channels
            .lock()
            .map_err(|_| DataFusionError::Internal("task inputs poisoned".into()))?;
        map.remove(&stage).ok_or_else(|| {
            DataFusionError::Internal(format!(
                "the input from stage {stage} was read twice or never connected"
            ))
        })
    }

    /// Releases (or with `table.exec.release-unread-inputs` off, reads to
    /// the end) every input no reader took (the other branches of a union,
    /// the probe side of a join whose build side was empty), so producers
    /// are never left waiting, and returns what all readers read.
    pub fn finish(&self) -> Result<InputStats> {
        let rest: Vec<InputChannelSpec> = match self.channels.lock() {
            Ok(mut m) => std::mem::take(&mut *m).into_values().flatten().collect(),
            Err(_) => Vec::new(),
        };
        self.close_unread(rest)?;
        Ok(self.stats.lock().map(|s| *s).unwrap_or_default())
    }

    /// Releases at once the inputs of every stage not in `read` (those of
    /// the other branches of a union, which this subtask never runs), so a
    /// pipelined producer feeding several branches never waits for a
    /// subtask that will not read it. Without `table.exec.release-unread-inputs`
    /// they are left to [`finish`](Self::finish).
    pub fn release_unread_stages(&self, read: &std::collections::BTreeSet<usize>) -> Result<()> {
        if !self.release_unread {
            return Ok(());
        }
        let unread: Vec<InputChannelSpec> = match self.channels.lock() {
            Ok(mut m) => {
                let (unread, kept): (BTreeMap<_, _>, BTreeMap<_, _>) = std::mem::take(&mut *m)
                    .into_iter()
                    .partition(|(stage, _)| !read.contains(stage));
                *m = kept;
                unread.into_values().flatten().collect()
            }
            Err(_) => Vec::new(),
        };
        self.close_unread(unread)
    }

    /// Releases (or reads to the end) channels no reader took, counting
    /// what they delivered.
    fn close_unread(&self, channels: Vec<InputChannelSpec>) -> Result<()> {
        if channels.is_empty() {
            return Ok(());
        }
        let mut gate = InputGate::new(channels);
        self.release_or_drain(&mut gate)?;
        self.add_gate(&gate);
        Ok(())
    }

    /// Readers end, releasing their channels, once `released` says nobody
    /// reads what this task produces.
    pub fn stop_when_released(&self, released: ConsumersReleased) {
        let _ = self.released.set(released);
    }

    fn stopped(&self) -> bool {
        self.released.get().is_some_and(|r| r.all())
    }

    fn release_or_drain(&self, gate: &mut InputGate) -> Result<()> {
        if self.release_unread {
            gate.release();
        } else {
            while gate.get_next(&self.cancel)?.is_some() {}
        }
        Ok(())
    }

    fn add_gate(&self, gate: &InputGate) {
        if let Ok(mut s) = self.stats.lock() {
            s.bytes += gate.bytes_received();
            s.buffers += gate.buffers_received();
        }
    }
}

struct GateStream {
    /// Reads the stage's channels; `None` once it ended.
    input: Option<StreamInputProcessor>,
    stops: Vec<Arc<ReaderStop>>,
    pending: VecDeque<RecordBatch>,
    schema: SchemaRef,
    inputs: Arc<TaskInputs>,
}

fn external(e: FluviaError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// Decodes the records the input processor hands over into batches.
struct BatchDecoder<'a> {
    schema: &'a SchemaRef,
    pending: &'a mut VecDeque<RecordBatch>,
}

impl DataOutput for BatchDecoder<'_> {
    fn emit_record(&mut self, _input: usize, record: RecordBytes<'_>) -> Result<()> {
        let batch = ipc::decode_record(record, self.schema)
            .map_err(|e| FluviaError::Serialization(format!("decoding an exchange batch: {e}")))?;
        self.pending.push_back(batch);
        Ok(())
    }
}

impl GateStream {
    fn next_event(&mut self) -> Result<bool> {
        let Some(input) = self.input.as_mut() else {
            return Ok(false);
        };
        let (inputs, stops) = (&self.inputs, &self.stops);
        let stopped = || inputs.stopped() || stops.iter().any(|s| s.is_stopped());
        if stopped() {
            // Nobody reads this task's output any more.
            input.gate_mut().release();
            self.finish_gate();
            return Ok(false);
        }
        let before = input.records_in();
        let mut out = BatchDecoder {
            schema: &self.schema,
            pending: &mut self.pending,
        };
        let status = input.process_blocking(&mut out, &inputs.cancel, &stopped)?;
        if let Ok(mut s) = self.inputs.stats.lock() {
            s.records += input.records_in() - before;
        }
        match status {
            // A stop is seen at the next call.
            InputStatus::MoreAvailable | InputStatus::NothingAvailable => Ok(true),
            InputStatus::EndOfInput => {
                self.finish_gate();
                Ok(false)
            }
        }
    }

    fn finish_gate(&mut self) {
        if let Some(input) = self.input.take() {
            self.inputs.add_gate(input.gate());
        }
    }
}

impl Stream for GateStream {
    type Item = DfResult<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(b) = self.pending.pop_front() {
                return Poll::Ready(Some(Ok(b)));
            }
            match self.next_event() {
                Ok(true) => continue,
                Ok(false) => return Poll::Ready(None),
                Err(e) => {
                    self.finish_gate();
                    return Poll::Ready(Some(Err(external(e))));
                }
            }
        }
    }
}

impl Drop for GateStream {
    /// A reader dropped before its end (a LIMIT was satisfied, a join's
    /// build side was empty) releases (or reads to the end) its channels,
    /// so no producer waits on it.
    fn drop(&mut self) {
        if let Some(input) = self.input.as_mut() {
            let _ = self.inputs.release_or_drain(input.gate_mut());
        }
        self.finish_gate();
    }
}

// ---------------------------------------------------------------- record type

/// The record type of SQL edges: Arrow batches of one schema.
pub struct SqlBatchType {
    pub schema: SchemaRef,
}

impl RecordType for SqlBatchType {
    fn type_name(&self) -> &'static str {
        "SqlBatch"
    }

    fn network_input(&self, input: AnyOutput) -> Result<Box<dyn NetworkInput>> {
        Ok(Box::new(DecodingInput {
            inner: downcast_output::<SqlBatch>(input)?,
            schema: Arc::clone(&self.schema),
        }))
    }

    fn network_output(
        &self,
        writer: Rc<RefCell<PartitionWriter>>,
        selector: ChannelSelector,
        edge_data: Option<&Arc<dyn std::any::Any + Send + Sync>>,
    ) -> Result<AnyOutput> {
        let out: Box<dyn Output<SqlBatch>> = Box::new(IpcOutput {
            takes: edge_data
                .and_then(|d| d.downcast_ref::<OutputOf>())
                .map(|o| o.0),
            writer,
            broadcast: selector.kind() == PartitionerKind::Broadcast,
            encoder: IpcEncoder::default(),
        });
        Ok(Box::new(out))
    }

    fn broadcasting(&self, outputs: Vec<AnyOutput>) -> Result<AnyOutput> {
        let outputs = outputs
            .into_iter()
            .map(downcast_output::<SqlBatch>)
            .collect::<Result<Vec<_>>>()?;
        let out: Box<dyn Output<SqlBatch>> = Box::new(BroadcastingOutput { outputs });
        Ok(Box::new(out))
    }

    fn discarding(&self) -> AnyOutput {
        let out: Box<dyn Output<SqlBatch>> = Box::new(DiscardingOutput);
        Box::new(out)
    }

    fn side_output(
        &self,
        _output: AnyOutput,
    ) -> Result<Box<dyn fluvia_runtime::output::SideOutput>> {
        Err(FluviaError::Plan(
            "a SQL plan fragment has no side outputs".to_string(),
        ))
    }
}

struct DecodingInput {
    inner: Box<dyn Output<SqlBatch>>,
    schema: SchemaRef,
}

impl NetworkInput for DecodingInput {
    fn process(&mut self, _input: usize, bytes: &[u8]) -> Result<()> {
        let batch = ipc::decode(bytes, &self.schema)
            .map_err(|e| FluviaError::Serialization(format!("decoding an exchange batch: {e}")))?;
        self.inner.collect(SqlBatch {
            batch,
            target: None,
            output: None,
        })
    }

    fn end_input(&mut self, _input: usize) -> Result<()> {
        self.inner.close()
    }

    fn checkpoint(
        &mut self,
        barrier: &fluvia_network::CheckpointBarrier,
        snapshot: &mut fluvia_runtime::checkpoint::ChainSnapshot,
    ) -> Result<()> {
        self.inner.checkpoint(barrier, snapshot)
    }

    fn notify_checkpoint(&mut self, id: u64, complete: bool) -> Result<()> {
        self.inner.notify_checkpoint(id, complete)
    }
}

/// Writes batches as Arrow IPC records: a broadcast batch is encoded once
/// for all subpartitions; others go to the subtask the producer chose.
struct IpcOutput {
    /// The stage whose batches this edge carries.
    takes: Option<usize>,
    writer: Rc<RefCell<PartitionWriter>>,
    broadcast: bool,
    encoder: IpcEncoder,
}

impl Output<SqlBatch> for IpcOutput {
    fn collect(&mut self, record: SqlBatch) -> Result<()> {
        if record.batch.num_rows() == 0 {
            return Ok(());
        }
        if let (Some(takes), Some(from)) = (self.takes, record.output)
            && takes != from
        {
            return Ok(());
        }
        let target = if self.broadcast {
            Target::All
        } else {
            Target::One(record.target.unwrap_or(0))
        };
        for piece in ipc::exchange_pieces(&record.batch) {
            let parts = self.encoder.encode_parts(&piece).map_err(|e| {
                FluviaError::Serialization(format!("encoding an exchange batch: {e}"))
            })?;
            self.writer.borrow_mut().emit_parts(target, &parts)?;
        }
        Ok(())
    }

    fn close(&mut self) -> Result<()> {
        Ok(())
    }

    fn consumers_released(&self) -> Option<ConsumersReleased> {
        self.writer.borrow().consumers_released()
    }
}

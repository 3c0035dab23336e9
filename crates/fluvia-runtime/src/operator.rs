//! Operators: the typed traits user code implements, the drivers that run
//! them inside a chain, and the type-erased [`OperatorFactory`] through which
//! a task builds its chain from a closure-free JobVertex.
//!
//! Type erasure happens only while a chain is built (once per task): outputs
//! travel as `Box<dyn Any>` holding a `Box<dyn Output<T>>` and are downcast
//! to the operator's concrete record type. Per record, a chained hand-over is
//! one virtual call.

use crate::checkpoint::ChainSnapshot;
use crate::mailbox::TaskMail;
use crate::output::{
    BroadcastingOutput, Collector, DiscardingOutput, KeyHasher, Output, RecordWriterOutput,
    SideOutput, SideOutputs, TypedSideOutput, set_current_operator,
};
use crate::record::{Data, decode};
use crate::state::{StateInitializationContext, StateSnapshotContext};
use fluvia_core::error::TaskLocation;
use fluvia_core::keygroup::key_group_range_for_operator;
use fluvia_core::{FluviaError, Result};
use fluvia_network::metrics::IoCounters;
use fluvia_network::{
    CancelToken, ChannelSelector, CheckpointBarrier, InputChannelSpec, PartitionWriter,
};
use std::any::Any;
use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;

/// The error a user function returns.
pub type UserError = Box<dyn std::error::Error + Send + Sync>;

/// A `Box<dyn Output<T>>` with `T` erased.
pub type AnyOutput = Box<dyn Any>;

/// What an operator instance knows about where it runs.
#[derive(Debug, Clone)]
pub struct OperatorContext {
    pub task_name: String,
    pub operator_name: String,
    /// Position in the chain (0 = head).
    pub operator_index: usize,
    pub subtask_index: usize,
    pub parallelism: usize,
    pub max_parallelism: usize,
    pub attempt_number: u32,
    /// Whether the job runs in BATCH mode (operators may emit only at the end).
    pub batch: bool,
    pub object_reuse: bool,
    /// The operator is fed through a chained edge with object reuse off:
    /// its driver hands it a copy of each record (Flink's
    /// `CopyingChainingOutput`, done on the receiving side to save a call).
    pub copy_input: bool,
    /// Key groups handed by the scheduler (ranges balanced by bytes need
    /// not match the even split the parallelism gives).
    pub key_groups: Option<(usize, usize)>,
    /// How often the job takes checkpoints (`execution.checkpointing.interval`;
    /// none: it takes no periodic ones). Sinks that commit on checkpoints
    /// (Flink's Sink V2 with a committer) need them to commit at all.
    pub checkpoint_interval: Option<std::time::Duration>,
    pub(crate) records_in: Rc<Cell<u64>>,
    /// Named results of the task, shipped to the client in its final report
    /// (shared by every operator of the chain).
    pub(crate) accumulators: Accumulators,
    /// Files the chain writes under attempt-private names.
    pub(crate) staged: StagedFiles,
    /// Where this operator's events to its coordinator go.
    pub(crate) coordinator: Option<crate::mailbox::CoordinatorGateway>,
    /// The state this subtask's operator restores (its share of a
    /// checkpoint or savepoint), if it restores any.
    pub(crate) restored: Option<Arc<crate::state::OperatorStateSnapshot>>,
}

pub use fluvia_deployment::StagedFile;

/// The attempt-private files of a task (see [`OperatorContext::stage_file`]).
pub type StagedFiles = Arc<std::sync::Mutex<Vec<fluvia_deployment::StagedFile>>>;

/// The hidden name attempt `attempt` writes a file named `name` under,
/// beside it: `.<name>.attempt-<n>.<unique>.inprogress` (unique across
/// processes and jobs writing the same path).
pub fn staged_name(name: &str, attempt: u32) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        ".{name}.attempt-{attempt}.{:x}{:x}{:x}.inprogress",
        std::process::id(),
        nanos,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Where a task's operators leave named results for the client (Flink's
/// accumulators; `collect()` sends its records this way).
pub type Accumulators = Rc<RefCell<Vec<(String, Vec<u8>)>>>;

impl OperatorContext {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        task_name: impl Into<String>,
        operator_name: impl Into<String>,
        operator_index: usize,
        subtask_index: usize,
        parallelism: usize,
        max_parallelism: usize,
        attempt_number: u32,
        batch: bool,
        object_reuse: bool,
    ) -> Self {
        OperatorContext {
            task_name: task_name.into(),
            operator_name: operator_name.into(),
            operator_index,
            subtask_index,
            parallelism,
            max_parallelism,
            attempt_number,
            batch,
            object_reuse,
            copy_input: false,
            key_groups: None,
            checkpoint_interval: None,
            records_in: Rc::new(Cell::new(0)),
            accumulators: Rc::new(RefCell::new(Vec::new())),
            staged: StagedFiles::default(),
            coordinator: None,
            restored: None,
        }
    }

    /// Sends `event` to this operator's coordinator on the JobManager
    /// (Flink's `OperatorEventGateway`); what it answers arrives through
    /// the operator's `handle_operator_event`.
    pub fn send_operator_event(&self, event: Vec<u8>) -> Result<()> {
        let gateway = self.coordinator.as_ref().ok_or_else(|| {
            FluviaError::Execution(format!(
                "operator '{}' sent an event to its coordinator, but this task has no route to the JobManager",
                self.operator_name
            ))
        })?;
        (gateway.0)(self.operator_index, event)
    }

    /// Where this attempt writes the file `target`: a hidden file beside it
    /// ([`staged_name`]) that gets the name `target` only if this attempt
    /// wins and the job finishes, so two attempts of a subtask
    /// (speculation, a restart) never both show up in the output (Flink's
    /// in-progress part files). Removed if the attempt fails, is cancelled
    /// or loses.
    pub fn stage_file(&self, target: &std::path::Path) -> Result<std::path::PathBuf> {
        let name = target.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
            FluviaError::Config(format!(
                "output path '{}' has no file name of UTF-8 characters",
                target.display()
            ))
        })?;
        let pending = target.with_file_name(staged_name(name, self.attempt_number));
        let utf8 = |p: &std::path::Path| {
            p.to_str().map(str::to_string).ok_or_else(|| {
                FluviaError::Config(format!("output path '{}' is not UTF-8", p.display()))
            })
        };
        let file = fluvia_deployment::StagedFile {
            pending: utf8(&pending)?,
            target: utf8(target)?,
        };
        self.staged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(file);
        Ok(pending)
    }

    /// The task's list of staged files, for writers that name their files
    /// themselves on other threads (SQL's `COPY ... TO`): what they add is
    /// committed or removed like [`stage_file`](Self::stage_file)'s.
    pub fn staged_files(&self) -> StagedFiles {
        Arc::clone(&self.staged)
    }

    /// The task's accumulators: what an operator adds there reaches the
    /// client with the attempt's final report (only the winning attempt's
    /// count).
    pub fn accumulators(&self) -> Accumulators {
        Rc::clone(&self.accumulators)
    }

    /// Inclusive range of key groups this subtask owns.
    pub fn key_group_range(&self) -> (usize, usize) {
        if let Some(range) = self.key_groups {
            return range;
        }
        key_group_range_for_operator(self.max_parallelism, self.parallelism, self.subtask_index)
    }

    pub fn location(&self) -> TaskLocation {
        TaskLocation {
            task: self.task_name.clone(),
            operator: self.operator_name.clone(),
            subtask_index: self.subtask_index,
            parallelism: self.parallelism,
        }
    }

    /// Attributes a user function's error to this operator and subtask.
    pub fn user_error(&self, e: UserError) -> FluviaError {
        FluviaError::Task {
            location: self.location(),
            message: e.to_string(),
        }
    }

    /// What `initialize_state` sees: the key groups this subtask owns and
    /// nothing restored (restoring comes with checkpoints).
    pub fn state_initialization(&self) -> StateInitializationContext {
        StateInitializationContext::new(self.key_group_range(), self.restored.as_deref().cloned())
    }

    /// Records this operator received (or, for a source, emitted).
    pub fn records_in(&self) -> u64 {
        self.records_in.get()
    }
}

/// Whether a source has more to emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceStatus {
    MoreAvailable,
    /// Nothing to emit now (an unbounded source waiting for data): the task
    /// thread runs its mailbox and polls again once woken
    /// ([`MailboxSender::wake`](crate::MailboxSender::wake)) or after a
    /// short wait.
    NothingAvailable,
    End,
}

/// The lifecycle hooks every operator trait shares (Flink's
/// `StreamOperator`), written once; each defaults to nothing.
macro_rules! lifecycle_hooks {
    (with_input) => {
        lifecycle_hooks!();
        /// Event time advanced to `watermark`; by default it is forwarded.
        /// Operators with event-time timers fire them here first.
        fn process_watermark(
            &mut self,
            watermark: i64,
            out: &mut Collector<'_, OUT>,
        ) -> Result<(), UserError> {
            out.emit_watermark(watermark);
            Ok(())
        }
    };
    () => {
        /// Called once before [`open`](Self::open), with the state this
        /// subtask restores from (empty on a fresh start).
        fn initialize_state(
            &mut self,
            _ctx: &mut StateInitializationContext,
        ) -> Result<(), UserError> {
            Ok(())
        }
        /// A barrier is about to be sent downstream: emit what must precede it
        /// (Flink's `prepareSnapshotPreBarrier`).
        fn prepare_snapshot_pre_barrier(
            &mut self,
            _checkpoint_id: u64,
            _out: &mut Collector<'_, OUT>,
        ) -> Result<(), UserError> {
            Ok(())
        }
        /// Writes this operator's state for checkpoint `ctx.checkpoint_id`.
        fn snapshot_state(&mut self, _ctx: &mut StateSnapshotContext) -> Result<(), UserError> {
            Ok(())
        }
        /// Checkpoint `id` completed everywhere: side effects it covers may be
        /// committed.
        fn notify_checkpoint_complete(&mut self, _id: u64) -> Result<(), UserError> {
            Ok(())
        }
        /// Checkpoint `id` was given up.
        fn notify_checkpoint_aborted(&mut self, _id: u64) -> Result<(), UserError> {
            Ok(())
        }
        /// Called once before processing starts.
        fn open(&mut self, _ctx: &OperatorContext) -> Result<(), UserError> {
            Ok(())
        }
        /// Releases resources, after the last record or on failure.
        fn close(&mut self) -> Result<(), UserError> {
            Ok(())
        }
    };
}

/// A source: polled until it says [`SourceStatus::End`]. Each poll may emit
/// any number of records; keeping polls short keeps cancellation prompt and
/// lets the task thread run its mailbox in between.
///
/// Every operator kind follows Flink's `StreamOperator` lifecycle:
/// `initialize_state` (restore), `open`, processing (records, watermarks),
/// `prepare_snapshot_pre_barrier` and `snapshot_state` at a checkpoint,
/// `notify_checkpoint_complete` / `_aborted`, `end_input`, then `close`.
/// Only the processing method is required.
pub trait SourceOperator<OUT>: 'static {
    lifecycle_hooks!();
    fn poll_next(&mut self, out: &mut Collector<'_, OUT>) -> Result<SourceStatus, UserError>;
    /// An event from this source's coordinator (FLIP-27: splits to read).
    fn handle_operator_event(&mut self, _event: &[u8]) -> Result<(), UserError> {
        Ok(())
    }
}

/// An operator with one input (lifecycle as [`SourceOperator`]'s).
pub trait OneInputOperator<IN, OUT>: 'static {
    lifecycle_hooks!(with_input);
    fn process_element(
        &mut self,
        record: IN,
        out: &mut Collector<'_, OUT>,
    ) -> Result<(), UserError>;
    /// All input has arrived (the place for batch operators to emit).
    fn end_input(&mut self, _out: &mut Collector<'_, OUT>) -> Result<(), UserError> {
        Ok(())
    }
}

/// An operator with two inputs (`connect`; lifecycle as
/// [`SourceOperator`]'s). Its watermark is the minimum of its inputs'.
pub trait TwoInputOperator<IN1, IN2, OUT>: 'static {
    lifecycle_hooks!(with_input);
    fn process_element1(
        &mut self,
        record: IN1,
        out: &mut Collector<'_, OUT>,
    ) -> Result<(), UserError>;
    fn process_element2(
        &mut self,
        record: IN2,
        out: &mut Collector<'_, OUT>,
    ) -> Result<(), UserError>;
    /// Input 1 or 2 has ended.
    fn end_input(&mut self, _input: usize, _out: &mut Collector<'_, OUT>) -> Result<(), UserError> {
        Ok(())
    }
}

/// Runs a chain headed by a source, yielding to the task's mailbox between
/// polls.
pub trait SourceDriver {
    fn run(
        &mut self,
        cancel: &CancelToken,
        mailbox: &crate::Mailbox,
        control: &mut crate::TaskControl<'_>,
    ) -> Result<()>;
}

/// Feeds encoded records from the network into a chain's head.
pub trait NetworkInput {
    /// One encoded record for logical input `input` (0, or 1/2).
    fn process(&mut self, input: usize, bytes: &[u8]) -> Result<()>;
    /// Every channel of `input` has ended.
    fn end_input(&mut self, input: usize) -> Result<()>;
    /// The task's combined watermark advanced. Operators without event
    /// time ignore it.
    fn process_watermark(&mut self, _watermark: i64) -> Result<()> {
        Ok(())
    }
    /// The barrier of a checkpoint arrived on every input (as its
    /// alignment asks): the chain takes its snapshot (see
    /// [`Output::checkpoint`]).
    fn checkpoint(
        &mut self,
        barrier: &CheckpointBarrier,
        snapshot: &mut ChainSnapshot,
    ) -> Result<()>;
    /// Checkpoint `id` completed (`true`) or was aborted.
    fn notify_checkpoint(&mut self, id: u64, complete: bool) -> Result<()>;
}

/// What a [`TaskDriver`] read from the network.
#[derive(Debug, Clone, Copy, Default)]
pub struct InputStats {
    pub records: u64,
    pub bytes: u64,
    pub buffers: u64,
}

/// A chain head that owns its input loop: it pulls from its channels in the
/// order it needs them (a hash join reads its build side before its probe
/// side) instead of being pushed records. SQL plan fragments are drivers.
pub trait TaskDriver {
    /// Runs to the end of input; `inputs` are all channels of the subtask,
    /// each tagged with its logical input.
    fn run(
        &mut self,
        inputs: Vec<InputChannelSpec>,
        counters: &Arc<IoCounters>,
        cancel: &CancelToken,
    ) -> Result<InputStats>;
}

/// A created operator, as the task needs it.
pub enum OperatorInstance {
    Source(Box<dyn SourceDriver>),
    /// The operator's input side, a `Box<dyn Output<IN>>`, with IN's type.
    OneInput {
        input: AnyOutput,
        input_type: Arc<dyn RecordType>,
    },
    TwoInput(Box<dyn NetworkInput>),
    /// A head that reads its own inputs (it may also have none).
    Driver(Box<dyn TaskDriver>),
}

/// Builds the per-subtask instance of one StreamGraph node.
pub trait OperatorFactory: Send + Sync {
    /// Creates the operator wired to `output` (a `Box<dyn Output<OUT>>`) and
    /// opens it.
    fn create(&self, ctx: &OperatorContext, output: AnyOutput) -> Result<OperatorInstance>;
    /// As [`OperatorFactory::create`], with the consumers of the operator's
    /// side outputs. Operators that cannot emit side outputs refuse any.
    fn create_with_side_outputs(
        &self,
        ctx: &OperatorContext,
        output: AnyOutput,
        side_outputs: SideOutputs,
    ) -> Result<OperatorInstance> {
        if side_outputs.is_empty() {
            self.create(ctx, output)
        } else {
            Err(FluviaError::Plan(format!(
                "operator '{}' has no side outputs to read",
                ctx.operator_name
            )))
        }
    }
    /// The type of the records it emits.
    fn output_type(&self) -> Arc<dyn RecordType>;
    /// Checks made before the job runs (e.g. input files exist).
    fn validate(&self) -> Result<()> {
        Ok(())
    }
}

/// Everything the runtime must do with records of one Rust type without
/// knowing it.
pub trait RecordType: Send + Sync {
    fn type_name(&self) -> &'static str;
    /// Wraps a head's `Box<dyn Output<T>>` into a decoder fed from the network.
    fn network_input(&self, input: AnyOutput) -> Result<Box<dyn NetworkInput>>;
    /// A non-chained output writing to `writer`.
    fn network_output(
        &self,
        writer: Rc<RefCell<PartitionWriter>>,
        selector: ChannelSelector,
        key_hasher: Option<&Arc<dyn Any + Send + Sync>>,
    ) -> Result<AnyOutput>;
    fn broadcasting(&self, outputs: Vec<AnyOutput>) -> Result<AnyOutput>;
    fn discarding(&self) -> AnyOutput;
    /// Wraps a `Box<dyn Output<T>>` as a side output of records `T`.
    fn side_output(&self, output: AnyOutput) -> Result<Box<dyn SideOutput>>;
}

/// [`RecordType`] of `T`.
pub struct TypeOf<T>(PhantomData<fn() -> T>);

/// The erased record type of `T`.
pub fn record_type<T: Data>() -> Arc<dyn RecordType> {
    Arc::new(TypeOf::<T>(PhantomData))
}

/// Recovers a typed output from its erased form.
pub fn downcast_output<T: 'static>(output: AnyOutput) -> Result<Box<dyn Output<T>>> {
    output
        .downcast::<Box<dyn Output<T>>>()
        .map(|b| *b)
        .map_err(|_| {
            FluviaError::Internal(format!(
                "chain type mismatch: expected an output of {}",
                std::any::type_name::<T>()
            ))
        })
}

fn erase<T: 'static>(output: Box<dyn Output<T>>) -> AnyOutput {
    Box::new(output)
}

impl<T: Data> RecordType for TypeOf<T> {
    fn type_name(&self) -> &'static str {
        std::any::type_name::<T>()
    }

    fn network_input(&self, input: AnyOutput) -> Result<Box<dyn NetworkInput>> {
        Ok(Box::new(DecodingInput {
            inner: downcast_output::<T>(input)?,
        }))
    }

    fn network_output(
        &self,
        writer: Rc<RefCell<PartitionWriter>>,
        selector: ChannelSelector,
        key_hasher: Option<&Arc<dyn Any + Send + Sync>>,
    ) -> Result<AnyOutput> {
        let hasher = match key_hasher {
            None => None,
            Some(h) => Some(h.downcast_ref::<KeyHasher<T>>().cloned().ok_or_else(|| {
                FluviaError::Internal(format!(
                    "key selector does not take {}",
                    std::any::type_name::<T>()
                ))
            })?),
        };
        Ok(erase::<T>(Box::new(RecordWriterOutput::new(
            writer, selector, hasher,
        )?)))
    }

    fn broadcasting(&self, outputs: Vec<AnyOutput>) -> Result<AnyOutput> {
        let outputs = outputs
            .into_iter()
            .map(downcast_output::<T>)
            .collect::<Result<Vec<_>>>()?;
        Ok(erase::<T>(Box::new(BroadcastingOutput { outputs })))
    }

    fn discarding(&self) -> AnyOutput {
        erase::<T>(Box::new(DiscardingOutput))
    }

    fn side_output(&self, output: AnyOutput) -> Result<Box<dyn SideOutput>> {
        Ok(Box::new(TypedSideOutput(downcast_output::<T>(output)?)))
    }
}

struct DecodingInput<T> {
    inner: Box<dyn Output<T>>,
}

impl<T: Data> NetworkInput for DecodingInput<T> {
    #[inline]
    fn process(&mut self, _input: usize, bytes: &[u8]) -> Result<()> {
        self.inner.collect(decode(bytes)?)
    }
    fn end_input(&mut self, _input: usize) -> Result<()> {
        self.inner.close()
    }
    fn process_watermark(&mut self, watermark: i64) -> Result<()> {
        self.inner.emit_watermark(watermark)
    }
    fn checkpoint(
        &mut self,
        barrier: &CheckpointBarrier,
        snapshot: &mut ChainSnapshot,
    ) -> Result<()> {
        self.inner.checkpoint(barrier, snapshot)
    }
    fn notify_checkpoint(&mut self, id: u64, complete: bool) -> Result<()> {
        self.inner.notify_checkpoint(id, complete)
    }
}

// ---------------------------------------------------------------- drivers

/// Reports a user function's outcome: a downstream failure (already
/// attributed) wins over the function's own result.
fn settle<T, O>(
    ctx: &OperatorContext,
    collector: &mut Collector<'_, O>,
    result: Result<T, UserError>,
) -> Result<T> {
    if let Some(e) = collector.take_error() {
        return Err(e);
    }
    result.map_err(|e| ctx.user_error(e))
}

/// Marks the driver's operator as the one running user code and returns
/// a collector to its outputs.
macro_rules! enter {
    ($self:ident) => {{
        set_current_operator($self.ctx.operator_index);
        Collector::with_side_outputs(&mut *$self.out, &mut $self.side, $self.ctx.operator_index)
    }};
}

/// A driver's checkpoint and watermark methods (see `checkpoint_driver!`,
/// `notify_driver!`), the same in every driver; `$watermark` names the
/// trait's watermark method.
macro_rules! driver_control {
    ($watermark:ident) => {
        fn $watermark(&mut self, watermark: i64) -> Result<()> {
            let mut c = enter!(self);
            let r = self.op.process_watermark(watermark, &mut c);
            settle(&self.ctx, &mut c, r)
        }

        fn checkpoint(
            &mut self,
            barrier: &CheckpointBarrier,
            snapshot: &mut ChainSnapshot,
        ) -> Result<()> {
            checkpoint_driver!(self, barrier, snapshot)
        }

        fn notify_checkpoint(&mut self, id: u64, complete: bool) -> Result<()> {
            notify_driver!(self, id, complete)
        }
    };
}

/// A checkpoint passes a driver: its operator emits what precedes the
/// barrier, the barrier goes on through the operator's outputs (to the
/// network at the chain's end), then the operator's state is snapshotted.
/// Inside a chain nothing is in flight, so the order of the snapshots of
/// the chain's operators does not matter.
macro_rules! checkpoint_driver {
    ($self:ident, $barrier:ident, $snapshot:ident) => {{
        let index = $self.ctx.operator_index;
        let mut c = enter!($self);
        let r = $self.op.prepare_snapshot_pre_barrier($barrier.id, &mut c);
        settle(&$self.ctx, &mut c, r)?;
        $self.side.checkpoint($barrier, $snapshot)?;
        $self.out.checkpoint($barrier, $snapshot)?;
        let mut state = StateSnapshotContext {
            checkpoint_id: $barrier.id,
            ..Default::default()
        };
        set_current_operator(index);
        $self
            .op
            .snapshot_state(&mut state)
            .map_err(|e| $self.ctx.user_error(e))?;
        $snapshot.add(index, state);
        Ok(())
    }};
}

/// Tells a driver's operator, then everything behind it, that checkpoint
/// `id` completed or was aborted.
macro_rules! notify_driver {
    ($self:ident, $id:ident, $complete:ident) => {{
        set_current_operator($self.ctx.operator_index);
        let r = if $complete {
            $self.op.notify_checkpoint_complete($id)
        } else {
            $self.op.notify_checkpoint_aborted($id)
        };
        r.map_err(|e| $self.ctx.user_error(e))?;
        $self.side.notify_checkpoint($id, $complete)?;
        $self.out.notify_checkpoint($id, $complete)
    }};
}

struct SourceDriverImpl<OUT> {
    op: Box<dyn SourceOperator<OUT>>,
    out: Box<dyn Output<OUT>>,
    side: SideOutputs,
    ctx: OperatorContext,
    /// A stop-with-savepoint's barrier went out: emit nothing more; end
    /// when it completes.
    stopping_at: Option<u64>,
    /// The savepoint completed: the source ends.
    stopped: bool,
}

impl<OUT: Data> SourceDriverImpl<OUT> {
    fn on_mail(&mut self, control: &mut crate::TaskControl<'_>, mail: TaskMail) -> Result<()> {
        let index = self.ctx.operator_index;
        match mail {
            TaskMail::OperatorEvent { operator, event } => {
                if operator != index {
                    return Err(FluviaError::Internal(format!(
                        "operator event for operator {operator} reached the source '{}'",
                        self.ctx.operator_name
                    )));
                }
                set_current_operator(index);
                self.op
                    .handle_operator_event(&event)
                    .map_err(|e| self.ctx.user_error(e))
            }
            TaskMail::TriggerCheckpoint(barrier) => self.trigger(control, &barrier),
            TaskMail::TriggerSynchronousSavepoint(barrier) => {
                self.trigger(control, &barrier)?;
                self.stopping_at = Some(barrier.id);
                Ok(())
            }
            TaskMail::NotifyCheckpoint { id, complete } => {
                if self.stopping_at == Some(id) {
                    self.stopping_at = None;
                    self.stopped = complete;
                }
                notify_driver!(self, id, complete)
            }
        }
    }

    /// Takes the chain's snapshot for `barrier` and hands it to the task's
    /// checkpointing. A source that stops for a savepoint takes no later
    /// checkpoint (nothing follows its savepoint).
    fn trigger(
        &mut self,
        control: &mut crate::TaskControl<'_>,
        barrier: &CheckpointBarrier,
    ) -> Result<()> {
        let Some(checkpoints) = control.checkpoints() else {
            tracing::warn!(
                "checkpoint {} triggered at '{}', which takes no checkpoints",
                barrier.id,
                self.ctx.task_name
            );
            return Ok(());
        };
        if let Some(savepoint) = self.stopping_at {
            checkpoints.decline(
                barrier.id,
                format!("the source stops after savepoint {savepoint}"),
            );
            return Ok(());
        }
        let started = std::time::Instant::now();
        let mut snapshot = ChainSnapshot::new(barrier.id);
        self.checkpoint(barrier, &mut snapshot)?;
        let metrics = fluvia_deployment::SubtaskCheckpointMetrics {
            start_delay_ms: crate::checkpoint::millis_since(barrier.timestamp),
            ..Default::default()
        };
        checkpoints.complete_sync(snapshot, metrics, started)
    }

    fn checkpoint(
        &mut self,
        barrier: &CheckpointBarrier,
        snapshot: &mut ChainSnapshot,
    ) -> Result<()> {
        checkpoint_driver!(self, barrier, snapshot)
    }
}

impl<OUT: Data> SourceDriver for SourceDriverImpl<OUT> {
    fn run(
        &mut self,
        cancel: &CancelToken,
        mailbox: &crate::Mailbox,
        control: &mut crate::TaskControl<'_>,
    ) -> Result<()> {
        let index = self.ctx.operator_index;
        let mut idle = false;
        loop {
            if cancel.is_cancelled() {
                return Err(FluviaError::Cancelled);
            }
            if mailbox.has_mail() {
                mailbox.run_pending(control, &mut |control, mail| self.on_mail(control, mail))?;
                idle = false;
            }
            if self.stopped {
                break;
            }
            if self.stopping_at.is_some() {
                // After a stop-with-savepoint's barrier nothing is emitted:
                // wait for its outcome.
                control.wait_idle(mailbox, fluvia_network::cancel::CANCEL_POLL)?;
                continue;
            }
            if idle {
                // Nothing to emit: hand over what is buffered and wait for
                // mail (an operator event with splits) or a wake-up, then
                // run that mail before polling again.
                control.wait_idle(mailbox, fluvia_network::cancel::CANCEL_POLL)?;
                idle = false;
                continue;
            }
            set_current_operator(index);
            let mut c = Collector::with_side_outputs(&mut *self.out, &mut self.side, index);
            let status = self.op.poll_next(&mut c);
            self.ctx
                .records_in
                .set(self.ctx.records_in.get() + c.emitted());
            match settle(&self.ctx, &mut c, status)? {
                SourceStatus::End => break,
                SourceStatus::NothingAvailable => idle = true,
                SourceStatus::MoreAvailable => idle = false,
            }
        }
        let r = self.op.close();
        let mut c = Collector::with_side_outputs(&mut *self.out, &mut self.side, index);
        settle(&self.ctx, &mut c, r)?;
        self.side.close()?;
        self.out.close()
    }
}

struct OneInputDriver<IN, OUT> {
    op: Box<dyn OneInputOperator<IN, OUT>>,
    out: Box<dyn Output<OUT>>,
    side: SideOutputs,
    ctx: OperatorContext,
}

impl<IN: Clone + 'static, OUT: 'static> Output<IN> for OneInputDriver<IN, OUT> {
    #[inline]
    fn collect(&mut self, record: IN) -> Result<()> {
        let record = if self.ctx.copy_input {
            record.clone()
        } else {
            record
        };
        let index = self.ctx.operator_index;
        self.ctx.records_in.set(self.ctx.records_in.get() + 1);
        set_current_operator(index);
        let mut c = Collector::with_side_outputs(&mut *self.out, &mut self.side, index);
        let r = self.op.process_element(record, &mut c);
        settle(&self.ctx, &mut c, r)
    }

    fn close(&mut self) -> Result<()> {
        let mut c = enter!(self);
        let r = self.op.end_input(&mut c);
        settle(&self.ctx, &mut c, r)?;
        let r = self.op.close();
        settle(&self.ctx, &mut c, r)?;
        self.side.close()?;
        self.out.close()
    }

    driver_control!(emit_watermark);
}

struct TwoInputDriver<IN1, IN2, OUT> {
    op: Box<dyn TwoInputOperator<IN1, IN2, OUT>>,
    out: Box<dyn Output<OUT>>,
    side: SideOutputs,
    ctx: OperatorContext,
    ended: [bool; 2],
}

impl<IN1: Data, IN2: Data, OUT: 'static> NetworkInput for TwoInputDriver<IN1, IN2, OUT> {
    fn process(&mut self, input: usize, bytes: &[u8]) -> Result<()> {
        let index = self.ctx.operator_index;
        self.ctx.records_in.set(self.ctx.records_in.get() + 1);
        match input {
            1 => {
                let rec: IN1 = decode(bytes)?;
                set_current_operator(index);
                let mut c = Collector::with_side_outputs(&mut *self.out, &mut self.side, index);
                let r = self.op.process_element1(rec, &mut c);
                settle(&self.ctx, &mut c, r)
            }
            2 => {
                let rec: IN2 = decode(bytes)?;
                set_current_operator(index);
                let mut c = Collector::with_side_outputs(&mut *self.out, &mut self.side, index);
                let r = self.op.process_element2(rec, &mut c);
                settle(&self.ctx, &mut c, r)
            }
            other => Err(FluviaError::Internal(format!(
                "two-input operator '{}' got input {other}",
                self.ctx.operator_name
            ))),
        }
    }

    fn end_input(&mut self, input: usize) -> Result<()> {
        if !(1..=2).contains(&input) || self.ended[input - 1] {
            return Ok(());
        }
        self.ended[input - 1] = true;
        let mut c = enter!(self);
        let r = self.op.end_input(input, &mut c);
        settle(&self.ctx, &mut c, r)?;
        if self.ended == [true, true] {
            let r = self.op.close();
            settle(&self.ctx, &mut c, r)?;
            self.side.close()?;
            self.out.close()?;
        }
        Ok(())
    }

    driver_control!(process_watermark);
}

// ---------------------------------------------------------------- factories

type Validator = Box<dyn Fn() -> Result<()> + Send + Sync>;
type MakeSource<OUT> =
    Box<dyn Fn(&OperatorContext) -> Result<Box<dyn SourceOperator<OUT>>, UserError> + Send + Sync>;
type MakeOneInput<IN, OUT> = Box<
    dyn Fn(&OperatorContext) -> Result<Box<dyn OneInputOperator<IN, OUT>>, UserError> + Send + Sync,
>;
type MakeTwoInput<IN1, IN2, OUT> = Box<
    dyn Fn(&OperatorContext) -> Result<Box<dyn TwoInputOperator<IN1, IN2, OUT>>, UserError>
        + Send
        + Sync,
>;

/// Makes a subtask's operator and takes it through `initialize_state` and
/// `open`, attributing a failure to it.
macro_rules! start_operator {
    ($make:expr, $ctx:expr) => {{
        set_current_operator($ctx.operator_index);
        let mut op = ($make)($ctx).map_err(|e| $ctx.user_error(e))?;
        op.initialize_state(&mut $ctx.state_initialization())
            .map_err(|e| $ctx.user_error(e))?;
        op.open($ctx).map_err(|e| $ctx.user_error(e))?;
        op
    }};
}

/// The [`OperatorFactory`] of a typed factory: `create` without side
/// outputs, `output_type` from `OUT`, and `create_with_side_outputs` making
/// the operator and wrapping it, with its output, side outputs and context,
/// into the instance `$instance` builds.
macro_rules! typed_factory {
    (
        impl<$($g:ident),+> $factory:ty => $out_ty:ident;
        |$op:ident, $out:ident, $side:ident, $ctx:ident| $instance:expr
        $(; $extra:item)*
    ) => {
        impl<$($g: Data),+> OperatorFactory for $factory {
            fn create(&self, ctx: &OperatorContext, output: AnyOutput) -> Result<OperatorInstance> {
                self.create_with_side_outputs(ctx, output, SideOutputs::default())
            }

            fn create_with_side_outputs(
                &self,
                $ctx: &OperatorContext,
                output: AnyOutput,
                $side: SideOutputs,
            ) -> Result<OperatorInstance> {
                let $out = downcast_output::<$out_ty>(output)?;
                let $op = start_operator!(self.make, $ctx);
                Ok($instance)
            }

            fn output_type(&self) -> Arc<dyn RecordType> {
                record_type::<$out_ty>()
            }

            $($extra)*
        }
    };
}

/// Factory of a source emitting `OUT`.
pub struct SourceFactory<OUT> {
    make: MakeSource<OUT>,
    validate: Option<Validator>,
}

impl<OUT: Data> SourceFactory<OUT> {
    pub fn new(
        make: impl Fn(&OperatorContext) -> Result<Box<dyn SourceOperator<OUT>>, UserError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        SourceFactory {
            make: Box::new(make),
            validate: None,
        }
    }

    pub fn with_validation(mut self, v: impl Fn() -> Result<()> + Send + Sync + 'static) -> Self {
        self.validate = Some(Box::new(v));
        self
    }
}

typed_factory! {
    impl<OUT> SourceFactory<OUT> => OUT;
    |op, out, side, ctx| OperatorInstance::Source(Box::new(SourceDriverImpl {
        op,
        out,
        side,
        ctx: ctx.clone(),
        stopping_at: None,
        stopped: false,
    }));
    fn validate(&self) -> Result<()> {
        self.validate.as_ref().map_or(Ok(()), |v| v())
    }
}

/// Factory of a one-input operator.
pub struct OneInputFactory<IN, OUT> {
    make: MakeOneInput<IN, OUT>,
}

impl<IN: Data, OUT: Data> OneInputFactory<IN, OUT> {
    pub fn new(
        make: impl Fn(&OperatorContext) -> Result<Box<dyn OneInputOperator<IN, OUT>>, UserError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        OneInputFactory {
            make: Box::new(make),
        }
    }
}

typed_factory! {
    impl<IN, OUT> OneInputFactory<IN, OUT> => OUT;
    |op, out, side, ctx| {
        let driver: Box<dyn Output<IN>> = Box::new(OneInputDriver {
            op,
            out,
            side,
            ctx: ctx.clone(),
        });
        OperatorInstance::OneInput {
            input: Box::new(driver),
            input_type: record_type::<IN>(),
        }
    }
}

/// Factory of a two-input operator.
pub struct TwoInputFactory<IN1, IN2, OUT> {
    make: MakeTwoInput<IN1, IN2, OUT>,
}

impl<IN1: Data, IN2: Data, OUT: Data> TwoInputFactory<IN1, IN2, OUT> {
    pub fn new(
        make: impl Fn(&OperatorContext) -> Result<Box<dyn TwoInputOperator<IN1, IN2, OUT>>, UserError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        TwoInputFactory {
            make: Box::new(make),
        }
    }
}

typed_factory! {
    impl<IN1, IN2, OUT> TwoInputFactory<IN1, IN2, OUT> => OUT;
    |op, out, side, ctx| OperatorInstance::TwoInput(Box::new(TwoInputDriver {
        op,
        out,
        side,
        ctx: ctx.clone(),
        ended: [false, false],
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::mailbox::{Mail, Mailbox, TaskControl};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    /// A source that emits as fast as it can until told to stop.
    struct Busy {
        emitted: Arc<AtomicU64>,
        stop: Arc<AtomicBool>,
    }

    impl SourceOperator<u64> for Busy {
        fn poll_next(&mut self, out: &mut Collector<'_, u64>) -> Result<SourceStatus, UserError> {
            if self.stop.load(Ordering::Acquire) {
                return Ok(SourceStatus::End);
            }
            for _ in 0..16 {
                out.collect(self.emitted.fetch_add(1, Ordering::Relaxed));
            }
            Ok(SourceStatus::MoreAvailable)
        }
    }

    /// Mail sent from another thread while a source is busy runs on the
    /// task thread, between two of the source's polls.
    #[test]
    fn mail_runs_on_the_task_thread_between_polls_of_a_busy_source() {
        let (emitted, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (e, s) = (Arc::clone(&emitted), Arc::clone(&stop));
        let factory = SourceFactory::<u64>::new(move |_| {
            Ok(Box::new(Busy {
                emitted: Arc::clone(&e),
                stop: Arc::clone(&s),
            }))
        });
        let mailbox = Mailbox::new();
        let sender = mailbox.sender();
        let seen = Arc::new(std::sync::Mutex::new(None));
        let (seen2, emitted2, stop2) = (Arc::clone(&seen), Arc::clone(&emitted), Arc::clone(&stop));
        let task = std::thread::spawn(move || {
            // Operators are built on their task thread.
            let ctx = OperatorContext::new("t", "busy", 0, 0, 1, 128, 0, false, false);
            let OperatorInstance::Source(mut driver) = factory
                .create(&ctx, record_type::<u64>().discarding())
                .unwrap()
            else {
                panic!("not a source");
            };
            let id = std::thread::current().id();
            driver
                .run(&CancelToken::new(), &mailbox, &mut TaskControl::new(&[]))
                .unwrap();
            (id, emitted2.load(Ordering::Relaxed))
        });
        // Let the source run, then ask it from here.
        while emitted.load(Ordering::Relaxed) < 10_000 {
            std::thread::yield_now();
        }
        sender
            .send(Mail::new("stop", move |_| {
                let at = emitted.load(Ordering::Relaxed);
                *seen2.lock().unwrap() = Some((std::thread::current().id(), at));
                stop2.store(true, Ordering::Release);
                Ok(())
            }))
            .unwrap();
        let (task_thread, total) = task.join().unwrap();
        let (ran_on, at) = seen.lock().unwrap().unwrap();
        assert_eq!(ran_on, task_thread, "the mail ran on the task thread");
        assert!(at >= 10_000, "it ran while the source was busy");
        assert_eq!(at % 16, 0, "between two polls, not inside one");
        assert_eq!(total, at, "the source ended at the next poll");
    }
}

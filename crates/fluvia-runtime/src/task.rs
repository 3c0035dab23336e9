//! One subtask: build the OperatorChain, run it, report metrics.
//!
//! The chain is built tail first (an operator needs its outputs before it can
//! be created), so operators are opened tail to head as in Flink. A chained
//! edge is a direct call; with object reuse off the receiving operator gets
//! a copy. Each non-chained output writes through its own [`PartitionWriter`].
//!
//! The input loop reads through the [`StreamInputProcessor`], which
//! deserialises records and pushes them into the head, and handles events.
//! Before it blocks on an empty gate it flushes every output, so partly
//! filled buffers never wait on our own idleness. Between input buffers (and
//! between a source's polls) the task thread runs its [`Mailbox`].

use crate::checkpoint::{ChainSnapshot, SubtaskCheckpointCoordinator, TaskCheckpointing};
use crate::input::{DataOutput, InputStatus, StreamInputProcessor};
use crate::mailbox::{Mailbox, TaskControl, TaskMail};
use crate::operator::{AnyOutput, NetworkInput, OperatorContext, OperatorInstance, RecordType};
use crate::output::SideOutputs;
use crate::registry::OperatorRegistry;
use crate::state::OperatorStateSnapshot;
use fluvia_core::config::options;
use fluvia_core::error::TaskLocation;
use fluvia_core::{FluviaError, PartitionerKind, Result};
use fluvia_deployment::checkpoint::StateLocation;
use fluvia_deployment::{AttemptMetrics, SubtaskCheckpointMetrics, TaskDeploymentDescriptor};
use fluvia_graph::{JobGraph, JobVertex, NetworkOutput};
use fluvia_network::metrics::IoCounters;
use fluvia_network::{
    AlignmentType, CancelToken, ChannelSelector, CheckpointBarrier, Event, InputChannelSpec,
    InputGate, LocalBufferPool, PartitionWriter, RecordBytes, ResultPartition,
};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

/// One produced data set of the subtask: where to write and how to route.
pub struct OutputSpec {
    pub partition: Arc<ResultPartition>,
    pub pool: Arc<LocalBufferPool>,
    pub partitioner: PartitionerKind,
    /// Max parallelism of the consumer (key groups of a HASH edge).
    pub consumer_max_parallelism: usize,
}

/// Everything one subtask needs, movable to its thread: the scheduler's
/// descriptor (which attempt, its parallelism and key groups) and the
/// resources the TaskManager made from it.
pub struct TaskDeployment {
    pub job: Arc<JobGraph>,
    /// As the scheduler decided it (parallelism and key groups included,
    /// not the JobGraph's defaults).
    pub descriptor: TaskDeploymentDescriptor,
    pub registry: Arc<OperatorRegistry>,
    pub inputs: Vec<InputChannelSpec>,
    /// Indexed like the vertex's produced data sets.
    pub outputs: Vec<OutputSpec>,
    pub cancel: CancelToken,
    pub flush_epoch: Arc<AtomicU64>,
    /// Live I/O counters, registered in the metric registry.
    pub counters: Arc<IoCounters>,
    /// Where other threads leave work for the task thread.
    pub mailbox: Mailbox,
    /// Where operator events to the job's coordinators go (none in a
    /// process without a JobManager connection).
    pub coordinator_gateway: Option<crate::mailbox::CoordinatorGateway>,
    /// How the task takes part in checkpoints (none: the job takes none).
    pub checkpointing: Option<TaskCheckpointing>,
}

impl TaskDeployment {
    pub fn vertex(&self) -> &JobVertex {
        &self.job.vertices[self.descriptor.attempt.vertex]
    }

    pub fn subtask_index(&self) -> usize {
        self.descriptor.attempt.subtask
    }

    pub fn parallelism(&self) -> usize {
        self.descriptor.parallelism
    }

    /// `Name (i/p)` as Flink prints task names.
    pub fn task_name(&self) -> String {
        let v = self.vertex();
        format!(
            "{} ({}/{})",
            v.name,
            self.subtask_index() + 1,
            self.parallelism()
        )
    }

    /// Where a failure with no better attribution happened: the operator that
    /// last ran user code on this thread.
    pub fn location_of(&self, operator_index: usize) -> TaskLocation {
        let v = self.vertex();
        let op = v
            .operators
            .get(operator_index)
            .map_or_else(|| v.head().name.clone(), |o| o.name.clone());
        TaskLocation {
            task: v.name.clone(),
            operator: op,
            subtask_index: self.subtask_index(),
            parallelism: self.parallelism(),
        }
    }
}

struct ChainBuilder<'a> {
    d: &'a TaskDeployment,
    contexts: Vec<OperatorContext>,
    writers: Vec<Rc<RefCell<PartitionWriter>>>,
}

impl ChainBuilder<'_> {
    /// The output of operator `op` (a `Box<dyn Output<OUT>>`, erased).
    fn build_output(&self, op: usize) -> Result<AnyOutput> {
        let chained = &self.d.vertex().operators[op];
        let factory = self.d.registry.factory(chained.node_id)?;
        self.build_edges(
            &factory.output_type(),
            &chained.chained_outputs,
            &chained.network_outputs,
        )
    }

    /// The consumers of operator `op`'s side outputs, by tag.
    fn build_side_outputs(&self, op: usize) -> Result<SideOutputs> {
        let chained = &self.d.vertex().operators[op];
        let mut side = SideOutputs::default();
        for s in &chained.side_outputs {
            let record_type = self.d.registry.side_output_type(chained.node_id, &s.tag)?;
            let out = self.build_edges(record_type, &s.chained_outputs, &s.network_outputs)?;
            side.insert(s.tag.clone(), record_type.side_output(out)?);
        }
        Ok(side)
    }

    /// One output of records `out_type` feeding `chained` operators and
    /// `network` outputs (a broadcast over all of them where several).
    fn build_edges(
        &self,
        out_type: &Arc<dyn RecordType>,
        chained: &[usize],
        network: &[NetworkOutput],
    ) -> Result<AnyOutput> {
        let mut outs: Vec<AnyOutput> = Vec::new();
        for &child in chained {
            outs.push(self.build_chained(child)?);
        }
        for net in network {
            let spec = &self.d.outputs[net.data_set];
            let mut selector = ChannelSelector::new(
                spec.partitioner,
                spec.partition.num_subpartitions(),
                spec.consumer_max_parallelism,
                (self.d.subtask_index() as u64) << 32 | net.data_set as u64,
            );
            let config = &self.d.job.config;
            if config.get(&options::ADAPTIVE_PARTITIONER)? {
                let traverse = config.get(&options::ADAPTIVE_PARTITIONER_TRAVERSE)?;
                selector = selector.load_aware(Arc::clone(&spec.partition), traverse);
            }
            outs.push(out_type.network_output(
                Rc::clone(&self.writers[net.data_set]),
                selector,
                self.d.registry.key_hasher(net.stream_edge),
            )?);
        }
        Ok(match outs.len() {
            0 => out_type.discarding(),
            1 => outs.pop().unwrap_or_else(|| out_type.discarding()),
            _ => out_type.broadcasting(outs)?,
        })
    }

    /// A chained (non-head) operator, returned as its input side.
    fn build_chained(&self, op: usize) -> Result<AnyOutput> {
        let output = self.build_output(op)?;
        let side = self.build_side_outputs(op)?;
        let node = self.d.vertex().operators[op].node_id;
        match self.d.registry.factory(node)?.create_with_side_outputs(
            &self.contexts[op],
            output,
            side,
        )? {
            OperatorInstance::OneInput { input, .. } => Ok(input),
            _ => Err(FluviaError::Internal(format!(
                "operator '{}' cannot be chained: only one-input operators follow a chain head",
                self.contexts[op].operator_name
            ))),
        }
    }
}

/// Runs one subtask, catching a panicking user function,
/// and makes sure every failure names the operator and subtask (the
/// operator that last ran user code on this thread).
pub fn run_task_attributed(d: &TaskDeployment) -> Result<AttemptMetrics> {
    let staged = crate::operator::StagedFiles::default();
    // The thread may have run another task before (a pool's).
    crate::output::set_current_operator(0);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_task(d, &staged)));
    // Mail that comes too late is refused; what is queued will not run.
    let dropped = d.mailbox.close();
    if !dropped.is_empty() {
        tracing::debug!(
            "{}: {} mail(s) left at the end",
            d.task_name(),
            dropped.len()
        );
    }
    if !matches!(outcome, Ok(Ok(_))) {
        // What a failed or cancelled attempt wrote is never committed.
        let files = std::mem::take(&mut *staged.lock().unwrap_or_else(|e| e.into_inner()));
        files.iter().for_each(discard_staged_file);
    }
    let location = || d.location_of(crate::output::current_operator());
    match outcome {
        Ok(Ok(m)) => Ok(m),
        Ok(Err(e @ (FluviaError::Task { .. } | FluviaError::Cancelled))) => Err(e),
        Ok(Err(other)) => Err(FluviaError::Task {
            location: location(),
            message: other.to_string(),
        }),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(FluviaError::Task {
                location: location(),
                message: format!("user function panicked: {message}"),
            })
        }
    }
}

/// Removes an attempt-private file that will not be committed.
pub fn discard_staged_file(f: &fluvia_deployment::StagedFile) {
    match std::fs::remove_file(&f.pending) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("removing the uncommitted file {}: {e}", f.pending),
    }
}

/// Runs one subtask to completion; the files it stages are listed in
/// `staged` as they are created.
fn run_task(d: &TaskDeployment, staged: &crate::operator::StagedFiles) -> Result<AttemptMetrics> {
    let v = d.vertex();
    let task_name = d.task_name();
    let batch = d.job.job_type == fluvia_graph::JobType::Batch;
    let accumulators: crate::operator::Accumulators = Default::default();
    let mut restored = restored_state(d)?.into_iter();
    let checkpoint_interval = if batch || d.checkpointing.is_none() {
        None
    } else {
        Some(
            d.job
                .config
                .get(&fluvia_core::config::options::CHECKPOINTING_INTERVAL)?,
        )
        .filter(|i| !i.is_zero())
    };
    let contexts: Vec<OperatorContext> = v
        .operators
        .iter()
        .enumerate()
        .map(|(i, op)| {
            let mut ctx = OperatorContext::new(
                task_name.clone(),
                op.name.clone(),
                i,
                d.subtask_index(),
                d.parallelism(),
                d.descriptor.max_parallelism,
                d.descriptor.attempt.attempt,
                batch,
                d.job.object_reuse,
            );
            ctx.key_groups = d.descriptor.key_group_range.map(|r| (r.start, r.end));
            ctx.checkpoint_interval = checkpoint_interval;
            // Every operator but the head is fed through a chained edge.
            ctx.copy_input = i > 0 && !d.job.object_reuse;
            ctx.accumulators = std::rc::Rc::clone(&accumulators);
            ctx.staged = Arc::clone(staged);
            ctx.coordinator = d.coordinator_gateway.clone();
            ctx.restored = restored.next().flatten().map(Arc::new);
            ctx
        })
        .collect();
    let writers: Vec<Rc<RefCell<PartitionWriter>>> = d
        .outputs
        .iter()
        .map(|o| {
            Rc::new(RefCell::new(
                PartitionWriter::new(
                    Arc::clone(&o.partition),
                    Arc::clone(&o.pool),
                    d.cancel.clone(),
                    Some(Arc::clone(&d.flush_epoch)),
                )
                .with_counters(Arc::clone(&d.counters)),
            ))
        })
        .collect();
    let builder = ChainBuilder {
        d,
        contexts,
        writers,
    };

    let head_output = builder.build_output(0)?;
    let head_factory = d.registry.factory(v.head().node_id)?;
    let head_side = builder.build_side_outputs(0)?;
    let head =
        head_factory.create_with_side_outputs(&builder.contexts[0], head_output, head_side)?;
    let mut metrics = AttemptMetrics::default();
    let mut checkpoints = d.checkpointing.clone().map(|services| {
        SubtaskCheckpointCoordinator::new(
            services,
            d.descriptor.attempt,
            v.operators.iter().map(|o| o.operator_id.clone()).collect(),
            Some(builder.contexts[0].key_group_range()),
        )
    });
    match head {
        OperatorInstance::Source(mut driver) => {
            if !d.inputs.is_empty() {
                return Err(FluviaError::Internal(format!(
                    "source task {task_name} has inputs"
                )));
            }
            let mut control = TaskControl::new(&builder.writers)
                .with_counters(&d.counters)
                .with_checkpoints(checkpoints.as_mut());
            driver.run(&d.cancel, &d.mailbox, &mut control)?;
        }
        OperatorInstance::OneInput { input, input_type } => {
            let mut head = input_type.network_input(input)?;
            let mut input = ChainInput::new(&mut *head, &builder.writers, checkpoints.as_mut());
            run_input_loop(d, &mut input, &mut metrics)?;
        }
        OperatorInstance::TwoInput(mut head) => {
            let mut input = ChainInput::new(&mut *head, &builder.writers, checkpoints.as_mut());
            run_input_loop(d, &mut input, &mut metrics)?;
        }
        OperatorInstance::Driver(mut driver) => {
            let read = driver.run(d.inputs.clone(), &d.counters, &d.cancel)?;
            metrics.records_in = read.records;
            metrics.bytes_in = read.bytes;
            metrics.buffers_in = read.buffers;
        }
    }
    // Snapshots handed to the checkpoint thread are written and
    // acknowledged before the task reports that it finished.
    drop(checkpoints);
    for w in &builder.writers {
        w.borrow_mut().finish()?;
    }
    for w in &builder.writers {
        let w = w.borrow();
        metrics.records_out += w.records_out();
        metrics.bytes_out += w.bytes_out();
        metrics.buffers_out += w.buffers_out();
        metrics.output_buffers_max_in_use += w.pool().max_in_use() as u64;
        metrics.output_buffers_limit += w.pool().max_buffers() as u64;
        metrics.backpressure_waits += w.pool().waits();
        metrics.subpartition_bytes.push(w.subpartition_bytes());
        metrics.subpartition_records.push(w.subpartition_records());
    }
    metrics.operator_records = builder.contexts.iter().map(|c| c.records_in()).collect();
    drop(builder);
    metrics.accumulators = std::mem::take(&mut *accumulators.borrow_mut());
    metrics.staged_files = staged.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(metrics)
}

/// What each operator of the chain restores: its share of the state every
/// subtask wrote for the snapshot the deployment names (keyed state by key
/// group, list state split or unioned), read from the checkpoint storage.
fn restored_state(d: &TaskDeployment) -> Result<Vec<Option<OperatorStateSnapshot>>> {
    let v = d.vertex();
    let Some(restore) = &d.descriptor.restore else {
        return Ok(vec![None; v.operators.len()]);
    };
    let store = d.checkpointing.as_ref().map(|c| &c.store).ok_or_else(|| {
        FluviaError::Internal(format!(
            "{} restores checkpoint {} without a checkpoint storage",
            d.task_name(),
            restore.checkpoint_id
        ))
    })?;
    let subtask = d.subtask_index();
    let max_parallelism = d.descriptor.max_parallelism;
    let own = fluvia_core::keygroup::key_group_range_for_operator(
        max_parallelism,
        d.parallelism(),
        subtask,
    );
    let mut result = Vec::with_capacity(v.operators.len());
    for op in &v.operators {
        let Some(state) = restore.operator(&op.operator_id) else {
            result.push(None);
            continue;
        };
        if state.max_parallelism as usize != max_parallelism {
            return Err(FluviaError::Plan(format!(
                "operator '{}' ({}) was snapshotted with max parallelism {} and now has {}: \
                 the max parallelism of a stateful operator cannot change",
                op.name, op.operator_id, state.max_parallelism, max_parallelism
            )));
        }
        let mut subtasks = Vec::new();
        for (&index, sub) in &state.subtasks {
            for handle in &sub.handles {
                let (bytes, location) = match &handle.location {
                    StateLocation::File { path } => (store.read(path)?, path.as_str()),
                    StateLocation::Inline { bytes } => (bytes.clone(), "inline state"),
                };
                let old_range = handle.key_groups.map_or_else(
                    || {
                        fluvia_core::keygroup::key_group_range_for_operator(
                            max_parallelism,
                            state.parallelism as usize,
                            index as usize,
                        )
                    },
                    |r| (r.start as usize, r.end as usize),
                );
                // Only the key groups this subtask owns are decoded.
                let overlap = (old_range.0.max(own.0), old_range.1.min(own.1));
                let snapshot = crate::checkpoint::decode_snapshot(&bytes, location, Some(overlap))?;
                subtasks.push(fluvia_state::SubtaskState {
                    key_group_range: old_range,
                    max_parallelism,
                    snapshot,
                });
            }
        }
        let mut shares = fluvia_state::redistribute(
            &op.operator_id,
            &subtasks,
            max_parallelism,
            d.parallelism(),
        )
        .map_err(crate::checkpoint::state_error)?;
        if subtask >= shares.len() {
            return Err(FluviaError::Internal(format!(
                "no share of operator {} for subtask {subtask}",
                op.operator_id
            )));
        }
        result.push(Some(shares.swap_remove(subtask)));
    }
    Ok(result)
}

/// The head of a chain as the input processor's output.
struct ChainInput<'a> {
    head: &'a mut dyn NetworkInput,
    writers: &'a [Rc<RefCell<PartitionWriter>>],
    checkpoints: Option<&'a mut SubtaskCheckpointCoordinator>,
}

impl<'a> ChainInput<'a> {
    fn new(
        head: &'a mut dyn NetworkInput,
        writers: &'a [Rc<RefCell<PartitionWriter>>],
        checkpoints: Option<&'a mut SubtaskCheckpointCoordinator>,
    ) -> Self {
        ChainInput {
            head,
            writers,
            checkpoints,
        }
    }

    fn on_mail(&mut self, mail: TaskMail) -> Result<()> {
        match mail {
            TaskMail::NotifyCheckpoint { id, complete } => {
                self.head.notify_checkpoint(id, complete)
            }
            // Barriers reach this task through its inputs.
            TaskMail::TriggerCheckpoint(barrier)
            | TaskMail::TriggerSynchronousSavepoint(barrier) => {
                if let Some(c) = self.checkpoints.as_deref() {
                    c.decline(
                        barrier.id,
                        "a task with inputs takes checkpoints from their barriers".to_string(),
                    );
                }
                Ok(())
            }
            TaskMail::OperatorEvent { operator, .. } => Err(FluviaError::Internal(format!(
                "an operator event for operator {operator}, which takes none"
            ))),
        }
    }
}

impl DataOutput for ChainInput<'_> {
    #[inline]
    fn emit_record(&mut self, input: usize, record: RecordBytes<'_>) -> Result<()> {
        self.head.process(input, record.as_slice())
    }
    fn emit_watermark(&mut self, watermark: i64) -> Result<()> {
        self.head.process_watermark(watermark)
    }
    fn end_input(&mut self, input: usize) -> Result<()> {
        self.head.end_input(input)
    }
    fn trigger_checkpoint(&mut self, barrier: CheckpointBarrier) -> Result<()> {
        let Some(checkpoints) = self.checkpoints.as_deref_mut() else {
            // A job without checkpoints still passes barriers on.
            return TaskControl::new(self.writers)
                .broadcast_event(&Event::CheckpointBarrier(barrier));
        };
        let started = Instant::now();
        let mut snapshot = ChainSnapshot::new(barrier.id);
        self.head.checkpoint(&barrier, &mut snapshot)?;
        let metrics = SubtaskCheckpointMetrics {
            start_delay_ms: crate::checkpoint::millis_since(barrier.timestamp),
            unaligned: barrier.options.alignment == AlignmentType::Unaligned,
            ..Default::default()
        };
        checkpoints.complete_sync(snapshot, metrics, started)
    }
    fn abort_checkpoint(&mut self, id: u64) -> Result<()> {
        // Downstream tasks stop aligning for it too.
        TaskControl::new(self.writers)
            .broadcast_event(&Event::CancelCheckpointMarker { checkpoint_id: id })?;
        self.head.notify_checkpoint(id, false)?;
        if let Some(c) = self.checkpoints.as_deref() {
            c.decline(
                id,
                format!("checkpoint {id} was cancelled upstream or overtaken"),
            );
        }
        Ok(())
    }
}

fn run_input_loop(
    d: &TaskDeployment,
    head: &mut ChainInput<'_>,
    metrics: &mut AttemptMetrics,
) -> Result<()> {
    let writers = head.writers;
    let gate = InputGate::new(d.inputs.clone());
    if gate.num_channels() == 0 {
        return Err(FluviaError::Internal(format!(
            "task {} has no input channels",
            d.task_name()
        )));
    }
    d.mailbox.set_waker(gate.waker());
    let mut input = StreamInputProcessor::new(gate).with_counters(Arc::clone(&d.counters));
    let counters = &d.counters;
    let mailbox = &d.mailbox;
    loop {
        if mailbox.has_mail() {
            mailbox.run_pending(&mut TaskControl::new(writers), &mut |_, mail| {
                head.on_mail(mail)
            })?;
        }
        match input.process(head)? {
            InputStatus::MoreAvailable => {}
            InputStatus::EndOfInput => break,
            InputStatus::NothingAvailable => {
                TaskControl::new(writers).flush()?;
                let idle_since = Instant::now();
                let status = input.process_blocking(head, &d.cancel, &|| mailbox.has_mail())?;
                IoCounters::add(&counters.idle_nanos, idle_since.elapsed().as_nanos() as u64);
                if status == InputStatus::EndOfInput {
                    break;
                }
            }
        }
        if d.cancel.is_cancelled() {
            return Err(FluviaError::Cancelled);
        }
    }
    metrics.records_in = input.records_in();
    metrics.bytes_in = input.gate().bytes_received();
    metrics.buffers_in = input.gate().buffers_received();
    Ok(())
}

//! The task's side of a checkpoint (Flink's `SubtaskCheckpointCoordinator`
//! and `AsyncCheckpointRunnable`).
//!
//! A checkpoint reaches a task as a mail (a source: "trigger checkpoint N")
//! or as barriers on its inputs (every other task, once aligned). On the
//! task thread the chain then takes its *synchronous* part: each operator
//! emits what must precede the barrier, the barrier goes on to every
//! output, and each operator's state is snapshotted into a
//! [`ChainSnapshot`]. The *asynchronous* part runs on the task's
//! checkpoint thread: each operator's snapshot is encoded and written
//! through the [`SnapshotStore`], and the task acknowledges with the
//! handles through the [`CheckpointResponder`] (the TaskManager sends it
//! to the JobManager's checkpoint coordinator).
//!
//! This module knows operator snapshots, handles and the two services; it
//! knows nothing of the coordinator's bookkeeping, RPC or where the store
//! keeps its files.

use crate::state::OperatorStateSnapshot;
use fluvia_core::{FluviaError, Result};
use fluvia_deployment::checkpoint::{
    KeyGroupRange, OperatorId, OperatorSubtaskState, StateHandle, StateKind, StateLocation,
    SubtaskCheckpointMetrics, TaskStateSnapshot,
};
use fluvia_deployment::{ExecutionAttemptId, TaskCheckpointAck, TaskCheckpointDecline};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Instant;

/// The state of a chain's operators for one checkpoint, by operator index.
#[derive(Default)]
pub struct ChainSnapshot {
    pub checkpoint_id: u64,
    pub operators: Vec<(usize, OperatorStateSnapshot)>,
    /// Keyed state of operators still to be encoded (off the task thread).
    deferred: Vec<(usize, crate::state::DeferredKeyedState)>,
}

debug_fields!(ChainSnapshot, |s| {
    checkpoint_id: s.checkpoint_id,
    operators: s.operators,
    deferred: s.deferred.len(),
});

impl ChainSnapshot {
    pub fn new(checkpoint_id: u64) -> Self {
        ChainSnapshot {
            checkpoint_id,
            ..Default::default()
        }
    }

    /// What operator `operator` wrote in `snapshot_state`.
    pub fn add(&mut self, operator: usize, state: crate::state::StateSnapshotContext) {
        if let Some(d) = state.deferred_keyed {
            self.deferred.push((operator, d));
        }
        self.operators.push((operator, state.snapshot));
    }

    /// Runs the deferred encodings (the asynchronous part).
    fn finish(mut self) -> Result<(u64, Vec<(usize, OperatorStateSnapshot)>)> {
        for (operator, encode) in self.deferred {
            let groups = encode().map_err(state_error)?;
            if let Some((_, s)) = self.operators.iter_mut().find(|(i, _)| *i == operator) {
                s.keyed_state.extend(groups);
            }
        }
        Ok((self.checkpoint_id, self.operators))
    }
}

/// Where a task's acknowledgements and refusals go (the TaskManager's
/// connection to the JobManager).
pub trait CheckpointResponder: Send + Sync {
    fn acknowledge(&self, ack: TaskCheckpointAck);
    fn decline(&self, decline: TaskCheckpointDecline);
}

/// Where snapshot files are written and read back (the checkpoint storage).
pub trait SnapshotStore: Send + Sync {
    /// Writes `bytes` as the file `name` of checkpoint `checkpoint_id`;
    /// returns its location.
    fn write(&self, checkpoint_id: u64, name: &str, bytes: Vec<u8>) -> Result<String>;
    /// Reads the file at `location` (a location `write` returned).
    fn read(&self, location: &str) -> Result<Vec<u8>>;
}

/// What a task needs to take part in checkpoints.
#[derive(Clone)]
pub struct TaskCheckpointing {
    pub responder: Arc<dyn CheckpointResponder>,
    pub store: Arc<dyn SnapshotStore>,
}

impl std::fmt::Debug for TaskCheckpointing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TaskCheckpointing")
    }
}

/// Milliseconds from `timestamp` (ms since the epoch, a barrier's) to now.
pub fn millis_since(timestamp: i64) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    now.saturating_sub(timestamp).max(0) as u64
}

/// Encodes one operator's snapshot as the bytes of its file.
pub fn encode_snapshot(snapshot: &OperatorStateSnapshot) -> Result<Vec<u8>> {
    fluvia_state::snapshot::encode(snapshot).map_err(state_error)
}

/// Decodes a snapshot file read from `location`, keeping only `key_groups`
/// of its keyed state when given.
pub fn decode_snapshot(
    bytes: &[u8],
    location: &str,
    key_groups: Option<(usize, usize)>,
) -> Result<OperatorStateSnapshot> {
    fluvia_state::snapshot::decode(bytes, location, key_groups.map(|(a, b)| a..=b))
        .map_err(state_error)
}

/// A state error as the engine reports it (it names the file or operator).
pub fn state_error(e: fluvia_state::StateError) -> FluviaError {
    FluviaError::Execution(e.to_string())
}

struct AsyncPart {
    snapshot: ChainSnapshot,
    metrics: SubtaskCheckpointMetrics,
    sync_started: Instant,
}

/// One task's checkpointing: the synchronous part is the caller's (the
/// chain), this takes the rest.
pub struct SubtaskCheckpointCoordinator {
    services: TaskCheckpointing,
    attempt: ExecutionAttemptId,
    /// Stable id of each operator of the chain, by index.
    operator_ids: Arc<Vec<String>>,
    key_group_range: Option<(usize, usize)>,
    queue: Option<mpsc::Sender<AsyncPart>>,
    worker: Option<std::thread::JoinHandle<()>>,
}

debug_fields!(SubtaskCheckpointCoordinator, |s| {
    attempt: s.attempt,
});

impl SubtaskCheckpointCoordinator {
    pub fn new(
        services: TaskCheckpointing,
        attempt: ExecutionAttemptId,
        operator_ids: Vec<String>,
        key_group_range: Option<(usize, usize)>,
    ) -> Self {
        SubtaskCheckpointCoordinator {
            services,
            attempt,
            operator_ids: Arc::new(operator_ids),
            key_group_range,
            queue: None,
            worker: None,
        }
    }

    /// The synchronous part of `snapshot` is done (it started at
    /// `sync_started`): write it and acknowledge, off the task thread.
    pub fn complete_sync(
        &mut self,
        snapshot: ChainSnapshot,
        mut metrics: SubtaskCheckpointMetrics,
        sync_started: Instant,
    ) -> Result<()> {
        metrics.sync_duration_ms = sync_started.elapsed().as_millis() as u64;
        let part = AsyncPart {
            snapshot,
            metrics,
            sync_started,
        };
        let queue = match &self.queue {
            Some(q) => q,
            None => self.start_worker()?,
        };
        queue.send(part).map_err(|_| {
            FluviaError::Internal("the task's checkpoint thread has stopped".to_string())
        })
    }

    /// The task cannot take part in checkpoint `id`.
    pub fn decline(&self, checkpoint_id: u64, reason: String) {
        self.services.responder.decline(TaskCheckpointDecline {
            checkpoint_id,
            attempt: self.attempt,
            reason,
        });
    }

    fn start_worker(&mut self) -> Result<&mpsc::Sender<AsyncPart>> {
        let (tx, rx) = mpsc::channel::<AsyncPart>();
        let services = self.services.clone();
        let attempt = self.attempt;
        let ids = Arc::clone(&self.operator_ids);
        let key_groups = self.key_group_range;
        let worker = std::thread::Builder::new()
            .name(format!("checkpoint {attempt}"))
            .spawn(move || {
                for part in rx {
                    let id = part.snapshot.checkpoint_id;
                    match write_snapshot(&services, attempt, &ids, key_groups, part) {
                        Ok(ack) => services.responder.acknowledge(ack),
                        Err(e) => services.responder.decline(TaskCheckpointDecline {
                            checkpoint_id: id,
                            attempt,
                            reason: e.to_string(),
                        }),
                    }
                }
            })
            .map_err(|e| FluviaError::io("starting a task's checkpoint thread", e))?;
        self.worker = Some(worker);
        Ok(self.queue.insert(tx))
    }
}

impl Drop for SubtaskCheckpointCoordinator {
    /// Snapshots already handed over are still written and acknowledged:
    /// a task that ends right after a barrier has taken its part.
    fn drop(&mut self) {
        self.queue = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

fn write_snapshot(
    services: &TaskCheckpointing,
    attempt: ExecutionAttemptId,
    operator_ids: &[String],
    key_group_range: Option<(usize, usize)>,
    part: AsyncPart,
) -> Result<TaskCheckpointAck> {
    let started = Instant::now();
    let AsyncPart {
        snapshot,
        mut metrics,
        sync_started,
    } = part;
    let (checkpoint_id, operators) = snapshot.finish()?;
    let mut state = TaskStateSnapshot::default();
    for (index, operator) in &operators {
        if operator.is_empty() {
            continue;
        }
        let operator_id = operator_ids.get(*index).ok_or_else(|| {
            FluviaError::Internal(format!("snapshot of operator {index}, beyond the chain"))
        })?;
        let bytes = encode_snapshot(operator)?;
        let state_size = bytes.len() as u64;
        let name = format!("{operator_id}-{}-{}", attempt.subtask, attempt.attempt);
        let path = services.store.write(checkpoint_id, &name, bytes)?;
        let keyed = !operator.keyed_state.is_empty();
        let handle = StateHandle {
            kind: if keyed {
                StateKind::ManagedKeyed
            } else {
                StateKind::ManagedOperator
            },
            location: StateLocation::File { path },
            key_groups: key_group_range
                .filter(|_| keyed)
                .map(|(start, end)| KeyGroupRange {
                    start: start as u32,
                    end: end as u32,
                }),
            key_group_offsets: Vec::new(),
            state_size,
        };
        state.operators.insert(
            OperatorId(operator_id.clone()),
            OperatorSubtaskState {
                handles: vec![handle],
            },
        );
    }
    metrics.checkpointed_size = state.state_size();
    metrics.async_duration_ms = started.elapsed().as_millis() as u64;
    state.metrics = metrics;
    tracing::debug!(
        "{attempt}: checkpoint {checkpoint_id} written in {:?} after the barrier",
        sync_started.elapsed()
    );
    Ok(TaskCheckpointAck {
        checkpoint_id,
        attempt,
        state,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::mailbox::{Mail, Mailbox, TaskControl, TaskMail};
    use crate::operator::{
        OneInputFactory, OneInputOperator, OperatorContext, OperatorFactory, OperatorInstance,
        SourceFactory, SourceOperator, SourceStatus, UserError, record_type,
    };
    use crate::output::Collector;
    use crate::state::StateSnapshotContext;
    use fluvia_core::JobId;
    use fluvia_network::{CancelToken, CheckpointBarrier, CheckpointOptions};
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    #[derive(Default)]
    struct Files(Mutex<HashMap<String, Vec<u8>>>);

    impl SnapshotStore for Files {
        fn write(&self, checkpoint_id: u64, name: &str, bytes: Vec<u8>) -> Result<String> {
            let location = format!("chk-{checkpoint_id}/{name}");
            self.0.lock().unwrap().insert(location.clone(), bytes);
            Ok(location)
        }
        fn read(&self, location: &str) -> Result<Vec<u8>> {
            self.0
                .lock()
                .unwrap()
                .get(location)
                .cloned()
                .ok_or_else(|| FluviaError::Execution(format!("no state file {location}")))
        }
    }

    #[derive(Default)]
    struct Replies {
        acks: Mutex<Vec<TaskCheckpointAck>>,
        declines: Mutex<Vec<TaskCheckpointDecline>>,
    }

    impl CheckpointResponder for Replies {
        fn acknowledge(&self, ack: TaskCheckpointAck) {
            self.acks.lock().unwrap().push(ack);
        }
        fn decline(&self, decline: TaskCheckpointDecline) {
            self.declines.lock().unwrap().push(decline);
        }
    }

    /// Emits 0, 1, 2, … and checkpoints its position.
    struct Counter {
        next: u64,
        stop: Arc<AtomicBool>,
        emitted: Arc<AtomicU64>,
    }

    impl SourceOperator<u64> for Counter {
        fn poll_next(&mut self, out: &mut Collector<'_, u64>) -> Result<SourceStatus, UserError> {
            if self.stop.load(Ordering::Acquire) {
                return Ok(SourceStatus::End);
            }
            out.collect(self.next);
            self.next += 1;
            self.emitted.store(self.next, Ordering::Release);
            Ok(SourceStatus::MoreAvailable)
        }
        fn snapshot_state(&mut self, ctx: &mut StateSnapshotContext) -> Result<(), UserError> {
            ctx.list_state("position", vec![self.next.to_le_bytes().to_vec()]);
            Ok(())
        }
    }

    /// Sums what it sees; emits a marker before each barrier and records the
    /// checkpoints it is told about.
    struct Sum {
        sum: u64,
        seen: u64,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl OneInputOperator<u64, u64> for Sum {
        fn process_element(
            &mut self,
            record: u64,
            _out: &mut Collector<'_, u64>,
        ) -> Result<(), UserError> {
            self.sum += record;
            self.seen += 1;
            Ok(())
        }
        fn prepare_snapshot_pre_barrier(
            &mut self,
            id: u64,
            _out: &mut Collector<'_, u64>,
        ) -> Result<(), UserError> {
            self.log.lock().unwrap().push(format!("pre-barrier {id}"));
            Ok(())
        }
        fn snapshot_state(&mut self, ctx: &mut StateSnapshotContext) -> Result<(), UserError> {
            self.log
                .lock()
                .unwrap()
                .push(format!("snapshot {}", ctx.checkpoint_id));
            let mut bytes = self.sum.to_le_bytes().to_vec();
            bytes.extend(self.seen.to_le_bytes());
            ctx.list_state("sum", vec![bytes]);
            Ok(())
        }
        fn notify_checkpoint_complete(&mut self, id: u64) -> Result<(), UserError> {
            self.log.lock().unwrap().push(format!("complete {id}"));
            Ok(())
        }
    }

    fn barrier(id: u64) -> CheckpointBarrier {
        CheckpointBarrier {
            id,
            timestamp: 0,
            options: CheckpointOptions::aligned(),
        }
    }

    /// A source task triggered through its mailbox while busy snapshots every
    /// operator of its chain consistently (the chained operator has seen
    /// exactly the records the source had emitted), writes one file per
    /// stateful operator off the task thread, acknowledges with their
    /// handles, and hands the completion to every operator.
    #[test]
    fn a_triggered_source_chain_snapshots_every_operator_and_acknowledges() {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (files, replies) = (Arc::new(Files::default()), Arc::new(Replies::default()));
        let services = TaskCheckpointing {
            responder: replies.clone(),
            store: files.clone(),
        };
        let mailbox = Mailbox::new();
        let sender = mailbox.sender();
        let emitted = Arc::new(AtomicU64::new(0));
        let (s, l, e) = (Arc::clone(&stop), Arc::clone(&log), Arc::clone(&emitted));
        let task = std::thread::spawn(move || {
            let sum = OneInputFactory::<u64, u64>::new(move |_| {
                Ok(Box::new(Sum {
                    sum: 0,
                    seen: 0,
                    log: Arc::clone(&l),
                }))
            });
            let ctx1 = OperatorContext::new("t", "sum", 1, 0, 1, 128, 0, false, false);
            let OperatorInstance::OneInput { input, .. } = sum
                .create(&ctx1, record_type::<u64>().discarding())
                .unwrap()
            else {
                panic!("not one-input");
            };
            let source = SourceFactory::<u64>::new(move |_| {
                Ok(Box::new(Counter {
                    next: 0,
                    stop: Arc::clone(&s),
                    emitted: Arc::clone(&e),
                }))
            });
            let ctx0 = OperatorContext::new("t", "counter", 0, 0, 1, 128, 0, false, false);
            let OperatorInstance::Source(mut driver) = source.create(&ctx0, input).unwrap() else {
                panic!("not a source");
            };
            let attempt = ExecutionAttemptId {
                job: JobId(1),
                vertex: 0,
                subtask: 0,
                attempt: 0,
            };
            let mut coordinator = SubtaskCheckpointCoordinator::new(
                services,
                attempt,
                vec!["op-counter".into(), "op-sum".into()],
                Some((0, 127)),
            );
            let mut control = TaskControl::new(&[]).with_checkpoints(Some(&mut coordinator));
            driver
                .run(&CancelToken::new(), &mailbox, &mut control)
                .unwrap();
        });
        // Trigger while the source is busy emitting.
        while emitted.load(Ordering::Acquire) < 1000 {
            std::thread::yield_now();
        }
        sender
            .send(Mail::task(TaskMail::TriggerCheckpoint(barrier(7))))
            .unwrap();
        while replies.acks.lock().unwrap().is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        sender
            .send(Mail::task(TaskMail::NotifyCheckpoint {
                id: 7,
                complete: true,
            }))
            .unwrap();
        let stop_after = Arc::clone(&stop);
        sender
            .send(Mail::new("stop", move |_| {
                stop_after.store(true, Ordering::Release);
                Ok(())
            }))
            .unwrap();
        task.join().unwrap();

        let acks = replies.acks.lock().unwrap();
        let [ack] = acks.as_slice() else {
            panic!("one acknowledgement: {acks:?}");
        };
        assert_eq!(ack.checkpoint_id, 7);
        assert!(replies.declines.lock().unwrap().is_empty());
        let ids: Vec<&str> = ack.state.operators.keys().map(|o| o.0.as_str()).collect();
        assert_eq!(
            ids,
            ["op-counter", "op-sum"],
            "one file per stateful operator"
        );
        let read = |id: &str| {
            let op = &ack.state.operators[&OperatorId(id.to_string())];
            let [h] = op.handles.as_slice() else {
                panic!("one handle: {op:?}");
            };
            let path = h.path().unwrap();
            let bytes = files.read(path).unwrap();
            assert_eq!(h.state_size, bytes.len() as u64);
            decode_snapshot(&bytes, path, None).unwrap()
        };
        let position = u64::from_le_bytes(
            read("op-counter").operator_state["position"].elements[0][..8]
                .try_into()
                .unwrap(),
        );
        let sum_state = &read("op-sum").operator_state["sum"].elements[0];
        let sum = u64::from_le_bytes(sum_state[..8].try_into().unwrap());
        let seen = u64::from_le_bytes(sum_state[8..16].try_into().unwrap());
        assert!(position > 0);
        assert_eq!(seen, position, "the chain was cut between two records");
        assert_eq!(sum, position * (position - 1) / 2);
        assert_eq!(
            *log.lock().unwrap(),
            ["pre-barrier 7", "snapshot 7", "complete 7"]
        );
    }
}

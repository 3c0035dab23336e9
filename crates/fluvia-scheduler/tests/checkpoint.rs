//! The checkpoint coordinator, driven event by event on a virtual clock
//! (the shape of Flink's `CheckpointCoordinatorTest`,
//! `CheckpointCoordinatorTriggeringTest` and `CheckpointFailureManagerTest`).

#![allow(clippy::unwrap_used)]

use fluvia_core::JobId;
use fluvia_scheduler::checkpoint::metadata::{self, METADATA_MAGIC, METADATA_VERSION};
use fluvia_scheduler::checkpoint::{
    AlignmentType, CheckpointAction as A, CheckpointConfig, CheckpointCoordinator,
    CheckpointEvent as E, CheckpointFailureReason, CheckpointType, CheckpointingMode,
    CompletedCheckpoint, ExternalizedCheckpointRetention, KeyGroupRange, MetadataError, OperatorId,
    OperatorSubtaskState, RestoreError, SavepointKind, StateHandle, StateKind, StateLocation,
    SubtaskCheckpointMetrics, TaskAttempt, TaskId, TaskStateSnapshot, TaskStatus, TasksPlan,
    TerminalJobStatus, VertexPlan,
};
use std::collections::BTreeMap;
use std::time::Duration;

const JOB: JobId = JobId(0xfeed);

/// Vertices given as (parallelism, upstream vertices); vertex v runs the
/// operator "op-v".
fn plan(vertices: &[(usize, &[usize])]) -> TasksPlan {
    TasksPlan {
        vertices: vertices
            .iter()
            .enumerate()
            .map(|(v, (p, inputs))| VertexPlan {
                name: format!("v{v}"),
                parallelism: *p,
                max_parallelism: 128,
                operators: vec![OperatorId::new(format!("op-{v}"))],
                inputs: inputs.to_vec(),
            })
            .collect(),
    }
}

/// source(2) -> map(2) -> sink(1)
fn pipeline() -> TasksPlan {
    plan(&[(2, &[]), (2, &[0]), (1, &[1])])
}

fn config(interval_ms: u64) -> CheckpointConfig {
    CheckpointConfig {
        checkpoint_dir: Some("/ckpt".into()),
        ..CheckpointConfig::with_interval(Duration::from_millis(interval_ms))
    }
}

/// `config(100)` tolerating `n` continuous checkpoint failures.
fn tolerating(n: u32) -> CheckpointConfig {
    CheckpointConfig {
        tolerable_failed: Some(n),
        ..config(100)
    }
}

fn coordinator(config: CheckpointConfig, plan: TasksPlan) -> CheckpointCoordinator {
    CheckpointCoordinator::new(config, JOB, plan).unwrap()
}

fn start_all(c: &mut CheckpointCoordinator, now: u64, attempt: u32) {
    let tasks: Vec<TaskId> = c.plan().tasks().collect();
    for task in tasks {
        c.handle(now, E::TaskRunning { task, attempt });
    }
}

/// The coordinator of `config` and `plan` with every task running (attempt 0).
fn started(config: CheckpointConfig, plan: TasksPlan) -> CheckpointCoordinator {
    let mut c = coordinator(config, plan);
    start_all(&mut c, 0, 0);
    c
}

/// A task declines `checkpoint_id` (`CheckpointDeclined`).
fn decline(checkpoint_id: u64, task: TaskId, attempt: u32, message: &str) -> E {
    decline_for(
        CheckpointFailureReason::CheckpointDeclined,
        checkpoint_id,
        task,
        attempt,
        message,
    )
}

fn decline_for(
    reason: CheckpointFailureReason,
    checkpoint_id: u64,
    task: TaskId,
    attempt: u32,
    message: &str,
) -> E {
    E::Decline {
        checkpoint_id,
        task,
        attempt,
        reason,
        message: message.into(),
    }
}

fn savepoint(request_id: &str, target_dir: Option<&str>, kind: SavepointKind) -> E {
    E::TriggerSavepoint {
        request_id: request_id.into(),
        target_dir: target_dir.map(Into::into),
        kind,
    }
}

fn finished(task: TaskId) -> E {
    E::TaskFinished { task, attempt: 0 }
}

fn failed(task: TaskId, attempt: u32, reason: &str) -> E {
    E::TaskFailed {
        task,
        attempt,
        reason: reason.into(),
    }
}

fn attempt0(task: TaskId) -> TaskAttempt {
    TaskAttempt { task, attempt: 0 }
}

/// The checkpoint of the one `WriteMetadata` action `out` must be.
fn write_metadata(out: &[A]) -> &CompletedCheckpoint {
    let [A::WriteMetadata { checkpoint }] = out else {
        panic!("{out:?}")
    };
    checkpoint
}

fn snapshot(id: u64, task: TaskId) -> TaskStateSnapshot {
    let op = OperatorId::new(format!("op-{}", task.vertex));
    let handle = StateHandle {
        kind: StateKind::ManagedKeyed,
        location: StateLocation::File {
            path: format!("/ckpt/chk-{id}/{}-{}", task.vertex, task.subtask),
        },
        key_groups: Some(KeyGroupRange { start: 0, end: 63 }),
        key_group_offsets: vec![],
        state_size: 100,
    };
    TaskStateSnapshot {
        operators: BTreeMap::from([(
            op,
            OperatorSubtaskState {
                handles: vec![handle],
            },
        )]),
        metrics: SubtaskCheckpointMetrics {
            checkpointed_size: 40,
            alignment_buffered: 1,
            processed_data: 2,
            persisted_data: 3,
            ..SubtaskCheckpointMetrics::default()
        },
    }
}

/// The checkpoint ids of the `$variant` actions among `$actions`.
macro_rules! checkpoint_ids {
    ($actions:expr, $variant:ident) => {
        $actions
            .iter()
            .filter_map(|a| match a {
                A::$variant { checkpoint_id, .. } => Some(*checkpoint_id),
                _ => None,
            })
            .collect()
    };
}

fn triggered(actions: &[A]) -> Vec<u64> {
    checkpoint_ids!(actions, TriggerCheckpoint)
}

fn ack(c: &mut CheckpointCoordinator, now: u64, id: u64, task: TaskId, attempt: u32) -> Vec<A> {
    c.handle(
        now,
        E::Acknowledge {
            checkpoint_id: id,
            task,
            attempt,
            state: snapshot(id, task),
        },
    )
}

/// Every running task acknowledges `id`; returns the actions of the last.
fn ack_all(c: &mut CheckpointCoordinator, now: u64, id: u64) -> Vec<A> {
    let tasks: Vec<(TaskId, u32)> = c
        .plan()
        .tasks()
        .filter_map(|t| match c.task_status(t) {
            Some(TaskStatus::Running { attempt }) => Some((t, attempt)),
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    for (t, a) in tasks {
        out = ack(c, now, id, t, a);
    }
    out
}

fn written(c: &mut CheckpointCoordinator, now: u64, id: u64) -> Vec<A> {
    c.handle(
        now,
        E::MetadataWritten {
            checkpoint_id: id,
            path: Some(format!("/ckpt/chk-{id}")),
        },
    )
}

/// The id of the checkpoint a tick at `now` triggers (one must be).
fn tick_trigger(c: &mut CheckpointCoordinator, now: u64) -> u64 {
    *triggered(&c.handle(now, E::Tick)).first().unwrap()
}

/// Trigger on a tick, ack, write: the id.
fn run_checkpoint(c: &mut CheckpointCoordinator, now: u64) -> u64 {
    let id = tick_trigger(c, now);
    ack_all(c, now, id);
    written(c, now, id);
    id
}

fn discarded_checkpoints(actions: &[A]) -> Vec<u64> {
    checkpoint_ids!(actions, DiscardCheckpoint)
}

fn fail_job(actions: &[A]) -> bool {
    actions.iter().any(|a| matches!(a, A::FailJob { .. }))
}

// ------------------------------------------------------------- triggering

#[test]
fn triggers_on_the_interval_only_when_every_task_runs() {
    let mut c = coordinator(config(100), pipeline());
    assert!(triggered(&c.handle(0, E::Tick)).is_empty());
    // Four of five tasks run: still nothing.
    for (v, s) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        c.handle(
            0,
            E::TaskRunning {
                task: TaskId::new(v, s),
                attempt: 0,
            },
        );
    }
    assert!(triggered(&c.handle(500, E::Tick)).is_empty());
    c.handle(
        1_000,
        E::TaskRunning {
            task: TaskId::new(2, 0),
            attempt: 0,
        },
    );
    assert_eq!(c.next_deadline(), Some(1_100));
    assert!(triggered(&c.handle(1_099, E::Tick)).is_empty());
    let out = c.handle(1_100, E::Tick);
    let A::TriggerCheckpoint {
        checkpoint_id,
        checkpoint_type,
        options,
        tasks,
        timestamp,
    } = &out[0]
    else {
        panic!("{out:?}")
    };
    assert_eq!(*checkpoint_id, 1);
    assert_eq!(*timestamp, 1_100);
    assert_eq!(*checkpoint_type, CheckpointType::Checkpoint);
    assert_eq!(options.alignment, AlignmentType::Aligned);
    // Only the sources are triggered.
    assert_eq!(
        tasks,
        &vec![attempt0(TaskId::new(0, 0)), attempt0(TaskId::new(0, 1)),]
    );
    assert_eq!(c.num_pending(), 1);
}

#[test]
fn barrier_options_follow_the_mode() {
    let mut cfg = config(100);
    cfg.mode = CheckpointingMode::AtLeastOnce;
    let mut c = started(cfg, pipeline());
    let out = c.handle(100, E::Tick);
    assert!(matches!(&out[0], A::TriggerCheckpoint { options, .. }
        if options.alignment == AlignmentType::AtLeastOnce));

    let mut cfg = config(100);
    cfg.unaligned = true;
    cfg.aligned_checkpoint_timeout = Duration::from_millis(30);
    let mut c = started(cfg, pipeline());
    let out = c.handle(100, E::Tick);
    assert!(matches!(&out[0], A::TriggerCheckpoint { options, .. }
        if options.alignment == AlignmentType::Aligned
            && options.aligned_checkpoint_timeout_ms == Some(30)));
}

#[test]
fn no_interval_means_no_periodic_checkpoints() {
    let mut c = started(CheckpointConfig::default(), pipeline());
    assert!(triggered(&c.handle(1_000_000, E::Tick)).is_empty());
    assert_eq!(c.next_deadline(), None);
}

#[test]
fn min_pause_counts_from_the_last_completion() {
    let mut cfg = config(100);
    cfg.min_pause = Duration::from_millis(250);
    let mut c = started(cfg, pipeline());
    let id = tick_trigger(&mut c, 100);
    ack_all(&mut c, 180, id);
    written(&mut c, 190, id);
    // Due at 200, but the pause lasts until 440.
    assert!(triggered(&c.handle(200, E::Tick)).is_empty());
    assert_eq!(c.next_deadline(), Some(440));
    assert!(triggered(&c.handle(439, E::Tick)).is_empty());
    assert_eq!(triggered(&c.handle(440, E::Tick)), vec![2]);
}

#[test]
fn min_pause_implies_one_checkpoint_at_a_time() {
    let mut cfg = config(100);
    cfg.min_pause = Duration::from_millis(10);
    cfg.max_concurrent = 3;
    let mut c = started(cfg, pipeline());
    assert_eq!(triggered(&c.handle(100, E::Tick)), vec![1]);
    assert!(triggered(&c.handle(200, E::Tick)).is_empty());
}

#[test]
fn max_concurrent_holds_the_periodic_trigger_back() {
    let mut cfg = config(100);
    cfg.max_concurrent = 2;
    let mut c = started(cfg, pipeline());
    assert_eq!(triggered(&c.handle(100, E::Tick)), vec![1]);
    assert_eq!(triggered(&c.handle(200, E::Tick)), vec![2]);
    assert!(triggered(&c.handle(300, E::Tick)).is_empty());
    assert_eq!(c.num_pending(), 2);
    // Checkpoint 2 completes (and subsumes 1): the waiting request fires
    // at the next tick.
    ack_all(&mut c, 310, 2);
    let out = written(&mut c, 320, 2);
    assert!(out.iter().any(|a| matches!(
        a,
        A::NotifyCheckpointAborted {
            checkpoint_id: 1,
            ..
        }
    )));
    assert_eq!(c.num_pending(), 0);
    assert_eq!(triggered(&c.handle(330, E::Tick)), vec![3]);
}

// ------------------------------------------------------------- completing

#[test]
fn completes_only_after_every_ack_and_the_metadata() {
    let mut c = started(config(100), pipeline());
    let id = tick_trigger(&mut c, 100);
    let tasks: Vec<TaskId> = c.plan().tasks().collect();
    for t in &tasks[..4] {
        assert!(ack(&mut c, 110, id, *t, 0).is_empty());
    }
    let out = ack(&mut c, 120, id, tasks[4], 0);
    let checkpoint = write_metadata(&out);
    assert_eq!(checkpoint.checkpoint_id, id);
    assert_eq!(
        checkpoint.external_path.as_deref(),
        Some(&*format!("/ckpt/{JOB}/chk-1"))
    );
    assert_eq!(checkpoint.operators.len(), 3);
    assert_eq!(
        checkpoint.operators[&OperatorId::new("op-1")]
            .subtasks
            .len(),
        2
    );
    assert!(c.latest_completed().is_none());
    assert_eq!(c.num_pending(), 1);
    // A tick while the metadata is written does not expire it.
    c.handle(100 + 600_000, E::Tick);
    assert_eq!(c.num_pending(), 1);

    let out = c.handle(
        700_000,
        E::MetadataWritten {
            checkpoint_id: id,
            path: Some("/ckpt/x/chk-1".into()),
        },
    );
    assert_eq!(c.latest_completed().unwrap().checkpoint_id, id);
    assert_eq!(
        c.latest_completed().unwrap().external_path.as_deref(),
        Some("/ckpt/x/chk-1")
    );
    assert_eq!(c.num_pending(), 0);
    // Every task that took part is told.
    let expected: Vec<TaskAttempt> = tasks
        .iter()
        .map(|&task| TaskAttempt { task, attempt: 0 })
        .collect();
    assert!(out.contains(&A::NotifyCheckpointComplete {
        checkpoint_id: id,
        tasks: expected
    }));
    let stats = c.statistics();
    assert_eq!(stats.counts.completed, 1);
    assert_eq!(stats.summary.state_size.max, 500);
    assert_eq!(stats.summary.checkpointed_size.max, 200);
    assert_eq!(
        stats
            .latest
            .completed
            .as_ref()
            .unwrap()
            .num_acknowledged_subtasks,
        5
    );
}

#[test]
fn num_retained_subsumes_the_oldest_and_discards_it_once() {
    let mut cfg = config(100);
    cfg.num_retained = 2;
    let mut c = started(cfg, pipeline());
    let mut discarded = Vec::new();
    for round in 1..=4u64 {
        let now = round * 100;
        let id = tick_trigger(&mut c, now);
        ack_all(&mut c, now + 10, id);
        let out = written(&mut c, now + 20, id);
        discarded.extend(discarded_checkpoints(&out));
        if let Some(A::DiscardCheckpoint {
            handles,
            external_path,
            ..
        }) = out
            .iter()
            .find(|a| matches!(a, A::DiscardCheckpoint { .. }))
        {
            assert_eq!(handles.len(), 5);
            assert!(external_path.is_some());
        }
    }
    assert_eq!(discarded, vec![1, 2]);
    let retained: Vec<u64> = c.retained().map(|cp| cp.checkpoint_id).collect();
    assert_eq!(retained, vec![3, 4]);
    assert_eq!(c.latest_completed().unwrap().checkpoint_id, 4);
    let stats = c.statistics();
    let h1 = stats.history.iter().find(|h| h.id == 1).unwrap();
    assert_eq!(h1.discarded, Some(true));
}

// --------------------------------------------------------------- failures

#[test]
fn decline_aborts_and_notifies() {
    let mut c = started(tolerating(5), pipeline());
    let id = tick_trigger(&mut c, 100);
    ack(&mut c, 110, id, TaskId::new(0, 0), 0);
    let out = c.handle(120, decline(id, TaskId::new(1, 1), 0, "disk full"));
    assert_eq!(c.num_pending(), 0);
    let notified = out.iter().find_map(|a| match a {
        A::NotifyCheckpointAborted {
            checkpoint_id,
            tasks,
            reason,
        } => Some((*checkpoint_id, tasks.len(), reason.clone())),
        _ => None,
    });
    let (nid, n, reason) = notified.unwrap();
    assert_eq!((nid, n), (id, 5));
    assert!(reason.contains("disk full"), "{reason}");
    // The one acknowledgement's state is discarded.
    assert!(
        out.iter()
            .any(|a| matches!(a, A::DiscardState { handles, .. } if handles.len() == 1))
    );
    assert_eq!(c.continuous_failures(), 1);
    assert_eq!(c.statistics().counts.failed, 1);
    assert!(c.statistics().latest.failed.is_some());
}

#[test]
fn expiry_aborts_with_flinks_message() {
    let mut cfg = tolerating(10);
    cfg.timeout = Duration::from_millis(1_000);
    let mut c = started(cfg, pipeline());
    let id = tick_trigger(&mut c, 100);
    assert_eq!(c.next_deadline(), Some(1_100));
    assert!(c.handle(1_099, E::Tick).is_empty());
    let out = c.handle(1_100, E::Tick);
    assert!(
        out.contains(&A::NotifyCheckpointAborted {
            checkpoint_id: id,
            tasks: c
                .plan()
                .tasks()
                .map(|task| TaskAttempt { task, attempt: 0 })
                .collect(),
            reason: format!("Checkpoint {id} expired before completing."),
        })
    );
    // The request due meanwhile fires in the same tick.
    assert_eq!(triggered(&out), vec![2]);
}

#[test]
fn failures_beyond_the_tolerable_count_fail_the_job() {
    let mut cfg = tolerating(1);
    cfg.timeout = Duration::from_millis(50);
    let mut c = started(cfg, pipeline());
    assert_eq!(triggered(&c.handle(100, E::Tick)), vec![1]);
    let out = c.handle(150, E::Tick);
    assert!(!fail_job(&out));
    // A success in between resets the count.
    assert_eq!(triggered(&c.handle(200, E::Tick)), vec![2]);
    ack_all(&mut c, 210, 2);
    written(&mut c, 220, 2);
    assert_eq!(c.continuous_failures(), 0);
    assert_eq!(triggered(&c.handle(300, E::Tick)), vec![3]);
    assert!(!fail_job(&c.handle(350, E::Tick)));
    assert_eq!(triggered(&c.handle(400, E::Tick)), vec![4]);
    let out = c.handle(450, E::Tick);
    let reason = out
        .iter()
        .find_map(|a| match a {
            A::FailJob { reason } => Some(reason.clone()),
            _ => None,
        })
        .unwrap();
    assert!(reason.contains("tolerable failure threshold"), "{reason}");
    assert!(reason.contains("Checkpoint 4 expired"), "{reason}");
}

#[test]
fn default_tolerates_no_failure() {
    let mut cfg = config(100);
    cfg.timeout = Duration::from_millis(50);
    let mut c = started(cfg, pipeline());
    c.handle(100, E::Tick);
    assert!(fail_job(&c.handle(150, E::Tick)));
}

#[test]
fn declines_of_tasks_not_ready_are_not_counted() {
    let mut c = started(config(100), pipeline());
    for round in 1..=3u64 {
        let id = *triggered(&c.handle(round * 100, E::Tick)).first().unwrap();
        let out = c.handle(
            round * 100 + 1,
            decline_for(
                CheckpointFailureReason::CheckpointDeclinedTaskNotReady,
                id,
                TaskId::new(0, 0),
                0,
                "restoring",
            ),
        );
        assert!(!fail_job(&out));
    }
    assert_eq!(c.continuous_failures(), 0);
}

#[test]
fn metadata_failure_aborts_and_counts() {
    let mut c = started(tolerating(3), pipeline());
    let id = tick_trigger(&mut c, 100);
    ack_all(&mut c, 110, id);
    let out = c.handle(
        120,
        E::MetadataFailed {
            checkpoint_id: id,
            reason: "permission denied".into(),
        },
    );
    assert!(
        out.iter()
            .any(|a| matches!(a, A::NotifyCheckpointAborted { .. }))
    );
    assert!(
        out.iter()
            .any(|a| matches!(a, A::DiscardState { handles, .. } if handles.len() == 5))
    );
    assert!(c.latest_completed().is_none());
    assert_eq!(c.continuous_failures(), 1);
    // The answer for it arriving late anyway: its file is garbage.
    let out = written(&mut c, 130, id);
    assert!(
        matches!(out.as_slice(), [A::DiscardMetadata { checkpoint_id, .. }] if *checkpoint_id == id)
    );
}

#[test]
fn late_duplicate_and_stale_acks_are_ignored() {
    let mut cfg = tolerating(10);
    cfg.max_concurrent = 2;
    let mut c = started(cfg, pipeline());
    let one = tick_trigger(&mut c, 100);
    // Stale attempt: ignored, its state dropped.
    let out = ack(&mut c, 110, one, TaskId::new(0, 0), 7);
    assert!(matches!(out.as_slice(), [A::DiscardState { .. }]));
    // Duplicate: ignored, state kept once.
    assert!(ack(&mut c, 111, one, TaskId::new(0, 1), 0).is_empty());
    assert!(ack(&mut c, 112, one, TaskId::new(0, 1), 0).is_empty());
    assert_eq!(c.pending().next().unwrap().num_acknowledged(), 1);
    // Declined by a stale attempt: ignored.
    c.handle(113, decline(one, TaskId::new(1, 0), 3, "old"));
    assert_eq!(c.num_pending(), 1);
    // Aborted, then acknowledged late: the state is discarded.
    c.handle(120, decline(one, TaskId::new(1, 0), 0, "x"));
    let out = ack(&mut c, 130, one, TaskId::new(2, 0), 0);
    assert!(
        matches!(out.as_slice(), [A::DiscardState { checkpoint_id, .. }] if *checkpoint_id == one)
    );
    // An id never triggered: discarded too.
    let out = ack(&mut c, 131, 99, TaskId::new(2, 0), 0);
    assert!(matches!(out.as_slice(), [A::DiscardState { .. }]));
    // A duplicate after completion: ignored, never discarded (the
    // completed checkpoint holds those handles).
    let two = run_checkpoint(&mut c, 200);
    assert!(ack(&mut c, 210, two, TaskId::new(0, 0), 0).is_empty());
    assert!(written(&mut c, 211, two).is_empty());
}

#[test]
fn task_failure_aborts_pending_and_recovery_uses_the_latest_completed() {
    let mut cfg = config(100);
    cfg.max_concurrent = 2;
    let mut c = started(cfg, pipeline());
    let first = run_checkpoint(&mut c, 100);
    let p1 = tick_trigger(&mut c, 200);
    let p2 = tick_trigger(&mut c, 300);
    ack_all(&mut c, 310, p2); // finalizing: aborted too
    ack(&mut c, 210, p1, TaskId::new(0, 0), 0);
    let out = c.handle(320, failed(TaskId::new(1, 0), 0, "boom"));
    assert_eq!(c.num_pending(), 0);
    // Not counted, nobody notified (the tasks restart anyway).
    assert!(!fail_job(&out));
    assert!(
        !out.iter()
            .any(|a| matches!(a, A::NotifyCheckpointAborted { .. }))
    );
    assert_eq!(
        out.iter()
            .filter(|a| matches!(a, A::DiscardState { .. }))
            .count(),
        2
    );
    assert_eq!(c.latest_completed().unwrap().checkpoint_id, first);
    assert_eq!(c.restore_latest(330).unwrap().checkpoint_id, first);
    assert_eq!(c.statistics().counts.restored, 1);
    // No trigger until the failed task runs again (as a new attempt).
    assert!(triggered(&c.handle(1_000, E::Tick)).is_empty());
    // The old attempt's news is stale.
    c.handle(
        1_000,
        E::TaskRunning {
            task: TaskId::new(1, 0),
            attempt: 1,
        },
    );
    c.handle(1_001, failed(TaskId::new(1, 0), 0, "late"));
    assert_eq!(
        c.task_status(TaskId::new(1, 0)),
        Some(TaskStatus::Running { attempt: 1 })
    );
    let id = tick_trigger(&mut c, 1_100);
    assert!(id > p2);
    ack_all(&mut c, 1_110, id);
    written(&mut c, 1_120, id);
    assert_eq!(c.latest_completed().unwrap().checkpoint_id, id);
}

#[test]
fn job_restart_aborts_everything_and_stops_triggering() {
    let mut c = started(config(100), pipeline());
    c.handle(100, E::Tick);
    c.handle(
        110,
        E::JobRestarting {
            reason: "TaskManager lost".into(),
        },
    );
    assert_eq!(c.num_pending(), 0);
    assert!(triggered(&c.handle(500, E::Tick)).is_empty());
    start_all(&mut c, 600, 1);
    // The first checkpoint after a restart is due an interval later.
    assert!(triggered(&c.handle(650, E::Tick)).is_empty());
    assert_eq!(triggered(&c.handle(700, E::Tick)), vec![2]);
}

// ------------------------------------------------------------- savepoints

#[test]
fn savepoints_are_forced_answered_and_never_subsumed() {
    let mut c = started(config(100), pipeline());
    let cp = tick_trigger(&mut c, 100);
    // max-concurrent 1 is reached, the savepoint goes anyway.
    let out = c.handle(
        110,
        savepoint("req-1", Some("/sp"), SavepointKind::Savepoint),
    );
    let A::TriggerCheckpoint {
        checkpoint_id: sp,
        checkpoint_type,
        options,
        ..
    } = &out[0]
    else {
        panic!("{out:?}")
    };
    let sp = *sp;
    assert_eq!(
        *checkpoint_type,
        CheckpointType::Savepoint(SavepointKind::Savepoint)
    );
    assert_eq!(options.alignment, AlignmentType::ForcedAligned);
    // The newer checkpoint completes first: the savepoint stays pending.
    ack_all(&mut c, 120, cp);
    written(&mut c, 130, cp);
    assert_eq!(c.num_pending(), 1);
    let out = ack_all(&mut c, 140, sp);
    let checkpoint = write_metadata(&out);
    let path = checkpoint.external_path.clone().unwrap();
    assert!(path.starts_with("/sp/savepoint-"), "{path}");
    let out = c.handle(
        150,
        E::MetadataWritten {
            checkpoint_id: sp,
            path: Some(path.clone()),
        },
    );
    assert!(out.contains(&A::SavepointCompleted {
        request_id: "req-1".into(),
        checkpoint_id: sp,
        path: Some(path),
    }));
    assert!(
        out.iter()
            .any(|a| matches!(a, A::NotifyCheckpointComplete { .. }))
    );
    // Not a recovery point, and later checkpoints do not discard it.
    assert_eq!(c.latest_completed().unwrap().checkpoint_id, cp);
    assert_eq!(c.latest_savepoint().unwrap().checkpoint_id, sp);
    for now in [200, 300, 400] {
        let id = tick_trigger(&mut c, now);
        ack_all(&mut c, now + 1, id);
        let out = written(&mut c, now + 2, id);
        assert!(!discarded_checkpoints(&out).contains(&sp));
    }
    let stats = c.statistics();
    assert_eq!(stats.latest.savepoint.as_ref().unwrap().id, sp);
    assert_eq!(
        stats.latest.savepoint.as_ref().unwrap().checkpoint_type,
        "SAVEPOINT"
    );
}

#[test]
fn savepoint_failures_answer_the_request_and_are_not_counted() {
    let mut c = coordinator(config(100), pipeline());
    // No directory anywhere.
    let out = c.handle(0, savepoint("a", None, SavepointKind::Savepoint));
    assert!(
        matches!(&out[..], [A::SavepointFailed { request_id, reason }]
        if request_id == "a" && reason.contains("savepoint-dir"))
    );
    // Tasks not running.
    let out = c.handle(0, savepoint("b", Some("/sp"), SavepointKind::Savepoint));
    assert!(matches!(&out[..], [A::SavepointFailed { reason, .. }]
        if reason.contains("Not all required tasks")));
    start_all(&mut c, 0, 0);
    let out = c.handle(10, savepoint("c", Some("/sp"), SavepointKind::Terminate));
    let sp = triggered(&out)[0];
    // A stop-with-savepoint holds periodic checkpoints back.
    assert!(triggered(&c.handle(500, E::Tick)).is_empty());
    let out = c.handle(510, decline(sp, TaskId::new(0, 0), 0, "no"));
    assert!(
        out.iter()
            .any(|a| matches!(a, A::SavepointFailed { request_id, .. } if request_id == "c"))
    );
    assert!(!fail_job(&out));
    assert_eq!(c.continuous_failures(), 0);
    assert_eq!(triggered(&c.handle(510, E::Tick)).len(), 1);
}

// ---------------------------------------------------------------- FLIP-147

/// `task` finishes at `now`; the tick 50 later triggers exactly `expected`
/// (attempt 0), which acknowledge 10 after: the id and the checkpoint to
/// write.
fn finish_and_checkpoint(
    c: &mut CheckpointCoordinator,
    now: u64,
    task: TaskId,
    expected: &[TaskId],
) -> (u64, CompletedCheckpoint) {
    c.handle(now, finished(task));
    let out = c.handle(now + 50, E::Tick);
    let A::TriggerCheckpoint {
        tasks,
        checkpoint_id,
        ..
    } = &out[0]
    else {
        panic!("{out:?}")
    };
    let expected: Vec<TaskAttempt> = expected.iter().copied().map(attempt0).collect();
    assert_eq!(tasks, &expected);
    let id = *checkpoint_id;
    let out = ack_all(c, now + 60, id);
    (id, write_metadata(&out).clone())
}

#[test]
fn finished_tasks_are_neither_triggered_nor_awaited() {
    let mut c = started(config(100), pipeline());
    // One source finished: the other source is still the trigger target.
    let (id, checkpoint) =
        finish_and_checkpoint(&mut c, 50, TaskId::new(0, 0), &[TaskId::new(0, 1)]);
    let src = &checkpoint.operators[&OperatorId::new("op-0")];
    assert_eq!(src.subtasks.keys().copied().collect::<Vec<_>>(), vec![1]);
    assert!(!src.fully_finished);
    written(&mut c, 120, id);

    // Both sources finished: the map tasks below them are triggered.
    let (id, checkpoint) = finish_and_checkpoint(
        &mut c,
        150,
        TaskId::new(0, 1),
        &[TaskId::new(1, 0), TaskId::new(1, 1)],
    );
    let src = &checkpoint.operators[&OperatorId::new("op-0")];
    assert!(src.fully_finished && src.subtasks.is_empty());
    let out = written(&mut c, 220, id);
    // Finished tasks are not notified.
    assert!(
        out.iter()
            .any(|a| matches!(a, A::NotifyCheckpointComplete { tasks, .. } if tasks.len() == 3))
    );

    // Everything finished: nothing more to checkpoint.
    for t in [TaskId::new(1, 0), TaskId::new(1, 1), TaskId::new(2, 0)] {
        c.handle(250, finished(t));
    }
    assert!(triggered(&c.handle(1_000, E::Tick)).is_empty());
}

// ------------------------------------------------------- ending, restoring

#[test]
fn retention_decides_what_the_end_of_the_job_discards() {
    for (retention, status, discards) in [
        (
            ExternalizedCheckpointRetention::NoExternalizedCheckpoints,
            TerminalJobStatus::Failed,
            true,
        ),
        (
            ExternalizedCheckpointRetention::NoExternalizedCheckpoints,
            TerminalJobStatus::Suspended,
            false,
        ),
        (
            ExternalizedCheckpointRetention::DeleteOnCancellation,
            TerminalJobStatus::Cancelled,
            true,
        ),
        (
            ExternalizedCheckpointRetention::DeleteOnCancellation,
            TerminalJobStatus::Failed,
            false,
        ),
        (
            ExternalizedCheckpointRetention::RetainOnCancellation,
            TerminalJobStatus::Cancelled,
            false,
        ),
    ] {
        let mut cfg = config(100);
        cfg.externalized_retention = retention;
        let mut c = started(cfg, pipeline());
        let id = run_checkpoint(&mut c, 100);
        c.handle(200, E::Tick);
        let out = c.handle(250, E::JobTerminated { status });
        assert_eq!(c.num_pending(), 0);
        assert_eq!(
            discarded_checkpoints(&out) == vec![id],
            discards,
            "{retention:?} {status:?}"
        );
        assert!(c.is_shut_down());
        assert!(triggered(&c.handle(1_000, E::Tick)).is_empty());
    }
}

#[test]
fn restoring_from_a_savepoint_continues_its_ids_and_never_deletes_it() {
    let mut donor = started(config(100), pipeline());
    for now in [100, 200, 300] {
        run_checkpoint(&mut donor, now);
    }
    let restored = donor.latest_completed().unwrap().clone();
    assert_eq!(restored.checkpoint_id, 3);

    let mut c = coordinator(config(100), pipeline());
    c.restore_from(0, restored.clone(), false).unwrap();
    assert_eq!(c.latest_completed().unwrap().checkpoint_id, 3);
    assert_eq!(c.statistics().latest.restored.as_ref().unwrap().id, 3);
    start_all(&mut c, 0, 0);
    let id = tick_trigger(&mut c, 100);
    assert_eq!(id, 4);
    ack_all(&mut c, 110, id);
    let out = written(&mut c, 120, id);
    // Subsumed from the store, but not ours to delete.
    assert!(discarded_checkpoints(&out).is_empty());
    assert_eq!(c.retained().count(), 1);

    // Max parallelism cannot change; unknown operators need permission.
    let mut other = pipeline();
    other.vertices[1].max_parallelism = 256;
    let mut c = coordinator(config(100), other);
    assert!(matches!(
        c.restore_from(0, restored.clone(), false),
        Err(RestoreError::MaxParallelismChanged {
            old: 128,
            new: 256,
            ..
        })
    ));
    let mut c = coordinator(config(100), plan(&[(2, &[]), (2, &[0])]));
    assert!(matches!(
        c.restore_from(0, restored.clone(), false),
        Err(RestoreError::NonRestoredState { .. })
    ));
    assert!(c.restore_from(0, restored, true).is_ok());
}

#[test]
fn bad_settings_and_plans_are_refused() {
    let mut cfg = config(100);
    cfg.max_concurrent = 0;
    assert!(CheckpointCoordinator::new(cfg, JOB, pipeline()).is_err());
    assert!(CheckpointCoordinator::new(config(100), JOB, plan(&[(1, &[1])])).is_err());
    let mut dup = pipeline();
    dup.vertices[1].operators = vec![OperatorId::new("op-0")];
    assert!(CheckpointCoordinator::new(config(100), JOB, dup).is_err());
}

// --------------------------------------------------------------- metadata

fn sample_checkpoint(c: &mut CheckpointCoordinator) -> CompletedCheckpoint {
    start_all(c, 0, 0);
    run_checkpoint(c, 100);
    c.latest_completed().unwrap().clone()
}

#[test]
fn metadata_round_trips() {
    let mut c = coordinator(config(100), pipeline());
    let mut cp = sample_checkpoint(&mut c);
    // Inline bytes and key-group offsets survive too.
    cp.operators
        .get_mut(&OperatorId::new("op-2"))
        .unwrap()
        .subtasks
        .get_mut(&0)
        .unwrap()
        .handles
        .push(StateHandle {
            kind: StateKind::ManagedOperator,
            location: StateLocation::Inline {
                bytes: vec![0, 1, 255],
            },
            key_groups: Some(KeyGroupRange::for_subtask(128, 1, 0)),
            key_group_offsets: (0..128).collect(),
            state_size: 3,
        });
    let bytes = metadata::serialize(&cp).unwrap();
    assert_eq!(&bytes[..8], &METADATA_MAGIC);
    assert_eq!(&bytes[8..12], &METADATA_VERSION.to_be_bytes());
    let back = metadata::deserialize(&bytes, "/ckpt/chk-1/_metadata", Some(JOB)).unwrap();
    assert_eq!(back, cp);
    assert_eq!(
        back.operators[&OperatorId::new("op-1")].max_parallelism,
        128
    );
    assert_eq!(back.operators[&OperatorId::new("op-1")].parallelism, 2);
}

#[test]
fn metadata_errors_name_the_path() {
    let mut c = coordinator(config(100), pipeline());
    let cp = sample_checkpoint(&mut c);
    let bytes = metadata::serialize(&cp).unwrap();
    let path = "/ckpt/chk-1/_metadata";

    let err = metadata::deserialize(b"PK\x03\x04garbage", path, None).unwrap_err();
    assert_eq!(err, MetadataError::BadMagic { path: path.into() });
    assert!(err.to_string().contains(path));
    assert!(matches!(
        metadata::deserialize(b"", path, None),
        Err(MetadataError::BadMagic { .. })
    ));

    let mut corrupt = bytes.clone();
    corrupt.truncate(bytes.len() / 2);
    let err = metadata::deserialize(&corrupt, path, None).unwrap_err();
    assert!(matches!(&err, MetadataError::Corrupt { path: p, .. } if p == path));
    assert!(err.to_string().contains(path));
    assert!(matches!(
        metadata::deserialize(&bytes[..10], path, None),
        Err(MetadataError::Corrupt { .. })
    ));

    let mut future = bytes.clone();
    future[8..12].copy_from_slice(&7u32.to_be_bytes());
    assert_eq!(
        metadata::deserialize(&future, path, None).unwrap_err(),
        MetadataError::UnknownVersion {
            path: path.into(),
            version: 7
        }
    );

    let err = metadata::deserialize(&bytes, path, Some(JobId(1))).unwrap_err();
    assert_eq!(
        err,
        MetadataError::OtherJob {
            path: path.into(),
            expected: JobId(1),
            found: JOB
        }
    );
    // A savepoint restore accepts any job's metadata.
    assert!(metadata::deserialize(&bytes, path, None).is_ok());
}

// ------------------------------------------------------------------ stats

#[test]
fn statistics_use_flinks_field_names() {
    let mut cfg = tolerating(10);
    cfg.timeout = Duration::from_millis(50);
    let mut c = started(cfg, pipeline());
    run_checkpoint(&mut c, 100);
    c.handle(200, E::Tick);
    c.handle(260, E::Tick); // expires 2, triggers nothing new before 300
    c.handle(300, E::Tick); // 3 in progress
    let stats = c.statistics();
    assert_eq!(
        (
            stats.counts.total,
            stats.counts.completed,
            stats.counts.failed,
            stats.counts.in_progress
        ),
        (3, 1, 1, 1)
    );
    let json = serde_json::to_value(&stats).unwrap();
    for key in ["counts", "summary", "latest", "history"] {
        assert!(json.get(key).is_some(), "{key}");
    }
    for key in [
        "state_size",
        "end_to_end_duration",
        "checkpointed_size",
        "alignment_buffered",
        "processed_data",
        "persisted_data",
    ] {
        let s = &json["summary"][key];
        for q in ["min", "max", "avg", "p50", "p90", "p95", "p99", "p999"] {
            assert!(s.get(q).is_some(), "{key}.{q}");
        }
    }
    let history = json["history"].as_array().unwrap();
    assert_eq!(history[0]["status"], "IN_PROGRESS");
    assert_eq!(history[1]["status"], "FAILED");
    assert!(
        history[1]["failure_message"]
            .as_str()
            .unwrap()
            .contains("expired")
    );
    assert_eq!(history[2]["status"], "COMPLETED");
    assert_eq!(history[2]["checkpoint_type"], "CHECKPOINT");
    assert_eq!(history[2]["num_acknowledged_subtasks"], 5);
    assert_eq!(history[2]["external_path"], "/ckpt/chk-1");
    assert_eq!(history[2]["tasks"]["1"]["num_subtasks"], 2);
    assert!(json["latest"]["completed"]["id"] == 1);
}

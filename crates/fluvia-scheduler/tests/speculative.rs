//! Speculative execution in the scheduler, on a virtual clock (Flink's
//! `SpeculativeSchedulerTest` / `ExecutionTimeBasedSlowTaskDetectorTest`):
//! a slow attempt gets a twin on another TaskManager once it ran past the
//! lower bound and the baseline, the first to finish wins and the other is
//! cancelled, a failed twin does not fail the job, the slow TaskManager is
//! blocked for new attempts until its block expires, and a vertex that does
//! not support concurrent attempts (a sink) is never speculated. Files that
//! attempts stage are committed for the winners only, once every subtask
//! finished.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Driver, Op, conf, graph};
use fluvia_core::config::options;
use fluvia_core::{Configuration, JobId};
use fluvia_scheduler::{
    Action, AttemptMetrics, Event, ExecutionState, JobState, SchedulerConfig, StagedFile,
    TaskDeploymentDescriptor, TaskManagerSpec,
};
use std::sync::Arc;
use std::time::Duration;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn speculation(block: &str) -> Configuration {
    conf(&[
        (options::SPECULATIVE_ENABLED.key, "true"),
        (options::SLOW_TASK_LOWER_BOUND.key, "10 s"),
        (options::SLOW_TASK_CHECK_INTERVAL.key, "1 s"),
        (options::SPECULATIVE_BLOCK_DURATION.key, block),
    ])
}

/// Four source subtasks on tm-1 (4 slots; tm-2 has 4 more): three finish
/// after 2 s, the fourth keeps running. Returns the driver and the slow one.
fn three_fast_one_slow(
    block: &str,
    supports_concurrent_attempts: bool,
) -> (Driver, TaskDeploymentDescriptor) {
    let mut jg = graph(&[Op("Source", Some(4), None)], &[], speculation(block));
    jg.vertices[0].supports_concurrent_attempts = supports_concurrent_attempts;
    let mut d = Driver::start_on(jg, &[4, 4], SchedulerConfig::default());
    let all = d.deployed.clone();
    assert_eq!(all.len(), 4);
    assert!(all.iter().all(|x| x.task_manager == "tm-1"));
    for x in &all {
        d.run(x);
    }
    d.advance(secs(2));
    for x in &all[..3] {
        d.finish(x, vec![]);
    }
    (d, all[3].clone())
}

fn twins(d: &mut Driver) -> Vec<TaskDeploymentDescriptor> {
    d.collect()
        .into_iter()
        .filter(|x| x.attempt.attempt > 0)
        .collect()
}

#[test]
fn a_slow_attempt_gets_a_twin_after_the_lower_bound_and_the_first_to_finish_wins() {
    let (mut d, slow) = three_fast_one_slow("0 s", true);
    // Baseline: 1.5 × the median of the finished (2 s) = 3 s, but nothing
    // is slow before the 10 s lower bound.
    for _ in 0..7 {
        d.advance(secs(1));
    }
    assert!(
        twins(&mut d).is_empty(),
        "speculated before the lower bound"
    );
    d.advance(secs(2));
    let twin = twins(&mut d);
    assert_eq!(twin.len(), 1, "one twin of the slow subtask");
    let twin = twin[0].clone();
    assert_eq!(twin.attempt.subtask, slow.attempt.subtask);
    assert_eq!(
        twin.task_manager, "tm-2",
        "away from the slow attempt's TaskManager"
    );
    let job = d.s.job(d.job).unwrap();
    assert_eq!(job.num_slow_execution_vertices, 1);
    // No third attempt while two run (max-concurrent-executions 2).
    d.advance(secs(3));
    assert!(twins(&mut d).is_empty());
    // The twin finishes first: it wins, the original is cancelled.
    d.run(&twin);
    d.event(Event::DeployAcknowledged {
        attempt: twin.attempt,
    });
    d.finish(&twin, vec![]);
    let cancels: Vec<Action> = d
        .s
        .drain_actions()
        .into_iter()
        .filter(|a| matches!(a, Action::CancelAttempt { attempt, .. } if *attempt == slow.attempt))
        .collect();
    assert_eq!(cancels.len(), 1, "the original is cancelled");
    let job = d.s.job(d.job).unwrap();
    assert_eq!(job.state, JobState::Finished);
    assert_eq!(job.num_effective_speculative_executions, 1);
    assert_eq!(job.eg.vertices[0].subtasks[3].finished_attempt, Some(1));
}

#[test]
fn a_failed_twin_does_not_fail_the_job_and_the_original_may_still_win() {
    let (mut d, slow) = three_fast_one_slow("0 s", true);
    d.advance(secs(10));
    let twin = twins(&mut d).pop().expect("a twin");
    d.run(&twin);
    d.report(&twin, ExecutionState::Failed, Some("disk full"));
    assert_eq!(d.s.job(d.job).unwrap().state, JobState::Running);
    d.finish(&slow, vec![]);
    let job = d.s.job(d.job).unwrap();
    assert_eq!(job.state, JobState::Finished);
    assert_eq!(job.num_effective_speculative_executions, 0);
}

#[test]
fn the_slow_task_manager_gets_nothing_new_until_its_block_expires() {
    let (mut d, slow) = three_fast_one_slow("30 s", true);
    d.advance(secs(10));
    assert_eq!(twins(&mut d).len(), 1);
    let blocked: Vec<(String, Duration)> =
        d.s.blocked_task_managers()
            .map(|(t, u)| (t.to_string(), u))
            .collect();
    assert_eq!(blocked.len(), 1);
    assert_eq!(blocked[0].0, "tm-1");
    // A new job while tm-1 is blocked goes to tm-2 only, though tm-1 has
    // free slots.
    let other = JobId(99);
    let jg = graph(&[Op("Other", Some(2), None)], &[], Configuration::new());
    d.s.handle(
        d.now,
        Event::SubmitJob {
            job: other,
            graph: Arc::new(jg),
            program: "p".into(),
            fingerprint: "fp".into(),
        },
    )
    .unwrap();
    let placed = d.collect();
    let placed: Vec<_> = placed.iter().filter(|x| x.attempt.job == other).collect();
    assert_eq!(placed.len(), 2);
    assert!(
        placed.iter().all(|x| x.task_manager == "tm-2"),
        "{placed:?}"
    );
    // Once nothing is slow any more, the block runs out and tm-1 takes
    // attempts again (a block is renewed while its attempt stays slow).
    d.finish(&slow, vec![]);
    d.advance(secs(20));
    assert_eq!(d.s.blocked_task_managers().count(), 1);
    d.advance(secs(11));
    assert_eq!(d.s.blocked_task_managers().count(), 0);
}

#[test]
fn a_vertex_that_does_not_support_concurrent_attempts_is_not_speculated() {
    let (mut d, _slow) = three_fast_one_slow("0 s", false);
    d.advance(secs(20));
    assert!(twins(&mut d).is_empty());
    // It is still counted slow.
    assert_eq!(d.s.job(d.job).unwrap().num_slow_execution_vertices, 1);
}

/// Finishes `x` as an attempt that staged one output file.
fn finish_staged(d: &mut Driver, x: &TaskDeploymentDescriptor) {
    d.event(Event::DeployAcknowledged { attempt: x.attempt });
    let i = x.attempt.subtask;
    d.event(Event::AttemptState {
        attempt: x.attempt,
        state: ExecutionState::Finished,
        failure: None,
        metrics: Some(AttemptMetrics {
            staged_files: vec![StagedFile {
                pending: format!("out/.part-{i}.attempt-{}.inprogress", x.attempt.attempt),
                target: format!("out/part-{i}"),
            }],
            ..AttemptMetrics::default()
        }),
    });
}

fn commits(actions: &[Action]) -> Vec<(String, Vec<(usize, u32)>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::CommitFiles {
                task_manager,
                attempts,
                ..
            } => Some((
                task_manager.clone(),
                attempts.iter().map(|x| (x.subtask, x.attempt)).collect(),
            )),
            _ => None,
        })
        .collect()
}

/// Four sink subtasks staging files, the fourth slow: its twin on tm-2 wins.
fn speculated_sink(
    config: SchedulerConfig,
) -> (Driver, TaskDeploymentDescriptor, TaskDeploymentDescriptor) {
    let mut jg = graph(&[Op("Sink", Some(4), None)], &[], speculation("0 s"));
    jg.vertices[0].supports_concurrent_attempts = true;
    let mut d = Driver::start_on(jg, &[4, 4], config);
    let all = d.deployed.clone();
    for x in &all {
        d.run(x);
    }
    d.advance(secs(2));
    for x in &all[..3] {
        finish_staged(&mut d, x);
    }
    d.advance(secs(10));
    let twin = twins(&mut d).pop().expect("a twin");
    d.run(&twin);
    (d, all[3].clone(), twin)
}

#[test]
fn only_the_winners_staged_files_are_committed_and_the_job_finishes_after_the_commit() {
    let (mut d, slow, twin) = speculated_sink(SchedulerConfig::default());
    d.s.drain_actions();
    finish_staged(&mut d, &twin);
    // The original ends too before its cancel arrives: it is no winner.
    finish_staged(&mut d, &slow);
    let actions = d.s.drain_actions();
    let mut got = commits(&actions);
    got.sort();
    assert_eq!(
        got,
        vec![
            ("tm-1".to_string(), vec![(0, 0), (1, 0), (2, 0)]),
            ("tm-2".to_string(), vec![(3, 1)]),
        ],
        "each subtask's winner, on the TaskManager that holds its files"
    );
    assert!(!actions.iter().any(|a| matches!(a, Action::JobEnded { .. })));
    assert_eq!(d.s.job(d.job).unwrap().state, JobState::Running);
    for tm in ["tm-2", "tm-1"] {
        assert_eq!(d.s.job(d.job).unwrap().state, JobState::Running);
        d.event(Event::FilesCommitted {
            job: d.job,
            task_manager: tm.into(),
            failure: None,
        });
    }
    assert_eq!(d.s.job(d.job).unwrap().state, JobState::Finished);
}

#[test]
fn a_failed_commit_fails_the_job_naming_the_task_manager() {
    let (mut d, _slow, twin) = speculated_sink(SchedulerConfig::default());
    finish_staged(&mut d, &twin);
    d.event(Event::FilesCommitted {
        job: d.job,
        task_manager: "tm-2".into(),
        failure: Some("renaming out/.part-3: permission denied".into()),
    });
    let job = d.s.job(d.job).unwrap();
    assert_eq!(job.state, JobState::Failed);
    let cause = job.failure_cause.clone().unwrap();
    assert!(
        cause.contains("tm-2") && cause.contains("permission denied"),
        "{cause}"
    );
}

#[test]
fn staged_files_on_a_lost_task_manager_are_written_again_before_the_commit() {
    let (mut d, _slow, twin) = speculated_sink(SchedulerConfig {
        restart_attempts: 1,
        ..SchedulerConfig::default()
    });
    // tm-1 (three winners' files, and the slow original) is lost.
    d.event(Event::TaskManagerLost {
        task_manager: "tm-1".into(),
        reason: "killed".into(),
    });
    d.event(Event::ProbeAnswered {
        task_manager: "tm-2".into(),
        alive: true,
    });
    // After the restart delay.
    d.advance(secs(2));
    let again = d.collect();
    let mut rerun: Vec<usize> = again.iter().map(|x| x.attempt.subtask).collect();
    rerun.sort();
    assert_eq!(
        rerun,
        vec![0, 1, 2],
        "the finished subtasks whose files were on tm-1"
    );
    assert!(again.iter().all(|x| x.task_manager == "tm-2"));
    finish_staged(&mut d, &twin);
    for x in &again {
        d.run(x);
        finish_staged(&mut d, x);
    }
    let got = commits(&d.s.drain_actions());
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, "tm-2");
    assert_eq!(got[0].1.len(), 4);
}

#[test]
fn a_task_manager_lost_after_its_commit_changes_nothing() {
    let (mut d, slow, twin) = speculated_sink(SchedulerConfig::default());
    finish_staged(&mut d, &twin);
    finish_staged(&mut d, &slow);
    assert_eq!(commits(&d.s.drain_actions()).len(), 2);
    d.event(Event::FilesCommitted {
        job: d.job,
        task_manager: "tm-1".into(),
        failure: None,
    });
    d.event(Event::TaskManagerLost {
        task_manager: "tm-1".into(),
        reason: "killed".into(),
    });
    assert!(d.collect().is_empty(), "nothing runs again");
    assert_eq!(d.s.job(d.job).unwrap().state, JobState::Running);
    d.event(Event::FilesCommitted {
        job: d.job,
        task_manager: "tm-2".into(),
        failure: None,
    });
    assert_eq!(d.s.job(d.job).unwrap().state, JobState::Finished);
}

#[test]
fn a_task_manager_that_registers_again_has_dropped_its_staged_files() {
    let (mut d, _slow, _twin) = speculated_sink(SchedulerConfig {
        restart_attempts: 1,
        ..SchedulerConfig::default()
    });
    // tm-1 dropped its jobs and registers again (same id).
    d.event(Event::RegisterTaskManager(TaskManagerSpec {
        id: "tm-1".into(),
        slots: 4,
        fingerprint: "fp".into(),
        data_address: "tm-1:6121".into(),
    }));
    for tm in ["tm-1", "tm-2"] {
        d.event(Event::ProbeAnswered {
            task_manager: tm.into(),
            alive: true,
        });
    }
    d.advance(secs(2));
    let mut rerun: Vec<usize> = d.collect().iter().map(|x| x.attempt.subtask).collect();
    rerun.sort();
    assert_eq!(rerun, vec![0, 1, 2], "the winners whose files tm-1 dropped");
}

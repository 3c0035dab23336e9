//! Speculative execution in the scheduler, on a virtual clock (Flink's
//! `SpeculativeSchedulerTest` / `ExecutionTimeBasedSlowTaskDetectorTest`):
//! a slow attempt gets a twin on another TaskManager once it ran past the
//! lower bound and the baseline, the first to finish wins and the other is
//! cancelled, a failed twin does not fail the job, the slow TaskManager is
//! blocked for new attempts until its block expires, and a vertex that does
//! not support concurrent attempts (a sink) is never speculated.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Driver, Op, conf, graph};
use fluvia_core::config::options;
use fluvia_core::{Configuration, JobId};
use fluvia_scheduler::{Action, Deployment, Event, ExecutionState, JobState, SchedulerConfig};
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
fn three_fast_one_slow(block: &str, supports_concurrent_attempts: bool) -> (Driver, Deployment) {
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

fn twins(d: &mut Driver) -> Vec<Deployment> {
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

//! Unit tests of the scheduler state machine, in the style of Flink's
//! `DefaultSchedulerTest` / `RestartPipelinedRegionFailoverStrategyTest`:
//! a tiny [`Driver`] plays the JobManager's shell (registers TaskManagers,
//! submits jobs, acknowledges deploys, reports attempt states, sends
//! heartbeats, moves the clock) and every test checks which actions the
//! scheduler asked for and what it believes about attempts, slots and jobs.
//!
//! Covered: input-driven deployment in batch (blocking) and streaming
//! (pipelined) jobs, slot sharing and slot shortage, restart strategies
//! (none, fixed delay, merged failures, exhausted budget), lost
//! TaskManagers (event and heartbeat timeout), stale and duplicate reports,
//! concurrent attempts (speculation), heartbeat reconciliation, failed
//! deployments and refused job graphs.

#![allow(clippy::unwrap_used)]

mod common;

use fluvia_core::{Configuration, JobId, PartitionerKind};
use fluvia_graph::{JobGraph, StreamGraphBuilder};
use fluvia_scheduler::{
    Action, Event, Execution, ExecutionAttemptId, ExecutionState, Job, JobState, PartitionRef,
    Scheduler, SchedulerConfig, ShuffleServiceSpec, TaskDeploymentDescriptor, TaskManagerSpec,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

const FP: &str = "fingerprint-of-the-program";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

// ------------------------------------------------------------------ graphs

/// One operator of a test graph: name, parallelism, slot sharing group.
struct V(&'static str, usize, Option<&'static str>);

/// A JobGraph with one vertex per operator (chaining off), vertex `k` being
/// `vs[k]`; `edges` are (from, to, partitioner). Vertex 0 is the only
/// source, bounded (a batch job) or not (a streaming job).
fn graph(bounded: bool, vs: &[V], edges: &[(usize, usize, PartitionerKind)]) -> JobGraph {
    let names: Vec<&'static str> = vs.iter().map(|v| v.0).collect();
    let configure = |b: &mut StreamGraphBuilder, id, k: usize| {
        let V(_, p, group) = &vs[k];
        b.set_parallelism(id, *p);
        if let Some(g) = group {
            b.set_slot_sharing_group(id, *g);
        }
    };
    common::job_graph(
        "test-job",
        bounded,
        &names,
        configure,
        edges,
        Configuration::new(),
    )
}

/// `Source (p) -> Map (p)` with a FORWARD edge: map subtask i reads only
/// source subtask i.
fn batch_forward(p: usize) -> JobGraph {
    use PartitionerKind::Forward;
    graph(
        true,
        &[V("Source", p, None), V("Map", p, None)],
        &[(0, 1, Forward)],
    )
}

// ------------------------------------------------------------------ driver

/// Plays the JobManager's shell and the TaskManagers around a scheduler.
struct Driver {
    s: Scheduler,
    now: Duration,
    /// Actions produced since the last [`Driver::take`].
    out: Vec<Action>,
    /// What each (simulated) TaskManager runs: acknowledged attempts that
    /// have not reported an end yet.
    running: BTreeMap<String, BTreeSet<ExecutionAttemptId>>,
    /// Probes asked for and not yet answered.
    probes: BTreeSet<String>,
    /// Every deployment ever asked for.
    deployed: Vec<TaskDeploymentDescriptor>,
    next_job: u128,
}

impl Driver {
    fn new(config: SchedulerConfig) -> Self {
        Driver {
            s: Scheduler::new(config),
            now: Duration::ZERO,
            out: Vec::new(),
            running: BTreeMap::new(),
            probes: BTreeSet::new(),
            deployed: Vec::new(),
            next_job: 1,
        }
    }

    /// Fixed-delay restarts: `attempts` restarts, 1 s apart.
    fn with_restarts(attempts: usize) -> Self {
        Driver::new(SchedulerConfig {
            restart_attempts: attempts,
            restart_delay: secs(1),
            ..SchedulerConfig::default()
        })
    }

    fn handle(&mut self, e: Event) -> fluvia_core::Result<()> {
        let r = self.s.handle(self.now, e);
        for a in self.s.drain_actions() {
            match &a {
                Action::Probe { task_manager } => {
                    self.probes.insert(task_manager.clone());
                }
                Action::Deploy(d) => self.deployed.push((**d).clone()),
                _ => {}
            }
            self.out.push(a);
        }
        r
    }

    /// The actions since the last call.
    fn take(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.out)
    }

    fn tm(&mut self, id: &str, slots: usize) {
        self.tm_with(id, slots, FP);
    }

    fn tm_with(&mut self, id: &str, slots: usize, fingerprint: &str) {
        self.handle(Event::RegisterTaskManager(TaskManagerSpec {
            id: id.to_string(),
            slots,
            fingerprint: fingerprint.to_string(),
            data_address: format!("{id}:6121"),
        }))
        .unwrap();
        self.running.entry(id.to_string()).or_default();
    }

    fn try_submit(&mut self, graph: JobGraph, fingerprint: &str) -> fluvia_core::Result<JobId> {
        let job = JobId(self.next_job);
        self.next_job += 1;
        self.handle(Event::SubmitJob {
            job,
            graph: Arc::new(graph),
            program: "test-program".to_string(),
            fingerprint: fingerprint.to_string(),
        })?;
        Ok(job)
    }

    fn submit(&mut self, graph: JobGraph) -> JobId {
        self.try_submit(graph, FP).unwrap()
    }

    /// Moves the clock and ticks.
    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.handle(Event::Tick).unwrap();
    }

    /// Moves the clock in steps of `step`, every step sending a heartbeat
    /// from each TaskManager in `alive` listing what it runs.
    fn advance_with_heartbeats(&mut self, d: Duration, step: Duration, alive: &[&str]) {
        let end = self.now + d;
        while self.now < end {
            self.now = (self.now + step).min(end);
            self.handle(Event::Tick).unwrap();
            for tm in alive {
                self.heartbeat(tm);
            }
        }
    }

    fn heartbeat(&mut self, tm: &str) {
        let running = self.running[tm].iter().copied().collect();
        self.handle(Event::Heartbeat {
            task_manager: tm.to_string(),
            running,
        })
        .unwrap();
    }

    /// Answers every outstanding probe: alive unless listed in `dead`.
    fn answer_probes(&mut self, dead: &[&str]) {
        for tm in std::mem::take(&mut self.probes) {
            self.handle(Event::ProbeAnswered {
                alive: !dead.contains(&tm.as_str()),
                task_manager: tm,
            })
            .unwrap();
        }
    }

    /// Lets a pending restart fire: probes answered, restart delay passed.
    fn let_restart_fire(&mut self) {
        self.answer_probes(&[]);
        let delay = self.s.config().restart_delay;
        self.advance(delay);
    }

    fn tm_of(&self, a: ExecutionAttemptId) -> String {
        self.attempt(a).task_manager.clone().unwrap()
    }

    fn ack(&mut self, a: ExecutionAttemptId) {
        let tm = self.tm_of(a);
        self.running.entry(tm).or_default().insert(a);
        self.handle(Event::DeployAcknowledged { attempt: a })
            .unwrap();
    }

    fn report(&mut self, a: ExecutionAttemptId, state: ExecutionState, failure: Option<&str>) {
        if state.is_terminal() {
            for set in self.running.values_mut() {
                set.remove(&a);
            }
        }
        self.handle(Event::AttemptState {
            attempt: a,
            state,
            failure: failure.map(str::to_string),
            metrics: None,
        })
        .unwrap();
    }

    fn run(&mut self, a: ExecutionAttemptId) {
        self.report(a, ExecutionState::Running, None);
    }

    fn finish(&mut self, a: ExecutionAttemptId) {
        self.report(a, ExecutionState::Finished, None);
    }

    fn fail(&mut self, a: ExecutionAttemptId, cause: &str) {
        self.report(a, ExecutionState::Failed, Some(cause));
    }

    fn canceled(&mut self, a: ExecutionAttemptId) {
        self.report(a, ExecutionState::Canceled, None);
    }

    /// Acknowledges and reports RUNNING for every deploy among the actions
    /// since the last take; returns the deployed attempts.
    fn start_deploys(&mut self) -> Vec<ExecutionAttemptId> {
        let deployed: Vec<ExecutionAttemptId> = deploys(&self.take())
            .into_iter()
            .map(|d| d.attempt)
            .collect();
        for &a in &deployed {
            self.ack(a);
            self.run(a);
        }
        deployed
    }

    fn job(&self, id: JobId) -> &Job {
        self.s.job(id).unwrap()
    }

    fn attempt(&self, a: ExecutionAttemptId) -> &Execution {
        self.job(a.job).eg.vertices[a.vertex].subtasks[a.subtask]
            .attempt(a.attempt)
            .unwrap()
    }

    fn finished_attempt(&self, job: JobId, v: usize, i: usize) -> Option<u32> {
        self.job(job).eg.vertices[v].subtasks[i].finished_attempt
    }

    fn used_slots(&self, tm: &str) -> usize {
        self.s
            .task_managers()
            .find(|(spec, _)| spec.id == tm)
            .map(|(_, used)| used)
            .unwrap()
    }

    /// No deployment ever went to `tm` after `since` deployments.
    fn assert_nothing_deployed_to(&self, tm: &str, since: usize) {
        let late: Vec<_> = self.deployed[since..]
            .iter()
            .filter(|d| d.task_manager == tm)
            .map(|d| d.attempt)
            .collect();
        assert!(late.is_empty(), "deployed to {tm}: {late:?}");
    }
}

fn aid(job: JobId, vertex: usize, subtask: usize, attempt: u32) -> ExecutionAttemptId {
    ExecutionAttemptId {
        job,
        vertex,
        subtask,
        attempt,
    }
}

fn deploys(actions: &[Action]) -> Vec<TaskDeploymentDescriptor> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Deploy(d) => Some((**d).clone()),
            _ => None,
        })
        .collect()
}

/// (vertex, subtask, attempt) of each deploy, sorted.
fn deployed(actions: &[Action]) -> Vec<(usize, usize, u32)> {
    let mut v: Vec<_> = deploys(actions)
        .iter()
        .map(|d| (d.attempt.vertex, d.attempt.subtask, d.attempt.attempt))
        .collect();
    v.sort();
    v
}

fn cancels(actions: &[Action]) -> Vec<ExecutionAttemptId> {
    let mut v: Vec<_> = actions
        .iter()
        .filter_map(|a| match a {
            Action::CancelAttempt { attempt, .. } => Some(*attempt),
            _ => None,
        })
        .collect();
    v.sort();
    v
}

fn ended(actions: &[Action]) -> Vec<JobState> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::JobEnded { state, .. } => Some(*state),
            _ => None,
        })
        .collect()
}

/// The producer attempts a deployment reads, as (subtask, attempt), sorted
/// and deduplicated.
fn inputs(d: &TaskDeploymentDescriptor) -> Vec<(u32, u32)> {
    let set: BTreeSet<(u32, u32)> = d
        .inputs
        .iter()
        .map(|i| (i.partition.producer_subtask, i.partition.attempt))
        .collect();
    set.into_iter().collect()
}

// ------------------------------------------------------- batch / streaming

#[test]
fn batch_deploys_a_consumer_only_after_all_its_producers_finished() {
    use PartitionerKind::{Hash, Rebalance};
    let mut d = Driver::with_restarts(0);
    d.tm("tm-1", 4);
    let job = d.submit(graph(
        true,
        &[V("Source", 2, None), V("Map", 2, None), V("Sink", 1, None)],
        &[(0, 1, Hash), (1, 2, Rebalance)],
    ));
    // Sources first, nothing else.
    let acts = d.take();
    assert_eq!(deployed(&acts), vec![(0, 0, 0), (0, 1, 0)]);
    for a in [aid(job, 0, 0, 0), aid(job, 0, 1, 0)] {
        d.ack(a);
        d.run(a);
    }
    assert!(deployed(&d.take()).is_empty());
    // One producer finished: the all-to-all consumers still wait.
    d.finish(aid(job, 0, 0, 0));
    assert!(deployed(&d.take()).is_empty());
    assert_eq!(
        d.attempt(aid(job, 1, 0, 0)).state,
        ExecutionState::Created,
        "a consumer does not even take a slot before its inputs are there"
    );
    d.finish(aid(job, 0, 1, 0));
    let acts = d.take();
    assert_eq!(deployed(&acts), vec![(1, 0, 0), (1, 1, 0)]);
    for dep in deploys(&acts) {
        assert_eq!(inputs(&dep), vec![(0, 0), (1, 0)], "reads both winners");
        assert!(dep.inputs.iter().all(|i| i.local));
    }
    for a in [aid(job, 1, 0, 0), aid(job, 1, 1, 0)] {
        d.ack(a);
        d.run(a);
    }
    d.finish(aid(job, 1, 1, 0));
    assert!(deployed(&d.take()).is_empty(), "the sink reads both maps");
    d.finish(aid(job, 1, 0, 0));
    assert_eq!(deployed(&d.take()), vec![(2, 0, 0)]);
    d.ack(aid(job, 2, 0, 0));
    d.finish(aid(job, 2, 0, 0));
    assert_eq!(ended(&d.take()), vec![JobState::Finished]);
    assert_eq!(d.job(job).state, JobState::Finished);
}

#[test]
fn batch_pointwise_consumer_waits_only_for_the_partitions_it_reads() {
    let mut d = Driver::with_restarts(0);
    d.tm("tm-1", 4);
    let job = d.submit(batch_forward(2));
    assert_eq!(deployed(&d.take()), vec![(0, 0, 0), (0, 1, 0)]);
    d.ack(aid(job, 0, 1, 0));
    d.finish(aid(job, 0, 1, 0));
    let acts = d.take();
    assert_eq!(deployed(&acts), vec![(1, 1, 0)]);
    assert_eq!(inputs(&deploys(&acts)[0]), vec![(1, 0)]);
}

#[test]
fn streaming_deploys_a_region_on_one_task_manager_in_one_wave_producers_first() {
    use PartitionerKind::Hash;
    let mut d = Driver::with_restarts(0);
    d.tm("tm-1", 2);
    let job = d.submit(graph(
        false,
        &[V("Source", 2, None), V("Map", 2, None)],
        &[(0, 1, Hash)],
    ));
    assert_eq!(d.job(job).state, JobState::Running);
    // The TaskManager creates its deployments in order: the sources'
    // partitions exist when the maps (queued behind them) ask.
    let acts = d.take();
    assert_eq!(
        deployed(&acts),
        vec![(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]
    );
    for dep in &deploys(&acts)[2..] {
        assert_eq!(inputs(dep), vec![(0, 0), (1, 0)]);
        assert!(dep.inputs.iter().all(|i| i.local));
    }
}

#[test]
fn streaming_deploys_a_consumer_once_its_remote_producers_are_acknowledged() {
    use PartitionerKind::Hash;
    let mut d = Driver::with_restarts(0);
    d.tm("tm-1", 1);
    d.tm("tm-2", 1);
    let job = d.submit(graph(
        false,
        &[V("Source", 2, None), V("Map", 2, None)],
        &[(0, 1, Hash)],
    ));
    assert_eq!(d.job(job).state, JobState::Running);
    assert_eq!(deployed(&d.take()), vec![(0, 0, 0), (0, 1, 0)]);
    // The whole region has its slots already.
    for i in 0..2 {
        assert_eq!(
            d.attempt(aid(job, 1, i, 0)).state,
            ExecutionState::Scheduled
        );
    }
    assert_eq!(d.tm_of(aid(job, 1, 0, 0)), "tm-1");
    assert_eq!(d.tm_of(aid(job, 1, 1, 0)), "tm-2");
    // Map 1 reads source 0 over the network (now acknowledged) and source
    // 1 on its own TaskManager (deploying there ahead of it); map 0 still
    // waits for source 1 on the other TaskManager.
    d.ack(aid(job, 0, 0, 0));
    let acts = d.take();
    assert_eq!(deployed(&acts), vec![(1, 1, 0)]);
    let local: Vec<bool> = deploys(&acts)[0].inputs.iter().map(|i| i.local).collect();
    assert_eq!(local, vec![false, true]);
    d.ack(aid(job, 0, 1, 0));
    let acts = d.take();
    assert_eq!(deployed(&acts), vec![(1, 0, 0)]);
    assert_eq!(inputs(&deploys(&acts)[0]), vec![(0, 0), (1, 0)]);
}

#[test]
fn a_streaming_member_whose_slot_was_lost_is_placed_again() {
    use PartitionerKind::Rebalance;
    // Source -> Mid -> Sink in three slot sharing groups, one TaskManager
    // each; Mid's TaskManager is lost while Mid waits for Source's ack.
    let mut d = Driver::with_restarts(0);
    for tm in ["tm-1", "tm-2", "tm-3"] {
        d.tm(tm, 1);
    }
    let job = d.submit(graph(
        false,
        &[
            V("Source", 1, Some("a")),
            V("Mid", 1, Some("b")),
            V("Sink", 1, Some("c")),
        ],
        &[(0, 1, Rebalance), (1, 2, Rebalance)],
    ));
    assert_eq!(deployed(&d.take()), vec![(0, 0, 0)]);
    let (mid, sink) = (aid(job, 1, 0, 0), aid(job, 2, 0, 0));
    assert_eq!(d.tm_of(mid), "tm-2");
    assert_eq!(d.tm_of(sink), "tm-3");
    d.handle(Event::TaskManagerLost {
        task_manager: "tm-2".to_string(),
        reason: "killed".to_string(),
    })
    .unwrap();
    assert_eq!(d.attempt(mid).state, ExecutionState::Created);
    assert_eq!(d.attempt(sink).state, ExecutionState::Scheduled);
    assert_eq!(d.job(job).restarts, 0, "nothing of it ran there");
    d.tm("tm-4", 1);
    d.ack(aid(job, 0, 0, 0));
    let acts = d.take();
    assert_eq!(deployed(&acts), vec![(1, 0, 0)], "{acts:?}");
    assert_eq!(d.tm_of(mid), "tm-4");
    d.ack(mid);
    assert_eq!(deployed(&d.take()), vec![(2, 0, 0)]);
}

// ------------------------------------------------------------------- slots

#[test]
fn subtask_i_of_each_vertex_of_a_slot_sharing_group_shares_one_slot() {
    use PartitionerKind::Rebalance;
    let mut d = Driver::with_restarts(0);
    d.tm("tm-1", 2);
    d.tm("tm-2", 2);
    let job = d.submit(graph(
        false,
        &[V("Source", 2, None), V("Map", 3, None)],
        &[(0, 1, Rebalance)],
    ));
    let j = d.job(job);
    assert_eq!(j.slots.len(), 3, "max parallelism of the group");
    for i in 0..2 {
        assert_eq!(
            d.attempt(aid(job, 0, i, 0)).slot,
            d.attempt(aid(job, 1, i, 0)).slot,
            "subtask {i} of Source and Map share a slot"
        );
    }
    for s in j.slots.values() {
        let mut vertices: Vec<usize> = s.hosted.iter().map(|h| h.0).collect();
        let n = vertices.len();
        vertices.dedup();
        assert_eq!(vertices.len(), n, "one attempt per vertex in {s:?}");
        assert!(s.hosted.iter().all(|h| h.1 == s.index));
    }
    assert_eq!(d.used_slots("tm-1"), 2);
    assert_eq!(d.used_slots("tm-2"), 1);
    assert_eq!(
        j.slots_per_task_manager(),
        BTreeMap::from([("tm-1".to_string(), 2), ("tm-2".to_string(), 1)])
    );
}

#[test]
fn different_slot_sharing_groups_take_different_slots() {
    use PartitionerKind::Rebalance;
    let mut d = Driver::with_restarts(0);
    d.tm("tm-1", 8);
    let job = d.submit(graph(
        false,
        &[V("Source", 2, Some("a")), V("Map", 3, Some("b"))],
        &[(0, 1, Rebalance)],
    ));
    assert_eq!(d.job(job).slots.len(), 5);
    assert_eq!(d.used_slots("tm-1"), 5);
    let slots: BTreeSet<u64> = (0..2)
        .map(|i| aid(job, 0, i, 0))
        .chain((0..3).map(|i| aid(job, 1, i, 0)))
        .map(|a| d.attempt(a).slot.unwrap())
        .collect();
    assert_eq!(slots.len(), 5);
}

#[test]
fn a_batch_job_never_uses_more_slots_than_the_task_manager_has() {
    let mut d = Driver::with_restarts(0);
    d.tm("tm-1", 2);
    let job = d.submit(graph(true, &[V("Source", 3, None)], &[]));
    assert_eq!(deployed(&d.take()), vec![(0, 0, 0), (0, 1, 0)]);
    assert_eq!(d.used_slots("tm-1"), 2);
    for a in [aid(job, 0, 0, 0), aid(job, 0, 1, 0)] {
        d.ack(a);
        d.run(a);
    }
    // Waiting while something runs is not a slot timeout.
    d.advance_with_heartbeats(secs(400), secs(10), &["tm-1"]);
    assert_eq!(d.job(job).state, JobState::Running);
    assert!(deployed(&d.take()).is_empty());
    d.finish(aid(job, 0, 1, 0));
    assert_eq!(deployed(&d.take()), vec![(0, 2, 0)]);
    assert_eq!(d.used_slots("tm-1"), 2);
}

#[test]
fn a_job_that_cannot_get_its_slots_fails_after_the_slot_request_timeout() {
    use PartitionerKind::Rebalance;
    let mut d = Driver::with_restarts(5);
    d.tm("tm-1", 2);
    let job = d.submit(graph(
        false,
        &[V("Source", 1, None), V("Map", 3, None)],
        &[(0, 1, Rebalance)],
    ));
    assert!(deployed(&d.take()).is_empty(), "all of the region or none");
    assert_eq!(d.used_slots("tm-1"), 0);
    let timeout = d.s.config().slot_request_timeout;
    d.advance_with_heartbeats(timeout - ms(1), secs(10), &["tm-1"]);
    assert_eq!(d.job(job).state, JobState::Running);
    d.advance(ms(1));
    assert_eq!(ended(&d.take()), vec![JobState::Failed]);
    let cause = d.job(job).failure_cause.clone().unwrap();
    assert!(cause.contains("not enough slots"), "{cause}");
    assert!(cause.contains("needs 3 slots"), "{cause}");
    assert_eq!(d.job(job).restarts, 0, "a slot shortage is not restarted");
}

#[test]
fn a_job_whose_program_no_task_manager_carries_fails_after_the_timeout() {
    let mut d = Driver::with_restarts(5);
    d.tm_with("tm-1", 4, "another-program");
    let job = d.submit(batch_forward(1));
    assert!(deployed(&d.take()).is_empty());
    let timeout = d.s.config().slot_request_timeout;
    d.advance_with_heartbeats(timeout, secs(10), &["tm-1"]);
    assert_eq!(ended(&d.take()), vec![JobState::Failed]);
    let cause = d.job(job).failure_cause.clone().unwrap();
    assert!(
        cause.contains("no registered TaskManager carries program"),
        "{cause}"
    );
    assert!(d.deployed.is_empty());
}

#[test]
fn a_task_manager_registering_in_time_ends_the_slot_wait() {
    let mut d = Driver::with_restarts(0);
    d.tm_with("other", 4, "another-program");
    let job = d.submit(batch_forward(1));
    d.advance_with_heartbeats(secs(200), secs(10), &["other"]);
    d.tm("tm-1", 1);
    assert_eq!(deployed(&d.take()), vec![(0, 0, 0)]);
    assert_eq!(d.deployed[0].task_manager, "tm-1");
    d.advance_with_heartbeats(secs(200), secs(10), &["other", "tm-1"]);
    assert_eq!(d.job(job).state, JobState::Running);
}

// --------------------------------------------------------- restart strategy

#[test]
fn without_restarts_the_first_failure_fails_the_job_with_its_cause() {
    let mut d = Driver::with_restarts(0);
    d.tm("tm-1", 2);
    let job = d.submit(batch_forward(2));
    d.start_deploys();
    d.fail(aid(job, 0, 1, 0), "boom: disk full");
    let acts = d.take();
    assert_eq!(ended(&acts), vec![JobState::Failed]);
    assert!(acts.contains(&Action::ReleaseJob {
        task_manager: "tm-1".to_string(),
        job
    }));
    let j = d.job(job);
    assert_eq!(j.state, JobState::Failed);
    let cause = j.failure_cause.clone().unwrap();
    assert!(
        cause.contains("boom: disk full") && cause.contains("Source (2/2)"),
        "{cause}"
    );
    assert_eq!(d.used_slots("tm-1"), 0, "an ended job gives its slots back");
    // Nothing of it runs on.
    assert!(
        (0..2).all(|i| !d.attempt(aid(job, 0, i, 0)).state.is_live()),
        "every attempt ended"
    );
}

#[test]
fn a_batch_failure_restarts_only_the_failed_subtask_after_the_delay() {
    let mut d = Driver::with_restarts(3);
    d.tm("tm-1", 4);
    let job = d.submit(batch_forward(2));
    d.start_deploys();
    d.fail(aid(job, 0, 0, 0), "boom");
    let acts = d.take();
    assert!(deployed(&acts).is_empty(), "not before the delay");
    assert!(cancels(&acts).is_empty(), "the other subtask runs on");
    assert!(
        acts.iter().any(|a| matches!(a, Action::Probe { .. })),
        "TaskManagers are probed before the restart"
    );
    assert_eq!(d.job(job).state, JobState::Running);
    d.answer_probes(&[]);
    d.advance(ms(999));
    assert!(deployed(&d.take()).is_empty());
    d.advance(ms(1));
    assert_eq!(deployed(&d.take()), vec![(0, 0, 1)]);
    assert_eq!(d.job(job).restarts, 1);
    assert_eq!(
        d.attempt(aid(job, 0, 1, 0)).state,
        ExecutionState::Running,
        "untouched"
    );
    assert_eq!(d.job(job).eg.vertices[0].subtasks[1].attempts.len(), 1);
    // The re-run finishes and the job goes on.
    d.ack(aid(job, 0, 0, 1));
    d.finish(aid(job, 0, 0, 1));
    d.finish(aid(job, 0, 1, 0));
    d.start_deploys();
    d.finish(aid(job, 1, 0, 0));
    d.finish(aid(job, 1, 1, 0));
    assert_eq!(d.job(job).state, JobState::Finished);
    assert_eq!(d.finished_attempt(job, 0, 0), Some(1));
}

#[test]
fn a_restart_waits_for_probe_answers_until_the_probe_timeout() {
    let mut d = Driver::new(SchedulerConfig {
        restart_attempts: 3,
        restart_delay: secs(1),
        probe_timeout: secs(3),
        ..SchedulerConfig::default()
    });
    d.tm("tm-1", 4);
    let job = d.submit(batch_forward(1));
    d.start_deploys();
    d.fail(aid(job, 0, 0, 0), "boom");
    d.take();
    // No answer: the restart waits for the probe timeout, not longer.
    let (delay, probe_timeout) = (secs(1), secs(3));
    d.advance(delay);
    assert!(deployed(&d.take()).is_empty());
    let next = d.s.poll_timeout().unwrap();
    assert!(next > d.now, "poll_timeout {next:?} is not after now");
    d.advance(probe_timeout - delay);
    assert_eq!(deployed(&d.take()), vec![(0, 0, 1)]);
}

#[test]
fn a_probe_answered_dead_loses_the_task_manager_before_the_restart() {
    let mut d = Driver::with_restarts(3);
    d.tm("tm-1", 2);
    d.tm("tm-2", 2);
    let job = d.submit(batch_forward(1));
    d.start_deploys();
    assert_eq!(d.tm_of(aid(job, 0, 0, 0)), "tm-1");
    d.fail(aid(job, 0, 0, 0), "boom");
    d.answer_probes(&["tm-1"]);
    assert!(!d.s.is_registered("tm-1"));
    let before = d.deployed.len();
    d.advance(secs(1));
    assert_eq!(deployed(&d.take()), vec![(0, 0, 1)]);
    assert_eq!(d.tm_of(aid(job, 0, 0, 1)), "tm-2");
    d.assert_nothing_deployed_to("tm-1", before);
}

#[test]
fn a_streaming_failure_cancels_and_restarts_every_task() {
    use PartitionerKind::Hash;
    let mut d = Driver::with_restarts(3);
    d.tm("tm-1", 4);
    let job = d.submit(graph(
        false,
        &[V("Source", 2, None), V("Map", 2, None)],
        &[(0, 1, Hash)],
    ));
    assert_eq!(d.start_deploys().len(), 4, "sources and maps in one wave");
    d.fail(aid(job, 1, 1, 0), "boom");
    let acts = d.take();
    assert_eq!(
        cancels(&acts),
        vec![aid(job, 0, 0, 0), aid(job, 0, 1, 0), aid(job, 1, 0, 0)]
    );
    assert_eq!(d.job(job).state, JobState::Restarting);
    d.answer_probes(&[]);
    d.advance(secs(1));
    assert!(
        deployed(&d.take()).is_empty(),
        "not before the cancelled attempts stopped"
    );
    for a in cancels(&acts) {
        d.canceled(a);
    }
    let acts = d.take();
    assert_eq!(
        deployed(&acts),
        vec![(0, 0, 1), (0, 1, 1), (1, 0, 1), (1, 1, 1)]
    );
    assert_eq!(d.job(job).state, JobState::Running);
    assert_eq!(d.job(job).restarts, 1);
    for dep in &deploys(&acts)[2..] {
        assert_eq!(inputs(dep), vec![(0, 1), (1, 1)], "the new sources");
    }
    // A cancelled attempt's CANCELED is not a failure.
    assert_eq!(d.job(job).restarts, 1);
}

#[test]
fn a_streaming_attempt_that_finishes_while_cancelled_does_not_win() {
    use PartitionerKind::Hash;
    let mut d = Driver::with_restarts(3);
    d.tm("tm-1", 4);
    let job = d.submit(graph(
        false,
        &[V("Source", 1, None), V("Map", 1, None)],
        &[(0, 1, Hash)],
    ));
    d.start_deploys();
    d.fail(aid(job, 1, 0, 0), "boom");
    assert_eq!(cancels(&d.take()), vec![aid(job, 0, 0, 0)]);
    // The source ended before the cancel arrived.
    d.finish(aid(job, 0, 0, 0));
    assert_eq!(d.finished_attempt(job, 0, 0), None);
    d.let_restart_fire();
    let acts = d.take();
    assert_eq!(deployed(&acts), vec![(0, 0, 1), (1, 0, 1)]);
    assert_eq!(inputs(&deploys(&acts)[1]), vec![(0, 1)]);
}

#[test]
fn failures_before_the_pending_restart_fires_count_as_one_restart() {
    let mut d = Driver::with_restarts(1);
    d.tm("tm-1", 4);
    let job = d.submit(graph(true, &[V("Source", 3, None)], &[]));
    d.start_deploys();
    d.fail(aid(job, 0, 0, 0), "boom 1");
    d.advance(ms(500));
    d.fail(aid(job, 0, 1, 0), "boom 2");
    assert_eq!(d.job(job).restarts, 1);
    d.answer_probes(&[]);
    d.advance(ms(500));
    assert_eq!(deployed(&d.take()), vec![(0, 0, 1), (0, 1, 1)]);
    assert_eq!(d.job(job).state, JobState::Running);
    assert_eq!(d.job(job).restarts, 1);
    assert_eq!(d.job(job).eg.vertices[0].subtasks[2].attempts.len(), 1);
    // The budget of one restart is spent: the next failure fails the job.
    d.ack(aid(job, 0, 0, 1));
    d.fail(aid(job, 0, 0, 1), "boom 3");
    assert_eq!(ended(&d.take()), vec![JobState::Failed]);
    let cause = d.job(job).failure_cause.clone().unwrap();
    assert!(cause.contains("boom 3"), "{cause}");
}

#[test]
fn an_exhausted_restart_budget_fails_the_job() {
    let mut d = Driver::with_restarts(2);
    d.tm("tm-1", 1);
    let job = d.submit(batch_forward(1));
    for n in 0..3u32 {
        let started = d.start_deploys();
        assert_eq!(started, vec![aid(job, 0, 0, n)]);
        d.fail(aid(job, 0, 0, n), &format!("boom {n}"));
        if n < 2 {
            assert_eq!(d.job(job).state, JobState::Running);
            d.let_restart_fire();
        }
    }
    assert_eq!(d.job(job).state, JobState::Failed);
    assert_eq!(d.job(job).restarts, 2);
    assert_eq!(ended(&d.take()), vec![JobState::Failed]);
}

// ------------------------------------------------------- lost TaskManagers

/// `Source (2) -FORWARD-> Map (2)` on tm-1 (1 slot) and tm-2 (1 slot):
/// source 0 runs on tm-1, source 1 on tm-2.
fn two_tm_forward_job(d: &mut Driver) -> JobId {
    d.tm("tm-1", 1);
    d.tm("tm-2", 1);
    let job = d.submit(batch_forward(2));
    d.start_deploys();
    assert_eq!(d.tm_of(aid(job, 0, 0, 0)), "tm-1");
    assert_eq!(d.tm_of(aid(job, 0, 1, 0)), "tm-2");
    job
}

#[test]
fn a_lost_task_manager_reruns_what_ran_there_and_the_results_still_needed() {
    let mut d = Driver::with_restarts(5);
    let job = two_tm_forward_job(&mut d);
    // Source 0 finishes on tm-1, Map 0 runs there reading it.
    d.finish(aid(job, 0, 0, 0));
    assert_eq!(d.start_deploys(), vec![aid(job, 1, 0, 0)]);
    assert_eq!(d.tm_of(aid(job, 1, 0, 0)), "tm-1");
    let before = d.deployed.len();
    d.handle(Event::TaskManagerLost {
        task_manager: "tm-1".to_string(),
        reason: "killed".to_string(),
    })
    .unwrap();
    let j = d.job(job);
    assert_eq!(
        d.attempt(aid(job, 1, 0, 0)).state,
        ExecutionState::Failed,
        "the running map"
    );
    assert_eq!(
        d.finished_attempt(job, 0, 0),
        None,
        "source 0's result is lost and Map 0 still needs it"
    );
    assert_eq!(
        d.attempt(aid(job, 0, 1, 0)).state,
        ExecutionState::Running,
        "source 1 on tm-2 is untouched"
    );
    assert_eq!(j.restarts, 1, "one failover for both");
    d.take();
    d.let_restart_fire();
    // tm-2's only slot is taken by source 1: nothing can go anywhere yet.
    assert!(deployed(&d.take()).is_empty());
    d.finish(aid(job, 0, 1, 0));
    let acts = d.take();
    assert_eq!(deployed(&acts), vec![(0, 0, 1)], "one slot on tm-2");
    assert_eq!(d.tm_of(aid(job, 0, 0, 1)), "tm-2");
    d.ack(aid(job, 0, 0, 1));
    d.finish(aid(job, 0, 0, 1));
    let acts = d.take();
    assert_eq!(deployed(&acts), vec![(1, 0, 1)]);
    assert_eq!(inputs(&deploys(&acts)[0]), vec![(0, 1)]);
    d.ack(aid(job, 1, 0, 1));
    d.finish(aid(job, 1, 0, 1));
    d.start_deploys();
    d.finish(aid(job, 1, 1, 0));
    assert_eq!(d.job(job).state, JobState::Finished);
    d.assert_nothing_deployed_to("tm-1", before);
}

#[test]
fn a_lost_task_manager_does_not_rerun_results_whose_consumers_finished() {
    let mut d = Driver::with_restarts(5);
    let job = two_tm_forward_job(&mut d);
    d.finish(aid(job, 0, 0, 0));
    d.start_deploys();
    d.finish(aid(job, 1, 0, 0));
    assert_eq!(d.tm_of(aid(job, 1, 0, 0)), "tm-1");
    let before = d.deployed.len();
    d.handle(Event::TaskManagerLost {
        task_manager: "tm-1".to_string(),
        reason: "killed".to_string(),
    })
    .unwrap();
    assert_eq!(d.job(job).restarts, 0, "nothing to re-run");
    assert_eq!(d.finished_attempt(job, 0, 0), Some(0));
    assert_eq!(d.finished_attempt(job, 1, 0), Some(0));
    d.let_restart_fire();
    assert!(deployed(&d.take()).is_empty());
    d.finish(aid(job, 0, 1, 0));
    assert_eq!(d.start_deploys(), vec![aid(job, 1, 1, 0)]);
    d.finish(aid(job, 1, 1, 0));
    assert_eq!(d.job(job).state, JobState::Finished);
    assert_eq!(d.job(job).restarts, 0);
    d.assert_nothing_deployed_to("tm-1", before);
}

#[test]
fn results_are_rerun_transitively_when_a_consumer_needs_a_rerun_producer() {
    use PartitionerKind::Forward;
    // Source -> Map -> Sink, parallelism 1, on tm-1 then tm-2.
    let mut d = Driver::with_restarts(5);
    d.tm("tm-1", 1);
    let job = d.submit(graph(
        true,
        &[V("Source", 1, None), V("Map", 1, None), V("Sink", 1, None)],
        &[(0, 1, Forward), (1, 2, Forward)],
    ));
    d.start_deploys();
    d.finish(aid(job, 0, 0, 0));
    d.start_deploys();
    d.finish(aid(job, 1, 0, 0));
    // The sink runs on tm-1 too; a second TaskManager joins.
    d.start_deploys();
    d.tm("tm-2", 1);
    let before = d.deployed.len();
    d.handle(Event::TaskManagerLost {
        task_manager: "tm-1".to_string(),
        reason: "killed".to_string(),
    })
    .unwrap();
    // The sink ran there, it needs Map's result (lost), which needs
    // Source's result (lost).
    assert_eq!(d.finished_attempt(job, 0, 0), None);
    assert_eq!(d.finished_attempt(job, 1, 0), None);
    assert_eq!(d.job(job).restarts, 1);
    d.take();
    d.let_restart_fire();
    assert_eq!(deployed(&d.take()), vec![(0, 0, 1)]);
    d.ack(aid(job, 0, 0, 1));
    d.finish(aid(job, 0, 0, 1));
    assert_eq!(deployed(&d.take()), vec![(1, 0, 1)]);
    d.ack(aid(job, 1, 0, 1));
    d.finish(aid(job, 1, 0, 1));
    let acts = d.take();
    assert_eq!(deployed(&acts), vec![(2, 0, 1)]);
    assert_eq!(inputs(&deploys(&acts)[0]), vec![(0, 1)]);
    d.ack(aid(job, 2, 0, 1));
    d.finish(aid(job, 2, 0, 1));
    assert_eq!(d.job(job).state, JobState::Finished);
    d.assert_nothing_deployed_to("tm-1", before);
}

#[test]
fn results_lost_with_a_task_manager_stay_lost_when_it_registers_again() {
    use PartitionerKind::Rebalance;
    // Source -> Map -> Sink. Source finishes on tm-1; Map's added attempt
    // wins on tm-2; tm-1 is lost (Source's result is not needed: Map
    // finished) and comes back under the same id, empty. Then tm-2 is lost:
    // Map must run again, and so must Source, whose result went with tm-1.
    let mut d = Driver::with_restarts(5);
    d.tm("tm-1", 1);
    d.tm("tm-2", 2);
    let job = d.submit(graph(
        true,
        &[
            V("Source", 1, None),
            V("Map", 1, None),
            V("Sink", 1, Some("sink")),
        ],
        &[(0, 1, Rebalance), (1, 2, Rebalance)],
    ));
    d.start_deploys();
    d.finish(aid(job, 0, 0, 0));
    d.start_deploys();
    assert_eq!(d.tm_of(aid(job, 1, 0, 0)), "tm-1");
    d.handle(Event::AddAttempt {
        job,
        vertex: 1,
        subtask: 0,
    })
    .unwrap();
    d.start_deploys();
    assert_eq!(d.tm_of(aid(job, 1, 0, 1)), "tm-2");
    d.finish(aid(job, 1, 0, 1));
    d.canceled(aid(job, 1, 0, 0));
    d.start_deploys();
    assert_eq!(d.tm_of(aid(job, 2, 0, 0)), "tm-2");
    d.handle(Event::TaskManagerLost {
        task_manager: "tm-1".to_string(),
        reason: "killed".to_string(),
    })
    .unwrap();
    assert_eq!(d.finished_attempt(job, 0, 0), Some(0), "not needed");
    d.tm("tm-1", 1);
    d.handle(Event::TaskManagerLost {
        task_manager: "tm-2".to_string(),
        reason: "killed".to_string(),
    })
    .unwrap();
    assert_eq!(
        d.finished_attempt(job, 1, 0),
        None,
        "Sink needs Map's result"
    );
    assert_eq!(
        d.finished_attempt(job, 0, 0),
        None,
        "the new Map needs Source's result, which went with the old tm-1"
    );
    d.take();
    d.let_restart_fire();
    assert_eq!(deployed(&d.take()), vec![(0, 0, 1)]);
}

#[test]
fn a_silent_task_manager_is_lost_at_the_heartbeat_timeout() {
    let mut d = Driver::with_restarts(5);
    let job = two_tm_forward_job(&mut d);
    d.finish(aid(job, 0, 0, 0));
    assert_eq!(d.start_deploys(), vec![aid(job, 1, 0, 0)]);
    let before = d.deployed.len();
    // Only tm-2 keeps heartbeating.
    let timeout = d.s.config().heartbeat_timeout;
    d.advance_with_heartbeats(timeout - secs(10), secs(10), &["tm-2"]);
    assert!(d.s.is_registered("tm-1"));
    // Ticking when the scheduler asks for it loses tm-1 right then.
    let deadline = d.s.poll_timeout().unwrap();
    assert_eq!(deadline, timeout);
    d.now = deadline;
    d.handle(Event::Tick).unwrap();
    assert!(!d.s.is_registered("tm-1"), "lost at {deadline:?}");
    assert_eq!(d.attempt(aid(job, 1, 0, 0)).state, ExecutionState::Failed);
    assert_eq!(d.finished_attempt(job, 0, 0), None);
    assert_eq!(d.attempt(aid(job, 0, 1, 0)).state, ExecutionState::Running);
    d.let_restart_fire();
    d.finish(aid(job, 0, 1, 0));
    assert_eq!(deployed(&d.take()), vec![(0, 0, 1)]);
    d.assert_nothing_deployed_to("tm-1", before);
}

// ---------------------------------------------------------- stale reports

#[test]
fn reports_of_replaced_attempts_and_duplicates_change_nothing() {
    let mut d = Driver::with_restarts(3);
    d.tm("tm-1", 2);
    let job = d.submit(batch_forward(1));
    d.start_deploys();
    d.fail(aid(job, 0, 0, 0), "boom");
    d.let_restart_fire();
    assert_eq!(d.start_deploys(), vec![aid(job, 0, 0, 1)]);
    d.take();
    // The failed attempt reports again, and even FINISHED: ignored.
    d.finish(aid(job, 0, 0, 0));
    d.fail(aid(job, 0, 0, 0), "boom again");
    d.run(aid(job, 0, 0, 0));
    d.handle(Event::DeployAcknowledged {
        attempt: aid(job, 0, 0, 0),
    })
    .unwrap();
    assert!(d.take().is_empty());
    assert_eq!(d.attempt(aid(job, 0, 0, 0)).state, ExecutionState::Failed);
    assert_eq!(d.finished_attempt(job, 0, 0), None);
    assert_eq!(d.job(job).restarts, 1);
    // Reports of attempts that never existed: ignored.
    d.finish(aid(job, 0, 0, 7));
    d.finish(aid(job, 9, 0, 0));
    d.finish(aid(JobId(999), 0, 0, 0));
    assert!(d.take().is_empty());
    // The live attempt finishes; a duplicate FINISHED and a late FAILED of
    // it change nothing.
    d.finish(aid(job, 0, 0, 1));
    let acts = d.take();
    assert_eq!(deployed(&acts), vec![(1, 0, 0)]);
    d.finish(aid(job, 0, 0, 1));
    d.fail(aid(job, 0, 0, 1), "late");
    assert!(d.take().is_empty());
    assert_eq!(d.finished_attempt(job, 0, 0), Some(1));
    assert_eq!(d.job(job).restarts, 1);
    d.start_deploys();
    d.finish(aid(job, 1, 0, 0));
    d.finish(aid(job, 1, 0, 0));
    assert_eq!(ended(&d.take()), vec![JobState::Finished]);
    // Once the job ended, nothing moves it.
    d.fail(aid(job, 1, 0, 0), "after the end");
    assert!(d.take().is_empty());
    assert_eq!(d.job(job).state, JobState::Finished);
}

#[test]
fn a_duplicate_failure_of_one_attempt_is_one_failure() {
    let mut d = Driver::with_restarts(1);
    d.tm("tm-1", 2);
    let job = d.submit(batch_forward(1));
    d.start_deploys();
    d.fail(aid(job, 0, 0, 0), "boom");
    d.fail(aid(job, 0, 0, 0), "boom");
    d.let_restart_fire();
    assert_eq!(d.start_deploys(), vec![aid(job, 0, 0, 1)]);
    d.fail(aid(job, 0, 0, 0), "boom");
    assert_eq!(d.job(job).state, JobState::Running);
    assert_eq!(d.job(job).restarts, 1);
}

// -------------------------------------------------- concurrent attempts

/// A one-subtask batch job on two TaskManagers with a second attempt added
/// and both deployed (attempt 0 on tm-1, attempt 1 on tm-2), no restarts.
fn two_live_attempts() -> (Driver, JobId) {
    let mut d = Driver::with_restarts(0);
    d.tm("tm-1", 2);
    d.tm("tm-2", 2);
    let job = d.submit(batch_forward(1));
    d.start_deploys();
    d.handle(Event::AddAttempt {
        job,
        vertex: 0,
        subtask: 0,
    })
    .unwrap();
    d.start_deploys();
    (d, job)
}

#[test]
fn an_added_attempt_runs_elsewhere_and_the_first_to_finish_wins() {
    let mut d = Driver::with_restarts(0);
    d.tm("tm-1", 2);
    d.tm("tm-2", 2);
    let job = d.submit(batch_forward(1));
    d.start_deploys();
    assert_eq!(d.tm_of(aid(job, 0, 0, 0)), "tm-1");
    d.handle(Event::AddAttempt {
        job,
        vertex: 0,
        subtask: 0,
    })
    .unwrap();
    assert_eq!(d.start_deploys(), vec![aid(job, 0, 0, 1)]);
    assert_eq!(d.tm_of(aid(job, 0, 0, 1)), "tm-2", "away from its sibling");
    d.finish(aid(job, 0, 0, 1));
    let acts = d.take();
    assert_eq!(d.finished_attempt(job, 0, 0), Some(1));
    assert_eq!(cancels(&acts), vec![aid(job, 0, 0, 0)]);
    assert!(acts.contains(&Action::CancelAttempt {
        task_manager: "tm-1".to_string(),
        attempt: aid(job, 0, 0, 0)
    }));
    let consumer = deploys(&acts);
    assert_eq!(consumer.len(), 1);
    assert_eq!(inputs(&consumer[0]), vec![(0, 1)], "reads the winner");
    assert_eq!(consumer[0].inputs[0].producer_address, "tm-2:6121");
    // The loser's CANCELED is no failure (no restart is allowed at all).
    d.canceled(aid(job, 0, 0, 0));
    assert_eq!(d.attempt(aid(job, 0, 0, 0)).state, ExecutionState::Canceled);
    assert_eq!(d.job(job).state, JobState::Running);
    assert_eq!(d.job(job).restarts, 0);
    d.start_deploys();
    d.finish(aid(job, 1, 0, 0));
    assert_eq!(ended(&d.take()), vec![JobState::Finished]);
    assert_eq!(d.finished_attempt(job, 0, 0), Some(1));
}

#[test]
fn a_loser_that_finishes_before_its_cancel_arrives_does_not_replace_the_winner() {
    let (mut d, job) = two_live_attempts();
    d.finish(aid(job, 0, 0, 0));
    d.take();
    d.finish(aid(job, 0, 0, 1));
    let acts = d.take();
    assert_eq!(d.finished_attempt(job, 0, 0), Some(0));
    assert!(
        acts.iter().any(|a| matches!(a,
            Action::ReleasePartitions { task_manager, partitions, .. }
                if task_manager == "tm-2" && partitions.iter().all(|p| p.attempt == 1))),
        "the loser's partitions are dropped: {acts:?}"
    );
    assert_eq!(d.job(job).state, JobState::Running);
}

#[test]
fn a_failed_attempt_with_a_live_sibling_does_not_fail_over() {
    let (mut d, job) = two_live_attempts();
    d.fail(aid(job, 0, 0, 0), "boom");
    let acts = d.take();
    assert!(ended(&acts).is_empty(), "{acts:?}");
    assert_eq!(d.job(job).state, JobState::Running);
    assert_eq!(d.job(job).restarts, 0);
    d.finish(aid(job, 0, 0, 1));
    d.start_deploys();
    d.finish(aid(job, 1, 0, 0));
    assert_eq!(d.job(job).state, JobState::Finished);
}

#[test]
fn an_added_attempt_is_refused_where_it_makes_no_sense() {
    use PartitionerKind::Hash;
    let mut d = Driver::with_restarts(0);
    d.tm("tm-1", 4);
    let streaming = d.submit(graph(
        false,
        &[V("Source", 1, None), V("Map", 1, None)],
        &[(0, 1, Hash)],
    ));
    let add = |d: &mut Driver, job, vertex, subtask| {
        d.handle(Event::AddAttempt {
            job,
            vertex,
            subtask,
        })
    };
    assert!(add(&mut d, streaming, 0, 0).is_err(), "streaming");
    let batch = d.submit(batch_forward(1));
    assert!(add(&mut d, batch, 5, 0).is_err(), "no such vertex");
    assert!(add(&mut d, batch, 0, 3).is_err(), "no such subtask");
    assert!(add(&mut d, JobId(12345), 0, 0).is_err(), "no such job");
    d.start_deploys();
    d.finish(aid(batch, 0, 0, 0));
    assert!(add(&mut d, batch, 0, 0).is_err(), "finished already");
    d.handle(Event::CancelJob { job: batch }).unwrap();
    assert!(add(&mut d, batch, 1, 0).is_err(), "ended");

    // Asking while an attempt waits for a slot adds nothing.
    let mut d = Driver::with_restarts(0);
    d.tm("tm-1", 1);
    let job = d.submit(graph(true, &[V("Source", 2, None)], &[]));
    assert_eq!(deployed(&d.take()), vec![(0, 0, 0)]);
    assert!(add(&mut d, job, 0, 1).is_ok());
    assert!(add(&mut d, job, 0, 1).is_ok());
    assert_eq!(d.job(job).eg.vertices[0].subtasks[1].attempts.len(), 1);
    // A deployed one gets one added attempt, which waits for a slot.
    assert!(add(&mut d, job, 0, 0).is_ok());
    assert!(add(&mut d, job, 0, 0).is_ok());
    assert_eq!(d.job(job).eg.vertices[0].subtasks[0].attempts.len(), 2);
    assert!(deployed(&d.take()).is_empty());
}

// --------------------------------------------------------- reconciliation

#[test]
fn an_attempt_missing_from_two_heartbeats_in_a_row_fails_and_restarts() {
    let mut d = Driver::with_restarts(3);
    d.tm("tm-1", 2);
    let job = d.submit(batch_forward(1));
    let a = aid(job, 0, 0, 0);
    d.start_deploys();
    // The TaskManager lost track of it (its FINISHED was lost on the way).
    d.running.get_mut("tm-1").unwrap().remove(&a);
    d.heartbeat("tm-1");
    assert_eq!(d.attempt(a).state, ExecutionState::Running, "one miss");
    // Listed again: the count starts over.
    d.running.get_mut("tm-1").unwrap().insert(a);
    d.heartbeat("tm-1");
    d.running.get_mut("tm-1").unwrap().remove(&a);
    d.heartbeat("tm-1");
    assert_eq!(d.attempt(a).state, ExecutionState::Running);
    d.heartbeat("tm-1");
    let e = d.attempt(a);
    assert_eq!(e.state, ExecutionState::Failed);
    assert!(
        e.failure_cause
            .as_deref()
            .unwrap()
            .contains("no longer runs this attempt"),
        "{:?}",
        e.failure_cause
    );
    assert_eq!(d.job(job).restarts, 1);
    d.let_restart_fire();
    assert_eq!(deployed(&d.take()), vec![(0, 0, 1)]);
}

#[test]
fn an_unacknowledged_deploy_is_not_reconciled_away() {
    let mut d = Driver::with_restarts(0);
    d.tm("tm-1", 2);
    let job = d.submit(batch_forward(1));
    d.take();
    d.heartbeat("tm-1");
    d.heartbeat("tm-1");
    d.heartbeat("tm-1");
    assert_eq!(
        d.attempt(aid(job, 0, 0, 0)).state,
        ExecutionState::Deploying
    );
}

#[test]
fn a_heartbeat_listing_an_attempt_that_is_not_live_cancels_it() {
    let mut d = Driver::with_restarts(3);
    d.tm("tm-1", 2);
    let job = d.submit(batch_forward(1));
    d.start_deploys();
    let unknown = aid(job, 0, 0, 5);
    d.running.get_mut("tm-1").unwrap().insert(unknown);
    d.heartbeat("tm-1");
    let acts = d.take();
    assert_eq!(
        acts,
        vec![Action::CancelAttempt {
            task_manager: "tm-1".to_string(),
            attempt: unknown
        }]
    );
    // An attempt the scheduler failed, still running there: cancelled too.
    let old = aid(job, 0, 0, 0);
    d.handle(Event::AttemptState {
        attempt: old,
        state: ExecutionState::Failed,
        failure: Some("boom".to_string()),
        metrics: None,
    })
    .unwrap();
    d.take();
    d.running.get_mut("tm-1").unwrap().remove(&unknown);
    d.heartbeat("tm-1");
    assert_eq!(cancels(&d.take()), vec![old]);
    // A live attempt listed by the wrong TaskManager is not its to run.
    d.let_restart_fire();
    let new = d.start_deploys();
    d.tm("tm-2", 1);
    d.running
        .get_mut("tm-2")
        .unwrap()
        .extend(new.iter().copied());
    d.heartbeat("tm-2");
    assert_eq!(cancels(&d.take()), new);
    assert_eq!(d.attempt(new[0]).state, ExecutionState::Running);
}

#[test]
fn a_heartbeat_from_an_unknown_task_manager_is_an_error() {
    let mut d = Driver::with_restarts(0);
    let r = d.handle(Event::Heartbeat {
        task_manager: "nobody".to_string(),
        running: Vec::new(),
    });
    assert!(r.is_err());
}

// ------------------------------------------------------------ deploy failed

#[test]
fn a_failed_deploy_gives_its_slot_and_partitions_back_and_fails_over() {
    let mut d = Driver::with_restarts(1);
    d.tm("tm-1", 1);
    let job = d.submit(batch_forward(1));
    let a = aid(job, 0, 0, 0);
    assert_eq!(deployed(&d.take()), vec![(0, 0, 0)]);
    assert_eq!(d.used_slots("tm-1"), 1);
    d.handle(Event::DeployFailed {
        attempt: a,
        reason: "no such program".to_string(),
    })
    .unwrap();
    let acts = d.take();
    assert_eq!(d.used_slots("tm-1"), 0);
    assert!(d.job(job).slots.is_empty());
    assert_eq!(d.attempt(a).state, ExecutionState::Failed);
    assert_eq!(d.attempt(a).slot, None);
    assert!(
        d.attempt(a)
            .failure_cause
            .as_deref()
            .unwrap()
            .contains("no such program")
    );
    assert!(acts.iter().any(|x| matches!(x,
        Action::ReleasePartitions { task_manager, job: j, partitions }
            if task_manager == "tm-1" && *j == job
                && partitions.len() == 1 && partitions[0].attempt == 0)));
    assert!(acts.contains(&Action::Probe {
        task_manager: "tm-1".to_string()
    }));
    assert_eq!(d.job(job).restarts, 1);
    d.let_restart_fire();
    assert_eq!(deployed(&d.take()), vec![(0, 0, 1)]);
    assert_eq!(d.used_slots("tm-1"), 1);
    // A late DeployFailed of the old attempt changes nothing.
    d.handle(Event::DeployFailed {
        attempt: a,
        reason: "again".to_string(),
    })
    .unwrap();
    assert_eq!(d.job(job).state, JobState::Running);
    assert_eq!(d.used_slots("tm-1"), 1);
}

// ------------------------------------------------------------ refused jobs

#[test]
fn an_invalid_job_graph_is_refused_with_an_error() {
    let mut d = Driver::with_restarts(0);
    d.tm("tm-1", 2);
    type Mutation = fn(&mut JobGraph);
    let cases: [(Mutation, &str); 5] = [
        (|g| g.vertices.clear(), "no vertices"),
        (|g| g.vertices[1].parallelism = 0, "parallelism 0"),
        (|g| g.vertices.swap(0, 1), "topological"),
        (|g| g.vertices[1].inputs.clear(), "no consumer"),
        (
            |g| g.vertices[0].produced_data_sets[0].id.0 ^= 1,
            "does not produce",
        ),
    ];
    for (mutate, expected) in cases {
        let mut g = batch_forward(2);
        mutate(&mut g);
        let err = d.try_submit(g, FP).unwrap_err().to_string();
        assert!(err.contains(expected), "expected '{expected}' in {err}");
    }
    assert_eq!(d.s.jobs().count(), 0);
    assert!(d.take().is_empty());
    // The same id twice is refused too.
    let job = d.submit(batch_forward(1));
    let again = d.handle(Event::SubmitJob {
        job,
        graph: Arc::new(batch_forward(1)),
        program: "p".to_string(),
        fingerprint: FP.to_string(),
    });
    assert!(again.is_err());
    assert_eq!(d.s.jobs().count(), 1);
}

#[test]
fn cancelling_a_job_releases_it_everywhere() {
    let mut d = Driver::with_restarts(0);
    d.tm("tm-1", 1);
    d.tm("tm-2", 1);
    let job = d.submit(batch_forward(2));
    d.start_deploys();
    d.handle(Event::CancelJob { job }).unwrap();
    let acts = d.take();
    assert_eq!(ended(&acts), vec![JobState::Canceled]);
    for tm in ["tm-1", "tm-2"] {
        assert!(acts.contains(&Action::ReleaseJob {
            task_manager: tm.to_string(),
            job
        }));
        assert_eq!(d.used_slots(tm), 0);
    }
    assert!(d.handle(Event::CancelJob { job }).is_err());
}

#[test]
fn a_consumer_that_cannot_read_a_partition_reruns_only_that_producer() {
    let mut d = Driver::with_restarts(5);
    d.tm("tm-1", 4);
    let job = d.submit(batch_forward(2));
    d.start_deploys();
    d.finish(aid(job, 0, 0, 0));
    d.finish(aid(job, 0, 1, 0));
    d.start_deploys();
    // Map 0 finds source 0's partition corrupt: it reports the partition,
    // then its own failure.
    let ds = d.job(job).eg.results[0].data_set.0;
    d.handle(Event::PartitionsLost {
        job,
        partitions: vec![PartitionRef {
            data_set: ds,
            producer_subtask: 0,
            attempt: 0,
        }],
        reason: "checksum mismatch".to_string(),
    })
    .unwrap();
    d.fail(aid(job, 1, 0, 0), "reading partition: checksum");
    assert_eq!(d.finished_attempt(job, 0, 0), None, "source 0 runs again");
    assert_eq!(d.finished_attempt(job, 0, 1), Some(0), "source 1 is kept");
    d.take();
    d.answer_probes(&[]);
    d.let_restart_fire();
    let acts = d.take();
    assert_eq!(deployed(&acts), vec![(0, 0, 1)], "only the producer first");
    d.ack(aid(job, 0, 0, 1));
    d.finish(aid(job, 0, 0, 1));
    let acts = d.take();
    assert_eq!(deployed(&acts), vec![(1, 0, 1)]);
    assert_eq!(
        inputs(&deploys(&acts)[0]),
        vec![(0, 1)],
        "reads the new attempt"
    );
    d.ack(aid(job, 1, 0, 1));
    d.finish(aid(job, 1, 0, 1));
    d.finish(aid(job, 1, 1, 0));
    assert_eq!(d.job(job).state, JobState::Finished);
    // A late report about an attempt nobody reads changes nothing.
    assert_eq!(d.job(job).eg.vertices[0].subtasks[1].attempts.len(), 1);
}

// ------------------------------------------------------------ shuffle

/// Registers shuffle service `id` on host `host-a`, data on `port`, RPC on
/// `port + 1`.
fn register_service(d: &mut Driver, id: &str, port: u16) {
    d.handle(Event::RegisterShuffleService(ShuffleServiceSpec {
        id: id.to_string(),
        host: "host-a".to_string(),
        data_address: format!("host-a:{port}"),
        dir: "/shuffle".to_string(),
        rpc_address: format!("host-a:{}", port + 1),
    }))
    .unwrap();
}

/// Two TaskManagers of one slot on host `host-a` with a shuffle service
/// there, and `Source (2) -> Map (2)` (blocking, forward) with
/// `shuffle-service.type` set to `kind`.
fn shuffle_job(d: &mut Driver, kind: &str) -> JobId {
    for (id, port) in [("tm-1", 1), ("tm-2", 2)] {
        d.handle(Event::RegisterTaskManager(TaskManagerSpec {
            id: id.to_string(),
            slots: 1,
            fingerprint: FP.to_string(),
            data_address: format!("host-a:{port}"),
        }))
        .unwrap();
        d.running.entry(id.to_string()).or_default();
    }
    register_service(d, "ss-a", 9);
    let mut g = batch_forward(2);
    g.config.set("shuffle-service.type", kind);
    d.submit(g)
}

#[test]
fn external_partitions_are_read_from_the_service_and_survive_their_task_manager() {
    let mut d = Driver::with_restarts(5);
    let job = shuffle_job(&mut d, "external");
    let acts = d.take();
    let sources = deploys(&acts);
    assert_eq!(sources.len(), 2);
    for dep in &sources {
        let target = dep.outputs[0]
            .shuffle_service
            .as_ref()
            .expect("to the service");
        assert_eq!(
            (target.id.as_str(), target.dir.as_str()),
            ("ss-a", "/shuffle")
        );
    }
    for dep in &sources {
        d.ack(dep.attempt);
        d.run(dep.attempt);
    }
    d.finish(aid(job, 0, 0, 0));
    d.finish(aid(job, 0, 1, 0));
    let acts = d.take();
    let maps = deploys(&acts);
    assert_eq!(maps.len(), 2);
    for m in &maps {
        assert_eq!(m.inputs.len(), 1);
        assert_eq!(m.inputs[0].producer_address, "host-a:9");
        assert!(!m.inputs[0].local, "read from the service, not in place");
        d.ack(m.attempt);
        d.run(m.attempt);
    }
    // tm-1 dies: Map 0 ran there and runs again; no source runs again.
    let map0_tm = d.tm_of(aid(job, 1, 0, 0));
    d.handle(Event::TaskManagerLost {
        task_manager: map0_tm.clone(),
        reason: "kill -9".to_string(),
    })
    .unwrap();
    assert_eq!(d.finished_attempt(job, 0, 0), Some(0));
    assert_eq!(d.finished_attempt(job, 0, 1), Some(0));
    d.take();
    d.let_restart_fire();
    let other = if map0_tm == "tm-1" { "tm-2" } else { "tm-1" };
    d.finish(d.running[other].iter().copied().next().unwrap());
    let redeployed = deployed(&d.take());
    assert!(
        redeployed.iter().all(|&(v, _, _)| v == 1),
        "only maps run again: {redeployed:?}"
    );
    for (v, i, n) in redeployed {
        let a = aid(job, v, i, n);
        d.ack(a);
        d.finish(a);
    }
    assert_eq!(d.job(job).state, JobState::Finished);
    for i in 0..2 {
        assert_eq!(d.job(job).eg.vertices[0].subtasks[i].attempts.len(), 1);
    }
    let acts = d.take();
    assert!(
        acts.iter()
            .any(|a| matches!(a, Action::ReleaseShuffleJob { service, .. } if service == "ss-a")),
        "the service drops the job's partitions: {acts:?}"
    );
}

#[test]
fn internal_partitions_are_lost_with_their_task_manager() {
    let mut d = Driver::with_restarts(5);
    let job = shuffle_job(&mut d, "internal");
    let sources = deploys(&d.take());
    assert!(
        sources
            .iter()
            .all(|s| s.outputs[0].shuffle_service.is_none())
    );
    for s in &sources {
        d.ack(s.attempt);
        d.finish(s.attempt);
    }
    let maps = deploys(&d.take());
    assert!(maps.iter().all(|m| m.inputs[0].local));
    let tm = d.tm_of(aid(job, 0, 0, 0));
    d.handle(Event::TaskManagerLost {
        task_manager: tm,
        reason: "kill -9".to_string(),
    })
    .unwrap();
    assert_eq!(d.finished_attempt(job, 0, 0), None, "source 0 runs again");
}

#[test]
fn losing_the_shuffle_service_reruns_the_producers_whose_data_it_held() {
    let mut d = Driver::with_restarts(5);
    let job = shuffle_job(&mut d, "external");
    for s in deploys(&d.take()) {
        d.ack(s.attempt);
        d.finish(s.attempt);
    }
    d.take();
    d.handle(Event::ShuffleServiceLost {
        service: "ss-a".to_string(),
        reason: "no heartbeat".to_string(),
    })
    .unwrap();
    assert_eq!(d.finished_attempt(job, 0, 0), None);
    assert_eq!(d.finished_attempt(job, 0, 1), None);
    // Without a service the re-run producers wait for one.
    d.take();
    d.let_restart_fire();
    assert_eq!(d.job(job).state, JobState::Running);
    assert!(deployed(&d.take()).is_empty());
    // The restarted service registers under a new id: they go there.
    register_service(&mut d, "ss-a2", 19);
    let again = deploys(&d.take());
    assert_eq!(again.len(), 2);
    assert!(
        again.iter().all(|s| s.attempt.attempt == 1
            && s.outputs[0].shuffle_service.as_ref().unwrap().id == "ss-a2")
    );
}

#[test]
fn an_unreadable_partition_probes_the_shuffle_service_and_a_silent_one_is_lost() {
    let mut d = Driver::with_restarts(5);
    let job = shuffle_job(&mut d, "external");
    for s in deploys(&d.take()) {
        d.ack(s.attempt);
        d.finish(s.attempt);
    }
    d.take();
    d.handle(Event::PartitionsLost {
        job,
        partitions: Vec::new(),
        reason: "connection refused".to_string(),
    })
    .unwrap();
    let acts = d.take();
    assert!(
        acts.contains(&Action::ProbeShuffleService {
            service: "ss-a".to_string()
        }),
        "{acts:?}"
    );
    d.handle(Event::ShuffleServiceProbeAnswered {
        service: "ss-a".to_string(),
        alive: true,
    })
    .unwrap();
    assert_eq!(d.finished_attempt(job, 0, 0), Some(0), "it answered");
    d.handle(Event::ShuffleServiceProbeAnswered {
        service: "ss-a".to_string(),
        alive: false,
    })
    .unwrap();
    assert_eq!(d.finished_attempt(job, 0, 0), None, "its data is gone");
    assert_eq!(d.finished_attempt(job, 0, 1), None);
}

#[test]
fn a_producer_without_a_service_on_its_host_fails_after_the_slot_request_timeout() {
    let mut d = Driver::new(SchedulerConfig {
        slot_request_timeout: secs(10),
        ..SchedulerConfig::default()
    });
    d.tm("tm-1", 2);
    let mut g = batch_forward(1);
    g.config.set("shuffle-service.type", "external");
    let job = d.submit(g);
    assert!(deployed(&d.take()).is_empty());
    d.advance(secs(10));
    assert_eq!(d.job(job).state, JobState::Failed);
    let cause = d.job(job).failure_cause.clone().unwrap();
    assert!(
        cause.contains("no shuffle service runs on host tm-1"),
        "{cause}"
    );
}

#[test]
fn a_producer_finishing_after_its_service_was_lost_runs_again_and_the_job_ends() {
    let mut d = Driver::with_restarts(5);
    let job = shuffle_job(&mut d, "external");
    for s in deploys(&d.take()) {
        d.ack(s.attempt);
        d.run(s.attempt);
    }
    d.finish(aid(job, 0, 0, 0));
    // Map 0 starts reading source 0 from the service.
    assert_eq!(d.start_deploys(), vec![aid(job, 1, 0, 0)]);
    // The service goes while source 1 still runs; Map 0 cannot read.
    d.handle(Event::ShuffleServiceLost {
        service: "ss-a".to_string(),
        reason: "gone".to_string(),
    })
    .unwrap();
    assert_eq!(
        d.finished_attempt(job, 0, 0),
        None,
        "its data went with the service"
    );
    d.fail(aid(job, 1, 0, 0), "connection refused");
    // Source 1 had handed over before the service died, and finishes.
    d.finish(aid(job, 0, 1, 0));
    assert_eq!(
        d.finished_attempt(job, 0, 1),
        None,
        "handed over to a lost service: it runs again instead of blocking its consumer"
    );
    d.take();
    d.let_restart_fire();
    register_service(&mut d, "ss-a2", 19);
    let mut rounds = 0;
    while d.job(job).state == JobState::Running && rounds < 10 {
        rounds += 1;
        for dep in deploys(&d.take()) {
            d.ack(dep.attempt);
            d.finish(dep.attempt);
        }
        d.let_restart_fire();
    }
    assert_eq!(d.job(job).state, JobState::Finished);
}

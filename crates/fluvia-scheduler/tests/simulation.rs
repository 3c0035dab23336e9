//! Deterministic simulation of the scheduler in a faulty cluster.
//!
//! Each seed builds a small world on a virtual clock: simulated TaskManagers
//! (slots, a program fingerprint, attempts that are acknowledged, report
//! RUNNING and then FINISHED with metrics or FAILED, partitions they serve,
//! heartbeats listing what they run), random batch and streaming jobs (1–4
//! vertices, parallelism 1–4, hash/forward/rebalance/rescale edges, slot
//! sharing groups, chaining on or off), and a seeded fault injector:
//! TaskManagers killed (silently, or noticed by the shell), restarted under
//! the same id, cut off by a network partition, new ones registering later;
//! state reports and heartbeats delayed, reordered, duplicated and dropped;
//! deploys that fail (or whose acknowledgement is lost while the task runs);
//! injected task failures; AddAttempt (speculation) on batch jobs; the odd
//! job cancellation. A consumer whose input partition is gone fails like a
//! task hitting PartitionNotFound.
//!
//! After every step (one `Scheduler::handle`) the invariants are checked:
//! - a subtask's result is one finished attempt: `finished_attempt` names an
//!   attempt that is FINISHED and really finished on its TaskManager, and a
//!   winner is only ever replaced after its results were lost;
//! - nothing is deployed to a lost TaskManager, nor to one with another
//!   program fingerprint; an attempt is deployed once;
//! - slots are never over-committed (per TaskManager the jobs' shared slots
//!   add up to its used slots, at most its slots) and a shared slot hosts at
//!   most one attempt per vertex, of its group and subtask index;
//! - a deployment's inputs are exactly the partitions its subtask consumes;
//!   blocking ones name the producers' current winners, whose TaskManager has
//!   not been lost since; a pipelined partition is read once per consumer;
//! - `poll_timeout` never asks for a tick that is already due;
//! - every job ends: once faults stop and a healthy TaskManager is there,
//!   all jobs reach a terminal state within a bounded virtual time; a
//!   FINISHED job has every subtask finished; a job fails only for want of
//!   slots or once its restart budget is used up (never, with 1000).
//!
//! Replay: `FLUVIA_SIM_SEED=<n>` runs only seed n and prints its step trace;
//! `FLUVIA_SIM_SEEDS=<count>` changes how many seeds the test runs and
//! `FLUVIA_SIM_THREADS=<n>` on how many threads (default: up to 4). The
//! smallest failing seed is re-run with its trace printed.

#![allow(clippy::unwrap_used)]

mod common;

use common::{env_u64, panic_message};

use fluvia_core::{Configuration, ExchangeMode, JobId, PartitionerKind, ResultPartitionType};
use fluvia_graph::{JobGraph, JobGraphGenerator, JobType, StreamGraphBuilder};
use fluvia_scheduler::{
    Action, AttemptMetrics, Event, ExecutionAttemptId, ExecutionState, JobState, PartitionRef,
    Scheduler, SchedulerConfig, TaskDeploymentDescriptor, TaskManagerSpec,
};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// Virtual milliseconds.
const HEARTBEAT_INTERVAL: u64 = 500;
const HEARTBEAT_TIMEOUT: u64 = 1_500;
const RESTART_DELAY: u64 = 100;
const PROBE_TIMEOUT: u64 = 150;
const SLOT_REQUEST_TIMEOUT: u64 = 3_000;
/// After faults stop, every job must end within this.
const SETTLE: u64 = 60_000;
const MAX_STEPS: u64 = 50_000;

const FP: &str = "fp-main";
const FP_OTHER: &str = "fp-other";

// ------------------------------------------------------------------ random

/// The faults' dice (seedable, so a failing seed replays).
type Rng = fluvia_core::random::SplitMix64;

// ------------------------------------------------------------------ faults

/// How hostile the world of one seed is (while faults are on).
#[derive(Debug, Clone, Copy, Default)]
struct Faults {
    /// State reports, heartbeats and cancels lost on the way.
    drop_pm: u32,
    duplicate_pm: u32,
    /// Network delay: 1..=max_delay ms (random delays reorder messages).
    max_delay: u64,
    deploy_fail_pm: u32,
    /// The TaskManager runs the attempt but its acknowledgement is lost: the
    /// shell reports the deploy failed.
    ack_lost_pm: u32,
    attempt_fail_pm: u32,
    /// Number of TaskManager kills / partitions / new TaskManagers.
    kills: u64,
    /// A killed TaskManager comes back under its id (empty) with this
    /// chance, within `restart_within` ms.
    restart_pm: u32,
    restart_within: u64,
    partitions: u64,
    new_tms: u64,
    add_attempts: u64,
    /// Chance that one of the jobs is cancelled.
    cancel_job_pm: u32,
}

impl Faults {
    fn pick(rng: &mut Rng) -> Faults {
        match rng.below(5) {
            // Calm: only a slow network.
            0 => Faults {
                max_delay: rng.range(1, 20),
                new_tms: rng.below(2),
                add_attempts: rng.below(3),
                ..Faults::default()
            },
            // A bad network.
            1 => Faults {
                drop_pm: rng.range(10, 150) as u32,
                duplicate_pm: rng.range(10, 150) as u32,
                max_delay: rng.range(5, 200),
                deploy_fail_pm: rng.range(0, 50) as u32,
                ack_lost_pm: rng.range(0, 50) as u32,
                partitions: rng.below(2),
                new_tms: rng.below(2),
                add_attempts: rng.below(4),
                ..Faults::default()
            },
            // Churn: TaskManagers die and come back under their ids quickly.
            2 => Faults {
                drop_pm: rng.range(0, 30) as u32,
                duplicate_pm: rng.range(0, 30) as u32,
                max_delay: rng.range(1, 20),
                deploy_fail_pm: rng.range(0, 20) as u32,
                attempt_fail_pm: rng.range(0, 30) as u32,
                kills: rng.range(2, 6),
                restart_pm: 900,
                restart_within: rng.range(20, 400),
                new_tms: rng.below(2),
                add_attempts: rng.range(0, 6),
                ..Faults::default()
            },
            // Everything.
            _ => Faults {
                drop_pm: rng.range(0, 100) as u32,
                duplicate_pm: rng.range(0, 100) as u32,
                max_delay: rng.range(1, 100),
                deploy_fail_pm: rng.range(0, 80) as u32,
                ack_lost_pm: rng.range(0, 30) as u32,
                attempt_fail_pm: rng.range(0, 150) as u32,
                kills: rng.range(0, 3),
                restart_pm: 400,
                restart_within: 2 * HEARTBEAT_TIMEOUT,
                partitions: rng.below(2),
                new_tms: rng.range(0, 3),
                add_attempts: rng.range(0, 6),
                cancel_job_pm: 300,
            },
        }
    }
}

// ------------------------------------------------------------------ graphs

fn partitioner(rng: &mut Rng, up: usize, down: usize) -> PartitionerKind {
    match rng.below(4) {
        0 => PartitionerKind::Hash,
        1 => PartitionerKind::Rebalance,
        _ if up == down => PartitionerKind::Forward,
        _ => PartitionerKind::Rescale,
    }
}

/// A random DAG of 1–4 operators, parallelism 1–4.
fn random_graph(rng: &mut Rng, streaming: bool) -> JobGraph {
    let n = rng.range(1, 4) as usize;
    let mut b = StreamGraphBuilder::new("sim-job");
    b.chaining_enabled = rng.chance(250);
    let groups = rng.chance(300);
    let mut nodes: Vec<(usize, usize)> = Vec::new(); // (node id, parallelism)
    for k in 0..n {
        let p = rng.range(1, 4) as usize;
        let source = k == 0 || rng.chance(150);
        let two_inputs = !source && k >= 2 && rng.chance(300);
        let id = if source {
            b.add_source(format!("Source {k}"), !streaming)
        } else {
            b.add_operator(format!("Op {k}"), if two_inputs { 2 } else { 1 })
        };
        b.set_parallelism(id, p);
        if groups {
            b.set_slot_sharing_group(id, if rng.chance(500) { "a" } else { "b" });
        }
        if two_inputs {
            let first = rng.below(k as u64) as usize;
            let mut second = rng.below(k as u64 - 1) as usize;
            if second >= first {
                second += 1;
            }
            for (t, up) in [(1u8, first), (2u8, second)] {
                let part = partitioner(rng, nodes[up].1, p);
                b.add_edge(nodes[up].0, id, Some(part), ExchangeMode::Undefined, t);
            }
        } else if !source {
            let up = rng.below(k as u64) as usize;
            let part = partitioner(rng, nodes[up].1, p);
            b.add_edge(nodes[up].0, id, Some(part), ExchangeMode::Undefined, 0);
        }
        nodes.push((id, p));
    }
    let jg = JobGraphGenerator::new(&b.build().unwrap())
        .create_job_graph(Configuration::new(), false)
        .unwrap();
    assert_eq!(
        jg.job_type,
        if streaming {
            JobType::Streaming
        } else {
            JobType::Batch
        }
    );
    jg
}

// ------------------------------------------------------------------ world

/// Something that happens at a virtual time.
#[derive(Debug)]
enum Msg {
    /// An event reaching the scheduler; a heartbeat names the TaskManager
    /// incarnation that sent it (it learns when it is not registered).
    ToScheduler {
        event: Box<Event>,
        from: Option<(String, u32)>,
    },
    /// A deployment sent to one incarnation of a TaskManager.
    Deploy(Box<TaskDeploymentDescriptor>, u32),
    Cancel {
        tm: String,
        attempt: ExecutionAttemptId,
    },
    ReleasePartitions {
        tm: String,
        job: JobId,
        partitions: Vec<PartitionRef>,
    },
    ReleaseJob {
        tm: String,
        job: JobId,
    },
    Probe {
        tm: String,
    },
    ReportRunning {
        tm: String,
        inc: u32,
        attempt: ExecutionAttemptId,
    },
    Complete {
        tm: String,
        inc: u32,
        attempt: ExecutionAttemptId,
    },
    HeartbeatTimer {
        tm: String,
        inc: u32,
    },
    Kill {
        tm: usize,
    },
    Restart {
        tm: String,
    },
    Partition {
        tm: usize,
        heal_after: u64,
    },
    Heal {
        tm: String,
    },
    NewTm,
    AddAttempt {
        job: usize,
    },
    CancelJob {
        job: usize,
    },
    Submit {
        job: usize,
    },
    EndFaults,
}

/// A partition a TaskManager serves: (job, data set, subtask, attempt).
type Part = (JobId, u128, u32, u32);

struct SimTm {
    spec: TaskManagerSpec,
    up: bool,
    /// Bumped at every (re)start: timers of an old incarnation are void.
    inc: u32,
    partitioned: bool,
    running: BTreeMap<ExecutionAttemptId, TaskDeploymentDescriptor>,
    partitions: BTreeSet<Part>,
}

struct SimJob {
    id: JobId,
    graph: Arc<JobGraph>,
    fingerprint: String,
    submitted: bool,
    ended: Option<JobState>,
    /// Per data set: (producer vertex index, blocking).
    data_sets: BTreeMap<u128, (usize, bool)>,
}

/// A TaskManager as the events delivered to the scheduler register it.
struct Registered {
    fingerprint: String,
    slots: usize,
    /// Bumped at every fresh registration (after a loss).
    epoch: u64,
    last_heartbeat: u64,
}

#[derive(Default, Debug, Clone, Copy)]
struct Stats {
    steps: u64,
    finished: u64,
    failed: u64,
    canceled: u64,
    restarts: u64,
    tm_losses: u64,
    added_attempts_won: u64,
    /// Attempts failed because heartbeats no longer listed them.
    reconciled: u64,
    virtual_ms: u64,
}

struct Sim {
    rng: Rng,
    s: Scheduler,
    now: u64,
    /// (time, message index): ties go in sending order.
    queue: BinaryHeap<Reverse<(u64, usize)>>,
    msgs: Vec<Option<Box<Msg>>>,
    faults: Faults,
    faults_on: bool,
    fault_end: u64,
    restart_attempts: usize,
    tms: Vec<SimTm>,
    jobs: Vec<SimJob>,
    // Ground truth.
    finished: BTreeSet<ExecutionAttemptId>,
    // What the scheduler was told.
    registered: BTreeMap<String, Registered>,
    epochs: u64,
    // Checker memory.
    deploy_epoch: BTreeMap<ExecutionAttemptId, (String, u64)>,
    /// The winner of each subtask at the last check, per job.
    winners: Vec<Vec<Vec<Option<u32>>>>,
    /// Jobs that ended and were checked: they no longer change.
    frozen: Vec<bool>,
    pipelined_reads: BTreeSet<(ExecutionAttemptId, u128, usize)>,
    /// The scheduler's `poll_timeout` after the last step.
    timer: Option<u64>,
    trace: Option<Vec<String>>,
    stats: Stats,
}

type Check = std::result::Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

fn d(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

impl Sim {
    fn new(seed: u64, trace: bool) -> Sim {
        let mut rng = fluvia_core::random::SplitMix64(seed);
        let faults = Faults::pick(&mut rng);
        let restart_attempts = if rng.chance(200) {
            rng.range(0, 3) as usize
        } else {
            1000
        };
        let s = Scheduler::new(SchedulerConfig {
            slot_request_timeout: d(SLOT_REQUEST_TIMEOUT),
            restart_attempts,
            restart_delay: d(RESTART_DELAY),
            heartbeat_timeout: d(HEARTBEAT_TIMEOUT),
            probe_timeout: d(PROBE_TIMEOUT),
            ..SchedulerConfig::default()
        });
        let fault_end = rng.range(300, 3_000);
        let mut sim = Sim {
            rng,
            s,
            now: 0,
            queue: BinaryHeap::new(),
            msgs: Vec::new(),
            faults,
            faults_on: true,
            fault_end,
            restart_attempts,
            tms: Vec::new(),
            jobs: Vec::new(),
            finished: BTreeSet::new(),
            registered: BTreeMap::new(),
            epochs: 0,
            deploy_epoch: BTreeMap::new(),
            winners: Vec::new(),
            frozen: Vec::new(),
            pipelined_reads: BTreeSet::new(),
            timer: None,
            trace: trace.then(Vec::new),
            stats: Stats::default(),
        };
        sim.note(|| format!("faults {faults:?}, restart attempts {restart_attempts}, faults end at {fault_end} ms"));
        // TaskManagers.
        for _ in 0..sim.rng.range(1, 4) {
            sim.enqueue(0, Msg::NewTm);
        }
        // Jobs, submitted at 0 or while faults go on.
        for k in 0..sim.rng.range(1, 3) as usize {
            let streaming = sim.rng.chance(400);
            let graph = random_graph(&mut sim.rng, streaming);
            let fingerprint = if sim.rng.chance(80) { FP_OTHER } else { FP };
            let data_sets = graph_data_sets(&graph);
            sim.jobs.push(SimJob {
                id: JobId(k as u128 + 1),
                graph: Arc::new(graph),
                fingerprint: fingerprint.to_string(),
                submitted: false,
                ended: None,
                data_sets,
            });
            let at = if sim.rng.chance(500) {
                0
            } else {
                sim.rng.below(fault_end)
            };
            sim.enqueue(at, Msg::Submit { job: k });
        }
        sim.winners = sim
            .jobs
            .iter()
            .map(|j| {
                j.graph
                    .vertices
                    .iter()
                    .map(|v| vec![None; v.parallelism])
                    .collect()
            })
            .collect();
        sim.frozen = vec![false; sim.jobs.len()];
        // Faults.
        let f = sim.faults;
        for _ in 0..f.kills {
            let at = sim.rng.below(fault_end);
            let tm = sim.rng.below(6) as usize;
            sim.enqueue(at, Msg::Kill { tm });
        }
        for _ in 0..f.partitions {
            let at = sim.rng.below(fault_end);
            let tm = sim.rng.below(6) as usize;
            let heal_after = sim.rng.range(100, 3 * HEARTBEAT_TIMEOUT);
            sim.enqueue(at, Msg::Partition { tm, heal_after });
        }
        for _ in 0..f.new_tms {
            let at = sim.rng.below(fault_end);
            sim.enqueue(at, Msg::NewTm);
        }
        for _ in 0..f.add_attempts {
            let at = sim.rng.below(fault_end);
            let job = sim.rng.below(sim.jobs.len() as u64) as usize;
            sim.enqueue(at, Msg::AddAttempt { job });
        }
        if sim.rng.chance(f.cancel_job_pm) {
            let at = sim.rng.below(fault_end);
            let job = sim.rng.below(sim.jobs.len() as u64) as usize;
            sim.enqueue(at, Msg::CancelJob { job });
        }
        sim.enqueue(fault_end, Msg::EndFaults);
        sim
    }

    fn note(&mut self, f: impl FnOnce() -> String) {
        if let Some(t) = &mut self.trace {
            t.push(format!("{:>6} ms  {}", self.now, f()));
        }
    }

    fn enqueue(&mut self, at: u64, msg: Msg) {
        self.queue.push(Reverse((at, self.msgs.len())));
        self.msgs.push(Some(Box::new(msg)));
    }

    fn delay(&mut self) -> u64 {
        self.rng.range(1, self.faults.max_delay)
    }

    /// Sends over the faulty network: maybe dropped, maybe twice.
    fn send_lossy(&mut self, msg: impl Fn() -> Msg) {
        if self.faults_on && self.rng.chance(self.faults.drop_pm) {
            if self.trace.is_some() {
                let m = format!("{:?}", msg());
                self.note(|| format!("   dropped {m}"));
            }
            return;
        }
        let at = self.now + self.delay();
        self.enqueue(at, msg());
        if self.faults_on && self.rng.chance(self.faults.duplicate_pm) {
            let at = self.now + self.delay();
            self.enqueue(at, msg());
        }
    }

    fn send_reliable(&mut self, msg: Msg) {
        let at = self.now + self.delay();
        self.enqueue(at, msg);
    }

    fn report(
        &mut self,
        attempt: ExecutionAttemptId,
        state: ExecutionState,
        failure: Option<&str>,
    ) {
        let metrics = (state == ExecutionState::Finished).then(|| AttemptMetrics {
            records_out: self.rng.below(1000),
            ..AttemptMetrics::default()
        });
        let failure = failure.map(str::to_string);
        self.send_lossy(|| Msg::ToScheduler {
            event: Box::new(Event::AttemptState {
                attempt,
                state,
                failure: failure.clone(),
                metrics: metrics.clone(),
            }),
            from: None,
        });
    }

    fn tm_index(&self, id: &str) -> Option<usize> {
        self.tms.iter().position(|t| t.spec.id == id)
    }

    // ------------------------------------------------------------ run

    fn run(&mut self) -> std::result::Result<Stats, String> {
        loop {
            if self.jobs.iter().all(|j| j.submitted && j.ended.is_some()) {
                break;
            }
            if self.now > self.fault_end + SETTLE {
                let mut states = Vec::new();
                for j in self.s.jobs().filter(|j| !j.state.is_terminal()) {
                    states.push(format!("job {} is {}:", j.id, j.state.name()));
                    for (v, ejv) in j.eg.vertices.iter().enumerate() {
                        for (i, sub) in ejv.subtasks.iter().enumerate() {
                            let attempts: Vec<String> = sub
                                .attempts
                                .iter()
                                .map(|e| {
                                    format!(
                                        "#{} {:?} on {:?}",
                                        e.attempt_number, e.state, e.task_manager
                                    )
                                })
                                .collect();
                            states.push(format!(
                                "  {v}/{i} '{}' winner {:?}: {}",
                                ejv.name,
                                sub.finished_attempt,
                                attempts.join(", ")
                            ));
                        }
                    }
                }
                return Err(format!(
                    "jobs did not end {SETTLE} ms after the faults stopped:\n{}",
                    states.join("\n")
                ));
            }
            if self.stats.steps > MAX_STEPS {
                return Err(format!("more than {MAX_STEPS} steps"));
            }
            let timer = self.timer;
            let next = self.queue.peek().map(|Reverse((t, _))| *t);
            let tick = match (timer, next) {
                (Some(t), Some(n)) => t <= n,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => return Err("nothing left to happen".into()),
            };
            if let (true, Some(t)) = (tick, timer) {
                self.now = self.now.max(t);
                self.step_ok(Event::Tick)?;
            } else if let Some(Reverse((t, k))) = self.queue.pop() {
                self.now = self.now.max(t);
                let msg = self.msgs[k].take().unwrap();
                self.process(*msg)?;
            }
        }
        self.check_end()?;
        self.stats.virtual_ms = self.now;
        Ok(self.stats)
    }

    /// Feeds one event to the scheduler, routes its actions and checks.
    fn step(&mut self, event: Event) -> std::result::Result<fluvia_core::Result<()>, String> {
        self.stats.steps += 1;
        // The scheduler drops a silent TaskManager at its heartbeat timeout
        // (this model is lenient at the boundary; the scheduler's own view
        // is taken after the step).
        let now = self.now;
        self.registered
            .retain(|_, r| now.saturating_sub(r.last_heartbeat) <= HEARTBEAT_TIMEOUT);
        match &event {
            Event::RegisterTaskManager(spec) => {
                if let Some(r) = self.registered.get_mut(&spec.id) {
                    r.last_heartbeat = now;
                } else {
                    self.epochs += 1;
                    self.registered.insert(
                        spec.id.clone(),
                        Registered {
                            fingerprint: spec.fingerprint.clone(),
                            slots: spec.slots,
                            epoch: self.epochs,
                            last_heartbeat: now,
                        },
                    );
                }
            }
            Event::TaskManagerLost { task_manager, .. }
            | Event::ProbeAnswered {
                task_manager,
                alive: false,
            } => {
                self.stats.tm_losses += u64::from(self.registered.remove(task_manager).is_some());
            }
            Event::Heartbeat { task_manager, .. } => {
                if let Some(r) = self.registered.get_mut(task_manager) {
                    r.last_heartbeat = now;
                }
            }
            _ => {}
        }
        if self.trace.is_some() {
            let e = format!("{event:?}");
            self.note(|| format!("-> {e}"));
        }
        let result = self.s.handle(d(self.now), event);
        if let Err(e) = &result {
            self.note(|| format!("   error: {e}"));
        }
        // The scheduler's own view of registrations wins for timeouts (a
        // step never registers a TaskManager the model does not know).
        if self.s.task_managers().count() < self.registered.len() {
            self.registered.retain(|id, _| self.s.is_registered(id));
        }
        let actions = self.s.drain_actions();
        for a in &actions {
            if self.trace.is_some() {
                let t = format!("   {a:?}");
                self.note(|| t);
            }
            self.check_action(a)?;
        }
        for a in actions {
            self.route(a);
        }
        self.check_state()?;
        Ok(result)
    }

    /// A step whose event the scheduler must accept.
    fn step_ok(&mut self, event: Event) -> Check {
        let r = self.step(event)?;
        ensure!(r.is_ok(), "an event was refused (see the trace): {r:?}");
        Ok(())
    }

    fn route(&mut self, a: Action) {
        match a {
            Action::Deploy(dep) => {
                let inc = self
                    .tm_index(&dep.task_manager)
                    .map_or(0, |k| self.tms[k].inc);
                self.send_reliable(Msg::Deploy(dep, inc));
            }
            Action::CancelAttempt {
                task_manager,
                attempt,
            } => self.send_lossy(|| Msg::Cancel {
                tm: task_manager.clone(),
                attempt,
            }),
            Action::ReleasePartitions {
                task_manager,
                job,
                partitions,
            } => self.send_reliable(Msg::ReleasePartitions {
                tm: task_manager,
                job,
                partitions,
            }),
            Action::ReleaseJob { task_manager, job } => {
                self.send_reliable(Msg::ReleaseJob {
                    tm: task_manager,
                    job,
                });
            }
            Action::Probe { task_manager } => {
                self.send_reliable(Msg::Probe { tm: task_manager });
            }
            Action::JobEnded { .. } => {}
            // Simulated attempts stage no files; a commit would succeed.
            Action::CommitFiles {
                task_manager, job, ..
            } => self.send_reliable(Msg::ToScheduler {
                event: Box::new(Event::FilesCommitted {
                    job,
                    task_manager,
                    failure: None,
                }),
                from: None,
            }),
            // The simulated cluster has no shuffle service (internal shuffle).
            Action::ReleaseShufflePartitions { .. }
            | Action::ReleaseShuffleJob { .. }
            | Action::ProbeShuffleService { .. } => {}
        }
    }

    fn process(&mut self, msg: Msg) -> Check {
        match msg {
            Msg::ToScheduler { event, from } => {
                let heartbeat = matches!(*event, Event::Heartbeat { .. });
                let r = self.step(*event)?;
                if heartbeat
                    && r.is_err()
                    && let Some((tm, inc)) = from
                {
                    // Not registered (any more): a TaskManager that is up
                    // drops what it runs and registers afresh.
                    if let Some(k) = self.tm_index(&tm)
                        && self.tms[k].up
                        && self.tms[k].inc == inc
                        && !self.tms[k].partitioned
                    {
                        self.note(|| format!("   {tm} is not registered: re-registers"));
                        self.reset_tm(k);
                        let spec = self.tms[k].spec.clone();
                        self.send_reliable(Msg::ToScheduler {
                            event: Box::new(Event::RegisterTaskManager(spec)),
                            from: None,
                        });
                    }
                }
            }
            Msg::Deploy(dep, inc) => self.tm_deploy(*dep, inc),
            Msg::Cancel { tm, attempt } => {
                if let Some(k) = self.reachable(&tm)
                    && self.tms[k].running.remove(&attempt).is_some()
                {
                    self.report(attempt, ExecutionState::Canceled, None);
                }
            }
            Msg::ReleasePartitions {
                tm,
                job,
                partitions,
            } => {
                if let Some(k) = self.reachable(&tm) {
                    for p in partitions {
                        self.tms[k].partitions.remove(&(
                            job,
                            p.data_set,
                            p.producer_subtask,
                            p.attempt,
                        ));
                    }
                }
            }
            Msg::ReleaseJob { tm, job } => {
                if let Some(k) = self.reachable(&tm) {
                    let t = &mut self.tms[k];
                    t.running.retain(|a, _| a.job != job);
                    t.partitions.retain(|p| p.0 != job);
                }
            }
            Msg::Probe { tm } => match self.tm_index(&tm) {
                Some(k) if self.tms[k].up && self.tms[k].partitioned => {}
                Some(k) if self.tms[k].up => self.send_reliable(Msg::ToScheduler {
                    event: Box::new(Event::ProbeAnswered {
                        task_manager: tm,
                        alive: true,
                    }),
                    from: None,
                }),
                _ => self.send_reliable(Msg::ToScheduler {
                    event: Box::new(Event::ProbeAnswered {
                        task_manager: tm,
                        alive: false,
                    }),
                    from: None,
                }),
            },
            Msg::ReportRunning { tm, inc, attempt } => {
                if let Some(k) = self.tm_index(&tm)
                    && self.tms[k].up
                    && self.tms[k].inc == inc
                    && self.tms[k].running.contains_key(&attempt)
                    && !self.tms[k].partitioned
                {
                    self.report(attempt, ExecutionState::Running, None);
                }
            }
            Msg::Complete { tm, inc, attempt } => self.tm_complete(&tm, inc, attempt),
            Msg::HeartbeatTimer { tm, inc } => {
                if let Some(k) = self.tm_index(&tm)
                    && self.tms[k].up
                    && self.tms[k].inc == inc
                {
                    if !self.tms[k].partitioned {
                        let running: Vec<ExecutionAttemptId> =
                            self.tms[k].running.keys().copied().collect();
                        self.send_lossy(|| Msg::ToScheduler {
                            event: Box::new(Event::Heartbeat {
                                task_manager: tm.clone(),
                                running: running.clone(),
                            }),
                            from: Some((tm.clone(), inc)),
                        });
                    }
                    self.enqueue(
                        self.now + HEARTBEAT_INTERVAL,
                        Msg::HeartbeatTimer { tm, inc },
                    );
                }
            }
            Msg::Kill { tm } => {
                if let Some(k) = self.nth_up(tm) {
                    let id = self.tms[k].spec.id.clone();
                    self.note(|| format!("   kill {id}"));
                    self.tms[k].up = false;
                    self.reset_tm(k);
                    if self.rng.chance(500) {
                        // The shell notices the connection closing.
                        self.send_reliable(Msg::ToScheduler {
                            event: Box::new(Event::TaskManagerLost {
                                task_manager: id.clone(),
                                reason: "connection closed".to_string(),
                            }),
                            from: None,
                        });
                    }
                    if self.rng.chance(self.faults.restart_pm) {
                        let at = self.now + self.rng.range(10, self.faults.restart_within);
                        self.enqueue(at, Msg::Restart { tm: id });
                    }
                }
            }
            Msg::Restart { tm } => {
                let Some(k) = self.tm_index(&tm) else {
                    return Ok(());
                };
                if self.tms[k].up {
                    return Ok(());
                }
                self.note(|| format!("   restart {tm}"));
                let t = &mut self.tms[k];
                t.up = true;
                t.inc += 1;
                t.partitioned = false;
                if self.rng.chance(100) {
                    t.spec.fingerprint = FP_OTHER.to_string();
                }
                let (spec, inc) = (t.spec.clone(), t.inc);
                // The shell sees a new incarnation of a TaskManager it may
                // still know: the old one is lost.
                if self.registered.contains_key(&tm) {
                    self.step_ok(Event::TaskManagerLost {
                        task_manager: tm.clone(),
                        reason: "restarted".to_string(),
                    })?;
                }
                self.step_ok(Event::RegisterTaskManager(spec))?;
                self.enqueue(
                    self.now + HEARTBEAT_INTERVAL,
                    Msg::HeartbeatTimer { tm, inc },
                );
            }
            Msg::Partition { tm, heal_after } => {
                if let Some(k) = self.nth_up(tm) {
                    let id = self.tms[k].spec.id.clone();
                    self.note(|| format!("   partition {id} for {heal_after} ms"));
                    self.tms[k].partitioned = true;
                    self.enqueue(self.now + heal_after, Msg::Heal { tm: id });
                }
            }
            Msg::Heal { tm } => {
                if let Some(k) = self.tm_index(&tm) {
                    self.tms[k].partitioned = false;
                }
            }
            Msg::NewTm => {
                let fingerprint = if self.rng.chance(150) { FP_OTHER } else { FP };
                let slots = self.rng.range(1, 4) as usize;
                self.add_tm(slots, fingerprint)?;
            }
            Msg::AddAttempt { job } => {
                let j = &self.jobs[job];
                if j.submitted {
                    let (id, g) = (j.id, j.graph.clone());
                    let vertex = self.rng.below(g.vertices.len() as u64) as usize;
                    let subtask = self.rng.below(g.vertices[vertex].parallelism as u64) as usize;
                    // Refused for streaming jobs and finished subtasks.
                    let _refused = self.step(Event::AddAttempt {
                        job: id,
                        vertex,
                        subtask,
                    })?;
                }
            }
            Msg::CancelJob { job } => {
                if self.jobs[job].submitted {
                    let id = self.jobs[job].id;
                    let _ended_already = self.step(Event::CancelJob { job: id })?;
                }
            }
            Msg::Submit { job } => {
                let j = &mut self.jobs[job];
                j.submitted = true;
                let event = Event::SubmitJob {
                    job: j.id,
                    graph: j.graph.clone(),
                    program: "sim-program".to_string(),
                    fingerprint: j.fingerprint.clone(),
                };
                let r = self.step(event)?;
                ensure!(r.is_ok(), "a valid job was refused: {r:?}");
            }
            Msg::EndFaults => {
                self.note(|| "faults stop".to_string());
                self.faults_on = false;
                for t in &mut self.tms {
                    t.partitioned = false;
                }
                // A healthy TaskManager big enough for any one job.
                let slots = self
                    .jobs
                    .iter()
                    .map(|j| j.graph.required_slots())
                    .max()
                    .unwrap_or(1);
                self.add_tm(slots, FP)?;
            }
        }
        Ok(())
    }

    /// The `n`-th TaskManager that is up (modulo their number).
    fn nth_up(&self, n: usize) -> Option<usize> {
        let up: Vec<usize> = (0..self.tms.len()).filter(|&k| self.tms[k].up).collect();
        (!up.is_empty()).then(|| up[n % up.len()])
    }

    /// The TaskManager, if a message from the JobManager reaches it.
    fn reachable(&self, tm: &str) -> Option<usize> {
        self.tm_index(tm)
            .filter(|&k| self.tms[k].up && !self.tms[k].partitioned)
    }

    fn add_tm(&mut self, slots: usize, fingerprint: &str) -> Check {
        let id = format!("tm-{}", self.tms.len());
        let spec = TaskManagerSpec {
            id: id.clone(),
            slots,
            fingerprint: fingerprint.to_string(),
            data_address: format!("{id}:data"),
        };
        self.tms.push(SimTm {
            spec: spec.clone(),
            up: true,
            inc: 0,
            partitioned: false,
            running: BTreeMap::new(),
            partitions: BTreeSet::new(),
        });
        self.step_ok(Event::RegisterTaskManager(spec))?;
        self.enqueue(
            self.now + HEARTBEAT_INTERVAL,
            Msg::HeartbeatTimer { tm: id, inc: 0 },
        );
        Ok(())
    }

    /// The TaskManager loses everything it ran and held.
    fn reset_tm(&mut self, k: usize) {
        let t = &mut self.tms[k];
        t.running.clear();
        t.partitions.clear();
    }

    fn tm_deploy(&mut self, dep: TaskDeploymentDescriptor, inc: u32) {
        let a = dep.attempt;
        let failed = |reason: &str| Msg::ToScheduler {
            event: Box::new(Event::DeployFailed {
                attempt: a,
                reason: reason.to_string(),
            }),
            from: None,
        };
        let Some(k) = self.tm_index(&dep.task_manager).filter(|&k| self.tms[k].up) else {
            self.send_reliable(failed("connection refused"));
            return;
        };
        if self.tms[k].partitioned {
            let at = self.now + 2 * self.faults.max_delay;
            self.enqueue(at, failed("the deploy RPC timed out"));
            return;
        }
        // A restarted TaskManager holds no slot of the JobManager's; the
        // scheduler checked the program when it deployed (check_deploy).
        let job = self.jobs.iter().find(|j| j.id == a.job).unwrap();
        if self.tms[k].inc != inc || self.tms[k].spec.fingerprint != job.fingerprint {
            self.send_reliable(failed("no such slot allocation"));
            return;
        }
        if self.faults_on && self.rng.chance(self.faults.deploy_fail_pm) {
            self.send_reliable(failed("injected deploy failure"));
            return;
        }
        let tm = dep.task_manager.clone();
        self.tms[k].running.insert(a, dep);
        if self.faults_on && self.rng.chance(self.faults.ack_lost_pm) {
            self.send_reliable(failed("the deploy RPC timed out"));
        } else {
            self.send_reliable(Msg::ToScheduler {
                event: Box::new(Event::DeployAcknowledged { attempt: a }),
                from: None,
            });
        }
        let running_at = self.now + self.rng.range(1, 30);
        let done_at = running_at + self.rng.range(10, 300);
        // Some attempts end before their RUNNING report goes out.
        if self.rng.chance(750) {
            self.enqueue(
                running_at,
                Msg::ReportRunning {
                    tm: tm.clone(),
                    inc,
                    attempt: a,
                },
            );
        }
        self.enqueue(
            done_at,
            Msg::Complete {
                tm,
                inc,
                attempt: a,
            },
        );
    }

    /// An attempt reaches its end on its TaskManager.
    fn tm_complete(&mut self, tm: &str, inc: u32, a: ExecutionAttemptId) {
        let Some(k) = self.tm_index(tm) else { return };
        if !self.tms[k].up || self.tms[k].inc != inc {
            return;
        }
        let Some(dep) = self.tms[k].running.get(&a).cloned() else {
            return;
        };
        let job = self.jobs.iter().find(|j| j.id == a.job).unwrap();
        let mut failure = None;
        let mut wait = false;
        for input in &dep.inputs {
            let p = input.partition;
            let (producer_vertex, blocking) = job.data_sets[&p.data_set];
            let producer_tm = self
                .tms
                .iter()
                .find(|t| t.spec.data_address == input.producer_address);
            if blocking {
                let there = producer_tm.is_some_and(|t| {
                    t.up && t.partitions.contains(&(
                        a.job,
                        p.data_set,
                        p.producer_subtask,
                        p.attempt,
                    ))
                });
                if !there {
                    failure = Some(format!("partition {p:?} not found"));
                }
            } else {
                let producer = ExecutionAttemptId {
                    job: a.job,
                    vertex: producer_vertex,
                    subtask: p.producer_subtask as usize,
                    attempt: p.attempt,
                };
                if self.finished.contains(&producer) {
                    continue;
                }
                if producer_tm.is_some_and(|t| t.up && t.running.contains_key(&producer)) {
                    wait = true; // the producer still writes
                } else {
                    failure = Some(format!("producer {producer} is gone"));
                }
            }
        }
        if failure.is_none() && wait {
            let at = self.now + self.rng.range(10, 50);
            self.enqueue(
                at,
                Msg::Complete {
                    tm: tm.to_string(),
                    inc,
                    attempt: a,
                },
            );
            return;
        }
        if failure.is_none() && self.faults_on && self.rng.chance(self.faults.attempt_fail_pm) {
            failure = Some("injected task failure".to_string());
        }
        let t = &mut self.tms[k];
        t.running.remove(&a);
        let reachable = !t.partitioned;
        match failure {
            Some(f) => {
                if reachable {
                    self.report(a, ExecutionState::Failed, Some(&f));
                }
            }
            None => {
                for o in &dep.outputs {
                    t.partitions
                        .insert((a.job, o.data_set, a.subtask as u32, a.attempt));
                }
                self.finished.insert(a);
                if reachable {
                    self.report(a, ExecutionState::Finished, None);
                }
            }
        }
    }

    // ------------------------------------------------------------ checks

    fn sim_job(&self, id: JobId) -> Option<usize> {
        self.jobs.iter().position(|j| j.id == id)
    }

    fn check_action(&mut self, action: &Action) -> Check {
        match action {
            Action::Deploy(dep) => self.check_deploy(dep),
            Action::JobEnded { job, state } => {
                let k = self.sim_job(*job).unwrap();
                ensure!(
                    self.jobs[k].ended.is_none(),
                    "job {job} ended twice ({state:?})"
                );
                self.jobs[k].ended = Some(*state);
                let j = self.s.job(*job).unwrap();
                ensure!(
                    j.state == *state,
                    "JobEnded {state:?} but job is {:?}",
                    j.state
                );
                match state {
                    JobState::Finished => self.stats.finished += 1,
                    JobState::Failed => self.stats.failed += 1,
                    _ => self.stats.canceled += 1,
                }
                self.stats.restarts += j.restarts as u64;
                self.stats.reconciled +=
                    j.eg.vertices
                        .iter()
                        .flat_map(|v| &v.subtasks)
                        .flat_map(|s| &s.attempts)
                        .filter(|e| {
                            e.failure_cause
                                .as_deref()
                                .is_some_and(|c| c.contains("no longer runs this attempt"))
                        })
                        .count() as u64;
                if *state == JobState::Failed {
                    let cause = j.failure_cause.clone().unwrap_or_default();
                    let no_slots = cause.contains("not enough slots")
                        || cause.contains("no registered TaskManager carries program");
                    ensure!(
                        no_slots || j.restarts == self.restart_attempts,
                        "job {job} failed after {} of {} restarts: {cause}",
                        j.restarts,
                        self.restart_attempts
                    );
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn check_deploy(&mut self, dep: &TaskDeploymentDescriptor) -> Check {
        let a = dep.attempt;
        let tm = &dep.task_manager;
        let k = self.sim_job(a.job).unwrap();
        let fingerprint = &self.jobs[k].fingerprint;
        let Some(r) = self.registered.get(tm) else {
            return Err(format!("{a} deployed to {tm}, which is not registered"));
        };
        ensure!(
            self.s.is_registered(tm),
            "{a} deployed to {tm}, which the scheduler lost"
        );
        ensure!(
            &r.fingerprint == fingerprint,
            "{a} deployed to {tm} with program {}, the job's is {fingerprint}",
            r.fingerprint
        );
        ensure!(
            self.deploy_epoch.insert(a, (tm.clone(), r.epoch)).is_none(),
            "{a} deployed twice"
        );
        let job = self.s.job(a.job).unwrap();
        ensure!(!job.state.is_terminal(), "{a} deployed for an ended job");
        let sub = &job.eg.vertices[a.vertex].subtasks[a.subtask];
        let e = sub.attempt(a.attempt).unwrap();
        ensure!(
            e.state == ExecutionState::Deploying && e.task_manager.as_deref() == Some(tm),
            "{a} deployed but it is {:?} on {:?}",
            e.state,
            e.task_manager
        );
        // Inputs: exactly the consumed subpartitions.
        let mut expected: Vec<(u128, u32, u32, u8)> = Vec::new();
        for cp in &sub.consumed {
            let ds = job.eg.results[cp.result].data_set.0;
            for sp in cp.subpartitions.iter() {
                expected.push((ds, cp.producer_subtask as u32, sp as u32, cp.type_number));
            }
        }
        let mut got: Vec<(u128, u32, u32, u8)> = dep
            .inputs
            .iter()
            .flat_map(|i| {
                (i.first_subpartition..=i.last_subpartition).map(|sp| {
                    (
                        i.partition.data_set,
                        i.partition.producer_subtask,
                        sp,
                        i.type_number,
                    )
                })
            })
            .collect();
        expected.sort();
        got.sort();
        ensure!(
            expected == got,
            "{a}'s inputs {got:?} are not what it consumes {expected:?}"
        );
        let mut reads = BTreeSet::new();
        for input in &dep.inputs {
            let p = input.partition;
            let (pv, blocking) = self.jobs[k].data_sets[&p.data_set];
            let producer = &job.eg.vertices[pv].subtasks[p.producer_subtask as usize];
            let pa = ExecutionAttemptId {
                job: a.job,
                vertex: pv,
                subtask: p.producer_subtask as usize,
                attempt: p.attempt,
            };
            let pe = producer.attempt(p.attempt).unwrap();
            let ptm = pe.task_manager.clone().unwrap_or_default();
            ensure!(
                input.producer_address == format!("{ptm}:data"),
                "{a} reads {pa} at {} but it ran on {ptm}",
                input.producer_address
            );
            if blocking {
                ensure!(
                    producer.finished_attempt == Some(p.attempt),
                    "{a} reads {pa}, not the winner {:?}",
                    producer.finished_attempt
                );
                ensure!(
                    self.finished.contains(&pa),
                    "{a} reads {pa}, which never finished"
                );
                let (dtm, epoch) = &self.deploy_epoch[&pa];
                let now_epoch = self.registered.get(dtm).map(|r| r.epoch);
                ensure!(
                    now_epoch == Some(*epoch),
                    "{a} reads {pa} from {dtm}, which was lost since it ran there"
                );
            } else {
                // Deploying is enough on the consumer's own TaskManager:
                // its deployment was queued there first.
                ensure!(
                    matches!(
                        pe.state,
                        ExecutionState::Initializing | ExecutionState::Running
                    ) || (pe.state == ExecutionState::Deploying && ptm == *tm)
                        || producer.finished_attempt == Some(p.attempt),
                    "{a} reads pipelined {pa} on {ptm} from {tm}, which is {:?}",
                    pe.state
                );
                if reads.insert((pa, p.data_set)) {
                    ensure!(
                        self.pipelined_reads.insert((pa, p.data_set, a.subtask)),
                        "{a} reads pipelined {pa} again (another attempt read it)"
                    );
                }
            }
        }
        Ok(())
    }

    fn check_state(&mut self) -> Check {
        self.timer = self.s.poll_timeout().map(|t| t.as_millis() as u64);
        if let Some(t) = self.timer {
            ensure!(
                t > self.now,
                "poll_timeout {t} ms is not after now ({} ms): a tick would change nothing",
                self.now
            );
        }
        let mut used: BTreeMap<&str, usize> = BTreeMap::new();
        for (k, sj) in self.jobs.iter().enumerate() {
            if self.frozen[k] {
                continue;
            }
            let Some(job) = self.s.job(sj.id) else {
                continue;
            };
            let terminal = job.state.is_terminal();
            // The scheduler ignores everything about an ended job.
            self.frozen[k] = terminal;
            ensure!(
                !terminal || job.slots.is_empty(),
                "ended job {} holds slots",
                job.id
            );
            for (v, ejv) in job.eg.vertices.iter().enumerate() {
                for (i, sub) in ejv.subtasks.iter().enumerate() {
                    let prev = self.winners[k][v][i];
                    let id = |n: u32| ExecutionAttemptId {
                        job: job.id,
                        vertex: v,
                        subtask: i,
                        attempt: n,
                    };
                    if let Some(n) = sub.finished_attempt {
                        let e = sub.attempt(n).unwrap();
                        ensure!(
                            e.state == ExecutionState::Finished,
                            "winner {} is {:?}",
                            id(n),
                            e.state
                        );
                    }
                    match (prev, sub.finished_attempt) {
                        (Some(p), Some(n)) => ensure!(
                            p == n,
                            "winner of {}/{v}/{i} changed from #{p} to #{n}",
                            job.id
                        ),
                        (None, Some(n)) => {
                            ensure!(
                                self.finished.contains(&id(n)),
                                "winner {} never finished",
                                id(n)
                            );
                            if job.graph.job_type == JobType::Batch
                                && sub.attempts.iter().any(|a| {
                                    a.attempt_number != n
                                        && matches!(
                                            a.state,
                                            ExecutionState::Canceling | ExecutionState::Canceled
                                        )
                                })
                            {
                                self.stats.added_attempts_won += 1;
                            }
                            self.winners[k][v][i] = Some(n);
                        }
                        (Some(p), None) => {
                            // Its results are gone with its TaskManager (the
                            // registration it ran under ended)...
                            let (tm, epoch) = &self.deploy_epoch[&id(p)];
                            let lost = self.registered.get(tm).is_none_or(|r| r.epoch != *epoch);
                            // ... or its pipelined region restarts as a
                            // whole (the restart may have fired already).
                            let region_restarts = job.graph.job_type == JobType::Streaming
                                && (job.state == JobState::Restarting
                                    || sub.latest_attempt().attempt_number > p);
                            ensure!(
                                lost || region_restarts,
                                "winner {} was dropped while its results are there",
                                id(p)
                            );
                            self.winners[k][v][i] = None;
                        }
                        (None, None) => {}
                    }
                    for e in &sub.attempts {
                        let id = || format!("{}/{v}/{i}#{}", job.id, e.attempt_number);
                        if terminal {
                            ensure!(!e.state.is_live(), "{} is live in an ended job", id());
                            continue;
                        }
                        let holds = e.state.is_live() || e.state == ExecutionState::Scheduled;
                        if !holds {
                            ensure!(e.slot.is_none(), "{} is {:?} with a slot", id(), e.state);
                            continue;
                        }
                        let Some(s) = e.slot.and_then(|s| job.slots.get(&s)) else {
                            return Err(format!("{} is {:?} without a slot", id(), e.state));
                        };
                        ensure!(
                            s.hosted.contains(&(v, i, e.attempt_number))
                                && e.task_manager.as_deref() == Some(s.task_manager.as_str()),
                            "{} on {:?} is not hosted by its slot {s:?}",
                            id(),
                            e.task_manager
                        );
                    }
                }
            }
            for s in job.slots.values() {
                ensure!(!s.hosted.is_empty(), "an empty slot is held: {s:?}");
                ensure!(
                    self.s.is_registered(&s.task_manager),
                    "a slot on lost {}",
                    s.task_manager
                );
                // `hosted` is sorted by vertex first.
                let mut vertices = s.hosted.iter().map(|h| h.0);
                let mut last = vertices.next();
                for v in vertices {
                    ensure!(
                        Some(v) != last,
                        "slot hosts two attempts of one vertex: {s:?}"
                    );
                    last = Some(v);
                }
                for &(v, i, _) in &s.hosted {
                    ensure!(
                        i == s.index && job.graph.vertices[v].slot_sharing_group == s.group,
                        "slot {s:?} hosts {v}/{i} of group {}",
                        job.graph.vertices[v].slot_sharing_group
                    );
                }
                *used.entry(s.task_manager.as_str()).or_insert(0) += 1;
            }
        }
        for (spec, n) in self.s.task_managers() {
            let held = used.get(spec.id.as_str()).copied().unwrap_or(0);
            ensure!(
                held == n,
                "{}: the jobs hold {held} slots, it counts {n} used",
                spec.id
            );
            let slots = self.registered.get(&spec.id).map_or(0, |r| r.slots);
            ensure!(
                n <= slots && slots == spec.slots,
                "{} has {n} used of {slots} slots",
                spec.id
            );
        }
        Ok(())
    }

    fn check_end(&self) -> Check {
        for sj in &self.jobs {
            let job = self.s.job(sj.id).unwrap();
            ensure!(job.state.is_terminal(), "job {} is {:?}", sj.id, job.state);
            if job.state == JobState::Finished {
                for (v, ejv) in job.eg.vertices.iter().enumerate() {
                    for (i, sub) in ejv.subtasks.iter().enumerate() {
                        ensure!(
                            sub.finished_attempt.is_some(),
                            "finished job {} has unfinished subtask {v}/{i}",
                            sj.id
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

fn graph_data_sets(g: &JobGraph) -> BTreeMap<u128, (usize, bool)> {
    let mut m = BTreeMap::new();
    for (v, jv) in g.vertices.iter().enumerate() {
        for ds in &jv.produced_data_sets {
            m.insert(
                ds.id.0,
                (v, ds.result_partition_type == ResultPartitionType::Blocking),
            );
        }
    }
    m
}

// ------------------------------------------------------------------ driver

/// Runs one seed; a panic in the scheduler counts as a failure.
fn run_seed(seed: u64, trace: bool) -> (std::result::Result<Stats, String>, Vec<String>) {
    let mut sim = None;
    let r = catch_unwind(AssertUnwindSafe(|| {
        let s = sim.insert(Sim::new(seed, trace));
        s.run()
    }));
    let trace = sim.and_then(|s| s.trace).unwrap_or_default();
    match r {
        Ok(r) => (r, trace),
        Err(p) => (Err(format!("panicked: {}", panic_message(&*p))), trace),
    }
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.steps += o.steps;
        self.finished += o.finished;
        self.failed += o.failed;
        self.canceled += o.canceled;
        self.restarts += o.restarts;
        self.tm_losses += o.tm_losses;
        self.added_attempts_won += o.added_attempts_won;
        self.reconciled += o.reconciled;
        self.virtual_ms += o.virtual_ms;
    }
}

/// Runs seeds `0..seeds` on a few threads; returns the summed stats, or
/// the smallest failing seed with its error (deterministic whatever the
/// threads' interleaving: every seed below a failure is run).
fn run_seeds(seeds: u64, threads: usize) -> std::result::Result<Stats, (u64, String)> {
    let next = AtomicU64::new(0);
    let first_failure = Mutex::new(None::<(u64, String)>);
    let total = Mutex::new(Stats::default());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                let mut local = Stats::default();
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    let failed_below =
                        |f: &Option<(u64, String)>| f.as_ref().is_some_and(|(s, _)| *s < seed);
                    if seed >= seeds || failed_below(&first_failure.lock().unwrap()) {
                        break;
                    }
                    match run_seed(seed, false).0 {
                        Ok(s) => local.add(&s),
                        Err(e) => {
                            let mut f = first_failure.lock().unwrap();
                            if f.as_ref().is_none_or(|(s, _)| seed < *s) {
                                *f = Some((seed, e));
                            }
                        }
                    }
                }
                total.lock().unwrap().add(&local);
            });
        }
    });
    match first_failure.into_inner().unwrap() {
        Some(f) => Err(f),
        None => Ok(total.into_inner().unwrap()),
    }
}

#[test]
fn simulated_clusters_keep_the_scheduler_invariants() {
    if let Some(seed) = env_u64("FLUVIA_SIM_SEED") {
        let (r, trace) = run_seed(seed, true);
        for line in &trace {
            println!("{line}");
        }
        match r {
            Ok(stats) => println!("seed {seed} passed: {stats:?}"),
            Err(e) => panic!("seed {seed}: {e}"),
        }
        return;
    }
    let seeds = env_u64("FLUVIA_SIM_SEEDS").unwrap_or(10_000);
    let threads = env_u64("FLUVIA_SIM_THREADS").map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get().min(4)),
        |n| n.max(1) as usize,
    );
    let started = Instant::now();
    let total = match run_seeds(seeds, threads) {
        Ok(total) => total,
        Err((seed, e)) => {
            let (_, trace) = run_seed(seed, true);
            let tail = trace.len().saturating_sub(400);
            for line in &trace[tail..] {
                eprintln!("{line}");
            }
            panic!(
                "seed {seed} failed: {e}\nreplay: FLUVIA_SIM_SEED={seed} cargo test -p \
                 fluvia-scheduler --test simulation -- --nocapture"
            );
        }
    };
    println!(
        "{seeds} seeds on {threads} threads in {:?}: {total:?}",
        started.elapsed()
    );
    // The harness must exercise the scheduler, not only fail jobs early.
    let jobs = total.finished + total.failed + total.canceled;
    assert!(
        total.finished * 10 >= jobs * 7,
        "too few jobs finished: {total:?}"
    );
    if seeds >= 1000 {
        assert!(
            total.restarts > 0
                && total.tm_losses > 0
                && total.added_attempts_won > 0
                && total.reconciled > 0,
            "faults were not exercised: {total:?}"
        );
    }
}

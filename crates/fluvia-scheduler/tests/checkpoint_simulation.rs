//! Deterministic simulation of the checkpoint coordinator in a faulty job.
//!
//! Each seed builds a random job (1–4 vertices, parallelism 1–3, one or two
//! chained operators, random upstream edges), random settings (interval,
//! timeout, min-pause, max-concurrent, retained count, tolerable failures)
//! and a seeded fault injector on a virtual clock: acknowledgements lost,
//! delayed past the timeout, duplicated and delivered after their
//! checkpoint ended, declines, single task failures (region restarts),
//! TaskManager loss (several tasks fail, the job restarts), `_metadata`
//! writes that fail, tasks finishing (FLIP-147), savepoints and
//! stop-with-savepoints. A `FailJob` restarts the job.
//!
//! After every step (one `CheckpointCoordinator::handle`) the invariants
//! are checked:
//! - checkpoint ids strictly increase;
//! - a completed checkpoint (as written and as notified) holds exactly one
//!   state handle for every task that was running at trigger time — the
//!   acknowledgement of that task's attempt — and nothing else;
//! - at most `max-concurrent` checkpoints are pending (savepoints aside);
//! - the recovery point is always the latest completed checkpoint;
//! - subsumed checkpoints are discarded exactly once, never the latest,
//!   never a savepoint, and orphaned state discarded never belongs to a
//!   live completed checkpoint;
//! - after a tick, `next_deadline` is in the future;
//! - every savepoint request is answered exactly once;
//! - once faults stop, a new checkpoint completes (liveness), and in the
//!   end exactly the checkpoints beyond `num-retained` were discarded.
//!
//! Replay: `FLUVIA_CKPT_SIM_SEED=<n>` runs only seed n and prints its trace;
//! `FLUVIA_CKPT_SIM_SEEDS=<count>` changes how many seeds run.

#![allow(clippy::unwrap_used)]

mod common;

use common::{env_u64, panic_message};

use fluvia_core::JobId;
use fluvia_scheduler::checkpoint::{
    CheckpointAction as A, CheckpointConfig, CheckpointCoordinator, CheckpointEvent as E,
    CheckpointFailureReason, CompletedCheckpoint, OperatorId, OperatorSubtaskState, SavepointKind,
    StateHandle, StateKind, StateLocation, SubtaskCheckpointMetrics, TaskId, TaskStateSnapshot,
    TasksPlan, VertexPlan,
};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

const TICK: u64 = 10;
const FAULT_PHASE: u64 = 20_000;
const SETTLE: u64 = 15_000;
const JOB: JobId = JobId(0xc0ffee);

/// The faults' dice (seedable, so a failing seed replays).
type Rng = fluvia_core::random::SplitMix64;

#[derive(Debug, Clone, Copy, Default)]
struct Faults {
    drop_pm: u32,
    duplicate_pm: u32,
    decline_pm: u32,
    /// Acknowledgements take 1..=max_delay ms.
    max_delay: u64,
    task_fail_pm: u32,
    tm_loss_pm: u32,
    metadata_fail_pm: u32,
    finish_pm: u32,
    savepoint_pm: u32,
}

impl Faults {
    fn pick(rng: &mut Rng, timeout: u64) -> Faults {
        match rng.below(4) {
            0 => Faults {
                max_delay: rng.range(1, 50),
                finish_pm: rng.range(0, 2) as u32,
                savepoint_pm: rng.range(0, 5) as u32,
                ..Faults::default()
            },
            1 => Faults {
                drop_pm: rng.range(10, 200) as u32,
                duplicate_pm: rng.range(10, 300) as u32,
                decline_pm: rng.range(0, 50) as u32,
                max_delay: rng.range(10, timeout * 2),
                metadata_fail_pm: rng.range(0, 200) as u32,
                savepoint_pm: rng.range(0, 5) as u32,
                ..Faults::default()
            },
            2 => Faults {
                drop_pm: rng.range(0, 50) as u32,
                duplicate_pm: rng.range(0, 100) as u32,
                decline_pm: rng.range(0, 20) as u32,
                max_delay: rng.range(1, 100),
                task_fail_pm: rng.range(1, 10) as u32,
                tm_loss_pm: rng.range(1, 5) as u32,
                metadata_fail_pm: rng.range(0, 50) as u32,
                finish_pm: rng.range(0, 3) as u32,
                savepoint_pm: rng.range(0, 5) as u32,
            },
            _ => Faults {
                drop_pm: rng.range(0, 150) as u32,
                duplicate_pm: rng.range(0, 200) as u32,
                decline_pm: rng.range(0, 60) as u32,
                max_delay: rng.range(1, timeout + timeout / 2),
                task_fail_pm: rng.range(0, 10) as u32,
                tm_loss_pm: rng.range(0, 5) as u32,
                metadata_fail_pm: rng.range(0, 150) as u32,
                finish_pm: rng.range(0, 3) as u32,
                savepoint_pm: rng.range(0, 8) as u32,
            },
        }
    }
}

fn random_plan(rng: &mut Rng) -> TasksPlan {
    let n = rng.range(1, 4) as usize;
    let vertices = (0..n)
        .map(|v| {
            let mut inputs = BTreeSet::new();
            // Vertex 0 is a source; later ones sometimes are too.
            if v > 0 && !rng.chance(150) {
                inputs.insert(rng.below(v as u64) as usize);
                if rng.chance(300) {
                    inputs.insert(rng.below(v as u64) as usize);
                }
            }
            let ops = rng.range(1, 2);
            VertexPlan {
                name: format!("v{v}"),
                parallelism: rng.range(1, 3) as usize,
                max_parallelism: 128,
                operators: (0..ops)
                    .map(|o| OperatorId::new(format!("uid-{v}-{o}")))
                    .collect(),
                inputs: inputs.into_iter().collect(),
            }
        })
        .collect();
    TasksPlan { vertices }
}

fn random_config(rng: &mut Rng) -> CheckpointConfig {
    let interval = rng.range(20, 300);
    CheckpointConfig {
        interval: Some(Duration::from_millis(interval)),
        timeout: Duration::from_millis(rng.range(100, 1_000)),
        min_pause: Duration::from_millis(if rng.chance(300) {
            rng.range(1, 200)
        } else {
            0
        }),
        max_concurrent: rng.range(1, 3) as usize,
        num_retained: rng.range(1, 3) as usize,
        tolerable_failed: match rng.below(3) {
            0 => None,
            1 => Some(rng.range(0, 5) as u32),
            _ => Some(1_000_000),
        },
        checkpoint_dir: Some("/ckpt".into()),
        savepoint_dir: if rng.chance(700) {
            Some("/sp".into())
        } else {
            None
        },
        ..CheckpointConfig::default()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Running,
    Finished,
    Down,
}

#[derive(Debug, Clone, Copy)]
struct SimTask {
    attempt: u32,
    life: Life,
}

#[derive(Debug, Clone)]
enum Msg {
    Deliver(E),
    /// The attempt is deployed and runs.
    Start {
        task: TaskId,
        attempt: u32,
    },
}

/// What the world knew when a checkpoint was triggered.
#[derive(Debug, Clone)]
struct Expect {
    running: BTreeMap<TaskId, u32>,
    savepoint: bool,
}

struct Sim {
    rng: Rng,
    now: u64,
    c: CheckpointCoordinator,
    plan: TasksPlan,
    cfg: CheckpointConfig,
    faults: Faults,
    faults_on: bool,
    tasks: BTreeMap<TaskId, SimTask>,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    msgs: BTreeMap<u64, Msg>,
    seq: u64,
    expected: BTreeMap<u64, Expect>,
    last_id: u64,
    /// Non-savepoint checkpoints completed, in order.
    completed: Vec<u64>,
    /// Handle paths of completed checkpoints not discarded.
    live_paths: BTreeMap<u64, BTreeSet<String>>,
    discarded: BTreeSet<u64>,
    savepoints: BTreeSet<u64>,
    requests_open: BTreeSet<String>,
    requests_answered: BTreeSet<String>,
    next_request: u64,
    /// The job ended: retained checkpoints go, the latest too.
    terminated: bool,
    trace: Vec<String>,
    verbose: bool,
}

fn path_of(id: u64, task: TaskId, attempt: u32) -> String {
    format!("/ckpt/chk-{id}/{}-{}-a{attempt}", task.vertex, task.subtask)
}

impl Sim {
    fn new(seed: u64, verbose: bool) -> Sim {
        let mut rng = fluvia_core::random::SplitMix64(seed);
        let plan = random_plan(&mut rng);
        let cfg = random_config(&mut rng);
        let faults = Faults::pick(&mut rng, cfg.timeout.as_millis() as u64);
        let c = CheckpointCoordinator::new(cfg.clone(), JOB, plan.clone()).unwrap();
        let tasks = plan
            .tasks()
            .map(|t| {
                (
                    t,
                    SimTask {
                        attempt: 0,
                        life: Life::Down,
                    },
                )
            })
            .collect();
        let mut sim = Sim {
            rng,
            now: 0,
            c,
            plan,
            cfg,
            faults,
            faults_on: true,
            tasks,
            queue: BinaryHeap::new(),
            msgs: BTreeMap::new(),
            seq: 0,
            expected: BTreeMap::new(),
            last_id: 0,
            completed: Vec::new(),
            live_paths: BTreeMap::new(),
            discarded: BTreeSet::new(),
            savepoints: BTreeSet::new(),
            requests_open: BTreeSet::new(),
            requests_answered: BTreeSet::new(),
            next_request: 0,
            terminated: false,
            trace: Vec::new(),
            verbose,
        };
        sim.log(format!("plan {:?}", sim.plan));
        sim.log(format!("config {:?}", sim.cfg));
        sim.log(format!("faults {:?}", sim.faults));
        let all: Vec<TaskId> = sim.tasks.keys().copied().collect();
        for t in all {
            let d = sim.rng.range(1, 100);
            sim.schedule(
                d,
                Msg::Start {
                    task: t,
                    attempt: 0,
                },
            );
        }
        sim
    }

    fn log(&mut self, s: String) {
        if self.verbose {
            println!("{s}");
        }
        self.trace.push(s);
        if self.trace.len() > 400 {
            self.trace.drain(..200);
        }
    }

    fn schedule(&mut self, delay: u64, msg: Msg) {
        self.seq += 1;
        self.queue.push(Reverse((self.now + delay, self.seq)));
        self.msgs.insert(self.seq, msg);
    }

    fn delay(&mut self) -> u64 {
        let max = if self.faults_on {
            self.faults.max_delay
        } else {
            20
        };
        self.rng.range(1, max)
    }

    fn handle(&mut self, event: E) {
        let short = match &event {
            E::Acknowledge {
                checkpoint_id,
                task,
                attempt,
                ..
            } => {
                format!("Ack {checkpoint_id} {task}#{attempt}")
            }
            e => format!("{e:?}"),
        };
        let is_tick = matches!(event, E::Tick);
        let out = self.c.handle(self.now, event);
        if !is_tick || !out.is_empty() {
            self.log(format!("@{} {short} -> {out:?}", self.now));
        }
        let fail = out.iter().any(|a| matches!(a, A::FailJob { .. }));
        for a in out {
            self.on_action(a);
        }
        // A job about to fail may leave a checkpoint due.
        self.check(is_tick && !fail);
        // The shell fails the job once it has done the rest.
        if fail {
            self.restart_job("checkpoint failures");
        }
    }

    fn check(&mut self, after_tick: bool) {
        let max = self.cfg.effective_max_concurrent();
        let cps = self
            .c
            .pending()
            .filter(|p| !p.checkpoint_type.is_savepoint())
            .count();
        assert!(cps <= max, "{cps} checkpoints pending, max {max}");
        if self.terminated {
            return;
        }
        let latest = self.c.latest_completed().map(|c| c.checkpoint_id);
        assert_eq!(latest, self.completed.last().copied(), "recovery point");
        if let Some(l) = latest {
            assert!(!self.discarded.contains(&l), "the latest was discarded");
        }
        if after_tick && let Some(d) = self.c.next_deadline() {
            assert!(d > self.now, "deadline {d} not after now {}", self.now);
        }
    }

    fn check_checkpoint(&self, cp: &CompletedCheckpoint) {
        let exp = &self.expected[&cp.checkpoint_id];
        assert_eq!(cp.job_id, JOB);
        assert_eq!(cp.is_savepoint(), exp.savepoint);
        let mut per_task: BTreeMap<TaskId, Vec<String>> = BTreeMap::new();
        for (op, st) in &cp.operators {
            let v = self
                .plan
                .vertices
                .iter()
                .position(|vp| vp.operators.contains(op))
                .unwrap();
            for (s, sub) in &st.subtasks {
                let task = TaskId::new(v, *s as usize);
                assert!(exp.running.contains_key(&task), "{task} was not running");
                for h in &sub.handles {
                    per_task
                        .entry(task)
                        .or_default()
                        .push(h.path().unwrap().to_string());
                }
            }
            let vertex_finished = (0..self.plan.vertices[v].parallelism)
                .all(|s| !exp.running.contains_key(&TaskId::new(v, s)));
            assert_eq!(st.fully_finished, vertex_finished, "{op} fully finished");
        }
        for (task, attempt) in &exp.running {
            let paths = per_task.remove(task).unwrap_or_default();
            assert_eq!(
                paths,
                vec![path_of(cp.checkpoint_id, *task, *attempt)],
                "checkpoint {}: handles of {task}",
                cp.checkpoint_id
            );
        }
        assert!(per_task.is_empty(), "handles of other tasks: {per_task:?}");
    }

    fn on_action(&mut self, a: A) {
        match a {
            A::TriggerCheckpoint {
                checkpoint_id: id,
                checkpoint_type,
                tasks,
                ..
            } => {
                assert!(id > self.last_id, "id {id} after {}", self.last_id);
                self.last_id = id;
                let running: BTreeMap<TaskId, u32> = self
                    .tasks
                    .iter()
                    .filter(|(_, t)| t.life == Life::Running)
                    .map(|(&k, t)| (k, t.attempt))
                    .collect();
                assert!(self.tasks.values().all(|t| t.life != Life::Down));
                for t in &tasks {
                    assert_eq!(running.get(&t.task), Some(&t.attempt), "triggered {t:?}");
                }
                self.expected.insert(
                    id,
                    Expect {
                        running: running.clone(),
                        savepoint: checkpoint_type.is_savepoint(),
                    },
                );
                for (task, attempt) in running {
                    self.respond(id, task, attempt);
                }
            }
            A::WriteMetadata { checkpoint } => {
                self.check_checkpoint(&checkpoint);
                let id = checkpoint.checkpoint_id;
                let d = self.delay();
                let fail = self.faults_on && self.rng.chance(self.faults.metadata_fail_pm);
                let ev = if fail {
                    E::MetadataFailed {
                        checkpoint_id: id,
                        reason: "disk full".into(),
                    }
                } else {
                    E::MetadataWritten {
                        checkpoint_id: id,
                        path: Some(format!("/ckpt/chk-{id}")),
                    }
                };
                self.schedule(d, Msg::Deliver(ev.clone()));
                if self.faults_on && self.rng.chance(self.faults.duplicate_pm) {
                    let d = self.delay() * 3;
                    self.schedule(d, Msg::Deliver(ev));
                }
            }
            A::NotifyCheckpointComplete {
                checkpoint_id: id,
                tasks,
            } => {
                let exp = self.expected[&id].clone();
                let notified: BTreeMap<TaskId, u32> =
                    tasks.iter().map(|t| (t.task, t.attempt)).collect();
                assert_eq!(notified, exp.running, "notified of {id}");
                let cp = if exp.savepoint {
                    self.savepoints.insert(id);
                    self.c.latest_savepoint().unwrap().clone()
                } else {
                    assert!(self.completed.last().is_none_or(|&l| l < id));
                    self.completed.push(id);
                    self.c.latest_completed().unwrap().clone()
                };
                assert_eq!(cp.checkpoint_id, id);
                self.check_checkpoint(&cp);
                let paths = cp
                    .handles()
                    .filter_map(|h| h.path().map(String::from))
                    .collect();
                self.live_paths.insert(id, paths);
            }
            A::DiscardCheckpoint {
                checkpoint_id: id,
                handles,
                ..
            } => {
                assert!(
                    self.completed.contains(&id),
                    "discarding {id}, never completed"
                );
                assert!(!self.savepoints.contains(&id), "discarding savepoint {id}");
                assert!(self.discarded.insert(id), "{id} discarded twice");
                let latest = self.c.latest_completed().map(|c| c.checkpoint_id);
                assert!(
                    self.terminated || latest != Some(id),
                    "discarding the latest {id}"
                );
                let live = self.live_paths.remove(&id).unwrap();
                let got: BTreeSet<String> = handles
                    .iter()
                    .filter_map(|h| h.path().map(String::from))
                    .collect();
                assert_eq!(got, live);
            }
            A::DiscardState { handles, .. } => {
                for h in handles {
                    let p = h.path().unwrap();
                    for (id, live) in &self.live_paths {
                        assert!(!live.contains(p), "discarding {p} of live checkpoint {id}");
                    }
                }
            }
            A::SavepointCompleted { request_id, .. } | A::SavepointFailed { request_id, .. } => {
                assert!(
                    self.requests_open.remove(&request_id),
                    "{request_id} unknown"
                );
                assert!(
                    self.requests_answered.insert(request_id.clone()),
                    "{request_id} twice"
                );
            }
            A::FailJob { .. } => {
                assert!(self.cfg.tolerable() < 1_000, "failed with huge tolerance");
            }
            A::NotifyCheckpointAborted { .. } | A::DiscardMetadata { .. } => {}
        }
    }

    /// The task's answer to checkpoint `id`: ack, decline, or nothing.
    fn respond(&mut self, id: u64, task: TaskId, attempt: u32) {
        let f = self.faults;
        let on = self.faults_on;
        if on && self.rng.chance(f.drop_pm) {
            return;
        }
        let d = self.delay();
        if on && self.rng.chance(f.decline_pm) {
            let reason = if self.rng.chance(500) {
                CheckpointFailureReason::CheckpointDeclined
            } else {
                CheckpointFailureReason::CheckpointDeclinedTaskNotReady
            };
            let ev = E::Decline {
                checkpoint_id: id,
                task,
                attempt,
                reason,
                message: "sim".into(),
            };
            self.schedule(d, Msg::Deliver(ev));
            return;
        }
        let v = &self.plan.vertices[task.vertex];
        let handle = StateHandle {
            kind: StateKind::ManagedKeyed,
            location: StateLocation::File {
                path: path_of(id, task, attempt),
            },
            key_groups: None,
            key_group_offsets: vec![],
            state_size: self.rng.range(0, 1_000),
        };
        let state = TaskStateSnapshot {
            operators: BTreeMap::from([(
                v.operators[0].clone(),
                OperatorSubtaskState {
                    handles: vec![handle],
                },
            )]),
            metrics: SubtaskCheckpointMetrics {
                checkpointed_size: self.rng.range(0, 500),
                ..SubtaskCheckpointMetrics::default()
            },
        };
        let ev = E::Acknowledge {
            checkpoint_id: id,
            task,
            attempt,
            state,
        };
        self.schedule(d, Msg::Deliver(ev.clone()));
        if on && self.rng.chance(f.duplicate_pm) {
            let d2 = self.rng.range(1, 4 * f.max_delay + 1_000);
            self.schedule(d2, Msg::Deliver(ev));
        }
    }

    fn fail_task(&mut self, task: TaskId) {
        let t = self.tasks[&task];
        let next = t.attempt + 1;
        self.tasks.insert(
            task,
            SimTask {
                attempt: next,
                life: Life::Down,
            },
        );
        self.handle(E::TaskFailed {
            task,
            attempt: t.attempt,
            reason: "sim".into(),
        });
    }

    fn restart_job(&mut self, reason: &str) {
        self.handle(E::JobRestarting {
            reason: reason.into(),
        });
        let restored = self.c.restore_latest(self.now).map(|c| c.checkpoint_id);
        assert_eq!(restored, self.completed.last().copied(), "restored from");
        let all: Vec<TaskId> = self.tasks.keys().copied().collect();
        for t in all {
            let next = self.tasks[&t].attempt + 1;
            self.tasks.insert(
                t,
                SimTask {
                    attempt: next,
                    life: Life::Down,
                },
            );
            let d = self.rng.range(10, 200);
            self.schedule(
                d,
                Msg::Start {
                    task: t,
                    attempt: next,
                },
            );
        }
    }

    fn running(&self) -> Vec<TaskId> {
        self.tasks
            .iter()
            .filter(|(_, t)| t.life == Life::Running)
            .map(|(&k, _)| k)
            .collect()
    }

    fn inject(&mut self) {
        let f = self.faults;
        let running = self.running();
        if !running.is_empty() && self.rng.chance(f.task_fail_pm) {
            let t = running[self.rng.below(running.len() as u64) as usize];
            self.fail_task(t);
            let attempt = self.tasks[&t].attempt;
            let d = self.rng.range(10, 300);
            self.schedule(d, Msg::Start { task: t, attempt });
        }
        let running = self.running();
        if !running.is_empty() && self.rng.chance(f.tm_loss_pm) {
            let n = self.rng.range(1, 3);
            for _ in 0..n {
                let t = running[self.rng.below(running.len() as u64) as usize];
                if self.tasks[&t].life == Life::Running {
                    self.fail_task(t);
                }
            }
            self.restart_job("TaskManager lost");
        }
        // A running task whose upstream all finished may finish.
        if self.rng.chance(f.finish_pm) {
            let candidates: Vec<TaskId> = self
                .running()
                .into_iter()
                .filter(|t| {
                    self.plan.vertices[t.vertex].inputs.iter().all(|&u| {
                        (0..self.plan.vertices[u].parallelism)
                            .all(|s| self.tasks[&TaskId::new(u, s)].life == Life::Finished)
                    })
                })
                .collect();
            if !candidates.is_empty() {
                let t = candidates[self.rng.below(candidates.len() as u64) as usize];
                let attempt = self.tasks[&t].attempt;
                self.tasks.insert(
                    t,
                    SimTask {
                        attempt,
                        life: Life::Finished,
                    },
                );
                self.handle(E::TaskFinished { task: t, attempt });
            }
        }
        if self.rng.chance(f.savepoint_pm) {
            self.next_request += 1;
            let request_id = format!("sp-{}", self.next_request);
            self.requests_open.insert(request_id.clone());
            let kind = if self.rng.chance(200) {
                SavepointKind::Suspend
            } else {
                SavepointKind::Savepoint
            };
            let target_dir = if self.rng.chance(500) {
                Some("/target".into())
            } else {
                None
            };
            self.handle(E::TriggerSavepoint {
                request_id,
                target_dir,
                kind,
            });
        }
    }

    fn deliver(&mut self, msg: Msg) {
        match msg {
            Msg::Deliver(ev) => self.handle(ev),
            Msg::Start { task, attempt } => {
                let t = self.tasks[&task];
                if t.attempt == attempt && t.life == Life::Down {
                    self.tasks.insert(
                        task,
                        SimTask {
                            attempt,
                            life: Life::Running,
                        },
                    );
                    self.handle(E::TaskRunning { task, attempt });
                }
            }
        }
    }

    fn run(&mut self) {
        let mut next_tick = 0;
        let end = FAULT_PHASE + SETTLE;
        let mut settle_from_id = None;
        while self.now < end {
            let next_msg = self.queue.peek().map(|Reverse((t, _))| *t);
            if let Some(t) = next_msg
                && t <= next_tick
            {
                let Reverse((t, seq)) = self.queue.pop().unwrap();
                self.now = t;
                let msg = self.msgs.remove(&seq).unwrap();
                self.deliver(msg);
                continue;
            }
            self.now = next_tick;
            next_tick += TICK;
            if self.faults_on && self.now >= FAULT_PHASE {
                self.faults_on = false;
                self.log(format!("@{} faults stop", self.now));
            }
            if self.faults_on {
                self.inject();
            }
            self.handle(E::Tick);
            // Liveness: once every task is back, a fresh checkpoint
            // completes.
            if !self.faults_on
                && settle_from_id.is_none()
                && self.tasks.values().all(|t| t.life != Life::Down)
            {
                settle_from_id = Some(self.last_id);
            }
        }
        let any_running = self.tasks.values().any(|t| t.life == Life::Running);
        if any_running {
            let from = settle_from_id.expect("tasks never came back");
            assert!(
                self.completed.last().is_some_and(|&l| l > from),
                "no checkpoint after {from} completed once faults stopped"
            );
        }
        // Exactly the checkpoints beyond num-retained were discarded.
        let keep = self.cfg.num_retained.min(self.completed.len());
        let expect: BTreeSet<u64> = self.completed[..self.completed.len() - keep]
            .iter()
            .copied()
            .collect();
        assert_eq!(self.discarded, expect, "discarded");
        assert!(
            self.requests_open.is_empty() || self.c.num_pending() > 0,
            "unanswered savepoints"
        );
        // The end of the job discards what the retention says (everything,
        // by default).
        self.terminated = true;
        self.handle(E::JobTerminated {
            status: fluvia_scheduler::checkpoint::TerminalJobStatus::Cancelled,
        });
        assert!(
            self.requests_open.is_empty(),
            "unanswered savepoints: {:?}",
            self.requests_open
        );
        assert_eq!(self.c.num_pending(), 0);
        let all: BTreeSet<u64> = self.completed.iter().copied().collect();
        assert_eq!(self.discarded, all, "discarded when the job ended");
    }
}

fn run_seed(seed: u64, verbose: bool) -> Result<(), (String, Vec<String>)> {
    let mut sim = None;
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut s = Sim::new(seed, verbose);
        let r = catch_unwind(AssertUnwindSafe(|| s.run()));
        sim = Some(std::mem::take(&mut s.trace));
        if let Err(e) = r {
            std::panic::resume_unwind(e);
        }
    }));
    r.map_err(|e| (panic_message(&*e), sim.unwrap_or_default()))
}

#[test]
fn checkpoint_coordinator_under_faults() {
    if let Some(seed) = env_u64("FLUVIA_CKPT_SIM_SEED") {
        if let Err((msg, _)) = run_seed(seed, true) {
            panic!("seed {seed} failed: {msg}");
        }
        return;
    }
    let seeds = env_u64("FLUVIA_CKPT_SIM_SEEDS").unwrap_or(300);
    let mut failed = Vec::new();
    // Failing seeds are reported below, with their trace.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for seed in 0..seeds {
        if let Err((msg, trace)) = run_seed(seed, false) {
            failed.push((seed, msg, trace));
            if failed.len() >= 3 {
                break;
            }
        }
    }
    std::panic::set_hook(hook);
    if let Some((seed, msg, trace)) = failed.first() {
        for line in trace.iter().rev().take(60).rev() {
            eprintln!("{line}");
        }
        let seeds: Vec<u64> = failed.iter().map(|f| f.0).collect();
        panic!(
            "seeds {seeds:?} failed; first, seed {seed}: {msg}\nreplay: \
             FLUVIA_CKPT_SIM_SEED={seed} cargo test -p fluvia-scheduler --test \
             checkpoint_simulation -- --nocapture"
        );
    }
}

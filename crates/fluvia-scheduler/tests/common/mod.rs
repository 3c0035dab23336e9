//! What the scheduler's integration tests share: small batch JobGraphs and a
//! driver that plays the JobManager around a [`Scheduler`].

#![allow(dead_code, clippy::unwrap_used)]

use fluvia_core::{Configuration, ExchangeMode, JobId, PartitionerKind};
use fluvia_graph::{JobGraph, JobGraphGenerator, StreamGraphBuilder, StreamNodeId};
use fluvia_scheduler::{
    Action, AttemptMetrics, Event, ExecutionState, Scheduler, SchedulerConfig,
    TaskDeploymentDescriptor, TaskManagerSpec,
};
use std::sync::Arc;
use std::time::Duration;

/// One operator: name, parallelism (None: left to the scheduler), max
/// parallelism.
pub struct Op(pub &'static str, pub Option<usize>, pub Option<usize>);

/// A JobGraph `job` with one vertex per name in `names` (chaining off),
/// vertex `k` named `names[k]` and set up by `configure(builder, id, k)`;
/// `edges` are (from, to, partitioner). Vertex 0 is the only source, bounded
/// (a batch job) or not (a streaming job).
pub fn job_graph(
    job: &str,
    bounded: bool,
    names: &[&'static str],
    mut configure: impl FnMut(&mut StreamGraphBuilder, StreamNodeId, usize),
    edges: &[(usize, usize, PartitionerKind)],
    conf: Configuration,
) -> JobGraph {
    let mut b = StreamGraphBuilder::new(job);
    b.chaining_enabled = false;
    let mut ids = Vec::new();
    for (k, name) in names.iter().enumerate() {
        let id = if k == 0 {
            b.add_source(*name, bounded)
        } else {
            b.add_operator(*name, 1)
        };
        configure(&mut b, id, k);
        ids.push(id);
    }
    for &(from, to, part) in edges {
        b.add_edge(ids[from], ids[to], Some(part), ExchangeMode::Undefined, 0);
    }
    let jg = JobGraphGenerator::new(&b.build().unwrap())
        .create_job_graph(conf, false)
        .unwrap();
    // The tests address vertices by their position in `names`.
    for (k, name) in names.iter().enumerate() {
        assert_eq!(jg.vertices[k].name, *name);
    }
    jg
}

/// A batch JobGraph, one vertex per operator (chaining off), vertex 0 the
/// only source.
pub fn graph(
    ops: &[Op],
    edges: &[(usize, usize, PartitionerKind)],
    conf: Configuration,
) -> JobGraph {
    let names: Vec<&'static str> = ops.iter().map(|op| op.0).collect();
    let configure = |b: &mut StreamGraphBuilder, id, k: usize| {
        let Op(_, p, max) = &ops[k];
        if let Some(p) = p {
            b.set_parallelism(id, *p);
        }
        if let Some(m) = max {
            b.set_max_parallelism(id, *m);
        }
    };
    job_graph("adaptive-job", true, &names, configure, edges, conf)
}

/// Registers one TaskManager, submits, and plays every deployment through
/// to FINISHED with the metrics `report` gives it.
pub struct Driver {
    pub s: Scheduler,
    pub job: JobId,
    pub now: Duration,
    pub deployed: Vec<TaskDeploymentDescriptor>,
}

impl Driver {
    pub fn start(jg: JobGraph, slots: usize) -> Self {
        Self::start_on(jg, &[slots], SchedulerConfig::default())
    }

    /// One TaskManager `tm-<k+1>` per entry of `slots`.
    pub fn start_on(jg: JobGraph, slots: &[usize], config: SchedulerConfig) -> Self {
        let mut s = Scheduler::new(config);
        for (k, &n) in slots.iter().enumerate() {
            s.handle(
                Duration::ZERO,
                Event::RegisterTaskManager(TaskManagerSpec {
                    id: format!("tm-{}", k + 1),
                    slots: n,
                    fingerprint: "fp".into(),
                    data_address: format!("tm-{}:6121", k + 1),
                }),
            )
            .unwrap();
        }
        let job = JobId(7);
        s.handle(
            Duration::ZERO,
            Event::SubmitJob {
                job,
                graph: Arc::new(jg),
                program: "p".into(),
                fingerprint: "fp".into(),
            },
        )
        .unwrap();
        let mut d = Driver {
            s,
            job,
            now: Duration::ZERO,
            deployed: Vec::new(),
        };
        d.collect();
        d
    }

    pub fn collect(&mut self) -> Vec<TaskDeploymentDescriptor> {
        let new: Vec<TaskDeploymentDescriptor> = self
            .s
            .drain_actions()
            .into_iter()
            .filter_map(|a| match a {
                Action::Deploy(d) => Some(*d),
                _ => None,
            })
            .collect();
        self.deployed.extend(new.iter().cloned());
        new
    }

    pub fn event(&mut self, e: Event) {
        self.now += Duration::from_millis(10);
        self.s.handle(self.now, e).unwrap();
    }

    /// Moves the clock by `d` and ticks.
    pub fn advance(&mut self, d: Duration) {
        self.now += d;
        self.s.handle(self.now, Event::Tick).unwrap();
    }

    /// Acknowledges `d` and reports it RUNNING.
    pub fn run(&mut self, d: &TaskDeploymentDescriptor) {
        self.event(Event::DeployAcknowledged { attempt: d.attempt });
        self.report(d, ExecutionState::Running, None);
    }

    pub fn report(
        &mut self,
        d: &TaskDeploymentDescriptor,
        state: ExecutionState,
        failure: Option<&str>,
    ) {
        self.event(Event::AttemptState {
            attempt: d.attempt,
            state,
            failure: failure.map(str::to_string),
            metrics: None,
        });
    }

    /// Acknowledges and finishes `d` with per-output subpartition bytes.
    /// Checks that each of `producers` writes `subpartitions` subpartitions
    /// (of its first output), finishes each with `bytes`, and returns what
    /// was deployed then.
    pub fn finish_all(
        &mut self,
        producers: &[TaskDeploymentDescriptor],
        subpartitions: usize,
        bytes: Vec<Vec<u64>>,
    ) -> Vec<TaskDeploymentDescriptor> {
        for p in producers {
            assert_eq!(p.outputs[0].num_subpartitions, subpartitions);
            self.finish(p, bytes.clone());
        }
        self.collect()
    }

    pub fn finish(&mut self, d: &TaskDeploymentDescriptor, subpartition_bytes: Vec<Vec<u64>>) {
        self.event(Event::DeployAcknowledged { attempt: d.attempt });
        self.event(Event::AttemptState {
            attempt: d.attempt,
            state: ExecutionState::Finished,
            failure: None,
            metrics: Some(AttemptMetrics {
                subpartition_bytes,
                ..AttemptMetrics::default()
            }),
        });
    }

    pub fn vertex(&self, v: usize) -> &fluvia_scheduler::ExecutionJobVertex {
        &self.s.job(self.job).unwrap().eg.vertices[v]
    }
}

pub fn conf(pairs: &[(&str, &str)]) -> Configuration {
    let mut c = Configuration::new();
    for (k, v) in pairs {
        c.set(*k, *v);
    }
    c
}

/// A test's setting from the environment (seeds to run, a seed to replay).
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The message of a panic's payload (`panic!` with a `String` or a `&str`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

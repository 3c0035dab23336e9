//! What the REST API and the CLI show of jobs, in the shapes of Flink's REST
//! API (`JobDetailsInfo`, `JobVertexDetailsInfo`,
//! `SubtaskExecutionAttemptDetailsInfo`, `IOMetricsInfo`,
//! `JobExceptionsInfoWithHistory`, `JobVertexBackPressureInfo`), field names
//! and units as Flink's, with Fluvia's own data in extra fields beside them.
//!
//! Metrics of attempts that ended are what they reported; those of running
//! attempts come from the TaskManagers' latest reports (at most
//! `metrics.fetcher.update-interval` old). It reads scheduler and
//! JobManager state only; it knows nothing of HTTP.

use crate::query::{ClusterView, JobMeta};
use fluvia_graph::JobGraph;
use fluvia_scheduler::{Execution, ExecutionState, Job, JobState};
use serde_json::{Map, Value, json};
use std::collections::HashMap;

/// A running attempt's live numbers, by (vertex, subtask, attempt).
type Live = HashMap<(usize, usize, u32), Value>;

/// Everything the views of one job need.
pub(crate) struct View<'a> {
    pub st: &'a ClusterView<'a>,
    pub meta: &'a JobMeta,
    pub job: &'a Job,
    /// Wall clock now, epoch ms.
    pub now: u64,
    /// The scheduler clock now, ms.
    pub clock: u64,
    live: Live,
}

/// The metrics of one attempt, as Flink's IOMetricsInfo plus rates.
#[derive(Default, Clone, Copy)]
struct Io {
    records_in: u64,
    records_out: u64,
    bytes_in: u64,
    bytes_out: u64,
    busy: f64,
    back_pressured: f64,
    idle: f64,
    /// Whether the numbers exist (reported at the end, or live).
    known: bool,
}

impl<'a> View<'a> {
    /// The views of `job` as of the cluster view's clocks.
    pub fn new(st: &'a ClusterView<'a>, meta: &'a JobMeta, job: &'a Job) -> Self {
        let (now, clock) = (st.now, st.clock);
        let mut live = Live::new();
        let jid = meta.id.as_str();
        for t in st.task_managers.values() {
            let Ok(tasks) = serde_json::from_str::<Vec<Value>>(&t.metrics_json) else {
                continue;
            };
            for v in tasks {
                if v["job_id"].as_str() != Some(jid) {
                    continue;
                }
                let key = (
                    v["vertex"].as_u64().unwrap_or(0) as usize,
                    v["subtask"].as_u64().unwrap_or(0) as usize,
                    v["attempt"].as_u64().unwrap_or(0) as u32,
                );
                live.insert(key, v);
            }
        }
        View {
            st,
            meta,
            job,
            now,
            clock,
            live,
        }
    }

    fn graph(&self) -> &JobGraph {
        &self.job.graph
    }

    /// Scheduler-clock ms → epoch ms (-1 when unset).
    fn wall(&self, t: Option<u64>) -> i64 {
        let origin = self.now.saturating_sub(self.clock);
        t.map_or(-1, |t| (origin + t) as i64)
    }

    fn io(&self, v: usize, i: usize, a: &Execution) -> Io {
        if let Some(m) = &a.metrics {
            return Io {
                records_in: m.records_in,
                records_out: m.records_out,
                bytes_in: m.bytes_in,
                bytes_out: m.bytes_out,
                busy: m.busy_ms_per_second,
                back_pressured: m.back_pressured_ms_per_second,
                idle: m.idle_ms_per_second,
                known: true,
            };
        }
        // Running, or ended without a report (lost with its TaskManager):
        // its latest live numbers.
        match self.live.get(&(v, i, a.attempt_number)) {
            Some(l) => Io {
                records_in: l["records_in"].as_u64().unwrap_or(0),
                records_out: l["records_out"].as_u64().unwrap_or(0),
                bytes_in: l["bytes_in"].as_u64().unwrap_or(0),
                bytes_out: l["bytes_out"].as_u64().unwrap_or(0),
                busy: l["busy_ms_per_second"].as_f64().unwrap_or(0.0),
                back_pressured: l["back_pressured_ms_per_second"].as_f64().unwrap_or(0.0),
                idle: l["idle_ms_per_second"].as_f64().unwrap_or(0.0),
                known: true,
            },
            _ => Io::default(),
        }
    }

    fn host(&self, tm: &Option<String>) -> String {
        tm.as_ref()
            .and_then(|t| self.st.tm_addresses.get(t))
            .cloned()
            .unwrap_or_default()
    }

    fn attempt_window(&self, a: &Execution) -> (Option<u64>, Option<u64>) {
        let start = a.timestamp(ExecutionState::Deploying);
        let end = [
            ExecutionState::Finished,
            ExecutionState::Failed,
            ExecutionState::Canceled,
        ]
        .iter()
        .find_map(|s| a.timestamp(*s))
        .filter(|_| a.state.is_terminal());
        (start, end)
    }

    /// One attempt as Flink's SubtaskExecutionAttemptDetailsInfo.
    fn attempt_json(&self, v: usize, i: usize, a: &Execution, with_others: bool) -> Value {
        let (start, end) = self.attempt_window(a);
        let duration = match (start, end) {
            (Some(s), Some(e)) => e.saturating_sub(s) as i64,
            (Some(s), None) => self.clock.saturating_sub(s) as i64,
            _ => -1,
        };
        let io = self.io(v, i, a);
        // The TaskManager's address (host:port), so two TaskManagers of
        // one host stay apart.
        let host = self.host(&a.task_manager);
        let endpoint = if host.is_empty() {
            "(unassigned)".to_string()
        } else {
            host.clone()
        };
        // Time spent in each state up to the next one (or now).
        let mut status_duration = Map::new();
        let entered: Vec<(ExecutionState, u64)> = ExecutionState::ALL
            .iter()
            .filter_map(|s| a.timestamp(*s).map(|t| (*s, t)))
            .collect();
        for s in [
            ExecutionState::Created,
            ExecutionState::Scheduled,
            ExecutionState::Deploying,
            ExecutionState::Initializing,
            ExecutionState::Running,
        ] {
            let value = match entered.iter().position(|(e, _)| *e == s) {
                None => -1,
                Some(k) => {
                    let from = entered[k].1;
                    let to = entered.get(k + 1).map_or(self.clock, |(_, t)| *t);
                    to.saturating_sub(from) as i64
                }
            };
            status_duration.insert(s.name().to_string(), json!(value));
        }
        let timestamps: Map<String, Value> = entered
            .iter()
            .map(|(s, t)| (s.name().to_string(), json!(self.wall(Some(*t)))))
            .collect();
        let mut out = json!({
            "subtask": i,
            "status": a.state.name(),
            "attempt": a.attempt_number,
            "attempt-number": a.attempt_number,
            "endpoint": endpoint,
            "host": host,
            "start-time": self.wall(start),
            "start_time": self.wall(start),
            "end-time": self.wall(end),
            "duration": duration,
            "taskmanager-id": a.task_manager.clone().unwrap_or_else(|| "(unassigned)".into()),
            "metrics": io_metrics(&io),
            "status-duration": status_duration,
            "busy-ms-per-second": io.busy,
            "back-pressured-ms-per-second": io.back_pressured,
            "idle-ms-per-second": io.idle,
            "speculative": self.job.speculative_attempts.contains(&(v, i, a.attempt_number)),
            "failure-cause": a.failure_cause,
            "timestamps": timestamps,
        });
        if with_others {
            let s = &self.job.eg.vertices[v].subtasks[i];
            let others: Vec<Value> = s
                .attempts
                .iter()
                .filter(|o| o.attempt_number != a.attempt_number)
                .filter(|o| {
                    (!o.state.is_terminal() && !a.state.is_terminal())
                        || overlaps(self.attempt_window(a), self.attempt_window(o))
                })
                .map(|o| self.attempt_json(v, i, o, false))
                .collect();
            out["other-concurrent-attempts"] = json!(others);
        }
        out
    }

    /// A subtask: the attempt Flink shows (the winner, else the newest)
    /// with its concurrent twins, and every attempt (Fluvia's `attempts`).
    fn subtask_json(&self, v: usize, i: usize) -> Value {
        let s = &self.job.eg.vertices[v].subtasks[i];
        let shown = shown(s);
        let mut out = self.attempt_json(v, i, shown, true);
        out["status"] = json!(s.state().name());
        let m = shown.metrics.clone().unwrap_or_default();
        out["operator-records"] = json!(m.operator_records);
        out["subpartition-bytes"] = json!(m.subpartition_bytes);
        out["attempts"] = json!(
            s.attempts
                .iter()
                .map(|a| self.attempt_json(v, i, a, false))
                .collect::<Vec<_>>()
        );
        out
    }

    fn shown_io(&self, v: usize) -> Vec<Io> {
        self.job.eg.vertices[v]
            .subtasks
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let shown = shown(s);
                self.io(v, i, shown)
            })
            .collect()
    }

    fn vertex_status(&self, v: usize) -> &'static str {
        let ejv = &self.job.eg.vertices[v];
        let states: Vec<ExecutionState> = ejv.subtasks.iter().map(|s| s.state()).collect();
        if !ejv.initialized {
            return match self.job.state {
                JobState::Failed | JobState::Canceled => "CANCELED",
                _ => "CREATED",
            };
        }
        let any = |x: ExecutionState| states.contains(&x);
        if any(ExecutionState::Failed) {
            "FAILED"
        } else if any(ExecutionState::Canceling) {
            "CANCELING"
        } else if any(ExecutionState::Canceled) {
            "CANCELED"
        } else if states.iter().all(|s| *s == ExecutionState::Finished) {
            "FINISHED"
        } else if any(ExecutionState::Running) || any(ExecutionState::Finished) {
            "RUNNING"
        } else if any(ExecutionState::Initializing) {
            "INITIALIZING"
        } else if any(ExecutionState::Deploying) {
            "DEPLOYING"
        } else if any(ExecutionState::Scheduled) {
            "SCHEDULED"
        } else {
            "CREATED"
        }
    }

    /// A vertex as in Flink's `/jobs/:id` `vertices[]`, with its subtasks
    /// (Fluvia's) beside.
    pub fn vertex_json(&self, v: usize, with_subtasks: bool) -> Value {
        let jv = &self.graph().vertices[v];
        let ejv = &self.job.eg.vertices[v];
        let ios = self.shown_io(v);
        let mut tasks = Map::new();
        for s in ExecutionState::ALL {
            let n = ejv.subtasks.iter().filter(|x| x.state() == s).count();
            tasks.insert(s.name().to_string(), json!(n));
        }
        tasks.insert("RECONCILING".into(), json!(0));
        let windows: Vec<(Option<u64>, Option<u64>)> = ejv
            .subtasks
            .iter()
            .map(|s| self.attempt_window(shown(s)))
            .collect();
        let start = windows.iter().filter_map(|w| w.0).min();
        let all_ended =
            !ejv.subtasks.is_empty() && ejv.subtasks.iter().all(|s| s.state().is_terminal());
        let end = all_ended
            .then(|| windows.iter().filter_map(|w| w.1).max())
            .flatten();
        let duration = match (start, end) {
            (Some(s), Some(e)) => e.saturating_sub(s) as i64,
            (Some(s), None) => self.clock.saturating_sub(s) as i64,
            _ => -1,
        };
        let total = ios.iter().fold(Io::default(), |a, b| Io {
            records_in: a.records_in + b.records_in,
            records_out: a.records_out + b.records_out,
            bytes_in: a.bytes_in + b.bytes_in,
            bytes_out: a.bytes_out + b.bytes_out,
            busy: a.busy.max(b.busy),
            back_pressured: a.back_pressured.max(b.back_pressured),
            idle: a.idle.max(b.idle),
            known: a.known || b.known,
        });
        let complete = !ios.is_empty() && ios.iter().all(|i| i.known);
        let mut metrics = io_metrics(&total);
        for k in [
            "read-bytes-complete",
            "write-bytes-complete",
            "read-records-complete",
            "write-records-complete",
        ] {
            metrics[k] = json!(complete);
        }
        let mut out = json!({
            "id": jv.id.to_string(),
            "name": jv.name,
            // Flink shows a parallelism the adaptive batch scheduler has
            // not decided yet as -1.
            "parallelism": if ejv.parallelism_decided { ejv.parallelism as i64 } else { -1 },
            "maxParallelism": jv.max_parallelism,
            "parallelism-decided": ejv.parallelism_decided,
            "status": self.vertex_status(v),
            "start-time": self.wall(start),
            "end-time": self.wall(end),
            "duration": duration,
            "tasks": tasks,
            "metrics": metrics,
            "busy-ms-per-second": total.busy,
            "back-pressured-ms-per-second": total.back_pressured,
            "idle-ms-per-second": total.idle,
            // A join side every subtask read whole, decided at runtime.
            "adaptive-broadcast-input": self
                .job
                .adaptive_broadcasts
                .iter()
                .find(|(u, _)| *u == v)
                .map(|(_, input)| *input),
            // Skewed subpartitions shared out among subtasks.
            "skew-splits": self
                .job
                .skew_splits
                .iter()
                .filter(|(u, _)| *u == v)
                .flat_map(|(_, splits)| splits.iter())
                .map(|sp| json!({
                    "subpartition": sp.subpartition,
                    "input": sp.input,
                    "pieces": sp.pieces,
                }))
                .collect::<Vec<_>>(),
        });
        if with_subtasks {
            out["subtasks"] = json!(
                (0..ejv.subtasks.len())
                    .map(|i| self.subtask_json(v, i))
                    .collect::<Vec<_>>()
            );
        }
        out
    }

    /// Records and bytes the producer of input `e` of vertex `v` wrote
    /// into that edge's data set.
    fn edge_io(&self, producer: usize, data_set: usize) -> (u64, u64) {
        let ejv = &self.job.eg.vertices[producer];
        let single = self.graph().vertices[producer].produced_data_sets.len() == 1;
        let mut records = 0;
        let mut bytes = 0;
        for (i, s) in ejv.subtasks.iter().enumerate() {
            let shown = shown(s);
            match &shown.metrics {
                Some(m) => {
                    bytes += m
                        .subpartition_bytes
                        .get(data_set)
                        .map_or(0, |p| p.iter().sum::<u64>());
                    records += m
                        .subpartition_records
                        .get(data_set)
                        .map_or(0, |p| p.iter().sum::<u64>());
                }
                // Running: its live output, when it has one data set.
                None if single => {
                    let io = self.io(producer, i, shown);
                    bytes += io.bytes_out;
                    records += io.records_out;
                }
                None => {}
            }
        }
        (records, bytes)
    }

    /// Flink's `/jobs/:id/plan` `plan`, each node with its chained members
    /// (and a SQL task's multiple-input members) and each input with the
    /// records and bytes that crossed it.
    pub fn plan_json(&self) -> Value {
        let g = self.graph();
        let nodes: Vec<Value> = g
            .vertices
            .iter()
            .enumerate()
            .map(|(v, jv)| {
                let ejv = &self.job.eg.vertices[v];
                let inputs: Vec<Value> = jv
                    .inputs
                    .iter()
                    .enumerate()
                    .map(|(num, e)| {
                        let producer = g.vertex_index(e.source_vertex);
                        let (records, bytes) = producer
                            .and_then(|p| {
                                let ds = g.vertices[p]
                                    .produced_data_sets
                                    .iter()
                                    .position(|d| d.id == e.source_data_set)?;
                                Some(self.edge_io(p, ds))
                            })
                            .unwrap_or((0, 0));
                        json!({
                            "num": num,
                            "id": e.source_vertex.to_string(),
                            "ship_strategy": e.ship_strategy_name(),
                            "exchange": e.result_partition_type.name(),
                            "records": records,
                            "bytes": bytes,
                        })
                    })
                    .collect();
                let members: Vec<String> = jv.operators.iter().map(|o| o.name.clone()).collect();
                let mut node = json!({
                    "id": jv.id.to_string(),
                    "parallelism": if ejv.parallelism_decided { ejv.parallelism as i64 } else { -1 },
                    "operator": jv.head().name,
                    "operator_strategy": if jv.operators.len() > 1 {
                        format!("chain of {} operators", jv.operators.len())
                    } else {
                        "single operator".to_string()
                    },
                    "description": jv.name,
                    "members": members,
                    "multiple-input": jv.operators.iter().find_map(|o| multiple_input(&o.name)),
                    "optimizer_properties": {},
                });
                // Flink's sources have no `inputs` key.
                if !inputs.is_empty() {
                    node["inputs"] = json!(inputs);
                }
                node
            })
            .collect();
        json!({
            "jid": self.meta.id,
            "name": g.name,
            "type": g.job_type.name(),
            "nodes": nodes,
        })
    }

    /// Flink's JobDetailsInfo (`GET /jobs/:id`).
    pub fn job_json(&self) -> Value {
        let job = self.job;
        let meta = self.meta;
        let vertices: Vec<Value> = (0..job.graph.vertices.len())
            .map(|v| self.vertex_json(v, true))
            .collect();
        let mut status_counts = Map::new();
        for s in ExecutionState::ALL {
            let n = vertices.iter().filter(|v| v["status"] == s.name()).count();
            status_counts.insert(s.name().to_string(), json!(n));
        }
        status_counts.insert("RECONCILING".into(), json!(0));
        let mut timestamps = Map::new();
        for s in [
            "INITIALIZING",
            "CREATED",
            "RUNNING",
            "FAILING",
            "FAILED",
            "CANCELLING",
            "CANCELED",
            "FINISHED",
            "RESTARTING",
            "SUSPENDED",
            "RECONCILING",
        ] {
            let t = match s {
                "INITIALIZING" | "CREATED" | "RUNNING" => meta.start_time,
                _ if s == job.state.name() => meta.end_time.unwrap_or(0),
                _ => 0,
            };
            timestamps.insert(s.into(), json!(t));
        }
        json!({
            "jid": meta.id,
            "name": job.graph.name,
            "isStoppable": false,
            "state": job.state.name(),
            "job-type": job.graph.job_type.name(),
            "type": job.graph.job_type.name(),
            "start-time": meta.start_time,
            "end-time": meta.end_time.map_or(-1, |t| t as i64),
            "duration": meta.end_time.unwrap_or(self.now).saturating_sub(meta.start_time),
            "maxParallelism": -1,
            "now": self.now,
            "timestamps": timestamps,
            "status-counts": status_counts,
            "restarts": job.restarts,
            "error": job.failure_cause,
            "shuffle-service-type": job.shuffle_service_type.name(),
            "speculative": job.speculative.is_some(),
            "numSlowExecutionVertices": job.num_slow_execution_vertices,
            "numEffectiveSpeculativeExecutions": job.num_effective_speculative_executions,
            "checkpoints": self.st.checkpoints.statistics(job.id).map(|s| json!({
                "completed": s.counts.completed,
                "failed": s.counts.failed,
                "restored": s.counts.restored,
                "latest": s.latest.completed.as_ref().map(|c| json!({
                    "id": c.id,
                    "end_to_end_duration": c.end_to_end_duration,
                    "state_size": c.state_size,
                })),
            })),
            "vertices": vertices,
            "plan": self.plan_json(),
        })
    }

    /// A line of Flink's `/jobs/overview`.
    pub fn overview_json(&self) -> Value {
        let mut tasks = Map::new();
        let mut total = 0;
        let mut last = self.meta.start_time;
        for ejv in &self.job.eg.vertices {
            for s in &ejv.subtasks {
                total += 1;
                let state = s.state().name().to_ascii_lowercase();
                let n = tasks.get(&state).and_then(Value::as_u64).unwrap_or(0);
                tasks.insert(state, json!(n + 1));
                let a = shown(s);
                let newest = a.state_timestamps.iter().flatten().max().copied();
                last = last.max(self.wall(newest).max(0) as u64);
            }
        }
        for s in ExecutionState::ALL {
            tasks
                .entry(s.name().to_ascii_lowercase())
                .or_insert(json!(0));
        }
        tasks.insert("reconciling".into(), json!(0));
        tasks.insert("total".into(), json!(total));
        if let Some(end) = self.meta.end_time {
            last = last.max(end);
        }
        json!({
            "jid": self.meta.id,
            "name": self.job.graph.name,
            "start-time": self.meta.start_time,
            "end-time": self.meta.end_time.map_or(-1, |t| t as i64),
            "duration": self.meta.end_time.unwrap_or(self.now).saturating_sub(self.meta.start_time),
            "state": self.job.state.name(),
            "last-modification": last,
            "tasks": tasks,
        })
    }

    /// Flink's JobExceptionsInfoWithHistory: the job's failure cause and
    /// every failed attempt, newest first.
    pub fn exceptions_json(&self, max: usize) -> Value {
        let mut entries: Vec<(i64, Value)> = Vec::new();
        for (v, ejv) in self.job.eg.vertices.iter().enumerate() {
            let name = &self.graph().vertices[v].name;
            let parallelism = ejv.subtasks.len();
            for (i, s) in ejv.subtasks.iter().enumerate() {
                for a in &s.attempts {
                    let Some(cause) = &a.failure_cause else {
                        continue;
                    };
                    let t = self.wall(
                        a.timestamp(ExecutionState::Failed)
                            .or(a.timestamp(ExecutionState::Canceled)),
                    );
                    let mut e = json!({
                        "exceptionName": exception_name(cause),
                        "stacktrace": cause,
                        "timestamp": t,
                        "taskName": format!("{name} ({}/{parallelism})#{}", i + 1, a.attempt_number),
                        "failureLabels": {},
                        "concurrentExceptions": [],
                    });
                    if let Some(tm) = &a.task_manager {
                        e["endpoint"] = json!(self.host(&a.task_manager));
                        e["taskManagerId"] = json!(tm);
                    }
                    entries.push((t, e));
                }
            }
        }
        entries.sort_by_key(|e| std::cmp::Reverse(e.0));
        // The job's own cause, when it is not one of its tasks' (a lost
        // TaskManager, no slots): at the job's end, or the newest task
        // failure's time.
        let root_time = self
            .meta
            .end_time
            .map(|t| t as i64)
            .or_else(|| entries.first().map(|e| e.0));
        if let Some(cause) = &self.job.failure_cause {
            // A job that failed because a task did says so around the
            // task's own cause.
            let own = !entries
                .iter()
                .any(|(_, e)| e["stacktrace"].as_str().is_some_and(|t| cause.contains(t)));
            if own {
                entries.insert(
                    0,
                    (
                        root_time.unwrap_or(self.now as i64),
                        json!({
                            "exceptionName": exception_name(cause),
                            "stacktrace": cause,
                            "timestamp": root_time.unwrap_or(self.now as i64),
                            "failureLabels": {},
                            "concurrentExceptions": [],
                        }),
                    ),
                );
            }
        }
        let truncated = entries.len() > max;
        entries.truncate(max);
        json!({
            "root-exception": self.job.failure_cause,
            "timestamp": self.job.failure_cause.as_ref().map(|_| root_time.unwrap_or(self.now as i64)),
            "all-exceptions": [],
            "truncated": truncated,
            "exceptionHistory": {
                "entries": entries.into_iter().map(|(_, e)| e).collect::<Vec<_>>(),
                "truncated": truncated,
            },
        })
    }

    /// Flink's JobVertexBackPressureInfo, from the back-pressured time per
    /// second each subtask's attempt measures.
    pub fn backpressure_json(&self, v: usize) -> Value {
        let ejv = &self.job.eg.vertices[v];
        let level = |ratio: f64| {
            if ratio <= 0.10 {
                "ok"
            } else if ratio <= 0.5 {
                "low"
            } else {
                "high"
            }
        };
        let mut max_ratio: f64 = 0.0;
        let subtasks: Vec<Value> = ejv
            .subtasks
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let shown = shown(s);
                let io = self.io(v, i, shown);
                let ratio = (io.back_pressured / 1000.0).clamp(0.0, 1.0);
                max_ratio = max_ratio.max(ratio);
                json!({
                    "subtask": i,
                    "attempt-number": shown.attempt_number,
                    "backpressure-level": level(ratio),
                    "backpressureLevel": level(ratio),
                    "ratio": ratio,
                    "idleRatio": (io.idle / 1000.0).clamp(0.0, 1.0),
                    "busyRatio": (io.busy / 1000.0).clamp(0.0, 1.0),
                })
            })
            .collect();
        json!({
            "status": "ok",
            "backpressure-level": level(max_ratio),
            "backpressureLevel": level(max_ratio),
            "end-timestamp": self.now,
            "subtasks": subtasks,
        })
    }

    /// Flink's aggregated subtask metrics: `[{id, min, max, avg, sum, skew}]`
    /// for the metrics named (Flink's names), over the shown attempts.
    pub fn subtask_metrics_json(&self, v: usize, names: &[&str], aggs: &[&str]) -> Value {
        let ios = self.shown_io(v);
        let available = [
            "numRecordsIn",
            "numRecordsOut",
            "numBytesIn",
            "numBytesOut",
            "busyTimeMsPerSecond",
            "backPressuredTimeMsPerSecond",
            "idleTimeMsPerSecond",
        ];
        if names.is_empty() {
            return json!(
                available
                    .iter()
                    .map(|n| json!({ "id": n }))
                    .collect::<Vec<_>>()
            );
        }
        let mut out = Vec::new();
        for name in names {
            let values: Vec<f64> = ios
                .iter()
                .filter_map(|io| {
                    Some(match *name {
                        "numRecordsIn" => io.records_in as f64,
                        "numRecordsOut" => io.records_out as f64,
                        "numBytesIn" => io.bytes_in as f64,
                        "numBytesOut" => io.bytes_out as f64,
                        "busyTimeMsPerSecond" => io.busy,
                        "backPressuredTimeMsPerSecond" => io.back_pressured,
                        "idleTimeMsPerSecond" => io.idle,
                        _ => return None,
                    })
                })
                .collect();
            if values.is_empty() {
                // Flink answers [] when a metric it was asked for has no value.
                return json!([]);
            }
            let sum: f64 = values.iter().sum();
            let avg = sum / values.len() as f64;
            let skew = if avg == 0.0 {
                0.0
            } else {
                let mad = values.iter().map(|x| (x - avg).abs()).sum::<f64>() / values.len() as f64;
                (mad / avg * 100.0).min(100.0)
            };
            let mut m = json!({ "id": name });
            let all = aggs.is_empty();
            let want = |a: &str| all || aggs.iter().any(|x| x.eq_ignore_ascii_case(a));
            if want("min") {
                m["min"] = json!(values.iter().copied().fold(f64::INFINITY, f64::min));
            }
            if want("max") {
                m["max"] = json!(values.iter().copied().fold(f64::NEG_INFINITY, f64::max));
            }
            if want("avg") {
                m["avg"] = json!(avg);
            }
            if want("sum") {
                m["sum"] = json!(sum);
            }
            if want("skew") {
                m["skew"] = json!(skew);
            }
            out.push(m);
        }
        json!(out)
    }

    /// One attempt of one subtask (`.../subtasks/:n/attempts/:a`), or the
    /// shown one (`.../subtasks/:n`).
    pub fn attempt_details(&self, v: usize, i: usize, attempt: Option<u32>) -> Option<Value> {
        let s = self.job.eg.vertices[v].subtasks.get(i)?;
        match attempt {
            None => Some(self.subtask_json(v, i)),
            Some(n) => s.attempt(n).map(|a| self.attempt_json(v, i, a, true)),
        }
    }
}

/// The attempt a subtask shows (Flink's rule): the winner once one
/// finished, else the one closest to finishing, the newest among equals.
fn shown(s: &fluvia_scheduler::ExecutionVertex) -> &Execution {
    if let Some(w) = s.winner() {
        return w;
    }
    s.attempts
        .iter()
        .rev()
        .max_by_key(|a| a.state.progress())
        .unwrap_or_else(|| s.latest_attempt())
}

fn overlaps(a: (Option<u64>, Option<u64>), b: (Option<u64>, Option<u64>)) -> bool {
    match (a.0, b.0) {
        (Some(sa), Some(sb)) => {
            let ea = a.1.unwrap_or(u64::MAX);
            let eb = b.1.unwrap_or(u64::MAX);
            sa < eb && sb < ea
        }
        _ => false,
    }
}

fn io_metrics(io: &Io) -> Value {
    json!({
        "read-bytes": io.bytes_in,
        "read-bytes-complete": io.known,
        "write-bytes": io.bytes_out,
        "write-bytes-complete": io.known,
        "read-records": io.records_in,
        "read-records-complete": io.known,
        "write-records": io.records_out,
        "write-records-complete": io.known,
        // Flink accumulates these over the task's life; here they are the
        // attempt's average per second times its run (not kept): 0.
        "accumulated-backpressured-time": 0,
        "accumulated-idle-time": 0,
        "accumulated-busy-time": 0.0,
    })
}

/// What failed, in short (Flink shows the exception's class here): the
/// innermost cause of a "task (i/n) failed: ..." chain.
fn exception_name(cause: &str) -> String {
    let inner = cause.rsplit(" failed: ").next().unwrap_or(cause);
    let first_line = inner.lines().next().unwrap_or(inner);
    first_line.chars().take(160).collect()
}

/// `MultipleInput(readOrder=[0,1], members=[A, B])` → its read order and members.
fn multiple_input(name: &str) -> Option<Value> {
    let rest = name.strip_prefix("MultipleInput(readOrder=[")?;
    let (order, rest) = rest.split_once("], members=[")?;
    // The members' list ends at the "]" that closes it: the last "])".
    let (members, _) = rest.rsplit_once("])")?;
    let order: Vec<u64> = order
        .split(',')
        .filter_map(|x| x.trim().parse().ok())
        .collect();
    // Members are separated by ", " outside their own brackets
    // (`HashJoin[Inner, CollectLeft]` is one member).
    let mut list = Vec::new();
    let mut depth = 0i32;
    let mut current = String::new();
    let mut chars = members.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => depth -= 1,
            ',' if depth == 0 && chars.peek() == Some(&' ') => {
                chars.next();
                list.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    if !current.is_empty() {
        list.push(current);
    }
    Some(json!({ "read-order": order, "members": list }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_multiple_input_name() {
        let m = multiple_input(
            "MultipleInput(readOrder=[1,2,0], members=[HashJoin[Inner, CollectLeft], HashJoin, Projection]) [Source: a]",
        )
        .expect("parses");
        assert_eq!(m["read-order"], json!([1, 2, 0]));
        assert_eq!(
            m["members"],
            json!(["HashJoin[Inner, CollectLeft]", "HashJoin", "Projection"])
        );
        assert!(multiple_input("Source: a -> Filter").is_none());
    }

    #[test]
    fn concurrent_attempts_overlap_in_time() {
        assert!(overlaps((Some(0), Some(10)), (Some(5), None)));
        assert!(!overlaps((Some(0), Some(10)), (Some(10), Some(20))));
        assert!(!overlaps((None, None), (Some(1), None)));
    }
}

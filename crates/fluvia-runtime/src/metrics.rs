//! The metric registry of a TaskManager: one group per running subtask with
//! Flink's task I/O metrics. Tasks update shared counters once per buffer;
//! the registry turns them into totals, pool usage and time-per-second rates
//! when asked (by the job summary now, by REST and Prometheus in a cluster).
//!
//! Rates are over the interval since the previous snapshot of the same task
//! (or since it started): `busyTimeMsPerSecond` is wall time minus the time
//! waiting for input (`idleTimeMsPerSecond`) and for output buffers
//! (`backPressuredTimeMsPerSecond`).

use fluvia_core::JobId;
use fluvia_network::LocalBufferPool;
use fluvia_network::metrics::IoCounters;
use fluvia_network::net::client::GateBufferPool;
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a task registers.
pub struct TaskMetricGroup {
    pub job_id: JobId,
    /// The vertex (chained) name.
    pub task: String,
    pub subtask: usize,
    /// The vertex's index in its JobGraph and the attempt, so the
    /// JobManager can show live numbers on the right attempt.
    pub vertex: usize,
    pub attempt: u32,
    pub counters: Arc<IoCounters>,
    pub output_pools: Vec<Arc<LocalBufferPool>>,
    pub input_pools: Vec<Arc<GateBufferPool>>,
    started: Instant,
    last: Mutex<Option<Sample>>,
}

#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    idle: Duration,
    back_pressured: Duration,
}

impl TaskMetricGroup {
    pub fn new(
        job_id: JobId,
        task: String,
        subtask: usize,
        counters: Arc<IoCounters>,
        output_pools: Vec<Arc<LocalBufferPool>>,
        input_pools: Vec<Arc<GateBufferPool>>,
    ) -> Self {
        TaskMetricGroup {
            job_id,
            task,
            subtask,
            vertex: 0,
            attempt: 0,
            counters,
            output_pools,
            input_pools,
            started: Instant::now(),
            last: Mutex::new(None),
        }
    }

    /// Names the vertex index and attempt the group measures.
    pub fn for_attempt(mut self, vertex: usize, attempt: u32) -> Self {
        self.vertex = vertex;
        self.attempt = attempt;
        self
    }

    fn back_pressured(&self) -> Duration {
        self.output_pools.iter().map(|p| p.waited()).sum()
    }

    fn usage(in_use: usize, max: usize) -> f64 {
        if max == 0 {
            0.0
        } else {
            in_use as f64 / max as f64
        }
    }

    /// Busy, idle and back-pressured milliseconds per second over the
    /// task's whole run (what its final report carries).
    pub fn run_averages(&self) -> (f64, f64, f64) {
        let secs = self.started.elapsed().as_secs_f64().max(1e-9);
        let per_second = |d: Duration| (d.as_secs_f64() * 1000.0 / secs).clamp(0.0, 1000.0);
        let idle = per_second(Duration::from_nanos(IoCounters::get(
            &self.counters.idle_nanos,
        )));
        let bp = per_second(self.back_pressured());
        ((1000.0 - idle - bp).max(0.0), idle, bp)
    }

    pub fn snapshot(&self) -> TaskMetricsSnapshot {
        let c = &self.counters;
        let now = Instant::now();
        let idle = Duration::from_nanos(IoCounters::get(&c.idle_nanos));
        let back_pressured = self.back_pressured();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let prev = last.unwrap_or(Sample {
            at: self.started,
            idle: Duration::ZERO,
            back_pressured: Duration::ZERO,
        });
        *last = Some(Sample {
            at: now,
            idle,
            back_pressured,
        });
        let interval = now.duration_since(prev.at).as_secs_f64().max(1e-9);
        let per_second = |d: Duration| (d.as_secs_f64() * 1000.0 / interval).clamp(0.0, 1000.0);
        let idle_ms = per_second(idle.saturating_sub(prev.idle));
        let bp_ms = per_second(back_pressured.saturating_sub(prev.back_pressured));
        TaskMetricsSnapshot {
            job_id: self.job_id,
            task: self.task.clone(),
            subtask: self.subtask,
            vertex: self.vertex,
            attempt: self.attempt,
            records_in: IoCounters::get(&c.records_in),
            records_out: IoCounters::get(&c.records_out),
            bytes_in: IoCounters::get(&c.bytes_in),
            bytes_out: IoCounters::get(&c.bytes_out),
            out_pool_usage: Self::usage(
                self.output_pools.iter().map(|p| p.in_use()).sum(),
                self.output_pools.iter().map(|p| p.max_buffers()).sum(),
            ),
            in_pool_usage: Self::usage(
                self.input_pools.iter().map(|p| p.in_use()).sum(),
                self.input_pools.iter().map(|p| p.max_buffers()).sum(),
            ),
            idle_ms_per_second: idle_ms,
            back_pressured_ms_per_second: bp_ms,
            busy_ms_per_second: (1000.0 - idle_ms - bp_ms).max(0.0),
        }
    }
}

/// Flink's task I/O metrics at one moment (serialised as JSON in
/// TaskManager heartbeats).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TaskMetricsSnapshot {
    pub job_id: JobId,
    pub task: String,
    pub subtask: usize,
    pub vertex: usize,
    pub attempt: u32,
    pub records_in: u64,
    pub records_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Fraction of the output pools' buffers in use (`outPoolUsage`).
    pub out_pool_usage: f64,
    /// Fraction of the remote input buffers in use (`inPoolUsage`).
    pub in_pool_usage: f64,
    pub idle_ms_per_second: f64,
    pub back_pressured_ms_per_second: f64,
    pub busy_ms_per_second: f64,
}

/// Reads one value from a snapshot.
type Getter = fn(&TaskMetricsSnapshot) -> f64;

/// All task metric groups of one process.
#[derive(Default)]
pub struct MetricRegistry {
    groups: Mutex<Vec<Arc<TaskMetricGroup>>>,
}

debug_fields!(MetricRegistry);

impl MetricRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn register(&self, group: TaskMetricGroup) -> Arc<TaskMetricGroup> {
        let g = Arc::new(group);
        self.groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::clone(&g));
        g
    }

    /// Forgets one task (it ended; its pools may go).
    pub fn unregister(&self, group: &Arc<TaskMetricGroup>) {
        self.groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|g| !Arc::ptr_eq(g, group));
    }

    /// Forgets a finished job's tasks.
    pub fn remove_job(&self, job: JobId) {
        self.groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|g| g.job_id != job);
    }

    pub fn snapshot(&self) -> Vec<TaskMetricsSnapshot> {
        let groups = self
            .groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        groups.iter().map(|g| g.snapshot()).collect()
    }

    /// The Prometheus text exposition of every task's metrics.
    pub fn render_prometheus(&self) -> String {
        let mut out = String::new();
        let snaps = self.snapshot();
        let metrics: [(&str, &str, Getter); 10] = [
            ("fluvia_task_records_in_total", "counter", |s| {
                s.records_in as f64
            }),
            ("fluvia_task_records_out_total", "counter", |s| {
                s.records_out as f64
            }),
            ("fluvia_task_bytes_in_total", "counter", |s| {
                s.bytes_in as f64
            }),
            ("fluvia_task_bytes_out_total", "counter", |s| {
                s.bytes_out as f64
            }),
            ("fluvia_task_out_pool_usage", "gauge", |s| s.out_pool_usage),
            ("fluvia_task_in_pool_usage", "gauge", |s| s.in_pool_usage),
            ("fluvia_task_idle_time_ms_per_second", "gauge", |s| {
                s.idle_ms_per_second
            }),
            (
                "fluvia_task_back_pressured_time_ms_per_second",
                "gauge",
                |s| s.back_pressured_ms_per_second,
            ),
            ("fluvia_task_busy_time_ms_per_second", "gauge", |s| {
                s.busy_ms_per_second
            }),
            ("fluvia_task_up", "gauge", |_| 1.0),
        ];
        for (name, kind, value) in metrics {
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for s in &snaps {
                let task = s.task.replace('\\', "\\\\").replace('"', "\\\"");
                let _ = writeln!(
                    out,
                    "{name}{{job_id=\"{}\",task=\"{task}\",subtask=\"{}\"}} {}",
                    s.job_id,
                    s.subtask,
                    value(s)
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn snapshots_and_prometheus_text_reflect_the_counters() {
        let registry = MetricRegistry::new();
        let counters = Arc::new(IoCounters::default());
        let global = fluvia_network::NetworkBufferPool::new(1 << 20, 1024).unwrap();
        let pool = global.create_local_pool(4).unwrap();
        let _held = pool.request(&fluvia_network::CancelToken::new()).unwrap();
        registry.register(TaskMetricGroup::new(
            JobId(1),
            "Source: \"x\" -> Map".into(),
            1,
            Arc::clone(&counters),
            vec![pool],
            vec![],
        ));
        counters.records_out.fetch_add(42, Ordering::Relaxed);
        counters.idle_nanos.fetch_add(0, Ordering::Relaxed);
        let snap = &registry.snapshot()[0];
        assert_eq!(snap.records_out, 42);
        assert_eq!(snap.out_pool_usage, 0.25);
        assert!(snap.busy_ms_per_second > 900.0, "{snap:?}");
        let text = registry.render_prometheus();
        assert!(
            text.contains("# TYPE fluvia_task_records_out_total counter"),
            "{text}"
        );
        assert!(
            text.contains(r#"fluvia_task_records_out_total{job_id="00000000000000000000000000000001",task="Source: \"x\" -> Map",subtask="1"} 42"#),
            "{text}"
        );
        registry.remove_job(JobId(1));
        assert!(registry.snapshot().is_empty());
    }
}

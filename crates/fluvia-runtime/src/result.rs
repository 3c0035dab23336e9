//! The outcome of a finished job as a program sees it: per-vertex totals
//! built from the metrics every winning attempt reported, and the checks a
//! job must pass before it runs. Jobs themselves run on a cluster (embedded
//! or remote) through the scheduler; this module only sums what they report.

use crate::metrics::TaskMetricsSnapshot;
use crate::registry::OperatorRegistry;
use fluvia_core::{JobId, Result};
use fluvia_deployment::AttemptMetrics;
use fluvia_graph::JobGraph;
use std::time::Duration;

/// Metrics of one JobVertex, summed over its subtasks.
#[derive(Debug, Clone, Default)]
pub struct VertexMetrics {
    pub name: String,
    pub parallelism: usize,
    pub records_in: u64,
    pub records_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// (operator name, records received or, for sources, emitted).
    pub operators: Vec<(String, u64)>,
    pub output_buffers_max_in_use: usize,
    pub output_buffers_limit: usize,
    pub backpressure_waits: u64,
    /// Averages over the subtasks, for the whole run.
    pub busy_ms_per_second: f64,
    pub back_pressured_ms_per_second: f64,
}

/// The outcome of a finished job.
#[derive(Debug, Clone)]
pub struct JobExecutionResult {
    pub job_id: JobId,
    pub job_name: String,
    pub duration: Duration,
    pub vertices: Vec<VertexMetrics>,
    /// Every subtask's metrics at the end of the run (its winning attempt).
    pub task_metrics: Vec<TaskMetricsSnapshot>,
    /// (vertex, subtask, attempt) of the attempt whose results count.
    pub attempts: Vec<(usize, usize, u32)>,
    /// Named results sinks handed back (`collect()`), in vertex and subtask
    /// order.
    pub accumulators: Vec<(String, Vec<u8>)>,
    /// A streaming job's checkpoints (none for a batch job).
    pub checkpoints: Option<CheckpointSummary>,
}

/// What a job's checkpoints came to.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CheckpointSummary {
    pub completed: u64,
    pub failed: u64,
    /// Times the job restored a checkpoint (restarts, or a savepoint).
    pub restored: u64,
    /// End-to-end duration of the completed ones: (min, avg, max) ms.
    pub duration_ms: (u64, u64, u64),
    /// Full and written bytes of the last completed one.
    pub last_state_size: u64,
    pub last_checkpointed_size: u64,
}

impl JobExecutionResult {
    /// A short human-readable summary.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "Job '{}' ({}) finished in {:.3} s",
            self.job_name,
            self.job_id,
            self.duration.as_secs_f64()
        );
        for v in &self.vertices {
            let _ = writeln!(
                s,
                "  {} [parallelism {}]: records in {}, out {}; bytes in {}, out {}; \
                 busy {:.0} ms/s, back-pressured {:.0} ms/s",
                v.name,
                v.parallelism,
                v.records_in,
                v.records_out,
                v.bytes_in,
                v.bytes_out,
                v.busy_ms_per_second,
                v.back_pressured_ms_per_second
            );
            if v.operators.len() > 1 {
                for (name, n) in &v.operators {
                    let _ = writeln!(s, "      {name}: {n} records");
                }
            }
        }
        if let Some(c) = &self.checkpoints {
            let (min, avg, max) = c.duration_ms;
            let _ = writeln!(
                s,
                "  checkpoints: {} completed, {} failed, {} restored; {min}/{avg}/{max} ms \
                 (min/avg/max); last {} bytes",
                c.completed, c.failed, c.restored, c.last_state_size
            );
        }
        s
    }

    /// Total records handled by the operator named `name` (all subtasks).
    pub fn operator_records(&self, name: &str) -> Option<u64> {
        self.vertices
            .iter()
            .flat_map(|v| v.operators.iter())
            .find(|(n, _)| n == name)
            .map(|(_, c)| *c)
    }
}

/// The checks made before a job runs: every operator has user code, and
/// each factory's own checks pass (input files exist, ...).
pub fn validate_job(job: &JobGraph, registry: &OperatorRegistry) -> Result<()> {
    for v in &job.vertices {
        for op in &v.operators {
            registry.factory(op.node_id)?.validate()?;
        }
    }
    Ok(())
}

impl JobExecutionResult {
    /// Sums what the winning attempts reported: `reports` holds (vertex,
    /// subtask, attempt, metrics) for every subtask.
    pub fn from_reports(
        job: &JobGraph,
        duration: Duration,
        reports: Vec<(usize, usize, u32, AttemptMetrics)>,
    ) -> Self {
        let mut vertices: Vec<VertexMetrics> = job
            .vertices
            .iter()
            .map(|jv| VertexMetrics {
                name: jv.name.clone(),
                parallelism: jv.parallelism,
                operators: jv.operators.iter().map(|o| (o.name.clone(), 0)).collect(),
                ..Default::default()
            })
            .collect();
        let mut reports = reports;
        reports.sort_by_key(|r| (r.0, r.1));
        let mut counts = vec![0usize; vertices.len()];
        let mut task_metrics = Vec::new();
        let mut attempts = Vec::new();
        let mut accumulators = Vec::new();
        for (v, i, attempt, t) in reports {
            let Some(m) = vertices.get_mut(v) else {
                continue;
            };
            counts[v] += 1;
            m.records_in += t.records_in;
            m.records_out += t.records_out;
            m.bytes_in += t.bytes_in;
            m.bytes_out += t.bytes_out;
            m.output_buffers_max_in_use = m
                .output_buffers_max_in_use
                .max(t.output_buffers_max_in_use as usize);
            m.output_buffers_limit = m.output_buffers_limit.max(t.output_buffers_limit as usize);
            m.backpressure_waits += t.backpressure_waits;
            m.busy_ms_per_second += t.busy_ms_per_second;
            m.back_pressured_ms_per_second += t.back_pressured_ms_per_second;
            for (slot, n) in m.operators.iter_mut().zip(&t.operator_records) {
                slot.1 += n;
            }
            task_metrics.push(TaskMetricsSnapshot {
                job_id: job.job_id,
                task: m.name.clone(),
                subtask: i,
                vertex: v,
                attempt,
                records_in: t.records_in,
                records_out: t.records_out,
                bytes_in: t.bytes_in,
                bytes_out: t.bytes_out,
                out_pool_usage: 0.0,
                in_pool_usage: 0.0,
                idle_ms_per_second: t.idle_ms_per_second,
                back_pressured_ms_per_second: t.back_pressured_ms_per_second,
                busy_ms_per_second: t.busy_ms_per_second,
            });
            attempts.push((v, i, attempt));
            accumulators.extend(t.accumulators);
        }
        for (m, n) in vertices.iter_mut().zip(counts) {
            if n > 0 {
                // The subtasks that ran: a parallelism decided at runtime.
                m.parallelism = n;
                m.busy_ms_per_second /= n as f64;
                m.back_pressured_ms_per_second /= n as f64;
            }
        }
        JobExecutionResult {
            job_id: job.job_id,
            job_name: job.name.clone(),
            duration,
            vertices,
            task_metrics,
            attempts,
            accumulators,
            checkpoints: None,
        }
    }

    /// The accumulators of one name, from every subtask.
    pub fn accumulator(&self, name: &str) -> impl Iterator<Item = &[u8]> {
        self.accumulators
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}

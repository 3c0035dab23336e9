//! Speculative execution's slow-task detector (Flink's FLIP-168
//! `ExecutionTimeBasedSlowTaskDetector`) and settings.
//!
//! Plain data in and out: from an [`ExecutionGraph`], the input bytes of
//! each subtask and the time, which attempts are slow. The [`Scheduler`]
//! asks it every `slow-task-detector.check-interval` and reacts (blocks the
//! slow TaskManagers, adds attempts).
//!
//! [`Scheduler`]: crate::Scheduler

use crate::execution_graph::{Execution, ExecutionGraph, ExecutionState};
use fluvia_core::config::options;
use fluvia_core::{Configuration, FluviaError, Result};
use std::time::Duration;

/// `execution.batch.speculative.*` and `slow-task-detector.*`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpeculativeConfig {
    pub max_concurrent_executions: usize,
    pub block_slow_node_duration: Duration,
    pub check_interval: Duration,
    pub baseline_lower_bound: Duration,
    pub baseline_ratio: f64,
    pub baseline_multiplier: f64,
}

impl SpeculativeConfig {
    /// `None` unless `execution.batch.speculative.enabled`.
    pub fn from_configuration(conf: &Configuration) -> Result<Option<Self>> {
        if !conf.get(&options::SPECULATIVE_ENABLED)? {
            return Ok(None);
        }
        let c = SpeculativeConfig {
            max_concurrent_executions: conf.get(&options::SPECULATIVE_MAX_CONCURRENT)?,
            block_slow_node_duration: conf.get(&options::SPECULATIVE_BLOCK_DURATION)?,
            check_interval: conf.get(&options::SLOW_TASK_CHECK_INTERVAL)?,
            baseline_lower_bound: conf.get(&options::SLOW_TASK_LOWER_BOUND)?,
            baseline_ratio: conf.get(&options::SLOW_TASK_BASELINE_RATIO)?,
            baseline_multiplier: conf.get(&options::SLOW_TASK_BASELINE_MULTIPLIER)?,
        };
        if c.max_concurrent_executions < 2 {
            return Err(FluviaError::Config(format!(
                "'{}' must be at least 2 for speculative execution",
                options::SPECULATIVE_MAX_CONCURRENT.key
            )));
        }
        if !(0.0..=1.0).contains(&c.baseline_ratio) || c.baseline_multiplier < 1.0 {
            return Err(FluviaError::Config(format!(
                "'{}' must be within 0..1 and '{}' at least 1",
                options::SLOW_TASK_BASELINE_RATIO.key,
                options::SLOW_TASK_BASELINE_MULTIPLIER.key
            )));
        }
        if c.check_interval.is_zero() {
            return Err(FluviaError::Config(format!(
                "'{}' must be above 0",
                options::SLOW_TASK_CHECK_INTERVAL.key
            )));
        }
        Ok(Some(c))
    }
}

/// Below this many input bytes the ratio compares time per this many bytes
/// (Flink's guard against dividing by tiny inputs).
const MIN_INPUT_BYTES: u64 = 1;

/// An attempt's execution time and the bytes its subtask reads (`None`:
/// unknown, e.g. a source).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Timed {
    time_ms: u64,
    bytes: Option<u64>,
}

impl Timed {
    /// Time per byte, or raw time when the bytes are unknown.
    fn rate(self) -> f64 {
        match self.bytes {
            Some(b) => self.time_ms as f64 / b.max(MIN_INPUT_BYTES) as f64,
            None => self.time_ms as f64,
        }
    }
}

/// Execution time: from DEPLOYING to FINISHED, or to `now` while it runs.
fn execution_time(e: &Execution, now_ms: u64) -> Option<u64> {
    let start = e.timestamp(ExecutionState::Deploying)?;
    let end = e.timestamp(ExecutionState::Finished).unwrap_or(now_ms);
    Some(end.saturating_sub(start))
}

/// One subtask with slow attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlowSubtask {
    pub vertex: usize,
    pub subtask: usize,
    /// Attempt numbers found slow.
    pub attempts: Vec<u32>,
}

/// Flink's detector: for every initialized vertex not finished yet with at
/// least `ratio` of its subtasks finished, the baseline is the median, by
/// time per input byte, of the first `round(parallelism × ratio)` finished
/// attempts, times `multiplier`; an attempt that runs (not CREATED, not
/// ended, not cancelling) is slow when it ran at least the lower bound and
/// its time per input byte is at least the baseline's. `input_bytes(v, i)`
/// is what subtask `i` of vertex `v` reads (`None`: unknown).
pub fn slow_subtasks(
    eg: &ExecutionGraph,
    input_bytes: impl Fn(usize, usize) -> Option<u64>,
    now_ms: u64,
    config: &SpeculativeConfig,
) -> Vec<SlowSubtask> {
    let lower = config.baseline_lower_bound.as_millis() as u64;
    let mut out = Vec::new();
    for (v, ejv) in eg.vertices.iter().enumerate() {
        let p = ejv.subtasks.len();
        if !ejv.initialized || p == 0 {
            continue;
        }
        let finished: Vec<Timed> = ejv
            .subtasks
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let w = s.winner()?;
                Some(Timed {
                    time_ms: execution_time(w, now_ms)?,
                    bytes: input_bytes(v, i),
                })
            })
            .collect();
        if finished.len() == p || (finished.len() as f64) < p as f64 * config.baseline_ratio {
            continue;
        }
        let n = (p as f64 * config.baseline_ratio).round() as usize;
        let baseline = if n == 0 {
            Timed {
                time_ms: 0,
                bytes: None,
            }
        } else {
            let mut sorted = finished.clone();
            sorted.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
            let m = sorted[(n.min(sorted.len()) - 1).min(n / 2)];
            Timed {
                time_ms: (m.time_ms as f64 * config.baseline_multiplier) as u64,
                bytes: m.bytes,
            }
        };
        for (i, s) in ejv.subtasks.iter().enumerate() {
            if s.finished_attempt.is_some() {
                continue;
            }
            let bytes = input_bytes(v, i);
            let slow: Vec<u32> = s
                .attempts
                .iter()
                .filter(|e| {
                    matches!(
                        e.state,
                        ExecutionState::Deploying
                            | ExecutionState::Initializing
                            | ExecutionState::Running
                    )
                })
                .filter_map(|e| {
                    let t = execution_time(e, now_ms)?;
                    let me = Timed { time_ms: t, bytes };
                    // Unknown bytes on either side: compare raw times.
                    let slower = match (me.bytes, baseline.bytes) {
                        (Some(_), Some(_)) => me.rate() >= baseline.rate(),
                        _ => me.time_ms >= baseline.time_ms,
                    };
                    (t >= lower && slower).then_some(e.attempt_number)
                })
                .collect();
            if !slow.is_empty() {
                out.push(SlowSubtask {
                    vertex: v,
                    subtask: i,
                    attempts: slow,
                });
            }
        }
    }
    out
}

//! Checkpoint statistics for the REST API (`GET /jobs/:id/checkpoints`,
//! Flink's `CheckpointStatsTracker` and `CheckpointingStatistics`): counts,
//! summaries over completed checkpoints, the latest ones and a bounded
//! history, as plain serde structs with Flink's field names.
//!
//! The coordinator reports to it; it knows nothing of how checkpoints are
//! taken.

use super::metadata::CheckpointType;
use super::state::{SubtaskCheckpointMetrics, TaskId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// How many values a summary keeps for its percentiles (Flink's
/// `StatsSummary` window).
pub const SUMMARY_WINDOW: usize = 10_000;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointCounts {
    pub restored: u64,
    pub total: u64,
    pub in_progress: u64,
    pub completed: u64,
    pub failed: u64,
}

/// min / max / avg and percentiles of one quantity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsSummaryDto {
    pub min: u64,
    pub max: u64,
    pub avg: u64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub p999: f64,
}

/// Running summary: exact min, max and average over every value, and
/// percentiles over the last [`SUMMARY_WINDOW`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatsSummary {
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
    window: VecDeque<u64>,
}

impl StatsSummary {
    pub fn add(&mut self, v: u64) {
        if self.count == 0 {
            self.min = v;
            self.max = v;
        } else {
            self.min = self.min.min(v);
            self.max = self.max.max(v);
        }
        self.count += 1;
        self.sum += u128::from(v);
        if self.window.len() == SUMMARY_WINDOW {
            self.window.pop_front();
        }
        self.window.push_back(v);
    }

    /// The `q` quantile (0 < q ≤ 1) of the window, interpolated between
    /// ranks at `q·(n+1)` like Apache Commons Math's default estimator
    /// Flink uses.
    pub fn quantile(&self, q: f64) -> f64 {
        let mut sorted: Vec<u64> = self.window.iter().copied().collect();
        sorted.sort_unstable();
        quantile_of_sorted(&sorted, q)
    }

    pub fn to_dto(&self) -> StatsSummaryDto {
        if self.count == 0 {
            return StatsSummaryDto::default();
        }
        let mut sorted: Vec<u64> = self.window.iter().copied().collect();
        sorted.sort_unstable();
        StatsSummaryDto {
            min: self.min,
            max: self.max,
            avg: (self.sum / u128::from(self.count)) as u64,
            p50: quantile_of_sorted(&sorted, 0.5),
            p90: quantile_of_sorted(&sorted, 0.9),
            p95: quantile_of_sorted(&sorted, 0.95),
            p99: quantile_of_sorted(&sorted, 0.99),
            p999: quantile_of_sorted(&sorted, 0.999),
        }
    }
}

fn quantile_of_sorted(sorted: &[u64], q: f64) -> f64 {
    let n = sorted.len();
    let (Some(&first), Some(&last)) = (sorted.first(), sorted.last()) else {
        return 0.0;
    };
    let pos = q * (n as f64 + 1.0);
    if pos < 1.0 {
        return first as f64;
    }
    if pos >= n as f64 {
        return last as f64;
    }
    let lower_rank = pos.floor() as usize; // 1-based, < n
    let frac = pos - pos.floor();
    let lo = sorted[lower_rank - 1] as f64;
    let hi = sorted[lower_rank] as f64;
    lo + frac * (hi - lo)
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointSummary {
    pub checkpointed_size: StatsSummaryDto,
    pub state_size: StatsSummaryDto,
    pub end_to_end_duration: StatsSummaryDto,
    pub alignment_buffered: StatsSummaryDto,
    pub processed_data: StatsSummaryDto,
    pub persisted_data: StatsSummaryDto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CheckpointStatsStatus {
    InProgress,
    Completed,
    Failed,
}

/// One vertex's part of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCheckpointStatistics {
    pub id: u64,
    pub status: CheckpointStatsStatus,
    pub latest_ack_timestamp: u64,
    pub checkpointed_size: u64,
    pub state_size: u64,
    pub end_to_end_duration: u64,
    pub alignment_buffered: u64,
    pub processed_data: u64,
    pub persisted_data: u64,
    pub num_subtasks: u64,
    pub num_acknowledged_subtasks: u64,
}

/// One checkpoint, as the history and `latest` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointStatistics {
    pub id: u64,
    pub status: CheckpointStatsStatus,
    pub is_savepoint: bool,
    pub trigger_timestamp: u64,
    pub latest_ack_timestamp: u64,
    pub state_size: u64,
    pub checkpointed_size: u64,
    pub end_to_end_duration: u64,
    pub alignment_buffered: u64,
    pub processed_data: u64,
    pub persisted_data: u64,
    pub num_subtasks: u64,
    pub num_acknowledged_subtasks: u64,
    /// CHECKPOINT, UNALIGNED_CHECKPOINT, SAVEPOINT or SYNC_SAVEPOINT.
    pub checkpoint_type: String,
    /// Per vertex index.
    pub tasks: BTreeMap<String, TaskCheckpointStatistics>,
    /// Completed: where its metadata is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_path: Option<String>,
    /// Completed: whether it was discarded since (subsumed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discarded: Option<bool>,
    /// Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_timestamp: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoredCheckpointStatistics {
    pub id: u64,
    pub restore_timestamp: u64,
    pub is_savepoint: bool,
    pub external_path: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatestCheckpoints {
    pub completed: Option<CheckpointStatistics>,
    pub savepoint: Option<CheckpointStatistics>,
    pub failed: Option<CheckpointStatistics>,
    pub restored: Option<RestoredCheckpointStatistics>,
}

/// The body of `GET /jobs/:id/checkpoints`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointingStatistics {
    pub counts: CheckpointCounts,
    pub summary: CheckpointSummary,
    pub latest: LatestCheckpoints,
    pub history: Vec<CheckpointStatistics>,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Summaries {
    checkpointed_size: StatsSummary,
    state_size: StatsSummary,
    end_to_end_duration: StatsSummary,
    alignment_buffered: StatsSummary,
    processed_data: StatsSummary,
    persisted_data: StatsSummary,
}

/// Collects what the coordinator reports.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointStatsTracker {
    history_size: usize,
    counts: CheckpointCounts,
    summaries: Summaries,
    /// Newest first; in-progress entries are updated in place.
    history: VecDeque<CheckpointStatistics>,
    latest: LatestCheckpoints,
}

fn type_name(t: CheckpointType, unaligned: bool) -> &'static str {
    match t {
        CheckpointType::Checkpoint if unaligned => "UNALIGNED_CHECKPOINT",
        CheckpointType::Checkpoint => "CHECKPOINT",
        t if t.is_synchronous() => "SYNC_SAVEPOINT",
        CheckpointType::Savepoint(_) => "SAVEPOINT",
    }
}

impl CheckpointStatsTracker {
    /// Remembers `history_size` checkpoints in detail (`web.checkpoints.history`).
    pub fn new(history_size: usize) -> Self {
        CheckpointStatsTracker {
            history_size,
            counts: CheckpointCounts::default(),
            summaries: Summaries::default(),
            history: VecDeque::new(),
            latest: LatestCheckpoints::default(),
        }
    }

    fn entry(&mut self, id: u64) -> Option<&mut CheckpointStatistics> {
        self.history.iter_mut().find(|c| c.id == id)
    }

    /// A checkpoint was triggered; `subtasks` counts the awaited subtasks
    /// per vertex.
    pub fn report_pending(
        &mut self,
        id: u64,
        trigger_timestamp: u64,
        checkpoint_type: CheckpointType,
        unaligned: bool,
        subtasks: &BTreeMap<usize, u64>,
    ) {
        self.counts.total += 1;
        self.counts.in_progress += 1;
        let tasks = subtasks
            .iter()
            .map(|(&v, &n)| {
                (
                    v.to_string(),
                    TaskCheckpointStatistics {
                        id,
                        status: CheckpointStatsStatus::InProgress,
                        latest_ack_timestamp: 0,
                        checkpointed_size: 0,
                        state_size: 0,
                        end_to_end_duration: 0,
                        alignment_buffered: 0,
                        processed_data: 0,
                        persisted_data: 0,
                        num_subtasks: n,
                        num_acknowledged_subtasks: 0,
                    },
                )
            })
            .collect();
        self.history.push_front(CheckpointStatistics {
            id,
            status: CheckpointStatsStatus::InProgress,
            is_savepoint: checkpoint_type.is_savepoint(),
            trigger_timestamp,
            latest_ack_timestamp: 0,
            state_size: 0,
            checkpointed_size: 0,
            end_to_end_duration: 0,
            alignment_buffered: 0,
            processed_data: 0,
            persisted_data: 0,
            num_subtasks: subtasks.values().sum(),
            num_acknowledged_subtasks: 0,
            checkpoint_type: type_name(checkpoint_type, unaligned).to_string(),
            tasks,
            external_path: None,
            discarded: None,
            failure_timestamp: None,
            failure_message: None,
        });
        // In-progress entries are never dropped: only ended ones fall out.
        while self.history.len() > self.history_size {
            match self
                .history
                .iter()
                .rposition(|c| c.status != CheckpointStatsStatus::InProgress)
            {
                Some(i) => {
                    self.history.remove(i);
                }
                None => break,
            }
        }
    }

    /// A subtask acknowledged.
    pub fn report_ack(
        &mut self,
        id: u64,
        task: TaskId,
        state_size: u64,
        m: &SubtaskCheckpointMetrics,
        ack_timestamp: u64,
    ) {
        let Some(c) = self.entry(id) else { return };
        let e2e = ack_timestamp.saturating_sub(c.trigger_timestamp);
        // The checkpoint's and its vertex's totals take the ack alike.
        macro_rules! add_ack {
            ($s:expr) => {{
                let s = $s;
                s.latest_ack_timestamp = s.latest_ack_timestamp.max(ack_timestamp);
                s.end_to_end_duration = s.end_to_end_duration.max(e2e);
                s.state_size += state_size;
                s.checkpointed_size += m.checkpointed_size;
                s.alignment_buffered += m.alignment_buffered;
                s.processed_data += m.processed_data;
                s.persisted_data += m.persisted_data;
                s.num_acknowledged_subtasks += 1;
            }};
        }
        add_ack!(&mut *c);
        if let Some(t) = c.tasks.get_mut(&task.vertex.to_string()) {
            add_ack!(t);
        }
    }

    fn set_task_status(c: &mut CheckpointStatistics, status: CheckpointStatsStatus) {
        c.status = status;
        for t in c.tasks.values_mut() {
            t.status = status;
        }
    }

    /// The checkpoint completed (its metadata is written).
    pub fn report_completed(&mut self, id: u64, external_path: Option<String>) {
        let Some(c) = self.entry(id) else { return };
        Self::set_task_status(c, CheckpointStatsStatus::Completed);
        c.external_path = external_path;
        c.discarded = Some(false);
        let c = c.clone();
        self.counts.in_progress = self.counts.in_progress.saturating_sub(1);
        self.counts.completed += 1;
        let s = &mut self.summaries;
        s.checkpointed_size.add(c.checkpointed_size);
        s.state_size.add(c.state_size);
        s.end_to_end_duration.add(c.end_to_end_duration);
        s.alignment_buffered.add(c.alignment_buffered);
        s.processed_data.add(c.processed_data);
        s.persisted_data.add(c.persisted_data);
        if c.is_savepoint {
            self.latest.savepoint = Some(c);
        } else {
            self.latest.completed = Some(c);
        }
    }

    /// The checkpoint failed.
    pub fn report_failed(&mut self, id: u64, failure_timestamp: u64, message: &str) {
        let Some(c) = self.entry(id) else { return };
        if c.status != CheckpointStatsStatus::InProgress {
            return;
        }
        Self::set_task_status(c, CheckpointStatsStatus::Failed);
        c.failure_timestamp = Some(failure_timestamp);
        c.failure_message = Some(message.to_string());
        let c = c.clone();
        self.counts.in_progress = self.counts.in_progress.saturating_sub(1);
        self.counts.failed += 1;
        self.latest.failed = Some(c);
    }

    /// A completed checkpoint was subsumed and discarded.
    pub fn report_discarded(&mut self, id: u64) {
        if let Some(c) = self.entry(id) {
            c.discarded = Some(true);
        }
        for c in [&mut self.latest.completed, &mut self.latest.savepoint]
            .into_iter()
            .flatten()
        {
            if c.id == id {
                c.discarded = Some(true);
            }
        }
    }

    /// The job (re)started from a checkpoint.
    pub fn report_restored(
        &mut self,
        id: u64,
        restore_timestamp: u64,
        is_savepoint: bool,
        external_path: Option<String>,
    ) {
        self.counts.restored += 1;
        self.latest.restored = Some(RestoredCheckpointStatistics {
            id,
            restore_timestamp,
            is_savepoint,
            external_path,
        });
    }

    pub fn counts(&self) -> CheckpointCounts {
        self.counts
    }

    /// The REST body.
    pub fn snapshot(&self) -> CheckpointingStatistics {
        let s = &self.summaries;
        CheckpointingStatistics {
            counts: self.counts,
            summary: CheckpointSummary {
                checkpointed_size: s.checkpointed_size.to_dto(),
                state_size: s.state_size.to_dto(),
                end_to_end_duration: s.end_to_end_duration.to_dto(),
                alignment_buffered: s.alignment_buffered.to_dto(),
                processed_data: s.processed_data.to_dto(),
                persisted_data: s.persisted_data.to_dto(),
            },
            latest: self.latest.clone(),
            history: self.history.iter().cloned().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_min_max_avg_and_percentiles() {
        let mut s = StatsSummary::default();
        for v in 1..=100 {
            s.add(v);
        }
        let d = s.to_dto();
        assert_eq!((d.min, d.max, d.avg), (1, 100, 50));
        assert!((d.p50 - 50.5).abs() < 1e-9);
        assert!((d.p90 - 90.9).abs() < 1e-9);
        assert_eq!(d.p999, 100.0);
        assert_eq!(StatsSummary::default().to_dto(), StatsSummaryDto::default());
    }

    #[test]
    fn history_is_bounded_but_keeps_in_progress() {
        let mut t = CheckpointStatsTracker::new(2);
        let one = BTreeMap::from([(0usize, 1u64)]);
        for id in 1..=3 {
            t.report_pending(id, id * 10, CheckpointType::Checkpoint, false, &one);
        }
        // All three still in progress: none may go.
        assert_eq!(t.snapshot().history.len(), 3);
        t.report_failed(1, 40, "x");
        t.report_pending(4, 50, CheckpointType::Checkpoint, false, &one);
        let ids: Vec<u64> = t.snapshot().history.iter().map(|c| c.id).collect();
        assert_eq!(ids, vec![4, 3, 2]);
        let c = t.snapshot().counts;
        assert_eq!((c.total, c.in_progress, c.failed), (4, 3, 1));
    }
}

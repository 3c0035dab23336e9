//! Why a checkpoint failed ([`CheckpointFailureReason`]) and which
//! failures count against `tolerable-failed-checkpoints`
//! ([`FailureManager`], Flink's `CheckpointFailureManager`).
//!
//! It counts; it does not know pending checkpoints or tasks.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Flink's `CheckpointFailureReason`, the part this coordinator meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CheckpointFailureReason {
    /// A task is not running (nor finished): nothing is triggered.
    NotAllRequiredTasksRunning,
    TooManyConcurrentCheckpoints,
    MinimumTimeBetweenCheckpoints,
    /// The timeout passed before every task acknowledged.
    CheckpointExpired,
    /// A newer checkpoint completed first.
    CheckpointSubsumed,
    /// A task declined (its snapshot failed).
    CheckpointDeclined,
    /// The task's asynchronous part (the upload) failed.
    CheckpointAsyncException,
    /// The task was not ready (still restoring) when the barrier came.
    CheckpointDeclinedTaskNotReady,
    /// The task was closing.
    CheckpointDeclinedTaskClosing,
    /// The task's input ended before the barrier.
    CheckpointDeclinedInputEndOfStream,
    /// Writing `_metadata` failed.
    FinalizeCheckpointFailure,
    /// A task failed: the job (or a region) restarts.
    TaskFailure,
    /// The job restarts.
    JobFailover,
    /// The job ended.
    CheckpointCoordinatorShutdown,
    /// A savepoint was asked with no directory to write it to.
    NoSavepointDirectory,
}

impl CheckpointFailureReason {
    /// Whether it counts against the tolerable failures (Flink's
    /// `checkFailureCounter`): only failures of the snapshot itself, not
    /// of the job around it.
    pub fn is_counted(self) -> bool {
        use CheckpointFailureReason::*;
        matches!(
            self,
            CheckpointExpired
                | CheckpointDeclined
                | CheckpointAsyncException
                | FinalizeCheckpointFailure
        )
    }

    /// Flink's message for the reason.
    pub fn message(self) -> &'static str {
        use CheckpointFailureReason::*;
        match self {
            NotAllRequiredTasksRunning => "Not all required tasks are currently running.",
            TooManyConcurrentCheckpoints => {
                "The maximum number of queued checkpoint requests exceeded"
            }
            MinimumTimeBetweenCheckpoints => {
                "The minimum time between checkpoints is still pending. Checkpoint will be triggered after the minimum time."
            }
            CheckpointExpired => "Checkpoint expired before completing.",
            CheckpointSubsumed => "Checkpoint has been subsumed.",
            CheckpointDeclined => "Checkpoint was declined.",
            CheckpointAsyncException => "Asynchronous task checkpoint failed.",
            CheckpointDeclinedTaskNotReady => "Checkpoint was declined (tasks not ready)",
            CheckpointDeclinedTaskClosing => "Checkpoint was declined (task is closing)",
            CheckpointDeclinedInputEndOfStream => {
                "Checkpoint was declined because one input stream is finished"
            }
            FinalizeCheckpointFailure => "Failure to finalize checkpoint.",
            TaskFailure => "Task has failed.",
            JobFailover => "The job has failed over.",
            CheckpointCoordinatorShutdown => "CheckpointCoordinator shutdown.",
            NoSavepointDirectory => {
                "No savepoint directory specified: give a target directory or set 'execution.checkpointing.savepoint-dir'."
            }
        }
    }
}

/// Consecutive counted checkpoint failures.
#[derive(Debug, Clone, Default)]
pub struct FailureManager {
    tolerable: u32,
    continuous: u32,
    counted: BTreeSet<u64>,
    last_succeeded: u64,
}

impl FailureManager {
    pub fn new(tolerable: u32) -> Self {
        FailureManager {
            tolerable,
            ..FailureManager::default()
        }
    }

    /// Records a failure of checkpoint `id` (savepoint failures are never
    /// counted). Each checkpoint counts once, and not when it is older than
    /// the last success. `true`: the threshold is exceeded and the job must
    /// fail; the count starts again.
    pub fn on_failure(
        &mut self,
        id: u64,
        is_savepoint: bool,
        reason: CheckpointFailureReason,
    ) -> bool {
        if is_savepoint || !reason.is_counted() || id <= self.last_succeeded {
            return false;
        }
        if self.counted.insert(id) {
            self.continuous += 1;
        }
        if self.continuous > self.tolerable {
            self.continuous = 0;
            self.counted.clear();
            return true;
        }
        false
    }

    /// A checkpoint completed: consecutive failures start again.
    pub fn on_success(&mut self, id: u64) {
        self.last_succeeded = self.last_succeeded.max(id);
        self.continuous = 0;
        self.counted.retain(|&c| c > id);
    }

    pub fn continuous_failures(&self) -> u32 {
        self.continuous
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CheckpointFailureReason::*;

    #[test]
    fn counts_each_checkpoint_once_and_only_snapshot_failures() {
        let mut m = FailureManager::new(2);
        assert!(!m.on_failure(1, false, CheckpointExpired));
        assert!(!m.on_failure(1, false, CheckpointDeclined));
        assert!(!m.on_failure(2, false, TaskFailure));
        assert!(!m.on_failure(3, true, CheckpointExpired));
        assert_eq!(m.continuous_failures(), 1);
        assert!(!m.on_failure(4, false, FinalizeCheckpointFailure));
        assert!(m.on_failure(5, false, CheckpointAsyncException));
        // The job failed: counting starts again.
        assert_eq!(m.continuous_failures(), 0);
    }

    #[test]
    fn a_success_resets_and_older_failures_do_not_count() {
        let mut m = FailureManager::new(0);
        m.on_success(10);
        assert!(!m.on_failure(9, false, CheckpointExpired));
        assert!(m.on_failure(11, false, CheckpointExpired));
    }
}

//! The checkpoint coordinator's settings (Flink's
//! `CheckpointCoordinatorConfiguration`): a plain struct whose `Default` is
//! Flink's defaults, and its validation.
//!
//! It does not parse configuration keys (that belongs to `fluvia-core`'s
//! configuration); each field names the Flink key it stands for.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Flink's lower bound for the interval and the timeout.
pub const MINIMAL_CHECKPOINT_TIME: Duration = Duration::from_millis(10);

/// `execution.checkpointing.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CheckpointingMode {
    #[default]
    ExactlyOnce,
    AtLeastOnce,
}

/// `execution.checkpointing.externalized-checkpoint-retention`: what
/// happens to the retained checkpoints when the job ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ExternalizedCheckpointRetention {
    /// Kept when the job fails; deleted when it is cancelled or finishes.
    DeleteOnCancellation,
    /// Kept when the job fails or is cancelled; deleted when it finishes.
    RetainOnCancellation,
    /// Deleted whenever the job ends (a suspended job does not end: its
    /// checkpoints are always kept for the next leader).
    #[default]
    NoExternalizedCheckpoints,
}

/// How the job ended, as far as the retained checkpoints care.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TerminalJobStatus {
    Finished,
    Cancelled,
    Failed,
    /// The JobManager lost leadership: another one takes the job over.
    Suspended,
}

impl ExternalizedCheckpointRetention {
    /// Whether the retained checkpoints are deleted when the job ends so
    /// (Flink's `CheckpointProperties.discardOn*`).
    pub fn discard_on(self, status: TerminalJobStatus) -> bool {
        use ExternalizedCheckpointRetention::*;
        use TerminalJobStatus::*;
        match (self, status) {
            // Not globally terminal: the next leader recovers from them.
            (_, Suspended) => false,
            (NoExternalizedCheckpoints, _) => true,
            (_, Finished) => true,
            (DeleteOnCancellation, Cancelled) => true,
            _ => false,
        }
    }
}

/// The coordinator's settings. `Default` is Flink's: checkpointing off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointConfig {
    /// `execution.checkpointing.interval` (no default: `None`, periodic
    /// checkpoints off; savepoints still work).
    pub interval: Option<Duration>,
    /// `execution.checkpointing.mode`.
    pub mode: CheckpointingMode,
    /// `execution.checkpointing.timeout` (10 min).
    pub timeout: Duration,
    /// `execution.checkpointing.min-pause` (0), measured from the last
    /// completion to the next trigger. Above 0 it implies one checkpoint
    /// at a time.
    pub min_pause: Duration,
    /// `execution.checkpointing.max-concurrent-checkpoints` (1).
    pub max_concurrent: usize,
    /// `execution.checkpointing.tolerable-failed-checkpoints` (no default:
    /// `None`, which Flink treats as 0 — the first counted failure fails
    /// the job).
    pub tolerable_failed: Option<u32>,
    /// `execution.checkpointing.num-retained` (1).
    pub num_retained: usize,
    /// `execution.checkpointing.unaligned.enabled` (false).
    pub unaligned: bool,
    /// `execution.checkpointing.aligned-checkpoint-timeout` (0: off).
    pub aligned_checkpoint_timeout: Duration,
    /// `execution.checkpointing.externalized-checkpoint-retention`
    /// (NO_EXTERNALIZED_CHECKPOINTS).
    pub externalized_retention: ExternalizedCheckpointRetention,
    /// `execution.checkpointing.dir` (formerly `state.checkpoints.dir`):
    /// `None` keeps the metadata in the JobManager only.
    pub checkpoint_dir: Option<String>,
    /// `execution.checkpointing.savepoint-dir` (formerly
    /// `state.savepoints.dir`): the default target of a savepoint.
    pub savepoint_dir: Option<String>,
    /// `web.checkpoints.history` (10): how many checkpoints the statistics
    /// remember in detail.
    pub history_size: usize,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            interval: None,
            mode: CheckpointingMode::ExactlyOnce,
            timeout: Duration::from_secs(600),
            min_pause: Duration::ZERO,
            max_concurrent: 1,
            tolerable_failed: None,
            num_retained: 1,
            unaligned: false,
            aligned_checkpoint_timeout: Duration::ZERO,
            externalized_retention: ExternalizedCheckpointRetention::default(),
            checkpoint_dir: None,
            savepoint_dir: None,
            history_size: 10,
        }
    }
}

/// A setting the coordinator cannot work with, or a plan it cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointConfigError {
    #[error("'execution.checkpointing.interval' must be at least 10 ms, got {0:?}")]
    IntervalTooSmall(Duration),
    #[error("'execution.checkpointing.timeout' must be at least 10 ms, got {0:?}")]
    TimeoutTooSmall(Duration),
    #[error("'execution.checkpointing.max-concurrent-checkpoints' must be at least 1")]
    MaxConcurrentZero,
    #[error("'execution.checkpointing.num-retained' must be at least 1")]
    NumRetainedZero,
    #[error(
        "unaligned checkpoints ('execution.checkpointing.unaligned.enabled') need mode \
         EXACTLY_ONCE and 'execution.checkpointing.max-concurrent-checkpoints' 1"
    )]
    UnalignedNeedsExactlyOnce,
    #[error("invalid checkpoint plan: {0}")]
    Plan(String),
}

impl CheckpointConfig {
    /// Periodic checkpoints every `interval` with the other defaults.
    pub fn with_interval(interval: Duration) -> Self {
        CheckpointConfig {
            interval: Some(interval),
            ..CheckpointConfig::default()
        }
    }

    pub fn validate(&self) -> Result<(), CheckpointConfigError> {
        if let Some(i) = self.interval
            && i < MINIMAL_CHECKPOINT_TIME
        {
            return Err(CheckpointConfigError::IntervalTooSmall(i));
        }
        if self.timeout < MINIMAL_CHECKPOINT_TIME {
            return Err(CheckpointConfigError::TimeoutTooSmall(self.timeout));
        }
        if self.max_concurrent == 0 {
            return Err(CheckpointConfigError::MaxConcurrentZero);
        }
        if self.num_retained == 0 {
            return Err(CheckpointConfigError::NumRetainedZero);
        }
        if self.unaligned
            && (self.mode != CheckpointingMode::ExactlyOnce || self.max_concurrent > 1)
        {
            return Err(CheckpointConfigError::UnalignedNeedsExactlyOnce);
        }
        Ok(())
    }

    /// Counted failures tolerated before the job fails.
    pub fn tolerable(&self) -> u32 {
        self.tolerable_failed.unwrap_or(0)
    }

    /// Checkpoints in flight at most (`min-pause` above 0 implies 1).
    pub fn effective_max_concurrent(&self) -> usize {
        if self.min_pause.is_zero() {
            self.max_concurrent.max(1)
        } else {
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_flinks() {
        let c = CheckpointConfig::default();
        assert_eq!(c.interval, None);
        assert_eq!(c.timeout, Duration::from_secs(600));
        assert_eq!(c.max_concurrent, 1);
        assert_eq!(c.num_retained, 1);
        assert_eq!(c.tolerable(), 0);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn validation_rejects_bad_settings() {
        let mut c = CheckpointConfig::with_interval(Duration::from_millis(5));
        assert!(matches!(
            c.validate(),
            Err(CheckpointConfigError::IntervalTooSmall(_))
        ));
        c.interval = Some(Duration::from_secs(1));
        c.unaligned = true;
        c.mode = CheckpointingMode::AtLeastOnce;
        assert_eq!(
            c.validate(),
            Err(CheckpointConfigError::UnalignedNeedsExactlyOnce)
        );
    }

    #[test]
    fn retention_follows_flinks_properties() {
        use ExternalizedCheckpointRetention::*;
        use TerminalJobStatus::*;
        assert!(NoExternalizedCheckpoints.discard_on(Failed));
        assert!(DeleteOnCancellation.discard_on(Cancelled));
        assert!(!DeleteOnCancellation.discard_on(Failed));
        assert!(!RetainOnCancellation.discard_on(Cancelled));
        assert!(RetainOnCancellation.discard_on(Finished));
    }
}

//! The state of an attempt, as the task reports it and the scheduler keeps it.

use serde::{Deserialize, Serialize};

/// Flink's `ExecutionState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ExecutionState {
    Created,
    Scheduled,
    Deploying,
    Initializing,
    Running,
    Finished,
    Canceling,
    Canceled,
    Failed,
}

impl ExecutionState {
    pub const ALL: [ExecutionState; 9] = [
        ExecutionState::Created,
        ExecutionState::Scheduled,
        ExecutionState::Deploying,
        ExecutionState::Initializing,
        ExecutionState::Running,
        ExecutionState::Finished,
        ExecutionState::Canceling,
        ExecutionState::Canceled,
        ExecutionState::Failed,
    ];

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            ExecutionState::Finished | ExecutionState::Canceled | ExecutionState::Failed
        )
    }

    /// Deployed (or being deployed) and not yet ended: the attempt holds a
    /// slot.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            ExecutionState::Deploying
                | ExecutionState::Initializing
                | ExecutionState::Running
                | ExecutionState::Canceling
        )
    }

    /// Flink's name (`RUNNING`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ExecutionState::Created => "CREATED",
            ExecutionState::Scheduled => "SCHEDULED",
            ExecutionState::Deploying => "DEPLOYING",
            ExecutionState::Initializing => "INITIALIZING",
            ExecutionState::Running => "RUNNING",
            ExecutionState::Finished => "FINISHED",
            ExecutionState::Canceling => "CANCELING",
            ExecutionState::Canceled => "CANCELED",
            ExecutionState::Failed => "FAILED",
        }
    }

    pub fn parse(s: &str) -> Option<ExecutionState> {
        Self::ALL.into_iter().find(|st| st.name() == s)
    }

    /// How close to FINISHED: the vertex shows its most advanced attempt.
    /// How close to FINISHED (higher is closer): Flink's order for the
    /// attempt a subtask shows.
    pub fn progress(self) -> u8 {
        match self {
            ExecutionState::Finished => 9,
            ExecutionState::Running => 8,
            ExecutionState::Initializing => 7,
            ExecutionState::Deploying => 6,
            ExecutionState::Scheduled => 5,
            ExecutionState::Created => 4,
            ExecutionState::Canceling => 3,
            ExecutionState::Failed => 2,
            ExecutionState::Canceled => 1,
        }
    }
}

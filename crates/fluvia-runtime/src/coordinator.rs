//! Operator coordinators (Flink's `OperatorCoordinator`): the JobManager-side
//! half of an operator. A coordinator exchanges opaque *operator events* with
//! the attempts of its operator's subtasks (over the JobManager ↔
//! TaskManager RPC), hears when attempts start, fail or are reset, and
//! will take part in checkpoints (its state is part of one).
//!
//! A coordinator is a state machine without I/O, in the scheduler's style:
//! every call returns, in an [`Outbox`], the events to send; the JobManager
//! delivers them. It is built on the JobManager from data, a
//! [`CoordinatorSpec`] (kind + config), through a [`CoordinatorRegistry`]:
//! user closures never reach the JobManager.
//!
//! This module knows no RPC, no sockets and no scheduler.

use fluvia_core::{FluviaError, Result};
use std::collections::BTreeMap;
use std::sync::Arc;

pub use fluvia_graph::CoordinatorSpec;

/// An event to deliver to one attempt of one subtask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingEvent {
    pub subtask: usize,
    pub attempt: u32,
    pub event: Vec<u8>,
}

/// What a coordinator asks the JobManager to send.
#[derive(Debug, Default)]
pub struct Outbox {
    events: Vec<OutgoingEvent>,
}

impl Outbox {
    pub fn send(&mut self, subtask: usize, attempt: u32, event: Vec<u8>) {
        self.events.push(OutgoingEvent {
            subtask,
            attempt,
            event,
        });
    }

    pub fn take(&mut self) -> Vec<OutgoingEvent> {
        std::mem::take(&mut self.events)
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

/// The JobManager-side half of one operator (see the module docs).
pub trait OperatorCoordinator: Send {
    /// Attempt `attempt` of `subtask` runs and can receive events (Flink's
    /// `executionAttemptReady`).
    fn attempt_ready(&mut self, subtask: usize, attempt: u32, out: &mut Outbox) -> Result<()>;
    /// An event from attempt `attempt` of `subtask`.
    fn handle_event(
        &mut self,
        subtask: usize,
        attempt: u32,
        event: &[u8],
        out: &mut Outbox,
    ) -> Result<()>;
    /// Attempt `attempt` of `subtask` failed or was cancelled; other
    /// attempts of the subtask may still run (speculation).
    fn attempt_failed(&mut self, subtask: usize, attempt: u32, out: &mut Outbox) -> Result<()>;
    /// `subtask` starts over with a new attempt (failover): what its earlier
    /// attempts were given is to be given again.
    fn subtask_reset(&mut self, subtask: usize, out: &mut Outbox) -> Result<()>;
    /// The coordinator's state for checkpoint `checkpoint_id` (the
    /// checkpoint coordinator stores it; nothing by default).
    fn checkpoint(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>> {
        Ok(Vec::new())
    }
    /// Checkpoint `checkpoint_id` completed.
    fn notify_checkpoint_complete(&mut self, _checkpoint_id: u64) -> Result<()> {
        Ok(())
    }
    /// The job restarts from a checkpoint whose coordinator state is
    /// `state` (Flink's `resetToCheckpoint`): forget every subtask and
    /// become what the checkpoint recorded. Its subtasks restore what they
    /// held from their own state.
    fn reset_to_checkpoint(&mut self, _checkpoint_id: u64, _state: &[u8]) -> Result<()> {
        Err(FluviaError::Execution(
            "this operator coordinator cannot restore a checkpoint".to_string(),
        ))
    }
}

/// Builds a coordinator from its spec for an operator of `parallelism`
/// subtasks.
pub type CoordinatorFactory =
    Arc<dyn Fn(&[u8], usize) -> Result<Box<dyn OperatorCoordinator>> + Send + Sync>;

/// The coordinator kinds a JobManager can build, by name.
#[derive(Clone, Default)]
pub struct CoordinatorRegistry {
    kinds: BTreeMap<String, CoordinatorFactory>,
}

impl std::fmt::Debug for CoordinatorRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.kinds.keys()).finish()
    }
}

impl CoordinatorRegistry {
    pub fn register(&mut self, kind: &str, factory: CoordinatorFactory) {
        self.kinds.insert(kind.to_string(), factory);
    }

    pub fn create(
        &self,
        spec: &CoordinatorSpec,
        parallelism: usize,
    ) -> Result<Box<dyn OperatorCoordinator>> {
        let factory = self.kinds.get(&spec.kind).ok_or_else(|| {
            FluviaError::Plan(format!(
                "no operator coordinator of kind '{}' on this JobManager (known: {})",
                spec.kind,
                self.kinds.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?;
        factory(&spec.config, parallelism)
    }
}

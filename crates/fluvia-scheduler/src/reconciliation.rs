//! Heartbeat reconciliation: what a TaskManager says it runs against what
//! the scheduler believes runs there. An attempt it runs that the scheduler
//! does not count as live there (or is cancelling: the cancel may have been
//! lost) is cancelled again; an acknowledged attempt missing from two
//! heartbeats in a row is failed, its final report having been lost.
//!
//! It takes and returns plain data: the attempts reported, the attempts
//! expected, and the ones to cancel or fail. The scheduler acts on them.

use crate::deployment::ExecutionAttemptId;
use crate::execution_graph::{ExecutionGraph, ExecutionState};
use fluvia_core::JobId;
use std::collections::{BTreeMap, BTreeSet};

/// One job's count of heartbeats each acknowledged attempt was missing from.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reconciliation {
    missed: BTreeMap<ExecutionAttemptId, u32>,
}

impl Reconciliation {
    /// A heartbeat of one TaskManager: `acknowledged` are the job's attempts
    /// the scheduler believes run there, `running` what it reports. Returns
    /// the attempts missing from a second heartbeat in a row.
    pub(crate) fn heartbeat(
        &mut self,
        acknowledged: Vec<ExecutionAttemptId>,
        running: &BTreeSet<ExecutionAttemptId>,
    ) -> Vec<ExecutionAttemptId> {
        let mut lost = Vec::new();
        for a in acknowledged {
            if running.contains(&a) {
                self.missed.remove(&a);
            } else {
                let n = self.missed.entry(a).or_insert(0);
                *n += 1;
                if *n >= 2 {
                    self.missed.remove(&a);
                    lost.push(a);
                }
            }
        }
        lost
    }

    /// Forgets attempts that ended some other way.
    pub(crate) fn retain_live(&mut self, eg: &ExecutionGraph) {
        self.missed.retain(|a, _| {
            eg.vertices[a.vertex].subtasks[a.subtask].attempts[a.attempt as usize]
                .state
                .is_live()
        });
    }

    /// The job ended.
    pub(crate) fn clear(&mut self) {
        self.missed.clear();
    }
}

/// The attempts of job `job` the scheduler believes `tm` runs: deployed and
/// acknowledged, not ended.
pub(crate) fn acknowledged_on(
    eg: &ExecutionGraph,
    job: JobId,
    tm: &str,
) -> Vec<ExecutionAttemptId> {
    let mut seen = Vec::new();
    for (v, ejv) in eg.vertices.iter().enumerate() {
        for (i, s) in ejv.subtasks.iter().enumerate() {
            for e in &s.attempts {
                let acked = matches!(
                    e.state,
                    ExecutionState::Initializing
                        | ExecutionState::Running
                        | ExecutionState::Canceling
                );
                if acked && e.task_manager.as_deref() == Some(tm) {
                    seen.push(ExecutionAttemptId {
                        job,
                        vertex: v,
                        subtask: i,
                        attempt: e.attempt_number,
                    });
                }
            }
        }
    }
    seen
}

/// The attempts a TaskManager runs that it should not: `expected` says
/// whether the scheduler counts an attempt as live there and not being
/// cancelled. Those are cancelled (again).
pub(crate) fn unexpected(
    running: &BTreeSet<ExecutionAttemptId>,
    expected: impl Fn(&ExecutionAttemptId) -> bool,
) -> Vec<ExecutionAttemptId> {
    running.iter().filter(|a| !expected(a)).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_missing_from_two_heartbeats_in_a_row_is_lost() {
        let a = ExecutionAttemptId {
            job: JobId(1),
            vertex: 0,
            subtask: 0,
            attempt: 0,
        };
        let mut r = Reconciliation::default();
        let none = BTreeSet::new();
        assert!(r.heartbeat(vec![a], &none).is_empty());
        assert!(r.heartbeat(vec![a], &BTreeSet::from([a])).is_empty());
        assert!(r.heartbeat(vec![a], &none).is_empty());
        assert_eq!(r.heartbeat(vec![a], &none), vec![a]);
    }
}

//! Which tasks a checkpoint involves: the job's vertices and operators
//! ([`TasksPlan`]), and, from the tasks' states at trigger time, whom to
//! trigger and whose acknowledgement to wait for ([`CheckpointPlan`],
//! Flink's `DefaultCheckpointPlanCalculator`).
//!
//! It knows task states as the coordinator tracks them; nothing of the
//! ExecutionGraph or of deployment.

use super::config::CheckpointConfigError;
use super::failure::CheckpointFailureReason;
use super::state::{OperatorId, TaskAttempt, TaskId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// One JobVertex (an operator chain) as checkpointing sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VertexPlan {
    pub name: String,
    pub parallelism: usize,
    /// Key groups of its keyed state; fixed for the job's life.
    pub max_parallelism: u32,
    /// The chained operators' uids, head first.
    pub operators: Vec<OperatorId>,
    /// Upstream vertices (indices below this vertex's).
    pub inputs: Vec<usize>,
}

/// The job's vertices in topological order; vertex `i` has the tasks
/// `(i, 0..parallelism)`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TasksPlan {
    pub vertices: Vec<VertexPlan>,
}

impl TasksPlan {
    pub fn tasks(&self) -> impl Iterator<Item = TaskId> + '_ {
        self.vertices
            .iter()
            .enumerate()
            .flat_map(|(v, vp)| (0..vp.parallelism).map(move |s| TaskId::new(v, s)))
    }

    pub fn contains(&self, task: TaskId) -> bool {
        self.vertices
            .get(task.vertex)
            .is_some_and(|v| task.subtask < v.parallelism)
    }

    pub fn validate(&self) -> Result<(), CheckpointConfigError> {
        let bad = |m: String| Err(CheckpointConfigError::Plan(m));
        let mut uids = BTreeSet::new();
        for (i, v) in self.vertices.iter().enumerate() {
            if v.parallelism == 0 {
                return bad(format!("vertex {i} ('{}') has parallelism 0", v.name));
            }
            if v.operators.is_empty() {
                return bad(format!("vertex {i} ('{}') has no operator", v.name));
            }
            if (v.max_parallelism as usize) < v.parallelism {
                return bad(format!(
                    "vertex {i} ('{}') has parallelism {} above its max parallelism {}",
                    v.name, v.parallelism, v.max_parallelism
                ));
            }
            if let Some(&u) = v.inputs.iter().find(|&&u| u >= i) {
                return bad(format!(
                    "vertex {i} ('{}') reads vertex {u}, which is not upstream of it",
                    v.name
                ));
            }
            for op in &v.operators {
                if !uids.insert(op.clone()) {
                    return bad(format!("operator uid '{op}' is used twice"));
                }
            }
        }
        Ok(())
    }
}

/// Where a task is, as far as checkpointing cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskStatus {
    /// Not deployed yet, restarting, or failed.
    NotRunning,
    Running {
        attempt: u32,
    },
    Finished,
}

/// One checkpoint's tasks, fixed when it is triggered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointPlan {
    /// Where the barriers start.
    pub to_trigger: Vec<TaskAttempt>,
    /// Every running task: each must acknowledge, and is notified.
    pub to_wait: BTreeMap<TaskId, u32>,
    /// Tasks finished at trigger time: neither triggered nor awaited.
    pub finished: BTreeSet<TaskId>,
}

/// The plan for a checkpoint now, or why there can be none.
///
/// Every task must run or have finished (Flink's "Not all required tasks
/// are currently running"), and at least one must run. FLIP-147,
/// simplified to whole vertices: a running task is triggered when none of
/// its upstream vertices has a task that is not finished — sources while
/// they run, and once every source finished, the running tasks right
/// below the finished part of the graph. Flink refines this per channel
/// (a pointwise edge can make a task a trigger target while its vertex's
/// siblings are not); here a partly finished upstream vertex still sends
/// barriers from its running subtasks.
pub fn calculate(
    plan: &TasksPlan,
    status: &BTreeMap<TaskId, TaskStatus>,
) -> Result<CheckpointPlan, CheckpointFailureReason> {
    let st = |t: TaskId| status.get(&t).copied().unwrap_or(TaskStatus::NotRunning);
    let mut to_wait = BTreeMap::new();
    let mut finished = BTreeSet::new();
    for t in plan.tasks() {
        match st(t) {
            TaskStatus::NotRunning => {
                return Err(CheckpointFailureReason::NotAllRequiredTasksRunning);
            }
            TaskStatus::Running { attempt } => {
                to_wait.insert(t, attempt);
            }
            TaskStatus::Finished => {
                finished.insert(t);
            }
        }
    }
    if to_wait.is_empty() {
        return Err(CheckpointFailureReason::NotAllRequiredTasksRunning);
    }
    let vertex_finished: Vec<bool> = plan
        .vertices
        .iter()
        .enumerate()
        .map(|(v, vp)| (0..vp.parallelism).all(|s| finished.contains(&TaskId::new(v, s))))
        .collect();
    let to_trigger = to_wait
        .iter()
        .filter(|(t, _)| {
            plan.vertices[t.vertex]
                .inputs
                .iter()
                .all(|&u| vertex_finished.get(u).copied().unwrap_or(true))
        })
        .map(|(&task, &attempt)| TaskAttempt { task, attempt })
        .collect();
    Ok(CheckpointPlan {
        to_trigger,
        to_wait,
        finished,
    })
}

//! Source reuse, Flink's `table.optimizer.reuse-source-enabled`: fragments
//! that scan the same files run as one task that reads them once and hands
//! every batch to each fragment, as a source chained to several consumers.
//!
//! At planning, [`reuse_groups`] groups fragments whose scans read, partition
//! for partition, the same CSV files with the same options
//! (whatever columns and filters each has), that do not feed each other and
//! run at the same parallelism. In a task, [`crate::exec::shared_scan::share_scans`] reads the scans
//! that are the same for that subtask once, with the union of their columns
//! and the disjunction of their filters; each consumer keeps its own columns
//! and applies its own filters on top. The pieces of one scan meet in
//! [`crate::exec::shared_scan::SharedScanExec`] leaves that hand out one stream's batches.
//!
//! Knows plans only: which task runs a group and where its outputs go is
//! the job's business (`job::graph`).

use crate::exec::shared_scan::{scan_key, shareable};
use crate::inspect::scan_bytes;
use crate::planning::split::StagePlan;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::union::{InterleaveExec, UnionExec};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Scans of at least `min_bytes` that `plan` reads partition for partition
/// (not whole, as under a build side kept in the fragment), by key.
fn partitioned_scan_keys(
    plan: &Arc<dyn ExecutionPlan>,
    parallelism: usize,
    min_bytes: u64,
) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    let mut stack = vec![Arc::clone(plan)];
    while let Some(node) = stack.pop() {
        if node.is::<CoalescePartitionsExec>() {
            continue;
        }
        if let Some(config) = shareable(&node) {
            if node.output_partitioning().partition_count() == parallelism
                && scan_bytes(config) >= min_bytes
                && let Some(k) = scan_key(config)
            {
                keys.push(k);
            }
            continue;
        }
        stack.extend(node.children().into_iter().cloned());
    }
    keys
}

fn has_union(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let mut found = false;
    let _ = plan.apply(|n| {
        found = n.is::<UnionExec>() || n.is::<InterleaveExec>();
        Ok(if found {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    found
}

/// Stages that run as one task, reading their common scans once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReuseGroup {
    /// Ascending stage ids.
    pub stages: Vec<usize>,
    /// Every stage emits at most one row per subtask (a scalar aggregate),
    /// so no output can hold the task up and its exchanges may stay
    /// pipelined; otherwise they are blocking, because the outputs meet
    /// again downstream and a consumer reading one of them first must not
    /// wait for a task stuck on a full other one.
    pub small_outputs: bool,
}

/// Whether `plan` emits at most one row: an aggregate without grouping,
/// maybe under a projection.
fn emits_one_row(plan: &Arc<dyn ExecutionPlan>) -> bool {
    if let Some(a) = plan.downcast_ref::<AggregateExec>() {
        return a.group_expr().is_empty();
    }
    if plan.is::<ProjectionExec>() {
        return plan.children().first().is_some_and(|c| emits_one_row(c));
    }
    false
}

/// Groups of two or more stages (ascending ids) that read the same files
/// (at least `min_bytes` of them) partition for partition and may run as
/// one task: none is the last stage, reads under a union or writes files,
/// none feeds another (even through other groups), and a task reads at
/// most 255 inputs.
pub fn reuse_groups(plan: &StagePlan, min_bytes: u64) -> Vec<ReuseGroup> {
    let root = plan.root();
    let mut by_key: BTreeMap<Vec<u8>, BTreeSet<usize>> = BTreeMap::new();
    for (id, s) in plan.stages.iter().enumerate() {
        if id == root || has_union(&s.plan) || crate::formats::staging::writes_files(&s.plan) {
            continue;
        }
        for key in partitioned_scan_keys(&s.plan, s.parallelism, min_bytes) {
            by_key.entry(key).or_default().insert(id);
        }
    }
    // Stages sharing any scan end up in one candidate (union-find).
    let mut parent: Vec<usize> = (0..plan.stages.len()).collect();
    fn find(parent: &mut [usize], x: usize) -> usize {
        let mut r = x;
        while parent[r] != r {
            r = parent[r];
        }
        parent[x] = r;
        r
    }
    for stages in by_key.values().filter(|s| s.len() >= 2) {
        let mut it = stages.iter();
        if let Some(&first) = it.next() {
            for &other in it {
                let (a, b) = (find(&mut parent, first), find(&mut parent, other));
                parent[a.max(b)] = a.min(b);
            }
        }
    }
    let mut candidates: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for id in 0..plan.stages.len() {
        let r = find(&mut parent, id);
        candidates.entry(r).or_default().push(id);
    }
    // Each candidate takes its stages one by one, leaving out a stage that
    // would close a cycle (one reading another's output, maybe through
    // other groups) or take the task past 255 inputs.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for c in candidates.into_values().filter(|c| c.len() >= 2) {
        let mut group = vec![c[0]];
        for &s in &c[1..] {
            let inputs: usize = group
                .iter()
                .chain([&s])
                .map(|&m| plan.stages[m].inputs.len())
                .sum();
            if inputs > 255 {
                continue;
            }
            group.push(s);
            groups.push(group.clone());
            let ok = acyclic(plan, &groups);
            groups.pop();
            if !ok {
                group.pop();
            }
        }
        if group.len() >= 2 {
            groups.push(group);
        }
    }
    groups
        .into_iter()
        .map(|stages| ReuseGroup {
            small_outputs: stages.iter().all(|&s| emits_one_row(&plan.stages[s].plan)),
            stages,
        })
        .collect()
}

/// Whether the stage graph with each group as one node has no cycle.
fn acyclic(plan: &StagePlan, groups: &[Vec<usize>]) -> bool {
    let n = plan.stages.len();
    let mut node: Vec<usize> = (0..n).collect();
    for g in groups {
        for &s in g {
            node[s] = g[0];
        }
    }
    let mut edges: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
    for (s, stage) in plan.stages.iter().enumerate() {
        if let Some(c) = stage.consumer {
            if node[s] == node[c] {
                return false;
            }
            edges[node[s]].insert(node[c]);
        }
    }
    // Kahn's algorithm over the nodes in use.
    let used: BTreeSet<usize> = node.iter().copied().collect();
    let mut indegree = vec![0usize; n];
    for &u in &used {
        for &v in &edges[u] {
            indegree[v] += 1;
        }
    }
    let mut ready: Vec<usize> = used.iter().copied().filter(|&u| indegree[u] == 0).collect();
    let mut seen = 0;
    while let Some(u) = ready.pop() {
        seen += 1;
        for &v in &edges[u] {
            indegree[v] -= 1;
            if indegree[v] == 0 {
                ready.push(v);
            }
        }
    }
    seen == used.len()
}

//! The multiple-input operator of Flink: every operator between two
//! exchanges (several joins with their scans) runs as one fragment in one
//! task, which reads its inputs in an order that cannot deadlock: a join's
//! build side before its probe side.
//!
//! [`crate::planning::split`] decides the fragments (with
//! `table.optimizer.multiple-input-enabled` off it cuts each join's
//! pipelined inputs into tasks of their own); this module reads what a
//! fragment is: its inputs in read order ([`read_order`]), the joins fused
//! in it ([`multi_input_operators`]), its Flink-style name
//! ([`stage_name`]), and which of its scans wait for demand because only a
//! probe side reads them ([`read_later`]). The task-side driving of the
//! inputs is DataFusion's own (a hash join polls its build side first).

use crate::exec::exchange::ExchangeReaderExec;
use crate::planning::split::{StagePlan, scan_table};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::{CrossJoinExec, HashJoinExec, NestedLoopJoinExec};
use std::sync::Arc;

/// Per stage: a scan (no inputs) that its consumer reads only on the probe
/// side of a hash join that an empty build side empties (inner, left, semi,
/// left anti), and so may never read: DataFusion collects the build side
/// first and, when it came out empty, never polls the probe side. Such a
/// scan waits for demand (`table.exec.source.start-on-demand`), which its
/// consumer gives once the joins above it saw a build row
/// ([`crate::exec::demand`]) or at its first poll. Every other scan starts at once:
/// its consumer reads it in any case, and scans running side by side keep
/// the cores busy (a cross join of scalar aggregates reads all its inputs).
pub fn read_later(plan: &StagePlan) -> Vec<bool> {
    fn walk(
        node: &Arc<dyn ExecutionPlan>,
        probe: bool,
        later: &mut std::collections::BTreeSet<usize>,
        at_once: &mut std::collections::BTreeSet<usize>,
    ) {
        if let Some(r) = node.downcast_ref::<ExchangeReaderExec>() {
            if probe {
                later.insert(r.stage());
            } else {
                at_once.insert(r.stage());
            }
            return;
        }
        if let Some(j) = crate::inspect::empty_without_build(node) {
            walk(j.left(), probe, later, at_once);
            walk(j.right(), true, later, at_once);
            return;
        }
        for c in node.children() {
            walk(c, probe, later, at_once);
        }
    }
    let (mut later, mut at_once) = Default::default();
    for s in &plan.stages {
        walk(&s.plan, false, &mut later, &mut at_once);
    }
    plan.stages
        .iter()
        .enumerate()
        .map(|(id, s)| s.inputs.is_empty() && later.contains(&id) && !at_once.contains(&id))
        .collect()
}

/// What a stage reads, in plan order: the producing stage of a reader, or
/// a table scanned inside the fragment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageInput {
    Exchange(usize),
    Scan(String),
}

/// Inputs of a fragment and their read order, as Flink's
/// `InputOrderCalculator` derives it: a join's build side (left) is read
/// before anything under its probe side; inputs not ordered by any join
/// share a priority. Returns (inputs, priority of each; 0 = first).
pub fn read_order(plan: &Arc<dyn ExecutionPlan>) -> (Vec<StageInput>, Vec<usize>) {
    fn walk(
        plan: &Arc<dyn ExecutionPlan>,
        inputs: &mut Vec<StageInput>,
        before: &mut Vec<(usize, usize)>,
    ) -> Vec<usize> {
        if let Some(r) = plan.downcast_ref::<ExchangeReaderExec>() {
            inputs.push(StageInput::Exchange(r.stage()));
            return vec![inputs.len() - 1];
        }
        if plan.children().is_empty() {
            if let Some(t) = scan_table(plan) {
                inputs.push(StageInput::Scan(t));
                return vec![inputs.len() - 1];
            }
            return vec![];
        }
        let hash_like = plan.is::<HashJoinExec>()
            || plan.is::<NestedLoopJoinExec>()
            || plan.is::<CrossJoinExec>();
        let groups: Vec<Vec<usize>> = plan
            .children()
            .into_iter()
            .map(|c| walk(c, inputs, before))
            .collect();
        if hash_like && groups.len() == 2 {
            for &a in &groups[0] {
                for &b in &groups[1] {
                    before.push((a, b));
                }
            }
        }
        groups.into_iter().flatten().collect()
    }
    let mut inputs = Vec::new();
    let mut before = Vec::new();
    walk(plan, &mut inputs, &mut before);
    // Longest path from any input that nothing precedes.
    let mut rank = vec![0usize; inputs.len()];
    for _ in 0..inputs.len() {
        let mut changed = false;
        for &(a, b) in &before {
            if rank[b] < rank[a] + 1 {
                rank[b] = rank[a] + 1;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    (inputs, rank)
}

/// Operators with several inputs (joins, unions) in a fragment: with two
/// or more the fragment is a multiple-input operator.
pub fn multi_input_operators(plan: &Arc<dyn ExecutionPlan>) -> usize {
    let own = usize::from(plan.children().len() >= 2);
    own + plan
        .children()
        .into_iter()
        .map(multi_input_operators)
        .sum::<usize>()
}

/// Operator names of a fragment, bottom-up, without plumbing nodes.
pub fn members(plan: &Arc<dyn ExecutionPlan>) -> Vec<String> {
    fn walk(plan: &Arc<dyn ExecutionPlan>, out: &mut Vec<String>) {
        for c in plan.children() {
            walk(c, out);
        }
        let name = plan.name();
        if matches!(
            name,
            "ExchangeReaderExec" | "CoalesceBatchesExec" | "CooperativeExec" | "DataSourceExec"
        ) {
            return;
        }
        let name = name.strip_suffix("Exec").unwrap_or(name);
        let label = match plan.downcast_ref::<HashJoinExec>() {
            Some(hj) => format!("HashJoin[{}, {:?}]", hj.join_type(), hj.partition_mode()),
            None => name.to_string(),
        };
        out.push(label);
    }
    let mut out = Vec::new();
    walk(plan, &mut out);
    out
}

/// Flink-style names: a fragment with one input is its operators bottom-up;
/// with several it is a `MultipleInput` listing its read order and members.
pub fn stage_name(plan: &StagePlan, id: usize) -> String {
    let stage = &plan.stages[id];
    let (inputs, order) = read_order(&stage.plan);
    let members = members(&stage.plan);
    let sources: Vec<String> = inputs
        .iter()
        .filter_map(|i| match i {
            StageInput::Scan(t) => Some(format!("Source: {t}")),
            StageInput::Exchange(_) => None,
        })
        .collect();
    let fused = multi_input_operators(&stage.plan);
    let body = if inputs.len() >= 2 && fused >= 2 {
        let order = order
            .iter()
            .map(|o| o.to_string())
            .collect::<Vec<_>>()
            .join(",");
        format!(
            "MultipleInput(readOrder=[{order}], members=[{}])",
            members.join(", ")
        )
    } else {
        members.join(" -> ")
    };
    match (sources.is_empty(), body.is_empty()) {
        (true, _) => body,
        (false, true) => sources.join(", "),
        (false, false) if stage.inputs.is_empty() && inputs.len() == 1 => {
            format!("{} -> {body}", sources[0])
        }
        (false, false) => format!("{body} [{}]", sources.join(", ")),
    }
}

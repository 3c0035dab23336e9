//! Cuts a DataFusion physical plan into stages: fragments that run as
//! Fluvia tasks, joined by network exchanges.
//!
//! Each exchange DataFusion planned becomes an edge: a hash
//! `RepartitionExec` a HASH edge, a `CoalescePartitionsExec` or
//! `SortPreservingMergeExec` a GLOBAL edge (the merge becomes a sort of the
//! gathered rows), and the gathered build side of a collect-left join a
//! BROADCAST edge. Everything between two exchanges stays one DataFusion
//! fragment: several joins with their scans run in one task, the
//! multiple-input operator of Flink ([`crate::planning::multiple_input`]). With `table.optimizer.multiple-input-enabled`
//! off each join's pipelined inputs are cut into their own tasks behind
//! FORWARD edges, and with chaining off every operator is.
//!
//! Partition `p` of a fragment runs in subtask `p`. Under a `UnionExec` the
//! partitions of the branches follow each other, so a hash edge into a
//! branch starts at that branch's offset.

//!
//! Also here: which stages the adaptive batch scheduler sizes, which inputs
//! may be split when skewed, and a fragment's view for one subtask
//! ([`task_view`]).

use crate::exec::exchange::{ExchangeReaderExec, ReaderFacts};
use crate::inspect::{dynamic_filter_ids, is_join, is_plain_pipeline, partitions};
use crate::planning::source_chaining::SourceChaining;
use datafusion::common::{JoinType, not_impl_err};
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result as DfResult;
use datafusion::physical_expr::{Partitioning, PhysicalExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, PartitionMode,
};
use datafusion::physical_plan::limit::GlobalLimitExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::union::UnionExec;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// How a stage's output reaches its consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Exchange {
    /// Hash-partitioned into `partitions` consecutive consumer subtasks
    /// starting at `offset`.
    Hash { partitions: usize, offset: usize },
    /// Every consumer subtask gets everything (serialised once).
    Broadcast,
    /// Everything to one consumer subtask: `offset` (0 unless the reader
    /// sits under a union branch).
    Global { offset: usize },
    /// Subtask `i` to subtask `offset + i`: one-to-one (FORWARD) when the
    /// parallelisms are equal and the offset is 0, else a direct route
    /// over an all-to-all edge (a pipelined input under a union branch).
    Forward { offset: usize },
}

impl Exchange {
    pub fn name(self) -> &'static str {
        match self {
            Exchange::Hash { .. } => "HASH",
            Exchange::Broadcast => "BROADCAST",
            Exchange::Global { .. } => "GLOBAL",
            Exchange::Forward { .. } => "FORWARD",
        }
    }
}

/// When to cut besides DataFusion's own exchanges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutPolicy {
    /// Only at exchanges: joins and scans between them share one task.
    Exchanges,
    /// Also every pipelined input of a join (multiple-input off).
    Joins,
    /// Also between any two operators (chaining off).
    Everything,
}

/// One fragment.
#[derive(Debug, Clone)]
pub struct Stage {
    pub plan: Arc<dyn ExecutionPlan>,
    pub parallelism: usize,
    pub exchange: Exchange,
    /// Hash expressions of a HASH output, over the plan's schema.
    pub hash_exprs: Vec<Arc<dyn PhysicalExpr>>,
    /// The consuming stage; None for the query's last stage (the sink).
    pub consumer: Option<usize>,
    /// Producing stages, in the order their readers appear in the plan.
    pub inputs: Vec<usize>,
}

/// A plan cut into stages; producers come before their consumers and the
/// last stage produces the query result.
#[derive(Debug, Clone)]
pub struct StagePlan {
    pub stages: Vec<Stage>,
}

impl StagePlan {
    pub fn root(&self) -> usize {
        self.stages.len() - 1
    }
}

fn is_collect_left(plan: &Arc<dyn ExecutionPlan>) -> bool {
    if let Some(hj) = plan.downcast_ref::<HashJoinExec>() {
        return *hj.partition_mode() == PartitionMode::CollectLeft;
    }
    plan.is::<NestedLoopJoinExec>() || plan.is::<CrossJoinExec>()
}

fn with_fetch(plan: Arc<dyn ExecutionPlan>, fetch: Option<usize>) -> Arc<dyn ExecutionPlan> {
    match fetch {
        Some(f) => Arc::new(GlobalLimitExec::new(plan, 0, Some(f))),
        None => plan,
    }
}

struct Splitter {
    stages: Vec<Stage>,
    policy: CutPolicy,
    /// Which build sides stay in their join's fragment.
    chaining: SourceChaining,
    /// Ids of the dynamic filters produced by the joins on the path from
    /// the current fragment's root to the node being visited.
    filters_above: Vec<u64>,
}

/// Whether `plan` (a fragment's part, its cut inputs already exchange
/// readers) reads files: work worth a task of its own beside another.
fn scans(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.is::<DataSourceExec>() || plan.children().into_iter().any(scans)
}

impl Splitter {
    fn cut(
        &mut self,
        plan: Arc<dyn ExecutionPlan>,
        exchange: Exchange,
        hash_exprs: Vec<Arc<dyn PhysicalExpr>>,
        consumer_partitions: usize,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let id = self.stages.len();
        let schema = plan.schema();
        let facts = match exchange {
            // One producer subtask feeds one consumer subtask in order: the
            // partitioning and the order of the rows are kept.
            Exchange::Forward { .. } => ReaderFacts::forwarded(&plan),
            _ if hash_exprs.is_empty() => ReaderFacts::of(&plan, None),
            _ => ReaderFacts::of(&plan, Some(hash_exprs.clone())),
        };
        self.stages.push(Stage {
            parallelism: partitions(&plan),
            plan,
            exchange,
            hash_exprs,
            consumer: None,
            inputs: Vec::new(),
        });
        Ok(Arc::new(ExchangeReaderExec::new(
            id,
            schema,
            consumer_partitions,
            facts,
        )?))
    }

    /// Visits the input of an exchange: the root of another fragment, which
    /// the joins above the exchange cannot reach.
    fn visit_fragment(&mut self, plan: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
        let above = std::mem::take(&mut self.filters_above);
        let out = self.visit(plan);
        self.filters_above = above;
        out
    }

    /// Whether the build side `child` of a broadcast join stays in the
    /// join's fragment, chained into it (see [`SourceChaining`]).
    fn keeps_build(&self, child: &Arc<dyn ExecutionPlan>) -> bool {
        self.policy == CutPolicy::Exchanges && self.chaining.keeps_build(child, &self.filters_above)
    }

    /// A build side that only projects or filters gathered rows (a scalar
    /// subquery's result under its projection) is broadcast by the stage
    /// it gathers from, with those operators moved into that stage: row by
    /// row they give the same rows before the gather as after it. Cut as
    /// it stands it would be a task of its own between the two, one more
    /// task and one more hop for a row or two. Returns the reader of the
    /// broadcast, or `None` if `build` is not such a side.
    fn broadcast_below_gather(
        &mut self,
        build: &Arc<dyn ExecutionPlan>,
    ) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
        let mut chain = Vec::new();
        let mut node = Arc::clone(build);
        loop {
            if let Some(r) = node.downcast_ref::<ExchangeReaderExec>() {
                let stage = r.stage();
                if chain.is_empty()
                    || self.stages[stage].exchange != (Exchange::Global { offset: 0 })
                {
                    return Ok(None);
                }
                let mut plan = Arc::clone(&self.stages[stage].plan);
                for op in chain.into_iter().rev() {
                    plan = replace_children_if_necessary(op, vec![plan])?;
                }
                let facts = ReaderFacts::of(&plan, None);
                let reader = ExchangeReaderExec::new(stage, plan.schema(), 1, facts)?;
                let s = &mut self.stages[stage];
                s.plan = plan;
                s.exchange = Exchange::Broadcast;
                return Ok(Some(Arc::new(reader)));
            }
            // A limit is not row by row: it must see the gathered rows.
            if !row_wise(&node) || node.fetch().is_some() {
                return Ok(None);
            }
            let [input] = node.children()[..] else {
                return Ok(None);
            };
            let input = Arc::clone(input);
            chain.push(node);
            node = input;
        }
    }

    fn visit(&mut self, plan: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
        if let Some(r) = plan.downcast_ref::<RepartitionExec>() {
            let input = self.visit_fragment(Arc::clone(r.input()))?;
            return match r.partitioning() {
                Partitioning::Hash(exprs, n) if !r.preserve_order() => Ok(self.cut(
                    input,
                    Exchange::Hash {
                        partitions: *n,
                        offset: 0,
                    },
                    exprs.clone(),
                    *n,
                )?),
                Partitioning::RoundRobinBatch(n) if partitions(&input) == *n => Ok(input),
                other => not_impl_err!(
                    "the exchange {other} (preserve order: {}) has no distributed form",
                    r.preserve_order()
                ),
            };
        }
        if let Some(c) = plan.downcast_ref::<CoalescePartitionsExec>() {
            let input = self.visit_fragment(Arc::clone(c.input()))?;
            let out = if partitions(&input) == 1 {
                input
            } else {
                self.cut(input, Exchange::Global { offset: 0 }, Vec::new(), 1)?
            };
            return Ok(with_fetch(out, c.fetch()));
        }
        if let Some(s) = plan.downcast_ref::<SortPreservingMergeExec>() {
            let input = self.visit_fragment(Arc::clone(s.input()))?;
            if partitions(&input) == 1 {
                return Ok(with_fetch(input, s.fetch()));
            }
            let reader = self.cut(input, Exchange::Global { offset: 0 }, Vec::new(), 1)?;
            let sort = SortExec::new(s.expr().clone(), reader).with_fetch(s.fetch());
            return Ok(Arc::new(sort));
        }
        let own_partitions = partitions(&plan);
        let collect_left = is_collect_left(&plan);
        // A join without keys of one partition reads both its inputs whole
        // in one task: its build side, then its probe side. DataFusion in
        // one process runs such inputs side by side (each one's exchanges
        // spawn at once); here, when both read files, each becomes a task
        // of its own, so both run while the join waits. q90's two scalar
        // counts over a one-row-group table are such a pair.
        let split_inputs =
            own_partitions == 1 && (plan.is::<CrossJoinExec>() || plan.is::<NestedLoopJoinExec>());
        let aligned_cut = match self.policy {
            CutPolicy::Exchanges => false,
            CutPolicy::Joins => is_join(&plan),
            CutPolicy::Everything => true,
        } && !plan.is::<UnionExec>();
        let produced: Vec<u64> = plan
            .dynamic_expressions_produced()
            .iter()
            .filter_map(|e| e.expression_id())
            .collect();
        let depth = self.filters_above.len();
        self.filters_above.extend(produced);
        let mut children = Vec::new();
        let mut kept_build = false;
        for (i, child) in plan.children().into_iter().enumerate() {
            let is_build = collect_left && i == 0;
            if is_build && self.keeps_build(child) {
                // Read whole by every subtask of this fragment (task_view).
                kept_build = true;
                children.push(Arc::clone(child));
                continue;
            }
            let mut child = self.visit(Arc::clone(child))?;
            if is_build {
                if let Some(r) = child.downcast_ref::<ExchangeReaderExec>() {
                    // The gathered build side goes to every probe subtask.
                    let stage = r.stage();
                    self.stages[stage].exchange = Exchange::Broadcast;
                } else if own_partitions > 1 {
                    child = match self.broadcast_below_gather(&child)? {
                        Some(reader) => reader,
                        // A build side of one partition (a small scan) runs
                        // once and is broadcast, as Flink plans it, rather
                        // than being re-read by every probe subtask.
                        None => self.cut(child, Exchange::Broadcast, Vec::new(), 1)?,
                    };
                }
            } else if aligned_cut
                && partitions(&child) == own_partitions
                && !child.is::<ExchangeReaderExec>()
            {
                child = self.cut(
                    child,
                    Exchange::Forward { offset: 0 },
                    Vec::new(),
                    own_partitions,
                )?;
            }
            children.push(child);
        }
        if split_inputs && !kept_build && children.len() == 2 && children.iter().all(scans) {
            let probe = children.pop();
            let build = children.pop();
            if let (Some(build), Some(probe)) = (build, probe) {
                children = vec![
                    self.cut(build, Exchange::Broadcast, Vec::new(), 1)?,
                    self.cut(probe, Exchange::Forward { offset: 0 }, Vec::new(), 1)?,
                ];
            }
        }
        self.filters_above.truncate(depth);
        replace_children_if_necessary(plan, children)
    }
}

/// Whether `plan` reads an exchange below a union (or interleave): its
/// subtasks then read only the inputs of their own branch until they end.
pub fn reads_under_union(plan: &Arc<dyn ExecutionPlan>) -> bool {
    fn reads(plan: &Arc<dyn ExecutionPlan>) -> bool {
        plan.is::<ExchangeReaderExec>() || plan.children().into_iter().any(reads)
    }
    use datafusion::physical_plan::union::InterleaveExec;
    if (plan.is::<UnionExec>() || plan.is::<InterleaveExec>()) && reads(plan) {
        return true;
    }
    plan.children().into_iter().any(reads_under_union)
}

/// Records, for the readers of `consumer`, which stage they read and at
/// which partition offset.
fn connect(plan: &Arc<dyn ExecutionPlan>, offset: usize, consumer: usize, stages: &mut [Stage]) {
    if let Some(r) = plan.downcast_ref::<ExchangeReaderExec>() {
        let producer = &mut stages[r.stage()];
        producer.consumer = Some(consumer);
        if let Exchange::Hash { offset: o, .. }
        | Exchange::Global { offset: o }
        | Exchange::Forward { offset: o } = &mut producer.exchange
        {
            *o = offset;
        }
        stages[consumer].inputs.push(r.stage());
        return;
    }
    let mut o = offset;
    let union = plan.is::<UnionExec>();
    for child in plan.children() {
        connect(child, o, consumer, stages);
        if union {
            o += partitions(child);
        }
    }
}

/// Cuts `plan` into stages; `chaining` keeps some broadcast build sides
/// in their consumer's fragment (see [`SourceChaining`]).
pub fn split(
    plan: Arc<dyn ExecutionPlan>,
    policy: CutPolicy,
    chaining: SourceChaining,
) -> DfResult<StagePlan> {
    let mut s = Splitter {
        stages: Vec::new(),
        policy,
        chaining,
        filters_above: Vec::new(),
    };
    let root = s.visit(plan)?;
    let parallelism = partitions(&root);
    s.stages.push(Stage {
        plan: root,
        parallelism,
        exchange: if parallelism == 1 {
            Exchange::Forward { offset: 0 }
        } else {
            Exchange::Global { offset: 0 }
        },
        hash_exprs: Vec::new(),
        consumer: None,
        inputs: Vec::new(),
    });
    for id in 0..s.stages.len() {
        let plan = Arc::clone(&s.stages[id].plan);
        connect(&plan, 0, id, &mut s.stages);
    }
    Ok(StagePlan { stages: s.stages })
}

/// Stages whose parallelism the adaptive batch scheduler may decide: a
/// fragment that only reads exchanges (no scan, values or union: the
/// operators whose partition index picks data), planned at the query's
/// parallelism, whose inputs are hash exchanges over all of its planned
/// partitions, broadcasts, or one-to-one forwards. Stages joined by forward
/// edges share one parallelism, so a group is adaptive only as a whole,
/// and only if one of its members reads a hash exchange (else there is
/// nothing to balance).
pub fn adaptive_stages(plan: &StagePlan) -> Vec<bool> {
    fn reads_only_exchanges(plan: &Arc<dyn ExecutionPlan>) -> bool {
        if plan.is::<ExchangeReaderExec>() {
            return true;
        }
        let children = plan.children();
        !children.is_empty()
            && !plan.is::<UnionExec>()
            && children.into_iter().all(reads_only_exchanges)
    }
    let stages = &plan.stages;
    let n = stages.len();
    let planned = stages.iter().map(|s| s.parallelism).max().unwrap_or(1);
    let forward = |producer: usize| {
        let p = &stages[producer];
        p.exchange == (Exchange::Forward { offset: 0 })
            && p.consumer
                .is_some_and(|c| stages[c].parallelism == p.parallelism)
    };
    let mut hash_input = vec![false; n];
    let eligible: Vec<bool> = stages
        .iter()
        .enumerate()
        .map(|(id, s)| {
            let inputs_ok = !s.inputs.is_empty()
                && s.inputs.iter().all(|&i| match stages[i].exchange {
                    Exchange::Hash { partitions, offset } => {
                        hash_input[id] = true;
                        offset == 0 && partitions == s.parallelism
                    }
                    Exchange::Broadcast => true,
                    Exchange::Forward { .. } => forward(i),
                    Exchange::Global { .. } => false,
                });
            // A forward output must be one-to-one into the stage's group: a
            // direct route (union offset) picks consumer subtasks by index.
            let output_ok = !matches!(s.exchange, Exchange::Forward { .. }) || forward(id);
            planned > 1
                && s.parallelism == planned
                && inputs_ok
                && output_ok
                && reads_only_exchanges(&s.plan)
        })
        .collect();
    // Forward groups: union-find over one-to-one edges, sink edge aside.
    let mut group: Vec<usize> = (0..n).collect();
    fn find(g: &mut [usize], x: usize) -> usize {
        let mut r = x;
        while g[r] != r {
            r = g[r];
        }
        g[x] = r;
        r
    }
    for (id, s) in stages.iter().enumerate() {
        if let Some(c) = s.consumer
            && forward(id)
        {
            let (a, b) = (find(&mut group, id), find(&mut group, c));
            group[a] = b;
        }
    }
    let roots: Vec<usize> = (0..n).map(|i| find(&mut group, i)).collect();
    (0..n)
        .map(|i| {
            let members = || (0..n).filter(|&j| roots[j] == roots[i]);
            members().all(|j| eligible[j]) && members().any(|j| hash_input[j])
        })
        .collect()
}

/// Whether `plan` works row by row: a projection or a filter.
pub(crate) fn row_wise(plan: &Arc<dyn ExecutionPlan>) -> bool {
    use datafusion::physical_plan::filter::FilterExec;
    use datafusion::physical_plan::projection::ProjectionExec;
    plan.is::<ProjectionExec>() || plan.is::<FilterExec>()
}

/// Per input of `stage` (in `stage.inputs` order): whether a skewed
/// subpartition of it may be split across subtasks (FLIP-475). Only the two
/// hash sides of one partitioned hash join, under operators that do not
/// depend on how rows are partitioned, and only the sides the join type
/// allows: splitting a side gives each of its rows all of the other side's
/// rows of that key once, so a side may be split when the join emits
/// nothing per row of the *other* side alone (INNER: either; LEFT, semi,
/// anti, mark: left; the RIGHT kinds: right).
pub fn splittable_inputs(stage: &Stage) -> Vec<bool> {
    use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};

    let none = vec![false; stage.inputs.len()];
    // A one-to-one consumer keeps relying on this stage's partitioning.
    if matches!(stage.exchange, Exchange::Forward { .. }) {
        return none;
    }
    fn reader_below(plan: &Arc<dyn ExecutionPlan>) -> Option<usize> {
        if let Some(r) = plan.downcast_ref::<ExchangeReaderExec>() {
            return Some(r.stage());
        }
        match plan.children().as_slice() {
            [only] if row_wise(plan) => reader_below(only),
            _ => None,
        }
    }
    let mut node = Arc::clone(&stage.plan);
    loop {
        if let Some(hj) = node.downcast_ref::<HashJoinExec>() {
            if *hj.partition_mode() != PartitionMode::Partitioned {
                return none;
            }
            let (Some(left), Some(right)) = (reader_below(hj.left()), reader_below(hj.right()))
            else {
                return none;
            };
            let jt = *hj.join_type();
            let left_ok = matches!(
                jt,
                JoinType::Inner
                    | JoinType::Left
                    | JoinType::LeftSemi
                    | JoinType::LeftAnti
                    | JoinType::LeftMark
            );
            let right_ok = matches!(
                jt,
                JoinType::Inner
                    | JoinType::Right
                    | JoinType::RightSemi
                    | JoinType::RightAnti
                    | JoinType::RightMark
            );
            return stage
                .inputs
                .iter()
                .map(|&i| (i == left && left_ok) || (i == right && right_ok))
                .collect();
        }
        let partial = node
            .downcast_ref::<AggregateExec>()
            .is_some_and(|a| *a.mode() == AggregateMode::Partial);
        let next = match node.children().as_slice() {
            [only] if row_wise(&node) || partial => Arc::clone(only),
            _ => return none,
        };
        node = next;
    }
}

/// The table a scan reads: the folder (or file stem) of its first file.
pub fn scan_table(plan: &Arc<dyn ExecutionPlan>) -> Option<String> {
    let ds = plan.downcast_ref::<DataSourceExec>()?;
    let config = ds.data_source().downcast_ref::<FileScanConfig>()?;
    let file = config.file_groups.iter().flat_map(|g| g.iter()).next()?;
    let path = std::path::Path::new(file.object_meta.location.as_ref());
    let parent = path.parent()?.file_name()?.to_str()?.to_string();
    Some(parent)
}

/// The fragment as subtask `p` runs it: a plan of one partition that
/// computes partition `p` of `plan`. Scans keep only their `p`-th file
/// group, a union keeps the branch that holds `p`, readers declare one
/// partition. In one partition, state DataFusion shares between the
/// partitions of an operator (a join's dynamic filter waits for a report
/// from every partition) is complete within the task, so dynamic filters
/// prune the scans of the task's own fragment.
pub fn task_view(plan: &Arc<dyn ExecutionPlan>, p: usize) -> DfResult<Arc<dyn ExecutionPlan>> {
    use datafusion::common::internal_err;
    use datafusion::datasource::physical_plan::FileScanConfigBuilder;
    use datafusion::physical_plan::union::InterleaveExec;

    let n = partitions(plan);
    if p >= n {
        return internal_err!("{} has {n} partitions, not {}", plan.name(), p + 1);
    }
    if let Some(r) = plan.downcast_ref::<ExchangeReaderExec>() {
        return Ok(Arc::new(ExchangeReaderExec::new(
            r.stage(),
            r.schema(),
            1,
            r.facts().clone(),
        )?));
    }
    if let Some(ds) = plan.downcast_ref::<DataSourceExec>() {
        if n == 1 {
            return Ok(Arc::clone(plan));
        }
        let Some(config) = ds.data_source().downcast_ref::<FileScanConfig>() else {
            return internal_err!("a scan of {n} partitions that is not a file scan");
        };
        let group = config.file_groups[p].clone();
        let one = FileScanConfigBuilder::from(config.clone())
            .with_file_groups(vec![group])
            .build();
        return Ok(DataSourceExec::from_data_source(one));
    }
    if plan.is::<UnionExec>() {
        let mut offset = 0;
        for child in plan.children() {
            let k = partitions(child);
            if p < offset + k {
                return task_view(child, p - offset);
            }
            offset += k;
        }
        return internal_err!("union without partition {p}");
    }
    if plan.is::<InterleaveExec>() {
        // Partition p of an interleave is partition p of every input.
        let views = plan
            .children()
            .into_iter()
            .map(|c| task_view(c, p))
            .collect::<DfResult<Vec<_>>>()?;
        let union = UnionExec::try_new(views)?;
        return Ok(Arc::new(CoalescePartitionsExec::new(union)));
    }
    if let Some(c) = plan.downcast_ref::<CoalescePartitionsExec>()
        && is_plain_pipeline(c.input())
    {
        // A build side kept in its consumer's fragment: read whole here.
        // One that reads runtime filters of the joins above starts once its
        // join asks for it, when those filters are complete; others start
        // at once, beside the task's other inputs.
        if dynamic_filter_ids(c.input()).is_empty() {
            return Ok(Arc::clone(plan));
        }
        return Ok(Arc::new(crate::exec::deferred::DeferredExec::new(
            Arc::clone(plan),
        )));
    }
    let collect_left = is_collect_left(plan);
    let children = plan
        .children()
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            if collect_left && i == 0 {
                // Every partition of the join reads the whole build side.
                if partitions(c) != 1 {
                    return internal_err!("a collect-left build side of several partitions");
                }
                task_view(c, 0)
            } else if partitions(c) == n {
                task_view(c, p)
            } else {
                internal_err!(
                    "{} has {n} partitions but its input {} has {}",
                    plan.name(),
                    c.name(),
                    partitions(c)
                )
            }
        })
        .collect::<DfResult<Vec<_>>>()?;
    replace_children_if_necessary(Arc::clone(plan), children)
}

//! The StreamGraph: operators and the edges between them, as written by the
//! user, with Flink's defaults resolved.
//!
//! The API records nodes and edges into a [`StreamGraphBuilder`] with their
//! settings still optional (a parallelism may be set after the edge into the
//! operator was added). [`StreamGraphBuilder::build`] then resolves, in this
//! order: parallelism and max parallelism, slot sharing groups (explicit name,
//! else the common group of all inputs, else `"default"`), and each edge's
//! partitioner (forward when parallelisms are equal, else rebalance; an
//! explicit forward across different parallelism is an error). Cycles and
//! out-of-range parallelism are rejected here, before anything runs.

use fluvia_core::keygroup::{UPPER_BOUND_MAX_PARALLELISM, default_max_parallelism};
use fluvia_core::{ChainingStrategy, ExchangeMode, PartitionerKind, Result, RuntimeMode, plan_err};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Index of a node in its StreamGraph; assigned in creation order, so the same
/// program gives the same ids.
pub type StreamNodeId = usize;

/// The default slot sharing group.
pub const DEFAULT_SLOT_SHARING_GROUP: &str = "default";

/// What the JobManager builds an operator's coordinator from: a kind it
/// knows by name and the kind's config bytes (no user closure crosses).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorSpec {
    pub kind: String,
    pub config: Vec<u8>,
}

/// An operator as the user declared it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamNode {
    pub id: StreamNodeId,
    /// Display name, e.g. `Source: lines` or `Flat Map`.
    pub name: String,
    /// User-assigned stable id (Flink's `uid`), if any.
    pub uid: Option<String>,
    pub parallelism: usize,
    pub max_parallelism: usize,
    /// Whether the user set the parallelism explicitly.
    pub parallelism_configured: bool,
    pub slot_sharing_group: String,
    pub chaining_strategy: ChainingStrategy,
    pub is_source: bool,
    /// Sources only: whether the source ends (decides AUTOMATIC runtime mode).
    pub bounded: bool,
    /// Flink's `SupportsConcurrentExecutionAttempts`: whether two attempts
    /// of one subtask may run at once (speculative execution). Sinks with
    /// side effects say no.
    #[serde(default = "correlated")]
    pub supports_concurrent_attempts: bool,
    /// Number of logical inputs of the operator (0 source, 1, or 2 for connect).
    pub num_inputs: usize,
    /// The operator's JobManager-side half, if it has one (a FLIP-27
    /// source's split enumerator).
    #[serde(default)]
    pub coordinator: Option<CoordinatorSpec>,
    pub in_edges: Vec<usize>,
    pub out_edges: Vec<usize>,
}

/// A connection between two operators.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamEdge {
    pub id: usize,
    pub source: StreamNodeId,
    pub target: StreamNodeId,
    pub partitioner: PartitionerKind,
    /// Whether the partitioner was given explicitly (forward across different
    /// parallelism is only an error when explicit).
    pub partitioner_explicit: bool,
    pub exchange_mode: ExchangeMode,
    /// 0 for one-input operators, 1 or 2 for the inputs of a two-input operator.
    pub type_number: u8,
    /// Flink's `intraInputKeyCorrelated`: records of one key must reach one
    /// subtask. False lets the adaptive batch scheduler split a skewed
    /// subpartition of this input across subtasks (a join side whose join
    /// type allows it).
    #[serde(default = "correlated")]
    pub intra_input_key_correlated: bool,
    /// The side output this edge carries (Flink's `OutputTag` id): the
    /// producer emits its records through `Collector::output`, not as its
    /// main output. `None` for the main output.
    #[serde(default)]
    pub output_tag: Option<String>,
}

fn correlated() -> bool {
    true
}

/// A resolved, validated StreamGraph.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamGraph {
    pub job_name: String,
    pub nodes: Vec<StreamNode>,
    pub edges: Vec<StreamEdge>,
    pub chaining_enabled: bool,
    pub runtime_mode: RuntimeMode,
}

impl StreamGraph {
    pub fn node(&self, id: StreamNodeId) -> &StreamNode {
        &self.nodes[id]
    }

    pub fn edge(&self, id: usize) -> &StreamEdge {
        &self.edges[id]
    }

    pub fn sources(&self) -> impl Iterator<Item = &StreamNode> {
        self.nodes.iter().filter(|n| n.is_source)
    }

    /// AUTOMATIC resolves to BATCH when every source is bounded.
    pub fn effective_runtime_mode(&self) -> RuntimeMode {
        match self.runtime_mode {
            RuntimeMode::Automatic => {
                if self.sources().all(|s| s.bounded) {
                    RuntimeMode::Batch
                } else {
                    RuntimeMode::Streaming
                }
            }
            m => m,
        }
    }

    /// A stable hash of the graph's shape and settings: two processes that
    /// built the same program get the same fingerprint.
    pub fn fingerprint(&self) -> u128 {
        let mut h = fluvia_core::StableHasher::new();
        for n in &self.nodes {
            h.write_str(&n.name)
                .write_u64(n.parallelism as u64)
                .write_u64(n.max_parallelism as u64)
                .write_u64(n.parallelism_configured as u64)
                .write_str(n.uid.as_deref().unwrap_or(""));
        }
        for e in &self.edges {
            h.write_u64(e.source as u64)
                .write_u64(e.target as u64)
                .write_str(e.partitioner.ship_strategy_name())
                .write_u64(e.type_number as u64);
        }
        h.finish128()
    }
}

#[derive(Debug, Clone)]
struct NodeSpec {
    name: String,
    uid: Option<String>,
    parallelism: Option<usize>,
    max_parallelism: Option<usize>,
    slot_sharing_group: Option<String>,
    chaining_strategy: ChainingStrategy,
    is_source: bool,
    bounded: bool,
    num_inputs: usize,
    supports_concurrent_attempts: bool,
    coordinator: Option<CoordinatorSpec>,
}

#[derive(Debug, Clone)]
struct EdgeSpec {
    source: StreamNodeId,
    target: StreamNodeId,
    partitioner: Option<PartitionerKind>,
    exchange_mode: ExchangeMode,
    type_number: u8,
    intra_input_key_correlated: bool,
    output_tag: Option<String>,
}

/// Records nodes and edges with optional settings; [`build`](Self::build)
/// resolves and validates them.
#[derive(Debug, Clone)]
pub struct StreamGraphBuilder {
    job_name: String,
    nodes: Vec<NodeSpec>,
    edges: Vec<EdgeSpec>,
    pub default_parallelism: usize,
    /// Whether the user chose `default_parallelism` (`env.set_parallelism`,
    /// `-p`): then every operator's parallelism counts as set, and the
    /// adaptive batch scheduler keeps it.
    pub default_parallelism_configured: bool,
    /// 0: derive per operator from its parallelism.
    pub default_max_parallelism: usize,
    pub chaining_enabled: bool,
    pub runtime_mode: RuntimeMode,
}

impl StreamGraphBuilder {
    pub fn new(job_name: impl Into<String>) -> Self {
        StreamGraphBuilder {
            job_name: job_name.into(),
            nodes: Vec::new(),
            edges: Vec::new(),
            default_parallelism: 1,
            default_parallelism_configured: false,
            default_max_parallelism: 0,
            chaining_enabled: true,
            runtime_mode: RuntimeMode::Automatic,
        }
    }

    pub fn set_job_name(&mut self, name: impl Into<String>) {
        self.job_name = name.into();
    }

    /// Adds a source node.
    pub fn add_source(&mut self, name: impl Into<String>, bounded: bool) -> StreamNodeId {
        self.push_node(name.into(), true, bounded, 0, ChainingStrategy::Head)
    }

    /// Adds an operator node with `num_inputs` logical inputs (1 or 2).
    pub fn add_operator(&mut self, name: impl Into<String>, num_inputs: usize) -> StreamNodeId {
        self.push_node(
            name.into(),
            false,
            false,
            num_inputs,
            ChainingStrategy::Always,
        )
    }

    fn push_node(
        &mut self,
        name: String,
        is_source: bool,
        bounded: bool,
        num_inputs: usize,
        chaining_strategy: ChainingStrategy,
    ) -> StreamNodeId {
        self.nodes.push(NodeSpec {
            name,
            uid: None,
            parallelism: None,
            max_parallelism: None,
            slot_sharing_group: None,
            chaining_strategy,
            is_source,
            bounded,
            num_inputs,
            supports_concurrent_attempts: true,
            coordinator: None,
        });
        self.nodes.len() - 1
    }

    /// Adds an edge; `partitioner: None` means "let Flink's default rule decide".
    /// Returns the edge id.
    pub fn add_edge(
        &mut self,
        source: StreamNodeId,
        target: StreamNodeId,
        partitioner: Option<PartitionerKind>,
        exchange_mode: ExchangeMode,
        type_number: u8,
    ) -> usize {
        self.edges.push(EdgeSpec {
            source,
            target,
            partitioner,
            exchange_mode,
            type_number,
            intra_input_key_correlated: true,
            output_tag: None,
        });
        self.edges.len() - 1
    }

    /// Makes edge `edge` carry the producer's side output `tag` instead of
    /// its main output.
    pub fn set_output_tag(&mut self, edge: usize, tag: &str) {
        if let Some(e) = self.edges.get_mut(edge) {
            e.output_tag = Some(tag.to_string());
        }
    }

    /// Marks edge `edge` as one whose skewed subpartitions may be split
    /// across subtasks (`false`), see [`StreamEdge::intra_input_key_correlated`].
    pub fn set_intra_input_key_correlated(&mut self, edge: usize, correlated: bool) {
        if let Some(e) = self.edges.get_mut(edge) {
            e.intra_input_key_correlated = correlated;
        }
    }

    pub fn node_name(&self, id: StreamNodeId) -> &str {
        &self.nodes[id].name
    }

    pub fn node_parallelism(&self, id: StreamNodeId) -> Option<usize> {
        self.nodes[id].parallelism
    }

    pub fn set_name(&mut self, id: StreamNodeId, name: impl Into<String>) {
        self.nodes[id].name = name.into();
    }
    pub fn set_uid(&mut self, id: StreamNodeId, uid: impl Into<String>) {
        self.nodes[id].uid = Some(uid.into());
    }
    pub fn set_parallelism(&mut self, id: StreamNodeId, p: usize) {
        self.nodes[id].parallelism = Some(p);
    }
    /// Whether attempts of this operator may run concurrently (speculative
    /// execution); true unless said otherwise.
    pub fn set_supports_concurrent_attempts(&mut self, id: StreamNodeId, supports: bool) {
        self.nodes[id].supports_concurrent_attempts = supports;
    }

    /// Gives the operator a coordinator on the JobManager.
    pub fn set_coordinator(&mut self, id: StreamNodeId, spec: CoordinatorSpec) {
        self.nodes[id].coordinator = Some(spec);
    }

    pub fn set_max_parallelism(&mut self, id: StreamNodeId, p: usize) {
        self.nodes[id].max_parallelism = Some(p);
    }
    pub fn set_slot_sharing_group(&mut self, id: StreamNodeId, g: impl Into<String>) {
        self.nodes[id].slot_sharing_group = Some(g.into());
    }
    pub fn set_chaining_strategy(&mut self, id: StreamNodeId, s: ChainingStrategy) {
        self.nodes[id].chaining_strategy = s;
    }

    /// Resolves defaults and validates; every error names the operator.
    pub fn build(&self) -> Result<StreamGraph> {
        if self.default_parallelism == 0 {
            return plan_err!("the default parallelism must be at least 1");
        }
        if self.default_max_parallelism > UPPER_BOUND_MAX_PARALLELISM {
            return plan_err!(
                "the max parallelism {} is above the upper bound {}",
                self.default_max_parallelism,
                UPPER_BOUND_MAX_PARALLELISM
            );
        }
        let mut in_edges = vec![Vec::new(); self.nodes.len()];
        let mut out_edges = vec![Vec::new(); self.nodes.len()];
        for (i, e) in self.edges.iter().enumerate() {
            if e.source >= self.nodes.len() || e.target >= self.nodes.len() {
                return plan_err!("edge {i} references an unknown operator");
            }
            out_edges[e.source].push(i);
            in_edges[e.target].push(i);
        }
        let order = topological_order(self.nodes.len(), &self.edges).ok_or_else(|| {
            let names = cycle_members(self.nodes.len(), &self.edges)
                .into_iter()
                .map(|n| format!("'{}'", self.nodes[n].name))
                .collect::<Vec<_>>()
                .join(", ");
            fluvia_core::FluviaError::Plan(format!(
                "the job graph has a cycle through {names}; Fluvia jobs must be acyclic"
            ))
        })?;

        let mut nodes: Vec<StreamNode> = Vec::with_capacity(self.nodes.len());
        for (id, spec) in self.nodes.iter().enumerate() {
            let parallelism = spec.parallelism.unwrap_or(self.default_parallelism);
            if parallelism == 0 {
                return plan_err!(
                    "the parallelism of operator '{}' must be at least 1",
                    spec.name
                );
            }
            let max_parallelism = match spec.max_parallelism {
                Some(m) => m,
                None if self.default_max_parallelism > 0 => self.default_max_parallelism,
                None => default_max_parallelism(parallelism),
            };
            if max_parallelism == 0 || max_parallelism > UPPER_BOUND_MAX_PARALLELISM {
                return plan_err!(
                    "the max parallelism {} of operator '{}' must be in 1..={}",
                    max_parallelism,
                    spec.name,
                    UPPER_BOUND_MAX_PARALLELISM
                );
            }
            if parallelism > max_parallelism {
                return plan_err!(
                    "the parallelism {} of operator '{}' is larger than its max parallelism {}",
                    parallelism,
                    spec.name,
                    max_parallelism
                );
            }
            let expected_inputs = if spec.is_source { 0 } else { spec.num_inputs };
            let got: BTreeSet<u8> = in_edges[id]
                .iter()
                .map(|&e| self.edges[e].type_number)
                .collect();
            if spec.is_source && !in_edges[id].is_empty() {
                return plan_err!("source '{}' cannot have inputs", spec.name);
            }
            if !spec.is_source && in_edges[id].is_empty() {
                return plan_err!("operator '{}' has no input", spec.name);
            }
            if expected_inputs == 2 && got != BTreeSet::from([1, 2]) {
                return plan_err!("two-input operator '{}' needs both inputs", spec.name);
            }
            nodes.push(StreamNode {
                id,
                name: spec.name.clone(),
                uid: spec.uid.clone(),
                parallelism,
                max_parallelism,
                parallelism_configured: spec.parallelism.is_some()
                    || self.default_parallelism_configured,
                slot_sharing_group: String::new(),
                chaining_strategy: spec.chaining_strategy,
                is_source: spec.is_source,
                bounded: spec.bounded,
                supports_concurrent_attempts: spec.supports_concurrent_attempts,
                num_inputs: spec.num_inputs,
                coordinator: spec.coordinator.clone(),
                in_edges: in_edges[id].clone(),
                out_edges: out_edges[id].clone(),
            });
        }

        // Slot sharing groups in topological order so inputs are resolved first.
        for &id in &order {
            let group = match &self.nodes[id].slot_sharing_group {
                Some(g) => g.clone(),
                None => {
                    let input_groups: BTreeSet<&str> = nodes[id]
                        .in_edges
                        .iter()
                        .map(|&e| nodes[self.edges[e].source].slot_sharing_group.as_str())
                        .collect();
                    if input_groups.len() == 1 {
                        input_groups
                            .into_iter()
                            .next()
                            .unwrap_or(DEFAULT_SLOT_SHARING_GROUP)
                            .to_string()
                    } else {
                        DEFAULT_SLOT_SHARING_GROUP.to_string()
                    }
                }
            };
            nodes[id].slot_sharing_group = group;
        }

        let mut edges = Vec::with_capacity(self.edges.len());
        for (i, e) in self.edges.iter().enumerate() {
            let (up, down) = (&nodes[e.source], &nodes[e.target]);
            let partitioner = match e.partitioner {
                None if up.parallelism == down.parallelism => PartitionerKind::Forward,
                None => PartitionerKind::Rebalance,
                Some(PartitionerKind::Forward) if up.parallelism != down.parallelism => {
                    return plan_err!(
                        "Forward partitioning does not allow change of parallelism. \
                         Upstream operation: '{}' parallelism: {}, downstream operation: '{}' \
                         parallelism: {}. You must use another partitioning strategy, such as \
                         rebalance, rescale or shuffle.",
                        up.name,
                        up.parallelism,
                        down.name,
                        down.parallelism
                    );
                }
                Some(p) => p,
            };
            edges.push(StreamEdge {
                id: i,
                source: e.source,
                target: e.target,
                partitioner,
                partitioner_explicit: e.partitioner.is_some(),
                exchange_mode: e.exchange_mode,
                type_number: e.type_number,
                intra_input_key_correlated: e.intra_input_key_correlated,
                output_tag: e.output_tag.clone(),
            });
        }

        Ok(StreamGraph {
            job_name: self.job_name.clone(),
            nodes,
            edges,
            chaining_enabled: self.chaining_enabled,
            runtime_mode: self.runtime_mode,
        })
    }
}

/// Kahn's algorithm; `None` when there is a cycle.
fn topological_order(n: usize, edges: &[EdgeSpec]) -> Option<Vec<StreamNodeId>> {
    let mut indegree = vec![0usize; n];
    let mut out = vec![Vec::new(); n];
    for e in edges {
        indegree[e.target] += 1;
        out[e.source].push(e.target);
    }
    let mut ready: Vec<usize> = (0..n).rev().filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop() {
        order.push(i);
        for &t in &out[i] {
            indegree[t] -= 1;
            if indegree[t] == 0 {
                ready.push(t);
            }
        }
    }
    (order.len() == n).then_some(order)
}

/// Nodes left over by Kahn's algorithm: those on or behind a cycle.
fn cycle_members(n: usize, edges: &[EdgeSpec]) -> Vec<StreamNodeId> {
    let mut indegree = vec![0usize; n];
    for e in edges {
        indegree[e.target] += 1;
    }
    let mut removed = vec![false; n];
    while let Some(i) = (0..n).find(|&i| !removed[i] && indegree[i] == 0) {
        removed[i] = true;
        for e in edges.iter().filter(|e| e.source == i) {
            indegree[e.target] -= 1;
        }
    }
    (0..n).filter(|&i| !removed[i]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_nodes(p_up: usize, p_down: usize, part: Option<PartitionerKind>) -> Result<StreamGraph> {
        let mut b = StreamGraphBuilder::new("t");
        let s = b.add_source("Source: s", true);
        let m = b.add_operator("Map", 1);
        b.set_parallelism(s, p_up);
        b.set_parallelism(m, p_down);
        b.add_edge(s, m, part, ExchangeMode::Undefined, 0);
        b.build()
    }

    #[test]
    fn default_partitioner_is_forward_for_equal_parallelism() {
        let g = two_nodes(2, 2, None).unwrap();
        assert_eq!(g.edges[0].partitioner, PartitionerKind::Forward);
    }

    #[test]
    fn default_partitioner_is_rebalance_for_different_parallelism() {
        let g = two_nodes(2, 3, None).unwrap();
        assert_eq!(g.edges[0].partitioner, PartitionerKind::Rebalance);
    }

    #[test]
    fn explicit_forward_across_parallelism_is_an_error() {
        let err = two_nodes(2, 3, Some(PartitionerKind::Forward))
            .unwrap_err()
            .to_string();
        assert!(err.contains("Forward partitioning does not allow change of parallelism"));
        assert!(err.contains("'Source: s' parallelism: 2"), "{err}");
    }

    #[test]
    fn bad_parallelism_is_an_error_naming_the_operator() {
        let err = two_nodes(1, 0, None).unwrap_err().to_string();
        assert!(err.contains("'Map'") && err.contains("at least 1"), "{err}");
        let mut b = StreamGraphBuilder::new("t");
        let s = b.add_source("Source: s", true);
        b.set_parallelism(s, 300);
        b.set_max_parallelism(s, 128);
        let err = b.build().unwrap_err().to_string();
        assert!(err.contains("larger than its max parallelism 128"), "{err}");
    }

    #[test]
    fn a_cycle_is_rejected_with_its_members() {
        let mut b = StreamGraphBuilder::new("t");
        let s = b.add_source("Source: s", true);
        let a = b.add_operator("A", 1);
        let c = b.add_operator("C", 2);
        b.add_edge(s, c, None, ExchangeMode::Undefined, 1);
        b.add_edge(c, a, None, ExchangeMode::Undefined, 0);
        b.add_edge(a, c, None, ExchangeMode::Undefined, 2);
        let err = b.build().unwrap_err().to_string();
        assert!(
            err.contains("cycle") && err.contains("'A'") && err.contains("'C'"),
            "{err}"
        );
        assert!(!err.contains("'Source: s'"), "{err}");
    }

    #[test]
    fn slot_sharing_group_is_inherited_from_inputs() {
        let mut b = StreamGraphBuilder::new("t");
        let s1 = b.add_source("s1", true);
        let s2 = b.add_source("s2", true);
        let m = b.add_operator("m", 1);
        let u = b.add_operator("u", 1);
        b.set_slot_sharing_group(s1, "g");
        b.add_edge(s1, m, None, ExchangeMode::Undefined, 0);
        b.add_edge(m, u, None, ExchangeMode::Undefined, 0);
        b.add_edge(s2, u, None, ExchangeMode::Undefined, 0);
        let g = b.build().unwrap();
        assert_eq!(g.nodes[s1].slot_sharing_group, "g");
        assert_eq!(g.nodes[m].slot_sharing_group, "g");
        assert_eq!(g.nodes[s2].slot_sharing_group, "default");
        // Inputs disagree: back to "default".
        assert_eq!(g.nodes[u].slot_sharing_group, "default");
    }

    #[test]
    fn automatic_mode_is_batch_only_when_all_sources_are_bounded() {
        let mut b = StreamGraphBuilder::new("t");
        b.add_source("s1", true);
        assert_eq!(
            b.build().unwrap().effective_runtime_mode(),
            RuntimeMode::Batch
        );
        b.add_source("s2", false);
        assert_eq!(
            b.build().unwrap().effective_runtime_mode(),
            RuntimeMode::Streaming
        );
    }
}

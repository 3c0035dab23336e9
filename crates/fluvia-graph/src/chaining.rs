//! StreamGraph → JobGraph with Flink's operator chaining rules
//! (`StreamingJobGraphGenerator`).
//!
//! An edge is chainable when the downstream operator has exactly one input
//! edge and [`is_chainable_input`] holds: chaining is enabled, both operators
//! are in the same slot sharing group, [`are_operators_chainable`] (chaining
//! strategies and equal parallelism), and the partitioner is forward on an
//! edge whose exchange mode is not BATCH. Chains start at every node without a
//! chainable input; each chain becomes a JobVertex named after its members as
//! Flink names it (`A -> B`, `A -> (B, C)`).

use crate::job_graph::{
    ChainedOperator, IntermediateDataSet, JobEdge, JobGraph, JobType, JobVertex, NetworkOutput,
};
use crate::stream_graph::{StreamEdge, StreamGraph, StreamNode, StreamNodeId};
use fluvia_core::{
    ChainingStrategy, Configuration, ExchangeMode, IntermediateDataSetId, JobId, JobVertexId,
    PartitionerKind, Result, ResultPartitionType, RuntimeMode, StableHasher, internal_err,
};

/// `areOperatorsChainable`: chaining strategies and parallelism.
pub fn are_operators_chainable(up: &StreamNode, down: &StreamNode) -> bool {
    let mut chainable = up.chaining_strategy != ChainingStrategy::Never;
    chainable = match down.chaining_strategy {
        ChainingStrategy::Never | ChainingStrategy::Head => false,
        ChainingStrategy::Always => chainable,
        ChainingStrategy::HeadWithSources => chainable && up.is_source,
    };
    // Flink chains operators with different max parallelism by default
    // (`chain-operators-with-different-max-parallelism` = true).
    chainable && up.parallelism == down.parallelism
}

/// `isChainableInput`: everything but the single-input condition.
pub fn is_chainable_input(edge: &StreamEdge, graph: &StreamGraph) -> bool {
    let up = graph.node(edge.source);
    let down = graph.node(edge.target);
    let partitioner_ok =
        edge.partitioner == PartitionerKind::Forward && edge.exchange_mode != ExchangeMode::Batch;
    graph.chaining_enabled
        && up.slot_sharing_group == down.slot_sharing_group
        && are_operators_chainable(up, down)
        && partitioner_ok
}

/// `isChainable`: the downstream operator has this edge as its only input.
pub fn is_chainable(edge: &StreamEdge, graph: &StreamGraph) -> bool {
    graph.node(edge.target).in_edges.len() == 1 && is_chainable_input(edge, graph)
}

/// Flink's result partition type for an edge: an explicit exchange mode wins;
/// otherwise batch jobs block on every exchange (`ALL_EXCHANGES_BLOCKING`)
/// and streaming jobs pipeline.
pub fn result_partition_type(edge: &StreamEdge, job_type: JobType) -> ResultPartitionType {
    match (edge.exchange_mode, job_type) {
        (ExchangeMode::Pipelined, _) => ResultPartitionType::PipelinedBounded,
        (ExchangeMode::Batch, _) => ResultPartitionType::Blocking,
        (ExchangeMode::Undefined, JobType::Batch) => ResultPartitionType::Blocking,
        (ExchangeMode::Undefined, JobType::Streaming) => ResultPartitionType::PipelinedBounded,
    }
}

/// Builds JobGraphs from StreamGraphs.
pub struct JobGraphGenerator<'a> {
    graph: &'a StreamGraph,
    chainable: Vec<bool>,
    node_hashes: Vec<u128>,
}

impl<'a> JobGraphGenerator<'a> {
    pub fn new(graph: &'a StreamGraph) -> Self {
        let chainable = graph.edges.iter().map(|e| is_chainable(e, graph)).collect();
        let node_hashes = stable_node_hashes(graph);
        JobGraphGenerator {
            graph,
            chainable,
            node_hashes,
        }
    }

    /// Whether StreamGraph edge `edge` is chained.
    pub fn is_edge_chained(&self, edge: usize) -> bool {
        self.chainable[edge]
    }

    /// The chained name of the chain rooted at `node`.
    pub fn chained_name(&self, node: StreamNodeId) -> String {
        let n = self.graph.node(node);
        let children: Vec<String> = n
            .out_edges
            .iter()
            .filter(|&&e| self.chainable[e])
            .map(|&e| self.chained_name(self.graph.edge(e).target))
            .collect();
        match children.len() {
            0 => n.name.clone(),
            1 => format!("{} -> {}", n.name, children[0]),
            _ => format!("{} -> ({})", n.name, children.join(", ")),
        }
    }

    pub fn create_job_graph(&self, config: Configuration, object_reuse: bool) -> Result<JobGraph> {
        let g = self.graph;
        let job_type = match g.effective_runtime_mode() {
            RuntimeMode::Batch => JobType::Batch,
            _ => JobType::Streaming,
        };

        // Chain heads: nodes without a chainable input, in node-id order.
        let heads: Vec<StreamNodeId> = g
            .nodes
            .iter()
            .filter(|n| !n.in_edges.iter().any(|&e| self.chainable[e]))
            .map(|n| n.id)
            .collect();

        // node -> (vertex index, operator index in chain)
        let mut placement: Vec<Option<(usize, usize)>> = vec![None; g.nodes.len()];
        let mut vertices: Vec<JobVertex> = Vec::with_capacity(heads.len());
        for &head in &heads {
            let vertex_index = vertices.len();
            let mut members = Vec::new();
            self.collect_members(head, &mut members);
            for (i, &m) in members.iter().enumerate() {
                placement[m] = Some((vertex_index, i));
            }
            let head_node = g.node(head);
            let operators = members
                .iter()
                .map(|&m| ChainedOperator {
                    node_id: m,
                    operator_id: format!("{:032x}", self.node_hashes[m]),
                    name: g.node(m).name.clone(),
                    coordinator: g.node(m).coordinator.clone(),
                    chained_outputs: Vec::new(),
                    network_outputs: Vec::new(),
                    side_outputs: Vec::new(),
                })
                .collect();
            vertices.push(JobVertex {
                id: JobVertexId(self.node_hashes[head]),
                name: self.chained_name(head),
                parallelism: head_node.parallelism,
                max_parallelism: head_node.max_parallelism,
                parallelism_configured: members.iter().any(|&m| g.node(m).parallelism_configured),
                supports_concurrent_attempts: members
                    .iter()
                    .all(|&m| g.node(m).supports_concurrent_attempts),
                slot_sharing_group: head_node.slot_sharing_group.clone(),
                operators,
                inputs: Vec::new(),
                produced_data_sets: Vec::new(),
                is_source: head_node.is_source,
            });
        }

        // Wire chained outputs and network edges, edge by edge in edge order.
        for edge in &g.edges {
            let (Some((up_v, up_op)), Some((down_v, down_op))) =
                (placement[edge.source], placement[edge.target])
            else {
                return internal_err!("edge {} touches an operator outside every chain", edge.id);
            };
            if self.chainable[edge.id] {
                let up = &mut vertices[up_v].operators[up_op];
                match &edge.output_tag {
                    None => up.chained_outputs.push(down_op),
                    Some(tag) => up.side_output_mut(tag).chained_outputs.push(down_op),
                }
                continue;
            }
            if down_op != 0 {
                return internal_err!("non-chained edge {} enters a chain mid-way", edge.id);
            }
            let rpt = result_partition_type(edge, job_type);
            let producer = vertices[up_v].id;
            let mut h = StableHasher::new();
            h.write(&producer.0.to_le_bytes()).write_u64(edge.id as u64);
            let data_set_id = IntermediateDataSetId(h.finish128());
            let data_set_index = vertices[up_v].produced_data_sets.len();
            let consumer = vertices[down_v].id;
            vertices[up_v].produced_data_sets.push(IntermediateDataSet {
                id: data_set_id,
                producer,
                consumer,
                partitioner: edge.partitioner,
                result_partition_type: rpt,
                stream_edge: edge.id,
            });
            let output = NetworkOutput {
                data_set: data_set_index,
                stream_edge: edge.id,
            };
            let up = &mut vertices[up_v].operators[up_op];
            match &edge.output_tag {
                None => up.network_outputs.push(output),
                Some(tag) => up.side_output_mut(tag).network_outputs.push(output),
            }
            vertices[down_v].inputs.push(JobEdge {
                source_data_set: data_set_id,
                source_vertex: producer,
                partitioner: edge.partitioner,
                distribution_pattern: edge.partitioner.distribution_pattern(),
                result_partition_type: rpt,
                type_number: edge.type_number,
                stream_edge: edge.id,
                intra_input_key_correlated: edge.intra_input_key_correlated,
            });
        }

        let vertices = topological_vertices(vertices)?;
        Ok(JobGraph {
            job_id: JobId::generate(),
            name: g.job_name.clone(),
            job_type,
            vertices,
            object_reuse,
            fingerprint: format!("{:032x}", g.fingerprint()),
            config,
        })
    }

    /// Pre-order over chainable out-edges: the head first, then each chained
    /// successor in edge order.
    fn collect_members(&self, node: StreamNodeId, out: &mut Vec<StreamNodeId>) {
        out.push(node);
        for &e in &self.graph.node(node).out_edges {
            if self.chainable[e] {
                self.collect_members(self.graph.edge(e).target, out);
            }
        }
    }
}

/// Stable hash per node: its uid if set, else its id, name and the hashes of
/// its inputs (so the same program gives the same ids in every process).
fn stable_node_hashes(g: &StreamGraph) -> Vec<u128> {
    let mut hashes: Vec<Option<u128>> = vec![None; g.nodes.len()];
    fn hash_of(g: &StreamGraph, id: StreamNodeId, memo: &mut Vec<Option<u128>>) -> u128 {
        if let Some(h) = memo[id] {
            return h;
        }
        let n = g.node(id);
        let mut h = StableHasher::new();
        match &n.uid {
            Some(uid) => {
                h.write_str("uid").write_str(uid);
            }
            None => {
                h.write_str("node").write_u64(id as u64).write_str(&n.name);
                for &e in &n.in_edges {
                    let up = hash_of(g, g.edge(e).source, memo);
                    h.write(&up.to_le_bytes());
                }
            }
        }
        let v = h.finish128();
        memo[id] = Some(v);
        v
    }
    (0..g.nodes.len())
        .map(|i| hash_of(g, i, &mut hashes))
        .collect()
}

/// Orders vertices so producers come before consumers (ties by creation order).
fn topological_vertices(vertices: Vec<JobVertex>) -> Result<Vec<JobVertex>> {
    let n = vertices.len();
    let index_of = |id: JobVertexId| vertices.iter().position(|v| v.id == id);
    let mut indegree = vec![0usize; n];
    let mut consumers = vec![Vec::new(); n];
    for (i, v) in vertices.iter().enumerate() {
        for input in &v.inputs {
            let Some(src) = index_of(input.source_vertex) else {
                return internal_err!("vertex '{}' reads from an unknown vertex", v.name);
            };
            indegree[i] += 1;
            consumers[src].push(i);
        }
    }
    let mut order = Vec::with_capacity(n);
    let mut ready: std::collections::BTreeSet<usize> =
        (0..n).filter(|&i| indegree[i] == 0).collect();
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &c in &consumers[i] {
            indegree[c] -= 1;
            if indegree[c] == 0 {
                ready.insert(c);
            }
        }
    }
    if order.len() != n {
        return internal_err!("the chained job graph has a cycle");
    }
    let mut slots: Vec<Option<JobVertex>> = vertices.into_iter().map(Some).collect();
    Ok(order.into_iter().filter_map(|i| slots[i].take()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream_graph::StreamGraphBuilder;

    /// source -> a -> b, all parallelism 1 unless changed by `tweak`.
    fn line(
        tweak: impl FnOnce(&mut StreamGraphBuilder, [usize; 3], &mut [usize; 2]),
    ) -> StreamGraph {
        let mut b = StreamGraphBuilder::new("job");
        let s = b.add_source("Source: s", true);
        let a = b.add_operator("A", 1);
        let c = b.add_operator("B", 1);
        let mut edges = [0, 0];
        edges[0] = forward(&mut b, s, a);
        edges[1] = forward(&mut b, a, c);
        tweak(&mut b, [s, a, c], &mut edges);
        b.build().unwrap()
    }

    /// A builder with a bounded source "Source: s" and operators named
    /// `names`, of parallelism 1, not connected yet.
    fn source_and<const N: usize>(
        names: [&str; N],
    ) -> (StreamGraphBuilder, StreamNodeId, [StreamNodeId; N]) {
        let mut b = StreamGraphBuilder::new("job");
        let s = b.add_source("Source: s", true);
        let ops = names.map(|name| b.add_operator(name, 1));
        (b, s, ops)
    }

    /// An edge of the default partitioner and exchange mode.
    fn forward(b: &mut StreamGraphBuilder, from: StreamNodeId, to: StreamNodeId) -> usize {
        b.add_edge(from, to, None, ExchangeMode::Undefined, 0)
    }

    /// The streaming JobGraph of `g` with the default configuration.
    fn job_graph(g: &StreamGraph) -> JobGraph {
        JobGraphGenerator::new(g)
            .create_job_graph(Configuration::new(), false)
            .unwrap()
    }

    fn first_edge_chainable(g: &StreamGraph) -> bool {
        is_chainable(&g.edges[0], g)
    }

    #[test]
    fn baseline_is_chainable_and_named_like_flink() {
        let g = line(|_, _, _| {});
        assert!(first_edge_chainable(&g));
        let jg = job_graph(&g);
        assert_eq!(jg.vertices.len(), 1);
        assert_eq!(jg.vertices[0].name, "Source: s -> A -> B");
        assert_eq!(jg.vertices[0].operators.len(), 3);
        assert_eq!(jg.vertices[0].operators[0].chained_outputs, vec![1]);
    }

    #[test]
    fn chaining_disabled_breaks_every_chain() {
        let mut g = line(|_, _, _| {});
        g.chaining_enabled = false;
        assert!(!first_edge_chainable(&g));
    }

    #[test]
    fn different_slot_sharing_groups_do_not_chain() {
        let g = line(|b, [_, a, _], _| b.set_slot_sharing_group(a, "other"));
        assert!(!first_edge_chainable(&g));
    }

    #[test]
    fn never_upstream_does_not_chain() {
        let g = line(|b, [s, _, _], _| b.set_chaining_strategy(s, ChainingStrategy::Never));
        assert!(!first_edge_chainable(&g));
    }

    #[test]
    fn never_or_head_downstream_does_not_chain() {
        for s in [ChainingStrategy::Never, ChainingStrategy::Head] {
            let g = line(|b, [_, a, _], _| b.set_chaining_strategy(a, s));
            assert!(!first_edge_chainable(&g), "{s:?}");
        }
    }

    #[test]
    fn head_with_sources_chains_only_to_a_source() {
        let g = line(|b, [_, a, c], _| {
            b.set_chaining_strategy(a, ChainingStrategy::HeadWithSources);
            b.set_chaining_strategy(c, ChainingStrategy::HeadWithSources);
        });
        assert!(
            is_chainable(&g.edges[0], &g),
            "source -> HEAD_WITH_SOURCES chains"
        );
        assert!(
            !is_chainable(&g.edges[1], &g),
            "non-source -> HEAD_WITH_SOURCES does not"
        );
    }

    /// A source feeding operator `A` over one edge.
    fn source_to_a(partitioner: PartitionerKind, mode: ExchangeMode) -> StreamGraph {
        let mut b = StreamGraphBuilder::new("job");
        let s = b.add_source("Source: s", true);
        let a = b.add_operator("A", 1);
        b.add_edge(s, a, Some(partitioner), mode, 0);
        b.build().unwrap()
    }

    #[test]
    fn non_forward_partitioner_does_not_chain() {
        let g = source_to_a(PartitionerKind::Rebalance, ExchangeMode::Undefined);
        assert!(!first_edge_chainable(&g));
    }

    #[test]
    fn batch_exchange_does_not_chain() {
        let g = source_to_a(PartitionerKind::Forward, ExchangeMode::Batch);
        assert!(!first_edge_chainable(&g));
        // The same edge pipelined chains.
        let g = source_to_a(PartitionerKind::Forward, ExchangeMode::Pipelined);
        assert!(first_edge_chainable(&g));
    }

    #[test]
    fn different_parallelism_does_not_chain() {
        let g = line(|b, [_, a, c], _| {
            b.set_parallelism(a, 2);
            b.set_parallelism(c, 2);
        });
        assert!(!is_chainable(&g.edges[0], &g));
        assert!(is_chainable(&g.edges[1], &g));
    }

    #[test]
    fn two_inputs_do_not_chain() {
        let mut b = StreamGraphBuilder::new("job");
        let s1 = b.add_source("Source: 1", true);
        let s2 = b.add_source("Source: 2", true);
        let u = b.add_operator("Map", 1);
        forward(&mut b, s1, u);
        forward(&mut b, s2, u);
        let g = b.build().unwrap();
        assert!(is_chainable_input(&g.edges[0], &g));
        assert!(!is_chainable(&g.edges[0], &g));
        let jg = job_graph(&g);
        assert_eq!(jg.vertices.len(), 3);
        let map = jg.vertices.iter().find(|v| v.name == "Map").unwrap();
        assert_eq!(map.inputs.len(), 2);
        assert_eq!(map.inputs[0].ship_strategy_name(), "FORWARD");
    }

    #[test]
    fn several_chained_outputs_are_named_in_parentheses() {
        let (mut b, s, [a, x, y, z]) = source_and(["A", "B", "C", "D"]);
        forward(&mut b, s, a);
        forward(&mut b, a, x);
        forward(&mut b, a, y);
        forward(&mut b, y, z);
        let g = b.build().unwrap();
        let jg = job_graph(&g);
        assert_eq!(jg.vertices.len(), 1);
        assert_eq!(jg.vertices[0].name, "Source: s -> A -> (B, C -> D)");
    }

    #[test]
    fn side_output_edges_are_wired_under_their_tag_chained_or_not() {
        let (mut b, s, [p, main, late, keyed]) = source_and(["Process", "Main", "Late", "Keyed"]);
        forward(&mut b, s, p);
        forward(&mut b, p, main);
        let e = forward(&mut b, p, late);
        b.set_output_tag(e, "late");
        let e = b.add_edge(
            p,
            keyed,
            Some(PartitionerKind::Hash),
            ExchangeMode::Undefined,
            0,
        );
        b.set_output_tag(e, "late");
        let g = b.build().unwrap();
        let jg = job_graph(&g);
        let head = &jg.vertices[0];
        let process = &head.operators[1];
        assert_eq!(process.name, "Process");
        assert_eq!(process.chained_outputs.len(), 1, "main output chained");
        assert!(process.network_outputs.is_empty());
        let [side] = process.side_outputs.as_slice() else {
            panic!("one tag: {:?}", process.side_outputs);
        };
        assert_eq!(side.tag, "late");
        assert_eq!(side.chained_outputs.len(), 1, "forward side output chained");
        assert_eq!(
            side.network_outputs.len(),
            1,
            "keyed side output on the network"
        );
        assert_eq!(
            head.produced_data_sets[side.network_outputs[0].data_set].partitioner,
            PartitionerKind::Hash
        );
    }

    #[test]
    fn keyed_exchange_produces_a_hash_edge_and_data_set() {
        let mut b = StreamGraphBuilder::new("job");
        let s = b.add_source("Source: s", true);
        let a = b.add_operator("Flat Map", 1);
        let r = b.add_operator("Keyed Reduce", 1);
        let k = b.add_operator("Sink: out", 1);
        for n in [s, a, r, k] {
            b.set_parallelism(n, 2);
        }
        forward(&mut b, s, a);
        b.add_edge(
            a,
            r,
            Some(PartitionerKind::Hash),
            ExchangeMode::Undefined,
            0,
        );
        forward(&mut b, r, k);
        let g = b.build().unwrap();
        let jg = job_graph(&g);
        assert_eq!(jg.job_type, JobType::Batch);
        assert_eq!(
            jg.vertices
                .iter()
                .map(|v| v.name.as_str())
                .collect::<Vec<_>>(),
            vec!["Source: s -> Flat Map", "Keyed Reduce -> Sink: out"]
        );
        let edge = &jg.vertices[1].inputs[0];
        assert_eq!(edge.ship_strategy_name(), "HASH");
        assert_eq!(edge.result_partition_type, ResultPartitionType::Blocking);
        assert_eq!(edge.source_vertex, jg.vertices[0].id);
        assert_eq!(
            jg.vertices[0].produced_data_sets[0].id,
            edge.source_data_set
        );
        assert_eq!(jg.vertices[0].operators[1].network_outputs.len(), 1);
    }

    #[test]
    fn ids_are_stable_across_builds_and_uid_wins() {
        let g1 = line(|_, _, _| {});
        let g2 = line(|_, _, _| {});
        let a = JobGraphGenerator::new(&g1)
            .create_job_graph(Configuration::new(), false)
            .unwrap();
        let b = JobGraphGenerator::new(&g2)
            .create_job_graph(Configuration::new(), false)
            .unwrap();
        assert_eq!(a.vertices[0].id, b.vertices[0].id);
        assert_eq!(a.fingerprint, b.fingerprint);
        let g3 = line(|b, [s, _, _], _| b.set_uid(s, "my-source"));
        let c = JobGraphGenerator::new(&g3)
            .create_job_graph(Configuration::new(), false)
            .unwrap();
        assert_ne!(a.vertices[0].id, c.vertices[0].id);
    }

    #[test]
    fn job_graph_round_trips_through_json() {
        let g = line(|b, [_, a, _], _| b.set_chaining_strategy(a, ChainingStrategy::Never));
        let jg = JobGraphGenerator::new(&g)
            .create_job_graph(Configuration::new(), true)
            .unwrap();
        let text = serde_json::to_string(&jg).unwrap();
        let back: JobGraph = serde_json::from_str(&text).unwrap();
        assert_eq!(back, jg);
    }
}

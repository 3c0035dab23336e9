//! Checks a JobGraph that arrived as data (from a client, over the network)
//! before anything is built from it: a malformed graph is refused with an
//! error that names the vertex and the problem, never a panic or an
//! arithmetic underflow further down.

use fluvia_core::{FluviaError, Result};
use fluvia_graph::JobGraph;
use std::collections::BTreeSet;

/// Flink's upper bound for max parallelism (key groups).
pub const UPPER_BOUND_MAX_PARALLELISM: usize = 1 << 15;

/// Most input channels a job may have in all (an all-to-all edge between
/// parallelism p and c has p × c): beyond this the ExecutionGraph alone
/// would take gigabytes.
pub const MAX_CHANNELS: usize = 10_000_000;

fn bad(graph: &JobGraph, msg: String) -> FluviaError {
    FluviaError::Plan(format!("invalid job graph '{}': {msg}", graph.name))
}

/// Validates indices, parallelism bounds and edges of `graph`.
pub fn validate_job_graph(graph: &JobGraph) -> Result<()> {
    if graph.vertices.is_empty() {
        return Err(bad(graph, "it has no vertices".into()));
    }
    let mut ids = BTreeSet::new();
    let mut data_sets = BTreeSet::new();
    for (index, v) in graph.vertices.iter().enumerate() {
        let name = &v.name;
        if !ids.insert(v.id) {
            return Err(bad(graph, format!("vertex '{name}' repeats id {}", v.id)));
        }
        if v.parallelism == 0 || v.parallelism > UPPER_BOUND_MAX_PARALLELISM {
            return Err(bad(
                graph,
                format!(
                    "vertex '{name}' has parallelism {}, expected 1..={UPPER_BOUND_MAX_PARALLELISM}",
                    v.parallelism
                ),
            ));
        }
        if v.max_parallelism < v.parallelism || v.max_parallelism > UPPER_BOUND_MAX_PARALLELISM {
            return Err(bad(
                graph,
                format!(
                    "vertex '{name}' has max parallelism {} for parallelism {}, expected \
                     parallelism..={UPPER_BOUND_MAX_PARALLELISM}",
                    v.max_parallelism, v.parallelism
                ),
            ));
        }
        if v.operators.is_empty() {
            return Err(bad(graph, format!("vertex '{name}' has no operators")));
        }
        for (i, op) in v.operators.iter().enumerate() {
            if let Some(c) = op
                .all_chained_outputs()
                .find(|&c| c <= i || c >= v.operators.len())
            {
                return Err(bad(
                    graph,
                    format!(
                        "operator '{}' of vertex '{name}' chains to operator {c}, which is not after \
                         it in the chain of {}",
                        op.name,
                        v.operators.len()
                    ),
                ));
            }
            if let Some(o) = op
                .all_network_outputs()
                .find(|o| o.data_set >= v.produced_data_sets.len())
            {
                return Err(bad(
                    graph,
                    format!(
                        "operator '{}' of vertex '{name}' writes data set {}, but the vertex \
                         produces {}",
                        op.name,
                        o.data_set,
                        v.produced_data_sets.len()
                    ),
                ));
            }
        }
        for ds in &v.produced_data_sets {
            if ds.producer != v.id {
                return Err(bad(
                    graph,
                    format!(
                        "data set {} is listed by vertex '{name}' but names another producer",
                        ds.id
                    ),
                ));
            }
            if !data_sets.insert(ds.id) {
                return Err(bad(graph, format!("data set {} is produced twice", ds.id)));
            }
        }
        for e in &v.inputs {
            let Some(p) = graph.vertex_index(e.source_vertex) else {
                return Err(bad(
                    graph,
                    format!(
                        "vertex '{name}' reads from unknown vertex {}",
                        e.source_vertex
                    ),
                ));
            };
            if p >= index {
                return Err(bad(
                    graph,
                    format!(
                        "vertex '{name}' reads from vertex '{}', which does not come before it \
                         (vertices must be in topological order)",
                        graph.vertices[p].name
                    ),
                ));
            }
            let producer = &graph.vertices[p];
            if !producer
                .produced_data_sets
                .iter()
                .any(|d| d.id == e.source_data_set && d.consumer == v.id)
            {
                return Err(bad(
                    graph,
                    format!(
                        "vertex '{name}' reads data set {} that vertex '{}' does not produce for it",
                        e.source_data_set, producer.name
                    ),
                ));
            }
            // 0 for one input, 1 and 2 for a two-input head, one per input
            // of a multiple-input head (some of which may be chained in).
            let most = (v.inputs.len() + v.operators.len()).max(2);
            if e.type_number as usize > most {
                return Err(bad(
                    graph,
                    format!(
                        "vertex '{name}' has an input of type number {} (at most {most})",
                        e.type_number
                    ),
                ));
            }
        }
    }
    let mut channels = 0usize;
    for v in &graph.vertices {
        for e in &v.inputs {
            let p = graph
                .vertex_index(e.source_vertex)
                .map_or(0, |i| graph.vertices[i].parallelism);
            channels = channels.saturating_add(match e.distribution_pattern {
                fluvia_core::DistributionPattern::AllToAll => p.saturating_mul(v.parallelism),
                fluvia_core::DistributionPattern::Pointwise => p.max(v.parallelism),
            });
        }
    }
    if channels > MAX_CHANNELS {
        return Err(bad(
            graph,
            format!("it needs {channels} input channels, more than the {MAX_CHANNELS} allowed"),
        ));
    }
    // Every produced data set is consumed by an edge.
    for v in &graph.vertices {
        for ds in &v.produced_data_sets {
            let consumed = graph
                .vertex_index(ds.consumer)
                .map(|c| {
                    graph.vertices[c]
                        .inputs
                        .iter()
                        .any(|e| e.source_data_set == ds.id)
                })
                .unwrap_or(false);
            if !consumed {
                return Err(bad(
                    graph,
                    format!("data set {} of vertex '{}' has no consumer", ds.id, v.name),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fluvia_core::{Configuration, ExchangeMode, PartitionerKind};
    use fluvia_graph::{JobGraphGenerator, StreamGraphBuilder};

    fn good() -> JobGraph {
        let mut b = StreamGraphBuilder::new("t");
        let s = b.add_source("Source: s", true);
        let m = b.add_operator("Map", 1);
        b.set_parallelism(s, 2);
        b.set_parallelism(m, 3);
        b.add_edge(
            s,
            m,
            Some(PartitionerKind::Hash),
            ExchangeMode::Undefined,
            0,
        );
        JobGraphGenerator::new(&b.build().unwrap())
            .create_job_graph(Configuration::new(), false)
            .unwrap()
    }

    #[test]
    fn a_built_graph_is_valid() {
        validate_job_graph(&good()).unwrap();
    }

    type Mutation = Box<dyn Fn(&mut JobGraph)>;

    #[test]
    fn crafted_graphs_are_refused_with_a_reason() {
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|g| g.vertices[1].parallelism = 0), "parallelism 0"),
            (
                Box::new(|g| g.vertices[1].max_parallelism = 1),
                "max parallelism 1",
            ),
            (
                Box::new(|g| g.vertices[0].parallelism = 1 << 20),
                "expected 1..=",
            ),
            (Box::new(|g| g.vertices.swap(0, 1)), "topological"),
            (
                Box::new(|g| g.vertices[1].inputs[0].source_data_set.0 ^= 1),
                "does not produce",
            ),
            (
                Box::new(|g| g.vertices[1].inputs[0].type_number = 7),
                "type number 7",
            ),
            (
                Box::new(|g| g.vertices[0].operators.clear()),
                "no operators",
            ),
            (
                Box::new(|g| g.vertices[0].operators[0].chained_outputs.push(0)),
                "chains to operator 0",
            ),
            (
                Box::new(|g| g.vertices[1].inputs.clear()),
                "has no consumer",
            ),
            (Box::new(|g| g.vertices.clear()), "no vertices"),
            (
                Box::new(|g| {
                    g.vertices[0].parallelism = 20_000;
                    g.vertices[0].max_parallelism = 20_000;
                    g.vertices[1].parallelism = 20_000;
                    g.vertices[1].max_parallelism = 20_000;
                }),
                "input channels",
            ),
            (
                Box::new(|g| {
                    let id = g.vertices[0].id;
                    g.vertices[1].id = id;
                }),
                "repeats id",
            ),
        ];
        for (mutate, expected) in cases {
            let mut g = good();
            mutate(&mut g);
            let err = validate_job_graph(&g).unwrap_err().to_string();
            assert!(err.contains(expected), "expected '{expected}' in: {err}");
        }
    }
}

//! Renderings of a JobGraph for people and tools: the JSON of Flink's
//! `/jobs/:id/plan` endpoint, a human-readable listing, and Graphviz DOT.

use crate::job_graph::JobGraph;
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// `/jobs/:id/plan`, shaped as Flink returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonPlan {
    pub jid: String,
    pub name: String,
    #[serde(rename = "type")]
    pub job_type: String,
    pub nodes: Vec<JsonPlanNode>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonPlanNode {
    pub id: String,
    /// -1 while the adaptive batch scheduler has not decided it (as Flink).
    pub parallelism: i64,
    /// The head operator's name.
    pub operator: String,
    /// How the vertex runs its operators.
    pub operator_strategy: String,
    /// The chained name, e.g. `Source: lines -> Flat Map`.
    pub description: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<JsonPlanInput>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonPlanInput {
    pub num: usize,
    pub id: String,
    pub ship_strategy: String,
    pub exchange: String,
}

/// Before it runs: a vertex the adaptive batch scheduler will decide shows
/// -1.
pub fn json_plan(jg: &JobGraph) -> JsonPlan {
    let undecided = undecided(jg);
    let parallelism: Vec<Option<usize>> = jg
        .vertices
        .iter()
        .zip(&undecided)
        .map(|(v, &u)| (!u).then_some(v.parallelism))
        .collect();
    json_plan_with(jg, &parallelism)
}

fn undecided(jg: &JobGraph) -> Vec<bool> {
    match jg.adaptive_vertices() {
        Ok(Some((undecided, _))) => undecided,
        _ => vec![false; jg.vertices.len()],
    }
}

/// The plan with the parallelism each vertex has at runtime (`None`: not
/// decided yet), as the JobManager regenerates it after each decision.
pub fn json_plan_with(jg: &JobGraph, parallelism: &[Option<usize>]) -> JsonPlan {
    JsonPlan {
        jid: jg.job_id.to_string(),
        name: jg.name.clone(),
        job_type: jg.job_type.name().to_string(),
        nodes: jg
            .vertices
            .iter()
            .enumerate()
            .map(|(i, v)| JsonPlanNode {
                id: v.id.to_string(),
                parallelism: parallelism
                    .get(i)
                    .copied()
                    .flatten()
                    .map_or(-1, |p| p as i64),
                operator: v.head().name.clone(),
                operator_strategy: if v.operators.len() > 1 {
                    format!("chain of {} operators", v.operators.len())
                } else {
                    "single operator".to_string()
                },
                description: v.name.clone(),
                inputs: v
                    .inputs
                    .iter()
                    .enumerate()
                    .map(|(num, e)| JsonPlanInput {
                        num,
                        id: e.source_vertex.to_string(),
                        ship_strategy: e.ship_strategy_name().to_string(),
                        exchange: e.result_partition_type.name().to_string(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// A listing for the terminal: one block per vertex with its inputs.
pub fn text_plan(jg: &JobGraph) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Job '{}' ({}): {} operators in {} tasks",
        jg.name,
        jg.job_type.name(),
        jg.num_operators(),
        jg.vertices.len()
    );
    let undecided = undecided(jg);
    for (i, v) in jg.vertices.iter().enumerate() {
        let parallelism = if undecided[i] {
            format!("parallelism decided at runtime (default {})", v.parallelism)
        } else {
            format!("parallelism {}", v.parallelism)
        };
        let _ = writeln!(
            out,
            "[{}] {}\n    {parallelism}, max parallelism {}, slot sharing group '{}'",
            i + 1,
            v.name,
            v.max_parallelism,
            v.slot_sharing_group
        );
        for e in &v.inputs {
            let src = jg.vertex_index(e.source_vertex).map_or(0, |i| i + 1);
            let _ = writeln!(
                out,
                "    <- [{}] {} ({})",
                src,
                e.ship_strategy_name(),
                e.result_partition_type.name()
            );
        }
    }
    out
}

/// Graphviz DOT: one box per vertex, edges labelled with ship strategy and
/// partition type.
pub fn dot_plan(jg: &JobGraph) -> String {
    let escape = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    let mut out = String::new();
    let _ = writeln!(out, "digraph \"{}\" {{", escape(&jg.name));
    let _ = writeln!(
        out,
        "  rankdir=LR;\n  node [shape=box, fontname=\"Helvetica\"];"
    );
    for (i, v) in jg.vertices.iter().enumerate() {
        let _ = writeln!(
            out,
            "  v{} [label=\"{}\\nparallelism {}\"];",
            i,
            escape(&v.name),
            v.parallelism
        );
    }
    for (i, v) in jg.vertices.iter().enumerate() {
        for e in &v.inputs {
            if let Some(src) = jg.vertex_index(e.source_vertex) {
                let _ = writeln!(
                    out,
                    "  v{} -> v{} [label=\"{}\\n{}\"];",
                    src,
                    i,
                    e.ship_strategy_name(),
                    e.result_partition_type.name()
                );
            }
        }
    }
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{JobGraphGenerator, StreamGraphBuilder};
    use fluvia_core::{Configuration, ExchangeMode, PartitionerKind};

    fn job() -> JobGraph {
        let mut b = StreamGraphBuilder::new("wc");
        let s = b.add_source("Source: lines", true);
        let f = b.add_operator("Flat Map", 1);
        let r = b.add_operator("Keyed Reduce", 1);
        b.add_edge(s, f, None, ExchangeMode::Undefined, 0);
        b.add_edge(
            f,
            r,
            Some(PartitionerKind::Hash),
            ExchangeMode::Undefined,
            0,
        );
        let g = b.build().unwrap();
        JobGraphGenerator::new(&g)
            .create_job_graph(Configuration::new(), false)
            .unwrap()
    }

    #[test]
    fn json_plan_has_flinks_shape() {
        let jg = job();
        let v: serde_json::Value = serde_json::to_value(json_plan(&jg)).unwrap();
        assert_eq!(v["type"], "BATCH");
        assert_eq!(v["jid"].as_str().unwrap().len(), 32);
        let nodes = v["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0]["description"], "Source: lines -> Flat Map");
        assert!(nodes[0].get("inputs").is_none());
        let input = &nodes[1]["inputs"][0];
        assert_eq!(input["num"], 0);
        assert_eq!(input["id"], nodes[0]["id"]);
        assert_eq!(input["ship_strategy"], "HASH");
        assert_eq!(input["exchange"], "blocking");
    }

    #[test]
    fn dot_and_text_mention_every_vertex() {
        let jg = job();
        let dot = dot_plan(&jg);
        assert!(dot.starts_with("digraph"));
        assert!(dot.contains("v0 -> v1 [label=\"HASH"));
        let text = text_plan(&jg);
        assert!(text.contains("[2] Keyed Reduce") && text.contains("<- [1] HASH (blocking)"));
    }
}

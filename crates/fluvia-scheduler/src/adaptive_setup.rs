//! Adaptive set-up: whether a job runs under the adaptive batch scheduler
//! and with which settings, and the initialization of each vertex once its
//! parallelism can be decided (Flink's `AdaptiveBatchScheduler`
//! `initializeVerticesIfPossible`). The decisions themselves are
//! [`crate::adaptive`]'s and [`crate::skew`]'s; this module feeds them the
//! bytes the job's producers reported and applies what they return.

use crate::adaptive::{self, BlockingResultInfo, DeciderConfig};
use crate::execution_graph::{SubpartitionRange, SubtaskInput};
use crate::job::{AdaptiveJob, Job};
use crate::skew::{self, SkewConfig};
use fluvia_core::config::options;
use fluvia_core::{ConfigOption, FluviaError, Result, internal_err};
use fluvia_graph::JobGraph;
use std::collections::BTreeMap;

/// Whether the job runs under the adaptive batch scheduler (see
/// [`JobGraph::adaptive_vertices`]), and then its settings and which
/// vertices start undecided.
pub(crate) fn adaptive_plan(graph: &JobGraph) -> Result<Option<(AdaptiveJob, Vec<bool>)>> {
    let Some((undecided, forward_group)) = graph.adaptive_vertices()? else {
        return Ok(None);
    };
    let config = DeciderConfig::from_configuration(&graph.config)?;
    let skew = if strategy_enabled(graph, &options::SKEWED_JOIN_STRATEGY, &["AUTO", "FORCED"])? {
        Some(SkewConfig {
            factor: graph.config.get(&options::SKEWED_JOIN_FACTOR)?,
            threshold: graph.config.get(&options::SKEWED_JOIN_THRESHOLD)?,
        })
    } else {
        None
    };
    let broadcast_threshold = if strategy_enabled(
        graph,
        &options::ADAPTIVE_BROADCAST_JOIN_STRATEGY,
        &["AUTO", "RUNTIME_ONLY"],
    )? {
        Some(graph.config.get(&options::BROADCAST_THRESHOLD)?)
    } else {
        None
    };
    Ok(Some((
        AdaptiveJob {
            config,
            forward_group,
            skew,
            broadcast_threshold,
            group_ranges: BTreeMap::new(),
        },
        undecided,
    )))
}

/// Whether the strategy `option` names (any case) is one of `enabled`
/// rather than NONE; any other value is an error.
fn strategy_enabled(
    graph: &JobGraph,
    option: &ConfigOption<&'static str>,
    enabled: &[&str],
) -> Result<bool> {
    match graph.config.get(option)?.to_ascii_uppercase().as_str() {
        "NONE" => Ok(false),
        s if enabled.contains(&s) => Ok(true),
        other => Err(FluviaError::Config(format!(
            "'{}' is {other}: expected {} or NONE",
            option.key,
            enabled.join(", ")
        ))),
    }
}

/// Initializes vertex `v` if it can be now: a decided one once its
/// producers are initialized, an undecided one once they all finished
/// (Flink's `initializeVerticesIfPossible`). Returns whether it did.
pub(crate) fn try_initialize(job: &mut Job, v: usize, now_ms: u64) -> Result<bool> {
    if job.eg.vertices[v].initialized || !job.eg.producers_initialized(v) {
        return Ok(false);
    }
    let dynamic: Vec<usize> = job
        .eg
        .inputs_of(v)
        .filter(|&r| job.eg.results[r].dynamic)
        .collect();
    let decided = job.eg.vertices[v].parallelism_decided;
    if !decided
        && !dynamic
            .iter()
            .all(|&r| job.vertex_finished(job.eg.results[r].producer))
    {
        return Ok(false);
    }
    let mut inputs = Vec::new();
    if !decided || !dynamic.is_empty() {
        let Some(adaptive) = &job.adaptive else {
            return internal_err!("vertex {v} has dynamic inputs in a static job");
        };
        let infos: Vec<BlockingResultInfo> = dynamic.iter().map(|&r| job.result_info(r)).collect();
        let ejv = &job.eg.vertices[v];
        let group = adaptive.forward_group[v];
        let members: Vec<usize> = (0..job.eg.vertices.len())
            .filter(|&u| adaptive.forward_group[u] == group)
            .collect();
        // The group's parallelism must suit every member (Flink: the
        // smallest max parallelism of the group).
        let max_parallelism = members
            .iter()
            .map(|&u| job.eg.vertices[u].max_parallelism)
            .min()
            .unwrap_or(ejv.max_parallelism);
        let splittable: Vec<bool> = dynamic
            .iter()
            .map(|&r| !job.eg.results[r].intra_input_key_correlated)
            .collect();
        // A join side small enough to broadcast now that its bytes are
        // known (FLIP-470), else a skewed side that may be split
        // (FLIP-475). Only for a vertex alone in its forward group: the
        // irregular slices could not be matched by the other members.
        let may_split = !decided && members.len() == 1 && splittable.iter().any(|&s| s);
        let broadcast = match adaptive.broadcast_threshold {
            Some(threshold) if may_split => skew::decide_broadcast(
                max_parallelism,
                &infos,
                &splittable,
                threshold,
                &adaptive.config,
            )?,
            _ => None,
        };
        let broadcast_input = broadcast.as_ref().map(|(small, _)| *small);
        let skewed = match (&adaptive.skew, broadcast) {
            (_, Some((_, d))) => Some(d),
            (Some(skew), None) if may_split => {
                skew::decide_skewed(max_parallelism, &infos, &splittable, skew, &adaptive.config)?
            }
            _ => None,
        };
        let (parallelism, slices, ranges) = match skewed {
            Some(d) => {
                let slices: Vec<Vec<Vec<SubtaskInput>>> = d
                    .inputs
                    .iter()
                    .map(|subtasks| {
                        subtasks
                            .iter()
                            .map(|list| {
                                list.iter()
                                    .map(|e| SubtaskInput {
                                        partitions: e.partition_range,
                                        subpartitions: e.subpartition_range,
                                    })
                                    .collect()
                            })
                            .collect()
                    })
                    .collect();
                if !d.split.is_empty() {
                    job.skew_splits.push((v, d.split.clone()));
                }
                if let Some(small) = broadcast_input {
                    job.adaptive_broadcasts.push((v, small));
                }
                (d.parallelism, slices, None)
            }
            None => {
                let d = adaptive::decide(
                    max_parallelism,
                    decided.then_some(ejv.parallelism),
                    &infos,
                    &adaptive.config,
                )?;
                // A member decided with its group reads the key groups
                // the group's first decision gave each subtask, so that
                // subtask k of every member holds the same keys.
                let shared = adaptive.group_ranges.get(&group).cloned();
                let mut ranges = None;
                let slices = d
                    .inputs
                    .iter()
                    .zip(&infos)
                    .map(|(jvi, info)| {
                        let keyed = !info.is_broadcast && !info.is_pointwise;
                        let n = info.num_subpartitions(0);
                        let all = SubpartitionRange {
                            start: 0,
                            end: info.num_partitions().saturating_sub(1),
                        };
                        match &shared {
                            Some((sn, r))
                                if keyed && decided && *sn == n && r.len() == d.parallelism =>
                            {
                                r.iter()
                                    .map(|&sub| {
                                        vec![SubtaskInput {
                                            partitions: all,
                                            subpartitions: sub,
                                        }]
                                    })
                                    .collect()
                            }
                            _ => {
                                if keyed && !decided && ranges.is_none() {
                                    ranges = Some((
                                        n,
                                        jvi.subtasks
                                            .iter()
                                            .map(|e| e.subpartition_range)
                                            .collect::<Vec<_>>(),
                                    ));
                                }
                                jvi.subtasks
                                    .iter()
                                    .map(|e| {
                                        vec![SubtaskInput {
                                            partitions: e.partition_range,
                                            subpartitions: e.subpartition_range,
                                        }]
                                    })
                                    .collect()
                            }
                        }
                    })
                    .collect();
                (d.parallelism, slices, ranges)
            }
        };
        if !decided {
            for &u in &members {
                if u == v || !job.eg.vertices[u].parallelism_decided {
                    job.eg.decide_parallelism(u, parallelism)?;
                }
            }
            if let (Some(r), Some(adaptive)) = (ranges, job.adaptive.as_mut()) {
                adaptive.group_ranges.insert(group, r);
            }
        }
        inputs = slices;
    }
    job.eg.initialize(v, &inputs, now_ms)?;
    Ok(true)
}

//! The adaptive batch scheduler inside the [`Scheduler`]: vertices whose
//! parallelism nobody set start undecided, producers write one subpartition
//! per key group of such a consumer, and once the producers finished the
//! consumer gets the parallelism and subpartition ranges the decider draws
//! from the bytes they reported (Flink's `AdaptiveBatchSchedulerTest`).

#![allow(clippy::unwrap_used)]

mod common;

use common::{Driver, Op, conf, graph};
use fluvia_core::PartitionerKind;
use fluvia_core::config::options;
use fluvia_scheduler::{Event, SchedulerConfig, SubpartitionRange};
use std::time::Duration;

/// Flink's `DefaultVertexParallelismAndInputInfosDeciderTest` vector, with
/// the two inputs written by two producers of one result: aggregated bytes
/// [18,27,34,21,14,17,27,33,26,22], 60 bytes per task.
const P0: [u64; 10] = [10, 15, 13, 12, 1, 10, 8, 20, 12, 17];
const P1: [u64; 10] = [8, 12, 21, 9, 13, 7, 19, 13, 14, 5];

/// Source (parallelism 2) -HASH-> Sum (undecided, max parallelism 10),
/// configured by `config`.
fn source_to_sum(config: &[(&str, &str)]) -> fluvia_graph::JobGraph {
    graph(
        &[Op("Source", Some(2), None), Op("Sum", None, Some(10))],
        &[(0, 1, PartitionerKind::Hash)],
        conf(config),
    )
}

/// Source -HASH-> Sum -FORWARD-> `third` (both undecided, max parallelism
/// 10), with `more` edges, 60 bytes per task.
fn forward_group(
    third: &'static str,
    more: &[(usize, usize, PartitionerKind)],
) -> fluvia_graph::JobGraph {
    let edges = [
        (0, 1, PartitionerKind::Hash),
        (1, 2, PartitionerKind::Forward),
    ];
    graph(
        &[
            Op("Source", Some(2), None),
            Op("Sum", None, Some(10)),
            Op(third, None, Some(10)),
        ],
        &[&edges[..], more].concat(),
        conf(&[(options::AUTO_PARALLELISM_AVG_DATA_VOLUME.key, "60")]),
    )
}

#[test]
fn an_undecided_keyed_vertex_gets_its_parallelism_and_balanced_key_group_ranges_from_the_bytes() {
    let jg = source_to_sum(&[(options::AUTO_PARALLELISM_AVG_DATA_VOLUME.key, "60")]);
    assert!(!jg.vertices[1].parallelism_configured);
    let mut d = Driver::start(jg, 8);
    // Undecided: no subtasks yet; producers write one subpartition per key
    // group of the consumer.
    assert!(!d.vertex(1).parallelism_decided);
    assert!(d.vertex(1).subtasks.is_empty());
    let sources = d.deployed.clone();
    assert_eq!(sources.len(), 2);
    for s in &sources {
        assert_eq!(s.outputs[0].num_subpartitions, 10);
        assert_eq!(s.outputs[0].consumer_max_parallelism, 10);
        assert_eq!(s.parallelism, 2);
    }
    d.finish(&sources[0], vec![P0.to_vec()]);
    assert!(
        d.vertex(1).subtasks.is_empty(),
        "decided before all producers finished"
    );
    d.finish(&sources[1], vec![P1.to_vec()]);
    assert!(d.vertex(1).parallelism_decided);
    assert_eq!(d.vertex(1).parallelism, 5);
    let sums = d.collect();
    assert_eq!(sums.len(), 5);
    let expected = [(0, 1), (2, 3), (4, 6), (7, 8), (9, 9)];
    for s in &sums {
        let (start, end) = expected[s.attempt.subtask];
        assert_eq!(s.parallelism, 5);
        assert_eq!(s.inputs.len(), 2, "one channel per producer");
        for input in &s.inputs {
            assert_eq!(
                (input.first_subpartition, input.last_subpartition),
                (start as u32, end as u32)
            );
        }
        assert_eq!(
            s.key_group_range,
            Some(SubpartitionRange { start, end }),
            "a keyed subtask owns exactly the key groups it reads"
        );
    }
    for s in &sums {
        d.finish(s, vec![]);
    }
    assert!(d.s.job(d.job).unwrap().state.is_terminal());
}

#[test]
fn forward_connected_vertices_share_one_decision() {
    let jg = forward_group("Map", &[]);
    let mut d = Driver::start(jg, 8);
    let sources = d.deployed.clone();
    d.finish(&sources[0], vec![P0.to_vec()]);
    d.finish(&sources[1], vec![P1.to_vec()]);
    // Map is decided with Sum, before any Sum subtask ran, and reads it
    // pointwise: subtask i of Sum feeds subtask i of Map.
    assert_eq!(d.vertex(2).parallelism, 5);
    assert!(d.vertex(2).parallelism_decided);
    let sums = d.collect();
    let maps = d.finish_all(&sums, 1, vec![vec![100]]);
    assert_eq!(maps.len(), 5);
    for m in &maps {
        assert_eq!(m.inputs.len(), 1);
        assert_eq!(
            m.inputs[0].partition.producer_subtask as usize,
            m.attempt.subtask
        );
        assert_eq!(m.key_group_range, None);
    }
}

#[test]
fn a_parallelism_the_user_set_is_kept_and_an_unset_source_gets_the_default_source_parallelism() {
    let jg = graph(
        &[Op("Source", None, None), Op("Sum", Some(3), None)],
        &[(0, 1, PartitionerKind::Hash)],
        conf(&[
            (options::AUTO_PARALLELISM_DEFAULT_SOURCE.key, "4"),
            (options::AUTO_PARALLELISM_AVG_DATA_VOLUME.key, "1"),
        ]),
    );
    let mut d = Driver::start(jg, 8);
    assert_eq!(d.vertex(0).parallelism, 4);
    // Sum's parallelism is known at submission: it is initialized as soon
    // as its producer is, with a subpartition per subtask.
    assert!(d.vertex(1).initialized);
    let sources = d.deployed.clone();
    assert_eq!(sources.len(), 4);
    let sums = d.finish_all(&sources, 3, vec![vec![1000, 1000, 1000]]);
    assert_eq!(sums.len(), 3);
    assert!(sums.iter().all(|s| s.key_group_range.is_none()));
}

#[test]
fn a_broadcast_input_of_an_undecided_vertex_is_one_subpartition_read_whole() {
    let jg = graph(
        &[Op("Source", Some(2), None), Op("Join", None, Some(8))],
        &[(0, 1, PartitionerKind::Broadcast)],
        conf(&[(options::AUTO_PARALLELISM_MIN.key, "3")]),
    );
    let mut d = Driver::start(jg, 8);
    let sources = d.deployed.clone();
    // Only broadcast inputs: the min parallelism; every subtask reads
    // subpartition 0 of every producer.
    let joins = d.finish_all(&sources, 1, vec![vec![5_000]]);
    assert_eq!(joins.len(), 3);
    for j in &joins {
        assert_eq!(j.inputs.len(), 2);
        assert!(
            j.inputs
                .iter()
                .all(|i| i.first_subpartition == 0 && i.last_subpartition == 0)
        );
    }
}

#[test]
fn with_auto_parallelism_disabled_every_vertex_keeps_the_default() {
    let jg = source_to_sum(&[(options::AUTO_PARALLELISM_ENABLED.key, "false")]);
    let d = Driver::start(jg, 8);
    assert!(d.vertex(1).parallelism_decided);
    assert_eq!(d.vertex(1).parallelism, 1);
    assert!(d.s.job(d.job).unwrap().adaptive.is_none());
}

#[test]
fn a_forward_group_member_reads_the_key_groups_its_group_decided_on_every_keyed_input() {
    // Source -HASH-> Sum -FORWARD-> Merge, and Source -HASH-> Merge: Merge is
    // decided with Sum, and its own keyed input from Source must give
    // subtask k the same key groups as Sum's subtask k.
    let jg = forward_group("Merge", &[(0, 2, PartitionerKind::Hash)]);
    let mut d = Driver::start(jg, 16);
    let sources = d.deployed.clone();
    for s in &sources {
        // One output per consumer, in edge order: Sum, then Merge.
        assert_eq!(s.outputs.len(), 2);
        assert!(s.outputs.iter().all(|o| o.num_subpartitions == 10));
    }
    d.finish(&sources[0], vec![P0.to_vec(), vec![1; 10]]);
    d.finish(&sources[1], vec![P1.to_vec(), vec![1; 10]]);
    let expected = [(0, 1), (2, 3), (4, 6), (7, 8), (9, 9)];
    assert_eq!(d.vertex(2).parallelism, 5);
    let sums = d.collect();
    for s in &sums {
        d.finish(s, vec![vec![10]]);
    }
    let merges = d.collect();
    assert_eq!(merges.len(), 5);
    for m in &merges {
        let (start, end) = expected[m.attempt.subtask];
        let from_source: Vec<_> = m
            .inputs
            .iter()
            .filter(|i| i.partition.data_set == sources[0].outputs[1].data_set)
            .collect();
        assert_eq!(from_source.len(), 2, "one channel per source subtask");
        for i in from_source {
            assert_eq!(
                (i.first_subpartition, i.last_subpartition),
                (start as u32, end as u32),
                "subtask {} of Merge",
                m.attempt.subtask
            );
        }
        assert_eq!(m.key_group_range, Some(SubpartitionRange { start, end }));
    }
}

#[test]
fn a_partition_lost_before_its_consumer_is_decided_is_produced_again_first() {
    let jg = source_to_sum(&[(options::AUTO_PARALLELISM_AVG_DATA_VOLUME.key, "60")]);
    let config = SchedulerConfig {
        restart_attempts: 3,
        restart_delay: Duration::ZERO,
        probe_timeout: Duration::from_millis(100),
        ..SchedulerConfig::default()
    };
    let mut d = Driver::start_on(jg, &[1, 1], config);
    let sources = d.deployed.clone();
    assert_eq!(sources.len(), 2);
    let on_first = sources
        .iter()
        .find(|s| s.task_manager == "tm-1")
        .unwrap()
        .clone();
    let on_second = sources
        .iter()
        .find(|s| s.task_manager == "tm-2")
        .unwrap()
        .clone();
    d.finish(&on_first, vec![P0.to_vec()]);
    // Its TaskManager (and the partition) goes while the other source runs.
    d.event(Event::TaskManagerLost {
        task_manager: "tm-1".into(),
        reason: "killed".into(),
    });
    d.finish(&on_second, vec![P1.to_vec()]);
    assert!(
        !d.vertex(1).initialized,
        "decided from a partition that no longer exists"
    );
    // The lost source runs again (on tm-2, now free), then Sum is decided.
    d.event(Event::ProbeAnswered {
        task_manager: "tm-2".into(),
        alive: true,
    });
    for _ in 0..20 {
        d.event(Event::Tick);
    }
    let again = d.collect();
    let rerun = again
        .iter()
        .find(|x| x.attempt.vertex == 0 && x.attempt.subtask == on_first.attempt.subtask)
        .expect("the lost source runs again")
        .clone();
    assert_eq!(rerun.attempt.attempt, 1);
    d.finish(&rerun, vec![P0.to_vec()]);
    assert!(d.vertex(1).initialized);
    assert_eq!(d.vertex(1).parallelism, 5);
}

//! The adaptive batch scheduler's decider: Flink's test vectors
//! (`DefaultVertexParallelismAndInputInfosDeciderTest` and
//! `VertexInputInfoComputationUtilsTest`, 1.17–1.19; test names in
//! snake_case), then properties over random byte matrices.

use fluvia_core::{Configuration, FluviaError};
use fluvia_scheduler::adaptive::{
    self, BlockingResultInfo, DeciderConfig, ExecutionVertexInputInfo, IndexRange,
    ParallelismAndInputInfos, decide, decide_parallelism,
};
use proptest::prelude::*;

const BYTE_256_MB: u64 = 256 * 1024 * 1024;
const BYTE_512_MB: u64 = 512 * 1024 * 1024;
const BYTE_8_GB: u64 = 8 * 1024 * 1024 * 1024;
const BYTE_1_TB: u64 = 1024 * 1024 * 1024 * 1024;

// Flink's test constants.
const MAX_PARALLELISM: usize = 100;
const MIN_PARALLELISM: usize = 3;
const VERTEX_MAX_PARALLELISM: usize = 256;
const DEFAULT_SOURCE_PARALLELISM: usize = 10;
const DATA_VOLUME_PER_TASK: u64 = 1024 * 1024 * 1024;

/// Sizes Flink's tests use again and again.
const BYTES_A: [u64; 10] = [10, 15, 13, 12, 1, 10, 8, 20, 12, 17];
const BYTES_B: [u64; 10] = [8, 12, 21, 9, 13, 7, 19, 13, 14, 5];

fn r(start: usize, end: usize) -> IndexRange {
    IndexRange { start, end }
}

fn config(min: usize, max: usize, avg: u64) -> DeciderConfig {
    DeciderConfig {
        min_parallelism: min,
        max_parallelism: max,
        avg_data_volume_per_task: avg,
        default_source_parallelism: DEFAULT_SOURCE_PARALLELISM,
    }
}

/// Flink's `createDeciderAndDecideParallelismAndInputInfos`: the decider's
/// global max parallelism is also the vertex max parallelism it is given.
fn decide_with(
    min: usize,
    max: usize,
    avg: u64,
    inputs: &[BlockingResultInfo],
) -> ParallelismAndInputInfos {
    decide(max, None, inputs, &config(min, max, avg)).expect("decide")
}

/// Flink's `createAllToAllBlockingResultInfo`: one partition.
fn all_to_all(bytes: &[u64]) -> BlockingResultInfo {
    BlockingResultInfo::all_to_all(vec![bytes.to_vec()])
}

/// Flink's `TestingBlockingResultInfo`: only the total matters, over
/// `partitions` × `subpartitions`.
fn sized(
    broadcast: bool,
    bytes: u64,
    partitions: usize,
    subpartitions: usize,
) -> BlockingResultInfo {
    let mut matrix = vec![vec![0u64; subpartitions]; partitions];
    matrix[0][0] = bytes;
    BlockingResultInfo {
        is_broadcast: broadcast,
        is_pointwise: false,
        subpartition_bytes: matrix,
    }
}

/// Flink's `createDeciderAndDecideParallelism` with its default bounds.
fn decide_parallelism_default(inputs: &[BlockingResultInfo]) -> usize {
    decide_parallelism(
        inputs,
        MIN_PARALLELISM,
        MAX_PARALLELISM,
        DATA_VOLUME_PER_TASK,
    )
}

/// Flink's `checkAllToAllJobVertexInputInfo`.
fn assert_all_to_all(
    result: &ParallelismAndInputInfos,
    input: usize,
    partitions: IndexRange,
    subpartitions: &[IndexRange],
) {
    let expected: Vec<ExecutionVertexInputInfo> = subpartitions
        .iter()
        .map(|&subpartition_range| ExecutionVertexInputInfo {
            partition_range: partitions,
            subpartition_range,
        })
        .collect();
    assert_eq!(result.inputs[input].subtasks, expected, "input {input}");
}

#[test]
fn test_decide_parallelism() {
    let inputs = [
        sized(true, BYTE_256_MB, 100, 100),
        sized(false, BYTE_256_MB + BYTE_8_GB, 100, 100),
    ];
    assert_eq!(decide_parallelism_default(&inputs), 9);
}

#[test]
fn test_initially_normalized_parallelism_is_larger_than_max_parallelism() {
    let inputs = [
        sized(true, BYTE_256_MB, 100, 100),
        sized(false, BYTE_8_GB + BYTE_1_TB, 100, 100),
    ];
    assert_eq!(decide_parallelism_default(&inputs), MAX_PARALLELISM);
}

#[test]
fn test_initially_normalized_parallelism_is_smaller_than_min_parallelism() {
    let inputs = [
        sized(true, BYTE_256_MB, 100, 100),
        sized(false, BYTE_512_MB, 100, 100),
    ];
    assert_eq!(decide_parallelism_default(&inputs), MIN_PARALLELISM);
}

#[test]
fn test_non_broadcast_bytes_can_not_divided_evenly() {
    let inputs = [
        sized(true, BYTE_512_MB, 100, 100),
        sized(false, BYTE_256_MB + BYTE_8_GB, 100, 100),
    ];
    assert_eq!(decide_parallelism_default(&inputs), 9);
}

#[test]
fn test_decide_parallelism_with_max_subpartition_limitation() {
    // 1024 × 1024 subpartitions in one result: at most 32768 per subtask
    // needs 32 subtasks, whatever the bytes.
    let inputs = [sized(false, 1, 1024, 1024), sized(false, 1, 512, 512)];
    assert_eq!(decide_parallelism(&inputs, 1, 100, BYTE_256_MB), 32);
}

#[test]
fn test_all_edges_all_to_all() {
    let inputs = [all_to_all(&BYTES_A), all_to_all(&BYTES_B)];
    let result = decide_with(1, 10, 60, &inputs);
    assert_eq!(result.parallelism, 5);
    assert_eq!(result.inputs.len(), 2);
    let ranges = [r(0, 1), r(2, 3), r(4, 6), r(7, 8), r(9, 9)];
    assert_all_to_all(&result, 0, r(0, 0), &ranges);
    assert_all_to_all(&result, 1, r(0, 0), &ranges);
}

#[test]
fn test_all_edges_all_to_all_and_decided_parallelism_is_max_parallelism() {
    let result = decide_with(1, 2, 10, &[all_to_all(&BYTES_A)]);
    assert_eq!(result.parallelism, 2);
    assert_all_to_all(&result, 0, r(0, 0), &[r(0, 5), r(6, 9)]);
}

#[test]
fn test_all_edges_all_to_all_and_decided_parallelism_is_min_parallelism() {
    let result = decide_with(4, 10, 1000, &[all_to_all(&BYTES_A)]);
    assert_eq!(result.parallelism, 4);
    assert_all_to_all(&result, 0, r(0, 0), &[r(0, 1), r(2, 5), r(6, 7), r(8, 9)]);
}

#[test]
fn test_fall_back_to_evenly_distribute_subpartitions() {
    let result = decide_with(
        8,
        8,
        10,
        &[all_to_all(&[10, 1, 10, 1, 10, 1, 10, 1, 10, 1])],
    );
    assert_eq!(result.parallelism, 8);
    assert_all_to_all(
        &result,
        0,
        r(0, 0),
        &[
            r(0, 0),
            r(1, 1),
            r(2, 2),
            r(3, 4),
            r(5, 5),
            r(6, 6),
            r(7, 7),
            r(8, 9),
        ],
    );
}

#[test]
fn test_all_edges_all_to_all_and_one_is_broadcast() {
    let inputs = [
        all_to_all(&BYTES_A),
        BlockingResultInfo::broadcast(vec![vec![10]]),
    ];
    let result = decide_with(1, 10, 60, &inputs);
    assert_eq!(result.parallelism, 3);
    assert_all_to_all(&result, 0, r(0, 0), &[r(0, 4), r(5, 8), r(9, 9)]);
    assert_all_to_all(&result, 1, r(0, 0), &[r(0, 0), r(0, 0), r(0, 0)]);
}

#[test]
fn test_all_edges_broadcast() {
    let inputs = [
        BlockingResultInfo::broadcast(vec![vec![10]]),
        BlockingResultInfo::broadcast(vec![vec![10]]),
    ];
    let result = decide_with(1, 10, 60, &inputs);
    assert_eq!(result.parallelism, 1);
    assert_all_to_all(&result, 0, r(0, 0), &[r(0, 0)]);
    assert_all_to_all(&result, 1, r(0, 0), &[r(0, 0)]);
}

#[test]
fn test_have_pointwise_edges() {
    let inputs = [
        all_to_all(&BYTES_A),
        BlockingResultInfo::pointwise(vec![vec![8, 12, 21, 9, 13], vec![7, 19, 13, 14, 5]]),
    ];
    let result = decide_with(1, 10, 60, &inputs);
    // ceil(239 / 60): pointwise bytes count, but the split is by count.
    assert_eq!(result.parallelism, 4);
    assert_all_to_all(&result, 0, r(0, 0), &[r(0, 1), r(2, 4), r(5, 6), r(7, 9)]);
    let pointwise: Vec<_> = result.inputs[1]
        .subtasks
        .iter()
        .map(|i| (i.partition_range, i.subpartition_range))
        .collect();
    assert_eq!(
        pointwise,
        [
            (r(0, 0), r(0, 1)),
            (r(0, 0), r(2, 4)),
            (r(1, 1), r(0, 1)),
            (r(1, 1), r(2, 4)),
        ]
    );
}

#[test]
fn test_parallelism_already_decided() {
    let result = decide(
        MAX_PARALLELISM,
        Some(3),
        &[all_to_all(&BYTES_A)],
        &config(MIN_PARALLELISM, MAX_PARALLELISM, DATA_VOLUME_PER_TASK),
    )
    .expect("decide");
    assert_eq!(result.parallelism, 3);
    assert_all_to_all(&result, 0, r(0, 0), &[r(0, 2), r(3, 5), r(6, 9)]);
}

#[test]
fn test_source_job_vertex() {
    let result = decide_with(MIN_PARALLELISM, MAX_PARALLELISM, DATA_VOLUME_PER_TASK, &[]);
    assert_eq!(result.parallelism, DEFAULT_SOURCE_PARALLELISM);
    assert!(result.inputs.is_empty());
}

#[test]
fn test_evenly_distribute_data_with_max_subpartition_limitation() {
    // 1024 partitions: a subtask may read at most 32768 / 1024 = 32
    // subpartitions of each, so the 1 MiB of data needs 32 subtasks.
    let input = BlockingResultInfo::all_to_all(vec![vec![1; 1024]; 1024]);
    let result = decide_with(1, 100, BYTE_256_MB, &[input]);
    assert_eq!(result.parallelism, 32);
    let ranges: Vec<_> = (0..32).map(|i| r(i * 32, (i + 1) * 32 - 1)).collect();
    assert_all_to_all(&result, 0, r(0, 1023), &ranges);
}

#[test]
fn test_compute_source_parallelism_upper_bound() {
    let result = decide(
        VERTEX_MAX_PARALLELISM,
        None,
        &[],
        &config(1, MAX_PARALLELISM, 1),
    )
    .expect("decide");
    assert_eq!(result.parallelism, DEFAULT_SOURCE_PARALLELISM);
}

#[test]
fn test_compute_source_parallelism_upper_bound_not_exceed_max_parallelism() {
    let config = DeciderConfig {
        default_source_parallelism: VERTEX_MAX_PARALLELISM * 2,
        ..config(1, MAX_PARALLELISM, 1)
    };
    let result = decide(VERTEX_MAX_PARALLELISM, None, &[], &config).expect("decide");
    assert_eq!(result.parallelism, VERTEX_MAX_PARALLELISM);
}

// VertexInputInfoComputationUtilsTest, dynamic graph (the decider's even
// split), through a fixed parallelism.

fn even_split(parallelism: usize, input: BlockingResultInfo) -> Vec<(IndexRange, IndexRange)> {
    let result =
        decide(64, Some(parallelism), &[input], &DeciderConfig::default()).expect("decide");
    assert_eq!(result.parallelism, parallelism);
    result.inputs[0]
        .subtasks
        .iter()
        .map(|i| (i.partition_range, i.subpartition_range))
        .collect()
}

fn subpartition_ranges(parallelism: usize, subpartitions: usize) -> Vec<IndexRange> {
    even_split(parallelism, all_to_all(&vec![1; subpartitions]))
        .into_iter()
        .map(|(_, s)| s)
        .collect()
}

#[test]
fn test_compute_consumed_subpartition_range_3to1() {
    assert_eq!(subpartition_ranges(1, 3), [r(0, 2)]);
}

#[test]
fn test_compute_consumed_subpartition_range_3to2() {
    assert_eq!(subpartition_ranges(2, 3), [r(0, 0), r(1, 2)]);
}

#[test]
fn test_compute_consumed_subpartition_range_6to4() {
    assert_eq!(
        subpartition_ranges(4, 6),
        [r(0, 0), r(1, 2), r(3, 3), r(4, 5)]
    );
}

#[test]
fn test_compute_broadcast_consumed_subpartition_range() {
    let got = even_split(3, BlockingResultInfo::broadcast(vec![vec![7]]));
    assert_eq!(got, [(r(0, 0), r(0, 0)); 3]);
}

#[test]
fn test_compute_vertex_input_info_for_all_to_all_with_dynamic_graph() {
    let got = even_split(3, BlockingResultInfo::all_to_all(vec![vec![1; 10]; 2]));
    assert_eq!(
        got,
        [(r(0, 1), r(0, 2)), (r(0, 1), r(3, 5)), (r(0, 1), r(6, 9))]
    );
    let got = even_split(3, BlockingResultInfo::broadcast(vec![vec![1]; 2]));
    assert_eq!(got, [(r(0, 1), r(0, 0)); 3]);
}

#[test]
fn test_compute_vertex_input_info_for_pointwise_with_dynamic_graph() {
    let got = even_split(3, BlockingResultInfo::pointwise(vec![vec![1; 4]; 2]));
    assert_eq!(
        got,
        [(r(0, 0), r(0, 1)), (r(0, 0), r(2, 3)), (r(1, 1), r(0, 3))]
    );
}

// Beyond Flink's tests.

/// More partitions than subtasks: each subtask reads whole partitions.
#[test]
fn pointwise_with_more_partitions_than_subtasks_reads_whole_partitions() {
    let got = even_split(2, BlockingResultInfo::pointwise(vec![vec![1; 3]; 5]));
    assert_eq!(got, [(r(0, 1), r(0, 2)), (r(2, 4), r(0, 2))]);
}

/// Two partitions, five subtasks: partition 1 goes to subtasks 3 and 4, in
/// that order (Flink's `i % numConsumers` would give subtask 3 the second
/// half).
#[test]
fn pointwise_shares_of_a_partition_follow_subtask_order() {
    let got = even_split(5, BlockingResultInfo::pointwise(vec![vec![1; 4]; 2]));
    assert_eq!(
        got,
        [
            (r(0, 0), r(0, 0)),
            (r(0, 0), r(1, 1)),
            (r(0, 0), r(2, 3)),
            (r(1, 1), r(0, 1)),
            (r(1, 1), r(2, 3)),
        ]
    );
}

/// Flink keeps the greedy cut when its count is legal, even where an even
/// split with the same count would read less per subtask: nine 3-byte
/// subpartitions at 12 bytes per task give 12 + 12 + 3, not 9 + 9 + 9.
#[test]
fn greedy_ranges_are_kept_when_their_count_is_legal() {
    let result = decide_with(1, 10, 12, &[all_to_all(&[3; 9])]);
    assert_all_to_all(&result, 0, r(0, 0), &[r(0, 3), r(4, 7), r(8, 8)]);
}

/// The vertex max parallelism caps both global bounds.
#[test]
fn vertex_max_parallelism_caps_the_global_bounds() {
    // min 8 > vertex max 4: four single-subpartition ranges.
    let result = decide(4, None, &[all_to_all(&[1; 4])], &config(8, 16, 1000)).expect("decide");
    assert_eq!(result.parallelism, 4);
    // 118 bytes at 10 per task want 12 subtasks; the vertex allows 3.
    let input = BlockingResultInfo::pointwise(vec![vec![118, 0, 0]]);
    let result = decide(3, None, &[input], &config(1, 16, 10)).expect("decide");
    assert_eq!(result.parallelism, 3);
}

#[test]
fn config_reads_flink_keys_and_their_deprecated_spellings() {
    let mut conf = Configuration::new();
    conf.set(adaptive::options::MIN_PARALLELISM.key, "2")
        .set("jobmanager.adaptive-batch-scheduler.max-parallelism", "64")
        .set(adaptive::options::AVG_DATA_VOLUME_PER_TASK.key, "1 gb");
    let config = DeciderConfig::from_configuration(&conf).expect("config");
    assert_eq!(
        config,
        DeciderConfig {
            min_parallelism: 2,
            max_parallelism: 64,
            avg_data_volume_per_task: 1 << 30,
            default_source_parallelism: 1,
        }
    );
    assert_eq!(
        DeciderConfig::from_configuration(&Configuration::new()).expect("defaults"),
        DeciderConfig::default()
    );
    assert_eq!(DeciderConfig::default().avg_data_volume_per_task, 16 << 20);
    assert_eq!(DeciderConfig::default().max_parallelism, 128);

    conf.set(adaptive::options::MAX_PARALLELISM.key, "1");
    let err = DeciderConfig::from_configuration(&conf).expect_err("max < min");
    assert!(matches!(err, FluviaError::Config(_)), "{err}");
}

#[test]
fn inconsistent_input_is_an_error() {
    let cfg = DeciderConfig::default();
    let ragged = BlockingResultInfo::all_to_all(vec![vec![1, 2, 3], vec![1, 2]]);
    let err = decide(8, None, &[ragged], &cfg).expect_err("ragged");
    assert!(err.to_string().contains("partition 1 has 2"), "{err}");

    let mismatched = [all_to_all(&[1; 4]), all_to_all(&[1; 5])];
    let err = decide(8, None, &mismatched, &cfg).expect_err("mismatched");
    assert!(err.to_string().contains("differ"), "{err}");

    let err = decide(0, None, &[all_to_all(&[1])], &cfg).expect_err("max 0");
    assert!(matches!(err, FluviaError::Plan(_)), "{err}");
    let err = decide(8, Some(0), &[all_to_all(&[1])], &cfg).expect_err("parallelism 0");
    assert!(matches!(err, FluviaError::Plan(_)), "{err}");
    let err = decide(8, Some(9), &[all_to_all(&[1; 9])], &cfg).expect_err("above max");
    assert!(matches!(err, FluviaError::Plan(_)), "{err}");

    // Three subtasks cannot share two subpartitions.
    let err = decide(8, Some(3), &[all_to_all(&[1; 2])], &cfg).expect_err("too few");
    assert!(err.to_string().contains("cannot be shared"), "{err}");

    let err = decide(8, None, &[BlockingResultInfo::all_to_all(vec![])], &cfg).expect_err("empty");
    assert!(err.to_string().contains("no partitions"), "{err}");
    let err = decide(
        8,
        None,
        &[BlockingResultInfo::all_to_all(vec![vec![]])],
        &cfg,
    )
    .expect_err("no subpartitions");
    assert!(err.to_string().contains("no subpartitions"), "{err}");

    let both = BlockingResultInfo {
        is_broadcast: true,
        is_pointwise: true,
        subpartition_bytes: vec![vec![1]],
    };
    assert!(decide(8, None, &[both], &cfg).is_err());

    // Subtask 0 reads partitions 0 and 1 with one subpartition range.
    let uneven = BlockingResultInfo::pointwise(vec![vec![1; 2], vec![1; 3]]);
    let err = decide(8, Some(1), &[uneven], &cfg).expect_err("uneven pointwise");
    assert!(err.to_string().contains("partition 1 has 3"), "{err}");

    let bad = DeciderConfig {
        avg_data_volume_per_task: 0,
        ..cfg
    };
    let err = decide(8, None, &[all_to_all(&[1])], &bad).expect_err("avg 0");
    assert!(matches!(err, FluviaError::Config(_)), "{err}");
}

#[test]
fn num_bytes_in_sums_a_block() {
    let input = BlockingResultInfo::all_to_all(vec![vec![1, 2, 3], vec![10, 20, 30]]);
    assert_eq!(input.total_bytes(), 66);
    assert_eq!(
        input.aggregated_subpartition_bytes().expect("agg"),
        [11, 22, 33]
    );
    assert_eq!(input.num_bytes_in(r(0, 1), r(1, 2)).expect("in range"), 55);
    assert!(input.num_bytes_in(r(0, 2), r(0, 0)).is_err());
    assert!(input.num_bytes_in(r(0, 0), r(0, 3)).is_err());
}

// Properties.

#[derive(Debug, Clone, Copy)]
enum Kind {
    AllToAll,
    Broadcast,
    Pointwise,
}

/// Bytes with occasional skew: mostly small, now and then a heavy
/// subpartition, sometimes empty.
fn byte_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 0u64..100,
        2 => Just(0u64),
        1 => 1_000u64..100_000,
    ]
}

/// An input as Flink's dynamic graph shapes it for a consumer of max
/// parallelism `v`: all-to-all `v` subpartitions per partition, broadcast
/// one, pointwise `ceil(v / partitions)`.
fn dynamic_input(v: usize, kinds: Vec<Kind>) -> impl Strategy<Value = BlockingResultInfo> {
    (prop::sample::select(kinds), 1usize..=6).prop_flat_map(move |(kind, partitions)| {
        let n = match kind {
            Kind::AllToAll => v,
            Kind::Broadcast => 1,
            Kind::Pointwise => v.div_ceil(partitions),
        };
        prop::collection::vec(prop::collection::vec(byte_value(), n), partitions).prop_map(
            move |matrix| BlockingResultInfo {
                is_broadcast: matches!(kind, Kind::Broadcast),
                is_pointwise: matches!(kind, Kind::Pointwise),
                subpartition_bytes: matrix,
            },
        )
    })
}

fn decider_config() -> impl Strategy<Value = DeciderConfig> {
    (1usize..=16, 0usize..=48, 1u64..=5_000, 1usize..=8).prop_map(|(min, extra, avg, src)| {
        DeciderConfig {
            min_parallelism: min,
            max_parallelism: min + extra,
            avg_data_volume_per_task: avg,
            default_source_parallelism: src,
        }
    })
}

#[derive(Debug, Clone)]
struct Case {
    vertex_max: usize,
    initial: Option<usize>,
    inputs: Vec<BlockingResultInfo>,
    config: DeciderConfig,
}

fn case(kinds: Vec<Kind>, max_inputs: usize, fixed: bool) -> impl Strategy<Value = Case> {
    (1usize..=40).prop_flat_map(move |v| {
        let initial = if fixed {
            prop::option::weighted(0.25, 1..=v).boxed()
        } else {
            Just(None).boxed()
        };
        (
            initial,
            prop::collection::vec(dynamic_input(v, kinds.clone()), 0..=max_inputs),
            decider_config(),
        )
            .prop_map(move |(initial, inputs, config)| Case {
                vertex_max: v,
                initial,
                inputs,
                config,
            })
    })
}

/// Every cell of every input is read exactly once (broadcast: subpartition 0
/// of each partition by every subtask), and walking the subtasks in order
/// walks the cells in order: all-to-all subpartition by subpartition,
/// pointwise partition by partition.
fn check_coverage(inputs: &[BlockingResultInfo], result: &ParallelismAndInputInfos) {
    assert_eq!(result.inputs.len(), inputs.len());
    for (idx, (input, info)) in inputs.iter().zip(&result.inputs).enumerate() {
        assert_eq!(info.subtasks.len(), result.parallelism, "input {idx}");
        let mut walked = Vec::new();
        for sub in &info.subtasks {
            let (pr, sr) = (sub.partition_range, sub.subpartition_range);
            assert!(
                pr.start <= pr.end && pr.end < input.num_partitions(),
                "input {idx}: {pr:?}"
            );
            assert!(sr.start <= sr.end, "input {idx}: {sr:?}");
            for p in pr.iter() {
                assert!(
                    sr.end < input.num_subpartitions(p),
                    "input {idx}: {sr:?} of partition {p}"
                );
            }
            if input.is_pointwise {
                walked.extend(pr.iter().flat_map(|p| sr.iter().map(move |s| (p, s))));
            } else {
                walked.extend(sr.iter().flat_map(|s| pr.iter().map(move |p| (p, s))));
            }
        }
        let expected: Vec<(usize, usize)> = if input.is_broadcast {
            (0..result.parallelism)
                .flat_map(|_| (0..input.num_partitions()).map(|p| (p, 0)))
                .collect()
        } else if input.is_pointwise {
            (0..input.num_partitions())
                .flat_map(|p| (0..input.num_subpartitions(p)).map(move |s| (p, s)))
                .collect()
        } else {
            let n = input.num_subpartitions(0);
            (0..n)
                .flat_map(|s| (0..input.num_partitions()).map(move |p| (p, s)))
                .collect()
        };
        assert_eq!(walked, expected, "input {idx}");
        if !input.is_pointwise {
            // All-to-all: every subtask reads every partition.
            assert!(
                info.subtasks
                    .iter()
                    .all(|s| s.partition_range == r(0, input.num_partitions() - 1))
            );
        }
    }
}

fn check_parallelism(case: &Case, result: &ParallelismAndInputInfos) {
    let v = case.vertex_max;
    if let Some(p) = case.initial {
        assert_eq!(result.parallelism, p);
    } else if case.inputs.is_empty() {
        assert_eq!(
            result.parallelism,
            case.config.default_source_parallelism.min(v)
        );
    } else {
        let lo = case.config.min_parallelism.min(v);
        let hi = case.config.max_parallelism.min(v);
        assert!(
            (lo..=hi).contains(&result.parallelism),
            "{} not in [{lo}, {hi}]",
            result.parallelism
        );
    }
}

/// Bytes each subtask reads of all inputs.
fn bytes_per_subtask(inputs: &[BlockingResultInfo], result: &ParallelismAndInputInfos) -> Vec<u64> {
    (0..result.parallelism)
        .map(|k| {
            inputs
                .iter()
                .zip(&result.inputs)
                .filter(|(i, _)| !i.is_broadcast)
                .map(|(i, info)| {
                    let sub = info.subtasks[k];
                    i.num_bytes_in(sub.partition_range, sub.subpartition_range)
                        .expect("decided ranges are in range")
                })
                .sum()
        })
        .collect()
}

/// The decider's cut at a limit, written again from FLIP-283's description.
fn greedy_count(bytes: &[u64], limit: u64) -> usize {
    let mut count = 0;
    let mut sum = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if i == 0 || sum + b > limit {
            count += 1;
            sum = b;
        } else {
            sum += b;
        }
    }
    count
}

/// The heaviest subtask of an even split of `bytes` into `p` ranges.
fn even_split_busiest(bytes: &[u64], p: usize) -> u64 {
    let n = bytes.len();
    (0..p)
        .map(|k| bytes[k * n / p..(k + 1) * n / p].iter().sum::<u64>())
        .max()
        .unwrap_or(0)
}

fn aggregated(inputs: &[BlockingResultInfo]) -> Vec<u64> {
    let mut agg: Vec<u64> = Vec::new();
    for i in inputs.iter().filter(|i| !i.is_broadcast) {
        let a = i.aggregated_subpartition_bytes().expect("uniform");
        if agg.is_empty() {
            agg = a;
        } else {
            agg.iter_mut().zip(a).for_each(|(x, y)| *x += y);
        }
    }
    agg
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any mix of inputs shaped as a dynamic graph shapes them, fixed or
    /// open parallelism: decided, within bounds, every byte read once.
    #[test]
    fn every_subpartition_is_read_exactly_once(
        case in case(vec![Kind::AllToAll, Kind::Broadcast, Kind::Pointwise], 3, true)
    ) {
        let result = decide(case.vertex_max, case.initial, &case.inputs, &case.config)
            .expect("consistent input");
        check_parallelism(&case, &result);
        check_coverage(&case.inputs, &result);
    }

    /// All-to-all only, parallelism open: the balanced ranges. When the cut
    /// at `avg` has a legal count it is kept, and no subtask reads more than
    /// `avg` unless one subpartition alone does. When the bounds forced a
    /// search, no subtask reads more than the busiest one of an even split
    /// into as many subtasks (nor into `max` when there were too many).
    #[test]
    fn balanced_ranges_are_never_worse_than_the_even_split(
        case in case(vec![Kind::AllToAll, Kind::AllToAll, Kind::Broadcast], 3, false)
            .prop_filter("a non-broadcast input", |c| c.inputs.iter().any(|i| !i.is_broadcast))
    ) {
        let result = decide(case.vertex_max, None, &case.inputs, &case.config)
            .expect("consistent input");
        check_parallelism(&case, &result);
        check_coverage(&case.inputs, &result);

        let agg = aggregated(&case.inputs);
        let busiest = bytes_per_subtask(&case.inputs, &result).into_iter().max().unwrap_or(0);
        let avg = case.config.avg_data_volume_per_task;
        let lo = case.config.min_parallelism.min(case.vertex_max);
        let hi = case.config.max_parallelism.min(case.vertex_max);
        let heaviest = agg.iter().copied().max().unwrap_or(0);
        if (lo..=hi).contains(&greedy_count(&agg, avg)) {
            prop_assert_eq!(result.parallelism, greedy_count(&agg, avg));
            prop_assert!(busiest <= avg.max(heaviest), "{} > max({}, {})", busiest, avg, heaviest);
        } else {
            // A search picked the smallest limit giving the count: the cut
            // with the lightest busiest range among all with as many
            // ranges (at most `hi` when there were too many).
            let even = even_split_busiest(&agg, result.parallelism);
            prop_assert!(busiest <= even, "balanced {} > even {}", busiest, even);
            if greedy_count(&agg, avg) > hi {
                let even = even_split_busiest(&agg, hi);
                prop_assert!(busiest <= even, "balanced {} > even into {}: {}", busiest, hi, even);
            }
        }
    }

    /// Arbitrary shapes (ragged partitions, flags in any combination, any
    /// bounds): an error or a decision that reads every byte once, never a
    /// panic.
    #[test]
    fn arbitrary_input_gives_an_error_or_a_valid_decision(
        vertex_max in 0usize..=12,
        initial in prop::option::of(0usize..=14),
        inputs in prop::collection::vec(
            (any::<bool>(), any::<bool>(),
             prop::collection::vec(prop::collection::vec(byte_value(), 0..=5), 0..=5))
                .prop_map(|(is_broadcast, is_pointwise, subpartition_bytes)| BlockingResultInfo {
                    is_broadcast, is_pointwise, subpartition_bytes,
                }),
            0..=3),
        config in (0usize..=6, 0usize..=8, 0u64..=300, 0usize..=4).prop_map(|(min, max, avg, src)| {
            DeciderConfig {
                min_parallelism: min,
                max_parallelism: max,
                avg_data_volume_per_task: avg,
                default_source_parallelism: src,
            }
        }),
    ) {
        if let Ok(result) = decide(vertex_max, initial, &inputs, &config) {
            let case = Case { vertex_max, initial, inputs, config };
            check_parallelism(&case, &result);
            check_coverage(&case.inputs, &result);
        }
    }
}

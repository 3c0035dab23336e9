//! Skew splitting for joins (Flink's FLIP-475/486): when a subpartition of
//! a join side holds far more bytes than the median one, the subtasks that
//! read it share it out by producer partitions, each of them reading the
//! other sides' matching subpartition whole.
//!
//! Plain data in and out, like the [`adaptive`](crate::adaptive) decider it
//! extends. Which inputs may be split is the caller's knowledge (the join
//! type; Flink's `intraInputKeyCorrelated == false`): splitting side A is
//! right when every output row depends on one row of A and the rows of B it
//! matches, so a row of A must meet all of B's matching rows exactly once.
//!
//! Simplifications against Flink 2.x: at most one side of a subpartition is
//! split (the biggest skewed one), so pieces of one subpartition never need a
//! Cartesian product, and pieces merged into one subtask never read a pair
//! of rows twice.

use crate::adaptive::{
    BlockingResultInfo, DeciderConfig, ExecutionVertexInputInfo, IndexRange,
    MAX_NUM_SUBPARTITIONS_PER_TASK_CONSUME, greedy_ranges, largest_satisfying, smallest_satisfying,
};
use fluvia_core::{FluviaError, Result};

/// `table.optimizer.skewed-join-optimization.*`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SkewConfig {
    /// A subpartition is skewed above `median * factor`...
    pub factor: f64,
    /// ...and above this many bytes.
    pub threshold: u64,
}

/// What each subtask reads of each input: a list of (partition range,
/// subpartition range) slices, per input, per subtask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkewedDecision {
    pub parallelism: usize,
    /// `[input][subtask]` -> slices.
    pub inputs: Vec<Vec<Vec<ExecutionVertexInputInfo>>>,
    /// Subpartitions that were split.
    pub split: Vec<SkewSplit>,
}

/// One skewed subpartition shared out among subtasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SkewSplit {
    pub subpartition: usize,
    /// The input (in the decider's order) whose partitions were cut.
    pub input: usize,
    pub pieces: usize,
}

/// One unit of work before the grouping into subtasks.
#[derive(Debug, Clone, Copy)]
enum Slice {
    /// Subpartition `s` of every input, whole.
    Whole(usize),
    /// Partitions `partitions` of input `input` at subpartition `s`, with
    /// subpartition `s` of every other input whole.
    Piece {
        s: usize,
        input: usize,
        partitions: IndexRange,
    },
}

impl Slice {
    fn subpartition(self) -> usize {
        match self {
            Slice::Whole(s) | Slice::Piece { s, .. } => s,
        }
    }
}

fn median(values: &[u64]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied().unwrap_or(0).max(1)
}

/// Splits skewed subpartitions of the `splittable` inputs, when there are
/// any; `None` when nothing is skewed (the balanced ranges of
/// [`crate::adaptive::decide`] apply). Every non-broadcast input must be
/// all-to-all with the same number of subpartitions.
pub fn decide_skewed(
    vertex_max_parallelism: usize,
    inputs: &[BlockingResultInfo],
    splittable: &[bool],
    skew: &SkewConfig,
    config: &DeciderConfig,
) -> Result<Option<SkewedDecision>> {
    config.validate()?;
    if splittable.len() != inputs.len() {
        return internal("one splittable flag per input");
    }
    if inputs.iter().any(|i| i.is_pointwise) {
        return Ok(None);
    }
    let hash: Vec<usize> = (0..inputs.len())
        .filter(|&i| !inputs[i].is_broadcast)
        .collect();
    if hash.is_empty() || !hash.iter().any(|&i| splittable[i]) {
        return Ok(None);
    }
    let mut agg: Vec<Vec<u64>> = vec![Vec::new(); inputs.len()];
    for &i in &hash {
        agg[i] = inputs[i].aggregated_subpartition_bytes()?;
    }
    let n = agg[hash[0]].len();
    if hash.iter().any(|&i| agg[i].len() != n) || n == 0 {
        return internal("the join sides differ in their numbers of subpartitions");
    }
    let threshold: Vec<u64> = (0..inputs.len())
        .map(|i| {
            if agg[i].is_empty() {
                return u64::MAX;
            }
            let m = (median(&agg[i]) as f64 * skew.factor).min(u64::MAX as f64) as u64;
            m.max(skew.threshold)
        })
        .collect();
    // The side split at each subpartition: the biggest skewed splittable one.
    let split_side: Vec<Option<usize>> = (0..n)
        .map(|s| {
            hash.iter()
                .copied()
                .filter(|&i| splittable[i] && agg[i][s] > threshold[i])
                .max_by_key(|&i| agg[i][s])
        })
        .collect();
    if split_side.iter().all(Option::is_none) {
        return Ok(None);
    }
    let avg = config.avg_data_volume_per_task;
    // Pieces of about the mean non-skewed subpartition, never below the
    // target volume (tiny pieces only cost channels).
    let target: Vec<u64> = (0..inputs.len())
        .map(|i| {
            let normal: Vec<u64> = (0..agg[i].len())
                .filter(|&s| split_side[s] != Some(i))
                .map(|s| agg[i][s])
                .collect();
            let mean = if normal.is_empty() {
                0
            } else {
                total(normal.iter().copied()) / normal.len() as u64
            };
            mean.max(avg)
        })
        .collect();

    let mut slices = Vec::new();
    let mut split = Vec::new();
    for (s, side) in split_side.iter().enumerate() {
        let Some(i) = *side else {
            slices.push(Slice::Whole(s));
            continue;
        };
        let bytes: Vec<u64> = inputs[i].subpartition_bytes.iter().map(|p| p[s]).collect();
        let ranges = cut(&bytes, target[i]);
        if ranges.len() < 2 {
            slices.push(Slice::Whole(s));
            continue;
        }
        split.push(SkewSplit {
            subpartition: s,
            input: i,
            pieces: ranges.len(),
        });
        slices.extend(ranges.into_iter().map(|partitions| Slice::Piece {
            s,
            input: i,
            partitions,
        }));
    }

    let slice_bytes = |k: usize, after: Option<usize>| -> u64 {
        match slices[k] {
            Slice::Whole(s) => total(hash.iter().map(|&i| agg[i][s])),
            Slice::Piece {
                s,
                input,
                partitions,
            } => {
                let own = total(
                    partitions
                        .iter()
                        .map(|p| inputs[input].subpartition_bytes[p][s]),
                );
                // The other sides of `s` are read once per subtask.
                let same = after.is_some_and(|a| slices[a].subpartition() == s);
                let others: u64 = if same {
                    0
                } else {
                    total(hash.iter().filter(|&&j| j != input).map(|&j| agg[j][s]))
                };
                own.saturating_add(others)
            }
        }
    };
    let max_partitions = hash
        .iter()
        .map(|&i| inputs[i].num_partitions())
        .max()
        .unwrap_or(1);
    let max_slices = MAX_NUM_SUBPARTITIONS_PER_TASK_CONSUME / max_partitions.max(1);
    let group = |limit: u64| -> Vec<(usize, usize)> {
        let mut tasks = Vec::new();
        let mut start = 0;
        let mut sum = 0u64;
        for k in 0..slices.len() {
            if k == start {
                sum = slice_bytes(k, None);
                continue;
            }
            let cost = slice_bytes(k, Some(k - 1));
            if sum.saturating_add(cost) <= limit && k - start < max_slices {
                sum = sum.saturating_add(cost);
            } else {
                tasks.push((start, k - 1));
                start = k;
                sum = slice_bytes(k, None);
            }
        }
        tasks.push((start, slices.len() - 1));
        tasks
    };
    let min = config.min_parallelism.min(vertex_max_parallelism);
    let max = config.max_parallelism.min(vertex_max_parallelism);
    let all_bytes = total((0..slices.len()).map(|k| slice_bytes(k, None)));
    let Some(tasks) = fit_bounds(group, avg, all_bytes, min, max) else {
        return Ok(None);
    };

    let mut per_input: Vec<Vec<Vec<ExecutionVertexInputInfo>>> =
        vec![Vec::with_capacity(tasks.len()); inputs.len()];
    for &(a, b) in &tasks {
        for (i, input) in inputs.iter().enumerate() {
            if input.is_broadcast {
                per_input[i].push(vec![whole(input, IndexRange::single(0))]);
                continue;
            }
            let run = slices[a..=b].iter().map(|slice| match *slice {
                Slice::Whole(s) => (s, None),
                Slice::Piece {
                    s,
                    input: j,
                    partitions,
                } => (s, (j == i).then_some(partitions)),
            });
            per_input[i].push(ranges_per_partition(input.num_partitions(), run)?);
        }
    }
    Ok(Some(SkewedDecision {
        parallelism: tasks.len(),
        inputs: per_input,
        split,
    }))
}

/// FLIP-470 at runtime: once both sides of a join finished, a side whose
/// bytes stay below `threshold` is read whole by every subtask (broadcast)
/// and the other side, one the join type lets split, is cut by bytes alone
/// (by subpartitions and, within a big subpartition, by producer
/// partitions), whatever its keys. `None` when no side qualifies. `split`
/// of the answer is empty; the broadcast side is returned beside it.
pub fn decide_broadcast(
    vertex_max_parallelism: usize,
    inputs: &[BlockingResultInfo],
    splittable: &[bool],
    threshold: u64,
    config: &DeciderConfig,
) -> Result<Option<(usize, SkewedDecision)>> {
    config.validate()?;
    if splittable.len() != inputs.len() || inputs.iter().any(|i| i.is_pointwise) {
        return Ok(None);
    }
    let hash: Vec<usize> = (0..inputs.len())
        .filter(|&i| !inputs[i].is_broadcast)
        .collect();
    let [a, b] = hash[..] else {
        return Ok(None);
    };
    let (ta, tb) = (inputs[a].total_bytes(), inputs[b].total_bytes());
    // The smaller side is broadcast, if small enough and the other side
    // may be split.
    let (small, big) = if ta <= tb { (a, b) } else { (b, a) };
    if inputs[small].total_bytes() > threshold || !splittable[big] {
        return Ok(None);
    }
    let big_input = &inputs[big];
    let n = big_input.num_subpartitions(0);
    if n == 0 {
        return Ok(None);
    }
    let avg = config.avg_data_volume_per_task;
    // Cells of the big side in (subpartition, partition) order, cut into
    // slices of about `avg` bytes that never cross a subpartition.
    let mut slices: Vec<(usize, IndexRange, u64)> = Vec::new();
    for s in 0..n {
        let bytes: Vec<u64> = big_input.subpartition_bytes.iter().map(|p| p[s]).collect();
        for r in cut(&bytes, avg) {
            let b = total(r.iter().map(|p| bytes[p]));
            slices.push((s, r, b));
        }
    }
    let max_partitions = big_input
        .num_partitions()
        .max(inputs[small].num_partitions());
    let max_slices = MAX_NUM_SUBPARTITIONS_PER_TASK_CONSUME / max_partitions.max(1);
    let group = |limit: u64| -> Vec<(usize, usize)> {
        let mut tasks = Vec::new();
        let (mut start, mut sum) = (0, 0u64);
        for (k, slice) in slices.iter().enumerate() {
            if k == start {
                sum = slice.2;
            } else if sum.saturating_add(slice.2) <= limit && k - start < max_slices {
                sum = sum.saturating_add(slice.2);
            } else {
                tasks.push((start, k - 1));
                start = k;
                sum = slice.2;
            }
        }
        tasks.push((start, slices.len() - 1));
        tasks
    };
    let min = config.min_parallelism.min(vertex_max_parallelism);
    let max = config.max_parallelism.min(vertex_max_parallelism);
    let all_bytes = total(slices.iter().map(|s| s.2));
    let Some(tasks) = fit_bounds(group, avg, all_bytes, min, max) else {
        return Ok(None);
    };
    let mut per_input: Vec<Vec<Vec<ExecutionVertexInputInfo>>> = vec![Vec::new(); inputs.len()];
    for &(first, last) in &tasks {
        for (i, input) in inputs.iter().enumerate() {
            if input.is_broadcast {
                per_input[i].push(vec![whole(input, IndexRange::single(0))]);
            } else if i == small {
                let every = IndexRange {
                    start: 0,
                    end: input.num_subpartitions(0) - 1,
                };
                per_input[i].push(vec![whole(input, every)]);
            } else {
                per_input[i].push(ranges_per_partition(
                    input.num_partitions(),
                    slices[first..=last].iter().map(|&(s, r, _)| (s, Some(r))),
                )?);
            }
        }
    }
    Ok(Some((
        small,
        SkewedDecision {
            parallelism: tasks.len(),
            inputs: per_input,
            split: Vec::new(),
        },
    )))
}

/// What one subtask reads of one input, from the run of (subpartition,
/// partitions covered, `None`: all) it got: per producer partition the
/// contiguous subpartition range it covers, neighbouring partitions with
/// the same range merged into one slice.
fn ranges_per_partition(
    num_partitions: usize,
    run: impl Iterator<Item = (usize, Option<IndexRange>)>,
) -> Result<Vec<ExecutionVertexInputInfo>> {
    let mut ranges: Vec<Option<IndexRange>> = vec![None; num_partitions];
    for (s, only) in run {
        for (p, range) in ranges.iter_mut().enumerate() {
            if only.is_some_and(|r| !(r.start..=r.end).contains(&p)) {
                continue;
            }
            *range = Some(match *range {
                None => IndexRange::single(s),
                Some(r) if r.end + 1 == s || r.end == s => IndexRange {
                    start: r.start,
                    end: s,
                },
                Some(r) => {
                    return internal(format!(
                        "partition {p} would read subpartitions {}..={} and {s}",
                        r.start, r.end
                    ));
                }
            });
        }
    }
    let mut list: Vec<ExecutionVertexInputInfo> = Vec::new();
    for (p, range) in ranges.into_iter().enumerate() {
        let Some(range) = range else { continue };
        match list.last_mut() {
            Some(last) if last.subpartition_range == range && last.partition_range.end + 1 == p => {
                last.partition_range.end = p;
            }
            _ => list.push(ExecutionVertexInputInfo {
                partition_range: IndexRange::single(p),
                subpartition_range: range,
            }),
        }
    }
    Ok(list)
}

/// Cuts consecutive partitions into ranges while their bytes stay below
/// `target` (a range always takes its first partition): the decider's
/// greedy cut with a limit one byte under the target.
fn cut(bytes: &[u64], target: u64) -> Vec<IndexRange> {
    greedy_ranges(bytes, target.saturating_sub(1), usize::MAX)
}

/// Groups slices with a byte limit of `avg`, moved by bisection when the
/// count falls outside `[min, max]`: too many, the smallest limit giving at
/// most `max`; too few, the largest limit still giving at least `min`.
/// `None` when no limit gives a count within the bounds.
fn fit_bounds(
    group: impl Fn(u64) -> Vec<(usize, usize)>,
    avg: u64,
    all_bytes: u64,
    min: usize,
    max: usize,
) -> Option<Vec<(usize, usize)>> {
    let mut tasks = group(avg);
    if tasks.len() > max {
        let limit = smallest_satisfying(avg, all_bytes.max(avg), |l| group(l).len() <= max);
        tasks = group(limit);
    } else if tasks.len() < min && group(1).len() >= min {
        let limit = largest_satisfying(1, avg, |l| group(l).len() >= min);
        tasks = group(limit);
    }
    (min..=max).contains(&tasks.len()).then_some(tasks)
}

/// `subpartitions` of every partition of `input`.
fn whole(input: &BlockingResultInfo, subpartitions: IndexRange) -> ExecutionVertexInputInfo {
    ExecutionVertexInputInfo {
        partition_range: IndexRange {
            start: 0,
            end: input.num_partitions() - 1,
        },
        subpartition_range: subpartitions,
    }
}

/// Sums reported byte counts without overflowing on hostile reports.
fn total(values: impl Iterator<Item = u64>) -> u64 {
    values.fold(0, u64::saturating_add)
}

fn internal<T>(msg: impl Into<String>) -> Result<T> {
    Err(FluviaError::Internal(format!(
        "adaptive batch scheduler, skew splitting: {}",
        msg.into()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(avg: u64) -> DeciderConfig {
        DeciderConfig {
            avg_data_volume_per_task: avg,
            ..DeciderConfig::default()
        }
    }

    const SKEW: SkewConfig = SkewConfig {
        factor: 4.0,
        threshold: 100,
    };

    /// How many subtasks, given what each reads of one input, read
    /// subpartition `s` of partition `p`.
    fn readers_of(subtasks: &[Vec<ExecutionVertexInputInfo>], p: usize, s: usize) -> usize {
        subtasks
            .iter()
            .filter(|slices| {
                slices.iter().any(|sl| {
                    (sl.partition_range.start..=sl.partition_range.end).contains(&p)
                        && (sl.subpartition_range.start..=sl.subpartition_range.end).contains(&s)
                })
            })
            .count()
    }

    /// Every (producer, subpartition) pair of input `i` read exactly once,
    /// and, for each subpartition, every pair of rows (a from the split
    /// side, b from the other) meets in exactly one subtask.
    fn check_coverage(inputs: &[BlockingResultInfo], d: &SkewedDecision) {
        for (i, input) in inputs.iter().enumerate() {
            let n = input.num_subpartitions(0);
            for p in 0..input.num_partitions() {
                for s in 0..n {
                    let reads = readers_of(&d.inputs[i], p, s);
                    let split = d
                        .split
                        .iter()
                        .any(|sp| sp.subpartition == s && sp.input != i);
                    if split {
                        assert!(reads >= 1, "input {i} ({p},{s}) never read");
                    } else {
                        assert_eq!(reads, 1, "input {i} ({p},{s}) read {reads} times");
                    }
                }
            }
        }
    }

    #[test]
    fn a_hot_subpartition_of_the_splittable_side_is_shared_out_by_partitions() {
        // Side 0: 4 producers, subpartition 2 holds 1000 bytes per producer.
        let side0 = BlockingResultInfo::all_to_all(vec![vec![10, 10, 1000, 10]; 4]);
        let side1 = BlockingResultInfo::all_to_all(vec![vec![5, 5, 5, 5]; 2]);
        let inputs = [side0, side1];
        let d = decide_skewed(128, &inputs, &[true, false], &SKEW, &config(1000))
            .unwrap()
            .expect("skewed");
        assert_eq!(
            d.split,
            vec![SkewSplit {
                subpartition: 2,
                input: 0,
                pieces: 4
            }]
        );
        check_coverage(&inputs, &d);
        // Each piece of subpartition 2 reads side 1's subpartition 2 whole.
        let pieces: Vec<usize> = (0..d.parallelism)
            .filter(|&t| {
                d.inputs[0][t].iter().any(|sl| {
                    sl.subpartition_range == IndexRange::single(2)
                        && sl.partition_range.end - sl.partition_range.start < 3
                })
            })
            .collect();
        assert!(pieces.len() >= 3, "{d:?}");
        for t in pieces {
            assert!(d.inputs[1][t].iter().any(|sl| {
                sl.partition_range == IndexRange { start: 0, end: 1 }
                    && (sl.subpartition_range.start..=sl.subpartition_range.end).contains(&2)
            }));
        }
    }

    #[test]
    fn a_small_side_is_read_whole_by_every_subtask_and_the_big_one_cut_by_bytes() {
        // Big side: all of its bytes in one subpartition (one key), 4
        // producers; small side: 2 producers, 8 bytes each in total.
        let big = BlockingResultInfo::all_to_all(vec![vec![0, 400, 0, 0]; 4]);
        let small = BlockingResultInfo::all_to_all(vec![vec![1, 2, 3, 2]; 2]);
        let inputs = [small, big];
        let (b, d) = decide_broadcast(128, &inputs, &[false, true], 100, &config(400))
            .unwrap()
            .expect("broadcast");
        assert_eq!(b, 0);
        assert_eq!(d.parallelism, 4, "{d:?}");
        for t in 0..d.parallelism {
            assert_eq!(
                d.inputs[0][t],
                vec![ExecutionVertexInputInfo {
                    partition_range: IndexRange { start: 0, end: 1 },
                    subpartition_range: IndexRange { start: 0, end: 3 },
                }]
            );
        }
        // Every (partition, subpartition) cell of the big side exactly once.
        for p in 0..4 {
            for s in 0..4 {
                let n = readers_of(&d.inputs[1], p, s);
                assert_eq!(n, 1, "({p},{s})");
            }
        }
        // Too big to broadcast, or a big side that may not be split: no.
        assert!(
            decide_broadcast(128, &inputs, &[false, true], 5, &config(400))
                .unwrap()
                .is_none()
        );
        assert!(
            decide_broadcast(128, &inputs, &[true, false], 100, &config(400))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn nothing_is_split_without_skew_or_on_a_side_that_may_not_be() {
        let even = BlockingResultInfo::all_to_all(vec![vec![10, 10, 10, 10]; 4]);
        let hot = BlockingResultInfo::all_to_all(vec![vec![10, 10, 1000, 10]; 4]);
        let cfg = config(1000);
        assert_eq!(
            decide_skewed(
                128,
                &[even.clone(), even.clone()],
                &[true, true],
                &SKEW,
                &cfg
            )
            .unwrap(),
            None
        );
        assert_eq!(
            decide_skewed(128, &[hot, even], &[false, true], &SKEW, &cfg).unwrap(),
            None
        );
    }

    #[test]
    fn the_bounds_hold_and_every_pair_is_read_once_under_random_skew() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |m: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % m
        };
        for _ in 0..300 {
            let n = 1 + next(12) as usize;
            let p0 = 1 + next(6) as usize;
            let p1 = 1 + next(6) as usize;
            let mut bytes = |p: usize| {
                (0..p)
                    .map(|_| {
                        (0..n)
                            .map(|_| if next(5) == 0 { next(5000) } else { next(50) })
                            .collect()
                    })
                    .collect::<Vec<Vec<u64>>>()
            };
            let inputs = [
                BlockingResultInfo::all_to_all(bytes(p0)),
                BlockingResultInfo::all_to_all(bytes(p1)),
            ];
            let splittable = [next(2) == 0, true];
            let cfg = DeciderConfig {
                min_parallelism: 1 + next(3) as usize,
                max_parallelism: 4 + next(20) as usize,
                avg_data_volume_per_task: 50 + next(500),
                ..DeciderConfig::default()
            };
            let skew = SkewConfig {
                factor: 2.0,
                threshold: 10,
            };
            if let Some(d) = decide_skewed(64, &inputs, &splittable, &skew, &cfg).unwrap() {
                assert!(
                    (cfg.min_parallelism..=cfg.max_parallelism).contains(&d.parallelism),
                    "{d:?}"
                );
                check_coverage(&inputs, &d);
                // Pieces come only from splittable sides.
                assert!(d.split.iter().all(|sp| splittable[sp.input]));
            }
        }
    }
}
